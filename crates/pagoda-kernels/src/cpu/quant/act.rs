//! Activations quantized to 8 bits for the integer block dot products.
//!
//! - [`BlockQ8`] (32 values, for Q4_0..Q8_0): like ggml's Q8_0/Q8_1, a scale
//!   `d = max|x| / 127`, `q = round(x / d)` in `-127..=127`, and `s = d *
//!   sum(q)` (the 4/5-bit types fold their offset or minimum into it).
//! - [`BlockQ8K`] (256 values, for the k-quants): like ggml's Q8_K, one
//!   scale per 256 values and the sums of each 16 `q` (`bsums`), which the
//!   k-quants' minimums and offsets need.
//!
//! With AVX2 the scale and rounding take 32 values at a time.
//!
//! Rounding each value to the nearest multiple of `d` errs by at most
//! `d / 2 = max|x| / 254` per element: this is the tolerance the kernel tests
//! derive their bounds from.

/// 32 activations quantized to 8 bits.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ8 {
    /// Scale: `x ~ d * q`.
    pub d: f32,
    /// `d * sum(q)`.
    pub s: f32,
    pub q: [i8; 32],
}

/// 256 activations quantized to 8 bits.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ8K {
    /// Scale: `x ~ d * q`.
    pub d: f32,
    pub q: [i8; 256],
    /// `bsums[g]`: sum of `q[16 g..16 g + 16]`.
    pub bsums: [i16; 16],
}

impl Default for BlockQ8 {
    fn default() -> Self {
        BlockQ8 {
            d: 0.0,
            s: 0.0,
            q: [0; 32],
        }
    }
}

impl Default for BlockQ8K {
    fn default() -> Self {
        BlockQ8K {
            d: 0.0,
            q: [0; 256],
            bsums: [0; 16],
        }
    }
}

/// Quantizes `x` to `q` with one scale; returns the scale. With AVX2 (32
/// values at a time) ties round to even rather than away from zero, which
/// only moves a value that is exactly halfway, within the same `d / 2`.
///
/// The block is an array (`N` = 32 or 256), so each length gets its own
/// copy compiled with it and no length crosses the call: the same machine
/// code whatever else the crate holds (with slices, whether the compiler
/// learnt the length from the callers depended on how the crate was split
/// into code generation units, which differs with feature `cuda`).
fn quantize<const N: usize>(x: &[f32; N], q: &mut [i8; N]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if N.is_multiple_of(32) && crate::cpu::simd::has_avx2_f16c() {
        // SAFETY: AVX2 detected; `x` and `q` are whole groups of 32.
        return unsafe { x86::quantize::<N>(x, q) };
    }
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round().clamp(-127.0, 127.0) as i8;
    }
    d
}

/// Quantizes `x` (`x.len() == 32 * out.len()`) to 32-blocks.
pub fn quantize_q8(x: &[f32], out: &mut [BlockQ8]) {
    debug_assert_eq!(x.len(), 32 * out.len());
    let blocks = x.chunks_exact(32).filter_map(|x| x.try_into().ok());
    for (b, x) in out.iter_mut().zip(blocks) {
        b.d = quantize(x, &mut b.q);
        b.s = b.d * b.q.iter().map(|&v| v as i32).sum::<i32>() as f32;
    }
}

/// Quantizes `x` (`x.len() == 256 * out.len()`) to 256-blocks.
pub fn quantize_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    debug_assert_eq!(x.len(), 256 * out.len());
    let blocks = x.chunks_exact(256).filter_map(|x| x.try_into().ok());
    for (b, x) in out.iter_mut().zip(blocks) {
        b.d = quantize(x, &mut b.q);
        for (s, q) in b.bsums.iter_mut().zip(b.q.chunks_exact(16)) {
            *s = q.iter().map(|&v| v as i16).sum();
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// The 8 values at `p` times `id`, rounded to the nearest integer.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn round8(p: *const f32, id: __m256) -> __m256i {
        let v = _mm256_mul_ps(_mm256_loadu_ps(p), id);
        _mm256_cvtps_epi32(_mm256_round_ps(
            v,
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        ))
    }

    /// [`super::quantize`] with AVX2; `N` a multiple of 32.
    #[target_feature(enable = "avx2")]
    pub unsafe fn quantize<const N: usize>(x: &[f32; N], q: &mut [i8; N]) -> f32 {
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_setzero_ps();
        for c in x.chunks_exact(8) {
            // max(|x|, m) keeps m when x is NaN, as the portable fold does.
            m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(c.as_ptr())), m);
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        let amax = lanes.iter().fold(0f32, |a, &v| a.max(v));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        for (c, o) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)) {
            let p = c.as_ptr();
            let (a, b) = (round8(p, id), round8(p.add(8), id));
            let (cc, dd) = (round8(p.add(16), id), round8(p.add(24), id));
            // packs work per 128-bit lane: restore the element order after.
            let v = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(cc, dd));
            let v = _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            let v = _mm256_max_epi8(v, _mm256_set1_epi8(-127));
            _mm256_storeu_si256(o.as_mut_ptr() as *mut __m256i, v);
        }
        d
    }
}
