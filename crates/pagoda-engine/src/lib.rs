//! The engine: turns requests into tokens on a model.
//!
//! - [`context`]: a step's [`pagoda_kernels::ForwardContext`] from the scheduled sequences.
//! - [`runner`]: backend + model + paged KV cache; one step in, logits out.
//! - [`sampler`]: penalties, temperature, top-k/top-p/min-p, per-request seeds.
//! - [`logit_rules`]: logit bias, allowed tokens, bad words, min_tokens bans.
//! - [`step_log`]: per-step stage times (`PAGODA_STEP_LOG`), for tuning step shapes.
//! - [`stop`]: stop strings matched across token boundaries.
//! - [`prompt_logprobs`]: the logprob of each prompt token given its prefix.
//! - [`structured`]: structured outputs (JSON schema, regex, choice, Lark)
//!   compiled by llguidance; per-step token masks.
//! - [`engine`]: scheduler + runner + per-request output state, one step at a time.
//! - [`generate`]: the offline batch call behind `pagoda generate`.
//! - [`handle`]: the engine on its own thread, driven through an async handle.

pub mod context;
pub mod engine;
pub mod generate;
pub mod handle;
pub mod kv_footprint;
pub mod logit_rules;
pub mod output_text;
pub mod prompt_logprobs;
pub mod runner;
pub mod sampler;
mod step_log;
pub mod stop;
pub mod structured;
pub mod token_history;

pub use engine::{EngineRequest, LlmEngine, RequestOutput};
pub use generate::{GenerateOutput, GenerateRequest};
pub use handle::{
    EngineHandle, EngineStats, HandleOptions, RequestStream, ShutdownMode, StreamItem,
    DEFAULT_PAUSE_BACKLOG,
};
pub use output_text::OutputText;
pub use pagoda_core::{FinishReason, RequestId, SchedulerConfig};
pub use runner::{ModelRunner, StepOutput};

/// The one error type of the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] pagoda_model::ModelError),
    #[error(transparent)]
    Kernel(#[from] pagoda_kernels::KernelError),
    #[error(transparent)]
    Core(#[from] pagoda_core::CoreError),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("KV cache too small: {0}")]
    CacheTooSmall(String),
    #[error("internal error: {0}")]
    Internal(String),
    #[error("overloaded: {num_waiting} requests waiting (limit {max_waiting})")]
    Overloaded {
        num_waiting: usize,
        max_waiting: usize,
    },
    #[error("the engine is shutting down or has stopped")]
    Shutdown,
    #[error("engine step failed: {0}")]
    StepFailed(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
