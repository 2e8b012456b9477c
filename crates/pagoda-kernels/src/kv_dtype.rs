//! The element type of the paged KV cache, as asked for (`--kv-cache-dtype`)
//! and as a backend stores it.
//!
//! `Auto` is each backend's native cache (f32 on the CPU, bf16 on CUDA);
//! `Bf16` asks for bf16 by name (CUDA only: the CPU refuses it rather than
//! store something else); `Fp8` stores FP8 E4M3 bytes (see [`crate::fp8`])
//! with one f32 scale for K and one for V per layer, `value = byte * scale`
//! (1.0 unless the checkpoint carries `k_scale` / `v_scale`). Writes divide
//! by the scale, round to nearest even and saturate to ±448; attention
//! dequantizes on load and accumulates in f32.

use std::fmt;
use std::str::FromStr;

/// The KV cache element type asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCacheDtype {
    /// The backend's native cache (f32 on the CPU, bf16 on CUDA).
    #[default]
    Auto,
    /// bf16 (CUDA).
    Bf16,
    /// FP8 E4M3 with a per-layer scale for K and for V.
    Fp8,
}

impl KvCacheDtype {
    /// The accepted spellings, for error messages and help.
    pub const NAMES: &'static str = "auto, bf16, fp8 (fp8_e4m3)";
}

impl FromStr for KvCacheDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(KvCacheDtype::Auto),
            "bf16" | "bfloat16" => Ok(KvCacheDtype::Bf16),
            "fp8" | "fp8_e4m3" => Ok(KvCacheDtype::Fp8),
            _ => Err(format!(
                "unknown KV cache dtype {s:?} (expected one of: {})",
                Self::NAMES
            )),
        }
    }
}

impl fmt::Display for KvCacheDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvCacheDtype::Auto => "auto",
            KvCacheDtype::Bf16 => "bf16",
            KvCacheDtype::Fp8 => "fp8",
        })
    }
}

/// Checks a per-layer KV scale (positive and finite).
pub fn check_kv_scale(name: &str, s: f32) -> Result<(), String> {
    if s.is_finite() && s > 0.0 {
        Ok(())
    } else {
        Err(format!("{name} {s} is not positive and finite"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_the_alias() {
        assert_eq!("auto".parse(), Ok(KvCacheDtype::Auto));
        assert_eq!("bf16".parse(), Ok(KvCacheDtype::Bf16));
        assert_eq!("fp8".parse(), Ok(KvCacheDtype::Fp8));
        assert_eq!("FP8_E4M3".parse(), Ok(KvCacheDtype::Fp8));
        let e = "fp16".parse::<KvCacheDtype>().unwrap_err();
        assert!(e.contains("fp16") && e.contains("fp8_e4m3"), "{e}");
        assert!("fp8_e5m2".parse::<KvCacheDtype>().is_err());
        for d in [KvCacheDtype::Auto, KvCacheDtype::Bf16, KvCacheDtype::Fp8] {
            assert_eq!(d.to_string().parse(), Ok(d));
        }
    }

    #[test]
    fn scales_must_be_positive_and_finite() {
        assert!(check_kv_scale("k_scale", 0.5).is_ok());
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert!(check_kv_scale("k_scale", bad).is_err());
        }
    }
}
