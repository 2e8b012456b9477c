//! Parsing the GGUF header, metadata and tensor infos from a byte slice.
//!
//! Invariants: every read is bounds-checked against the slice; every count
//! read from the file is checked against the bytes left before anything is
//! allocated for it (each element takes at least `min_size` bytes in the
//! file), so a corrupt count gives [`GgufError::CountTooLarge`] instead of a
//! huge allocation, and parsed structures stay within a small constant factor
//! of the file size. Cost: one pass over the header; tensor data is not read.

use crate::error::{GgufError, Result};
use crate::metadata::{value_type as vt, Metadata, MetadataArray, MetadataValue};
use crate::types::GgmlType;

/// The GGUF magic, "GGUF" as bytes.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a ggml tensor has.
pub const MAX_DIMS: u32 = 4;
/// Deepest array nesting accepted (guards the recursion).
const MAX_ARRAY_DEPTH: usize = 8;

/// A tensor as described by its tensor info, validated against the file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub ggml_type: GgmlType,
    /// GGUF's dimensions, innermost (contiguous) first: a matrix is `[in, out]`.
    pub ne: Vec<u64>,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Absolute byte range of the data within the file.
    pub(crate) start: usize,
    pub(crate) n_bytes: usize,
    pub(crate) n_elements: usize,
}

impl TensorInfo {
    /// The shape outermost first (the reverse of `ne`): a GGUF matrix with
    /// `ne = [in, out]` has shape `[out, in]`, as Hugging Face stores it.
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }

    pub fn n_elements(&self) -> usize {
        self.n_elements
    }

    /// Bytes of data in the file.
    pub fn n_bytes(&self) -> usize {
        self.n_bytes
    }
}

/// Everything the header describes.
#[derive(Debug)]
pub(crate) struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: usize,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                needed: n as u64,
                file_len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A count of elements each at least `min_size` bytes long, checked
    /// against the bytes left in the file.
    fn count(&mut self, min_size: usize, what: &dyn Fn() -> String) -> Result<usize> {
        let n = self.u64(what)?;
        let remaining = self.remaining() as u64;
        if n.checked_mul(min_size as u64).is_none_or(|b| b > remaining) {
            return Err(GgufError::CountTooLarge {
                what: what(),
                count: n,
                remaining,
            });
        }
        Ok(n as usize)
    }

    fn bytes_string(&mut self, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let n = self.count(1, what)?;
        self.take(n, what)
    }

    /// A string that must be UTF-8 (keys, tensor names).
    fn strict_string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let b = self.bytes_string(what)?;
        String::from_utf8(b.to_vec()).map_err(|_| GgufError::InvalidUtf8 { what: what() })
    }

    /// A string value; invalid UTF-8 is replaced rather than rejected, so one
    /// odd vocabulary entry does not make a whole model unreadable.
    fn value_string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let b = self.bytes_string(what)?;
        Ok(String::from_utf8_lossy(b).into_owned())
    }
}

/// Fewest bytes one value of type `t` takes in the file.
fn min_value_size(t: u32) -> usize {
    match t {
        vt::U8 | vt::I8 | vt::BOOL => 1,
        vt::U16 | vt::I16 => 2,
        vt::U32 | vt::I32 | vt::F32 => 4,
        vt::U64 | vt::I64 | vt::F64 | vt::STRING => 8,
        vt::ARRAY => 12,
        _ => 1,
    }
}

fn read_value(
    c: &mut Cursor,
    t: u32,
    what: &dyn Fn() -> String,
    depth: usize,
) -> Result<MetadataValue> {
    Ok(match t {
        vt::U8 => MetadataValue::U8(c.array::<1>(what)?[0]),
        vt::I8 => MetadataValue::I8(c.array::<1>(what)?[0] as i8),
        vt::U16 => MetadataValue::U16(u16::from_le_bytes(c.array(what)?)),
        vt::I16 => MetadataValue::I16(i16::from_le_bytes(c.array(what)?)),
        vt::U32 => MetadataValue::U32(c.u32(what)?),
        vt::I32 => MetadataValue::I32(i32::from_le_bytes(c.array(what)?)),
        vt::U64 => MetadataValue::U64(c.u64(what)?),
        vt::I64 => MetadataValue::I64(i64::from_le_bytes(c.array(what)?)),
        vt::F32 => MetadataValue::F32(f32::from_le_bytes(c.array(what)?)),
        vt::F64 => MetadataValue::F64(f64::from_le_bytes(c.array(what)?)),
        vt::BOOL => MetadataValue::Bool(c.array::<1>(what)?[0] != 0),
        vt::STRING => MetadataValue::String(c.value_string(what)?),
        vt::ARRAY => MetadataValue::Array(read_array(c, what, depth)?),
        type_id => {
            return Err(GgufError::UnknownValueType {
                what: what(),
                type_id,
            })
        }
    })
}

