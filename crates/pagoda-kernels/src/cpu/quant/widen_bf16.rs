//! Blocks widened straight to bf16, for the AMX tiles' weight panels
//! ([`super::super::amx`]): each block is unpacked, scaled and rounded in
//! registers, with no f32 pass through memory.
//!
//! - Types: Q4_1, Q8_0, Q4_K, Q5_K and Q6_K (those of the default model and
//!   of Q4_K_M / Q5_K_M files); [`rows`] returns false for the others and on
//!   CPUs without AVX-512 F/BW and AVX512-BF16, and the caller widens to f32
//!   and rounds. [`rows`] takes a slice of several rows at once (one call
//!   per tile block, not per row).
//! - Numbers: each element is the f32 the portable dequantizers compute (the
//!   same multiply, then add, in the same order; no fused multiply-add),
//!   rounded to nearest even by `vcvtne2ps2bf16`: the bits of rounding the
//!   f32 [`super::dequantize`] output, for every value these formats give (the
//!   instruction flushes f32 subnormals, which f16 scales times small
//!   integers never produce). `bf16_widening_is_the_rounded_dequantizer`
//!   checks it on random blocks of every type here.

use crate::GgmlType;

/// Whether [`rows`] has `ty` on this CPU.
pub(crate) fn handles(ty: GgmlType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use GgmlType as T;
        matches!(ty, T::Q4_1 | T::Q8_0 | T::Q4_K | T::Q5_K | T::Q6_K) && imp::cpu()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        false
    }
}

