//! Loading named weights with shape checks, shared by the architecture files.

use crate::loader::WeightSource;
use crate::{ModelError, Result};
use pagoda_kernels::{Backend, HostData, HostTensor};

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
