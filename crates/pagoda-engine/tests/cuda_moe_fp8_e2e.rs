//! FP8 experts end to end on CUDA: the tiny mixture-of-experts goldens
//! (Qwen3-MoE, Mixtral, Qwen2-MoE) under `--quantization fp8` (dense
//! layers through the FP8 GEMMs, experts through the FP8 expert kernels)
//! against the CPU reference of the same FP8 model: every step's logits of
//! a batched teacher-forced trace (one prefill of all prompts, so the
//! grouped expert path, then decode steps on the GEMV path) within
//! [`TOL`] relative L2, the bound of cuda_fp8.rs's dense FP8 models, for the
//! same reason: bf16 activations between the layers against f32 flip some
//! per-token input codes of the dense layers one step, and these tiny
//! dummy-weight models amplify that (the expert op itself is held to 1e-2
//! by pagoda-kernels' cuda_moe_fp8.rs).
#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::*;
use pagoda_kernels::cpu::{CpuBackend, CpuOptions, WeightDtype};
use pagoda_model::loader::dummy::DummySource;
use pagoda_model::loader::hf_config::load_config_file;
use pagoda_model::loader::WeightSource;
use pagoda_model::ModelConfig;

const TOL: f32 = 0.1;

fn cpu_fp8() -> CpuBackend {
    CpuBackend::new(CpuOptions {
        threads: 2,
        weight_dtype: WeightDtype::F32,
    })
    .unwrap()
    .with_fp8_weights(true)
}

/// Logits of every step of the golden prompts, prefilled together then
/// fed their golden greedy tokens.
fn trace<B: pagoda_kernels::Backend>(
    b: B,
    cfg: &ModelConfig,
    src: &dyn WeightSource,
    golden: &serde_json::Value,
    steps: usize,
) -> Vec<Vec<Vec<f32>>> {
    let entries = golden["prompts"].as_array().unwrap();
    let prompts: Vec<Vec<u32>> = entries.iter().map(|p| ids(&p["prompt_ids"])).collect();
    let forced: Vec<Vec<u32>> = entries
        .iter()
        .map(|p| ids(&p["output_ids"])[..steps].to_vec())
        .collect();
    let mut r = runner(b, cfg, src, blocks_needed(&prompts, steps) + 4);
    forced_trace(&mut r, &prompts, &forced)
}

#[test]
fn tiny_moe_models_in_fp8_on_cuda_match_the_cpu_reference() {
    let Some(_) = gpu() else { return };
    for arch in ["qwen3-moe", "mixtral", "qwen2-moe"] {
        let dir = repo_root().join(format!("tests/golden/tiny-{arch}"));
        let cfg = load_config_file(&dir.join("config.json")).unwrap();
        let golden: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("golden.json")).unwrap()).unwrap();
        let src = DummySource::new(&cfg).unwrap();
        let want = trace(cpu_fp8(), &cfg, &src, &golden, 8);
        let g = gpu().unwrap().with_fp8_weights(true);
        let got = trace(g, &cfg, &src, &golden, 8);
        assert_eq!(got.len(), want.len(), "{arch}: prompts");
        let mut worst = 0f32;
        for (p, (gs, ws)) in got.iter().zip(&want).enumerate() {
            assert_eq!(gs.len(), ws.len(), "{arch} prompt {p}: steps");
            for (s, (g, w)) in gs.iter().zip(ws).enumerate() {
                let err = rel_err_l2(g, w);
                worst = worst.max(err);
                assert!(
                    err < TOL,
                    "{arch} prompt {p} step {s}: CUDA fp8 vs CPU fp8 {err}"
                );
            }
        }
        eprintln!("{arch}: worst step CUDA fp8 vs CPU fp8 {worst:.3e}");
    }
}
