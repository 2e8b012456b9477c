//! Continuous-batching scheduler with chunked prefill and preemption (vLLM v1's
//! policy), over the block pool and radix prefix cache.
//!
//! Each step spends a token budget: running decodes first, then the prompt
//! chunks of running requests, then new requests from the waiting queue (FIFO)
//! until the budget, `max_num_seqs` or the free blocks run out. A prompt longer
//! than what is left of the budget is cut into chunks over several steps.
//! With a mixed-step prefill budget ([`Scheduler::set_mixed_prefill_budget`])
//! a step that carries decodes takes at most that many prompt tokens, so
//! prompts arriving while others decode lengthen each decode step by a
//! bounded amount (the inter-token latency's tail); steps with no decode
//! still take the whole budget.
//!
//! When a running request cannot get a block, the radix cache is evicted
//! first; then the newest running requests not yet scheduled in this step, and
//! newer than the one asking, are preempted by recompute (their K/V goes to
//! the prefix cache, they go back to the front of the waiting queue). New
//! requests are not admitted in a step where a running one was preempted or
//! left out for want of blocks.
//!
//! A request can be paused for its client ([`Scheduler::pause`], e.g. a
//! stream nobody reads): a running one is preempted as memory pressure would
//! (by recompute: its blocks go back, its computed prefix stays in the radix
//! cache where caching is on), a waiting one leaves the queue; it is then
//! never scheduled and holds no blocks until [`Scheduler::resume`] puts it
//! back in the waiting queue in its order of arrival.
//!
//! Logits rows: a step has at most `max_num_seqs` of them (the count the
//! runner's profiling sized device memory for): one per sequence that
//! samples, and one per position of a prompt chunk of a request asking
//! for prompt logprobs, whose chunks are cut to fit; such a request also
//! takes no cached prefix until its prompt is computed.
//!
//! Liveness: a request is admitted only if it fits the whole cache on its own
//! (with a sliding window: one window of blocks and a step's chunk; with KV
//! cache groups: the sum over the groups);
//! the oldest running request can be preempted by no one (only paused, by its
//! client's choice) and, once the others finish or are preempted, has the
//! whole cache; so every request that is not paused finishes.
//!
//! Costs: `schedule` is O(running + scheduled tokens + blocks of scheduled
//! sequences) plus O(prompt) for each admission (prefix match); paused
//! requests cost it nothing. `update_from_output` O(batch + newly full
//! blocks); `abort`, `pause` and `resume` O(queue length).

use std::collections::{HashMap, VecDeque};

use crate::config::SchedulerConfig;
use crate::error::{CoreError, Result};
use crate::kv_cache_manager::KvCacheManager;
use crate::output::{BlockCopy, RequestUpdate, ScheduledSequence, SchedulerOutput};
use crate::sequence::{FinishReason, Request, RequestId, Sequence, SequenceStatus};
use crate::stats::{SchedulerStats, StatCounters};

#[derive(Debug, Clone)]
pub struct Scheduler {
    pub(crate) config: SchedulerConfig,
    pub(crate) kv: KvCacheManager,
    pub(crate) requests: HashMap<RequestId, Sequence>,
    /// FIFO; preempted requests go back to the front.
    pub(crate) waiting: VecDeque<RequestId>,
    /// In admission order: earlier = higher priority.
    pub(crate) running: Vec<RequestId>,
    /// Requests with status `Paused` (in no queue).
    pub(crate) num_paused: usize,
    /// The next request's `arrival`.
    next_arrival: u64,
    pub(crate) counters: StatCounters,
    /// Most prompt tokens of a step that carries decodes (`None`: the
    /// whole budget).
    mixed_prefill_budget: Option<usize>,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Result<Self> {
        Self::with_sliding_window(config, None)
    }

    /// A scheduler for a model whose every attention layer sees only the
    /// last `window` positions: running requests release the blocks the
    /// window has passed (see [`crate::kv_cache_manager`]), and a request is
    /// admitted when one window of blocks (plus a step's chunk) fits the cache.
    pub fn with_sliding_window(config: SchedulerConfig, window: Option<usize>) -> Result<Self> {
        Self::with_kv_groups(config, &[window])
    }

