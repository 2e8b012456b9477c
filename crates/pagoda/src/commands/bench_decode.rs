//! `pagoda bench decode`: the time of one decode step at fixed batch sizes
//! and context lengths, the way a serving engine's steady state sees it.
//!
//! For each batch size B: B sequences get a `--context`-token random prompt
//! (prefilled in chunks of at most --max-num-batched-tokens tokens), then
//! `--steps` decode steps run one after another, each sampling greedily on
//! the device where the backend can (replaying a CUDA graph when one fits)
//! and feeding the sampled tokens back. The median step time is reported,
//! one JSON line per batch size. Needs B * ceil((context + steps + 1) /
//! block_size) KV blocks.

use super::{open, run_on_device, CacheArgs, EngineTask, ModelArgs};
use anyhow::{bail, Result};
use clap::Args;
use pagoda_core::{BlockId, RequestId, ScheduledSequence};
use pagoda_engine::context::build_forward_context;
use pagoda_engine::{LlmEngine, StepOutput};
use pagoda_kernels::{Backend, SamplingRow};
use serde::Serialize;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct DecodeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Batch sizes to time, comma-separated.
    #[arg(
        long,
        default_value = "1,64,256",
        value_delimiter = ',',
        value_name = "B,.."
    )]
    pub batch_sizes: Vec<usize>,
    /// Tokens in each sequence's cache before the timed steps.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub context: usize,
    /// Timed decode steps per batch size (after 3 warm-up steps).
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub steps: usize,
}

#[derive(Serialize)]
struct DecodeResult {
    backend: String,
    batch: usize,
    context: usize,
    steps: usize,
    graphs: bool,
    ms_per_step_median: f64,
    ms_per_step_min: f64,
    tok_per_s: f64,
}

pub fn run(a: DecodeArgs) -> Result<()> {
    if a.batch_sizes.contains(&0) || a.steps == 0 || a.context == 0 {
        bail!("--batch-sizes, --steps and --context must be at least 1");
    }
    let files = open(&a.model, true)?;
    let results = run_on_device(files, &a.model, &a.cache, true, Decode { args: &a })?;
    for r in results {
        println!("{}", serde_json::to_string(&r)?);
    }
    Ok(())
}

struct Decode<'a> {
    args: &'a DecodeArgs,
}

const WARMUP: usize = 3;

impl EngineTask for Decode<'_> {
    type Output = Vec<DecodeResult>;

    fn run<B: Backend>(self, mut engine: LlmEngine<B>) -> Result<Vec<DecodeResult>> {
        let a = self.args;
        let sc = engine.scheduler_config().clone();
        let bs = sc.block_size;
        let vocab = engine.runner().config().vocab_size as u64;
        let total = a.context + WARMUP + a.steps + 1;
        if total > sc.max_model_len {
            bail!(
                "--context + --steps exceed --max-model-len ({})",
                sc.max_model_len
            );
        }
        let per_seq = total.div_ceil(bs);
        let runner = engine.runner_mut();
        // Every KV cache group keeps every block (no window release here).
        let groups = runner.kv_layout().num_groups();
        let graphs = !runner.graph_batch_sizes().is_empty();
        let on_device = runner.samples_on_device();
        let mut out = Vec::new();
        for &batch in &a.batch_sizes {
            if batch * per_seq * groups > sc.num_blocks {
                bail!(
                    "batch {batch} of {total}-token sequences needs {} KV blocks, the cache has {}",
                    batch * per_seq * groups,
                    sc.num_blocks
                );
            }
            let table = |k: usize| -> Vec<BlockId> {
                ((k * per_seq) as u32..((k + 1) * per_seq) as u32)
                    .map(BlockId)
                    .collect()
            };
            // Sequence i on pages of its own, in every KV cache group (group
            // g's table is table g * batch + i).
            let entry = |i: usize, ids: Vec<u32>, context: usize, logits: bool| {
                ScheduledSequence::new(RequestId(i as u64), ids, context, table(i), logits)
                    .with_group_tables((1..groups).map(|g| table(g * batch + i)).collect())
            };
            let prompts: Vec<Vec<u32>> = (0..batch as u64)
                .map(|s| {
                    (0..a.context as u64)
                        .map(|i| {
                            let h = (s * 1_000_003 + i).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                            ((h >> 33) % vocab) as u32
                        })
                        .collect()
                })
                .collect();
            // Prefill, a few sequences per step.
            let per_step = (sc.max_num_batched_tokens / a.context).max(1);
            for first in (0..batch).step_by(per_step) {
                let seqs: Vec<ScheduledSequence> = (first..(first + per_step).min(batch))
                    .map(|i| entry(i, prompts[i].clone(), 0, false))
                    .collect();
                runner.execute(&build_forward_context(&seqs, bs))?;
            }
            let mut tokens: Vec<u32> = prompts.iter().map(|p| p[0]).collect();
            let mut times = Vec::with_capacity(a.steps);
            let mut seqs: Vec<ScheduledSequence> = (0..batch)
                .map(|i| entry(i, vec![tokens[i]], a.context, true))
                .collect();
            for step in 0..WARMUP + a.steps {
                for (s, &t) in seqs.iter_mut().zip(&tokens) {
                    s.token_ids[0] = t;
                    s.num_computed_tokens = a.context + step;
                }
                let mut ctx = build_forward_context(&seqs, bs);
                if on_device {
                    ctx.sampling = vec![SamplingRow::GREEDY; batch];
                }
                let t = Instant::now();
                let result = runner.execute(&ctx)?;
                let secs = t.elapsed().as_secs_f64();
                tokens =
                    match result {
                        StepOutput::Tokens(t) => t,
                        StepOutput::Samples(s) => s.tokens,
                        StepOutput::Logits(l) => {
                            let v = l.len() / batch.max(1);
                            l.chunks_exact(v.max(1))
                                .map(|row| {
                                    row.iter()
                                        .enumerate()
                                        .fold((0, f32::NEG_INFINITY), |b, (i, &x)| {
                                            if x > b.1 {
                                                (i, x)
                                            } else {
                                                b
                                            }
                                        })
                                        .0 as u32
                                })
                                .collect()
                        }
                    };
                if step >= WARMUP {
                    times.push(secs * 1e3);
                }
            }
            times.sort_by(f64::total_cmp);
            let med = times[times.len() / 2];
            out.push(DecodeResult {
                backend: runner.backend_name(),
                batch,
                context: a.context,
                steps: a.steps,
                graphs: graphs && runner.graph_batch_sizes().iter().any(|&g| g >= batch),
                ms_per_step_median: med,
                ms_per_step_min: times[0],
                tok_per_s: batch as f64 / med * 1e3,
            });
        }
        Ok(out)
    }
}
