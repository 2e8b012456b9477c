//! `pagoda bench`: benchmark programs (their figures go in BENCHMARKS.md).
//!
//! `pagoda bench single`: single-stream speed like llama.cpp's llama-bench:
//! prompt processing of `--prompt-tokens` random tokens in one step (pp), then
//! `--gen-tokens` greedy decode steps (tg), each repeated `--repeats` times;
//! prints the median tokens/s of each as one JSON line.

use super::{build_engine, open, CacheArgs, ModelArgs};
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use pagoda_engine::context::{build_forward_context, ScheduledSeq};
use serde::Serialize;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub mode: BenchMode,
}

#[derive(Subcommand, Debug)]
pub enum BenchMode {
    /// Single-stream prompt processing and decode speed.
    Single(SingleArgs),
}

#[derive(Args, Debug)]
pub struct SingleArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Prompt tokens processed in one step (pp).
    #[arg(long, default_value_t = 512, value_name = "N")]
    pub prompt_tokens: usize,
    /// Tokens decoded one step at a time after a short prompt (tg).
    #[arg(long, default_value_t = 128, value_name = "N")]
    pub gen_tokens: usize,
    /// Repetitions of each measurement; the median is reported.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub repeats: usize,
}

#[derive(Serialize)]
struct SingleResult {
    model: String,
    backend: String,
    weight_dtype: String,
    prompt_tokens: usize,
    gen_tokens: usize,
    repeats: usize,
    pp_tok_per_s: f64,
    tg_tok_per_s: f64,
}

pub fn run(args: BenchArgs) -> Result<()> {
    match args.mode {
        BenchMode::Single(a) => single(a),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn single(a: SingleArgs) -> Result<()> {
    if a.prompt_tokens == 0 || a.gen_tokens == 0 || a.repeats == 0 {
        bail!("--prompt-tokens, --gen-tokens and --repeats must be at least 1");
    }
    let files = open(&a.model, true)?;
    let name = files
        .path
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "dummy".into());
    let mut engine = build_engine(files, &a.model, &a.cache, true)?;
    let block_size = engine.scheduler_config().block_size;
    let vocab = engine.runner().config().vocab_size as u32;
    let total = a.prompt_tokens.max(a.gen_tokens + 1);
    if total > engine.scheduler_config().max_model_len {
        bail!(
            "--prompt-tokens/--gen-tokens exceed the model's context ({})",
            engine.scheduler_config().max_model_len
        );
    }
    let blocks: Vec<u32> = (0..total.div_ceil(block_size) as u32).collect();
    if blocks.len() > engine.scheduler_config().num_blocks {
        bail!("the KV cache is too small for {total} tokens; raise --kv-cache-memory");
    }
    // Deterministic pseudo-random prompt ids.
    let prompt: Vec<u32> = (0..a.prompt_tokens as u64)
        .map(|i| ((i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33) % vocab as u64) as u32)
        .collect();
    let runner = engine.runner_mut();
    let mut pp = Vec::new();
    let mut tg = Vec::new();
    // One warm-up pass of each kind, then the measured repeats.
    for rep in 0..=a.repeats {
        let seq = ScheduledSeq {
            token_ids: &prompt,
            context_len: 0,
            block_table: &blocks,
            want_logits: true,
        };
        let ctx = build_forward_context(&[seq], block_size);
        let t = Instant::now();
        runner.execute(&ctx)?;
        let pp_s = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let mut token = prompt[0];
        for pos in 0..a.gen_tokens {
            let ids = [token];
            let seq = ScheduledSeq {
                token_ids: &ids,
                context_len: pos,
                block_table: &blocks,
                want_logits: true,
            };
            let logits = runner.execute(&build_forward_context(&[seq], block_size))?;
            token = argmax(&logits);
        }
        let tg_s = t.elapsed().as_secs_f64();
        if rep > 0 {
            pp.push(a.prompt_tokens as f64 / pp_s);
            tg.push(a.gen_tokens as f64 / tg_s);
        }
    }
    let result = SingleResult {
        model: name,
        backend: engine.runner().backend_name(),
        weight_dtype: format!("{:?}", a.model.weight_dtype).to_lowercase(),
        prompt_tokens: a.prompt_tokens,
        gen_tokens: a.gen_tokens,
        repeats: a.repeats,
        pp_tok_per_s: median(pp),
        tg_tok_per_s: median(tg),
    };
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}
