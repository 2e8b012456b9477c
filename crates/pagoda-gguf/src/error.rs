//! The one error type of the GGUF reader and writer.
//!
//! Every variant names what was being read (a metadata key, a tensor) so a
//! user holding a broken or unsupported file learns which part is wrong.

use std::path::PathBuf;

/// Errors opening, parsing, querying, dequantizing or writing a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file: magic is {found:?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    #[error("truncated GGUF file: {what} needs {needed} bytes at offset {offset}, but the file has {file_len}")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },
    #[error("truncated or corrupt GGUF file: {what}: count {count} cannot fit in the {remaining} bytes left in the file")]
    CountTooLarge {
        what: String,
        count: u64,
        remaining: u64,
    },
    #[error("{what}: unknown metadata value type {type_id}")]
    UnknownValueType { what: String, type_id: u32 },
    #[error("tensor {tensor:?}: unknown ggml type {type_id}")]
    UnknownGgmlType { tensor: String, type_id: u32 },
    #[error("tensor {tensor:?}: {n_dims} dimensions, at most 4 are supported")]
    TooManyDims { tensor: String, n_dims: u32 },
    #[error("tensor {tensor:?}: element count of shape {ne:?} overflows")]
    ShapeOverflow { tensor: String, ne: Vec<u64> },
    #[error("tensor {tensor:?}: first dimension {ne0} is not a multiple of the {type_name} block size {block_size}")]
    BlockMisfit {
        tensor: String,
        ne0: u64,
        type_name: &'static str,
        block_size: usize,
    },
    #[error(
        "tensor {tensor:?}: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    Misaligned {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error(
        "truncated or corrupt GGUF file: tensor {tensor:?}: data bytes {start}..{end} lie outside the file ({file_len} bytes)"
    )]
    OutOfBounds {
        tensor: String,
        start: u64,
        end: u64,
        file_len: u64,
    },
    #[error("general.alignment must be a nonzero power of two, got {0}")]
    BadAlignment(u64),
    #[error("duplicate {what} {name:?}")]
    Duplicate { what: &'static str, name: String },
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 { what: String },
    #[error("missing metadata key {0:?}")]
    MissingKey(String),
    #[error("metadata key {key:?}: expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("metadata key {key:?}: value {value} does not fit in {target}")]
    OutOfRange {
        key: String,
        value: String,
        target: &'static str,
    },
    #[error("no tensor named {0:?} in the GGUF file")]
    MissingTensor(String),
    #[error("tensor {tensor:?}: cannot dequantize ggml type {type_name} (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)")]
    UnsupportedType {
        tensor: String,
        type_name: &'static str,
    },
    #[error("tensor {tensor:?}: stored as {found}, not {expected}")]
    WrongTensorType {
        tensor: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("GGUF writer: {0}")]
    Writer(String),
}

pub type Result<T, E = GgufError> = std::result::Result<T, E>;
