//! The k-quant kernels for one x row ([`super::super::one_row_fn`]): each
//! call dots one quantized x row with a run of consecutive weight rows, so
//! a decode step pays no call, division or group dispatch per weight row (a
//! 1536-column Q4_K row is only 6 blocks). One set per instruction set, as
//! in [`super`], from one macro.
//!
//! - Q4_K / Q5_K apply the sub-block scales after the dot products: each
//!   32-element sub-block's quants go through `udot` unscaled, two
//!   sub-blocks' i32 lanes are packed to 16 bits and multiplied by their
//!   scales in one `wdot`. One weight row at a time: two rows per pass
//!   over the x row (two weight streams) ran the same in L2 and 2.5x
//!   slower streamed from memory (one `one_row_timing` run).
//! - Q6_K (16 scales per block) unpacks each block as the row kernels do
//!   ([`super::KBlock`]): the same packing of two 16-element sub-blocks'
//!   sums with four scales per `wdot` measured 3-6% slower (one thread,
//!   least of 30 trials, `one_row_timing`).
//!
//! - Both sets prefetch the weights ahead of the block they dot, as the
//!   row kernels do ([`super::WEIGHT_PREFETCH`]; on an Intel Xeon with
//!   AVX-512 VNNI the VNNI set's Qwen2.5-1.5B Q4_K_M decode went from 14.3
//!   to 19.6 tok/s with it).
//!
//! The integer sums equal the row kernels'; the f32 sums differ from them
//! in order only (the minimum terms have their own accumulator).
//!
//! Safety: as [`super`]: AVX2, FMA and F16C (and AVX-512 VNNI + VL for the
//! VNNI set), and `rb` bytes of whole blocks per weight row.

use super::*;

/// `vpshufb` masks (both 128-bit halves alike) that spread the scale bytes
/// `2 j` and `2 j + 1` of 8 into 16-bit lanes: `2 j` into lanes 0..4 and
/// `2 j + 1` into lanes 4..8 of each half, the order in which
/// `_mm256_packs_epi32` leaves two sub-blocks' lanes.
const PAIR_SCALES: [[u8; 32]; 4] = {
    let mut m = [[0x80u8; 32]; 4];
    let mut j = 0;
    while j < 4 {
        let mut b = 0;
        while b < 32 {
            let lane = (b % 16) / 2;
            if b % 2 == 0 {
                m[j][b] = (2 * j + lane / 4) as u8;
            }
            b += 1;
        }
        j += 1;
    }
    m
};

