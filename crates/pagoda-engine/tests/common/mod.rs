//! Shared helpers of the engine's end-to-end tests: building a CPU runner,
//! a plain greedy loop that keeps every step's logits, and comparisons.

#![allow(dead_code)]

pub mod faulty;
pub mod forced;
pub mod fp8_calibration;
pub mod tiny;
pub mod trace;
pub mod window_check;

use pagoda_core::{BlockId, RequestId, ScheduledSequence};
use pagoda_engine::context::build_forward_context;
use pagoda_engine::{ModelRunner, SchedulerConfig};
use pagoda_kernels::cpu::{CpuBackend, CpuOptions, WeightDtype};
use pagoda_kernels::Backend;
use pagoda_model::arch::{self, BuildOptions};
use pagoda_model::loader::WeightSource;
use pagoda_model::ModelConfig;
use std::path::PathBuf;

pub const BLOCK_SIZE: usize = 16;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn default_model() -> PathBuf {
    let p = repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-default-model.sh",
        p.display()
    );
    p
}

pub fn read_json(rel: &str) -> serde_json::Value {
    let p = repo_root().join(rel);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// A CPU runner with room for `num_blocks` blocks.
pub fn cpu_runner(
    cfg: &ModelConfig,
    weights: &dyn WeightSource,
    dtype: WeightDtype,
    num_blocks: usize,
) -> ModelRunner<CpuBackend> {
    let backend = CpuBackend::new(CpuOptions {
        threads: 2,
        weight_dtype: dtype,
    })
    .unwrap();
    runner(backend, cfg, weights, num_blocks)
}

/// A runner on `backend` with room for `num_blocks` blocks.
pub fn runner<B: Backend>(
    backend: B,
    cfg: &ModelConfig,
    weights: &dyn WeightSource,
    num_blocks: usize,
) -> ModelRunner<B> {
    let max_model_len = cfg.max_position_embeddings.min(4096);
    let model = arch::build(
        &backend,
        cfg,
        weights,
        BuildOptions { max_model_len },
        &mut |_, _| {},
    )
    .unwrap();
    ModelRunner::new(backend, model, BLOCK_SIZE, num_blocks).unwrap()
}

/// Greedy decoding of one prompt through the runner, one step per token,
/// returning the tokens and the logits each was picked from.
pub fn greedy_trace(
    runner: &mut ModelRunner<CpuBackend>,
    prompt: &[u32],
    new_tokens: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let blocks: Vec<BlockId> = (0..(prompt.len() + new_tokens).div_ceil(BLOCK_SIZE) as u32)
        .map(BlockId)
        .collect();
    let mut tokens = Vec::new();
    let mut all_logits = Vec::new();
    let mut input = prompt.to_vec();
    let mut context_len = 0;
    for _ in 0..new_tokens {
        let seq = ScheduledSequence::new(RequestId(0), input, context_len, blocks.clone(), true);
        let mut ctx = build_forward_context(&[seq], BLOCK_SIZE);
        with_kv_groups(runner, &mut ctx, blocks.len());
        let logits = runner.execute(&ctx).unwrap().into_logits().unwrap();
        let next = argmax(&logits);
        context_len += ctx.num_tokens();
        input = vec![next];
        tokens.push(next);
        all_logits.push(logits);
    }
    (tokens, all_logits)
}

/// Gives a hand-built context (group-0 tables on pages below `used`) the
/// runner's other KV cache groups, each on pages of its own (the cache split
/// evenly between the groups).
pub fn with_kv_groups<B: Backend>(
    runner: &ModelRunner<B>,
    ctx: &mut pagoda_kernels::ForwardContext,
    used: usize,
) {
    let groups = runner.kv_layout().num_groups();
    if groups > 1 {
        let stride = runner.kv_shape().num_blocks / groups;
        assert!(used <= stride, "{used} pages per group, room for {stride}");
        pagoda_engine::context::shifted_kv_groups(ctx, groups - 1, stride);
    }
}

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Indices of the `k` largest values, largest first.
pub fn top_k(v: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..v.len() as u32).collect();
    idx.sort_by(|&a, &b| v[b as usize].total_cmp(&v[a as usize]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// max |got - want| / max |want|.
pub fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    got.iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

/// A scheduler config for `num_blocks` blocks of [`BLOCK_SIZE`].
/// An engine on the default model (CPU, f16 weights) with `num_blocks` KV
/// blocks and 2,048-token sequences, and its tokenizer.
pub fn default_engine(
    num_blocks: usize,
) -> (
    pagoda_engine::LlmEngine<CpuBackend>,
    std::sync::Arc<pagoda_model::tokenizer::Tokenizer>,
) {
    let files = pagoda_model::open::open_model(&pagoda_model::open::OpenOptions {
        model: Some(default_model()),
        ..Default::default()
    })
    .unwrap();
    let runner = cpu_runner(
        &files.config,
        files.weights.as_ref(),
        WeightDtype::F16,
        num_blocks,
    );
    let tok = files.tokenizer.unwrap();
    let e = pagoda_engine::LlmEngine::new(
        runner,
        Some(tok.clone()),
        scheduler_config(num_blocks, 2048),
    )
    .unwrap();
    (e, tok)
}

pub fn scheduler_config(num_blocks: usize, max_model_len: usize) -> SchedulerConfig {
    SchedulerConfig {
        block_size: BLOCK_SIZE,
        num_blocks,
        max_num_batched_tokens: 2048,
        max_num_seqs: 256,
        max_model_len,
        enable_prefix_caching: true,
    }
}
