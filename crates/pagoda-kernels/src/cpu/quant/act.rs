//! Activations quantized to 8 bits for the integer block dot products.
//!
//! - [`BlockQ8`] (32 values, for Q4_0..Q8_0): like ggml's Q8_0/Q8_1, a scale
//!   `d = max|x| / 127`, `q = round(x / d)` in `-127..=127`, and `s = d *
//!   sum(q)` (the 4/5-bit types fold their offset or minimum into it).
//! - [`BlockQ8K`] (256 values, for the k-quants): like ggml's Q8_K, one
//!   scale per 256 values and the sums of each 16 `q` (`bsums`), which the
//!   k-quants' minimums and offsets need.
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

/// Quantizes `x` to `q` with one scale; returns the scale.
fn quantize(x: &[f32], q: &mut [i8]) -> f32 {
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
    for (b, x) in out.iter_mut().zip(x.chunks_exact(32)) {
        b.d = quantize(x, &mut b.q);
        b.s = b.d * b.q.iter().map(|&v| v as i32).sum::<i32>() as f32;
    }
}

/// Quantizes `x` (`x.len() == 256 * out.len()`) to 256-blocks.
pub fn quantize_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    debug_assert_eq!(x.len(), 256 * out.len());
    for (b, x) in out.iter_mut().zip(x.chunks_exact(256)) {
        b.d = quantize(x, &mut b.q);
        for (s, q) in b.bsums.iter_mut().zip(b.q.chunks_exact(16)) {
            *s = q.iter().map(|&v| v as i16).sum();
        }
    }
}
