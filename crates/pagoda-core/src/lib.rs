//! pagoda's plain-data core.
//!
//! Owns what a request asks for ([`SamplingParams`]), the KV block pool, the
//! radix prefix cache and the scheduler that turns requests into per-step
//! batch plans. Nothing here touches tensors, devices, threads or I/O, so
//! every piece is tested with plain values.
//!
//! Map: [`block_pool`] (ref-counted KV pages) <- [`radix_cache`] (shared
//! prefixes) <- [`kv_cache_manager`] (a sequence's blocks) <- [`scheduler`]
//! (policy) -> [`output`] (the step plan the model runner executes).

pub mod block_pool;
mod check;
pub mod config;
pub mod error;
pub mod kv_cache_manager;
pub mod output;
pub mod radix_cache;
pub mod sampling;
pub mod scheduler;
pub mod sequence;
pub mod stats;

pub use block_pool::{BlockId, BlockPool};
pub use config::SchedulerConfig;
pub use error::CoreError;
pub use output::{BlockCopy, RequestUpdate, ScheduledSequence, SchedulerOutput};
pub use radix_cache::{NodeId, PrefixMatch, RadixCache};
pub use sampling::{SamplingParams, SamplingParamsError, StructuredOutput};
pub use scheduler::Scheduler;
pub use sequence::{FinishReason, Request, RequestId, Sequence};
pub use stats::{SchedulerStats, StatCounters};
