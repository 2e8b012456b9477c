//! Prompt logprobs on the CUDA backend against the CPU backend (same
//! bf16-rounded weights, the tiny Llama with dummy weights): after the
//! start-up profiling froze the step memory (so the extra logits rows must
//! fit what it reserved), prompts in chunks of at most 8 logits rows, next
//! to a request without the field, give each prompt token's logprobs within
//! the tiny models' bf16 tolerance (relative L2 over a prompt's logprobs),
//! the same tokens, ranks near the CPU's and 5 alternatives each.
//!
//! The device scoring itself (prompt rows after the sampling rows of one
//! `sample_full`) against the host's `prompt_logprob` on the same bf16
//! logits: ranks and top ids exact, logprobs within 1e-5, one wait for the
//! device, and the sampling rows' greedy tokens unchanged.
//!
//! Without a CUDA device or driver the test prints a notice and passes
//! (fails where PAGODA_REQUIRE_GPU=1 says a GPU must be present).
#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::*;
use pagoda_core::SamplingParams;
use pagoda_engine::prompt_logprobs::prompt_logprob;
use pagoda_engine::prompt_logprobs::PromptLogprob;
use pagoda_engine::sampler::splitmix64;
use pagoda_engine::{EngineRequest, LlmEngine, SchedulerConfig};
use pagoda_kernels::cpu::{CpuBackend, CpuOptions, WeightDtype};
use pagoda_kernels::cuda::testing::sampling_step;
use pagoda_kernels::{Backend, PromptRow, SamplingOptions, SamplingRow};
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

#[test]
fn device_prompt_rows_match_the_host() {
    let Some(g) = gpu() else { return };
    let mut s = 0x9e37_u64;
    for vocab in [32_000usize, 151_936] {
        let (sampled, prompt) = (3usize, 6usize);
        let rows = sampled + prompt;
        let mut logits: Vec<f32> = (0..rows * vocab)
            .map(|_| bf(unit(&mut s) * 12.0 - 6.0))
            .collect();
        // Ties at the top of one prompt row and of one sampling row.
        for r in [0usize, sampled + 1] {
            let x = &mut logits[r * vocab..(r + 1) * vocab];
            for t in [17usize, 5, 900] {
                x[t] = 9.5;
            }
        }
        let mut opts = SamplingOptions::default();
        for (k, n) in [0u32, 1, 5, 20, 7, 3].into_iter().enumerate() {
            let token = match k {
                1 => 5,        // one of the tied top tokens
                4 => u32::MAX, // outside the vocabulary
                _ => (splitmix64(&mut s) % vocab as u64) as u32,
            };
            opts.prompt_rows.push(PromptRow { token, n });
        }
        let mut ctx = sampling_step(vec![SamplingRow::GREEDY; rows]);
        ctx.sampling.truncate(sampled);
        let t = g.tensor_from_host(rows, vocab, &logits).unwrap();
        let step = g.begin_step_with(&ctx, &opts).unwrap();
        let syncs = g.host_syncs();
        let got = g.sample_full(&t, &step).unwrap();
        assert_eq!(g.host_syncs() - syncs, 1, "one wait for the device");
        assert_eq!(got.tokens.len(), sampled);
        for (r, &tok) in got.tokens.iter().enumerate() {
            let x = &logits[r * vocab..(r + 1) * vocab];
            let best = (0..vocab).fold(0, |b, i| if x[i] > x[b] { i } else { b });
            assert_eq!(tok as usize, best, "vocab {vocab}: sampling row {r}");
        }
        assert_eq!(got.prompt.len(), prompt);
        for (k, (p, d)) in opts.prompt_rows.iter().zip(&got.prompt).enumerate() {
            let r = sampled + k;
            let want = prompt_logprob(&logits[r * vocab..(r + 1) * vocab], p.token, p.n as usize);
            let what = format!("vocab {vocab}: prompt row {k}");
            if p.token as usize >= vocab {
                assert_eq!(d.logprob, f32::NEG_INFINITY, "{what}");
            } else {
                assert!(
                    (d.logprob - want.logprob).abs() < 1e-5,
                    "{what}: {} vs {}",
                    d.logprob,
                    want.logprob
                );
                assert_eq!(d.rank, want.rank, "{what}: rank");
            }
            let ids = |v: &[(u32, f32)]| v.iter().map(|e| e.0).collect::<Vec<_>>();
            assert_eq!(ids(&d.top), ids(&want.top), "{what}: top ids");
            for (a, b) in d.top.iter().zip(&want.top) {
                assert!(
                    (a.1 - b.1).abs() < 1e-5,
                    "{what}: top logprob {} vs {}",
                    a.1,
                    b.1
                );
            }
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
