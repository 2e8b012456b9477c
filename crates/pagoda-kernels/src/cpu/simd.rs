//! Run-time CPU feature detection shared by the vectorized kernels.
//!
//! `is_x86_feature_detected!` caches its answer in a static, so calling these
//! per op costs a load and a branch. [`set_simd_enabled`] turns the vector
//! paths off process-wide, so tests can check the portable fallbacks on a
//! machine that has AVX2.

use std::sync::atomic::{AtomicBool, Ordering};

static DISABLED: AtomicBool = AtomicBool::new(false);

/// Enables (the default) or disables the AVX2 kernels for the whole process.
/// Results stay correct either way; only speed changes.
pub fn set_simd_enabled(enabled: bool) {
    DISABLED.store(!enabled, Ordering::Relaxed);
}

/// AVX2 + FMA + F16C: what the x86-64 GEMV and conversion kernels need.
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn has_avx2_f16c() -> bool {
    !DISABLED.load(Ordering::Relaxed)
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// AVX2 + FMA + F16C: never on other architectures.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
pub fn has_avx2_f16c() -> bool {
    false
}

/// The widest vector level the CPU kernels use here, for logs: `avx512-vnni`
/// (integer block dot products with `vpdpbusd`), `avx512` (AVX-512F, which
/// the kernels use at their AVX2 width), `avx2`, or empty (portable code).
pub fn level_name() -> &'static str {
    if !has_avx2_f16c() {
        return "";
    }
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
            return "avx512-vnni";
        }
        if is_x86_feature_detected!("avx512f") {
            return "avx512";
        }
    }
    "avx2"
}
