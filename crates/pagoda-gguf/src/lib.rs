//! pagoda's GGUF reader: header, metadata, tensor infos, alignment, mmap,
//! dequantization, and a small writer for tests.
//!
//! - [`GgufFile`] memory-maps a file and validates all of its header up
//!   front: every tensor it lists lies inside the file, aligned, with a shape
//!   that fits its type's blocks. A corrupt or truncated file gives one
//!   [`GgufError`] naming the broken part, never a panic or an allocation
//!   beyond a small multiple of the file size.
//! - [`Metadata`] holds the typed key/value section with accessors that
//!   coerce integer widths and name the key in their errors.
//! - [`dequant`] turns F32/F16/BF16, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 and the
//!   Q2_K..Q6_K k-quants into f32, in parallel over blocks;
//!   [`GgufFile::tensor_values`] keeps F16/BF16 unconverted.
//! - [`writer::GgufWriter`] builds small files (F32, F16, Q8_0, raw blocks).
//!
//! Shapes are outermost first everywhere in this API ([`TensorInfo::shape`]),
//! the reverse of GGUF's `ne`: a matrix with `ne = [in, out]` has shape
//! `[out, in]`, the Hugging Face layout of the same bytes.

pub mod dequant;
mod error;
mod file;
mod metadata;
mod parse;
mod types;
pub mod writer;

pub use error::{GgufError, Result};
pub use file::{GgufFile, TensorValues};
pub use metadata::{Metadata, MetadataArray, MetadataValue};
pub use parse::{TensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
pub use types::GgmlType;
pub use writer::GgufWriter;
