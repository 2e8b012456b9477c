//! `pagoda bench`: benchmark programs (their figures go in BENCHMARKS.md).
//!
//! `pagoda bench`: offline throughput on the nano-vllm workload: `--num-seqs`
//! requests of random token ids in [0, 10000), prompt lengths uniform in
//! [`--min-input`, `--max-input`], max_tokens uniform in [`--min-output`,
//! `--max-output`], ignore_eos, temperature 0.6, all from `--seed`;
//! `--shared-prefix LEN` gives every prompt the same first LEN tokens;
//! `--logprobs-fraction F --logprobs K` makes a random F of the requests ask
//! for K top logprobs and `--penalty-fraction F` gives a random F repetition
//! 1.1, frequency 0.2 and presence 0.2 penalties (both drawn from `--seed`
//! apart from the prompts, so the prompts are those of the plain run);
//! `--json-schema FILE` generates every request under that JSON schema
//! (a request ends when its document is complete) and reports the median
//! and p99 per-step token mask time (`mask_ms_median`, `mask_ms_p99`).
//! `--save-workload FILE` writes the requests of the run as JSONL and
//! `--workload FILE` runs such a file instead of a draw (bench_workload.rs),
//! so a peer engine can run the identical requests; `--save-realized FILE`
//! writes them with the tokens each really generated as max_tokens, to
//! replay a constrained run's lengths unconstrained.
//! Prints one JSON line.
//!
//! `pagoda bench single`: single-stream speed like llama.cpp's llama-bench:
//! prompt processing of `--prompt-tokens` random tokens in one step (pp), then
//! `--gen-tokens` greedy decode steps (tg), each repeated `--repeats` times;
//! prints the median tokens/s of each as one JSON line, with the process's
//! resident memory once loaded (`rss_after_load_mib`: weights + KV cache +
//! runtime, beside `file_mib`, `kv_cache_mib` and `over_file_and_kv`: see
//! [`super::memory`]) and at the end (`rss_mib`, adding activations), Linux
//! only.

use super::device::Device;
use super::{open, run_on_device, CacheArgs, EngineTask, ModelArgs};
use crate::progress;
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use pagoda_core::{BlockId, RequestId, SamplingParams, ScheduledSequence};
use pagoda_engine::context::build_forward_context;
use pagoda_engine::sampler::RequestRng;
use pagoda_engine::{EngineRequest, LlmEngine, StepOutput};
use pagoda_kernels::{Backend, SamplingRow};
use serde::Serialize;
use std::time::Instant;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub mode: Option<BenchMode>,
    #[command(flatten)]
    pub throughput: ThroughputArgs,
}

/// Offline throughput (the default mode).
#[derive(Args, Debug)]
pub struct ThroughputArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Number of requests.
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub num_seqs: usize,
    /// Shortest prompt, in tokens.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub min_input: usize,
    /// Longest prompt, in tokens.
    #[arg(long, default_value_t = 1024, value_name = "N")]
    pub max_input: usize,
    /// Fewest tokens to generate per request.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub min_output: usize,
    /// Most tokens to generate per request.
    #[arg(long, default_value_t = 1024, value_name = "N")]
    pub max_output: usize,
    /// Tokens every prompt starts with (random ids drawn once from the seed).
    #[arg(long, default_value_t = 0, value_name = "LEN")]
    pub shared_prefix: usize,
    /// Sampling temperature of every request.
    #[arg(long, default_value_t = 0.6, value_name = "T")]
    pub temperature: f32,
    /// Seed of the workload and of each request's sampling.
    #[arg(long, default_value_t = 0, value_name = "S")]
    pub seed: u64,
    /// Fraction of the requests (drawn from the seed) asking for logprobs.
    #[arg(long, default_value_t = 0.0, value_name = "F")]
    pub logprobs_fraction: f64,
    /// Top logprobs those requests ask for.
    #[arg(long, default_value_t = 5, value_name = "K")]
    pub logprobs: usize,
    /// Fraction of the requests (drawn from the seed) with repetition 1.1,
    /// frequency 0.2 and presence 0.2 penalties.
    #[arg(long, default_value_t = 0.0, value_name = "F")]
    pub penalty_fraction: f64,
    /// Run the requests of this JSONL workload file instead of a random draw
    /// (lines without a temperature take `--temperature`).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["shared_prefix", "num_seqs", "min_input", "max_input", "min_output", "max_output"])]
    pub workload: Option<std::path::PathBuf>,
    /// Write the run's requests to this JSONL workload file.
    #[arg(long, value_name = "FILE")]
    pub save_workload: Option<std::path::PathBuf>,
    /// After the run, write its requests with each `max_tokens` set to the
    /// tokens the request really generated (fewer where it stopped early, as
    /// under a JSON schema whose document closes): running that file without
    /// the constraint measures the same token counts unconstrained.
    #[arg(long, value_name = "FILE")]
    pub save_realized: Option<std::path::PathBuf>,
    /// Generate every request under this JSON schema (structured outputs);
    /// reports the per-step token mask time.
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<std::path::PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum BenchMode {
    /// Single-stream prompt processing and decode speed.
    Single(SingleArgs),
    /// Load a running OpenAI-compatible server and measure TTFT, ITL, throughput.
    Serve(super::bench_serve::BenchServeArgs),
    /// Time one decode step at fixed batch sizes and context lengths.
    Decode(super::bench_decode::DecodeArgs),
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
    /// The model file, the KV cache and the resident memory once both are
    /// loaded (MiB), with the overhead over file + KV cache.
    #[serde(flatten)]
    memory: super::memory::LoadedMemory,
    /// Resident MiB at the end (activations included).
    rss_mib: Option<f64>,
}

