//! CUDA graphs for decode steps: capture once per batch shape, replay after.
//!
//! [`capture`] records the model's forward pass over a step, up to its
//! logits rows, into a graph; nothing runs at capture. The graph keeps the
//! captured [`CudaStep`], whose packed metadata buffer (a static buffer,
//! outside the step arena) is the graph's input, and the address of the
//! logits the forward pass returned: its output, a range of the step arena
//! that every replay writes, given back after capture and claimed again
//! for the sampling after each launch. [`replay`] packs a new context of
//! the same shape into that input buffer (one host-to-device copy), launches
//! the graph, uploads the sampling options when the step has any (a second
//! copy, queued after the graph), then samples the logits eagerly (logit
//! adjustments, penalties, the draw,
//! logprobs; see [`super::sampling_extras`]) and copies the results back (the
//! step's one synchronization). Sampling outside the graph means per-row
//! options never change what was captured.
//!
//! What makes this sound:
//! - every kernel's launch shape and arguments depend only on the context's
//!   shape (tokens, sequences, block-table width, sampling rows), never on
//!   its values; [`replay`] refuses a context whose packed layout differs;
//! - activations come from the step arena (see `pool`), so no allocation is
//!   captured; intermediates, the logits included, go back to the arena
//!   after capture and may serve other work, which is safe because the one
//!   stream serializes replays with everything else and nothing in the
//!   arena is held across a replay. After the launch the logits' range is
//!   claimed back first (it is free: nothing else is held), then whatever
//!   the sampling takes from the arena (options, results) comes from the
//!   rest and is written after the graph, in stream order;
//! - capture uses relaxed mode (allocation calls are allowed) and runs with
//!   output poisoning off.
//!
//! Range checks on the replayed values (token ids, positions, block ids) are
//! the caller's: the ops check them at capture only.

use super::logit_adjust::{launch_adjust, pack_adjust, AdjustSpans};
use super::sampling_extras::{pack_options, sample_rows, OptionsInfo};
use super::storage::{pack, Act, CudaStep, CudaTensor};
use super::{device_err, CudaBackend};
use crate::{DeviceSamples, ForwardContext, KernelError, Result, SamplingOptions};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, DevicePtr};
use std::sync::atomic::Ordering;

/// A captured decode step (see the module docs).
pub struct CudaGraphRunner {
    graph: CudaGraph,
    step: CudaStep,
    /// Where every replay writes the logits: `[rows, cols]` bf16, a range
    /// of the step arena claimed back after each launch.
    logits_ptr: cudarc::driver::sys::CUdeviceptr,
    cols: usize,
    rows: usize,
    packed: Vec<i32>,
    /// Reused host buffer for the packed sampling options.
    opts_packed: Vec<i32>,
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
    // The graph's input lives across replays: a static buffer.
    let mut step = step;
    let mut input = b.alloc_static_i32(step.buf.len())?;
    b.dev
        .stream
        .memcpy_dtod(&*step.buf, &mut *input)
        .map_err(|e| device_err("graph input copy", e))?;
    step.buf = input;
    let poison = b.poison.swap(false, Ordering::Relaxed);
    let stream = &b.dev.stream;
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .map_err(|e| device_err("begin graph capture", e))?;
    let recorded = forward(&step);
    // End the capture whatever happened, so the stream is usable again.
    let ended = stream.end_capture(CUgraphInstantiate_flags(0));
    b.poison.store(poison, Ordering::Relaxed);
    let logits = recorded?;
    let logits_ptr = match &logits.data {
        Act::Bf16(d) if logits.rows == rows => d.device_ptr(stream).0,
        _ => 0,
    };
    if logits_ptr == 0 {
        return Err(KernelError::Shape {
            op: "capture_graph",
            detail: format!(
                "the forward pass returned {} logits rows for {rows} (bf16 expected)",
                logits.rows
            ),
        });
    }
    let graph = ended
        .map_err(|e| device_err("end graph capture", e))?
        .ok_or_else(|| KernelError::Device("graph capture recorded nothing".into()))?;
    graph.upload().map_err(|e| device_err("upload graph", e))?;
    let cols = logits.cols;
    // Back to the arena: nothing holds the output between replays.
    drop(logits);
    Ok(CudaGraphRunner {
        graph,
        step,
        logits_ptr,
        cols,
        rows,
        packed: Vec::new(),
        opts_packed: Vec::new(),
    })
}

pub(crate) fn replay(
    b: &CudaBackend,
    g: &mut CudaGraphRunner,
    ctx: &ForwardContext,
    opts: &SamplingOptions,
    masks: &mut dyn FnMut() -> Result<crate::TokenMasks>,
) -> Result<DeviceSamples> {
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
    let info = OptionsInfo::new(opts, ctx.sampling.len())?;
    if info.prompt_rows > 0 {
        return Err(KernelError::Shape {
            op: "graph replay",
            detail: "prompt-logprobs rows in a decode graph".into(),
        });
    }
    let stream = &b.dev.stream;
    stream
        .memcpy_htod(&g.packed, &mut *g.step.buf)
        .map_err(|e| device_err("replay upload", e))?;
    g.graph
        .launch()
        .map_err(|e| device_err("replay graph", e))?;
    // The logits first, then the options: a buffer from the arena may be
    // one the graph uses as an intermediate (the arena holds those as
    // free), and stream order keeps this copy after every write of the
    // graph; claiming the logits first keeps them out of its way.
    let logits = CudaTensor {
        rows: g.rows,
        cols: g.cols,
        data: Act::Bf16(b.pool.claim(g.logits_ptr, g.rows * g.cols)?),
    };
    // The host computed the token masks while the graph ran.
    super::token_masks::apply(b, &logits, &masks()?)?;
    let mut opts_buf = None;
    let mut adjust = AdjustSpans::default();
    if info.present {
        g.opts_packed.clear();
        let spans = pack_options(opts, ctx.sampling.len(), &mut g.opts_packed);
        adjust = pack_adjust(&opts.adjust, ctx.sampling.len(), &mut g.opts_packed);
        let mut d = b.alloc_i32(g.opts_packed.len())?;
        stream
            .memcpy_htod(&g.opts_packed, &mut *d)
            .map_err(|e| device_err("replay options upload", e))?;
        opts_buf = Some((d, spans));
    }
    if let Some((d, _)) = &opts_buf {
        let rows = ctx.sampling.len();
        launch_adjust(b, &logits, rows, &adjust, |s| {
            d.slice(s.start..s.start + s.len)
        })?;
    }
    let views = opts_buf.as_ref().map(|(d, (o, h))| {
        (
            d.slice(o.start..o.start + o.len),
            d.slice(h.start..h.start + h.len),
        )
    });
    let mut out = sample_rows(b, &logits, &g.step, views, &info)?;
    out.tokens.truncate(g.rows);
    Ok(out)
}
