//! KV cache groups on CUDA (tiny Gemma 3 and Gemma 2, dummy weights): long
//! prompts past the local window and the 64-key read tile, batched with
//! chunked prefill, decoded through captured graphs. With the local groups'
//! passed blocks released the GPU gives the same greedy tokens as with
//! every block kept, and holds fewer pages; and the GPU's tokens are the CPU
//! backend's (bf16 weights, the same engine and schedule) wherever the CPU's
//! top-1 margin is clear of bf16 rounding (a near-tie may flip; after the
//! first difference a request is not compared further).
//!
//! Without a CUDA device every test prints a notice and passes (fails where
//! PAGODA_REQUIRE_GPU=1 says a GPU must be present).
#![cfg(feature = "cuda")]

mod cuda_common;

use std::collections::HashMap;

use cuda_common::*;
use pagoda_core::{RequestId, SamplingParams, SchedulerConfig};
use pagoda_engine::{EngineRequest, LlmEngine};
use pagoda_kernels::cpu::{CpuBackend, CpuOptions, WeightDtype};
use pagoda_kernels::Backend;
use pagoda_model::loader::dummy::DummySource;
use pagoda_model::loader::hf_config::load_config_file;
use pagoda_model::ModelConfig;

const MAX_MODEL_LEN: usize = 256;
const NUM_BLOCKS: usize = 400;

fn config(arch: &str) -> ModelConfig {
    load_config_file(&repo_root().join(format!("tests/golden/tiny-{arch}/config.json"))).unwrap()
}

fn engine<B: Backend>(b: B, cfg: &ModelConfig, release: bool, graphs: bool) -> LlmEngine<B> {
    let src = DummySource::new(cfg).unwrap();
    let mut r = runner(b, cfg, &src, NUM_BLOCKS);
    assert!(r.kv_layout().num_groups() > 1);
    if graphs {
        r.capture_decode_graphs(8, MAX_MODEL_LEN).unwrap();
    }
    let sched = SchedulerConfig {
        block_size: BLOCK_SIZE,
        num_blocks: NUM_BLOCKS,
        max_num_batched_tokens: 40,
        max_num_seqs: 8,
        max_model_len: MAX_MODEL_LEN,
        enable_prefix_caching: false,
    };
    LlmEngine::with_window_release(r, None, sched, release).unwrap()
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) % 500 + 3)
        .collect()
}

/// Per request: its tokens and each token's (top-1 - top-2) logprob margin.
fn run<B: Backend>(e: &mut LlmEngine<B>, peak: &mut usize) -> Vec<(Vec<u32>, Vec<f32>)> {
    let wave = [
        (prompt(1, 180), 40),
        (prompt(2, 150), 60),
        (prompt(3, 9), 120),
    ];
    let mut order: Vec<RequestId> = Vec::new();
    for (p, n) in &wave {
        let params = SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(*n)
        };
        order.push(
            e.add_request(EngineRequest {
                prompt_token_ids: p.clone(),
                params,
                logprobs: Some(2),
            })
            .unwrap(),
        );
    }
    let mut got: HashMap<RequestId, (Vec<u32>, Vec<f32>)> = HashMap::new();
    while e.has_unfinished_requests() {
        for out in e.step().unwrap() {
            let lp = out.logprobs.unwrap();
            let margin = match lp.top.as_slice() {
                [(_, a), (_, b), ..] => a - b,
                _ => f32::INFINITY,
            };
            let entry = got.entry(out.request_id).or_default();
            entry.0.push(out.token_id);
            entry.1.push(margin);
        }
        *peak = (*peak).max(e.stats().num_blocks_used);
    }
    order.iter().map(|id| got.remove(id).unwrap()).collect()
}

#[test]
fn released_local_blocks_on_cuda_match_kept_blocks_and_the_cpu() {
    for arch in ["gemma3", "gemma2"] {
        let cfg = config(arch);
        let Some(dev) = gpu() else { return };
        let mut released = engine(dev, &cfg, true, true);
        let mut peak = 0;
        let got = run(&mut released, &mut peak);
        assert!(released.runner().graph_replays() > 0, "{arch}: graphs ran");
        let Some(dev) = gpu() else { return };
        let mut kept = engine(dev, &cfg, false, true);
        let mut peak_kept = 0;
        let want = run(&mut kept, &mut peak_kept);
        assert!(peak < peak_kept, "{arch}: {peak} vs {peak_kept} pages");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.0, w.0, "{arch} request {i}: released vs kept on CUDA");
        }
        let cpu = CpuBackend::new(CpuOptions {
            threads: 2,
            weight_dtype: WeightDtype::BF16,
        })
        .unwrap();
        let mut cpu_engine = engine(cpu, &cfg, true, false);
        let mut cpu_peak = 0;
        let cpu_run = run(&mut cpu_engine, &mut cpu_peak);
        assert_eq!(cpu_peak, peak, "{arch}: the same schedule");
        let mut compared = 0;
        for (i, (g, c)) in got.iter().zip(&cpu_run).enumerate() {
            for (j, ((&gt, &ct), &margin)) in g.0.iter().zip(&c.0).zip(&c.1).enumerate() {
                if gt != ct {
                    assert!(
                        margin < 0.1,
                        "{arch} request {i} token {j}: GPU {gt} vs CPU {ct}, CPU margin {margin}"
                    );
                    break;
                }
                compared += 1;
            }
        }
        assert!(compared > 60, "{arch}: only {compared} tokens compared");
    }
}
