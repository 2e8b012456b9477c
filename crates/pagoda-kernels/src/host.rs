//! Host-side tensors: what weight loaders produce and backends upload.
//!
//! Row-major; a 2-D weight of a linear layer is `[out_features, in_features]`
//! (Hugging Face layout; GGUF's `ne = [in, out]` is the same bytes).

use half::{bf16, f16};

/// Element storage of a host tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum HostData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

/// A dense host tensor with its shape (outermost dimension first).
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: HostData,
}

impl HostData {
    pub fn len(&self) -> usize {
        match self {
            HostData::F32(v) => v.len(),
            HostData::F16(v) => v.len(),
            HostData::BF16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Short dtype name for logs and `pagoda info`.
    pub fn dtype_name(&self) -> &'static str {
        match self {
            HostData::F32(_) => "f32",
            HostData::F16(_) => "f16",
            HostData::BF16(_) => "bf16",
        }
    }
}

impl HostTensor {
    pub fn f32(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        HostTensor {
            shape,
            data: HostData::F32(data),
        }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Rows and columns when viewed as a matrix (a vector is one row).
    pub fn dims2(&self) -> (usize, usize) {
        match self.shape.as_slice() {
            [] => (1, 1),
            [n] => (1, *n),
            [rest @ .., last] => (rest.iter().product(), *last),
        }
    }

    /// The elements as f32 (converting if stored narrower).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.data {
            HostData::F32(v) => v.clone(),
            HostData::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            HostData::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
        }
    }

    /// Consumes the tensor and returns its elements as f32.
    pub fn into_f32_vec(self) -> Vec<f32> {
        match self.data {
            HostData::F32(v) => v,
            other => HostTensor {
                shape: self.shape,
                data: other,
            }
            .to_f32_vec(),
        }
    }
}
