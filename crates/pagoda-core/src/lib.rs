//! pagoda's plain-data core.
//!
//! Owns what a request asks for ([`SamplingParams`]), the KV block pool, the
//! radix prefix cache and the scheduler that turns requests into per-step
//! batch plans. Nothing here touches tensors, devices, threads or I/O, so
//! every piece is tested with plain values.

pub mod block_pool;
pub mod error;
pub mod radix_cache;
pub mod sampling;
pub mod sequence;

pub use block_pool::{BlockId, BlockPool};
pub use error::CoreError;
pub use radix_cache::{NodeId, PrefixMatch, RadixCache};
pub use sampling::{SamplingParams, SamplingParamsError};
pub use sequence::{FinishReason, Request, RequestId, Sequence};
