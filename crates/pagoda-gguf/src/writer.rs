//! A small GGUF (version 3) writer for tests and tools.
//!
//! Builds a whole file in memory: metadata of any type, and tensors stored as
//! F32, F16, Q8_0 (quantized here the way ggml's reference quantizer does) or
//! as raw pre-built blocks of any type. Shapes are given outermost first, as
//! everywhere in pagoda, and written reversed into GGUF's `ne`. Tensor data is
//! aligned to `general.alignment` (32 unless that key is set).

use crate::error::{GgufError, Result};
use crate::metadata::{MetadataArray, MetadataValue};
use crate::parse::{DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::types::GgmlType;
use half::f16;
use std::path::Path;

struct PendingTensor {
    name: String,
    ne: Vec<u64>,
    ggml_type: GgmlType,
    data: Vec<u8>,
}

/// Collects metadata and tensors, then serializes them as one GGUF file.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<PendingTensor>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a metadata pair (later pairs with the same key are written too;
    /// the reader rejects such files, which tests may want).
    pub fn add_metadata(&mut self, key: &str, value: MetadataValue) -> &mut Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds an F32 tensor of `shape` (outermost first).
    pub fn add_f32(&mut self, name: &str, shape: &[usize], data: &[f32]) -> Result<&mut Self> {
        let bytes = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.add_raw(name, shape, GgmlType::F32, bytes)
    }

    /// Adds an F16 tensor, rounding `data` to f16.
    pub fn add_f16(&mut self, name: &str, shape: &[usize], data: &[f32]) -> Result<&mut Self> {
        let bytes = data
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect();
        self.add_raw(name, shape, GgmlType::F16, bytes)
    }

    /// Adds a Q8_0 tensor, quantizing `data` per block of 32 as ggml does:
    /// `d = max|x| / 127` (stored as f16), `q = round(x / d)`.
    pub fn add_q8_0(&mut self, name: &str, shape: &[usize], data: &[f32]) -> Result<&mut Self> {
        if !data.len().is_multiple_of(32) {
            return Err(GgufError::Writer(format!(
                "{name}: Q8_0 needs a multiple of 32 elements, got {}",
                data.len()
            )));
        }
        let mut bytes = Vec::with_capacity(data.len() / 32 * 34);
        for block in data.chunks_exact(32) {
            let amax = block.iter().fold(0f32, |m, x| m.max(x.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            bytes.extend_from_slice(&f16::from_f32(d).to_le_bytes());
            bytes.extend(block.iter().map(|&x| (x * id).round() as i8 as u8));
        }
        self.add_raw(name, shape, GgmlType::Q8_0, bytes)
    }

    /// Adds a tensor from already-encoded blocks of `ggml_type`.
    pub fn add_raw(
        &mut self,
        name: &str,
        shape: &[usize],
        ggml_type: GgmlType,
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        let n: usize = shape.iter().product();
        let bs = ggml_type.block_size();
        let inner = shape.last().copied().unwrap_or(1);
        if inner % bs != 0 || data.len() != n / bs * ggml_type.type_size() {
            return Err(GgufError::Writer(format!(
                "{name}: {} bytes of {ggml_type} do not hold shape {shape:?}",
                data.len()
            )));
        }
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            ne: shape.iter().rev().map(|&d| d as u64).collect(),
            ggml_type,
            data,
        });
        Ok(self)
    }

    fn alignment(&self) -> u64 {
        let a = self
            .metadata
            .iter()
            .find_map(|(k, v)| match (k.as_str(), v) {
                ("general.alignment", MetadataValue::U32(a)) => Some(u64::from(*a)),
                ("general.alignment", MetadataValue::U64(a)) => Some(*a),
                _ => None,
            });
        a.filter(|a| a.is_power_of_two())
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// The whole file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.alignment() as usize;
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&v.type_id().to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0usize;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.id().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len()).div_ceil(align) * align;
        }
        let data_start = out.len().div_ceil(align) * align;
        out.resize(data_start, 0);
        for (t, off) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + off, 0);
            out.extend_from_slice(&t.data);
        }
        out.resize(data_start + offset, 0);
        out
    }

    /// Writes the file to `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_bytes()).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &MetadataValue) {
    match v {
        MetadataValue::U8(x) => out.push(*x),
        MetadataValue::I8(x) => out.push(*x as u8),
        MetadataValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::Bool(x) => out.push(u8::from(*x)),
        MetadataValue::String(s) => put_str(out, s),
        MetadataValue::Array(a) => put_array(out, a),
    }
}

fn put_array(out: &mut Vec<u8>, a: &MetadataArray) {
    out.extend_from_slice(&a.elem_type_id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        MetadataArray::U8(v) => out.extend_from_slice(v),
        MetadataArray::I8(v) => each!(v),
        MetadataArray::U16(v) => each!(v),
        MetadataArray::I16(v) => each!(v),
        MetadataArray::U32(v) => each!(v),
        MetadataArray::I32(v) => each!(v),
        MetadataArray::U64(v) => each!(v),
        MetadataArray::I64(v) => each!(v),
        MetadataArray::F32(v) => each!(v),
        MetadataArray::F64(v) => each!(v),
        MetadataArray::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        MetadataArray::String(v) => v.iter().for_each(|s| put_str(out, s)),
        MetadataArray::Array(v) => v.iter().for_each(|x| put_array(out, x)),
    }
}
