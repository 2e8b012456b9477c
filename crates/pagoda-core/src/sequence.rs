//! A request as the engine submits it, and its per-sequence state.
//!
//! [`Sequence`] is deliberately small: token ids (prompt then output), how many
//! of them have K/V in the cache (`num_computed_tokens`), the block table, and
//! where its prefix sits in the radix tree. Everything else is derived.
//!
//! Invariants: `num_computed_tokens <= token_ids.len()`; the block table covers
//! at least `num_computed_tokens` tokens (its released leading entries are
//! `BlockId::NULL`); a waiting sequence holds no blocks and
//! no radix lock, and so does a paused one. Stop checks are O(stop ids + eos ids) per token.

use std::fmt;

use crate::block_pool::BlockId;
use crate::radix_cache::NodeId;
use crate::sampling::SamplingParams;

/// Engine-assigned id of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What the engine submits.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub id: RequestId,
    pub prompt_token_ids: Vec<u32>,
    pub sampling: SamplingParams,
    /// The model's end-of-sequence ids (ignored when `sampling.ignore_eos`).
    pub eos_token_ids: Vec<u32>,
}

/// Why a request ended (OpenAI's `finish_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// `max_tokens` or `max_model_len` reached.
    Length,
    /// Aborted by the client or the engine.
    Abort,
}

impl FinishReason {
    /// The OpenAI spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceStatus {
    Waiting,
    Running,
    /// Held back by its client (see `Scheduler::pause`): never scheduled,
    /// holds no blocks, in neither queue.
    Paused,
}

/// The sequence's prefix held in the radix tree: `node` (locked by this
/// sequence) ends at `num_tokens`, and those tokens are this sequence's first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RadixHold {
    pub node: NodeId,
    pub num_tokens: usize,
}

/// Where a sequence that gave up its radix lock (a sliding window released
/// its first blocks) goes on caching: `node`, unlocked, ends at its first
/// `num_tokens` tokens, valid while the tree's `removals()` is `removals`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RadixCursor {
    pub node: NodeId,
    pub num_tokens: usize,
    pub removals: u64,
}

/// A sequence's block table in one KV cache group after the first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupTable {
    /// Indexed by block position; the first `num_released` entries are
    /// [`BlockId::NULL`] (the group's window has passed them).
    pub blocks: Vec<BlockId>,
    pub num_released: usize,
}

/// One request's state inside the scheduler.
#[derive(Debug, Clone)]
pub struct Sequence {
    pub request_id: RequestId,
    /// Prompt followed by generated tokens.
    pub token_ids: Vec<u32>,
    pub num_prompt_tokens: usize,
    /// Tokens whose K/V is in the cache (vLLM's `num_computed_tokens`).
    pub num_computed_tokens: usize,
    /// Tokens taken from the prefix cache at the latest admission.
    pub num_cached_tokens: usize,
    /// Indexed by block position; its first `num_released_blocks` entries
    /// are [`BlockId::NULL`] (released out of a sliding window).
    pub block_table: Vec<BlockId>,
    /// Leading block-table entries released because the sliding window has
    /// passed them (0 without a window).
    pub num_released_blocks: usize,
    /// The block tables of KV cache groups 1.. (empty with one group; see
    /// [`crate::kv_cache_manager`]), each as long as `block_table`.
    pub group_tables: Vec<GroupTable>,
    pub status: SequenceStatus,
    pub sampling: SamplingParams,
    pub eos_token_ids: Vec<u32>,
    /// Set while running with prefix caching on, until the sliding window
    /// first releases a block.
    pub radix_hold: Option<RadixHold>,
    /// Set in place of `radix_hold` once a sliding window released blocks.
    pub radix_cursor: Option<RadixCursor>,
    /// Order of arrival at the scheduler (set by it): a resumed request takes
    /// its place in the waiting queue by it.
    pub arrival: u64,
}

