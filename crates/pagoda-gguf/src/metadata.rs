//! GGUF metadata: the typed key/value section, and typed accessors on it.
//!
//! Arrays keep their element type (`Vec<u8>` for a byte array), so a parsed
//! array takes memory proportional to its bytes in the file. Accessors coerce
//! between integer widths when the value fits (a `u32` key stored as `i32` or
//! `u64` still reads) and otherwise fail with an error naming the key.

use crate::error::{GgufError, Result};
use std::collections::HashMap;

/// GGUF metadata value type ids (`enum gguf_type`).
pub(crate) mod value_type {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(MetadataArray),
}

/// A homogeneous metadata array (arrays may nest).
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<MetadataArray>),
}

impl MetadataValue {
    /// The GGUF value type id.
    pub fn type_id(&self) -> u32 {
        use value_type as t;
        match self {
            MetadataValue::U8(_) => t::U8,
            MetadataValue::I8(_) => t::I8,
            MetadataValue::U16(_) => t::U16,
            MetadataValue::I16(_) => t::I16,
            MetadataValue::U32(_) => t::U32,
            MetadataValue::I32(_) => t::I32,
            MetadataValue::U64(_) => t::U64,
            MetadataValue::I64(_) => t::I64,
            MetadataValue::F32(_) => t::F32,
            MetadataValue::F64(_) => t::F64,
            MetadataValue::Bool(_) => t::BOOL,
            MetadataValue::String(_) => t::STRING,
            MetadataValue::Array(_) => t::ARRAY,
        }
    }

    /// A short description of the type for error messages ("u32", "array of string").
    pub fn type_name(&self) -> String {
        match self {
            MetadataValue::Array(a) => format!("array of {}", a.elem_type_name()),
            other => scalar_name(other.type_id()).to_string(),
        }
    }

    /// The value as a signed 128-bit integer, when it is an integer.
    fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            MetadataValue::U8(v) => v.into(),
            MetadataValue::I8(v) => v.into(),
            MetadataValue::U16(v) => v.into(),
            MetadataValue::I16(v) => v.into(),
            MetadataValue::U32(v) => v.into(),
            MetadataValue::I32(v) => v.into(),
            MetadataValue::U64(v) => v.into(),
            MetadataValue::I64(v) => v.into(),
            _ => return None,
        })
    }
}

fn scalar_name(type_id: u32) -> &'static str {
    use value_type as t;
    match type_id {
        t::U8 => "u8",
        t::I8 => "i8",
        t::U16 => "u16",
        t::I16 => "i16",
        t::U32 => "u32",
        t::I32 => "i32",
        t::U64 => "u64",
        t::I64 => "i64",
        t::F32 => "f32",
        t::F64 => "f64",
        t::BOOL => "bool",
        t::STRING => "string",
        _ => "array",
    }
}

impl MetadataArray {
    pub fn len(&self) -> usize {
        match self {
            MetadataArray::U8(v) => v.len(),
            MetadataArray::I8(v) => v.len(),
            MetadataArray::U16(v) => v.len(),
            MetadataArray::I16(v) => v.len(),
            MetadataArray::U32(v) => v.len(),
            MetadataArray::I32(v) => v.len(),
            MetadataArray::U64(v) => v.len(),
            MetadataArray::I64(v) => v.len(),
            MetadataArray::F32(v) => v.len(),
            MetadataArray::F64(v) => v.len(),
            MetadataArray::Bool(v) => v.len(),
            MetadataArray::String(v) => v.len(),
            MetadataArray::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GGUF value type id of the elements.
    pub fn elem_type_id(&self) -> u32 {
        use value_type as t;
        match self {
            MetadataArray::U8(_) => t::U8,
            MetadataArray::I8(_) => t::I8,
            MetadataArray::U16(_) => t::U16,
            MetadataArray::I16(_) => t::I16,
            MetadataArray::U32(_) => t::U32,
            MetadataArray::I32(_) => t::I32,
            MetadataArray::U64(_) => t::U64,
            MetadataArray::I64(_) => t::I64,
            MetadataArray::F32(_) => t::F32,
            MetadataArray::F64(_) => t::F64,
            MetadataArray::Bool(_) => t::BOOL,
            MetadataArray::String(_) => t::STRING,
            MetadataArray::Array(_) => t::ARRAY,
        }
    }

    fn elem_type_name(&self) -> &'static str {
        scalar_name(self.elem_type_id())
    }

    /// Integer elements widened to i128 (`None` for non-integer arrays).
    fn integers(&self) -> Option<Vec<i128>> {
        fn w<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            MetadataArray::U8(v) => w(v),
            MetadataArray::I8(v) => w(v),
            MetadataArray::U16(v) => w(v),
            MetadataArray::I16(v) => w(v),
            MetadataArray::U32(v) => w(v),
            MetadataArray::I32(v) => w(v),
            MetadataArray::U64(v) => w(v),
            MetadataArray::I64(v) => w(v),
            _ => return None,
        })
    }
}

