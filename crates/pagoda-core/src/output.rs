//! What the scheduler hands the model runner, and what it reports back.
//!
//! [`SchedulerOutput`] is the per-step batch plan: for each scheduled sequence
//! the tokens to compute, its context length and block table, and whether the
//! runner must produce logits for its last token; plus the block copies to do
//! before the forward pass (copy-on-write of a prefix that ends mid-block).
//! Building it is O(scheduled tokens + blocks of the scheduled sequences).

use std::ops::Range;

use crate::block_pool::BlockId;
use crate::sequence::{FinishReason, RequestId};

/// Copy the K/V of the first `num_tokens` slots of block `src` into `dst`,
/// in every layer, before this step's forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopy {
    pub src: BlockId,
    pub dst: BlockId,
    pub num_tokens: usize,
}

/// One sequence's share of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduledSequence {
    pub request_id: RequestId,
    /// Tokens to compute now, at positions `num_computed_tokens..`.
    pub token_ids: Vec<u32>,
    /// Tokens already in the cache (vLLM's `context_len`).
    pub num_computed_tokens: usize,
    /// Covers at least `seq_len()` tokens (KV cache group 0's table).
    pub block_table: Vec<BlockId>,
    /// The tables of KV cache groups 1.., each as long as `block_table`
    /// (empty with one group).
    pub group_tables: Vec<Vec<BlockId>>,
    /// Whether the last token's logits are sampled (false for a prompt chunk
    /// that does not finish the prompt).
    pub needs_logits: bool,
    /// A prompt (or recompute) chunk rather than a single-token decode.
    pub is_prefill: bool,
    /// Prompt tokens taken from the prefix cache when the request was admitted.
    pub num_cached_tokens: usize,
}

impl ScheduledSequence {
    /// A step entry laid out by hand (benchmarks, tests; the scheduler plans
    /// its own): `token_ids` computed after `num_computed_tokens` cached ones,
    /// in the blocks of `block_table`, one KV cache group. A single token after
    /// a non-empty context is a decode, anything else a prompt chunk.
    pub fn new(
        request_id: RequestId,
        token_ids: Vec<u32>,
        num_computed_tokens: usize,
        block_table: Vec<BlockId>,
        needs_logits: bool,
    ) -> Self {
        let is_prefill = token_ids.len() != 1 || num_computed_tokens == 0;
        Self {
            request_id,
            token_ids,
            num_computed_tokens,
            block_table,
            group_tables: Vec::new(),
            needs_logits,
            is_prefill,
            num_cached_tokens: 0,
        }
    }

    /// The same entry with the tables of KV cache groups 1.. (each as long as
    /// `block_table`).
    pub fn with_group_tables(mut self, group_tables: Vec<Vec<BlockId>>) -> Self {
        self.group_tables = group_tables;
        self
    }

    pub fn query_len(&self) -> usize {
        self.token_ids.len()
    }

    pub fn context_len(&self) -> usize {
        self.num_computed_tokens
    }

    /// Tokens in the cache after this step.
    pub fn seq_len(&self) -> usize {
        self.num_computed_tokens + self.token_ids.len()
    }

    /// Positions of `token_ids`.
    pub fn positions(&self) -> Range<usize> {
        self.num_computed_tokens..self.seq_len()
    }
}

/// The plan of one step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchedulerOutput {
    /// Decodes first, then prompt chunks of running requests, then newly
    /// admitted ones.
    pub scheduled: Vec<ScheduledSequence>,
    /// To run before the forward pass, in order.
    pub block_copies: Vec<BlockCopy>,
    /// Requests sent back to the waiting queue this step (their K/V is gone
    /// or in the prefix cache; they will be recomputed).
    pub preempted: Vec<RequestId>,
    pub num_prefills: usize,
    pub num_prefill_tokens: usize,
    pub num_decode_tokens: usize,
}

impl SchedulerOutput {
    pub fn num_scheduled_tokens(&self) -> usize {
        self.num_prefill_tokens + self.num_decode_tokens
    }

    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty()
    }

    pub(crate) fn push(&mut self, s: ScheduledSequence) {
        if s.is_prefill {
            self.num_prefills += 1;
            self.num_prefill_tokens += s.query_len();
        } else {
            self.num_decode_tokens += s.query_len();
        }
        self.scheduled.push(s);
    }
}

/// A sampled token accepted for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestUpdate {
    pub request_id: RequestId,
    pub token_id: u32,
    /// Set when this token ended the request; its blocks are already released.
    pub finish_reason: Option<FinishReason>,
    pub num_output_tokens: usize,
    pub num_cached_tokens: usize,
}