impl Sequence {
    pub fn new(request: Request) -> Self {
        Sequence {
            request_id: request.id,
            num_prompt_tokens: request.prompt_token_ids.len(),
            token_ids: request.prompt_token_ids,
            num_computed_tokens: 0,
            num_cached_tokens: 0,
            block_table: Vec::new(),
            num_released_blocks: 0,
            group_tables: Vec::new(),
            status: SequenceStatus::Waiting,
            sampling: request.sampling,
            eos_token_ids: request.eos_token_ids,
            radix_hold: None,
            radix_cursor: None,
            arrival: 0,
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    pub fn num_output_tokens(&self) -> usize {
        self.token_ids.len() - self.num_prompt_tokens
    }

    pub fn output_token_ids(&self) -> &[u32] {
        &self.token_ids[self.num_prompt_tokens..]
    }

    /// Tokens still to compute before the next token can be sampled.
    pub fn num_uncomputed_tokens(&self) -> usize {
        self.token_ids.len() - self.num_computed_tokens
    }

    /// Whether the next chunk needs the logits of its every position:
    /// the request asks for prompt logprobs and its prompt (but for its
    /// last token, whose logits only sample) is not computed yet.
    pub fn wants_prompt_rows(&self) -> bool {
        self.sampling.prompt_logprobs.is_some()
            && self.num_computed_tokens + 1 < self.num_prompt_tokens
    }

    /// The most tokens (prompt + output) this request can reach.
    pub fn max_num_tokens(&self, max_model_len: usize) -> usize {
        let cap = max_model_len.max(self.num_prompt_tokens + 1);
        (self.num_prompt_tokens + self.sampling.max_tokens).min(cap)
    }

    /// Whether the latest token ends the request, and why. Stop ids win over
    /// length when both apply.
    pub fn stop_reason(&self, max_model_len: usize) -> Option<FinishReason> {
        let last = *self.output_token_ids().last()?;
        let is_eos = !self.sampling.ignore_eos && self.eos_token_ids.contains(&last);
        // Before `min_tokens`, stop ids do not end the request (vLLM's rule;
        // the sampler bans them then, so this holds even if all were banned).
        let early = self.num_output_tokens() < self.sampling.min_tokens;
        if !early && (is_eos || self.sampling.stop_token_ids.contains(&last)) {
            return Some(FinishReason::Stop);
        }
        if self.num_output_tokens() >= self.sampling.max_tokens
            || self.num_tokens() >= max_model_len
        {
            return Some(FinishReason::Length);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(prompt: &[u32], max_tokens: usize, ignore_eos: bool) -> Sequence {
        Sequence::new(Request {
            id: RequestId(1),
            prompt_token_ids: prompt.to_vec(),
            sampling: SamplingParams {
                max_tokens,
                ignore_eos,
                stop_token_ids: vec![7],
                ..SamplingParams::greedy(max_tokens)
            },
            eos_token_ids: vec![2],
        })
    }

    #[test]
    fn stop_conditions() {
        let mut s = seq(&[5, 6], 3, false);
        assert_eq!(s.stop_reason(100), None);
        s.token_ids.push(9);
        assert_eq!(s.stop_reason(100), None);
        s.token_ids.push(2);
        assert_eq!(s.stop_reason(100), Some(FinishReason::Stop));
        let mut s = seq(&[5, 6], 3, true);
        s.token_ids.extend([2, 2]);
        assert_eq!(s.stop_reason(100), None, "EOS ignored");
        s.token_ids.push(2);
        assert_eq!(s.stop_reason(100), Some(FinishReason::Length));
        let mut s = seq(&[5, 6], 3, true);
        s.token_ids.push(7);
        assert_eq!(
            s.stop_reason(100),
            Some(FinishReason::Stop),
            "stop ids apply with ignore_eos"
        );
        let mut s = seq(&[5, 6], 10, false);
        s.token_ids.push(9);
        assert_eq!(
            s.stop_reason(3),
            Some(FinishReason::Length),
            "max_model_len"
        );
    }

    #[test]
    fn stop_ids_wait_for_min_tokens() {
        let mut s = seq(&[5, 6], 5, false);
        s.sampling.min_tokens = 2;
        s.token_ids.push(2);
        assert_eq!(s.stop_reason(100), None, "EOS before min_tokens");
        s.token_ids.push(7);
        assert_eq!(s.stop_reason(100), Some(FinishReason::Stop));
    }

    #[test]
    fn max_num_tokens_respects_both_limits() {
        assert_eq!(seq(&[1; 10], 5, false).max_num_tokens(100), 15);
        assert_eq!(seq(&[1; 10], 50, false).max_num_tokens(20), 20);
        assert_eq!(
            seq(&[1; 20], 50, false).max_num_tokens(20),
            21,
            "one token past a full prompt"
        );
    }
}
