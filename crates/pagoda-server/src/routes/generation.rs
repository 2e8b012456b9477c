//! Submitting a request's choices to the engine and reading them back, shared
//! by the completion and chat routes.
//!
//! A request with P prompts and `n` choices becomes P * n engine requests
//! (choice index `p * n + i`); choice `i` gets `seed + i`. All are submitted
//! before any is read, so the scheduler batches them and the prefix cache
//! shares the prompt's KV between them once it is computed.
//!
//! A request may start at most
//! [`crate::ServerConfig::max_seqs_per_request`] sequences (P * n).
//!
//! Invariant: every [`ChoiceStream`] owns its engine [`RequestStream`];
//! dropping it (the handler future or the SSE task going away because the
//! client did) aborts the request and returns its blocks.
//!
//! Timing: time to first token is measured from submission, inter-token
//! latency between consecutive outputs as they arrive, end-to-end latency
//! from when the HTTP request was received.

use crate::error::ApiError;
use crate::state::AppState;
use pagoda_core::SamplingParams;
use pagoda_engine::prompt_logprobs::PromptLogprob;
use pagoda_engine::sampler::TokenLogprobs;
use pagoda_engine::{EngineError, EngineRequest, FinishReason, RequestOutput, RequestStream};
use std::time::Instant;

use super::params::{check_num_seqs, ChoiceParams, SeqLimits};

/// One choice being generated.
pub struct ChoiceStream {
    pub index: usize,
    /// Which of the request's prompts it continues.
    pub prompt_index: usize,
    stream: RequestStream,
    state: AppState,
    received: Instant,
    submitted: Instant,
    last_output: Option<Instant>,
}

impl ChoiceStream {
    /// The next output; `None` after the last. An engine error or a stream
    /// that closed early becomes an [`ApiError`].
    pub async fn next(&mut self) -> Option<Result<RequestOutput, ApiError>> {
        let item = self.stream.next().await?;
        let now = Instant::now();
        let metrics = &self.state.metrics;
        Some(match item {
            Ok(out) => {
                match self.last_output {
                    None => metrics.record_time_to_first_token(now - self.submitted),
                    Some(t) => metrics.record_inter_token_latency(now - t),
                }
                self.last_output = Some(now);
                if out.finish_reason.is_some() {
                    metrics.record_e2e_latency(now - self.received);
                }
                Ok(out)
            }
            Err(e) => Err(ApiError::from(e)),
        })
    }

    /// The choice as a stream of `(index, item)`, ending after the last output.
    pub fn into_stream(
        self,
    ) -> futures_util::stream::BoxStream<'static, (usize, Result<RequestOutput, ApiError>)> {
        use futures_util::StreamExt;
        futures_util::stream::unfold(self, |mut c| async move {
            let item = c.next().await?;
            Some(((c.index, item), c))
        })
        .boxed()
    }
}

/// Submits `n` choices for each prompt. On any refusal the choices already
/// submitted are dropped (aborted) and the refusal is returned.
pub async fn submit_all(
    state: &AppState,
    prompts: &[Vec<u32>],
    params: &ChoiceParams,
    logprobs: Option<usize>,
    received: Instant,
) -> Result<Vec<ChoiceStream>, ApiError> {
    check_num_seqs(prompts.len(), params.n, state.config.max_seqs_per_request)?;
    let limits = SeqLimits {
        max_model_len: state.config.max_model_len,
        kv_cache_tokens: state.config.kv_cache_tokens,
    };
    // Validate every prompt before submitting anything.
    let mut per_choice: Vec<(usize, SamplingParams)> = Vec::with_capacity(prompts.len() * params.n);
    for (p, prompt) in prompts.iter().enumerate() {
        for i in 0..params.n {
            per_choice.push((p, params.for_prompt(prompt.len(), limits, i)?));
        }
    }
    let mut choices = Vec::with_capacity(per_choice.len());
    for (index, (p, sampling)) in per_choice.into_iter().enumerate() {
        let submitted = Instant::now();
        let stream = state
            .handle
            .submit(EngineRequest {
                prompt_token_ids: prompts[p].clone(),
                params: sampling,
                logprobs,
            })
            .await
            .map_err(|e| match e {
                // What the engine refuses is the prompt (the parameters were
                // checked above): e.g. a token id outside the vocabulary;
                // or a token rule, whose message starts with its name.
                EngineError::InvalidRequest(m) => {
                    let param = ["logit_bias", "allowed_token_ids", "bad_words"]
                        .into_iter()
                        .find(|p| m.starts_with(&format!("{p}:")))
                        .unwrap_or(params.prompt_param);
                    ApiError::invalid_param(param, m)
                }
                e => ApiError::from(e),
            })?;
        choices.push(ChoiceStream {
            index,
            prompt_index: p,
            stream,
            state: state.clone(),
            received,
            submitted,
            last_output: None,
        });
    }
    Ok(choices)
}

