//! Writing a `model.safetensors` file from any [`WeightSource`].
//!
//! Tests use it to build tiny Hugging Face model directories from dummy
//! weights instead of committing checkpoints; `pagoda` could use it to export
//! dequantized weights. The file carries `{"format": "pt"}` metadata like the
//! files transformers writes.
//!
//! Costs: every tensor is read and converted in memory before the file is
//! written (the safetensors header needs all sizes up front), so peak memory
//! is about the file's size plus the largest tensor in f32. Meant for small
//! models.

use super::WeightSource;
use crate::{ModelError, Result};
use half::{bf16, f16};
use safetensors::tensor::{Dtype, View};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

/// Element type of the tensors written to the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageDtype {
    F32,
    F16,
    BF16,
}

impl StorageDtype {
    fn safetensors_dtype(self) -> Dtype {
        match self {
            StorageDtype::F32 => Dtype::F32,
            StorageDtype::F16 => Dtype::F16,
            StorageDtype::BF16 => Dtype::BF16,
        }
    }

    /// Little-endian bytes of `values` converted (round to nearest even) to this type.
    fn encode(self, values: &[f32]) -> Vec<u8> {
        match self {
            StorageDtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            StorageDtype::F16 => values
                .iter()
                .flat_map(|v| f16::from_f32(*v).to_le_bytes())
                .collect(),
            StorageDtype::BF16 => values
                .iter()
                .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
                .collect(),
        }
    }
}

/// One encoded tensor, ready for the safetensors serializer.
struct Encoded {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &Encoded {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Writes the tensors `names` of `source`, converted to `dtype`, to the
/// safetensors file `path` (created or truncated).
pub fn write_safetensors<S: AsRef<str>>(
    source: &dyn WeightSource,
    names: &[S],
    dtype: StorageDtype,
    path: &Path,
) -> Result<()> {
    let mut tensors = Vec::with_capacity(names.len());
    for name in names {
        let name = name.as_ref();
        let t = source.get(name)?;
        let shape = t.shape.clone();
        let bytes = dtype.encode(&t.into_f32_vec());
        tensors.push((
            name.to_string(),
            Encoded {
                dtype: dtype.safetensors_dtype(),
                shape,
                bytes,
            },
        ));
    }
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(
        tensors.iter().map(|(n, t)| (n.as_str(), t)),
        Some(metadata),
        path,
    )
    .map_err(|e| ModelError::Safetensors(format!("writing {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagoda_kernels::HostTensor;
    use safetensors::SafeTensors;

    /// A source with two hand-written tensors.
    struct Fixed;

    impl WeightSource for Fixed {
        fn get(&self, name: &str) -> Result<HostTensor> {
            match name {
                "a.weight" => Ok(HostTensor::f32(
                    vec![2, 3],
                    vec![1.0, -2.0, 0.5, 3.25, 1.0e-3, 65504.0],
                )),
                "b.bias" => Ok(HostTensor::f32(vec![2], vec![0.1, -0.0])),
                _ => Err(ModelError::MissingTensor(name.to_string())),
            }
        }
        fn contains(&self, name: &str) -> bool {
            matches!(name, "a.weight" | "b.bias")
        }
    }

    fn roundtrip(dtype: StorageDtype) -> (Vec<u8>, tempdir::Dir) {
        let dir = tempdir::Dir::new(&format!("st-{dtype:?}"));
        let path = dir.0.join("model.safetensors");
        write_safetensors(&Fixed, &["a.weight", "b.bias"], dtype, &path).unwrap();
        (std::fs::read(&path).unwrap(), dir)
    }

    #[test]
    fn f32_bytes_are_exact() {
        let (buf, _dir) = roundtrip(StorageDtype::F32);
        let st = SafeTensors::deserialize(&buf).unwrap();
        let a = st.tensor("a.weight").unwrap();
        assert_eq!(a.dtype(), Dtype::F32);
        assert_eq!(a.shape(), &[2, 3]);
        let vals: Vec<f32> = a
            .data()
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(vals, vec![1.0, -2.0, 0.5, 3.25, 1.0e-3, 65504.0]);
        assert_eq!(st.tensor("b.bias").unwrap().shape(), &[2]);
    }

    #[test]
    fn half_types_hold_their_bit_patterns() {
        // Bit patterns from the IEEE binary16 / bfloat16 definitions.
        let (buf, _dir) = roundtrip(StorageDtype::F16);
        let st = SafeTensors::deserialize(&buf).unwrap();
        let a = st.tensor("a.weight").unwrap();
        assert_eq!(a.dtype(), Dtype::F16);
        let bits: Vec<u16> = a
            .data()
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(bits[0], 0x3C00); // 1.0
        assert_eq!(bits[1], 0xC000); // -2.0
        assert_eq!(bits[5], 0x7BFF); // 65504, the largest finite f16

        let (buf, _dir) = roundtrip(StorageDtype::BF16);
        let st = SafeTensors::deserialize(&buf).unwrap();
        let b = st.tensor("b.bias").unwrap();
        assert_eq!(b.dtype(), Dtype::BF16);
        let bits: Vec<u16> = b
            .data()
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(bits, vec![0x3DCD, 0x8000]); // 0.1 rounded to nearest even, -0.0
    }

    #[test]
    fn missing_tensor_is_an_error() {
        let dir = tempdir::Dir::new("st-missing");
        let err = write_safetensors(
            &Fixed,
            &["nope"],
            StorageDtype::F32,
            &dir.0.join("m.safetensors"),
        );
        assert!(matches!(err, Err(ModelError::MissingTensor(n)) if n == "nope"));
    }

    /// A throwaway directory under the system temp dir, removed on drop.
    pub(crate) mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new(tag: &str) -> Dir {
                let p = std::env::temp_dir().join(format!("pagoda-{tag}-{}", std::process::id()));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }
}
