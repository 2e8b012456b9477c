//! GGUF reader: header, metadata, tensor infos, alignment, mmap, dequantization.
//!
//! Placeholder until the implementation lands.

/// Errors reading a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{0}")]
    Invalid(String),
}
