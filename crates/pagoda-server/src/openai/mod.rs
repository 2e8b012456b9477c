//! OpenAI (and vLLM) JSON shapes: requests as clients send them, responses
//! and stream chunks as clients expect them. Plain serde types, no logic
//! beyond defaults; turning a request into engine parameters lives in
//! [`crate::routes::params`].
//!
//! Invariant: unknown request fields are ignored (no `deny_unknown_fields`),
//! so clients sending newer or other servers' options still work.

pub mod chat;
pub mod common;
pub mod completions;
pub mod misc;

pub use chat::*;
pub use common::*;
pub use completions::*;
pub use misc::*;
