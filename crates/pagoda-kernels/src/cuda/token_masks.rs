//! Token masks of structured outputs on the device: the step's masks
//! ([`TokenMasks`]) are uploaded into one buffer the backend keeps (grown
//! geometrically; it lives outside the step arena, whose size it would
//! otherwise change). The engine's start-up profiling applies masks to
//! every row of its largest steps, so the buffer has its final size before
//! the KV cache is sized and serving never allocates it. Then
//! `mask_logits_bf16` (`kernels/token_masks.cu`) sets the disallowed
//! logits to -inf in the same stream, before penalties and sampling: no
//! wait for the device.

use super::storage::CudaTensor;
use super::{device_err, CudaBackend};
use crate::{KernelError, Result, TokenMasks};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

/// Threads per mask (`TM_THREADS`).
const THREADS: u32 = 256;

/// The backend's mask upload buffer and the host staging of its contents.
#[derive(Default)]
pub(crate) struct MaskBuffer {
    dev: Option<CudaSlice<u32>>,
    host: Vec<u32>,
}

/// Applies `masks` to the rows of `logits` (`[rows, vocab]`, bf16).
pub(crate) fn apply(b: &CudaBackend, logits: &CudaTensor, masks: &TokenMasks) -> Result<()> {
    if masks.is_empty() {
        return Ok(());
    }
    let (rows, vocab) = (logits.rows, logits.cols);
    masks
        .validate(rows, vocab)
        .map_err(|detail| KernelError::Shape {
            op: "token masks",
            detail,
        })?;
    let n = masks.rows.len();
    let need = n + masks.bits.len();
    let mut guard = b
        .masks
        .lock()
        .map_err(|_| KernelError::Device("token mask buffer poisoned".into()))?;
    let buf = &mut *guard;
    buf.host.clear();
    buf.host.extend_from_slice(&masks.rows);
    buf.host.extend_from_slice(&masks.bits);
    if buf.dev.as_ref().is_none_or(|d| d.len() < need) {
        let cap = need.next_power_of_two();
        buf.dev = Some(
            b.dev
                .stream
                .alloc_zeros::<u32>(cap)
                .map_err(|e| device_err("token mask buffer", e))?,
        );
    }
    let dev = buf
        .dev
        .as_mut()
        .ok_or_else(|| KernelError::Device("no token mask buffer".into()))?;
    b.dev
        .stream
        .memcpy_htod(&buf.host, &mut dev.slice_mut(..need))
        .map_err(|e| device_err("token mask upload", e))?;
    let (n_i, words, v) = (n as i32, masks.words as i32, vocab as i32);
    let mut l = b
        .dev
        .stream
        .launch_builder(b.dev.kernel("mask_logits_bf16")?);
    l.arg(logits.bf16("mask_logits")?)
        .arg(&*dev)
        .arg(&n_i)
        .arg(&words)
        .arg(&v);
    let cfg = LaunchConfig {
        grid_dim: (n as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: validated above: n rows below `rows`, n masks of `words` =
    // ceil(vocab / 32) words each, all in the uploaded prefix of `dev`.
    unsafe { l.launch(cfg) }.map_err(|e| device_err("mask_logits", e))?;
    Ok(())
}
