//! `pagoda generate`: one batch of prompts, printed as text or JSON lines.

use super::{open, run_on_device, CacheArgs, EngineTask, ModelArgs};
use crate::progress;
use anyhow::{bail, Context, Result};
use clap::Args;
use pagoda_core::SamplingParams;
use pagoda_engine::{GenerateOutput, GenerateRequest, LlmEngine};
use pagoda_kernels::Backend;
use pagoda_model::tokenizer::ChatMessage;
use serde::Serialize;
use std::io::Write;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    /// A prompt; repeat the option for several prompts, which run as one batch.
    #[arg(long = "prompt", value_name = "TEXT")]
    pub prompts: Vec<String>,
    /// Most tokens to generate per prompt.
    #[arg(long, default_value_t = 128, value_name = "N")]
    pub max_tokens: usize,
    /// Sampling temperature; 0 picks the most likely token (greedy).
    #[arg(
        long,
        default_value_t = 0.7,
        value_name = "T",
        allow_negative_numbers = true
    )]
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens whose probability adds up to P.
    #[arg(
        long,
        default_value_t = 1.0,
        value_name = "P",
        allow_negative_numbers = true
    )]
    pub top_p: f32,
    /// Keep only the K most likely tokens (0: all).
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub top_k: usize,
    /// Drop tokens less likely than P times the most likely one.
    #[arg(
        long,
        default_value_t = 0.0,
        value_name = "P",
        allow_negative_numbers = true
    )]
    pub min_p: f32,
    /// Penalize tokens already in the prompt or output (1: off).
    #[arg(
        long,
        default_value_t = 1.0,
        value_name = "R",
        allow_negative_numbers = true
    )]
    pub repetition_penalty: f32,
    /// Seed for sampling; the same seed gives the same output.
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// Stop when this string is generated (repeatable); it is not printed.
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Wrap each prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Optional system message for --chat.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Print one JSON object per prompt (prompt_token_ids, token_ids, text,
    /// finish_reason, ...) and nothing else on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct JsonLine<'a> {
    prompt: &'a str,
    prompt_token_ids: &'a [u32],
    token_ids: &'a [u32],
    text: &'a str,
    finish_reason: &'static str,
    num_cached_tokens: usize,
}

pub fn run(args: GenerateArgs) -> Result<()> {
    if args.prompts.is_empty() {
        bail!("give at least one --prompt");
    }
    // Options are checked before the model is opened, so a typo fails fast.
    let params = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        seed: args.seed,
        max_tokens: args.max_tokens,
        ignore_eos: args.ignore_eos,
        stop: args.stop.clone(),
        ..SamplingParams::default()
    };
    params.validate()?;
    args.cache.check_kv_cache_memory()?;
    let quiet = args.json;
    let files = open(&args.model, quiet)?;
    let Some(tokenizer) = files.tokenizer.as_ref() else {
        bail!("the model has no tokenizer, so text prompts cannot be encoded");
    };
    let mut requests = Vec::with_capacity(args.prompts.len());
    for prompt in &args.prompts {
        let ids = if args.chat {
            let Some(template) = tokenizer.chat_template() else {
                bail!("--chat: the model has no chat template");
            };
            let mut messages = Vec::new();
            if let Some(system) = &args.system {
                messages.push(ChatMessage::new("system", system));
            }
            messages.push(ChatMessage::new("user", prompt));
            let text = template.apply(&messages, true)?;
            // The template already wrote any BOS it wants.
            tokenizer.encode(&text, false)?
        } else {
            tokenizer.encode(prompt, true)?
        };
        requests.push(GenerateRequest {
            prompt_token_ids: ids,
            params: params.clone(),
        });
    }

    let outputs = run_on_device(
        files,
        &args.model,
        &args.cache,
        quiet,
        Generate { requests, quiet },
    )?;

    let mut out = std::io::stdout().lock();
    for (prompt, o) in args.prompts.iter().zip(&outputs) {
        if args.json {
            let line = JsonLine {
                prompt,
                prompt_token_ids: &o.prompt_token_ids,
                token_ids: &o.token_ids,
                text: &o.text,
                finish_reason: o.finish_reason.as_str(),
                num_cached_tokens: o.num_cached_tokens,
            };
            writeln!(
                out,
                "{}",
                serde_json::to_string(&line).context("serializing output")?
            )?;
        } else if args.prompts.len() == 1 {
            writeln!(out, "{}", o.text)?;
        } else {
            writeln!(out, "--- {prompt}\n{}\n", o.text)?;
        }
    }
    Ok(())
}

/// The batch run, on whichever backend the engine was built for.
struct Generate {
    requests: Vec<GenerateRequest>,
    quiet: bool,
}

impl EngineTask for Generate {
    type Output = Vec<GenerateOutput>;

    fn run<B: Backend>(self, mut engine: LlmEngine<B>) -> Result<Vec<GenerateOutput>> {
        let total: usize = self.requests.iter().map(|r| r.params.max_tokens).sum();
        let pb = progress::bar(total as u64, "generating", self.quiet);
        let started = std::time::Instant::now();
        let outputs = engine.generate(self.requests, &mut |n| pb.inc(n as u64))?;
        pb.finish_and_clear();
        let generated: usize = outputs.iter().map(|o| o.token_ids.len()).sum();
        tracing::info!(
            generated,
            seconds = started.elapsed().as_secs_f64(),
            "generated {generated} tokens in {:.2}s",
            started.elapsed().as_secs_f64()
        );
        Ok(outputs)
    }
}
