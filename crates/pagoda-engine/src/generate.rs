//! The offline batch call behind `pagoda generate`: run a set of requests to
//! completion together, sharing forward passes.
//!
//! Every step batches all unfinished sequences: the first step prefills every
//! prompt of the wave, later steps decode one token for each. Requests are
//! admitted in waves whose KV blocks fit in the cache (each sequence reserves
//! blocks for prompt + max_tokens up front), so nothing is ever preempted here.

use crate::context::{build_forward_context, ScheduledSeq};
use crate::runner::ModelRunner;
use crate::sampler::{self, RequestRng};
use crate::stop::find_stop;
use crate::{EngineError, Result};
use pagoda_core::SamplingParams;
use pagoda_kernels::Backend;
use pagoda_model::tokenizer::{IncrementalDetokenizer, Tokenizer};
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::Arc;

/// Sizing of the engine's KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Number of KV blocks (all layers together count as one block).
    pub num_blocks: usize,
    /// Longest prompt + output a sequence may reach.
    pub max_model_len: usize,
}

/// One generation request.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt_token_ids: Vec<u32>,
    pub params: SamplingParams,
}

/// Why a sequence stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// End-of-sequence token, stop token or stop string.
    Stop,
    /// max_tokens or max_model_len reached.
    Length,
}

/// The result of one request.
#[derive(Debug, Clone, Serialize)]
pub struct GenerateOutput {
    pub prompt_token_ids: Vec<u32>,
    pub token_ids: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    pub num_cached_tokens: usize,
}

/// A model, its tokenizer and its KV cache, ready to generate.
pub struct LlmEngine<B: Backend> {
    runner: ModelRunner<B>,
    tokenizer: Option<Arc<Tokenizer>>,
    eos_token_ids: Vec<u32>,
    opts: EngineOptions,
    /// Seeds requests that bring none.
    seed_source: RequestRng,
}

/// A sequence in flight.
struct Sequence {
    index: usize,
    prompt: Vec<u32>,
    output: Vec<u32>,
    params: SamplingParams,
    rng: RequestRng,
    text: String,
    block_table: Vec<u32>,
    finish: Option<FinishReason>,
}

impl<B: Backend> LlmEngine<B> {
    pub fn new(
        runner: ModelRunner<B>,
        tokenizer: Option<Arc<Tokenizer>>,
        opts: EngineOptions,
    ) -> Self {
        let mut eos_token_ids = runner.config().eos_token_ids.clone();
        if let Some(t) = &tokenizer {
            for &id in t.eos_token_ids() {
                if !eos_token_ids.contains(&id) {
                    eos_token_ids.push(id);
                }
            }
        }
        let time_seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        LlmEngine {
            runner,
            tokenizer,
            eos_token_ids,
            opts,
            seed_source: RequestRng::new(time_seed),
        }
    }

    pub fn runner(&self) -> &ModelRunner<B> {
        &self.runner
    }

    /// The runner, for benchmarks that drive steps directly.
    pub fn runner_mut(&mut self) -> &mut ModelRunner<B> {
        &mut self.runner
    }

    pub fn tokenizer(&self) -> Option<&Arc<Tokenizer>> {
        self.tokenizer.as_ref()
    }

    pub fn options(&self) -> EngineOptions {
        self.opts
    }

    fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.opts.block_size)
    }

    /// Rejects a request that no amount of waiting could run.
    pub fn check_request(&self, r: &GenerateRequest) -> Result<()> {
        r.params
            .validate()
            .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        let n = r.prompt_token_ids.len();
        if n == 0 {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        if n >= self.opts.max_model_len {
            return Err(EngineError::InvalidRequest(format!(
                "the prompt has {n} tokens but the model's context is {} tokens \
                 (at least one must be left to generate)",
                self.opts.max_model_len
            )));
        }
        let vocab = self.runner.config().vocab_size;
        if let Some(&bad) = r.prompt_token_ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidRequest(format!(
                "prompt token id {bad} is outside the vocabulary (size {vocab})"
            )));
        }
        let need = self.blocks_for(self.max_len(r));
        if need > self.opts.num_blocks {
            return Err(EngineError::CacheTooSmall(format!(
                "a request of {} tokens needs {need} KV blocks but the cache has {}",
                self.max_len(r),
                self.opts.num_blocks
            )));
        }
        Ok(())
    }

    fn max_len(&self, r: &GenerateRequest) -> usize {
        (r.prompt_token_ids.len() + r.params.max_tokens).min(self.opts.max_model_len)
    }

    /// Runs every request to completion; outputs are in request order.
    /// `on_step(tokens_generated)` is called after each step.
    pub fn generate(
        &mut self,
        requests: Vec<GenerateRequest>,
        on_step: &mut dyn FnMut(usize),
    ) -> Result<Vec<GenerateOutput>> {
        for r in &requests {
            self.check_request(r)?;
        }
        let mut outputs: Vec<Option<GenerateOutput>> = vec![None; requests.len()];
        let mut pending: VecDeque<(usize, GenerateRequest)> =
            requests.into_iter().enumerate().collect();
        while !pending.is_empty() {
            // Admit the longest run of requests whose blocks fit.
            let mut wave = Vec::new();
            let mut next_block = 0usize;
            while let Some((_, r)) = pending.front() {
                let need = self.blocks_for(self.max_len(r));
                if next_block + need > self.opts.num_blocks {
                    break;
                }
                let Some((index, r)) = pending.pop_front() else {
                    break;
                };
                let block_table = (next_block..next_block + need).map(|b| b as u32).collect();
                next_block += need;
                wave.push(self.start(index, r, block_table));
            }
            for seq in self.run_wave(wave, on_step)? {
                let finish_reason = seq.finish.unwrap_or(FinishReason::Length);
                outputs[seq.index] = Some(GenerateOutput {
                    prompt_token_ids: seq.prompt,
                    token_ids: seq.output,
                    text: seq.text,
                    finish_reason,
                    num_cached_tokens: 0,
                });
            }
        }
        outputs
            .into_iter()
            .map(|o| o.ok_or_else(|| EngineError::Internal("a request produced no output".into())))
            .collect()
    }

    fn start(&mut self, index: usize, r: GenerateRequest, block_table: Vec<u32>) -> Sequence {
        let seed = r.params.seed.unwrap_or_else(|| self.seed_source.next_u64());
        Sequence {
            index,
            prompt: r.prompt_token_ids,
            output: Vec::new(),
            params: r.params,
            rng: RequestRng::new(seed),
            text: String::new(),
            block_table,
            finish: None,
        }
    }

    fn run_wave(
        &mut self,
        mut seqs: Vec<Sequence>,
        on_step: &mut dyn FnMut(usize),
    ) -> Result<Vec<Sequence>> {
        let vocab = self.runner.config().vocab_size;
        let tokenizer = self.tokenizer.clone();
        let mut detoks = Vec::with_capacity(seqs.len());
        for s in &seqs {
            detoks.push(match tokenizer.as_deref() {
                Some(t) => Some(IncrementalDetokenizer::with_prompt(t, true, &s.prompt)?),
                None => None,
            });
        }
        loop {
            let active: Vec<usize> = (0..seqs.len())
                .filter(|&i| seqs[i].finish.is_none())
                .collect();
            if active.is_empty() {
                return Ok(seqs);
            }
            // 1. Lay out the step: whole prompts first time, last token afterwards.
            let scheduled: Vec<ScheduledSeq<'_>> = active
                .iter()
                .map(|&i| {
                    let s = &seqs[i];
                    match s.output.last() {
                        None => ScheduledSeq {
                            token_ids: &s.prompt,
                            context_len: 0,
                            block_table: &s.block_table,
                            want_logits: true,
                        },
                        Some(last) => ScheduledSeq {
                            token_ids: std::slice::from_ref(last),
                            context_len: s.prompt.len() + s.output.len() - 1,
                            block_table: &s.block_table,
                            want_logits: true,
                        },
                    }
                })
                .collect();
            let ctx = build_forward_context(&scheduled, self.opts.block_size);
            // 2. Forward pass.
            let mut logits = self.runner.execute(&ctx)?;
            // 3. Sample and check stop conditions for each sequence.
            for (row, &i) in logits.chunks_exact_mut(vocab).zip(&active) {
                let token = {
                    let s = &mut seqs[i];
                    sampler::sample(row, &s.params, &s.prompt, &s.output, &mut s.rng).token
                };
                self.append(&mut seqs[i], detoks[i].as_mut(), token)?;
            }
            on_step(active.len());
        }
    }

    fn append(
        &self,
        s: &mut Sequence,
        detok: Option<&mut IncrementalDetokenizer<'_>>,
        token: u32,
    ) -> Result<()> {
        s.output.push(token);
        let is_eos = !s.params.ignore_eos && self.eos_token_ids.contains(&token);
        if is_eos || s.params.stop_token_ids.contains(&token) {
            s.finish = Some(FinishReason::Stop);
            return Ok(());
        }
        if let Some(d) = detok {
            let mut delta = d.step(token)?;
            let done = s.output.len() >= s.params.max_tokens
                || s.prompt.len() + s.output.len() >= self.opts.max_model_len;
            if done {
                delta.push_str(&d.finish()?);
            }
            s.text.push_str(&delta);
            if let Some(m) = find_stop(&s.text, delta.len(), &s.params.stop) {
                s.text.truncate(m.at);
                s.finish = Some(FinishReason::Stop);
                return Ok(());
            }
        }
        if s.output.len() >= s.params.max_tokens
            || s.prompt.len() + s.output.len() >= self.opts.max_model_len
        {
            s.finish = Some(FinishReason::Length);
        }
        Ok(())
    }
}
