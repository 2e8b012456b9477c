//! Tiny random Llama (Llama 3 rope scaling), Llama with attention_bias
//! (biases on q/k/v and o_proj), Qwen2, Qwen3, OPT, Gemma 3 (sliding windows
//! of 6 on 2 of 3 layers, two rope bases) and Gemma 2 (window 5 on alternate
//! layers, attention and final logit soft-capping), Qwen3-MoE (8 experts,
//! top-2, one dense layer) and Mixtral (8 experts, top-2 renormalized) models
//! against Hugging Face transformers (tests/golden/tiny-*/, made by
//! scripts/golden/models.py with pagoda's dummy-weight spec): last-prompt
//! logits, 16 greedy tokens with their top-5, alone and batched, from dummy
//! weights and from safetensors files.

mod common;

use common::*;
use pagoda_core::SamplingParams;
use pagoda_engine::{GenerateRequest, LlmEngine};
use pagoda_kernels::cpu::WeightDtype;
use pagoda_model::loader::dummy::DummySource;
use pagoda_model::loader::hf_config::load_config_file;
use pagoda_model::loader::safetensors_writer::{write_safetensors, StorageDtype};
use pagoda_model::open::{open_model, OpenOptions};
use pagoda_model::ModelConfig;

const ARCHS: [&str; 9] = [
    "llama",
    "llama-attnbias",
    "qwen2",
    "qwen3",
    "opt",
    "gemma3",
    "gemma2",
    "qwen3-moe",
    "mixtral",
];

fn load(arch: &str) -> (ModelConfig, serde_json::Value) {
    let dir = repo_root().join(format!("tests/golden/tiny-{arch}"));
    let cfg = load_config_file(&dir.join("config.json")).unwrap();
    (
        cfg,
        read_json(&format!("tests/golden/tiny-{arch}/golden.json")),
    )
}

/// Checks one runner against the golden prompts: logits within `tol`, and
/// (when `check_tokens`) every greedy token and top-5.
fn check_runner(
    arch: &str,
    runner: &mut pagoda_engine::ModelRunner<pagoda_kernels::cpu::CpuBackend>,
    golden: &serde_json::Value,
    tol: f32,
    check_tokens: bool,
) {
    for p in golden["prompts"].as_array().unwrap() {
        let prompt = ids(&p["prompt_ids"]);
        let want = ids(&p["output_ids"]);
        let (got, logits) = greedy_trace(runner, &prompt, want.len());
        let err = rel_err(&logits[0], &floats(&p["last_logits"]));
        assert!(
            err < tol,
            "{arch}, prompt of {}: last-prompt logits off by {err}",
            prompt.len()
        );
        if check_tokens {
            assert_eq!(
                got,
                want,
                "{arch}, prompt of {}: greedy tokens",
                prompt.len()
            );
            for (s, step) in p["steps"].as_array().unwrap().iter().enumerate() {
                let top = ids(&step["top_ids"]);
                assert_eq!(top_k(&logits[s], 5), top, "{arch} step {s}: top-5 ids");
                let got_top: Vec<f32> = top.iter().map(|&i| logits[s][i as usize]).collect();
                let err = rel_err(&got_top, &floats(&step["top_logits"]));
                assert!(err < tol, "{arch} step {s}: top-5 logits off by {err}");
            }
        }
    }
}

#[test]
fn dummy_weights_match_transformers_for_every_architecture() {
    for arch in ARCHS {
        let (cfg, golden) = load(arch);
        let src = DummySource::new(&cfg).unwrap();
        let mut runner = cpu_runner(&cfg, &src, WeightDtype::F32, 64);
        check_runner(arch, &mut runner, &golden, 1e-4, true);
    }
}

#[test]
fn batched_generation_equals_transformers_for_every_architecture() {
    for arch in ARCHS {
        let (cfg, golden) = load(arch);
        let src = DummySource::new(&cfg).unwrap();
        let runner = cpu_runner(&cfg, &src, WeightDtype::F32, 64);
        let mut engine = LlmEngine::new(runner, None, scheduler_config(64, 256)).unwrap();
        let prompts = golden["prompts"].as_array().unwrap();
        let requests = prompts
            .iter()
            .map(|p| GenerateRequest {
                prompt_token_ids: ids(&p["prompt_ids"]),
                params: SamplingParams {
                    ignore_eos: true,
                    ..SamplingParams::greedy(16)
                },
            })
            .collect();
        let outputs = engine.generate(requests, &mut |_| {}).unwrap();
        for (p, o) in prompts.iter().zip(&outputs) {
            assert_eq!(
                o.token_ids,
                ids(&p["output_ids"]),
                "{arch}: batched greedy tokens"
            );
        }
    }
}

#[test]
fn safetensors_directories_load_like_dummy_weights() {
    for arch in ARCHS {
        let (cfg, golden) = load(arch);
        let src = DummySource::new(&cfg).unwrap();
        let dir = std::env::temp_dir().join(format!("pagoda-golden-{arch}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let golden_dir = repo_root().join(format!("tests/golden/tiny-{arch}"));
        for f in ["config.json", "generation_config.json"] {
            std::fs::copy(golden_dir.join(f), dir.join(f)).unwrap();
        }
        for (dtype, weight_dtype, tol, exact) in [
            (StorageDtype::F32, WeightDtype::F32, 1e-4, true),
            (StorageDtype::BF16, WeightDtype::BF16, 5e-2, false),
        ] {
            write_safetensors(
                &src,
                src.tensor_names(),
                dtype,
                &dir.join("model.safetensors"),
            )
            .unwrap();
            let files = open_model(&OpenOptions {
                model: Some(dir.clone()),
                ..Default::default()
            })
            .unwrap();
            assert_eq!(files.config, cfg);
            let mut runner = cpu_runner(&files.config, files.weights.as_ref(), weight_dtype, 64);
            check_runner(arch, &mut runner, &golden, tol, exact);
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