fn read_array(c: &mut Cursor, what: &dyn Fn() -> String, depth: usize) -> Result<MetadataArray> {
    if depth >= MAX_ARRAY_DEPTH {
        return Err(GgufError::CountTooLarge {
            what: format!("{} (array nesting depth)", what()),
            count: depth as u64 + 1,
            remaining: MAX_ARRAY_DEPTH as u64,
        });
    }
    let t = c.u32(what)?;
    if t > vt::F64 {
        return Err(GgufError::UnknownValueType {
            what: what(),
            type_id: t,
        });
    }
    let n = c.count(min_value_size(t), what)?;
    macro_rules! fixed {
        ($variant:ident, $ty:ty) => {{
            let size = std::mem::size_of::<$ty>();
            let raw = c.take(n * size, what)?;
            MetadataArray::$variant(
                raw.chunks_exact(size)
                    .map(|b| {
                        let mut a = [0u8; std::mem::size_of::<$ty>()];
                        a.copy_from_slice(b);
                        <$ty>::from_le_bytes(a)
                    })
                    .collect(),
            )
        }};
    }
    Ok(match t {
        vt::U8 => MetadataArray::U8(c.take(n, what)?.to_vec()),
        vt::I8 => MetadataArray::I8(c.take(n, what)?.iter().map(|&b| b as i8).collect()),
        vt::BOOL => MetadataArray::Bool(c.take(n, what)?.iter().map(|&b| b != 0).collect()),
        vt::U16 => fixed!(U16, u16),
        vt::I16 => fixed!(I16, i16),
        vt::U32 => fixed!(U32, u32),
        vt::I32 => fixed!(I32, i32),
        vt::U64 => fixed!(U64, u64),
        vt::I64 => fixed!(I64, i64),
        vt::F32 => fixed!(F32, f32),
        vt::F64 => fixed!(F64, f64),
        vt::STRING => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(c.value_string(what)?);
            }
            MetadataArray::String(v)
        }
        _ => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_array(c, what, depth + 1)?);
            }
            MetadataArray::Array(v)
        }
    })
}

/// Parses and validates everything before the tensor data of `buf`.
pub(crate) fn parse_header(buf: &[u8]) -> Result<Header> {
    let mut c = Cursor { buf, pos: 0 };
    let magic: [u8; 4] = c.array(&|| "the magic".into())?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = c.u32(&|| "the version".into())?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let tensor_count = c.u64(&|| "the tensor count".into())?;
    // Smallest tensor info: name length, n_dims, type, offset.
    let kv_count = c.count(8 + 4 + 1, &|| "the metadata key/value count".into())?;

    let mut metadata = Metadata::default();
    for i in 0..kv_count {
        let key = c.strict_string(&|| format!("metadata key #{i}"))?;
        let what = || format!("metadata key {key:?}");
        let t = c.u32(&what)?;
        let value = read_value(&mut c, t, &what, 0)?;
        metadata.insert(key, value)?;
    }
    let remaining = c.remaining() as u64;
    if tensor_count
        .checked_mul(8 + 4 + 4 + 8)
        .is_none_or(|b| b > remaining)
    {
        return Err(GgufError::CountTooLarge {
            what: "the tensor count".into(),
            count: tensor_count,
            remaining,
        });
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(_) => metadata.get_u64("general.alignment")?,
    };
    if alignment == 0 || !alignment.is_power_of_two() {
        return Err(GgufError::BadAlignment(alignment));
    }

    let mut tensors = Vec::with_capacity(tensor_count as usize);
    for i in 0..tensor_count {
        let name = c.strict_string(&|| format!("tensor info #{i}"))?;
        let what = || format!("tensor info {name:?}");
        let n_dims = c.u32(&what)?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                tensor: name,
                n_dims,
            });
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            ne.push(c.u64(&what)?);
        }
        let type_id = c.u32(&what)?;
        let offset = c.u64(&what)?;
        let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownGgmlType {
            tensor: name.clone(),
            type_id,
        })?;
        tensors.push(TensorInfo {
            name,
            ggml_type,
            ne,
            offset,
            start: 0,
            n_bytes: 0,
            n_elements: 0,
        });
    }

    let header_end = c.pos as u64;
    let data_offset = header_end.div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    let mut names = std::collections::HashSet::with_capacity(tensors.len());
    for t in &mut tensors {
        if !names.insert(t.name.clone()) {
            return Err(GgufError::Duplicate {
                what: "tensor",
                name: t.name.clone(),
            });
        }
        locate(t, data_offset, alignment, file_len)?;
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset: data_offset.min(file_len) as usize,
    })
}

/// Checks a tensor's shape, alignment and bounds, and fills in its byte range.
fn locate(t: &mut TensorInfo, data_offset: u64, alignment: u64, file_len: u64) -> Result<()> {
    let overflow = || GgufError::ShapeOverflow {
        tensor: t.name.clone(),
        ne: t.ne.clone(),
    };
    let mut n: u64 = 1;
    for &d in &t.ne {
        n = n
            .checked_mul(d)
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(overflow)?;
    }
    let block = t.ggml_type.block_size() as u64;
    let ne0 = t.ne.first().copied().unwrap_or(1);
    if ne0 % block != 0 {
        return Err(GgufError::BlockMisfit {
            tensor: t.name.clone(),
            ne0,
            type_name: t.ggml_type.name(),
            block_size: block as usize,
        });
    }
    let n_bytes = (n / block)
        .checked_mul(t.ggml_type.type_size() as u64)
        .ok_or_else(overflow)?;
    if !t.offset.is_multiple_of(alignment) {
        return Err(GgufError::Misaligned {
            tensor: t.name.clone(),
            offset: t.offset,
            alignment,
        });
    }
    let start = data_offset.checked_add(t.offset);
    let end = start.and_then(|s| s.checked_add(n_bytes));
    match (start, end) {
        (Some(start), Some(end)) if end <= file_len => {
            t.start = start as usize;
            t.n_bytes = n_bytes as usize;
            t.n_elements = usize::try_from(n).map_err(|_| overflow())?;
            Ok(())
        }
        _ => Err(GgufError::OutOfBounds {
            tensor: t.name.clone(),
            start: start.unwrap_or(u64::MAX),
            end: end.unwrap_or(u64::MAX),
            file_len,
        }),
    }
}