/// A finished choice.
#[derive(Debug, Clone)]
pub struct ChoiceResult {
    pub index: usize,
    pub prompt_index: usize,
    pub text: String,
    pub logprobs: Vec<(u32, TokenLogprobs)>,
    pub finish_reason: FinishReason,
    pub num_prompt_tokens: usize,
    pub num_output_tokens: usize,
    pub num_cached_tokens: usize,
    /// When its first output arrived.
    pub first_output: Option<Instant>,
    /// Its prompt logprobs, where asked.
    pub prompt_logprobs: Option<Vec<PromptLogprob>>,
}

/// Reads one choice to its end.
async fn collect(mut c: ChoiceStream) -> Result<ChoiceResult, ApiError> {
    let mut r = ChoiceResult {
        index: c.index,
        prompt_index: c.prompt_index,
        text: String::new(),
        logprobs: Vec::new(),
        finish_reason: FinishReason::Abort,
        num_prompt_tokens: 0,
        num_output_tokens: 0,
        num_cached_tokens: 0,
        first_output: None,
        prompt_logprobs: None,
    };
    while let Some(item) = c.next().await {
        let out = item?;
        r.first_output.get_or_insert_with(Instant::now);
        r.text.push_str(&out.text_delta);
        if let Some(lp) = out.logprobs {
            r.logprobs.push((out.token_id, lp));
        }
        if out.prompt_logprobs.is_some() {
            r.prompt_logprobs = out.prompt_logprobs;
        }
        r.num_prompt_tokens = out.num_prompt_tokens;
        r.num_output_tokens = out.num_output_tokens;
        r.num_cached_tokens = out.num_cached_tokens;
        if let Some(reason) = out.finish_reason {
            r.finish_reason = reason;
            return Ok(r);
        }
    }
    Err(ApiError::internal("the request ended without a result"))
}

/// Reads every choice to its end, concurrently, in index order.
pub async fn collect_all(choices: Vec<ChoiceStream>) -> Result<Vec<ChoiceResult>, ApiError> {
    futures_util::future::try_join_all(choices.into_iter().map(collect)).await
}

/// Reads every choice to its end ([`collect_all`]) and logs the request:
/// its status, each choice's first output and finish reason, and its usage,
/// which comes back with the results.
pub async fn collect_and_log(
    choices: Vec<ChoiceStream>,
    mut log: crate::request_log::RequestLog,
    num_prompts: usize,
) -> Result<(Vec<ChoiceResult>, crate::openai::Usage), ApiError> {
    let results = match collect_all(choices).await {
        Ok(results) => results,
        Err(e) => {
            log.finish(e.status.as_u16());
            return Err(e);
        }
    };
    let usage = usage_of(&results, num_prompts);
    for r in &results {
        log.choice(r.first_output, r.finish_reason);
    }
    log.set_usage(usage);
    log.finish(200);
    Ok((results, usage))
}

/// Usage of a request: each prompt counted once (with the cached tokens of
/// its first choice), completion tokens of every choice.
#[derive(Debug, Default, Clone)]
pub struct UsageTally {
    /// Per prompt: (prompt tokens, cached tokens), from its first output seen.
    prompts: Vec<Option<(usize, usize)>>,
    /// Per choice: tokens generated so far.
    completion: Vec<usize>,
}

impl UsageTally {
    pub fn new(num_prompts: usize, num_choices: usize) -> Self {
        UsageTally {
            prompts: vec![None; num_prompts],
            completion: vec![0; num_choices],
        }
    }

    /// Notes an output of choice `index` (of prompt `prompt_index`).
    pub fn observe(&mut self, index: usize, prompt_index: usize, out: &RequestOutput) {
        if let Some(slot) = self.prompts.get_mut(prompt_index) {
            if slot.is_none() {
                *slot = Some((out.num_prompt_tokens, out.num_cached_tokens));
            }
        }
        if let Some(c) = self.completion.get_mut(index) {
            *c = out.num_output_tokens;
        }
    }

    pub fn usage(&self) -> crate::openai::Usage {
        let prompt: usize = self.prompts.iter().flatten().map(|p| p.0).sum();
        let cached: usize = self.prompts.iter().flatten().map(|p| p.1).sum();
        crate::openai::Usage::new(prompt, self.completion.iter().sum(), cached)
    }
}

/// The usage of finished choices.
pub fn usage_of(results: &[ChoiceResult], num_prompts: usize) -> crate::openai::Usage {
    let mut tally = UsageTally::new(num_prompts, results.len());
    for r in results {
        if let Some(slot) = tally.prompts.get_mut(r.prompt_index) {
            if slot.is_none() {
                *slot = Some((r.num_prompt_tokens, r.num_cached_tokens));
            }
        }
        if let Some(c) = tally.completion.get_mut(r.index) {
            *c = r.num_output_tokens;
        }
    }
    tally.usage()
}
