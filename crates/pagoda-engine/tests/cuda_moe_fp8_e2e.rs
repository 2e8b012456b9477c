//! FP8 experts end to end on CUDA: the tiny mixture-of-experts goldens
//! (Qwen3-MoE, Mixtral, Qwen2-MoE) under `--quantization fp8` (dense
//! layers through the FP8 GEMMs, experts through the FP8 expert kernels)
//! against the CPU reference of the same FP8 model: every step's logits of
//! a batched teacher-forced trace (one prefill of all prompts, so the
//! grouped expert path, then decode steps on the GEMV path) within the bar
//! calibrated on the CPU (tests/common/fp8_calibration.rs, as cuda_fp8.rs
//! does for dense FP8 models): bf16 activations between the layers, and
//! the router held in bf16, against the reference's f32 flip some
//! per-token input codes of the dense layers and some expert choices,
//! and these tiny dummy-weight models amplify that; the bar is a multiple
//! of how far the reference itself moves under such differences. The
//! expert op alone is held to 1e-2 by pagoda-kernels' cuda_moe_fp8.rs.
#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::fp8_calibration::*;
use cuda_common::*;

/// Decode steps of the teacher-forced traces (after the prefill step).
const STEPS: usize = 8;

#[test]
fn tiny_moe_models_in_fp8_on_cuda_match_the_cpu_reference() {
    let Some(_) = gpu() else { return };
    let mut failures = Vec::new();
    for arch in ["qwen3-moe", "mixtral", "qwen2-moe"] {
        let case = GoldenCase::load(&repo_root(), arch, STEPS);
        let (cfg, src, trace) = (&case.cfg, &case.src, case.trace());
        let cal = calibrate(cfg, src, Some(src), &trace);
        let g = gpu().unwrap().with_fp8_weights(true);
        let v = cal.check(&trace.run(g, cfg, src));
        let what = format!("{arch}: CUDA fp8 vs CPU fp8");
        eprintln!("{what}\n{}", v.report);
        if !v.pass {
            failures.push(what);
        }
    }
    assert!(
        failures.is_empty(),
        "over the calibrated bar (see the per-step lines above): {failures:?}"
    );
}
