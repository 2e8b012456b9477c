//! The sampler's O(vocab) inner loops, written so the compiler vectorizes
//! them: lane-wise argmax and max, a branch-free `exp` for non-positive
//! arguments, f64 sums over eight lanes, and the selections that rank tokens
//! without sorting the vocabulary.
//!
//! Invariants: ranking is always by weight descending then id ascending
//! ([`rank`]), a total order, so every selection returns the same set for the
//! same weights; weights are finite and >= 0 (the caller maps NaN to -inf
//! before [`to_weights`]); a weight of exactly 0 means "never sampled".

use std::cmp::Ordering;

/// Lanes of the vectorizable loops.
const L: usize = 8;
/// Up to this many candidates, [`top_by_weight`] keeps a sorted buffer.
pub(super) const SMALL_K: usize = 128;
/// Below this many candidates, [`nucleus`] sorts instead of selecting.
const NUCLEUS_SORT: usize = 32;
/// Arguments below this get weight 0 (e^-87 < 2^-125: below any relevant
/// probability, and keeps the result a normal f32).
const EXP_CUTOFF: f32 = -87.0;

/// `e^x` for `x <= 0` within about 2 ulp (Cody-Waite reduction and Cephes'
/// degree-6 polynomial); 0 for `x < -87` and for `-inf`.
#[inline(always)]
pub(super) fn exp_nonpos(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.max(EXP_CUTOFF);
    let k = xc * LOG2E + ROUND;
    let n = k - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // k's bits are ROUND's plus n: integer ops only, so the loop vectorizes.
    let n_int = (k.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let scale = f32::from_bits((n_int.wrapping_add(127) << 23) as u32);
    if x < EXP_CUTOFF {
        0.0
    } else {
        y * scale
    }
}

/// Largest value, NaN skipped (-inf if none), eight lanes.
fn max_lanes(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; L];
    let chunks = x.chunks_exact(L);
    let tail = chunks.remainder();
    for c in chunks {
        for j in 0..L {
            lanes[j] = if c[j] > lanes[j] { c[j] } else { lanes[j] };
        }
    }
    let m = lanes
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    tail.iter().fold(m, |m, &v| if v > m { v } else { m })
}

/// Index of the largest value; ties go to the lowest index, NaN is skipped,
/// 0 when nothing is above -inf. Two passes: a vectorized max, then the
/// first position holding it.
pub fn argmax(x: &[f32]) -> u32 {
    let max = max_lanes(x);
    if max == f32::NEG_INFINITY {
        return 0;
    }
    x.iter().position(|&v| v == max).unwrap_or(0) as u32
}

/// Sum in f64, eight lanes (a fixed order: the result is deterministic).
pub(super) fn sum_f64(w: &[f32]) -> f64 {
    let mut acc = [0f64; L];
    let chunks = w.chunks_exact(L);
    let tail = chunks.remainder();
    for c in chunks {
        for j in 0..L {
            acc[j] += c[j] as f64;
        }
    }
    acc.iter().sum::<f64>() + tail.iter().map(|&v| v as f64).sum::<f64>()
}

/// Rewrites `logits` as weights `exp((l / t) - max)` (NaN -> 0) and returns
/// their sum; the largest weight is exactly 1. All weights are 0 when no
/// logit is above -inf; tokens at +inf share the mass when any is.
pub(super) fn to_weights(logits: &mut [f32], t: f32) -> f64 {
    for l in logits.iter_mut() {
        let v = *l / t;
        *l = if v.is_nan() { f32::NEG_INFINITY } else { v };
    }
    let max = max_lanes(logits);
    if max == f32::NEG_INFINITY {
        logits.fill(0.0);
        return 0.0;
    }
    if max == f32::INFINITY {
        for l in logits.iter_mut() {
            *l = if *l == f32::INFINITY { 1.0 } else { 0.0 };
        }
        return sum_f64(logits);
    }
    for l in logits.iter_mut() {
        *l = exp_nonpos(*l - max);
    }
    sum_f64(logits)
}

