//! Models pagoda can run, and everything needed to get them off disk.
//!
//! - [`config`]: the architecture-neutral [`ModelConfig`] every loader produces.
//! - [`loader`]: weight sources (GGUF, safetensors directories, dummy weights)
//!   behind one [`loader::WeightSource`] trait, keyed by Hugging Face tensor names.
//! - [`arch`]: one file per architecture, written against
//!   [`pagoda_kernels::Backend`]; models never own KV state.
//! - [`tokenizer`]: tokenizer, chat template, incremental detokenizer.

pub mod arch;
pub mod config;
pub mod error;
pub mod kv_layout;
pub mod loader;
pub mod open;
pub mod tokenizer;

pub use config::{Architecture, GemmaConfig, ModelConfig, MoeConfig, RopeScaling};
pub use error::{ModelError, Result};
pub use kv_layout::KvLayout;
