//! The engine: a scheduler, a model runner and per-request output state,
//! advanced one step at a time.
//!
//! One [`LlmEngine::step`] = prepare (schedule, block copies, forward
//! context) -> sample (forward pass and a token per sequence: on the device,
//! penalties and logprobs included, where the backend can; else on the
//! host) -> emit (scheduler update, detokenize, stop strings).
//! It is synchronous and owns everything it touches; the threaded handle and
//! the offline batch call are built on top of it.
//!
//! Costs per step: O(scheduled tokens + blocks of the scheduled sequences)
//! for bookkeeping, plus the forward pass and O(vocab) sampling per sequence
//! that needs a token.

use crate::context::build_forward_context;
use crate::logit_rules::LogitRules;
use crate::output_text::OutputText;
use crate::prompt_logprobs::{self as plp, PromptLogprob, PromptLogprobsState};
use crate::runner::{ModelRunner, StepOutput};
use crate::sampler::{self, RequestRng, TokenLogprobs};
use crate::step_log::{StepClock, StepLog};
use crate::structured::step::{PendingMasks, StructuredBuild, StructuredEngine};
use crate::structured::{apply_mask, Advanced, Guide, MaskStats};
use crate::token_history::TokenHistory;
use crate::{EngineError, Result};
use pagoda_core::{
    FinishReason, Request, RequestId, SamplingParams, Scheduler, SchedulerConfig, SchedulerOutput,
    SchedulerStats,
};
use pagoda_kernels::{
    Backend, DeviceSamples, ForwardContext, KernelError, PromptRow, RowOptions, SamplingOptions,
    SamplingRow, TokenMasks, MAX_LOGPROBS,
};
use pagoda_model::tokenizer::Tokenizer;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// What a request asks of the engine.
#[derive(Debug, Clone)]
pub struct EngineRequest {
    pub prompt_token_ids: Vec<u32>,
    pub params: SamplingParams,
    /// `Some(n)`: report the sampled token's logprob and the top `n`.
    pub logprobs: Option<usize>,
}

/// What one step produced for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestOutput {
    pub request_id: RequestId,
    /// The token sampled this step.
    pub token_id: u32,
    /// Its logprobs, when asked for.
    pub logprobs: Option<TokenLogprobs>,
    /// New text, never splitting a character and never holding a stop string
    /// (text that might start one is held back until it is decided). Empty
    /// from an engine that leaves text to its caller
    /// ([`LlmEngine::set_detokenize`]), which applies [`OutputText`].
    pub text_delta: String,
    /// Set on the request's last output.
    pub finish_reason: Option<FinishReason>,
    /// This output carries no token (`token_id` means nothing, and
    /// `num_output_tokens` is the last output's): a request under
    /// structured outputs whose grammar its last token completed ends one
    /// step later, on an output of its finish reason and the text held
    /// back so far only.
    pub no_token: bool,
    /// The scheduler ended the request on this token as a stop token (EOS or
    /// a stop token id): its text is shown only with
    /// `include_stop_str_in_output`.
    pub stop_token: bool,
    pub num_prompt_tokens: usize,
    pub num_output_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub num_cached_tokens: usize,
    /// On the first output of a request that asked for prompt logprobs:
    /// one entry per prompt token after the first.
    pub prompt_logprobs: Option<Vec<PromptLogprob>>,
}

/// Engine-side state of a request the scheduler is running.
struct RequestState {
    rng: RequestRng,
    /// Text and stop strings, where the engine decodes text.
    text: Option<OutputText>,
    logprobs: Option<usize>,
    /// Distinct prompt + output tokens with output counts, for device
    /// penalties (made at the first device-sampled step of a request with
    /// penalties).
    history: Option<TokenHistory>,
    /// The structured-output matcher, advanced with each output token.
    guide: Option<Guide>,
    num_prompt_tokens: usize,
    /// Logit bias, allowed tokens, bad words and min_tokens bans, if any.
    rules: Option<LogitRules>,
    /// Prompt logprobs collected so far, until handed out.
    prompt_lp: Option<PromptLogprobsState>,
}

