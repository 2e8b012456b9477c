//! The AVX2 (no VNNI) inner product of [`super::kgemm`]: every x row
//! against a panel of reordered weight rows, in register tiles sized so
//! that a tile's 16-bit sums, its operand loads and one product fit the 16
//! ymm registers.
//!
//! - Per step (32 bytes of K) a tile of `R` x rows by `C` weight rows loads
//!   `C` weight vectors and `R` x vectors and adds `R C` `vpmaddubsw` pair
//!   sums into 16-bit lanes; runs of [`steps_in_i16`] steps cannot overflow
//!   them, and each run is widened once (`vpmaddwd` by ones).
//!   Q6_K's runs are two steps, so its pair sums go straight into i32
//!   sums held in registers (no `held` scratch between runs):
//!   `products_timing`, Q6_K 32 x [32, 8960], medians of eight alternating
//!   rounds on a 2-core AMD EPYC (Zen 3), 35.1 -> 38.1 G MACs/s.
//! - The f32 sums of a tile (`R C` vectors of 8 lanes, one per sub-block of
//!   a group) live in a scratch in memory, read and written once per group
//!   (a group is 8 steps for Q4_K / Q5_K, 4 for Q6_K). Kept in registers
//!   beside the 16-bit sums they did not fit: the compiler spilled the
//!   16-bit sums instead, inside the step loop.
//! - Operands are addressed from one base pointer per side and the row
//!   strides, so the tile needs few general registers too.
//!
//! The sums are the same integers as the VNNI path's, in the same f32
//! order, so the two paths agree to f32 rounding of the final lane sums.

use super::kgemm::x86::{Acts, Panel, SharedOut, Tile};
use super::x86::hsum;
use crate::GgmlType;
use std::arch::x86_64::*;

/// Steps of `vpmaddubsw` pair sums added in 16-bit lanes before widening
/// them (`vpmaddwd` by ones) into the i32 sums: a pair sum is at most
/// `2 * umax * 128` in magnitude (activations in -128..=127), so
/// `32767 / (256 umax)` of them fit: 8 for Q4_K and Q4_1 (quants 0..=15:
/// 30,720), 4 for Q5_K (0..=31: 31,744), 2 for Q6_K (0..=63: 32,256).
pub(super) fn steps_in_i16(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_K | GgmlType::Q4_1 => 8,
        GgmlType::Q5_K => 4,
        _ => 2,
    }
}

/// x rows per tile.
const MR: usize = 4;
/// Weight rows per tile.
const NR: usize = 2;

/// Every x row against the panel's weight rows `j0..j1`, tile by tile, K
/// slice by K slice (`per_slice` groups), summed into columns `j0..j1` of
/// `out` (`[rows, n]`).
///
/// # Safety
/// AVX2, FMA; `a` and `p` prepared for `rows` x rows and `j1 - j0` weight
/// rows of `ty` with sub-blocks of `sub`, reordered to `k` columns (whole
/// groups, padded); `out` holds `rows * n` values of which this call alone
/// writes columns `j0..j1`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn multiply(
    ty: GgmlType,
    a: &Acts,
    p: &Panel,
    rows: usize,
    (j0, j1): (usize, usize),
    n: usize,
    k: usize,
    sub: usize,
    per_slice: usize,
    out: &SharedOut,
) {
    let groups = k / (8 * sub);
    let cols = j1 - j0;
    let h16 = steps_in_i16(ty);
    // Escaped (`black_box`), so that the compiler keeps them in memory.
    let mut sums = [[_mm256_setzero_ps(); NR]; MR];
    let acc = std::hint::black_box(sums.as_mut_ptr() as *mut __m256);
    let mut runs = [[_mm256_setzero_si256(); NR]; MR];
    let held = std::hint::black_box(runs.as_mut_ptr() as *mut __m256i);
    for g0 in (0..groups).step_by(per_slice) {
        let g1 = (g0 + per_slice).min(groups);
        for r0 in (0..rows).step_by(MR) {
            let rn = (rows - r0).min(MR);
            for c0 in (0..cols).step_by(NR) {
                let cn = (cols - c0).min(NR);
                let tile = Tile::at(a, p, (r0, c0), k, groups, (g0, g1));
                macro_rules! go {
                    ($s:literal, $h:literal) => {
                        match (rn, cn) {
                            (4, 2) => tile.run_avx2::<4, 2, $s, $h>(acc, held),
                            (3, 2) => tile.run_avx2::<3, 2, $s, $h>(acc, held),
                            (2, 2) => tile.run_avx2::<2, 2, $s, $h>(acc, held),
                            (1, 2) => tile.run_avx2::<1, 2, $s, $h>(acc, held),
                            (4, _) => tile.run_avx2::<4, 1, $s, $h>(acc, held),
                            (3, _) => tile.run_avx2::<3, 1, $s, $h>(acc, held),
                            (2, _) => tile.run_avx2::<2, 1, $s, $h>(acc, held),
                            _ => tile.run_avx2::<1, 1, $s, $h>(acc, held),
                        }
                    };
                }
                match (sub, h16) {
                    (32, 8) => go!(8, 8),
                    (32, _) => go!(8, 4),
                    _ => go!(4, 2),
                }
                for r in 0..rn {
                    for c in 0..cn {
                        let v = hsum(*acc.add(r * NR + c));
                        // SAFETY: `(r0 + r) * n + j0 + c0 + c < rows * n`,
                        // a column of this call's alone.
                        let o = out.0.add((r0 + r) * n + j0 + c0 + c);
                        *o = if g0 == 0 { v } else { *o + v };
                    }
                }
            }
        }
    }
}