/// Ranking order: higher weight first, then lower id.
pub(super) fn rank(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The `m` highest-ranked tokens of `w`, in [`rank`] order.
pub(super) fn top_by_weight(w: &[f32], m: usize) -> Vec<(u32, f32)> {
    let m = m.min(w.len());
    if m == 0 {
        return Vec::new();
    }
    if m <= SMALL_K {
        // One scan with a sorted buffer; ids grow, so an equal weight seen
        // later ranks after the ones kept.
        let mut buf: Vec<(u32, f32)> = Vec::with_capacity(m + 1);
        for (i, &x) in w.iter().enumerate() {
            if buf.len() == m && x <= buf[m - 1].1 {
                continue;
            }
            let pos = buf.partition_point(|e| e.1 >= x);
            buf.insert(pos, (i as u32, x));
            buf.truncate(m);
        }
        return buf;
    }
    let all: Vec<(u32, f32)> = w.iter().enumerate().map(|(i, &x)| (i as u32, x)).collect();
    top_of_pairs(all, m)
}

/// The `m` highest-ranked of `c`, in [`rank`] order.
pub(super) fn top_of_pairs(mut c: Vec<(u32, f32)>, m: usize) -> Vec<(u32, f32)> {
    if m == 0 {
        return Vec::new();
    }
    if m < c.len() {
        c.select_nth_unstable_by(m - 1, rank);
        c.truncate(m);
    }
    c.sort_unstable_by(rank);
    c
}

/// The highest-ranked `m` of `c` moved to the front (in no particular
/// order) without sorting; returns nothing, `c` keeps its length.
pub(super) fn partition_top(c: &mut [(u32, f32)], m: usize) {
    if m > 0 && m < c.len() {
        c.select_nth_unstable_by(m - 1, rank);
    }
}

/// Rearranges `c` so that `c[..j]` is the smallest rank-order prefix whose
/// weight reaches `target`, and returns `j` (all of `c` if rounding leaves
/// the total short). Expected O(len): each round selects within half of the
/// remaining range, as quickselect does, with mass in place of rank.
pub(super) fn nucleus(c: &mut [(u32, f32)], target: f64) -> usize {
    // c[..lo]: the top `lo`, mass `acc` < target; the answer lies in (lo, hi].
    let (mut lo, mut hi, mut acc) = (0usize, c.len(), 0.0f64);
    while hi - lo > NUCLEUS_SORT {
        let s = &mut c[lo..hi];
        let mid = s.len() / 2;
        partition_top(s, mid);
        let m: f64 = s[..mid].iter().map(|e| e.1 as f64).sum();
        if acc + m >= target {
            hi = lo + mid;
        } else {
            acc += m;
            lo += mid;
        }
    }
    c[lo..hi].sort_unstable_by(rank);
    for (j, e) in c[lo..hi].iter().enumerate() {
        acc += e.1 as f64;
        if acc >= target {
            return lo + j + 1;
        }
    }
    hi
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_f64_exp() {
        let mut worst = 0.0f64;
        let mut x = -86.9f32;
        while x <= 0.0 {
            let want = (x as f64).exp();
            let got = exp_nonpos(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_37;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp_nonpos(0.0), 1.0);
        assert_eq!(exp_nonpos(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpos(-100.0), 0.0);
    }

    #[test]
    fn argmax_matches_a_scalar_scan() {
        let scalar = |x: &[f32]| {
            let (mut b, mut bv) = (0usize, f32::NEG_INFINITY);
            for (i, &v) in x.iter().enumerate() {
                if v > bv {
                    b = i;
                    bv = v;
                }
            }
            b as u32
        };
        for n in [0usize, 1, 5, 8, 9, 17, 100] {
            for hot in 0..n.min(20) {
                let mut x: Vec<f32> = (0..n).map(|i| ((i * 7) % 5) as f32).collect();
                x[hot] = 4.0; // ties with other 4s: lowest index must win
                if n > 3 {
                    x[n - 1] = f32::NAN;
                }
                assert_eq!(argmax(&x), scalar(&x), "n {n} hot {hot} {x:?}");
            }
        }
        assert_eq!(argmax(&[f32::NEG_INFINITY; 11]), 0);
    }

    #[test]
    fn nucleus_matches_a_sorted_prefix() {
        let mut s = 17u64;
        let w: Vec<f32> = (0..2000)
            .map(|_| (super::super::splitmix64(&mut s) % 29) as f32 / 28.0)
            .collect();
        let mut sorted: Vec<(u32, f32)> =
            w.iter().enumerate().map(|(i, &x)| (i as u32, x)).collect();
        sorted.sort_by(rank);
        let total: f64 = sorted.iter().map(|e| e.1 as f64).sum();
        for p in [1e-9, 0.1, 0.5, 0.9, 0.999, 1.0] {
            let mut cum = 0.0;
            let want = sorted
                .iter()
                .position(|e| {
                    cum += e.1 as f64;
                    cum >= p * total
                })
                .map_or(sorted.len(), |j| j + 1);
            let mut c: Vec<(u32, f32)> =
                w.iter().enumerate().map(|(i, &x)| (i as u32, x)).collect();
            let j = nucleus(&mut c, p * total);
            // The sums are exact (few distinct f32 values), so no rounding slack.
            assert_eq!(j, want, "p {p}");
            let mut got: Vec<u32> = c[..j].iter().map(|e| e.0).collect();
            got.sort_unstable();
            let mut exp: Vec<u32> = sorted[..j].iter().map(|e| e.0).collect();
            exp.sort_unstable();
            assert_eq!(got, exp, "p {p}");
        }
    }
}
