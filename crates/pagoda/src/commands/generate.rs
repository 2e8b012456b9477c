//! `pagoda generate`: one batch of prompts, printed as text or JSON lines;
//! text is streamed in prompt order when stdout is a terminal.

use super::in_order::{write_block, InOrder};
use super::{open, run_on_device, CacheArgs, EngineTask, ModelArgs, SamplingArgs};
use crate::progress;
use anyhow::{bail, Context, Result};
use clap::Args;
use pagoda_engine::{GenerateOutput, GenerateRequest, LlmEngine};
use pagoda_kernels::Backend;
use pagoda_model::tokenizer::ChatMessage;
use serde::Serialize;
use std::io::{IsTerminal, Write};

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
    #[command(flatten)]
    pub sampling: SamplingArgs,
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
    let params = args.sampling.params(args.max_tokens)?;
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

    // A terminal sees the text as it is produced; a pipe or file gets the
    // same bytes once the batch is done.
    let stream = !args.json && std::io::stdout().is_terminal();
    let outputs = run_on_device(
        files,
        &args.model,
        &args.cache,
        quiet,
        Generate {
            requests,
            quiet: quiet || stream,
            stream: stream.then_some(args.prompts.as_slice()),
        },
    )?;
    if stream {
        return Ok(());
    }

    let mut out = std::io::stdout().lock();
    let several = args.prompts.len() > 1;
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
        } else {
            write_block(&mut out, prompt, &o.text, several)?;
        }
    }
    Ok(())
}

/// The batch run, on whichever backend the engine was built for.
struct Generate<'a> {
    requests: Vec<GenerateRequest>,
    /// No progress bar.
    quiet: bool,
    /// Print the text to stdout as it is produced (these prompts' blocks).
    stream: Option<&'a [String]>,
}

impl EngineTask for Generate<'_> {
    type Output = Vec<GenerateOutput>;

    fn run<B: Backend>(self, mut engine: LlmEngine<B>) -> Result<Vec<GenerateOutput>> {
        let total: usize = self.requests.iter().map(|r| r.params.max_tokens).sum();
        let pb = progress::bar(total as u64, "generating", self.quiet);
        let started = std::time::Instant::now();
        let outputs = match self.stream {
            None => engine.generate(self.requests, &mut |n| pb.inc(n as u64))?,
            Some(prompts) => {
                let mut printer = InOrder::new(std::io::stdout().lock(), prompts);
                let mut failed = None;
                let outputs =
                    engine.generate_streaming(self.requests, &mut |_| {}, &mut |i, o| {
                        if failed.is_none() {
                            let r = printer.push(i, &o.text_delta, o.finish_reason.is_some());
                            failed = r.err();
                        }
                    })?;
                if let Some(e) = failed {
                    return Err(e).context("writing to stdout");
                }
                outputs
            }
        };
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
