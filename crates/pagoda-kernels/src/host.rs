//! Host-side tensors: what weight loaders produce and backends upload.
//!
//! Row-major; a 2-D weight of a linear layer is `[out_features, in_features]`
//! (Hugging Face layout; GGUF's `ne = [in, out]` is the same bytes).
//! A quantized tensor ([`HostData::Quant`]) keeps GGUF's blocks as stored:
//! each row is `cols / block_size` whole blocks.

use half::{bf16, f16};
pub use pagoda_gguf::GgmlType;
use rayon::prelude::*;

/// Elements converted per rayon task in [`HostData::into_bf16`].
const CONVERT_CHUNK: usize = 1 << 16;

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

impl HostData {
    /// The elements as bf16 (round to nearest even, as `half` converts),
    /// converted in parallel over rayon chunks: the same bits as converting
    /// one element at a time, in any thread count. bf16 data is moved, not
    /// copied; quantized blocks are dequantized to f32 first (NaNs where
    /// pagoda cannot dequantize the type, as [`HostTensor::to_f32_vec`]).
    pub fn into_bf16(self) -> Vec<bf16> {
        fn par_map<T: Sync>(v: &[T], f: impl Fn(&T) -> bf16 + Sync + Send) -> Vec<bf16> {
            let mut out = Vec::with_capacity(v.len());
            v.par_iter()
                .with_min_len(CONVERT_CHUNK)
                .map(f)
                .collect_into_vec(&mut out);
            out
        }
        match self {
            HostData::BF16(v) => v,
            HostData::F32(v) => par_map(&v, |&x| bf16::from_f32(x)),
            HostData::F16(v) => par_map(&v, |x| bf16::from_f32(x.to_f32())),
            d @ HostData::Quant(_) => {
                let f = HostTensor {
                    shape: vec![d.len()],
                    data: d,
                }
                .into_f32_vec();
                par_map(&f, |&x| bf16::from_f32(x))
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The parallel conversion gives the bits of the element-wise one, over
    /// several chunks (with a partial last one) and the special values.
    #[test]
    fn into_bf16_matches_the_serial_conversion_bit_for_bit() {
        let n = 3 * CONVERT_CHUNK + 1234;
        let mut v: Vec<f32> = (0..n)
            .map(|i| ((i as f32) * 0.618_034).sin() * 1e3 / (1.0 + i as f32))
            .collect();
        // Ties (round to even), NaN, infinities, subnormals, signed zero.
        let specials = [
            f32::from_bits(0x3f80_8000),
            f32::from_bits(0x3f81_8000),
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::from_bits(1),
            -0.0,
            f32::MAX,
        ];
        v[..specials.len()].copy_from_slice(&specials);
        let serial: Vec<u16> = v.iter().map(|&x| bf16::from_f32(x).to_bits()).collect();
        let par: Vec<u16> = HostData::F32(v.clone())
            .into_bf16()
            .iter()
            .map(|x| x.to_bits())
            .collect();
        assert_eq!(par, serial);
        let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
        let serial: Vec<u16> = h
            .iter()
            .map(|x| bf16::from_f32(x.to_f32()).to_bits())
            .collect();
        let par: Vec<u16> = HostData::F16(h)
            .into_bf16()
            .iter()
            .map(|x| x.to_bits())
            .collect();
        assert_eq!(par, serial);
        let b: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
        let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&HostData::BF16(b.clone()).into_bf16()), bits(&b));
        assert!(HostData::F32(Vec::new()).into_bf16().is_empty());
    }
}