    /// A scheduler over KV cache groups with windows `windows`, group 0
    /// first (see [`crate::kv_cache_manager`]): `num_blocks` counts pages of
    /// the one pool all groups share; each windowed group releases the
    /// blocks its window has passed. One group is
    /// [`Self::with_sliding_window`]; with more, prefix caching is
    /// block-granular (see [`crate::kv_cache_manager`]).
    pub fn with_kv_groups(config: SchedulerConfig, windows: &[Option<usize>]) -> Result<Self> {
        config.validate()?;
        if windows.contains(&Some(0)) {
            return Err(CoreError::InvalidConfig(
                "the sliding window must be at least 1 token".into(),
            ));
        }
        Ok(Scheduler {
            kv: KvCacheManager::with_groups(
                config.num_blocks,
                config.block_size,
                config.enable_prefix_caching,
                windows,
            )?,
            config,
            requests: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            num_paused: 0,
            next_arrival: 0,
            counters: StatCounters::default(),
            mixed_prefill_budget: None,
        })
    }

    /// Caps the prompt tokens of a step that also carries decodes at
    /// `tokens` (at least 1); `None` (the default): the step's whole budget.
    pub fn set_mixed_prefill_budget(&mut self, tokens: Option<usize>) {
        self.mixed_prefill_budget = tokens.map(|t| t.max(1));
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The sliding window whose passed blocks are released, if any (of
    /// group 0 where there are several KV cache groups).
    pub fn sliding_window(&self) -> Option<usize> {
        self.kv.window
    }

    /// KV cache groups (1 unless the model mixes windows).
    pub fn num_kv_groups(&self) -> usize {
        self.kv.num_groups()
    }

    /// The most pages a request reaching `num_tokens` tokens holds at once,
    /// summed over the KV cache groups: all of its blocks in a full group,
    /// one window of them plus a step's chunk in a windowed one.
    pub fn max_blocks_held(&self, num_tokens: usize) -> usize {
        self.kv
            .max_blocks_held(num_tokens, self.config.max_num_batched_tokens)
    }

    /// Queues a request, or refuses one that could never be served.
    pub fn add_request(&mut self, request: Request) -> Result<()> {
        let id = request.id;
        request.sampling.validate()?;
        if request.prompt_token_ids.is_empty() {
            return Err(CoreError::EmptyPrompt(id));
        }
        if self.requests.contains_key(&id) {
            return Err(CoreError::DuplicateRequest(id));
        }
        let max_model_len = self.config.max_model_len;
        if request.prompt_token_ids.len() > max_model_len {
            return Err(CoreError::PromptTooLong {
                id,
                prompt_len: request.prompt_token_ids.len(),
                max_model_len,
            });
        }
        let mut seq = Sequence::new(request);
        // The last token is never computed, so at most max_num_tokens - 1 K/V.
        let needed = self.max_blocks_held(seq.max_num_tokens(max_model_len) - 1);
        if needed > self.config.num_blocks {
            return Err(CoreError::ExceedsKvCache {
                id,
                needed,
                num_blocks: self.config.num_blocks,
            });
        }
        seq.arrival = self.next_arrival;
        self.next_arrival += 1;
        self.requests.insert(id, seq);
        self.waiting.push_back(id);
        Ok(())
    }

    pub fn has_unfinished_requests(&self) -> bool {
        !self.requests.is_empty()
    }

    /// Whether some unfinished request is not paused (a step has work).
    pub fn has_schedulable_requests(&self) -> bool {
        self.requests.len() > self.num_paused
    }

    pub fn num_paused_requests(&self) -> usize {
        self.num_paused
    }

    /// Holds request `id` back until [`Self::resume`]: a running request is
    /// preempted by recompute (its blocks go back; its computed prefix stays
    /// in the radix cache where caching is on), a waiting one leaves the
    /// queue. It keeps its tokens and is never scheduled while paused.
    /// Pausing a paused request does nothing. Call between steps (after an
    /// `update_from_output`), as for [`Self::abort`].
    pub fn pause(&mut self, id: RequestId) -> Result<()> {
        let seq = self
            .requests
            .get_mut(&id)
            .ok_or(CoreError::UnknownRequest(id))?;
        match seq.status {
            SequenceStatus::Paused => return Ok(()),
            SequenceStatus::Running => {
                self.kv.release(seq)?;
                self.running.retain(|&r| r != id);
            }
            SequenceStatus::Waiting => self.waiting.retain(|&r| r != id),
        }
        seq.status = SequenceStatus::Paused;
        self.num_paused += 1;
        self.counters.num_pauses += 1;
        Ok(())
    }

    /// Makes paused request `id` schedulable again: it goes back to the
    /// waiting queue ahead of every request that arrived after it. Resuming
    /// a request that is not paused does nothing.
    pub fn resume(&mut self, id: RequestId) -> Result<()> {
        let seq = self
            .requests
            .get_mut(&id)
            .ok_or(CoreError::UnknownRequest(id))?;
        if seq.status != SequenceStatus::Paused {
            return Ok(());
        }
        seq.status = SequenceStatus::Waiting;
        let arrival = seq.arrival;
        let requests = &self.requests;
        let at = self
            .waiting
            .iter()
            .position(|w| requests.get(w).is_some_and(|r| r.arrival > arrival))
            .unwrap_or(self.waiting.len());
        self.waiting.insert(at, id);
        self.num_paused -= 1;
        Ok(())
    }

    /// Whether request `id` is paused.
    pub fn is_paused(&self, id: RequestId) -> bool {
        self.requests
            .get(&id)
            .is_some_and(|s| s.status == SequenceStatus::Paused)
    }

    pub fn num_unfinished_requests(&self) -> usize {
        self.requests.len()
    }

    /// The state of an unfinished request (prompt and output token ids, ...).
    pub fn sequence(&self, id: RequestId) -> Option<&Sequence> {
        self.requests.get(&id)
    }

    /// Plans the next step. Call [`Self::update_from_output`] with its results
    /// before planning another.
    pub fn schedule(&mut self) -> Result<SchedulerOutput> {
        self.kv.end_step()?;
        let mut out = SchedulerOutput::default();
        let mut budget = self.config.max_num_batched_tokens;
        let order = std::mem::take(&mut self.running);
        let mut scheduled = vec![false; order.len()];
        let mut preempted = vec![false; order.len()];
        let mut blocked = false;
        // Logits rows planned so far (an upper bound; see the module docs).
        let max_rows = self.config.max_num_seqs;
        let mut rows = 0;
        // 1. Running requests: decodes (one token left), then prompt chunks.
        for decodes in [true, false] {
            if let (false, Some(cap)) = (decodes, self.mixed_prefill_budget) {
                if !out.scheduled.is_empty() {
                    // Decodes are in this step: bound the prompt tokens.
                    budget = budget.min(cap);
                }
            }
            for i in 0..order.len() {
                let seq = &self.requests[&order[i]];
                let left = seq.num_uncomputed_tokens();
                if budget == 0
                    || scheduled[i]
                    || preempted[i]
                    || left == 0
                    || (left == 1) != decodes
                {
                    continue;
                }
                let room = max_rows.saturating_sub(rows);
                let (num_new, cost) = if seq.wants_prompt_rows() {
                    let n = left.min(budget).min(room);
                    (n, n)
                } else {
                    (left.min(budget), 1)
                };
                if num_new == 0 || cost > room {
                    continue;
                }
                if self.allocate_or_preempt(
                    &order,
                    i,
                    num_new,
                    &scheduled,
                    &mut preempted,
                    &mut out,
                )? {
                    scheduled[i] = true;
                    budget -= num_new;
                    rows += cost;
                    out.push(self.plan(order[i], num_new));
                } else {
                    blocked = true;
                }
            }
        }
        self.running = order
            .into_iter()
            .zip(preempted)
            .filter(|(_, p)| !p)
            .map(|(id, _)| id)
            .collect();
        // 2. Waiting requests, unless blocks are already short.
        if blocked || !out.preempted.is_empty() {
            return Ok(out);
        }
        while budget > 0 && self.running.len() < self.config.max_num_seqs && rows < max_rows {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let room = max_rows - rows;
            let prompt_rows = self.requests[&id].sampling.prompt_logprobs.is_some();
            let chunk_budget = if prompt_rows {
                budget.min(room)
            } else {
                budget
            };
            let Some((num_new, copy)) = self.admit(id, chunk_budget)? else {
                break;
            };
            self.waiting.pop_front();
            self.running.push(id);
            budget -= num_new;
            rows += if prompt_rows { num_new } else { 1 };
            out.block_copies.extend(copy);
            out.push(self.plan(id, num_new));
        }
        Ok(out)
    }

    /// Gives running request `order[i]` blocks for `num_new` more tokens,
    /// preempting newer unscheduled requests if needed. `false`: it must wait.
    fn allocate_or_preempt(
        &mut self,
        order: &[RequestId],
        i: usize,
        num_new: usize,
        scheduled: &[bool],
        preempted: &mut [bool],
        out: &mut SchedulerOutput,
    ) -> Result<bool> {
        loop {
            let seq = self
                .requests
                .get_mut(&order[i])
                .ok_or(CoreError::UnknownRequest(order[i]))?;
            let total = seq.num_computed_tokens + num_new;
            if self.kv.allocate_slots(seq, total)? {
                return Ok(true);
            }
            let Some(j) = (i + 1..order.len())
                .rev()
                .find(|&j| !scheduled[j] && !preempted[j])
            else {
                return Ok(false);
            };
            preempted[j] = true;
            self.preempt(order[j])?;
            out.preempted.push(order[j]);
        }
    }

    fn preempt(&mut self, id: RequestId) -> Result<()> {
        let seq = self
            .requests
            .get_mut(&id)
            .ok_or(CoreError::UnknownRequest(id))?;
        self.kv.release(seq)?;
        seq.status = SequenceStatus::Waiting;
        self.waiting.push_front(id);
        self.counters.num_preemptions += 1;
        Ok(())
    }

    /// Starts waiting request `id` from its cached prefix and gives it blocks
    /// for a first chunk; `None` (and no change) if the blocks are not there.
    fn admit(
        &mut self,
        id: RequestId,
        budget: usize,
    ) -> Result<Option<(usize, Option<BlockCopy>)>> {
        let bs = self.config.block_size;
        let seq = self
            .requests
            .get_mut(&id)
            .ok_or(CoreError::UnknownRequest(id))?;
        // Retry without a mid-block prefix: its copy needs one block more.
        for allow_partial in [true, false] {
            let src = self.kv.acquire_prefix(seq, allow_partial)?;
            let num_new = seq.num_uncomputed_tokens().min(budget);
            if self
                .kv
                .allocate_slots(seq, seq.num_computed_tokens + num_new)?
            {
                let cached = seq.num_computed_tokens;
                seq.status = SequenceStatus::Running;
                self.counters.prefix_cache_queried_tokens += seq.num_tokens() as u64;
                self.counters.prefix_cache_hit_tokens += cached as u64;
                let copy = src.map(|src| BlockCopy {
                    src,
                    dst: seq.block_table[cached / bs],
                    num_tokens: cached % bs,
                });
                return Ok(Some((num_new, copy)));
            }
            self.kv.cancel_admission(seq, src)?;
            if src.is_none() {
                break;
            }
        }
        Ok(None)
    }

    fn plan(&self, id: RequestId, num_new: usize) -> ScheduledSequence {
        let seq = &self.requests[&id];
        let start = seq.num_computed_tokens;
        let end = start + num_new;
        ScheduledSequence {
            request_id: id,
            token_ids: seq.token_ids[start..end].to_vec(),
            num_computed_tokens: start,
            block_table: seq.block_table.clone(),
            group_tables: seq.group_tables.iter().map(|t| t.blocks.clone()).collect(),
            needs_logits: end == seq.num_tokens(),
            is_prefill: num_new > 1 || start < seq.num_prompt_tokens,
            num_cached_tokens: seq.num_cached_tokens,
        }
    }

    /// Applies a step's results: advances the computed tokens, caches newly
    /// full blocks, appends each sampled token and runs the stop checks.
    /// Finished requests have released their blocks when this returns.
    /// A sequence that needed a token but got none is planned again unchanged.
    pub fn update_from_output(
        &mut self,
        output: &SchedulerOutput,
        sampled: &[(RequestId, u32)],
    ) -> Result<Vec<RequestUpdate>> {
        self.kv.end_step()?;
        let sampled: HashMap<RequestId, u32> = sampled.iter().copied().collect();
        let mut updates = Vec::new();
        for s in &output.scheduled {
            let Some(seq) = self.requests.get_mut(&s.request_id) else {
                continue;
            };
            let fresh = seq.status == SequenceStatus::Running
                && seq.num_computed_tokens == s.num_computed_tokens;
            let token = sampled.get(&s.request_id).copied();
            if !fresh || (s.needs_logits && token.is_none()) {
                continue;
            }
            seq.num_computed_tokens += s.query_len();
            self.kv.cache_full_blocks(seq)?;
            let Some(token_id) = token.filter(|_| s.needs_logits) else {
                continue;
            };
            seq.token_ids.push(token_id);
            let finish_reason = seq.stop_reason(self.config.max_model_len);
            updates.push(RequestUpdate {
                request_id: s.request_id,
                token_id,
                finish_reason,
                num_output_tokens: seq.num_output_tokens(),
                num_cached_tokens: seq.num_cached_tokens,
            });
            if let Some(reason) = finish_reason {
                self.remove(s.request_id, reason)?;
            }
        }
        if updates.iter().any(|u| u.finish_reason.is_some()) {
            let requests = &self.requests;
            self.running.retain(|id| requests.contains_key(id));
        }
        Ok(updates)
    }

    /// Ends a request for a reason found outside (a stop string, a client
    /// going away); its blocks are released at once.
    pub fn finish(&mut self, id: RequestId, reason: FinishReason) -> Result<()> {
        let status = self
            .requests
            .get(&id)
            .ok_or(CoreError::UnknownRequest(id))?
            .status;
        self.remove(id, reason)?;
        match status {
            SequenceStatus::Running => self.running.retain(|&r| r != id),
            SequenceStatus::Waiting => self.waiting.retain(|&r| r != id),
            SequenceStatus::Paused => self.num_paused -= 1,
        }
        Ok(())
    }

    /// Aborts a request, running, waiting or paused, at any time.
    pub fn abort(&mut self, id: RequestId) -> Result<()> {
        self.finish(id, FinishReason::Abort)
    }

    /// Drops the request and releases its blocks; the caller fixes the queues.
    fn remove(&mut self, id: RequestId, reason: FinishReason) -> Result<()> {
        let Some(mut seq) = self.requests.remove(&id) else {
            return Err(CoreError::UnknownRequest(id));
        };
        self.kv.release(&mut seq)?;
        match reason {
            FinishReason::Abort => self.counters.num_aborted += 1,
            _ => self.counters.num_finished += 1,
        }
        Ok(())
    }

    /// Evicts every unlocked prefix from the radix cache; returns blocks freed.
    pub fn flush_prefix_cache(&mut self) -> Result<usize> {
        match self.kv.radix.as_mut() {
            Some(radix) => radix.flush(&mut self.kv.pool),
            None => Ok(0),
        }
    }

    pub fn stats(&self) -> SchedulerStats {
        let bs = self.config.block_size;
        let internal_fragmentation_slots = self
            .running
            .iter()
            .filter_map(|id| self.requests.get(id))
            .map(|s| (s.block_table.len() * bs).saturating_sub(s.num_computed_tokens))
            .sum();
        SchedulerStats {
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            num_paused: self.num_paused,
            num_blocks_total: self.kv.pool.num_blocks(),
            num_blocks_used: self.kv.pool.num_used(),
            num_blocks_free: self.kv.pool.num_free(),
            radix_cached_tokens: self.kv.radix.as_ref().map_or(0, |r| r.num_tokens()),
            internal_fragmentation_slots,
            counters: self.counters,
        }
    }
}
