//! Token masks of structured outputs on the device: the step's masks
//! ([`TokenMasks`]) are staged in page-locked host memory and uploaded, in
//! one copy per step, into one buffer the backend keeps (both grown
//! geometrically; the device one lives outside the step arena, whose size
//! it would otherwise change). The copy runs on a stream of its own, so it
//! overlaps the forward pass queued before it (the host joins the masks
//! while the device computes, typically well before the forward pass ends);
//! the compute stream waits for it (an event) only where the masks are
//! applied, and the copy stream waits for the last application before
//! writing the buffer again. The engine's start-up profiling applies masks to
//! every row of its largest steps, so the buffer has its final size before
//! the KV cache is sized and serving never allocates it. Then
//! `mask_logits_bf16` (`kernels/token_masks.cu`) sets the disallowed
//! logits to -inf in the compute stream, before penalties and sampling: no
//! wait for the device. Masks are never applied inside a graph capture
//! (the runner applies them after a replay is queued).

use super::storage::CudaTensor;
use super::{device_err, CudaBackend};
use crate::{KernelError, Result, TokenMasks};
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, LaunchConfig, PinnedHostSlice};
use std::sync::Arc;

/// Threads per mask (`TM_THREADS`).
const THREADS: u32 = 256;

/// The backend's mask upload buffer and the host staging of its contents.
#[derive(Default)]
pub(crate) struct MaskBuffer {
    dev: Option<CudaSlice<u32>>,
    /// Page-locked staging, at least as long as `dev`'s used prefix.
    host: Option<PinnedHostSlice<u32>>,
    /// The stream the uploads run on, beside the compute stream.
    copy: Option<Arc<CudaStream>>,
    /// Recorded on `copy` after the last upload: the compute stream waits
    /// on it before applying the masks, and the host before writing `host`
    /// again (long done by then: the step that queued the copy read its
    /// sampled tokens back).
    uploaded: Option<CudaEvent>,
    /// Recorded on the compute stream after the last use of `dev` (its
    /// allocation, or the mask kernel that read it): the next upload waits
    /// on it before writing `dev`.
    applied: Option<CudaEvent>,
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
    let stream = &b.dev.stream;
    let ctx = stream.context();
    let event = || {
        ctx.new_event(None)
            .map_err(|e| device_err("token mask event", e))
    };
    if buf.copy.is_none() {
        buf.copy = Some(
            ctx.new_stream()
                .map_err(|e| device_err("token mask copy stream", e))?,
        );
        buf.uploaded = Some(event()?);
        buf.applied = Some(event()?);
    }
    let (Some(copy), Some(uploaded), Some(applied)) = (&buf.copy, &buf.uploaded, &buf.applied)
    else {
        return Err(KernelError::Device("no token mask stream".into()));
    };
    // The last upload has left the staging (and no copy into `dev` is
    // pending, so it may be replaced).
    uploaded
        .synchronize()
        .map_err(|e| device_err("token mask staging wait", e))?;
    if buf.host.as_ref().is_none_or(|h| h.len() < need) {
        let cap = need.next_power_of_two();
        // SAFETY: the contents are written below before any copy reads
        // them (only the written prefix is copied); flags 0: plain
        // page-locked memory (not write-combined: the host writes it
        // in order, and nothing reads it back).
        let host = unsafe { ctx.alloc_pinned_with_flags::<u32>(cap, 0) }
            .map_err(|e| device_err("token mask staging", e))?;
        buf.host = Some(host);
    }
    if buf.dev.as_ref().is_none_or(|d| d.len() < need) {
        let cap = need.next_power_of_two();
        buf.dev = Some(
            stream
                .alloc_zeros::<u32>(cap)
                .map_err(|e| device_err("token mask buffer", e))?,
        );
        // Allocated (and zeroed) in the compute stream's order: the upload
        // waits for that (this once, also for the forward pass queued
        // before it).
        applied
            .record(stream)
            .map_err(|e| device_err("token mask event", e))?;
    }
    let (Some(host), Some(dev)) = (buf.host.as_mut(), buf.dev.as_mut()) else {
        return Err(KernelError::Device("no token mask buffer".into()));
    };
    let staged = host
        .as_mut_slice()
        .map_err(|e| device_err("token mask staging", e))?;
    let staged = &mut staged[..need];
    staged[..n].copy_from_slice(&masks.rows);
    staged[n..].copy_from_slice(&masks.bits);
    // A plain slice of page-locked memory: an asynchronous copy, on the
    // copy stream once the last mask kernel has read `dev`. `staged` is not
    // written again before `uploaded` (recorded next) has passed.
    copy.wait(applied)
        .map_err(|e| device_err("token mask copy wait", e))?;
    copy.memcpy_htod(&*staged, &mut dev.slice_mut(..need))
        .map_err(|e| device_err("token mask upload", e))?;
    uploaded
        .record(copy)
        .map_err(|e| device_err("token mask event", e))?;
    stream
        .wait(uploaded)
        .map_err(|e| device_err("token mask upload wait", e))?;
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
    applied
        .record(stream)
        .map_err(|e| device_err("token mask event", e))?;
    Ok(())
}
