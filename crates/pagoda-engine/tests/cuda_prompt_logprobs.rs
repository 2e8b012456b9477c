//! Prompt logprobs on the CUDA backend against the CPU backend (same
//! bf16-rounded weights, the tiny Llama with dummy weights): after the
//! start-up profiling froze the step memory (so the extra logits rows must
//! fit what it reserved), prompts in chunks of at most 8 logits rows, next
//! to a request without the field, give each prompt token's logprobs within
//! the tiny models' bf16 tolerance (relative L2 over a prompt's logprobs),
//! the same tokens, ranks near the CPU's and 5 alternatives each.
//!
//! Without a CUDA device or driver the test prints a notice and passes
//! (fails where PAGODA_REQUIRE_GPU=1 says a GPU must be present).
#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::*;
use pagoda_core::SamplingParams;
use pagoda_engine::prompt_logprobs::PromptLogprob;
use pagoda_engine::{EngineRequest, LlmEngine, SchedulerConfig};
use pagoda_kernels::cpu::{CpuBackend, CpuOptions, WeightDtype};
use pagoda_kernels::Backend;
use pagoda_model::loader::dummy::DummySource;
use pagoda_model::loader::hf_config::load_config_file;
use std::collections::HashMap;

/// The bf16 tolerance of the tiny dummy-weight models (see cuda_e2e.rs).
const TINY_TOL: f32 = 4e-2;

fn sched() -> SchedulerConfig {
    SchedulerConfig {
        block_size: BLOCK_SIZE,
        num_blocks: 64,
        max_num_batched_tokens: 64,
        max_num_seqs: 8,
        max_model_len: 256,
        enable_prefix_caching: true,
    }
}

/// Runs the golden prompts (with prompt logprobs) and one plain request;
/// returns each prompt's logprobs.
fn run<B: Backend>(mut e: LlmEngine<B>, prompts: &[Vec<u32>]) -> Vec<Vec<PromptLogprob>> {
    let mut index = HashMap::new();
    for (i, p) in prompts.iter().enumerate() {
        let id = e
            .add_request(EngineRequest {
                prompt_token_ids: p.clone(),
                params: SamplingParams {
                    prompt_logprobs: Some(5),
                    ignore_eos: true,
                    ..SamplingParams::greedy(3)
                },
                logprobs: None,
            })
            .unwrap();
        index.insert(id, i);
    }
    e.add_request(EngineRequest {
        prompt_token_ids: prompts[0][..5].to_vec(),
        params: SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(6)
        },
        logprobs: None,
    })
    .unwrap();
    let mut out = vec![Vec::new(); prompts.len()];
    let mut plain = 0;
    while e.has_unfinished_requests() {
        for o in e.step().unwrap() {
            match index.get(&o.request_id) {
                Some(&i) => {
                    if let Some(p) = o.prompt_logprobs {
                        out[i] = p;
                    }
                }
                None => plain += 1,
            }
        }
    }
    assert_eq!(plain, 6, "the plain request's tokens");
    out
}

#[test]
fn prompt_logprobs_on_cuda_match_the_cpu_backend() {
    let Some(dev) = gpu() else { return };
    let golden = read();
    let prompts: Vec<Vec<u32>> = golden.iter().map(|(p, _)| p.clone()).collect();
    let cfg = load_config_file(&repo_root().join("tests/golden/tiny-llama/config.json")).unwrap();
    let src = DummySource::new(&cfg).unwrap();
    let s = sched();

    let mut r = runner(dev, &cfg, &src, 1);
    r.reserve_step_memory(s.max_num_batched_tokens, s.max_num_seqs, s.max_model_len)
        .unwrap();
    r.resize_kv_cache(s.num_blocks).unwrap();
    let got = run(LlmEngine::new(r, None, s.clone()).unwrap(), &prompts);

    let cpu = CpuBackend::new(CpuOptions {
        threads: 2,
        weight_dtype: WeightDtype::BF16,
    })
    .unwrap();
    let want = run(
        LlmEngine::new(runner(cpu, &cfg, &src, s.num_blocks), None, s).unwrap(),
        &prompts,
    );
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), prompts[i].len() - 1, "prompt {i}: entries");
        assert_eq!(g.len(), w.len());
        let gl: Vec<f32> = g.iter().map(|x| x.logprob).collect();
        let wl: Vec<f32> = w.iter().map(|x| x.logprob).collect();
        let err = rel_err_l2(&gl, &wl);
        assert!(err < TINY_TOL, "prompt {i}: logprobs off by {err}");
        for (x, y) in g.iter().zip(w) {
            assert_eq!(x.token, y.token);
            assert_eq!(x.top.len(), 5);
            let spread = (x.rank as f32 - y.rank as f32).abs() / cfg.vocab_size as f32;
            assert!(spread < 0.1, "prompt {i}: rank {} vs {}", x.rank, y.rank);
        }
    }
}

fn read() -> Vec<(Vec<u32>, serde_json::Value)> {
    let path = repo_root().join("tests/golden/tiny-llama/prompt_logprobs.json");
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (ids(&c["prompt_ids"]), c["entries"].clone()))
        .collect()
}
