//! A tiny Qwen3 engine (tests/golden/tiny-qwen3 config, dummy weights, f32
//! CPU backend) and helpers for tests of the threaded engine: prompts,
//! requests, reading streams, and the offline `LlmEngine::generate` reference.

use super::faulty::{Faults, FaultyBackend};
use super::{cpu_runner, repo_root, scheduler_config, BLOCK_SIZE};
use pagoda_core::SamplingParams;
use pagoda_engine::{
    EngineRequest, FinishReason, GenerateRequest, LlmEngine, ModelRunner, RequestOutput,
    RequestStream, SchedulerConfig,
};
use pagoda_kernels::cpu::{CpuBackend, CpuOptions, WeightDtype};
use pagoda_model::arch::{self, BuildOptions};
use pagoda_model::loader::dummy::DummySource;
use pagoda_model::loader::hf_config::load_config_file;
use std::sync::Arc;

/// The tiny model's `max_position_embeddings`.
pub const MAX_MODEL_LEN: usize = 256;

pub fn engine_with(config: SchedulerConfig) -> LlmEngine<CpuBackend> {
    let path = repo_root().join("tests/golden/tiny-qwen3/config.json");
    let cfg = load_config_file(&path).unwrap();
    let src = DummySource::new(&cfg).unwrap();
    let runner = cpu_runner(&cfg, &src, WeightDtype::F32, config.num_blocks);
    LlmEngine::new(runner, None, config).unwrap()
}

pub fn engine(num_blocks: usize) -> LlmEngine<CpuBackend> {
    engine_with(scheduler_config(num_blocks, MAX_MODEL_LEN))
}

/// Prompts of different lengths (some over a block) from a fixed formula.
pub fn prompts() -> Vec<Vec<u32>> {
    [5usize, 17, 33, 9, 40]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            (0..n)
                .map(|j| (3 + (i * 131 + j * 37) % 500) as u32)
                .collect()
        })
        .collect()
}

pub fn request(prompt: Vec<u32>, params: SamplingParams) -> EngineRequest {
    EngineRequest {
        prompt_token_ids: prompt,
        params,
        logprobs: None,
    }
}

/// Greedy, never stopping on EOS, so a request runs exactly `max_tokens`.
pub fn long(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(max_tokens)
    }
}

/// Reads a stream to its end; the last item must be a finished output.
pub fn drain_blocking(stream: &mut RequestStream) -> Vec<RequestOutput> {
    let mut outs = Vec::new();
    while let Some(item) = stream.blocking_next() {
        outs.push(item.unwrap());
    }
    assert!(outs.last().unwrap().finish_reason.is_some());
    outs
}

pub async fn drain(stream: &mut RequestStream) -> Vec<RequestOutput> {
    let mut outs = Vec::new();
    while let Some(item) = stream.next().await {
        outs.push(item.unwrap());
    }
    assert!(outs.last().unwrap().finish_reason.is_some());
    outs
}

/// Every request of `prompts` run offline, batched, by `LlmEngine::generate`.
pub fn offline(prompts: &[Vec<u32>], max_tokens: &[usize]) -> Vec<(Vec<u32>, FinishReason)> {
    let reqs = prompts
        .iter()
        .zip(max_tokens)
        .map(|(p, &m)| GenerateRequest {
            prompt_token_ids: p.clone(),
            params: SamplingParams::greedy(m),
        })
        .collect();
    engine(128)
        .generate(reqs, &mut |_| {})
        .unwrap()
        .into_iter()
        .map(|o| (o.token_ids, o.finish_reason))
        .collect()
}

pub fn check_against_offline(
    got: &[Vec<RequestOutput>],
    prompts: &[Vec<u32>],
    want: &[(Vec<u32>, FinishReason)],
) {
    for (i, (outs, (want_ids, want_reason))) in got.iter().zip(want).enumerate() {
        let ids: Vec<u32> = outs.iter().map(|o| o.token_id).collect();
        assert_eq!(&ids, want_ids, "request {i}: streamed tokens");
        assert_eq!(outs.last().unwrap().finish_reason, Some(*want_reason));
        for (k, o) in outs.iter().enumerate() {
            assert_eq!(o.num_output_tokens, k + 1, "request {i}, output {k}");
            assert_eq!(o.num_prompt_tokens, prompts[i].len());
            assert_eq!(o.finish_reason.is_some(), k + 1 == outs.len());
        }
    }
}

/// An engine on the tiny model whose forward passes fail or panic on demand.
pub fn faulty_engine(num_blocks: usize) -> (LlmEngine<FaultyBackend>, Arc<Faults>) {
    faulty_engine_with(
        num_blocks,
        scheduler_config(num_blocks, MAX_MODEL_LEN).max_num_seqs,
    )
}

/// [`faulty_engine`] running at most `max_num_seqs` sequences per step.
pub fn faulty_engine_with(
    num_blocks: usize,
    max_num_seqs: usize,
) -> (LlmEngine<FaultyBackend>, Arc<Faults>) {
    let path = repo_root().join("tests/golden/tiny-qwen3/config.json");
    let cfg = load_config_file(&path).unwrap();
    let src = DummySource::new(&cfg).unwrap();
    let faults = Arc::new(Faults::default());
    let backend = FaultyBackend {
        inner: CpuBackend::new(CpuOptions {
            threads: 2,
            weight_dtype: WeightDtype::F32,
        })
        .unwrap(),
        faults: faults.clone(),
    };
    let opts = BuildOptions {
        max_model_len: MAX_MODEL_LEN,
    };
    let model = arch::build(&backend, &cfg, &src, opts, &mut |_, _| {}).unwrap();
    let runner = ModelRunner::new(backend, model, BLOCK_SIZE, num_blocks).unwrap();
    let config = SchedulerConfig {
        enable_prefix_caching: false,
        max_num_seqs,
        ..scheduler_config(num_blocks, MAX_MODEL_LEN)
    };
    (LlmEngine::new(runner, None, config).unwrap(), faults)
}
