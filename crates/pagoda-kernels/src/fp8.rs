//! FP8 E4M3 ("e4m3fn": no infinities, one NaN pattern per sign, largest
//! finite 448) on the host: the one encoder and decoder every backend and
//! test uses, so host references and device kernels agree bit for bit.
//!
//! Encoding rounds to nearest even and saturates finite values to ±448, as
//! the device's `cvt.rn.satfinite.e4m3x2.f32` does; NaN stays NaN (0x7f with
//! the sign). The device side of the same rules is `f2fp8` / `fp82f` in the
//! kernels' prelude.

/// Largest finite E4M3 magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// Decodes one E4M3 byte.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = (b >> 3) & 0x0f;
    let mant = (b & 0x07) as f32;
    if exp == 0x0f && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        // Subnormal: mant/8 * 2^-6.
        return sign * mant * (1.0 / 512.0);
    }
    sign * (1.0 + mant / 8.0) * f32::powi(2.0, exp as i32 - 7)
}

/// Encodes one f32 as E4M3: round to nearest even, saturate to ±448.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    if a < 1.0 / 64.0 {
        // Subnormal range (and the rounding up into the smallest normal,
        // code 0x08, which `q == 8` encodes by itself).
        let q = (a * 512.0).round_ties_even() as u8;
        return sign | q;
    }
    let bits = a.to_bits();
    let exp = ((bits >> 23) as i32) - 127 + 7;
    let mut mant = (bits >> 20) & 0x7;
    let rem = bits & 0x000f_ffff;
    let mut e = exp as u32;
    if rem > 0x8_0000 || (rem == 0x8_0000 && mant & 1 == 1) {
        mant += 1;
        if mant == 8 {
            mant = 0;
            e += 1;
        }
    }
    let code = (e << 3) | mant;
    sign | code.min(0x7e) as u8
}

/// The scale that maps `amax` onto the E4M3 range (1 for an all-zero input).
pub fn scale_for_amax(amax: f32) -> f32 {
    if amax > 0.0 && amax.is_finite() {
        amax / E4M3_MAX
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for c in 0u8..=255 {
            let v = e4m3_to_f32(c);
            if c & 0x7f == 0x7f {
                assert!(v.is_nan(), "code {c:#x}");
                continue;
            }
            let back = f32_to_e4m3(v);
            // -0.0 encodes as 0x80; both zeros decode to zero.
            assert_eq!(back, c, "code {c:#x} value {v}");
        }
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 1.0 / 512.0);
        assert_eq!(e4m3_to_f32(0x08), 1.0 / 64.0);
    }

    #[test]
    fn rounds_to_nearest_even_and_saturates() {
        // Between neighbours, the nearer one wins; at the midpoint, the even code.
        for c in 0u8..0x7e {
            let (lo, hi) = (e4m3_to_f32(c), e4m3_to_f32(c + 1));
            let mid = (lo + hi) / 2.0;
            let even = if c & 1 == 0 { c } else { c + 1 };
            assert_eq!(f32_to_e4m3(mid), even, "midpoint of {c:#x}");
            assert_eq!(f32_to_e4m3(lo + (hi - lo) * 0.25), c);
            assert_eq!(f32_to_e4m3(lo + (hi - lo) * 0.75), c + 1);
            assert_eq!(f32_to_e4m3(-(lo + (hi - lo) * 0.75)), 0x80 | (c + 1));
        }
        assert_eq!(f32_to_e4m3(1e9), 0x7e);
        assert_eq!(f32_to_e4m3(-460.0), 0xfe);
        assert_eq!(f32_to_e4m3(f32::INFINITY), 0x7e);
        assert_eq!(f32_to_e4m3(f32::NAN), 0x7f);
        assert_eq!(f32_to_e4m3(1e-9), 0);
    }

    #[test]
    fn scale_maps_amax_to_the_largest_code() {
        let s = scale_for_amax(3.5);
        assert_eq!(f32_to_e4m3(3.5 / s), 0x7e);
        assert_eq!(scale_for_amax(0.0), 1.0);
    }
}
