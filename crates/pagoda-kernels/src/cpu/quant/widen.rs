//! Blocks widened to f32 with AVX2, for the prefill GEMM's weight tiles
//! (many x rows against one weight: [`super::super::matmul`] dequantizes a
//! tile once and runs the f32 GEMM).
//!
//! Q4_1, Q8_0, Q4_K, Q5_K and Q6_K (the types of the default model and of
//! Q4_K_M / Q5_K_M files) have SIMD widening; every other type, and machines without AVX2, take
//! `pagoda_gguf`'s portable dequantizers. The SIMD code performs the same f32
//! operations in the same order as those (a multiply, then an add or
//! subtract; no fused multiply-add), so its output is bitwise identical.

use crate::GgmlType;

/// Widens whole blocks of `ty` in `bytes` into `out` (`out.len()` elements),
/// with SIMD where `simd` and the type has it; returns false when the type
/// has no dequantizer.
pub(super) fn widen(ty: GgmlType, bytes: &[u8], out: &mut [f32], simd: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    use GgmlType as T;
    #[cfg(target_arch = "x86_64")]
    if simd && matches!(ty, T::Q4_1 | T::Q8_0 | T::Q4_K | T::Q5_K | T::Q6_K) {
        let (bs, ts) = (ty.block_size(), ty.type_size());
        let blocks = out.len() / bs;
        assert!(out.len().is_multiple_of(bs) && bytes.len() >= blocks * ts);
        // SAFETY: `simd` is set only where AVX2 + F16C were detected
        // (`Isa::Avx2` or better); `bytes` holds `blocks` whole blocks.
        unsafe { x86::blocks(ty, &bytes[..blocks * ts], out) };
        return true;
    }
    let _ = simd;
    pagoda_gguf::dequant::dequantize_into(ty, bytes, out).is_ok()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::scalar::scale_min_k4;
    use std::arch::x86_64::*;

    // The f16 loads through `vmovd` (`_mm_cvtsi32_si128` compiled to
    // `vpinsrw` into whatever register, chaining each block's scales to
    // earlier work).
    use super::super::x86::fp16;
    use crate::GgmlType;

    /// Every block of `bytes` (Q4_1, Q8_0, Q4_K, Q5_K or Q6_K) widened into `out`, in
    /// one loop per type (the per-block functions inlined).
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn blocks(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
        let (bs, ts) = (ty.block_size(), ty.type_size());
        let pairs = out.chunks_exact_mut(bs).zip(bytes.chunks_exact(ts));
        match ty {
            GgmlType::Q4_1 => {
                for (o, b) in pairs {
                    q4_1(b.as_ptr(), o.as_mut_ptr());
                }
            }
            GgmlType::Q8_0 => {
                for (o, b) in pairs {
                    q8_0(b.as_ptr(), o.as_mut_ptr());
                }
            }
            GgmlType::Q4_K => {
                for (o, b) in pairs {
                    q4_k(b.as_ptr(), o.as_mut_ptr());
                }
            }
            GgmlType::Q5_K => {
                for (o, b) in pairs {
                    q5_k(b.as_ptr(), o.as_mut_ptr());
                }
            }
            _ => {
                for (o, b) in pairs {
                    q6_k(b.as_ptr(), o.as_mut_ptr());
                }
            }
        }
    }

    /// The 8 bytes at `p` (each `0..=255`) as f32.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn u8x8(p: *const u8) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i)))
    }

    /// `y[i] = q[i] * d - m` for 32 quants at `q` (bytes) into `y`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn mul_sub(q: *const u8, d: f32, m: f32, y: *mut f32) {
        let (d, m) = (_mm256_set1_ps(d), _mm256_set1_ps(m));
        for i in 0..4 {
            let v = _mm256_sub_ps(_mm256_mul_ps(d, u8x8(q.add(8 * i))), m);
            _mm256_storeu_ps(y.add(8 * i), v);
        }
    }

    /// Q4_1 (20 bytes): `x = q d + m`.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    unsafe fn q4_1(b: *const u8, y: *mut f32) {
        let (d, m) = (fp16(b), fp16(b.add(2)));
        let x = _mm_loadu_si128(b.add(4) as *const __m128i);
        let mut q = [0u8; 32];
        _mm_storeu_si128(
            q.as_mut_ptr() as *mut __m128i,
            _mm_and_si128(x, _mm_set1_epi8(0x0F)),
        );
        let hi = _mm_and_si128(_mm_srli_epi16(x, 4), _mm_set1_epi8(0x0F));
        _mm_storeu_si128(q.as_mut_ptr().add(16) as *mut __m128i, hi);
        let (dv, mv) = (_mm256_set1_ps(d), _mm256_set1_ps(m));
        for i in 0..4 {
            let v = _mm256_add_ps(_mm256_mul_ps(u8x8(q.as_ptr().add(8 * i)), dv), mv);
            _mm256_storeu_ps(y.add(8 * i), v);
        }
    }

    /// Q8_0 (34 bytes): `x = q d`, q signed.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    unsafe fn q8_0(b: *const u8, y: *mut f32) {
        let d = _mm256_set1_ps(fp16(b));
        for i in 0..4 {
            let p = b.add(2 + 8 * i) as *const __m128i;
            let q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p)));
            _mm256_storeu_ps(y.add(8 * i), _mm256_mul_ps(q, d));
        }
    }

    /// Q5_K (176 bytes): `x = (d sc) q - dmin m` per 32-element sub-block,
    /// q's fifth bit from `qh` (bit `2 i` for the low nibbles of quarter
    /// `i`, bit `2 i + 1` for the high ones).
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    unsafe fn q5_k(b: *const u8, y: *mut f32) {
        let (d, dmin) = (fp16(b), fp16(b.add(2)));
        let scales = std::slice::from_raw_parts(b.add(4), 12);
        let qh = _mm256_loadu_si256(b.add(16) as *const __m256i);
        let (m4, sixteen) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(16));
        // 16 where `qh`'s bit `bit` is set, else 0.
        let high = |bit: i32| {
            let u = _mm256_set1_epi8((1u8 << bit) as i8);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, u), u);
            _mm256_and_si256(set, sixteen)
        };
        for i in 0..4 {
            let x = _mm256_loadu_si256(b.add(48 + 32 * i) as *const __m256i);
            let lo = _mm256_add_epi8(_mm256_and_si256(x, m4), high(2 * i as i32));
            let hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
            let hi = _mm256_add_epi8(hi, high(2 * i as i32 + 1));
            k_quarter(lo, hi, i, (d, dmin), scales, y);
        }
    }

    /// Q4_K (144 bytes): `x = (d sc) q - dmin m` per 32-element sub-block.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    unsafe fn q4_k(b: *const u8, y: *mut f32) {
        let (d, dmin) = (fp16(b), fp16(b.add(2)));
        let scales = std::slice::from_raw_parts(b.add(4), 12);
        for i in 0..4 {
            let x = _mm256_loadu_si256(b.add(16 + 32 * i) as *const __m256i);
            let m4 = _mm256_set1_epi8(0x0F);
            let lo = _mm256_and_si256(x, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
            k_quarter(lo, hi, i, (d, dmin), scales, y);
        }
    }

    /// Quarter `i` (64 elements) of a Q4_K / Q5_K block from its quants:
    /// `lo` (sub-block `2 i`) and `hi` (sub-block `2 i + 1`), each element
    /// `(d sc) q - dmin m` with its sub-block's 6-bit scale and minimum.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn k_quarter(
        lo: __m256i,
        hi: __m256i,
        i: usize,
        (d, dmin): (f32, f32),
        scales: &[u8],
        y: *mut f32,
    ) {
        let mut q = [0u8; 64];
        _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, lo);
        _mm256_storeu_si256(q.as_mut_ptr().add(32) as *mut __m256i, hi);
        let (sc1, m1) = scale_min_k4(2 * i, scales);
        let (sc2, m2) = scale_min_k4(2 * i + 1, scales);
        let yo = y.add(64 * i);
        mul_sub(q.as_ptr(), d * sc1 as f32, dmin * m1 as f32, yo);
        mul_sub(
            q.as_ptr().add(32),
            d * sc2 as f32,
            dmin * m2 as f32,
            yo.add(32),
        );
    }

    /// Q6_K (210 bytes): `x = (d sc) (q - 32)`, 16 elements per scale.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    unsafe fn q6_k(b: *const u8, y: *mut f32) {
        let d = fp16(b.add(208));
        let sc = std::slice::from_raw_parts(b.add(192) as *const i8, 16);
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(3);
        let mut q = [0i8; 128];
        for h in 0..2 {
            let ql0 = _mm256_loadu_si256(b.add(64 * h) as *const __m256i);
            let ql1 = _mm256_loadu_si256(b.add(64 * h + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(b.add(128 + 32 * h) as *const __m256i);
            let parts = [
                (_mm256_and_si256(ql0, m4), _mm256_and_si256(qh, m2)),
                (
                    _mm256_and_si256(ql1, m4),
                    _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2),
                ),
                (
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                    _mm256_and_si256(_mm256_srli_epi16(qh, 4), m2),
                ),
                (
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                    _mm256_and_si256(_mm256_srli_epi16(qh, 6), m2),
                ),
            ];
            for (r, (lo, hi)) in parts.into_iter().enumerate() {
                let v = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
                let v = _mm256_sub_epi8(v, _mm256_set1_epi8(32));
                _mm256_storeu_si256(q.as_mut_ptr().add(32 * r) as *mut __m256i, v);
            }
            for g in 0..8 {
                // Elements 128 h + 16 g.. take scale 8 h + g.
                let ds = _mm256_set1_ps(d * sc[8 * h + g] as f32);
                for i in 0..2 {
                    let p = q.as_ptr().add(16 * g + 8 * i) as *const __m128i;
                    let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p)));
                    _mm256_storeu_ps(y.add(128 * h + 16 * g + 8 * i), _mm256_mul_ps(ds, v));
                }
            }
        }
    }
}