pub fn run(args: BenchArgs) -> Result<()> {
    match args.mode {
        Some(BenchMode::Single(a)) => single(a),
        Some(BenchMode::Serve(a)) => super::bench_serve::run(a),
        Some(BenchMode::Decode(a)) => super::bench_decode::run(a),
        None => throughput(args.throughput),
    }
}

#[derive(Serialize)]
struct ThroughputResult {
    model: String,
    backend: String,
    num_seqs: usize,
    input_tokens: usize,
    output_tokens: usize,
    seconds: f64,
    output_tok_per_s: f64,
    total_tok_per_s: f64,
    cached_tokens: usize,
    preemptions: u64,
    prefix_caching: bool,
    shared_prefix: usize,
    logprobs_fraction: f64,
    logprobs: usize,
    logprobs_requests: usize,
    penalty_fraction: f64,
    penalty_requests: usize,
    /// `--json-schema`'s file, if given.
    json_schema: Option<String>,
    /// Per-step token mask time (median, p99) in milliseconds, with a schema.
    mask_ms_median: Option<f64>,
    mask_ms_p99: Option<f64>,
    /// Seconds from opening the model to a ready engine: loading weights,
    /// sizing memory (profiling steps on CUDA), capturing graphs; the
    /// workload's drawing is not counted.
    startup_s: f64,
    /// The same by phase (`open`: the model files; then the phases of
    /// `crate::startup`), with its `total`.
    startup_phases_s: Option<serde_json::Value>,
}

/// The workload: prompts and max_tokens per request, reproducible from the
/// seed. Token ids are drawn from [0, 10000), or the whole vocabulary when it
/// is smaller.
fn workload(a: &ThroughputArgs, vocab_size: usize) -> Result<Vec<EngineRequest>> {
    let max_id = vocab_size.clamp(1, 10_000) - 1;
    if a.num_seqs == 0 || a.min_input == 0 || a.min_output == 0 {
        bail!("--num-seqs, --min-input and --min-output must be at least 1");
    }
    if a.min_input > a.max_input || a.min_output > a.max_output {
        bail!("--min-input/--min-output must not exceed --max-input/--max-output");
    }
    let mut rng = RequestRng::new(a.seed);
    let mut uniform = |lo: usize, hi: usize| lo + (rng.next_u64() % (hi - lo + 1) as u64) as usize;
    let prefix: Vec<u32> = (0..a.shared_prefix)
        .map(|_| uniform(0, max_id) as u32)
        .collect();
    let schema = match &a.json_schema {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| anyhow::anyhow!("--json-schema {}: {e}", p.display()))?,
        ),
        None => None,
    };
    let mut requests = Vec::with_capacity(a.num_seqs);
    for i in 0..a.num_seqs {
        let len = uniform(a.min_input, a.max_input).max(a.shared_prefix + 1);
        let mut ids = prefix.clone();
        while ids.len() < len {
            ids.push(uniform(0, max_id) as u32);
        }
        let params = SamplingParams {
            temperature: a.temperature,
            max_tokens: uniform(a.min_output, a.max_output),
            ignore_eos: true,
            seed: Some(a.seed.wrapping_add(i as u64)),
            structured: schema
                .clone()
                .map(pagoda_core::StructuredOutput::JsonSchema),
            ..SamplingParams::default()
        };
        requests.push(EngineRequest {
            prompt_token_ids: ids,
            params,
            logprobs: None,
        });
    }
    add_options(a, &mut requests)?;
    Ok(requests)
}

