//! Single query tokens (decode): dot products straight from the paged cache.
//!
//! One item is one token's `group` query heads over the key range `k0..k1`:
//! scores `[group, k1 - k0]` (one read of each K row for all heads of the
//! group; clipped to the window, soft-capped where asked), a max-subtracted
//! softmax, and a weighted sum of V rows. With
//! AVX2+FMA and `head_dim % 32 == 0` an intrinsic kernel keeps up to three
//! heads' 32-wide output slices in registers while it walks the keys;
//! otherwise a portable loop does the same arithmetic. An FP8 cache is
//! dequantized into contiguous f32 rows first. Scratch is
//! O(group * (k1 - k0)) (plus the rows, FP8 only).

use super::{for_each_key, softcap, Item, Part, Scratch};
use crate::cpu::math::{dot, exp_sub_sum};
use crate::cpu::storage::{CpuKvCache, CpuStep, CpuTensor};
use crate::AttentionParams;

/// The part of token `it.t0` of `it.seq` over keys `it.k0..it.k1`.
pub(super) fn part(
    q: &CpuTensor,
    cache: &CpuKvCache,
    step: &CpuStep,
    p: &AttentionParams,
    it: Item,
    s: &mut Scratch,
) -> Part {
    let (hd, nkv) = (p.head_dim, p.num_kv_heads);
    let group = p.num_heads / nkv;
    let ctx = &step.ctx;
    let table = ctx.group_block_table(p.kv_group, it.seq);
    let limit = ctx.context_lens[it.seq] as usize + it.t0 + 1;
    let (k0, k1) = (it.k0.max(p.first_key(limit - 1)), it.k1.min(limit));
    let n = k1.saturating_sub(k0);
    let tok = ctx.cu_seqlens_q[it.seq] as usize + it.t0;
    let qa = tok * q.cols + it.kvh * group * hd;
    let qs = &q.data[qa..qa + group * hd];
    let (width, head) = (nkv * hd, it.kvh * hd);
    let bs = cache.shape.block_size;
    // Offsets of the keys' rows in K/V.
    let mut offsets = std::mem::take(&mut s.idx);
    offsets.clear();
    for_each_key(table, bs, width, head, k0, k1, |_, a| offsets.push(a));
    // An FP8 cache is read once into f32 rows (contiguous, so the offsets
    // become j * hd); an f32 cache is read in place.
    let (kd, vd): (&[f32], &[f32]) = match cache.f32_kv() {
        Some(kv) => kv,
        None => {
            s.k.clear();
            s.v.clear();
            for (j, a) in offsets.iter_mut().enumerate() {
                cache.extend_k(&mut s.k, *a, hd);
                cache.extend_v(&mut s.v, *a, hd);
                *a = j * hd;
            }
            (&s.k, &s.v)
        }
    };
    let mut max = vec![f32::NEG_INFINITY; group];
    let mut sum = vec![0f32; group];
    let mut o = vec![0f32; group * hd];
    s.s.clear();
    s.s.resize(group * n, 0.0);
    if n > 0 {
        let fast =
            cfg!(target_arch = "x86_64") && hd % 32 == 0 && crate::cpu::simd::has_avx2_f16c();
        // 1. Scores, [group, n].
        if fast {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX2/FMA detected; every offset + hd is inside K
            // (block ids were checked by `check`), qs holds group * hd values.
            unsafe {
                avx2::scores(qs, kd, &offsets, hd, group, p.scale, &mut s.s)
            };
        } else {
            for (j, &a) in offsets.iter().enumerate() {
                let k = &kd[a..a + hd];
                for g in 0..group {
                    s.s[g * n + j] = dot(&qs[g * hd..(g + 1) * hd], k) * p.scale;
                }
            }
        }
        // 2. Softmax weights per head, relative to the head's max.
        for g in 0..group {
            let row = &mut s.s[g * n..(g + 1) * n];
            softcap(p, row);
            max[g] = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            sum[g] = exp_sub_sum(row, max[g]);
        }
        // 3. O = P V (unnormalized).
        if fast {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, for V; o holds group * hd values.
            unsafe {
                avx2::weighted_sum(&s.s, vd, &offsets, hd, group, &mut o)
            };
        } else {
            for (j, &a) in offsets.iter().enumerate() {
                let v = &vd[a..a + hd];
                for g in 0..group {
                    let w = s.s[g * n + j];
                    for (o, v) in o[g * hd..(g + 1) * hd].iter_mut().zip(v) {
                        *o += w * v;
                    }
                }
            }
        }
    }
    s.idx = offsets;
    Part { o, max, sum }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// `out[g * n + j] = scale * dot(q[g], k[offsets[j]..][..hd])`, `hd % 8 == 0`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scores(
        q: &[f32],
        k: &[f32],
        offsets: &[usize],
        hd: usize,
        group: usize,
        scale: f32,
        out: &mut [f32],
    ) {
        let n = offsets.len();
        assert!(q.len() >= group * hd && out.len() >= group * n);
        for (j, &a) in offsets.iter().enumerate() {
            assert!(a + hd <= k.len());
            let kp = k.as_ptr().add(a);
            for g in 0..group {
                let qp = q.as_ptr().add(g * hd);
                let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                let mut d = 0;
                while d + 16 <= hd {
                    s0 =
                        _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(d)), _mm256_loadu_ps(kp.add(d)), s0);
                    s1 = _mm256_fmadd_ps(
                        _mm256_loadu_ps(qp.add(d + 8)),
                        _mm256_loadu_ps(kp.add(d + 8)),
                        s1,
                    );
                    d += 16;
                }
                if d < hd {
                    s0 =
                        _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(d)), _mm256_loadu_ps(kp.add(d)), s0);
                }
                *out.get_unchecked_mut(g * n + j) = hsum(_mm256_add_ps(s0, s1)) * scale;
            }
        }
    }

    /// `o[g] += sum_j w[g * n + j] * v[offsets[j]..][..hd]`, `hd % 32 == 0`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn weighted_sum(
        w: &[f32],
        v: &[f32],
        offsets: &[usize],
        hd: usize,
        group: usize,
        o: &mut [f32],
    ) {
        let mut g0 = 0;
        while g0 < group {
            match group - g0 {
                1 => heads::<1>(w, v, offsets, hd, g0, o),
                2 => heads::<2>(w, v, offsets, hd, g0, o),
                _ => heads::<3>(w, v, offsets, hd, g0, o),
            }
            g0 += 3;
        }
    }

    /// Heads `g0..g0 + G`, 32 output lanes at a time held in registers.
    #[target_feature(enable = "avx2,fma")]
    // Indexing by head and lane keeps the register tile readable.
    #[allow(clippy::needless_range_loop)]
    unsafe fn heads<const G: usize>(
        w: &[f32],
        v: &[f32],
        offsets: &[usize],
        hd: usize,
        g0: usize,
        o: &mut [f32],
    ) {
        let n = offsets.len();
        assert!(w.len() >= (g0 + G) * n && o.len() >= (g0 + G) * hd);
        for d in (0..hd).step_by(32) {
            let mut acc = [[_mm256_setzero_ps(); 4]; G];
            for (j, &a) in offsets.iter().enumerate() {
                assert!(a + hd <= v.len());
                let vp = v.as_ptr().add(a + d);
                let vv = [
                    _mm256_loadu_ps(vp),
                    _mm256_loadu_ps(vp.add(8)),
                    _mm256_loadu_ps(vp.add(16)),
                    _mm256_loadu_ps(vp.add(24)),
                ];
                for g in 0..G {
                    let wg = _mm256_set1_ps(*w.get_unchecked((g0 + g) * n + j));
                    for c in 0..4 {
                        acc[g][c] = _mm256_fmadd_ps(wg, vv[c], acc[g][c]);
                    }
                }
            }
            for g in 0..G {
                let op = o.as_mut_ptr().add((g0 + g) * hd + d);
                for c in 0..4 {
                    let prev = _mm256_loadu_ps(op.add(8 * c));
                    _mm256_storeu_ps(op.add(8 * c), _mm256_add_ps(prev, acc[g][c]));
                }
            }
        }
    }
}
