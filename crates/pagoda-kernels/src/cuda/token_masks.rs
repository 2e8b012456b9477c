//! Token masks of structured outputs on the device: the step's masks
//! ([`TokenMasks`]) are staged in page-locked host memory and uploaded, in
//! one copy per step, into one buffer the backend keeps (both grown
//! geometrically; the device one lives outside the step arena, whose size
//! it would otherwise change). From page-locked memory the copy is queued
//! behind the forward pass like a kernel, so the host goes on to queue the
//! sampling at once instead of waiting for the device to reach the copy
//! (which a copy from pageable memory of this size, 6 KB a row, does), and
//! the device leaves no gap between the forward pass and the sampling. The engine's start-up profiling applies masks to
//! every row of its largest steps, so the buffer has its final size before
//! the KV cache is sized and serving never allocates it. Then
//! `mask_logits_bf16` (`kernels/token_masks.cu`) sets the disallowed
//! logits to -inf in the same stream, before penalties and sampling: no
//! wait for the device.

use super::storage::CudaTensor;
use super::{device_err, CudaBackend};
use crate::{KernelError, Result, TokenMasks};
use cudarc::driver::{CudaEvent, CudaSlice, LaunchConfig, PinnedHostSlice};

/// Threads per mask (`TM_THREADS`).
const THREADS: u32 = 256;

/// The backend's mask upload buffer and the host staging of its contents.
#[derive(Default)]
pub(crate) struct MaskBuffer {
    dev: Option<CudaSlice<u32>>,
    /// Page-locked staging, at least as long as `dev`'s used prefix.
    host: Option<PinnedHostSlice<u32>>,
    /// Recorded after the last copy out of `host`: the next step waits on
    /// it before writing `host` again (long done by then: the step that
    /// queued the copy read its sampled tokens back).
    copied: Option<CudaEvent>,
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
    if let Some(e) = &buf.copied {
        e.synchronize()
            .map_err(|e| device_err("token mask staging wait", e))?;
    }
    if buf.host.as_ref().is_none_or(|h| h.len() < need) {
        let cap = need.next_power_of_two();
        // SAFETY: the contents are written below before any copy reads
        // them (only the written prefix is copied); flags 0: plain
        // page-locked memory (not write-combined: the host writes it
        // in order, and nothing reads it back).
        let host = unsafe {
            b.dev
                .stream
                .context()
                .alloc_pinned_with_flags::<u32>(cap, 0)
        }
        .map_err(|e| device_err("token mask staging", e))?;
        buf.host = Some(host);
    }
    if buf.dev.as_ref().is_none_or(|d| d.len() < need) {
        let cap = need.next_power_of_two();
        buf.dev = Some(
            b.dev
                .stream
                .alloc_zeros::<u32>(cap)
                .map_err(|e| device_err("token mask buffer", e))?,
        );
    }
    if buf.copied.is_none() {
        buf.copied = Some(
            b.dev
                .stream
                .context()
                .new_event(None)
                .map_err(|e| device_err("token mask event", e))?,
        );
    }
    let (Some(host), Some(dev), Some(copied)) = (buf.host.as_mut(), buf.dev.as_mut(), &buf.copied)
    else {
        return Err(KernelError::Device("no token mask buffer".into()));
    };
    let staged = host
        .as_mut_slice()
        .map_err(|e| device_err("token mask staging", e))?;
    let staged = &mut staged[..need];
    staged[..n].copy_from_slice(&masks.rows);
    staged[n..].copy_from_slice(&masks.bits);
    // A plain slice of page-locked memory: an asynchronous copy. `staged`
    // is not written again before `copied` (recorded next) has passed.
    b.dev
        .stream
        .memcpy_htod(&*staged, &mut dev.slice_mut(..need))
        .map_err(|e| device_err("token mask upload", e))?;
    copied
        .record(&b.dev.stream)
        .map_err(|e| device_err("token mask event", e))?;
    let (n_i, words, v) = (n as i32, masks.words as i32, vocab as i32);
    let mut l = b.dev.launch("mask_logits_bf16")?;
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
    // In bounds: validated above: n rows below `rows`, n masks of `words` =
    // ceil(vocab / 32) words each, all in the uploaded prefix of `dev`.
    l.run(cfg)?;
    Ok(())
}