/// A model with its scheduler and KV cache.
pub struct LlmEngine<B: Backend> {
    runner: ModelRunner<B>,
    scheduler: Scheduler,
    tokenizer: Option<Arc<Tokenizer>>,
    /// Decode text and look for stop strings in [`Self::step`] (else the
    /// caller does, with [`OutputText`]).
    detokenize: bool,
    eos_token_ids: Vec<u32>,
    states: HashMap<RequestId, RequestState>,
    next_id: u64,
    /// Seeds requests that bring none.
    seed_source: RequestRng,
    /// The requests of the step being run (or last run), and its tokens.
    in_step: Vec<RequestId>,
    in_step_tokens: usize,
    /// Per-step stage times, when `PAGODA_STEP_LOG` names a file.
    step_log: Option<StepLog>,
    /// Reused per step: the sampling rows' penalties and logprobs requests.
    sampling_options: SamplingOptions,
    /// Grammar compiler and mask workers, made at the first constrained
    /// request (from `structured_build` where that was started).
    structured: Option<StructuredEngine>,
    /// The compiler being built on a thread of its own, where the caller
    /// started that before the model loaded ([`Self::set_structured_build`]).
    structured_build: Option<StructuredBuild>,
    /// Reused per row: the logit rules' entries of a step.
    rule_entries: Vec<(u32, f32)>,
    /// Per scheduled sequence of the step: the rows of its chunk whose
    /// logits prompt logprobs need (empty when none does).
    prompt_rows: Vec<std::ops::Range<usize>>,
    /// Requests whose grammar the last advance ended (complete or broken),
    /// reported at a mask join, to be ended by the next emit.
    ended: Vec<(RequestId, Advanced)>,
}

