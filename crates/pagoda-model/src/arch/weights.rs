//! Loading named weights with shape checks, shared by the architecture files.
//! Dense linear layers (attention and MLP projections) load through
//! [`load_linear`] / [`LinearHost`], which take a checkpoint's FP8 weights as
//! stored and let the backend quantize dense ones (`--quantization fp8`);
//! stacked mixture-of-experts weights take the same two forms through
//! [`LinearHost::upload_experts`]; embeddings, norms, biases and the LM
//! head load through [`load`].

use crate::loader::WeightSource;
use crate::{ModelError, Result};
use pagoda_kernels::{Backend, Fp8Matrix, HostData, HostTensor, QuantData};

/// Reads `name`, checks it has shape `shape`, and uploads it.
pub fn load<B: Backend>(
    b: &B,
    src: &dyn WeightSource,
    name: &str,
    shape: &[usize],
) -> Result<B::Weight> {
    Ok(b.load_weight(read(src, name, shape)?)?)
}

/// Like [`load`], but `None` when the source has no such tensor.
pub fn load_opt<B: Backend>(
    b: &B,
    src: &dyn WeightSource,
    name: &str,
    shape: &[usize],
) -> Result<Option<B::Weight>> {
    if src.contains(name) {
        load(b, src, name, shape).map(Some)
    } else {
        Ok(None)
    }
}

/// Reads `name` from the source (quantized tensors as their blocks: the
/// backend keeps or dequantizes them) and checks its shape.
pub fn read(src: &dyn WeightSource, name: &str, shape: &[usize]) -> Result<HostTensor> {
    let t = src.get_stored(name)?;
    if t.shape != shape {
        return Err(ModelError::TensorShape {
            name: name.to_string(),
            got: t.shape,
            expected: shape.to_vec(),
        });
    }
    Ok(t)
}

/// Stacks two matrices with the same column count and dtype on top of each
/// other (e.g. gate_proj over up_proj, so one GEMM computes both).
pub fn concat_rows(a: HostTensor, b: HostTensor) -> HostTensor {
    let (ra, ca) = a.dims2();
    let (rb, _) = b.dims2();
    let shape = vec![ra + rb, ca];
    let data = match (a.data, b.data) {
        (HostData::F32(mut x), HostData::F32(y)) => {
            x.extend_from_slice(&y);
            HostData::F32(x)
        }
        (HostData::F16(mut x), HostData::F16(y)) => {
            x.extend_from_slice(&y);
            HostData::F16(x)
        }
        (HostData::BF16(mut x), HostData::BF16(y)) => {
            x.extend_from_slice(&y);
            HostData::BF16(x)
        }
        (HostData::Quant(mut x), HostData::Quant(y)) if x.ty == y.ty => {
            x.bytes.extend_from_slice(&y.bytes);
            HostData::Quant(x)
        }
        (x, y) => {
            let mut v = HostTensor {
                shape: vec![ra, ca],
                data: x,
            }
            .into_f32_vec();
            v.extend(
                HostTensor {
                    shape: vec![rb, ca],
                    data: y,
                }
                .into_f32_vec(),
            );
            HostData::F32(v)
        }
    };
    HostTensor { shape, data }
}