impl Tile {
    /// The f32 sums of the first `R` x rows against the first `C` weight
    /// rows into `acc[r * NR + c]` (8 lanes each, overwritten), groups of
    /// `S` steps in runs of `H` ([`steps_in_i16`]); a group's earlier runs
    /// are summed in `held` (same layout, i32 lanes).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn run_avx2<const R: usize, const C: usize, const S: usize, const H: usize>(
        &self,
        acc: *mut __m256,
        held: *mut __m256i,
    ) {
        let zero = _mm256_setzero_si256();
        let ones = _mm256_set1_epi16(1);
        for r in 0..R {
            for c in 0..C {
                acc.add(r * NR + c).write(_mm256_setzero_ps());
            }
        }
        for g in self.g0..self.g1 {
            let mut isum = [[zero; C]; R];
            if H == 2 {
                // Q6_K: two steps' pair sums added in 16 bits and widened
                // straight into i32 sums kept in registers (a run is only
                // two steps, too short to pay for the `held` scratch).
                for pair in 0..std::hint::black_box(S / 2) {
                    let off = (g * S + 2 * pair) * 32;
                    let w: [[__m256i; C]; 2] = std::array::from_fn(|s| {
                        std::array::from_fn(|c| {
                            _mm256_loadu_si256(
                                self.wq.add(c * self.k + off + 32 * s) as *const __m256i
                            )
                        })
                    });
                    for (r, ir) in isum.iter_mut().enumerate() {
                        let xp = self.aq.add(r * self.k + off);
                        let x0 = _mm256_loadu_si256(xp as *const __m256i);
                        let x1 = _mm256_loadu_si256(xp.add(32) as *const __m256i);
                        for (c, iv) in ir.iter_mut().enumerate() {
                            let t = _mm256_add_epi16(
                                _mm256_maddubs_epi16(w[0][c], x0),
                                _mm256_maddubs_epi16(w[1][c], x1),
                            );
                            *iv = _mm256_add_epi32(*iv, _mm256_madd_epi16(t, ones));
                        }
                    }
                }
            }
            // (Q6_K's pairs above took the whole group.)
            let runs = if H == 2 { 0 } else { S / H };
            for run in 0..runs {
                let mut h = [[zero; C]; R];
                // A loop the compiler keeps rolled (its count hidden):
                // unrolled, it hoisted every step's loads ahead of the
                // products and spilled them.
                for s in 0..std::hint::black_box(H) {
                    let off = (g * S + run * H + s) * 32;
                    let w: [__m256i; C] = std::array::from_fn(|c| {
                        _mm256_loadu_si256(self.wq.add(c * self.k + off) as *const __m256i)
                    });
                    for (r, hr) in h.iter_mut().enumerate() {
                        let x = _mm256_loadu_si256(self.aq.add(r * self.k + off) as *const __m256i);
                        for (hv, wv) in hr.iter_mut().zip(&w) {
                            *hv = _mm256_add_epi16(*hv, _mm256_maddubs_epi16(*wv, x));
                        }
                    }
                }
                for r in 0..R {
                    for c in 0..C {
                        let slot = held.add(r * NR + c);
                        let mut wide = _mm256_madd_epi16(h[r][c], ones);
                        if run > 0 {
                            wide = _mm256_add_epi32(slot.read(), wide);
                        }
                        if run + 1 < runs {
                            slot.write(wide);
                        } else {
                            isum[r][c] = wide;
                        }
                    }
                }
            }
            for (r, ir) in isum.iter().enumerate() {
                let d = _mm256_loadu_ps(self.ad.add((r * self.groups + g) * 8));
                let sums = _mm256_loadu_ps(self.as_.add((r * self.groups + g) * 8));
                for (c, iv) in ir.iter().enumerate() {
                    let f = self.wf.add((c * self.groups + g) * 16);
                    let scale = _mm256_mul_ps(_mm256_loadu_ps(f), d);
                    let slot = acc.add(r * NR + c);
                    let t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(*iv), scale, slot.read());
                    slot.write(_mm256_fmadd_ps(_mm256_loadu_ps(f.add(8)), sums, t));
                }
            }
        }
    }
}
