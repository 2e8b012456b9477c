//! OpenAI (and vLLM) JSON shapes: requests as clients send them, responses
//! and stream chunks as clients expect them. Plain serde types, no logic
//! beyond defaults; turning a request into engine parameters lives in
//! [`crate::routes::params`].
//!
//! Unknown fields are not rejected by these types: which fields a generation
//! request may carry is decided on the raw body by
//! [`crate::routes::fields`] (honoured, harmlessly ignored, or refused).

pub mod chat;
pub mod common;
pub mod completions;
pub mod misc;
pub mod prompt_logprobs;
pub mod structured;

pub use chat::*;
pub use common::*;
pub use completions::*;
pub use misc::*;
pub use prompt_logprobs::{PromptLogprobs, PromptTokenLogprob};
pub use structured::StructuredFields;
