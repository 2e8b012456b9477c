//! [`GgufFile`]: an opened, validated GGUF file and its tensor data.
//!
//! The file is memory-mapped, not read: opening costs one pass over the
//! header, and a tensor's bytes are touched only when it is dequantized.
//! Invariant: every [`TensorInfo`] of an opened file lies inside the file, is
//! aligned, and its element count and byte size are consistent with its type,
//! so reading tensor data never fails on bounds.

use crate::dequant::{dequantize_into, half_from_le};
use crate::error::{GgufError, Result};
use crate::metadata::Metadata;
use crate::parse::{parse_header, TensorInfo};
use crate::types::GgmlType;
use half::{bf16, f16};
use memmap2::Mmap;
use std::collections::HashMap;
use std::path::Path;

enum Storage {
    Mmap(Mmap),
    Owned(Vec<u8>),
}

/// A tensor's elements: F16/BF16 tensors kept as stored, everything else f32.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorValues {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

/// An opened GGUF file (version 2 or 3, little-endian).
pub struct GgufFile {
    storage: Storage,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
    alignment: u64,
    data_offset: usize,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata_len", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; pagoda never writes model files while
        // serving them. Another process truncating the file underneath is the
        // usual caveat of memory-mapped reading, accepted by every GGUF reader.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::from_storage(Storage::Mmap(mmap))
    }

    /// Parses a GGUF file held in memory (tests, files built by [`crate::writer`]).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::from_storage(Storage::Owned(bytes))
    }

    fn from_storage(storage: Storage) -> Result<Self> {
        let bytes = match &storage {
            Storage::Mmap(m) => &m[..],
            Storage::Owned(v) => &v[..],
        };
        let header = parse_header(bytes)?;
        let index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            storage,
            version: header.version,
            metadata: header.metadata,
            tensors: header.tensors,
            index,
            alignment: header.alignment,
            data_offset: header.data_offset,
        })
    }

    fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Tensor data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the tensor data section.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// Total size of the file in bytes.
    pub fn file_len(&self) -> usize {
        self.bytes().len()
    }

    /// All tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    fn require(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))
    }

    /// The raw (possibly quantized) bytes of a tensor, as stored.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        // In bounds by the invariant of TensorInfo; `get` keeps a TensorInfo
        // from another file from panicking.
        self.bytes()
            .get(info.start..info.start + info.n_bytes)
            .unwrap_or(&[])
    }

    /// The tensor `name` dequantized to f32 (shape: `info.shape()`).
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>> {
        let info = self.require(name)?;
        self.dequantize_info(info)
    }

    /// Like [`GgufFile::dequantize`] for a tensor info of this file.
    pub fn dequantize_info(&self, info: &TensorInfo) -> Result<Vec<f32>> {
        if !info.ggml_type.can_dequantize() {
            return Err(GgufError::UnsupportedType {
                tensor: info.name.clone(),
                type_name: info.ggml_type.name(),
            });
        }
        let data = self.tensor_bytes(info);
        if data.len() != info.n_bytes {
            return Err(GgufError::MissingTensor(info.name.clone()));
        }
        let mut out = vec![0f32; info.n_elements];
        dequantize_into(info.ggml_type, data, &mut out).map_err(|type_name| {
            GgufError::UnsupportedType {
                tensor: info.name.clone(),
                type_name,
            }
        })?;
        Ok(out)
    }

    /// The tensor `name`, keeping F16 and BF16 data in half precision and
    /// dequantizing every other type to f32.
    pub fn tensor_values(&self, name: &str) -> Result<TensorValues> {
        let info = self.require(name)?;
        Ok(match info.ggml_type {
            GgmlType::F16 => TensorValues::F16(self.f16_values(info)?),
            GgmlType::BF16 => TensorValues::BF16(self.bf16_values(info)?),
            _ => TensorValues::F32(self.dequantize_info(info)?),
        })
    }

    /// The raw f16 values of an F16 tensor.
    pub fn f16_values(&self, info: &TensorInfo) -> Result<Vec<f16>> {
        self.expect_type(info, GgmlType::F16)?;
        Ok(half_from_le(self.tensor_bytes(info), f16::from_bits))
    }

    /// The raw bf16 values of a BF16 tensor.
    pub fn bf16_values(&self, info: &TensorInfo) -> Result<Vec<bf16>> {
        self.expect_type(info, GgmlType::BF16)?;
        Ok(half_from_le(self.tensor_bytes(info), bf16::from_bits))
    }

    fn expect_type(&self, info: &TensorInfo, t: GgmlType) -> Result<()> {
        if info.ggml_type != t {
            return Err(GgufError::WrongTensorType {
                tensor: info.name.clone(),
                expected: t.name(),
                found: info.ggml_type.name(),
            });
        }
        Ok(())
    }
}
