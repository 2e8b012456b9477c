//! CUDA graphs for decode steps: capture once per batch shape, replay after.
//!
//! [`capture`] records the model's forward pass over a step, followed by
//! device sampling, into a graph; nothing runs at capture. The graph keeps
//! the captured [`CudaStep`] (its packed metadata buffer is the graph's
//! static input) and the buffer the sampled ids land in (its static output).
//! [`replay`] packs a new context of the same shape into that input buffer
//! (one host-to-device copy), launches the graph, and copies the ids back
//! (the step's one synchronization).
//!
//! What makes this sound:
//! - every kernel's launch shape and arguments depend only on the context's
//!   shape (tokens, sequences, block-table width, sampling rows), never on
//!   its values; [`replay`] refuses a context whose packed layout differs;
//! - activations come from the step arena (see `pool`), so no allocation is
//!   captured; intermediates go back to the arena after capture and may
//!   serve other work, which is safe because the one stream serializes
//!   replays with everything else and nothing in the arena is held across a
//!   replay: the graph's input and output are static buffers;
//! - capture uses relaxed mode (allocation calls are allowed) and runs with
//!   output poisoning off.
//!
//! Range checks on the replayed values (token ids, positions, block ids) are
//! the caller's: the ops check them at capture only.

use super::pool::DeviceBuf;
use super::storage::{pack, CudaStep, CudaTensor};
use super::{device_err, CudaBackend};
use crate::{ForwardContext, KernelError, Result};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;
use std::sync::atomic::Ordering;

/// A captured decode step (see the module docs).
pub struct CudaGraphRunner {
    graph: CudaGraph,
    step: CudaStep,
    tokens: DeviceBuf<i32>,
    rows: usize,
    packed: Vec<i32>,
    host_tokens: Vec<i32>,
}

impl std::fmt::Debug for CudaGraphRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaGraphRunner")
            .field("tokens", &self.step.ctx.num_tokens())
            .field("seqs", &self.step.ctx.num_seqs())
            .field("rows", &self.rows)
            .finish()
    }
}

// SAFETY: the graph is only used through `&mut CudaGraphRunner` (replay), so
// calls on it are serialized, as CUDA requires.
unsafe impl Send for CudaGraphRunner {}

pub(crate) fn capture(
    b: &CudaBackend,
    step: CudaStep,
    forward: &mut dyn FnMut(&CudaStep) -> Result<CudaTensor>,
) -> Result<CudaGraphRunner> {
    let rows = step.ctx.logits_indices.len();
    if step.ctx.sampling.len() != rows || rows == 0 {
        return Err(KernelError::Shape {
            op: "capture_graph",
            detail: format!(
                "a graph samples every logits row: {} sampling rows for {rows} logits rows",
                step.ctx.sampling.len()
            ),
        });
    }
    // The graph's input (packed metadata) and output (sampled ids) live
    // across replays: static buffers, outside the step arena.
    let mut step = step;
    let mut input = b.alloc_static_i32(step.buf.len())?;
    b.dev
        .stream
        .memcpy_dtod(&*step.buf, &mut *input)
        .map_err(|e| device_err("graph input copy", e))?;
    step.buf = input;
    let mut tokens = b.alloc_static_i32(rows)?;
    let poison = b.poison.swap(false, Ordering::Relaxed);
    let stream = &b.dev.stream;
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .map_err(|e| device_err("begin graph capture", e))?;
    let recorded = forward(&step)
        .and_then(|logits| super::sampling::launch_sample(b, &logits, &step, &mut tokens));
    // End the capture whatever happened, so the stream is usable again.
    let ended = stream.end_capture(CUgraphInstantiate_flags(0));
    b.poison.store(poison, Ordering::Relaxed);
    recorded?;
    let graph = ended
        .map_err(|e| device_err("end graph capture", e))?
        .ok_or_else(|| KernelError::Device("graph capture recorded nothing".into()))?;
    graph.upload().map_err(|e| device_err("upload graph", e))?;
    Ok(CudaGraphRunner {
        graph,
        step,
        tokens,
        rows,
        packed: Vec::new(),
        host_tokens: vec![0; rows],
    })
}

pub(crate) fn replay(
    b: &CudaBackend,
    g: &mut CudaGraphRunner,
    ctx: &ForwardContext,
) -> Result<Vec<u32>> {
    let shape_err = |detail: String| KernelError::Shape {
        op: "replay_graph",
        detail,
    };
    let cap = &g.step.ctx;
    if ctx.block_size != cap.block_size || ctx.max_blocks_per_seq != cap.max_blocks_per_seq {
        return Err(shape_err(format!(
            "block size {} / table width {} differ from the captured {} / {}",
            ctx.block_size, ctx.max_blocks_per_seq, cap.block_size, cap.max_blocks_per_seq
        )));
    }
    ctx.validate().map_err(shape_err)?;
    let layout = pack(ctx, &mut g.packed)?;
    if !layout.same_spans(&g.step.layout) {
        return Err(shape_err(format!(
            "a step of {} tokens / {} sequences / {} sampling rows does not fit the graph \
             captured for {} / {} / {}",
            ctx.num_tokens(),
            ctx.num_seqs(),
            ctx.sampling.len(),
            cap.num_tokens(),
            cap.num_seqs(),
            cap.sampling.len()
        )));
    }
    let stream = &b.dev.stream;
    stream
        .memcpy_htod(&g.packed, &mut *g.step.buf)
        .map_err(|e| device_err("replay upload", e))?;
    g.graph
        .launch()
        .map_err(|e| device_err("replay graph", e))?;
    stream
        .memcpy_dtoh(&*g.tokens, &mut g.host_tokens)
        .map_err(|e| device_err("replay download", e))?;
    b.synchronize()?;
    Ok(g.host_tokens[..g.rows].iter().map(|&t| t as u32).collect())
}