/// Gives a random `--logprobs-fraction` of the requests logprobs and a random
/// `--penalty-fraction` penalties. Options come from their own stream, so the
/// prompts and lengths are those of the run without them.
fn add_options(a: &ThroughputArgs, requests: &mut [EngineRequest]) -> Result<()> {
    for (name, f) in [
        ("--logprobs-fraction", a.logprobs_fraction),
        ("--penalty-fraction", a.penalty_fraction),
    ] {
        if !(0.0..=1.0).contains(&f) {
            bail!("{name} must be within [0, 1], got {f}");
        }
    }
    let mut option_rng = RequestRng::new(a.seed ^ 0x6f70_7469_6f6e_7321);
    for r in requests {
        r.logprobs = (option_rng.next_f64() < a.logprobs_fraction).then_some(a.logprobs);
        if option_rng.next_f64() < a.penalty_fraction {
            r.params.repetition_penalty = 1.1;
            r.params.frequency_penalty = 0.2;
            r.params.presence_penalty = 0.2;
        }
    }
    Ok(())
}

fn throughput(a: ThroughputArgs) -> Result<()> {
    let opening = Instant::now();
    let files = open(&a.model, true)?;
    let open_secs = opening.elapsed().as_secs_f64();
    let requests = match &a.workload {
        Some(path) => {
            let mut requests =
                super::bench_workload::load(path, files.config.vocab_size, a.temperature, a.seed)?;
            add_options(&a, &mut requests)?;
            requests
        }
        None => workload(&a, files.config.vocab_size)?,
    };
    if let Some(path) = &a.save_workload {
        super::bench_workload::save(path, &requests)?;
    }
    let name = files
        .path
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "dummy".into());
    let result = run_on_device(
        files,
        &a.model,
        &a.cache,
        false,
        Throughput {
            args: &a,
            requests,
            name,
            building: Instant::now(),
            open_secs,
        },
    )?;
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}

/// The offline run, on whichever backend the engine was built for.
struct Throughput<'a> {
    args: &'a ThroughputArgs,
    requests: Vec<EngineRequest>,
    name: String,
    /// When the engine's construction began (weights, profiling, graphs).
    building: Instant,
    /// Seconds spent opening the model files before that.
    open_secs: f64,
}

