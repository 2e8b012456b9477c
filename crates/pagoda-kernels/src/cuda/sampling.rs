//! Sampling on the device: one token id per logits row, with the host
//! sampler's semantics (pagoda-engine's `sampler`), queued on the stream.
//!
//! Owns the launch of `sample_bf16` (`kernels/sampling.cu`, whose header
//! describes the algorithm): one 1024-thread block per row, the row's
//! parameters read from the step's packed `sampling` span (6 ints per row,
//! see [`super::storage::Layout::sampling`]), the id written to `out[row]`
//! and the kept prefix (length, mass) to `kept` for the logprobs kernel
//! (see [`super::sampling_extras`]).
//!
//! Semantics (those of [`crate::SamplingRow`]): temperature NaN or below 1e-5
//! is greedy (argmax, ties to the lowest id, NaN never chosen, token 0 when
//! nothing is above -inf); otherwise softmax(logits / T), top-k, top-p (the
//! shortest most-likely prefix whose mass reaches p, at least one token),
//! min-p, and one draw with `u = (random >> 11) * 2^-53`, walking the kept
//! tokens in id order when neither top-k nor top-p filters and in rank order
//! (probability descending, id ascending) when either does, as the host does.
//! Ranking ties always go to the lower id.
//!
//! Invariants: the launch shape and arguments depend only on (rows, vocab),
//! so the launch can be captured into a CUDA graph and replayed with new
//! parameter values; rows never interact (a row's token depends on that
//! row's logits and parameters only, whatever the batch); the result is
//! deterministic (integer fixed-point masses, exact sums). No allocation and
//! no synchronization here.
//!
//! Costs per row of V logits: greedy one read of the row (2V bytes); a draw
//! without top-k/top-p three reads; with them two reads plus one per distinct
//! threshold bin (at most three), plus one more when the draw lands on the
//! second or later of several tokens with the same logit. Vocabularies up to
//! 2^23 - 1 tokens (the fixed-point total must stay below 2^63).

use super::pool::DeviceBuf;
use super::storage::{CudaStep, CudaTensor, SAMPLING_INTS};
use super::CudaBackend;
use crate::{KernelError, Result};
use cudarc::driver::LaunchConfig;

/// Threads per row (the kernel's `SMP_THREADS`).
const THREADS: u32 = 1024;
/// Largest vocabulary the fixed-point masses allow (`V * 2^40 < 2^63`).
pub(crate) const MAX_VOCAB: usize = (1 << 23) - 1;

fn shape_err(detail: String) -> KernelError {
    KernelError::Shape {
        op: "sample",
        detail,
    }
}

/// Queues the sampling of the leading rows of `logits`, one per sampling
/// row of the step; the ids land in `out` (at least one per row), each row's
/// kept-prefix length and mass in `kept` (two u64 per row, for logprobs).
pub(crate) fn launch_sample(
    b: &CudaBackend,
    logits: &CudaTensor,
    step: &CudaStep,
    out: &mut DeviceBuf<i32>,
    kept: &mut DeviceBuf<i32>,
) -> Result<()> {
    // The sampling rows lead; prompt-logprobs rows may follow them.
    let (rows, vocab) = (step.ctx.sampling.len(), logits.cols);
    if logits.rows < rows {
        return Err(shape_err(format!(
            "{} logits rows but {rows} sampling rows in the step",
            logits.rows
        )));
    }
    if step.layout.sampling.len != rows * SAMPLING_INTS {
        return Err(shape_err(format!(
            "the packed step holds {} sampling ints for {rows} rows",
            step.layout.sampling.len
        )));
    }
    if out.len() < rows {
        return Err(shape_err(format!(
            "output holds {} ids for {rows} rows",
            out.len()
        )));
    }
    if kept.len() < 4 * rows {
        return Err(shape_err(format!(
            "kept buffer holds {} ints for {rows} rows",
            kept.len()
        )));
    }
    if vocab > MAX_VOCAB {
        return Err(shape_err(format!(
            "vocabulary of {vocab} tokens (at most {MAX_VOCAB})"
        )));
    }
    let grid = u32::try_from(rows)
        .ok()
        .filter(|&r| r < i32::MAX as u32 / SAMPLING_INTS as u32)
        .ok_or_else(|| shape_err(format!("{rows} rows")))?;
    if rows == 0 {
        return Ok(());
    }
    let v = vocab as i32;
    let sampling = step.view(step.layout.sampling);
    let mut l = b.dev.launch("sample_bf16")?;
    l.out(&mut *out)
        .arg(logits.bf16("sample")?)
        .arg(&sampling)
        .arg(&v)
        .out(&mut *kept);
    let cfg = LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // In bounds: the kernel reads `rows * vocab` logits (the tensor holds at
    // least that many, checked above),
    // `6 * rows` ints of the step (checked above) and writes `rows` ids and
    // `2 * rows` u64 of `kept` (4 * rows ints, checked above; pool buffers
    // are 512-byte aligned).
    l.run(cfg)?;
    Ok(())
}