/// Rows `r0..r0 + nr` of a weight of blocks of `ty` (`w`, rows of `k`
/// elements), elements `k0..k0 + len` of each (whole blocks), widened as
/// bf16 bits into `out` (row `i` at `i * stride`); returns false (writing
/// nothing) where [`handles`] says no.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rows(
    ty: GgmlType,
    w: &[u8],
    k: usize,
    (r0, nr): (usize, usize),
    (k0, len): (usize, usize),
    out: &mut [u16],
    stride: usize,
) -> bool {
    if !handles(ty) {
        return false;
    }
    let (bs, ts) = (ty.block_size(), ty.type_size());
    let rb = k / bs * ts;
    assert!(k.is_multiple_of(bs) && k0.is_multiple_of(bs) && len.is_multiple_of(bs));
    assert!(k0 + len <= k && w.len() >= (r0 + nr) * rb);
    assert!(nr == 0 || out.len() >= (nr - 1) * stride + len);
    let bytes = len / bs * ts;
    for i in 0..nr {
        let at = (r0 + i) * rb + k0 / bs * ts;
        let src = &w[at..at + bytes];
        // The row's next piece, which the caller widens after its other
        // rows (many rows apart: no hardware prefetcher follows them all).
        let next = (rb - k0 / bs * ts - bytes).min(bytes);
        #[cfg(target_arch = "x86_64")]
        for line in (0..next).step_by(64) {
            // SAFETY: a prefetch reads no memory and cannot fault; the
            // address lies inside `w` anyway (the row's next piece).
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                _mm_prefetch::<_MM_HINT_T1>(w.as_ptr().add(at + bytes + line) as *const i8)
            };
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `handles` saw AVX-512 F/BW, AVX512-BF16, AVX2, FMA and
        // F16C; `src` holds `len / bs` whole blocks and the slice of `out`
        // their elements.
        unsafe {
            imp::blocks(ty, src, &mut out[i * stride..i * stride + len])
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = src;
    }
    true
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::super::scalar::scale_min_k4;
    use super::super::x86::{fp16, unpack_q45_k, unpack_q6_k};
    use crate::GgmlType;
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    pub(super) fn cpu() -> bool {
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            super::super::Isa::Avx2.is_available()
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512bf16")
        })
    }

    /// `lo` and `hi` (16 f32 each) rounded into 32 bf16 at `out`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn store(lo: __m512, hi: __m512, out: *mut u16) {
        let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
        _mm512_storeu_si512(out.cast(), v);
    }

    /// The 32 bytes of `u` as two registers of 16 i32 (zero-extended).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    unsafe fn bytes_u32(u: __m256i) -> (__m512i, __m512i) {
        (
            _mm512_cvtepu8_epi32(_mm256_castsi256_si128(u)),
            _mm512_cvtepu8_epi32(_mm256_extracti128_si256::<1>(u)),
        )
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
    pub(super) unsafe fn blocks(ty: GgmlType, bytes: &[u8], out: &mut [u16]) {
        let (bs, ts) = (ty.block_size(), ty.type_size());
        let pairs = out.chunks_exact_mut(bs).zip(bytes.chunks_exact(ts));
        match ty {
            GgmlType::Q4_1 => pairs.for_each(|(o, b)| q4_1(b.as_ptr(), o.as_mut_ptr())),
            GgmlType::Q8_0 => pairs.for_each(|(o, b)| q8_0(b.as_ptr(), o.as_mut_ptr())),
            GgmlType::Q4_K => pairs.for_each(|(o, b)| q45_k::<false>(b, o.as_mut_ptr())),
            GgmlType::Q5_K => pairs.for_each(|(o, b)| q45_k::<true>(b, o.as_mut_ptr())),
            _ => pairs.for_each(|(o, b)| q6_k(b.as_ptr(), o.as_mut_ptr())),
        }
    }

    /// Q4_1 (20 bytes): `q d + m`, low nibbles the first 16 elements.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
    unsafe fn q4_1(b: *const u8, y: *mut u16) {
        let (d, m) = (_mm512_set1_ps(fp16(b)), _mm512_set1_ps(fp16(b.add(2))));
        let qs = _mm_loadu_si128(b.add(4) as *const __m128i);
        let m4 = _mm_set1_epi8(0x0F);
        let lo = _mm512_cvtepu8_epi32(_mm_and_si128(qs, m4));
        let hi = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(qs, 4), m4));
        let f = |q: __m512i| _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(q), d), m);
        store(f(lo), f(hi), y);
    }

    /// Q8_0 (34 bytes): `q d`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
    unsafe fn q8_0(b: *const u8, y: *mut u16) {
        let d = _mm512_set1_ps(fp16(b));
        let lo = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(2) as *const __m128i));
        let hi = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(18) as *const __m128i));
        let f = |q: __m512i| _mm512_mul_ps(_mm512_cvtepi32_ps(q), d);
        store(f(lo), f(hi), y);
    }

    /// Q4_K / Q5_K (144 / 176 bytes): `(d sc) q - dmin m` per sub-block of 32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
    unsafe fn q45_k<const FIVE: bool>(b: &[u8], y: *mut u16) {
        let kb = unpack_q45_k::<FIVE>(b.as_ptr());
        for (j, &u) in kb.u.iter().enumerate() {
            let (sc, m) = scale_min_k4(j, &b[4..16]);
            // `kb.dm` is `-dmin`: adding `-dmin m` is subtracting `dmin m`.
            let (ds, mn) = (
                _mm512_set1_ps(kb.d * sc as f32),
                _mm512_set1_ps(kb.dm * m as f32),
            );
            let (lo, hi) = bytes_u32(u);
            let f = |q: __m512i| _mm512_add_ps(_mm512_mul_ps(ds, _mm512_cvtepi32_ps(q)), mn);
            store(f(lo), f(hi), y.add(32 * j));
        }
    }

    /// Q6_K (210 bytes): `(d sc) (q - 32)` per 16 elements.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
    unsafe fn q6_k(b: *const u8, y: *mut u16) {
        let kb = unpack_q6_k(b);
        let sc = b.add(192) as *const i8;
        let off = _mm512_set1_epi32(32);
        for (j, &u) in kb.u.iter().enumerate() {
            let (lo, hi) = bytes_u32(u);
            let f = |q: __m512i, s: i8| {
                let q = _mm512_cvtepi32_ps(_mm512_sub_epi32(q, off));
                _mm512_mul_ps(_mm512_set1_ps(kb.d * s as f32), q)
            };
            store(
                f(lo, *sc.add(2 * j)),
                f(hi, *sc.add(2 * j + 1)),
                y.add(32 * j),
            );
        }
    }
}