/// The ids that end a request's generation: the model config's
/// end-of-sequence ids, then the tokenizer's that the config lacks.
pub fn stop_token_ids(config_eos: &[u32], tokenizer: Option<&Tokenizer>) -> Vec<u32> {
    let mut ids = config_eos.to_vec();
    for &id in tokenizer.map_or(&[][..], |t| t.eos_token_ids()) {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

impl<B: Backend> LlmEngine<B> {
    /// `config.block_size` and `config.num_blocks` must match the runner's
    /// cache. Running requests release the KV blocks a sliding window has
    /// passed: in every layer where all share one window, in the local
    /// layers' KV cache groups where local and global layers mix (see the
    /// runner's [`pagoda_model::KvLayout`]). With more than one group the
    /// prefix cache reuses whole blocks (see `pagoda_core::kv_cache_manager`).
    pub fn new(
        runner: ModelRunner<B>,
        tokenizer: Option<Arc<Tokenizer>>,
        config: SchedulerConfig,
    ) -> Result<Self> {
        Self::with_window_release(runner, tokenizer, config, true)
    }

    /// As [`Self::new`]; `release_window_blocks: false` keeps every KV block
    /// of a sliding-window model for the whole request (the reference the
    /// release is checked against).
    pub fn with_window_release(
        runner: ModelRunner<B>,
        tokenizer: Option<Arc<Tokenizer>>,
        config: SchedulerConfig,
        release_window_blocks: bool,
    ) -> Result<Self> {
        let windows: Vec<Option<usize>> = runner
            .kv_layout()
            .windows
            .iter()
            .map(|w| w.filter(|_| release_window_blocks))
            .collect();
        let kv = runner.kv_shape();
        if kv.block_size != config.block_size || kv.num_blocks != config.num_blocks {
            return Err(EngineError::Internal(
                "the scheduler's block size or count differs from the KV cache's".into(),
            ));
        }
        let eos_token_ids = stop_token_ids(&runner.config().eos_token_ids, tokenizer.as_deref());
        let time_seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Ok(LlmEngine {
            runner,
            scheduler: Scheduler::with_kv_groups(config, &windows)?,
            tokenizer,
            detokenize: true,
            eos_token_ids,
            states: HashMap::new(),
            next_id: 0,
            seed_source: RequestRng::new(time_seed),
            in_step: Vec::new(),
            in_step_tokens: 0,
            step_log: StepLog::from_env(),
            sampling_options: SamplingOptions::default(),
            structured: None,
            structured_build: None,
            rule_entries: Vec::new(),
            prompt_rows: Vec::new(),
            ended: Vec::new(),
        })
    }

    /// Takes the structured-output compiler that `build` is making (see
    /// [`StructuredBuild`]: started before the model loaded, so that the
    /// first constrained request does not wait for it). One built for
    /// another vocabulary or other stop ids than this engine's is dropped
    /// at that request, which then builds its own.
    pub fn set_structured_build(&mut self, build: StructuredBuild) {
        if self.structured.is_none() {
            self.structured_build = Some(build);
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

    /// Whether [`Self::step`] decodes text and ends requests on stop strings
    /// (the default). Off, outputs carry tokens only and the caller applies
    /// an [`OutputText`] per request, ending a request in the engine
    /// ([`Self::finish_on_stop_string`]) when it finds a stop string; the
    /// threaded handle does this on its streams. Set before any request.
    pub fn set_detokenize(&mut self, on: bool) {
        self.detokenize = on;
    }

    /// Ends a request whose stop string its caller found (see
    /// [`Self::set_detokenize`]); its blocks are released at once. Unknown
    /// or finished ids are ignored.
    pub fn finish_on_stop_string(&mut self, id: RequestId) -> Result<()> {
        if self.states.remove(&id).is_some() {
            self.scheduler.finish(id, FinishReason::Stop)?;
        }
        Ok(())
    }

    /// Caps the prompt tokens of a step that also carries decodes (see
    /// [`Scheduler::set_mixed_prefill_budget`]); `None`: no cap.
    pub fn set_mixed_prefill_budget(&mut self, tokens: Option<usize>) {
        self.scheduler.set_mixed_prefill_budget(tokens);
    }

    pub fn scheduler_config(&self) -> &SchedulerConfig {
        self.scheduler.config()
    }

    pub fn stats(&self) -> SchedulerStats {
        self.scheduler.stats()
    }

    pub fn has_unfinished_requests(&self) -> bool {
        self.scheduler.has_unfinished_requests()
    }

    /// Whether a step has work: some unfinished request is not paused.
    pub fn has_schedulable_requests(&self) -> bool {
        self.scheduler.has_schedulable_requests()
    }

    /// Queues a request; refuses (with the reason) one that can never run.
    pub fn add_request(&mut self, r: EngineRequest) -> Result<RequestId> {
        let vocab = self.runner.config().vocab_size;
        if let Some(&bad) = r.prompt_token_ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidRequest(format!(
                "prompt token id {bad} is outside the vocabulary (size {vocab})"
            )));
        }
        if let (Some(n), true) = (r.logprobs, self.runner.samples_on_device()) {
            if n > MAX_LOGPROBS {
                return Err(EngineError::InvalidRequest(format!(
                    "{n} top logprobs asked; at most {MAX_LOGPROBS}"
                )));
            }
        }
        if let Some(n) = r.params.prompt_logprobs {
            if n > MAX_LOGPROBS {
                return Err(EngineError::InvalidRequest(format!(
                    "{n} prompt logprobs asked; at most {MAX_LOGPROBS}"
                )));
            }
        }
        let rules = LogitRules::new(
            &r.params,
            &self.eos_token_ids,
            self.tokenizer.as_deref(),
            vocab,
        )
        .map_err(EngineError::InvalidRequest)?;
        let guide = match &r.params.structured {
            Some(c) => {
                if self.structured.is_none() {
                    let vocab = self.runner.config().vocab_size;
                    let built = self
                        .structured_build
                        .take()
                        .and_then(|b| b.join(vocab, &self.eos_token_ids));
                    let s = match built {
                        Some(s) => s,
                        None => StructuredEngine::new(
                            self.tokenizer.as_ref(),
                            self.runner.config().vocab_size,
                            &self.eos_token_ids,
                            self.runner.samples_on_device(),
                        ),
                    }
                    .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
                    self.structured = Some(s);
                }
                let s = self
                    .structured
                    .as_ref()
                    .ok_or_else(|| EngineError::Internal("no structured-output compiler".into()))?;
                Some(
                    s.compile(c)
                        .map_err(|e| EngineError::InvalidRequest(e.to_string()))?,
                )
            }
            None => None,
        };
        let id = RequestId(self.next_id);
        let seed = r.params.seed.unwrap_or_else(|| self.seed_source.next_u64());
        let text = match (&self.tokenizer, self.detokenize) {
            (Some(t), true) => Some(OutputText::new(t.clone(), &r.params, &r.prompt_token_ids)?),
            _ => None,
        };
        let state = RequestState {
            rng: RequestRng::new(seed),
            text,
            logprobs: r.logprobs,
            history: None,
            guide,
            num_prompt_tokens: r.prompt_token_ids.len(),
            rules,
            prompt_lp: r.params.prompt_logprobs.map(|n| PromptLogprobsState {
                n,
                entries: Vec::new(),
            }),
        };
        self.scheduler
            .add_request(Request {
                id,
                prompt_token_ids: r.prompt_token_ids,
                sampling: r.params,
                eos_token_ids: self.eos_token_ids.clone(),
            })
            .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        self.next_id += 1;
        self.states.insert(id, state);
        Ok(id)
    }

    /// Drops a request at once; its blocks go back to the pool or the cache.
    pub fn abort(&mut self, id: RequestId) -> Result<()> {
        if self.states.remove(&id).is_some() {
            self.scheduler.abort(id)?;
        }
        Ok(())
    }

    /// Stops computing tokens for a request until [`Self::resume`]: it is
    /// never scheduled meanwhile, and a running one gives its blocks back (its
    /// computed prefix stays in the prefix cache where caching is on; it is
    /// recomputed on resuming). Its outputs so far and its sampling state
    /// stay, so its output is the same as if it had never paused. Unknown or
    /// finished ids are ignored.
    pub fn pause(&mut self, id: RequestId) -> Result<()> {
        if self.states.contains_key(&id) {
            self.scheduler.pause(id)?;
        }
        Ok(())
    }

    /// Makes a paused request schedulable again, in its order of arrival.
    /// Unknown, finished or unpaused ids are ignored.
    pub fn resume(&mut self, id: RequestId) -> Result<()> {
        if self.states.contains_key(&id) {
            self.scheduler.resume(id)?;
        }
        Ok(())
    }

    /// The requests scheduled in the step being run or last run (empty if
    /// planning itself failed): when a step fails, these are the requests
    /// whose state it may have left half-done; the others are untouched.
    pub fn last_step_requests(&self) -> &[RequestId] {
        &self.in_step
    }

    /// `(tokens, sequences)` of the step being run or last run.
    pub fn last_step_shape(&self) -> (usize, usize) {
        (self.in_step_tokens, self.in_step.len())
    }

    /// Runs one step; returns an output for every request that got a token
    /// (none when every unfinished request is paused).
    pub fn step(&mut self) -> Result<Vec<RequestOutput>> {
        self.in_step.clear();
        let mut clock = self.step_log.as_ref().map(|_| StepClock::start());
        let Some((plan, mut ctx)) = self.prepare()? else {
            return Ok(Vec::new());
        };
        clock.as_mut().map(StepClock::mark);
        let masks = self.start_masks(&plan);
        let (sampled, logprobs) = self.sample(&plan, &mut ctx, masks)?;
        clock.as_mut().map(StepClock::mark);
        let outputs = self.emit(&plan, &sampled, logprobs)?;
        let guides = self.structured.as_mut().map(|s| s.take_times());
        if let (Some(log), Some(c)) = (self.step_log.as_mut(), clock) {
            let guides = guides.unwrap_or_default();
            if !log.record(plan.num_decode_tokens, plan.num_prefill_tokens, &c, guides) {
                self.step_log = None;
            }
        }
        Ok(outputs)
    }

    /// Per-step token mask times of constrained requests (`None` before
    /// the first one).
    pub fn mask_stats(&self) -> Option<&MaskStats> {
        self.structured.as_ref().map(|s| s.workers().stats())
    }

    /// Starts the masks of the step's constrained rows on the mask workers
    /// (they run during the forward pass), or takes those the last step's
    /// advance started.
    fn start_masks(&mut self, plan: &SchedulerOutput) -> Option<PendingMasks> {
        let s = self.structured.as_mut()?;
        let t = Instant::now();
        let states = &mut self.states;
        let rows = plan.scheduled.iter().filter(|s| s.needs_logits);
        let pending = s.start(
            rows.enumerate()
                .map(|(row, sch)| (sch.request_id, row as u32)),
            |id| states.get_mut(&id).and_then(|st| st.guide.take()),
        );
        s.add_time(t, |g| &mut g.start_us);
        pending
    }

    /// Joins a step's masks and gives the guides back to their requests.
    fn finish_masks(
        structured: &mut Option<StructuredEngine>,
        states: &mut HashMap<RequestId, RequestState>,
        ended: &mut Vec<(RequestId, Advanced)>,
        pending: Option<PendingMasks>,
    ) -> Result<TokenMasks> {
        let (Some(s), Some(p)) = (structured.as_mut(), pending) else {
            return Ok(TokenMasks::default());
        };
        let t = Instant::now();
        let masks = s.finish(
            p,
            |id, g| {
                if let Some(st) = states.get_mut(&id) {
                    st.guide = Some(g);
                }
            },
            ended,
        );
        s.add_time(t, |g| &mut g.wait_us);
        masks.map_err(EngineError::Internal)
    }

    /// Stage 1: plan the step, copy shared blocks, build the forward
    /// context (no sampling rows yet). `None`: nothing to run.
    fn prepare(&mut self) -> Result<Option<(SchedulerOutput, ForwardContext)>> {
        let plan = self.scheduler.schedule()?;
        self.in_step
            .extend(plan.scheduled.iter().map(|s| s.request_id));
        self.in_step_tokens = plan.num_prefill_tokens + plan.num_decode_tokens;
        if plan.scheduled.is_empty() {
            if self.scheduler.has_schedulable_requests() {
                return Err(EngineError::Internal(
                    "the scheduler planned an empty step".into(),
                ));
            }
            return Ok(None);
        }
        // Copy-on-write of partly shared blocks, before the forward pass.
        if !plan.block_copies.is_empty() {
            self.runner.copy_blocks(&plan.block_copies)?;
        }
        let mut ctx = build_forward_context(&plan.scheduled, self.scheduler.config().block_size);
        self.lay_out_prompt_rows(&plan, &mut ctx);
        Ok(Some((plan, ctx)))
    }

    /// Adds to `ctx` the logits rows of the step's prompt chunks whose
    /// requests ask for prompt logprobs (none, and no cost, otherwise).
    fn lay_out_prompt_rows(&mut self, plan: &SchedulerOutput, ctx: &mut ForwardContext) {
        self.prompt_rows.clear();
        let mut any = false;
        for s in &plan.scheduled {
            let rows = match (
                self.states
                    .get(&s.request_id)
                    .and_then(|st| st.prompt_lp.as_ref()),
                self.scheduler.sequence(s.request_id),
            ) {
                (Some(p), Some(seq)) => plp::rows_wanted(
                    s.num_computed_tokens,
                    s.token_ids.len(),
                    seq.num_prompt_tokens,
                    p.entries.len(),
                ),
                _ => 0..0,
            };
            any |= !rows.is_empty();
            self.prompt_rows.push(rows);
        }
        if any {
            let samples: Vec<bool> = plan.scheduled.iter().map(|s| s.needs_logits).collect();
            plp::lay_out_rows(ctx, &self.prompt_rows, &samples);
        } else {
            self.prompt_rows.clear();
        }
    }

    /// Stage 2: the forward pass and a token for every sequence that
    /// finished its prompt or decoded: on the device where the backend
    /// samples there (penalties and logprobs included), else on the host.
    fn sample(
        &mut self,
        plan: &SchedulerOutput,
        ctx: &mut ForwardContext,
        masks: Option<PendingMasks>,
    ) -> Result<Sampled> {
        if self.runner.samples_on_device() {
            self.sample_on_device(plan, ctx, masks)
        } else {
            self.sample_on_host(plan, ctx, masks)
        }
    }

    fn sample_on_device(
        &mut self,
        plan: &SchedulerOutput,
        ctx: &mut ForwardContext,
        masks: Option<PendingMasks>,
    ) -> Result<Sampled> {
        let opts = &mut self.sampling_options;
        opts.clear();
        let mut any_options = false;
        let mut any_rules = false;
        for s in plan.scheduled.iter().filter(|s| s.needs_logits) {
            let (Some(seq), Some(state)) = (
                self.scheduler.sequence(s.request_id),
                self.states.get_mut(&s.request_id),
            ) else {
                ctx.sampling.push(SamplingRow::GREEDY);
                opts.rows.push(RowOptions::NONE);
                opts.adjust.push_row(&[], None);
                continue;
            };
            let p = &seq.sampling;
            ctx.sampling.push(SamplingRow {
                temperature: p.temperature,
                top_k: u32::try_from(p.top_k).unwrap_or(u32::MAX),
                top_p: p.top_p,
                min_p: p.min_p,
                // One draw per sampled token, as on the host.
                random: state.rng.next_u64(),
            });
            let mut row = RowOptions {
                logprobs: state.logprobs.map(|n| n.min(MAX_LOGPROBS) as u32),
                ..RowOptions::NONE
            };
            if has_penalties(p) {
                let prompt = &seq.token_ids[..seq.num_prompt_tokens];
                let h = state
                    .history
                    .get_or_insert_with(|| TokenHistory::from_prompt(prompt));
                h.sync(prompt, seq.output_token_ids());
                row.repetition_penalty = p.repetition_penalty;
                row.frequency_penalty = p.frequency_penalty;
                row.presence_penalty = p.presence_penalty;
                row.history_start = u32::try_from(opts.history.len() / 2)
                    .map_err(|_| EngineError::Internal("penalty history too long".into()))?;
                row.history_len = h.len() as u32;
                opts.history.extend_from_slice(h.pairs());
            }
            any_options |= row != RowOptions::NONE;
            opts.rows.push(row);
            match &state.rules {
                Some(rules) => {
                    rules.entries(seq.output_token_ids(), &mut self.rule_entries);
                    opts.adjust.push_row(&self.rule_entries, rules.allowed());
                    any_rules = true;
                }
                None => opts.adjust.push_row(&[], None),
            }
        }
        if !any_rules {
            opts.adjust.clear();
        }
        if !any_options {
            opts.rows.clear();
            opts.history.clear();
        }
        // Prompt-logprobs rows follow the sampling rows (see lay_out_rows):
        // the device scores each row's next prompt token.
        for (k, s) in plan.scheduled.iter().enumerate() {
            let rows = self.prompt_rows.get(k).cloned().unwrap_or(0..0);
            if rows.is_empty() {
                continue;
            }
            let (Some(seq), Some(p)) = (
                self.scheduler.sequence(s.request_id),
                self.states
                    .get(&s.request_id)
                    .and_then(|st| st.prompt_lp.as_ref()),
            ) else {
                return Err(EngineError::Internal(
                    "prompt-logprobs rows of an unknown request".into(),
                ));
            };
            for j in rows {
                let pos = s.num_computed_tokens + j;
                opts.prompt_rows.push(PromptRow {
                    token: seq.token_ids.get(pos + 1).copied().unwrap_or(u32::MAX),
                    n: p.n.min(MAX_LOGPROBS) as u32,
                });
            }
        }
        // The masks are joined once the forward pass is queued (or here,
        // if the step never got that far), giving every guide back.
        let mut pending = masks;
        let (structured, states, ended) = (&mut self.structured, &mut self.states, &mut self.ended);
        let out = self
            .runner
            .execute_masked(ctx, &self.sampling_options, &mut || {
                Self::finish_masks(structured, states, ended, pending.take())
                    .map_err(|e| KernelError::Device(e.to_string()))
            });
        Self::finish_masks(
            &mut self.structured,
            &mut self.states,
            &mut self.ended,
            pending,
        )?;
        let mut samples = match out? {
            StepOutput::Samples(s) => s,
            StepOutput::Tokens(tokens) => DeviceSamples {
                tokens,
                ..DeviceSamples::default()
            },
            // A step of prompt chunks only: no rows, nothing sampled.
            StepOutput::Logits(l) if l.is_empty() && ctx.sampling.is_empty() => {
                DeviceSamples::default()
            }
            StepOutput::Logits(_) => {
                return Err(EngineError::Internal(
                    "a step sampled on the device returned logits".into(),
                ))
            }
        };
        if samples.tokens.len() != ctx.sampling.len()
            || samples.prompt.len() != self.sampling_options.prompt_rows.len()
        {
            return Err(EngineError::Internal(
                "fewer sampled tokens or prompt rows than asked".into(),
            ));
        }
        let mut prompt = std::mem::take(&mut samples.prompt).into_iter();
        for (k, s) in plan.scheduled.iter().enumerate() {
            for j in self.prompt_rows.get(k).cloned().unwrap_or(0..0) {
                let Some(r) = prompt.next() else { break };
                self.collect_prompt_logprob(s.request_id, s.num_computed_tokens + j, |token, _| {
                    PromptLogprob {
                        token,
                        logprob: r.logprob,
                        rank: r.rank,
                        top: r.top,
                    }
                });
            }
        }
        let mut sampled = Vec::with_capacity(samples.tokens.len());
        let mut logprobs = HashMap::new();
        let mut lps = samples.logprobs.into_iter();
        let rows = plan.scheduled.iter().filter(|s| s.needs_logits);
        for (s, &t) in rows.zip(&samples.tokens) {
            let lp = lps.next().flatten();
            if self.states.contains_key(&s.request_id) {
                sampled.push((s.request_id, t));
                if let Some(lp) = lp {
                    logprobs.insert(
                        s.request_id,
                        TokenLogprobs {
                            logprob: lp.logprob,
                            top: lp.top,
                        },
                    );
                }
            }
        }
        Ok((sampled, logprobs))
    }

    fn sample_on_host(
        &mut self,
        plan: &SchedulerOutput,
        ctx: &ForwardContext,
        masks: Option<PendingMasks>,
    ) -> Result<Sampled> {
        let mut sampled = Vec::with_capacity(ctx.logits_indices.len());
        let mut logprobs = HashMap::new();
        // The masks were computed during the forward pass; join them
        // whatever it returned, so that every guide goes back.
        let logits = self.runner.execute(ctx);
        let masks = Self::finish_masks(
            &mut self.structured,
            &mut self.states,
            &mut self.ended,
            masks,
        )?;
        let mut logits = logits?.into_logits()?;
        let vocab = self.runner.config().vocab_size;
        let num_sampled = plan.scheduled.iter().filter(|s| s.needs_logits).count();
        masks
            .validate(num_sampled, vocab)
            .map_err(EngineError::Internal)?;
        let mut next_mask = masks
            .rows
            .iter()
            .zip(masks.bits.chunks_exact(masks.words.max(1)));
        let mut pending_mask = next_mask.next();
        // The sampled rows lead, the prompt-logprobs rows follow (see
        // lay_out_rows).
        let split = (num_sampled * vocab).min(logits.len());
        let (sampled_rows, prompt_rows) = logits.split_at_mut(split);
        let mut rows = sampled_rows.chunks_exact_mut(vocab);
        let mut next_row = || {
            rows.next()
                .ok_or_else(|| EngineError::Internal("fewer logits rows than sequences".into()))
        };
        let mut prompt = prompt_rows.chunks_exact(vocab);
        for (k, s) in plan.scheduled.iter().enumerate() {
            for j in self.prompt_rows.get(k).cloned().unwrap_or(0..0) {
                let row = prompt
                    .next()
                    .ok_or_else(|| EngineError::Internal("fewer prompt rows than asked".into()))?;
                self.collect_prompt_logprob(s.request_id, s.num_computed_tokens + j, |token, n| {
                    plp::prompt_logprob(row, token, n)
                });
            }
        }
        // `i` counts the sampled rows (the masks' numbering).
        let mut i = 0;
        for s in &plan.scheduled {
            if !s.needs_logits {
                continue;
            }
            let row = next_row()?;
            if let Some((_, bits)) = pending_mask.filter(|(&r, _)| r as usize == i) {
                // Before penalties and temperature, as vLLM does.
                apply_mask(row, bits);
                pending_mask = next_mask.next();
            }
            i += 1;
            let (Some(seq), Some(state)) = (
                self.scheduler.sequence(s.request_id),
                self.states.get_mut(&s.request_id),
            ) else {
                continue;
            };
            let prompt = &seq.token_ids[..seq.num_prompt_tokens];
            if let Some(rules) = &state.rules {
                sampler::apply_logit_rules(
                    row,
                    rules,
                    seq.output_token_ids(),
                    &mut self.rule_entries,
                );
            }
            let out = sampler::sample_with_logprobs(
                row,
                &seq.sampling,
                prompt,
                seq.output_token_ids(),
                &mut state.rng,
                state.logprobs,
            );
            sampled.push((s.request_id, out.token));
            if let Some(lp) = out.logprobs {
                logprobs.insert(s.request_id, lp);
            }
        }
        if let Some(st) = self.structured.as_mut() {
            st.recycle(masks);
        }
        Ok((sampled, logprobs))
    }

    /// Records the prompt logprob that the logits at prompt position `pos`
    /// give the token after it, made by `entry(token, n)` (once: a
    /// recomputed position is skipped).
    fn collect_prompt_logprob(
        &mut self,
        id: RequestId,
        pos: usize,
        entry: impl FnOnce(u32, usize) -> PromptLogprob,
    ) {
        let (Some(seq), Some(p)) = (
            self.scheduler.sequence(id),
            self.states
                .get_mut(&id)
                .and_then(|st| st.prompt_lp.as_mut()),
        ) else {
            return;
        };
        if pos == p.entries.len() && pos + 1 < seq.num_prompt_tokens {
            p.entries.push(entry(seq.token_ids[pos + 1], p.n));
        }
    }

    /// Advances the guides of the rows that got a token and go on, past
    /// that token, on the mask workers, which then go on to compute those
    /// rows' next masks (joined by the next step); entry `k` is update `k`'s
    /// outcome (`None`: unconstrained, or finished by the step).
    fn advance_guides(
        &mut self,
        updates: &[pagoda_core::RequestUpdate],
    ) -> Result<Vec<Option<Advanced>>> {
        let mut out = vec![None; updates.len()];
        let Some(s) = self.structured.as_mut() else {
            return Ok(out);
        };
        let t = Instant::now();
        let mut rows = Vec::new();
        let mut idx = Vec::new();
        for (k, u) in updates.iter().enumerate() {
            if u.finish_reason.is_some() {
                continue;
            }
            let guide = self
                .states
                .get_mut(&u.request_id)
                .and_then(|st| st.guide.take());
            if let Some(g) = guide {
                rows.push((u.request_id, g, u.token_id));
                idx.push(k);
            }
        }
        let mut advanced = vec![Advanced::Pending; rows.len()];
        let states = &mut self.states;
        s.advance(
            rows,
            &mut advanced,
            |id, g| {
                if let Some(st) = states.get_mut(&id) {
                    st.guide = Some(g);
                }
            },
            &mut self.ended,
        )
        .map_err(EngineError::Internal)?;
        for (k, a) in idx.into_iter().zip(advanced) {
            out[k] = Some(a);
        }
        s.add_time(t, |g| &mut g.advance_us);
        Ok(out)
    }

    /// Ends the requests whose grammar the last advance found complete
    /// (`Stop`, whatever `ignore_eos` says: nothing may follow) or broken
    /// by the sampled token (`Abort`, logged as an error: a correct mask
    /// makes it impossible), reported at this step's mask join. Called
    /// before the scheduler's update, so that such a request's row of this
    /// step (sampled under a mask of EOS only) is discarded: never
    /// appended, emitted, counted or cached. Each gets an output without a
    /// token ([`RequestOutput::no_token`]) with the text held back so far.
    /// Requests gone meanwhile (aborted, or ended by a stop string or
    /// `max_tokens` on their last token) are skipped.
    fn end_grammars(&mut self, outputs: &mut Vec<RequestOutput>) -> Result<()> {
        if self.ended.is_empty() {
            return Ok(());
        }
        let mut ended = std::mem::take(&mut self.ended);
        for (id, a) in ended.drain(..) {
            let Some(seq) = self.scheduler.sequence(id) else {
                continue;
            };
            let (num_output_tokens, num_cached_tokens) =
                (seq.num_output_tokens(), seq.num_cached_tokens);
            let Some(mut state) = self.states.remove(&id) else {
                continue;
            };
            let reason = match a {
                Advanced::Broken(e) => {
                    tracing::error!(request = id.0, error = %e,
                        "structured output: the sampled token breaks the grammar \
                         (its mask allowed it): the request is aborted");
                    FinishReason::Abort
                }
                _ => FinishReason::Stop,
            };
            self.scheduler.finish(id, reason)?;
            let mut out = RequestOutput {
                request_id: id,
                token_id: 0,
                logprobs: None,
                text_delta: String::new(),
                finish_reason: Some(reason),
                stop_token: false,
                num_prompt_tokens: state.num_prompt_tokens,
                num_output_tokens,
                num_cached_tokens,
                prompt_logprobs: state.prompt_lp.take().map(|p| p.entries),
                no_token: true,
            };
            if let Some(text) = state.text.as_mut() {
                text.apply(&mut out)?;
            }
            outputs.push(out);
        }
        self.ended = ended;
        Ok(())
    }

    /// Stage 3: append the tokens, run the stop checks, decode text.
    fn emit(
        &mut self,
        plan: &SchedulerOutput,
        sampled: &[(RequestId, u32)],
        mut logprobs: HashMap<RequestId, TokenLogprobs>,
    ) -> Result<Vec<RequestOutput>> {
        let mut outputs = Vec::with_capacity(sampled.len());
        // Before the update, so that their rows of this step are dropped.
        self.end_grammars(&mut outputs)?;
        let updates = self.scheduler.update_from_output(plan, sampled)?;
        if tracing::enabled!(tracing::Level::DEBUG) {
            let st = self.scheduler.stats();
            tracing::debug!(
                prefills = plan.num_prefills,
                prefill_tokens = plan.num_prefill_tokens,
                decode_tokens = plan.num_decode_tokens,
                running = st.num_running,
                waiting = st.num_waiting,
                blocks_used = st.num_blocks_used,
                blocks_free = st.num_blocks_free,
                radix_tokens = st.radix_cached_tokens,
                hit_rate = st.prefix_cache_hit_rate(),
                fragmentation = st.fragmentation(self.scheduler.config().block_size),
                preemptions = st.counters.num_preemptions,
                "step"
            );
        }
        let mut advanced = self.advance_guides(&updates)?;
        for (k, u) in updates.into_iter().enumerate() {
            let Some(state) = self.states.get_mut(&u.request_id) else {
                continue;
            };
            let mut finish = u.finish_reason;
            // A stop token's text is kept only with include_stop_str_in_output.
            let is_stop_token = finish == Some(FinishReason::Stop);
            if let Some(a) = advanced.get_mut(k).and_then(Option::take) {
                // A complete grammar allows only EOS: end the request now.
                let done = match a {
                    Advanced::Continues(more) => !more,
                    Advanced::Pending => false,
                    Advanced::Broken(e) => {
                        tracing::warn!(request = u.request_id.0, error = %e,
                            "structured output: the sampled token breaks the grammar");
                        true
                    }
                };
                if done {
                    self.scheduler.finish(u.request_id, FinishReason::Stop)?;
                    finish = Some(FinishReason::Stop);
                }
            }
            let mut out = RequestOutput {
                request_id: u.request_id,
                token_id: u.token_id,
                logprobs: logprobs.remove(&u.request_id),
                text_delta: String::new(),
                finish_reason: finish,
                stop_token: is_stop_token,
                num_prompt_tokens: state.num_prompt_tokens,
                num_output_tokens: u.num_output_tokens,
                num_cached_tokens: u.num_cached_tokens,
                prompt_logprobs: state.prompt_lp.take().map(|p| p.entries),
                no_token: false,
            };
            if let Some(text) = state.text.as_mut() {
                if text.apply(&mut out)? && finish.is_none() {
                    self.scheduler.finish(u.request_id, FinishReason::Stop)?;
                }
            }
            if out.finish_reason.is_some() {
                self.states.remove(&u.request_id);
            }
            outputs.push(out);
        }
        Ok(outputs)
    }
}

/// A step's sampled tokens, and the logprobs of the requests that asked.
type Sampled = (Vec<(RequestId, u32)>, HashMap<RequestId, TokenLogprobs>);

/// Whether a request's sampling needs its token history.
fn has_penalties(p: &pagoda_core::SamplingParams) -> bool {
    p.repetition_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0
}
