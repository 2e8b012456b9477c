//! Host-side tensors: what weight loaders produce and backends upload.
//!
//! Row-major; a 2-D weight of a linear layer is `[out_features, in_features]`
//! (Hugging Face layout; GGUF's `ne = [in, out]` is the same bytes).
//! A quantized tensor ([`HostData::Quant`]) keeps GGUF's blocks as stored:
//! each row is `cols / block_size` whole blocks.

use half::{bf16, f16};
pub use pagoda_gguf::GgmlType;

/// Element storage of a host tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum HostData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    /// GGUF blocks of a quantized type, rows one after another.
    Quant(QuantData),
}

/// The blocks of a quantized tensor as the file stores them.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantData {
    /// Block format (Q4_0, Q4_K, ...).
    pub ty: GgmlType,
    /// Whole blocks, `elements / ty.block_size() * ty.type_size()` bytes.
    pub bytes: Vec<u8>,
}

impl QuantData {
    /// Number of elements the blocks hold.
    pub fn elements(&self) -> usize {
        self.bytes.len() / self.ty.type_size().max(1) * self.ty.block_size()
    }

    /// The elements as f32; `None` when pagoda cannot dequantize the type.
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        let mut out = vec![0f32; self.elements()];
        pagoda_gguf::dequant::dequantize_into(self.ty, &self.bytes, &mut out).ok()?;
        Some(out)
    }
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
            HostData::Quant(q) => q.elements(),
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
            HostData::Quant(q) => q.ty.name(),
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

    /// The elements as f32 (converting if stored narrower, dequantizing
    /// blocks; a quantized type pagoda cannot dequantize gives NaNs: the
    /// GGUF source hands out only types it can dequantize).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.data {
            HostData::F32(v) => v.clone(),
            HostData::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            HostData::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            HostData::Quant(q) => q
                .to_f32_vec()
                .unwrap_or_else(|| vec![f32::NAN; q.elements()]),
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
