//! Vectorizable elementwise math: `exp` (softmax, SiLU) and the row loops built on it.
//!
//! `exp_f32` is branch-free f32 code (Cody-Waite range reduction to
//! |r| <= ln2/2, a degree-6 polynomial, the exponent built from bits), so the
//! compiler vectorizes loops over it; relative error is about 2e-7 for inputs
//! in [-87, 88] (results saturate outside). The slice functions below are
//! compiled twice, plain and with AVX2+FMA, and pick at run time.

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
/// Adding and subtracting 1.5 * 2^23 rounds an f32 of magnitude < 2^22 to an integer.
const ROUND: f32 = 12_582_912.0;

/// `e^x` in f32 without branches or libm.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    let x = x.clamp(-87.3, 88.3);
    // t = ROUND + n with n = round(x / ln2); its low mantissa bits hold n, so
    // 2^n is built with integer ops only (no float-to-int conversion).
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    let e = t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23;
    p * f32::from_bits(e)
}

/// `x / (1 + e^-x)`.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp_f32(-x))
}

/// Runs `$body` compiled with AVX2+FMA when the CPU has them, else plain.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident: $t:ty),*) $(-> $r:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name($($a: $t),*) $(-> $r)? {
            #[inline(always)]
            fn body($($a: $t),*) $(-> $r)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($a: $t),*) $(-> $r)? {
                    body($($a),*)
                }
                if $crate::cpu::simd::has_avx2_f16c() {
                    // SAFETY: AVX2 and FMA were detected at run time.
                    return unsafe { avx2($($a),*) };
                }
            }
            body($($a),*)
        }
    };
}

multiversion! {
    /// `x[i] = e^(x[i] - max)`; returns the sum of the new values.
    pub fn exp_sub_sum(x: &mut [f32], max: f32) -> f32 {
        exp_sub_sum_inline(x, max)
    }
}

/// [`exp_sub_sum`] for inlining into a caller compiled for AVX2.
#[inline(always)]
pub fn exp_sub_sum_inline(x: &mut [f32], max: f32) -> f32 {
    {
        let mut acc = [0f32; 8];
        let mut chunks = x.chunks_exact_mut(8);
        for c in &mut chunks {
            for i in 0..8 {
                c[i] = exp_f32(c[i] - max);
                acc[i] += c[i];
            }
        }
        let mut tail = 0f32;
        for v in chunks.into_remainder() {
            *v = exp_f32(*v - max);
            tail += *v;
        }
        acc.iter().sum::<f32>() + tail
    }
}

multiversion! {
    /// `out[i] = silu(gate[i]) * up[i]`.
    pub fn silu_mul_slice(out: &mut [f32], gate: &[f32], up: &[f32]) {
        for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
            *o = silu(*g) * u;
        }
    }
}

multiversion! {
    /// Dot product in f32 with 8 partial sums.
    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        dot_inline(a, b)
    }
}

/// [`dot`] for inlining into a caller compiled for AVX2.
#[inline(always)]
pub fn dot_inline(a: &[f32], b: &[f32]) -> f32 {
    {
        let mut acc = [0f32; 8];
        let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
        let tail: f32 = ca
            .remainder()
            .iter()
            .zip(cb.remainder())
            .map(|(x, y)| x * y)
            .sum();
        for (x, y) in ca.zip(cb) {
            for i in 0..8 {
                acc[i] += x[i] * y[i];
            }
        }
        acc.iter().sum::<f32>() + tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_libm_over_the_softmax_range() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp_f32(x) as f64, (x as f64).exp());
            assert!(
                ((got - want) / want).abs() < 5e-7,
                "exp({x}) = {got}, want {want}"
            );
            x += 0.0137;
        }
        assert_eq!(exp_f32(0.0), 1.0);
        assert!(exp_f32(-1000.0) < 1e-37);
        assert!(exp_f32(1000.0).is_finite());
        assert!(exp_f32(f32::NAN).is_nan());
    }

    #[test]
    fn slice_versions_agree_with_scalar() {
        let mut x: Vec<f32> = (0..37).map(|i| i as f32 * 0.3 - 5.0).collect();
        let want: Vec<f32> = x.iter().map(|&v| exp_f32(v - 2.0)).collect();
        let sum = exp_sub_sum(&mut x, 2.0);
        assert_eq!(x, want);
        assert!((sum - want.iter().sum::<f32>()).abs() < 1e-4);
        let g: Vec<f32> = (0..19).map(|i| i as f32 - 9.0).collect();
        let mut o = vec![0.0; 19];
        silu_mul_slice(&mut o, &g, &g);
        for i in 0..19 {
            let s = g[i] as f64 / (1.0 + (-g[i] as f64).exp()) * g[i] as f64;
            assert!((o[i] as f64 - s).abs() < 1e-5 * (1.0 + s.abs()));
        }
        assert!((dot(&g, &g) - g.iter().map(|v| v * v).sum::<f32>()).abs() < 1e-3);
    }
}