/// Splits a matrix into consecutive row ranges of `rows` each (e.g. Phi-3's
/// fused qkv_proj into q, k and v); the counts must add up to the row count.
/// Quantized matrices split between rows, which are whole blocks.
pub fn split_rows(t: HostTensor, rows: &[usize]) -> Option<Vec<HostTensor>> {
    let (total, cols) = t.dims2();
    if rows.iter().sum::<usize>() != total || total == 0 {
        return None;
    }
    fn cut<T: Clone>(v: &[T], per_row: usize, rows: &[usize]) -> Vec<Vec<T>> {
        let mut start = 0;
        rows.iter()
            .map(|&r| {
                let part = v[start * per_row..(start + r) * per_row].to_vec();
                start += r;
                part
            })
            .collect()
    }
    let parts: Vec<HostData> = match &t.data {
        HostData::F32(v) => cut(v, cols, rows).into_iter().map(HostData::F32).collect(),
        HostData::F16(v) => cut(v, cols, rows).into_iter().map(HostData::F16).collect(),
        HostData::BF16(v) => cut(v, cols, rows).into_iter().map(HostData::BF16).collect(),
        HostData::Quant(q) => {
            if !q.bytes.len().is_multiple_of(total) {
                return None;
            }
            cut(&q.bytes, q.bytes.len() / total, rows)
                .into_iter()
                .map(|bytes| HostData::Quant(QuantData { ty: q.ty, bytes }))
                .collect()
        }
    };
    Some(
        parts
            .into_iter()
            .zip(rows)
            .map(|(data, &r)| HostTensor {
                shape: vec![r, cols],
                data,
            })
            .collect(),
    )
}

/// A dense linear layer's weight as the source holds it: dense (the
/// backend may still quantize it, see [`pagoda_kernels::Backend::load_linear`])
/// or FP8 from an FP8 checkpoint.
pub enum LinearHost {
    Dense(HostTensor),
    Fp8(Fp8Matrix),
}

impl LinearHost {
    /// Uploads through `load_linear` or `load_fp8_linear`.
    pub fn upload<B: Backend>(self, b: &B) -> Result<B::Weight> {
        Ok(match self {
            LinearHost::Dense(t) => b.load_linear(t)?,
            LinearHost::Fp8(m) => b.load_fp8_linear(m)?,
        })
    }

    /// Uploads a stacked expert weight through `load_experts` or
    /// `load_fp8_experts`.
    pub fn upload_experts<B: Backend>(self, b: &B) -> Result<B::Weight> {
        Ok(match self {
            LinearHost::Dense(t) => b.load_experts(t)?,
            LinearHost::Fp8(m) => b.load_fp8_experts(m)?,
        })
    }

    /// Stacks `other` under `self` (gate over up); an FP8 and a dense
    /// half do not mix.
    pub fn concat_rows(self, other: LinearHost, what: &str) -> Result<LinearHost> {
        match (self, other) {
            (LinearHost::Dense(a), LinearHost::Dense(b)) => {
                Ok(LinearHost::Dense(concat_rows(a, b)))
            }
            (LinearHost::Fp8(a), LinearHost::Fp8(b)) => Ok(LinearHost::Fp8(a.concat_rows(b)?)),
            _ => Err(ModelError::Config(format!(
                "{what}: one half is FP8 and the other not"
            ))),
        }
    }

    /// Splits into consecutive row ranges (see [`split_rows`]).
    pub fn split_rows(self, rows: &[usize]) -> Option<Vec<LinearHost>> {
        match self {
            LinearHost::Dense(t) => {
                split_rows(t, rows).map(|v| v.into_iter().map(LinearHost::Dense).collect())
            }
            LinearHost::Fp8(m) => m
                .split_rows(rows)
                .map(|v| v.into_iter().map(LinearHost::Fp8).collect()),
        }
    }
}

/// Reads the linear weight `name` (FP8 where the checkpoint stores it so)
/// and checks its shape.
pub fn read_linear(src: &dyn WeightSource, name: &str, shape: &[usize]) -> Result<LinearHost> {
    match src.get_fp8(name)? {
        Some(m) => {
            if [m.rows, m.cols] != shape {
                return Err(ModelError::TensorShape {
                    name: name.to_string(),
                    got: vec![m.rows, m.cols],
                    expected: shape.to_vec(),
                });
            }
            Ok(LinearHost::Fp8(m))
        }
        None => read(src, name, shape).map(LinearHost::Dense),
    }
}

/// Reads and uploads a dense linear layer's weight (attention and MLP
/// projections): FP8 as stored, or dense through `load_linear`.
pub fn load_linear<B: Backend>(
    b: &B,
    src: &dyn WeightSource,
    name: &str,
    shape: &[usize],
) -> Result<B::Weight> {
    read_linear(src, name, shape)?.upload(b)
}