macro_rules! one_row_kernels {
    ($name:ident, $ops:ident, $prefetch:expr) => {
        pub mod $name {
            use super::super::$ops::{kdot, udot, wdot};
            use super::*;

            /// A k-quant against one x row, over `out.len()` consecutive
            /// weight rows of `rb` bytes in one call (no per-row call,
            /// division or group dispatch: a 1536-column row is only 6
            /// blocks). The minimum terms go to their own accumulator, so no
            /// chain of two FMAs per block runs through one register.
            macro_rules! k_one_row {
                ($fname:ident, $bytes:expr, $fold:expr, $unpack:expr) => {
                    #[target_feature(enable = "avx2,fma,f16c")]
                    pub unsafe fn $fname(w: &[u8], rb: usize, a: &[BlockQ8K], out: &mut [f32]) {
                        let nb = a.len();
                        assert!(rb == nb * $bytes && w.len() >= out.len() * rb);
                        let base = w.as_ptr();
                        for (j, o) in out.iter_mut().enumerate() {
                            let row = base.add(j * rb);
                            let mut acc = _mm256_setzero_ps();
                            let mut accm = _mm256_setzero_ps();
                            for (i, a) in a.iter().enumerate() {
                                let b = row.add(i * $bytes);
                                prefetch_ahead(b, $prefetch, $bytes);
                                let k: KBlock = $unpack(b);
                                let aq = a.q.as_ptr() as *const u8;
                                let mut s2 = [_mm256_setzero_si256(); 2];
                                for j in 0..8 {
                                    s2[j % 2] =
                                        kdot(s2[j % 2], k.u[j], load(aq.add(32 * j)), k.sc[j]);
                                }
                                let mut sumi = _mm256_add_epi32(s2[0], s2[1]);
                                let bs = load(a.bsums.as_ptr() as *const u8);
                                let mins = _mm256_madd_epi16(k.mg, bs);
                                if $fold {
                                    sumi = _mm256_add_epi32(sumi, mins);
                                }
                                let p = _mm256_cvtepi32_ps(sumi);
                                acc = _mm256_fmadd_ps(_mm256_set1_ps(k.d * a.d), p, acc);
                                if !$fold {
                                    let m = _mm256_cvtepi32_ps(mins);
                                    accm = _mm256_fmadd_ps(_mm256_set1_ps(k.dm * a.d), m, accm);
                                }
                            }
                            *o = hsum(_mm256_add_ps(acc, accm));
                        }
                    }
                };
            }

            /// Q4_K / Q5_K against one x row over consecutive weight rows
            /// (as `k_one_row!`), with the sub-block scales applied after
            /// the dot products rather than to each pair of products: each
            /// 32-element sub-block's quants go through `udot` unscaled (i32
            /// lanes of 4 products, at most 4 * 31 * 127 in magnitude, so
            /// they pack to i16 exactly), two sub-blocks' lanes are packed
            /// into one register of 16-bit lanes and multiplied by their
            /// scales in one `wdot`: 4 scale registers per block, built by
            /// byte shuffles of the 8 scale bytes, instead of 8 spread ones.
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn q45_k_one_row<const FIVE: bool>(
                w: &[u8],
                rb: usize,
                a: &[BlockQ8K],
                out: &mut [f32],
            ) {
                let bytes = if FIVE { 176 } else { 144 };
                let nb = a.len();
                assert!(rb == nb * bytes && w.len() >= out.len() * rb);
                let base = w.as_ptr();
                let m4 = _mm256_set1_epi8(0x0F);
                for (j, o) in out.iter_mut().enumerate() {
                    let row = base.add(j * rb);
                    let mut acc = _mm256_setzero_ps();
                    let mut accm = _mm256_setzero_ps();
                    for (i, a) in a.iter().enumerate() {
                        let b = row.add(i * bytes);
                        prefetch_ahead(b, $prefetch, bytes);
                        let qs = if FIVE { b.add(48) } else { b.add(16) };
                        let qh = if FIVE {
                            load(b.add(16))
                        } else {
                            _mm256_setzero_si256()
                        };
                        let (sc8, m8) = k4_scales_mins(b.add(4));
                        let sc = _mm256_broadcastsi128_si256(_mm_cvtsi64_si128(sc8 as i64));
                        let aq = a.q.as_ptr() as *const u8;
                        let mut sumi = _mm256_setzero_si256();
                        for jj in 0..4 {
                            let q = load(qs.add(32 * jj));
                            let mut lo = _mm256_and_si256(q, m4);
                            let mut hi = bits(q, 4, 0x0F);
                            if FIVE {
                                let h1 = bits(qh, 2 * jj as i32, 1);
                                let h2 = bits(qh, 2 * jj as i32 + 1, 1);
                                lo = _mm256_or_si256(lo, _mm256_slli_epi16(h1, 4));
                                hi = _mm256_or_si256(hi, _mm256_slli_epi16(h2, 4));
                            }
                            let t0 = udot(lo, load(aq.add(64 * jj)));
                            let t1 = udot(hi, load(aq.add(64 * jj + 32)));
                            let mask = load(PAIR_SCALES[jj].as_ptr());
                            let s = _mm256_shuffle_epi8(sc, mask);
                            sumi = wdot(sumi, _mm256_packs_epi32(t0, t1), s);
                        }
                        let m8 = _mm_cvtsi64_si128(m8 as i64);
                        let mg = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
                        let bs = load(a.bsums.as_ptr() as *const u8);
                        let mins = _mm256_cvtepi32_ps(_mm256_madd_epi16(mg, bs));
                        let d = fp16(b) * a.d;
                        let dm = -fp16(b.add(2)) * a.d;
                        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
                        accm = _mm256_fmadd_ps(_mm256_set1_ps(dm), mins, accm);
                    }
                    *o = hsum(_mm256_add_ps(acc, accm));
                }
            }

            /// Q4_K against one x row over consecutive weight rows.
            #[target_feature(enable = "avx2,fma,f16c")]
            pub unsafe fn q4_k_one_row(w: &[u8], rb: usize, a: &[BlockQ8K], out: &mut [f32]) {
                q45_k_one_row::<false>(w, rb, a, out)
            }

            /// Q5_K against one x row over consecutive weight rows.
            #[target_feature(enable = "avx2,fma,f16c")]
            pub unsafe fn q5_k_one_row(w: &[u8], rb: usize, a: &[BlockQ8K], out: &mut [f32]) {
                q45_k_one_row::<true>(w, rb, a, out)
            }

            // Q4_K with the scales spread per register as the row kernels
            // apply them: the timing test's comparison for `q4_k_one_row`.
            #[cfg(test)]
            k_one_row!(q4_k_one_row_spread, 144, false, unpack_q45_k::<false>);
            k_one_row!(q6_k_one_row, 210, true, unpack_q6_k);
        }
    };
}

one_row_kernels!(avx2_one_row, avx2_ops, WEIGHT_PREFETCH);
one_row_kernels!(vnni_one_row, vnni_ops, WEIGHT_PREFETCH);