impl EngineTask for Throughput<'_> {
    type Output = ThroughputResult;

    fn run<B: Backend>(self, mut engine: LlmEngine<B>) -> Result<ThroughputResult> {
        let startup_s = self.open_secs + self.building.elapsed().as_secs_f64();
        let open_secs = self.open_secs;
        let (a, requests, name) = (self.args, self.requests, self.name);
        let input_tokens: usize = requests.iter().map(|r| r.prompt_token_ids.len()).sum();
        let expected: usize = requests.iter().map(|r| r.params.max_tokens).sum();
        let logprobs_requests = requests.iter().filter(|r| r.logprobs.is_some()).count();
        let penalty_requests = requests
            .iter()
            .filter(|r| r.params.repetition_penalty != 1.0)
            .count();
        let num_seqs = requests.len();
        let pb = progress::bar(expected as u64, "generating", false);
        let started = Instant::now();
        // As `LlmEngine::generate`, with each request's logprobs request.
        let realized_of = a.save_realized.as_ref().map(|_| requests.clone());
        let mut index = std::collections::HashMap::with_capacity(num_seqs);
        for (i, r) in requests.into_iter().enumerate() {
            index.insert(engine.add_request(r)?, i);
        }
        let mut generated = vec![0usize; num_seqs];
        let (mut output_tokens, mut cached_tokens) = (0usize, 0usize);
        while engine.has_unfinished_requests() {
            let step = engine.step()?;
            // A structured output's end one step after its last token
            // carries no token.
            let tokens = step.iter().filter(|o| !o.no_token).count();
            pb.inc(tokens as u64);
            output_tokens += tokens;
            for o in step.iter().filter(|o| !o.no_token) {
                if let Some(&i) = index.get(&o.request_id) {
                    generated[i] += 1;
                }
            }
            for o in step.iter().filter(|o| o.finish_reason.is_some()) {
                cached_tokens += o.num_cached_tokens;
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        pb.finish_and_clear();
        if let (Some(path), Some(mut realized)) = (&a.save_realized, realized_of) {
            for (r, &n) in realized.iter_mut().zip(&generated) {
                r.params.max_tokens = n.max(1);
            }
            super::bench_workload::save(path, &realized)?;
        }
        let mask = engine.mask_stats().and_then(|m| m.median_p99());
        let result = ThroughputResult {
            model: name,
            backend: engine.runner().backend_name(),
            num_seqs,
            input_tokens,
            output_tokens,
            seconds,
            output_tok_per_s: output_tokens as f64 / seconds,
            total_tok_per_s: (input_tokens + output_tokens) as f64 / seconds,
            cached_tokens,
            preemptions: engine.stats().counters.num_preemptions,
            prefix_caching: engine.scheduler_config().enable_prefix_caching,
            shared_prefix: a.shared_prefix,
            logprobs_fraction: a.logprobs_fraction,
            logprobs: a.logprobs,
            logprobs_requests,
            penalty_fraction: a.penalty_fraction,
            penalty_requests,
            json_schema: a.json_schema.as_ref().map(|p| p.display().to_string()),
            mask_ms_median: mask.map(|m| m.0 * 1e3),
            mask_ms_p99: mask.map(|m| m.1 * 1e3),
            startup_s,
            startup_phases_s: crate::startup::last().map(|mut r| {
                r.prepend("open", open_secs);
                r.to_json()
            }),
        };
        Ok(result)
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
    let result = run_on_device(files, &a.model, &a.cache, true, Single { args: &a, name })?;
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}

/// The single-stream measurements, on whichever backend the engine was built for.
struct Single<'a> {
    args: &'a SingleArgs,
    name: String,
}

impl EngineTask for Single<'_> {
    type Output = SingleResult;

    fn run<B: Backend>(self, mut engine: LlmEngine<B>) -> Result<SingleResult> {
        let (a, name) = (self.args, self.name);
        let memory = super::memory::LoadedMemory::of(&engine, a.model.model.as_deref());
        let block_size = engine.scheduler_config().block_size;
        let vocab = engine.runner().config().vocab_size as u32;
        let total = a.prompt_tokens.max(a.gen_tokens + 1);
        if total > engine.scheduler_config().max_model_len {
            bail!(
                "--prompt-tokens/--gen-tokens exceed the model's context ({})",
                engine.scheduler_config().max_model_len
            );
        }
        let per_group = total.div_ceil(block_size);
        let blocks: Vec<BlockId> = (0..per_group as u32).map(BlockId).collect();
        // Every KV cache group keeps every block, on pages of its own.
        let extra = engine.runner().kv_layout().num_groups() - 1;
        let group_tables: Vec<Vec<BlockId>> = (1..=extra)
            .map(|g| {
                ((g * per_group) as u32..((g + 1) * per_group) as u32)
                    .map(BlockId)
                    .collect()
            })
            .collect();
        if per_group * (extra + 1) > engine.scheduler_config().num_blocks {
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
            let seq = ScheduledSequence::new(RequestId(0), prompt.clone(), 0, blocks.clone(), true)
                .with_group_tables(group_tables.clone());
            let mut ctx = build_forward_context(&[seq], block_size);
            if runner.samples_on_device() {
                ctx.sampling = vec![SamplingRow::GREEDY];
            }
            let t = Instant::now();
            runner.execute(&ctx)?;
            let pp_s = t.elapsed().as_secs_f64();

            let t = Instant::now();
            let mut token = prompt[0];
            let mut seq =
                [
                    ScheduledSequence::new(RequestId(0), vec![token], 0, blocks.clone(), true)
                        .with_group_tables(group_tables.clone()),
                ];
            for pos in 0..a.gen_tokens {
                seq[0].token_ids[0] = token;
                seq[0].num_computed_tokens = pos;
                let mut ctx = build_forward_context(&seq, block_size);
                if runner.samples_on_device() {
                    ctx.sampling = vec![SamplingRow::GREEDY];
                }
                token = match runner.execute(&ctx)? {
                    StepOutput::Tokens(t) => t.first().copied().unwrap_or(0),
                    StepOutput::Samples(s) => s.tokens.first().copied().unwrap_or(0),
                    StepOutput::Logits(l) => argmax(&l),
                };
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
            weight_dtype: match a.model.device.device {
                Device::Cpu => format!("{:?}", a.model.cpu_weight_dtype()).to_lowercase(),
                Device::Cuda(_) => "bf16".into(),
            },
            prompt_tokens: a.prompt_tokens,
            gen_tokens: a.gen_tokens,
            repeats: a.repeats,
            pp_tok_per_s: median(pp),
            tg_tok_per_s: median(tg),
            memory,
            rss_mib: super::memory::rss_mib(),
        };
        Ok(result)
    }
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
