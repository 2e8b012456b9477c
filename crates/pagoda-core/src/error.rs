//! The one error type of pagoda-core.
//!
//! Every refusal the core can make is a value of [`CoreError`]: a request that
//! can never be served is refused at admission, an unknown id is reported, and
//! a ref-count misuse is reported instead of corrupting the pool. Running out of
//! free KV blocks is *not* an error: it is an ordinary outcome (`None`) that the
//! scheduler answers with eviction or preemption.
//!
//! The messages of admission refusals (empty prompt, too long, too large for
//! the cache) name no request id: they reach API clients, to whom the
//! engine's ids mean nothing (the variants still carry the id).

use crate::block_pool::BlockId;
use crate::sampling::SamplingParamsError;
use crate::sequence::RequestId;

/// Errors of the plain-data core.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CoreError {
    #[error(transparent)]
    InvalidSampling(#[from] SamplingParamsError),
    #[error("invalid scheduler config: {0}")]
    InvalidConfig(String),
    #[error("the prompt is empty")]
    EmptyPrompt(RequestId),
    #[error("the prompt of {prompt_len} tokens exceeds max_model_len ({max_model_len})")]
    PromptTooLong {
        id: RequestId,
        prompt_len: usize,
        max_model_len: usize,
    },
    #[error(
        "the request needs up to {needed} KV blocks but the whole cache has {num_blocks}; \
         lower max_tokens or the prompt length"
    )]
    ExceedsKvCache {
        id: RequestId,
        needed: usize,
        num_blocks: usize,
    },
    #[error("request {0} already exists")]
    DuplicateRequest(RequestId),
    #[error("unknown request {0}")]
    UnknownRequest(RequestId),
    #[error("KV block {0} is not allocated (ref count would underflow)")]
    BlockNotAllocated(BlockId),
    #[error("radix node {0} is not live or not on the expected path")]
    StaleRadixNode(u32),
    #[error("radix node {0} is not locked (lock_ref would underflow)")]
    RadixNodeNotLocked(u32),
}

pub type Result<T, E = CoreError> = std::result::Result<T, E>;
