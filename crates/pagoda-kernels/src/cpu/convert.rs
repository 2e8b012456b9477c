//! Narrow-float to f32 conversion of weight rows, vectorized where the CPU allows.
//!
//! f16 uses F16C (`vcvtph2ps`, 8 values per instruction) when detected at run
//! time, else `half`'s conversion; bf16 is a 16-bit shift, which the compiler
//! vectorizes. Both are exact (every f16/bf16 is an f32).

use half::{bf16, f16};

/// `dst[i] = src[i] as f32`; the slices have equal length.
pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    debug_assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    {
        if super::simd::has_avx2_f16c() {
            // SAFETY: AVX2 and F16C were detected at run time.
            unsafe { f16_to_f32_f16c(src, dst) };
            return;
        }
    }
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_to_f32_f16c(src: &[f16], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    for j in i..n {
        dst[j] = src[j].to_f32();
    }
}

/// `dst[i] = src[i] as f32`; the slices have equal length.
pub fn bf16_to_f32(src: &[bf16], dst: &mut [f32]) {
    debug_assert_eq!(src.len(), dst.len());
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f32::from_bits((s.to_bits() as u32) << 16);
    }
}
