//! FP8 weights (`--quantization fp8`) end to end on CUDA.
//!
//! 1. Tiny golden models (Qwen3, Llama with biases, Phi-3's fused weights)
//!    with their dense layers quantized at load, on CUDA against the CPU
//!    reference path (same codes and scales; activations quantized per token
//!    on both) over a batched teacher-forced trace (one prefill of all
//!    prompts, then decode steps), on the FP8 GEMM path the device chooses
//!    and on each one forced that the device runs (a forced path it refuses
//!    must say so at load); and the compressed-tensors checkpoint
//!    tests/golden/tiny-qwen3-fp8 loaded as stored, also against PyTorch's
//!    logits for the same FP8 arithmetic. The bar is calibrated on the CPU
//!    (tests/common/fp8_calibration.rs): per-token FP8 quantization turns
//!    bf16-level differences of the inputs (the device's bf16 activations
//!    and tables) into drift of the FP8 error's own size, so each step must
//!    stay within a multiple of the CPU reference's drift under such
//!    differences, and the mean error against the model without FP8 near
//!    the reference's. Every step's error and bar is printed, so one run
//!    shows how far any failure is from rounding.
//! 2. The Qwen3 comparison model of scripts/gpu/make_qwen3.py
//!    ($PAGODA_QWEN3_DIR, default /tmp/qwen3-small; skipped with a notice
//!    when missing): pagoda's FP8 prompt logits against PyTorch's f32 ones,
//!    next to PyTorch's own FP8 error (`fp8_reference.json`, written on the
//!    GPU host by scripts/gpu/fp8_torch_error.py with torch._scaled_mm, the
//!    same scheme): pagoda's error must stay within [`TORCH_FACTOR`] times
//!    PyTorch's (or under [`FP8_BAR`] when that file is missing).
#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::fp8_calibration::*;
use cuda_common::*;
use pagoda_kernels::cuda::{CudaBackend, Fp8GemmPath};
use pagoda_kernels::{Backend, Fp8Matrix};
use pagoda_model::loader::dummy::DummySource;
use pagoda_model::loader::safetensors::open_hf_dir;
use pagoda_model::open::{open_model, OpenOptions};
use std::path::PathBuf;

/// Pagoda's FP8 error may be at most this many times PyTorch's.
const TORCH_FACTOR: f32 = 1.5;
/// Without PyTorch's figure: FP8 logits within this of f32 (relative L2).
const FP8_BAR: f32 = 0.1;

/// A CUDA backend quantizing to FP8 at load, on `path` (`None`: the one
/// it chooses); `None` where the device refuses the forced path, which
/// only outer-vector scales may be (cuBLASLt without such kernels).
fn cuda_fp8(path: Option<Fp8GemmPath>) -> Option<CudaBackend> {
    let g = gpu()?.with_fp8_weights(true);
    let Some(path) = path else { return Some(g) };
    let g = g.with_fp8_gemm_path(path);
    let probe = Fp8Matrix::quantize(16, 32, &[0.25; 16 * 32]).unwrap();
    match g.load_fp8_linear(probe) {
        Ok(_) => Some(g),
        Err(e) => {
            let e = e.to_string();
            assert!(
                path == Fp8GemmPath::OuterVec && e.contains("outer-vector"),
                "forced {path:?} refused: {e}"
            );
            eprintln!("notice: forced {path:?} refused as expected: {e}");
            None
        }
    }
}

/// Decode steps of the teacher-forced traces (after the prefill step).
const STEPS: usize = 8;

