//! Sampling on the device: one token per logits row (placeholder until the
//! sampling kernels land).

use super::pool::DeviceBuf;
use super::storage::{CudaStep, CudaTensor};
use super::CudaBackend;
use crate::{KernelError, Result};

/// Queues the sampling of every row of `logits` with the step's sampling
/// rows; the ids land in `out` (at least `logits.rows` elements).
pub(crate) fn launch_sample(
    _b: &CudaBackend,
    _logits: &CudaTensor,
    _step: &CudaStep,
    _out: &mut DeviceBuf<i32>,
) -> Result<()> {
    Err(KernelError::Unsupported("device sampling".into()))
}
