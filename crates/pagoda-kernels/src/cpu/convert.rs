//! Narrow-float to f32 conversion of weight rows, vectorized where the CPU allows.
//!
//! f16 uses F16C (`vcvtph2ps`, 8 values per instruction) when detected at run
//! time, else `half`'s conversion; bf16 is a 16-bit shift, which the compiler
//! vectorizes. Both are exact (every f16/bf16 is an f32). The one narrowing,
//! [`round_to_bf16`], rounds f32 values to bf16 in place (nearest even).

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

/// Rounds each value to its nearest bf16 (ties to even; NaN stays NaN), in place.
pub fn round_to_bf16(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = bf16::from_f32(*v).to_f32();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_to_bf16_is_nearest_even() {
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to the even 1.
        let mut x = [
            1.0 + 2f32.powi(-8),
            1.0 + 3.0 * 2f32.powi(-8),
            -2.5,
            f32::NAN,
        ];
        round_to_bf16(&mut x);
        assert_eq!(x[0], 1.0);
        assert_eq!(x[1], 1.0 + 2.0 * 2f32.powi(-7));
        assert_eq!(x[2], -2.5);
        assert!(x[3].is_nan());
    }
}
