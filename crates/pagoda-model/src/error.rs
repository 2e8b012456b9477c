//! The one error type of the model crate: every message names its cause.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Gguf(#[from] pagoda_gguf::GgufError),
    #[error("invalid model config: {0}")]
    Config(String),
    #[error("unknown architecture {0:?} (supported: llama, mistral, qwen2, qwen3, opt)")]
    UnknownArchitecture(String),
    #[error("missing tensor {0:?}")]
    MissingTensor(String),
    #[error("tensor {name:?} has shape {got:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("safetensors: {0}")]
    Safetensors(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error(transparent)]
    Kernel(#[from] pagoda_kernels::KernelError),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