#[test]
fn tiny_models_in_fp8_on_cuda_match_the_cpu_reference() {
    let Some(_) = gpu() else { return };
    let mut failures = Vec::new();
    for arch in ["qwen3", "llama-attnbias", "phi3"] {
        let case = GoldenCase::load(&repo_root(), arch, STEPS);
        let (cfg, src, trace) = (&case.cfg, &case.src, case.trace());
        let cal = calibrate(cfg, src, Some(src), &trace);
        let paths = [
            None,
            Some(Fp8GemmPath::OuterVec),
            Some(Fp8GemmPath::UnitScaled),
        ];
        for path in paths {
            let Some(g) = cuda_fp8(path) else { continue };
            let v = cal.check(&trace.run(g, cfg, src));
            let what = format!("{arch} ({path:?}): CUDA fp8 vs CPU fp8");
            eprintln!("{what}\n{}", v.report);
            if !v.pass {
                failures.push(what);
            }
        }
    }
    // The FP8 checkpoint as stored (the tiny Qwen3 model's weights, so its
    // model without FP8 is the dummy one), and against PyTorch's FP8
    // arithmetic: the CPU reference's own distance from PyTorch (held by
    // golden_fp8.rs) plus the calibrated bar.
    let dir = repo_root().join("tests/golden/tiny-qwen3-fp8");
    let (cfg, src) = open_hf_dir(&dir).unwrap();
    let dense = DummySource::new(&cfg).unwrap();
    let golden: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("golden.json")).unwrap()).unwrap();
    let (prompts, forced) = golden_inputs(&golden, STEPS);
    let trace = Trace {
        prompts: &prompts,
        forced: &forced,
        blocks: blocks_needed(&prompts, STEPS) + 4,
    };
    let cal = calibrate(&cfg, &src, Some(&dense), &trace);
    let got = trace.run(gpu().unwrap(), &cfg, &src);
    let v = cal.check(&got);
    eprintln!("FP8 checkpoint: CUDA vs CPU\n{}", v.report);
    if !v.pass {
        failures.push("FP8 checkpoint: CUDA vs CPU".into());
    }
    let bar0 = cal.bar()[0];
    for (i, p) in golden["prompts"].as_array().unwrap().iter().enumerate() {
        let torch = floats(&p["last_logits"]);
        let err = rel_err_l2(&got[i][0], &torch);
        let cpu = rel_err_l2(&cal.reference[i][0], &torch);
        let bar = cpu + bar0;
        eprintln!(
            "FP8 checkpoint prompt {i}: CUDA vs PyTorch {err:.4} (CPU vs PyTorch {cpu:.4}, bar {bar:.4})"
        );
        if err.is_nan() || err > bar {
            failures.push(format!("FP8 checkpoint prompt {i}: CUDA vs PyTorch {err}"));
        }
    }
    assert!(
        failures.is_empty(),
        "over the calibrated bar (see the per-step lines above):\n{}",
        failures.join("\n")
    );
}

#[test]
fn qwen3_in_fp8_is_as_accurate_as_pytorch_fp8() {
    let Some(_) = gpu() else { return };
    let dir = PathBuf::from(
        std::env::var("PAGODA_QWEN3_DIR").unwrap_or_else(|_| "/tmp/qwen3-small".into()),
    );
    let reference = dir.join("reference.json");
    if !reference.is_file() {
        eprintln!(
            "notice: skipped: {} is missing (run scripts/gpu/make_qwen3.py)",
            reference.display()
        );
        return;
    }
    let golden: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&reference).unwrap()).unwrap();
    let torch: Option<serde_json::Value> = std::fs::read(dir.join("fp8_reference.json"))
        .ok()
        .map(|b| serde_json::from_slice(&b).unwrap());
    let files = open_model(&OpenOptions {
        model: Some(dir.clone()),
        config: None,
        dummy_weights: false,
        tokenizer: None,
    })
    .unwrap();
    let entries = golden["prompts"].as_array().unwrap();
    let prompts: Vec<Vec<u32>> = entries.iter().map(|p| ids(&p["prompt_ids"])).collect();
    let mut r = runner(
        gpu().unwrap().with_fp8_weights(true),
        &files.config,
        files.weights.as_ref(),
        blocks_needed(&prompts, 1) + 4,
    );
    eprintln!(
        "notice: {}",
        r.backend().fp8_gemm_note().unwrap_or_default()
    );
    let got = forced_trace(&mut r, &prompts, &vec![Vec::new(); prompts.len()]);
    let mut lines = Vec::new();
    let mut failures = Vec::new();
    for (i, p) in entries.iter().enumerate() {
        let err = rel_err_l2(&got[i][0], &floats(&p["prompt_logits"]));
        let torch_err = torch
            .as_ref()
            .and_then(|t| t["prompts"][i]["torch_fp8_l2"].as_f64())
            .map(|e| e as f32);
        let bar = torch_err.map_or(FP8_BAR, |t| t * TORCH_FACTOR);
        lines.push(format!(
            "prompt {i}: pagoda fp8 {err:.3e}, PyTorch fp8 {}",
            torch_err.map_or("?".into(), |t| format!("{t:.3e}"))
        ));
        if err.is_nan() || err > bar {
            failures.push(format!(
                "prompt {i}: pagoda fp8 error {err:.3e} over {bar:.3e}"
            ));
        }
    }
    eprintln!(
        "qwen3 fp8 prompt logits vs PyTorch f32 (relative L2):\n{}",
        lines.join("\n")
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