/// The metadata section: key/value pairs in file order, with lookup by key.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    entries: Vec<(String, MetadataValue)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// Adds a pair; a key seen before is an error (llama.cpp rejects those too).
    pub(crate) fn insert(&mut self, key: String, value: MetadataValue) -> Result<()> {
        if self.index.contains_key(&key) {
            return Err(GgufError::Duplicate {
                what: "metadata key",
                name: key,
            });
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    /// All pairs in file order.
    pub fn entries(&self) -> &[(String, MetadataValue)] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    fn require(&self, key: &str) -> Result<&MetadataValue> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    fn integer<T: TryFrom<i128>>(&self, key: &str, target: &'static str) -> Result<T> {
        let v = self.require(key)?;
        let i = v.as_i128().ok_or_else(|| wrong(key, "an integer", v))?;
        T::try_from(i).map_err(|_| GgufError::OutOfRange {
            key: key.to_string(),
            value: i.to_string(),
            target,
        })
    }

    /// An integer key as u32 (any integer type whose value fits).
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.integer(key, "u32")
    }

    /// An integer key as u64 (any integer type whose value is non-negative).
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.integer(key, "u64")
    }

    /// An integer key as i64.
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.integer(key, "i64")
    }

    /// An integer key as usize.
    pub fn get_usize(&self, key: &str) -> Result<usize> {
        self.integer(key, "usize")
    }

    /// A float key as f32 (f64 values are narrowed, integers converted).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.get_f64(key).map(|v| v as f32)
    }

    /// A float key as f64 (f32 values widened, integers converted).
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        let v = self.require(key)?;
        match *v {
            MetadataValue::F32(x) => Ok(x.into()),
            MetadataValue::F64(x) => Ok(x),
            _ => v
                .as_i128()
                .map(|i| i as f64)
                .ok_or_else(|| wrong(key, "a number", v)),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.require(key)? {
            MetadataValue::Bool(b) => Ok(*b),
            v => Err(wrong(key, "bool", v)),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.require(key)? {
            MetadataValue::String(s) => Ok(s),
            v => Err(wrong(key, "string", v)),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<&MetadataArray> {
        match self.require(key)? {
            MetadataValue::Array(a) => Ok(a),
            v => Err(wrong(key, "array", v)),
        }
    }

    pub fn get_string_array(&self, key: &str) -> Result<&[String]> {
        match self.require(key)? {
            MetadataValue::Array(MetadataArray::String(v)) => Ok(v),
            v => Err(wrong(key, "array of string", v)),
        }
    }

    /// An integer array as i32 (any integer element type whose values fit).
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        let v = self.require(key)?;
        let ints = match v {
            MetadataValue::Array(MetadataArray::I32(a)) => return Ok(a.clone()),
            MetadataValue::Array(a) => a.integers(),
            _ => None,
        }
        .ok_or_else(|| wrong(key, "array of integers", v))?;
        ints.into_iter()
            .map(|i| {
                i32::try_from(i).map_err(|_| GgufError::OutOfRange {
                    key: key.to_string(),
                    value: i.to_string(),
                    target: "i32",
                })
            })
            .collect()
    }

    /// `Ok(None)` when `key` is absent, otherwise what `f` gives.
    pub fn optional<'a, T>(
        &'a self,
        key: &str,
        f: impl FnOnce(&'a Self, &str) -> Result<T>,
    ) -> Result<Option<T>> {
        if self.contains(key) {
            f(self, key).map(Some)
        } else {
            Ok(None)
        }
    }
}

fn wrong(key: &str, expected: &'static str, found: &MetadataValue) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: found.type_name(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(pairs: Vec<(&str, MetadataValue)>) -> Metadata {
        let mut m = Metadata::default();
        for (k, v) in pairs {
            m.insert(k.to_string(), v).unwrap();
        }
        m
    }

    #[test]
    fn integer_widths_coerce_when_the_value_fits() {
        let m = md(vec![
            ("a", MetadataValue::I32(7)),
            ("b", MetadataValue::U64(1 << 40)),
            ("c", MetadataValue::I8(-1)),
            ("f", MetadataValue::F64(0.5)),
        ]);
        assert_eq!(m.get_u32("a").unwrap(), 7);
        assert_eq!(m.get_u64("b").unwrap(), 1 << 40);
        assert!(matches!(m.get_u32("b"), Err(GgufError::OutOfRange { .. })));
        assert!(matches!(m.get_u32("c"), Err(GgufError::OutOfRange { .. })));
        assert_eq!(m.get_i64("c").unwrap(), -1);
        assert_eq!(m.get_f32("f").unwrap(), 0.5);
        assert_eq!(m.get_f32("a").unwrap(), 7.0);
    }

    #[test]
    fn errors_name_the_key() {
        let m = md(vec![("s", MetadataValue::String("x".into()))]);
        let e = m.get_u32("s").unwrap_err().to_string();
        assert!(e.contains("\"s\"") && e.contains("string"), "{e}");
        let e = m.get_u32("missing.key").unwrap_err().to_string();
        assert!(e.contains("missing.key"), "{e}");
        assert!(m
            .optional("missing.key", Metadata::get_u32)
            .unwrap()
            .is_none());
        assert!(m.optional("s", Metadata::get_u32).is_err());
    }

    #[test]
    fn arrays_read_typed() {
        let m = md(vec![
            (
                "t",
                MetadataValue::Array(MetadataArray::String(vec!["a".into(), "b".into()])),
            ),
            (
                "i",
                MetadataValue::Array(MetadataArray::U8(vec![1, 2, 255])),
            ),
            (
                "big",
                MetadataValue::Array(MetadataArray::U64(vec![u64::MAX])),
            ),
        ]);
        assert_eq!(m.get_string_array("t").unwrap(), ["a", "b"]);
        assert_eq!(m.get_i32_array("i").unwrap(), [1, 2, 255]);
        assert!(m.get_i32_array("t").is_err());
        assert!(m.get_string_array("i").is_err());
        assert!(matches!(
            m.get_i32_array("big"),
            Err(GgufError::OutOfRange { .. })
        ));
    }

    #[test]
    fn duplicate_keys_are_rejected() {
        let mut m = Metadata::default();
        m.insert("k".into(), MetadataValue::U8(1)).unwrap();
        assert!(m.insert("k".into(), MetadataValue::U8(2)).is_err());
    }
}
