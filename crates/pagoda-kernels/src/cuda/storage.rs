//! Memory of the CUDA backend: activations, weights, KV cache and step metadata.
//!
//! - [`CudaTensor`]: a row-major `[rows, cols]` activation on the device,
//!   bf16 ([`Act::Bf16`]) or f32 ([`Act::F32`]). The residual stream is f32
//!   (`embedding` makes it, `add_linear` accumulates into it, the norms read
//!   it); every other activation is bf16, the input precision of the GEMMs
//!   and of attention. Keeping the residual in f32 removes the rounding that
//!   otherwise compounds over the layers (on a 28-layer Qwen3 it is most of
//!   the bf16 error). Kernels accumulate in f32 and round once per output
//!   element. The buffer holds at least `rows * cols` elements (empty tensors
//!   hold one element so no zero-byte allocation is made).
//! - [`CudaWeight`]: `[rows, cols]`, bf16 for everything [`load_weight`]
//!   uploads (matrices, tables, norm weights and biases alike), f32 for what
//!   `load_table` uploads (the rotary cos/sin table), or FP8 for a linear
//!   layer's matrix loaded by `load_linear` / `load_fp8_linear` (E4M3 codes
//!   and one f32 scale per row; only `linear` / `add_linear` take it).
//! - [`CudaKvCache`]: K and V, each `[num_blocks, block_size,
//!   num_kv_heads, head_dim]` of bf16, or of FP8 E4M3 bytes with the layer's
//!   `{k_scale, v_scale}` in a two-float device buffer the kernels read
//!   (so a captured graph follows a change), zero-filled at allocation.
//! - [`CudaStep`]: the [`ForwardContext`]'s index arrays packed into one int32
//!   device buffer (one host-to-device copy per step), plus the host copy and
//!   the maxima the ops' range checks need (each check O(1) per op).
//!
//! [`load_weight`]: crate::Backend::load_weight

use super::pool::DeviceBuf;
use crate::{ForwardContext, HostData, HostTensor, KernelError, KvCacheShape, Result};
use cudarc::driver::{CudaSlice, CudaView};
use half::bf16;

/// Element storage of an activation.
pub enum Act {
    Bf16(DeviceBuf<bf16>),
    /// The residual stream.
    F32(DeviceBuf<f32>),
}

/// An activation: row-major `[rows, cols]` on the device.
pub struct CudaTensor {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) data: Act,
}

impl CudaTensor {
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Whether the elements are f32 (the residual stream) rather than bf16.
    pub fn is_f32(&self) -> bool {
        matches!(self.data, Act::F32(_))
    }

    pub(crate) fn numel(&self) -> usize {
        self.rows * self.cols
    }

    /// The bf16 storage, or a shape error naming `op` for an f32 tensor.
    pub(crate) fn bf16(&self, op: &'static str) -> Result<&DeviceBuf<bf16>> {
        match &self.data {
            Act::Bf16(d) => Ok(d),
            Act::F32(_) => Err(f32_input(op)),
        }
    }

    /// The bf16 storage, mutably (see [`Self::bf16`]).
    pub(crate) fn bf16_mut(&mut self, op: &'static str) -> Result<&mut DeviceBuf<bf16>> {
        match &mut self.data {
            Act::Bf16(d) => Ok(d),
            Act::F32(_) => Err(f32_input(op)),
        }
    }
}

fn f32_input(op: &'static str) -> KernelError {
    KernelError::Shape {
        op,
        detail: "expects a bf16 activation, got the f32 residual stream (normalize it first)"
            .into(),
    }
}

/// Element storage of a weight.
pub enum WeightBuf {
    Bf16(CudaSlice<bf16>),
    F32(CudaSlice<f32>),
    /// An FP8 linear weight: `rows * cols` E4M3 codes, one scale per row.
    Fp8 {
        codes: CudaSlice<u8>,
        scales: CudaSlice<f32>,
    },
}

/// A weight on the device: `[rows, cols]` (a vector is one row).
pub struct CudaWeight {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) data: WeightBuf,
}

impl CudaWeight {
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The bf16 storage, or a shape error naming `op` for an f32 table.
    pub(crate) fn bf16(&self, op: &'static str) -> Result<&CudaSlice<bf16>> {
        match &self.data {
            WeightBuf::Bf16(d) => Ok(d),
            WeightBuf::F32(_) => Err(KernelError::Shape {
                op,
                detail: "expects a weight loaded with load_weight, got an f32 table".into(),
            }),
            WeightBuf::Fp8 { .. } => Err(KernelError::Shape {
                op,
                detail: "expects a bf16 weight, got an FP8 linear weight".into(),
            }),
        }
    }

    /// The bf16 storage of a vector of `n` elements (norm weights, biases).
    pub(crate) fn vector(&self, n: usize, op: &'static str) -> Result<&CudaSlice<bf16>> {
        if self.rows * self.cols != n || self.rows != 1 {
            return Err(KernelError::Shape {
                op,
                detail: format!(
                    "weight must be a vector of {n} values, got [{}, {}]",
                    self.rows, self.cols
                ),
            });
        }
        self.bf16(op)
    }
}

/// Converts host elements to bf16 (rounding to nearest even).
pub(crate) fn host_to_bf16(d: HostData) -> Vec<bf16> {
    d.into_bf16()
}

/// Rows and columns of a host tensor, checked against its element count.
pub(crate) fn host_dims(t: &HostTensor, op: &'static str) -> Result<(usize, usize)> {
    let (rows, cols) = t.dims2();
    if t.data.len() != rows * cols {
        return Err(KernelError::Shape {
            op,
            detail: format!("shape {:?} but {} elements", t.shape, t.data.len()),
        });
    }
    Ok((rows, cols))
}

/// One layer's paged KV cache: bf16, or FP8 bytes (`fp8`); either way K
/// and V are byte buffers the kernels of the matching element type read.
pub struct CudaKvCache {
    pub(crate) shape: KvCacheShape,
    pub(crate) fp8: bool,
    pub(crate) k: CudaSlice<u8>,
    pub(crate) v: CudaSlice<u8>,
    /// `{k_scale, v_scale}` (1.0 each unless set; unused by a bf16 cache).
    pub(crate) scales: CudaSlice<f32>,
}

impl CudaKvCache {
    pub fn shape(&self) -> KvCacheShape {
        self.shape
    }

    pub(crate) fn num_slots(&self) -> usize {
        self.shape.num_blocks * self.shape.block_size
    }

    /// Whether the cache holds FP8 bytes.
    pub fn is_fp8(&self) -> bool {
        self.fp8
    }
}

/// Ints per sampling row in the packed step (see [`CudaStep::sampling`]).
pub(crate) const SAMPLING_INTS: usize = 6;

/// Where each array of the step lives in the packed buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Span {
    pub start: usize,
    pub len: usize,
}

/// Where a step's arrays sit in its packed buffer, and the maxima the ops'
/// range checks need. A function of the context's lengths only for the
/// spans, so two contexts of the same shape pack to the same layout (a
/// captured graph relies on that).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub(crate) input_ids: Span,
    pub(crate) positions: Span,
    pub(crate) slot_mapping: Span,
    /// Sequence index of each token.
    pub(crate) token_seq: Span,
    pub(crate) cu_seqlens_q: Span,
    pub(crate) context_lens: Span,
    pub(crate) block_tables: Span,
    /// The slot mappings and block tables of KV cache groups 1.. (see
    /// [`ForwardContext::extra_kv_groups`]); empty with one group.
    pub(crate) group_slot_mapping: Span,
    pub(crate) group_block_tables: Span,
    pub(crate) logits_indices: Span,
    /// [`crate::SamplingRow`]s as 6 ints each: temperature (f32 bits),
    /// top_k, top_p (f32 bits), min_p (f32 bits), random low 32 bits,
    /// random high 32 bits; empty when the step samples on the host.
    pub(crate) sampling: Span,
    /// Per-row sampling options and their history pairs (see
    /// [`super::sampling_extras`]); empty when the step has none. Not part
    /// of a captured graph's input (replays upload them apart).
    pub(crate) options: Span,
    pub(crate) history: Span,
    /// Packed logit adjustments (see [`super::logit_adjust`]); inactive
    /// when the step has none. Not part of a captured graph's input either.
    pub(crate) adjust: super::logit_adjust::AdjustSpans,
    /// Prompt-logprobs rows as (token, n) int pairs, one per logits row
    /// after the sampling rows; empty when the step has none.
    pub(crate) prompt: Span,
    /// Largest token id / position / block id the step reads (block ids:
    /// only the entries each sequence's length reaches).
    pub(crate) max_input_id: Option<u32>,
    pub(crate) max_position: Option<u32>,
    pub(crate) max_block: Option<u32>,
}

impl Layout {
    /// The slot mapping of KV cache group `g`.
    pub(crate) fn slot_mapping_of(&self, g: usize) -> Span {
        if g == 0 {
            return self.slot_mapping;
        }
        let t = self.slot_mapping.len;
        Span {
            start: self.group_slot_mapping.start + (g - 1) * t,
            len: t,
        }
    }

    /// The block tables of KV cache group `g`.
    pub(crate) fn block_tables_of(&self, g: usize) -> Span {
        if g == 0 {
            return self.block_tables;
        }
        let n = self.block_tables.len;
        Span {
            start: self.group_block_tables.start + (g - 1) * n,
            len: n,
        }
    }

    /// Whether `other` puts every array at the same place.
    pub(crate) fn same_spans(&self, other: &Layout) -> bool {
        let spans = |l: &Layout| {
            [
                l.input_ids,
                l.positions,
                l.slot_mapping,
                l.token_seq,
                l.cu_seqlens_q,
                l.context_lens,
                l.block_tables,
                l.group_slot_mapping,
                l.group_block_tables,
                l.logits_indices,
                l.sampling,
            ]
        };
        spans(self) == spans(other)
    }
}

/// Packs a validated context's arrays into `packed` (cleared first).
pub(crate) fn pack(ctx: &ForwardContext, packed: &mut Vec<i32>) -> Result<Layout> {
    packed.clear();
    let too_big = |what: &str| KernelError::Shape {
        op: "begin_step",
        detail: format!("{what} does not fit in 32 bits"),
    };
    let push_u32 = |packed: &mut Vec<i32>, v: &[u32], what: &str| -> Result<Span> {
        let start = packed.len();
        for &x in v {
            packed.push(i32::try_from(x).map_err(|_| too_big(what))?);
        }
        Ok(Span {
            start,
            len: v.len(),
        })
    };
    let input_ids = push_u32(packed, &ctx.input_ids, "a token id")?;
    let positions = push_u32(packed, &ctx.positions, "a position")?;
    let slot_mapping = Span {
        start: packed.len(),
        len: ctx.slot_mapping.len(),
    };
    for &s in &ctx.slot_mapping {
        packed.push(i32::try_from(s).map_err(|_| too_big("a slot"))?);
    }
    let token_seq = Span {
        start: packed.len(),
        len: ctx.num_tokens(),
    };
    for i in 0..ctx.num_seqs() {
        packed.extend(std::iter::repeat_n(i as i32, ctx.query_len(i)));
    }
    let cu_seqlens_q = push_u32(packed, &ctx.cu_seqlens_q, "cu_seqlens_q")?;
    let context_lens = push_u32(packed, &ctx.context_lens, "a context_len")?;
    let block_tables = push_u32(packed, &ctx.block_tables, "a block id")?;
    let logits_indices = push_u32(packed, &ctx.logits_indices, "a logits index")?;
    let sampling = Span {
        start: packed.len(),
        len: ctx.sampling.len() * SAMPLING_INTS,
    };
    for r in &ctx.sampling {
        packed.extend([
            r.temperature.to_bits() as i32,
            r.top_k.min(i32::MAX as u32) as i32,
            r.top_p.to_bits() as i32,
            r.min_p.to_bits() as i32,
            r.random as u32 as i32,
            (r.random >> 32) as u32 as i32,
        ]);
    }
    // After everything else, so one group packs as it always did.
    let group_slot_mapping = Span {
        start: packed.len(),
        len: ctx.group_slot_mapping.len(),
    };
    for &s in &ctx.group_slot_mapping {
        packed.push(i32::try_from(s).map_err(|_| too_big("a slot"))?);
    }
    let group_block_tables = push_u32(packed, &ctx.group_block_tables, "a block id")?;
    // A trailing element keeps every span (empty ones too) inside the buffer.
    packed.push(0);
    let empty = Span {
        start: packed.len() - 1,
        len: 0,
    };
    let max_block = (0..=ctx.extra_kv_groups)
        .flat_map(|g| (0..ctx.num_seqs()).map(move |i| (g, i)))
        .flat_map(|(g, i)| {
            let used = (ctx.seq_lens[i] as usize).div_ceil(ctx.block_size);
            ctx.group_block_table(g, i)[..used].iter().copied()
        })
        .max();
    Ok(Layout {
        input_ids,
        positions,
        slot_mapping,
        token_seq,
        cu_seqlens_q,
        context_lens,
        block_tables,
        group_slot_mapping,
        group_block_tables,
        logits_indices,
        sampling,
        options: empty,
        history: empty,
        adjust: Default::default(),
        prompt: Span::default(),
        max_input_id: ctx.input_ids.iter().copied().max(),
        max_position: ctx.positions.iter().copied().max(),
        max_block,
    })
}

/// The batch metadata of one forward pass, on the device: the context's
/// arrays packed into one int32 buffer from the pool (one host-to-device
/// copy per step, no device allocation once warm).
pub struct CudaStep {
    pub(crate) ctx: ForwardContext,
    pub(crate) buf: DeviceBuf<i32>,
    pub(crate) layout: Layout,
    /// What the host needs of the step's sampling options.
    pub(crate) opts: super::sampling_extras::OptionsInfo,
}

impl std::ops::Deref for CudaStep {
    type Target = Layout;
    fn deref(&self) -> &Layout {
        &self.layout
    }
}

impl CudaStep {
    /// Validates `ctx` (as the CPU backend does), packs its arrays and uploads
    /// them with one copy.
    pub(crate) fn new(ctx: &ForwardContext, b: &super::CudaBackend) -> Result<Self> {
        Self::with_options(ctx, &crate::SamplingOptions::default(), b)
    }

    /// [`Self::new`] with the sampling options packed after the context's
    /// arrays, in the same upload.
    pub(crate) fn with_options(
        ctx: &ForwardContext,
        opts: &crate::SamplingOptions,
        b: &super::CudaBackend,
    ) -> Result<Self> {
        // The CPU step's checks are the contract: reuse them (and its copy).
        let ctx = crate::cpu::CpuStep::new(ctx)?.ctx;
        let mut packed = Vec::new();
        let mut layout = pack(&ctx, &mut packed)?;
        let info = super::sampling_extras::OptionsInfo::new(opts, ctx.sampling.len())?;
        if !opts.is_empty() {
            let rows = ctx.sampling.len();
            let (o, h) = super::sampling_extras::pack_options(opts, rows, &mut packed);
            layout.options = o;
            layout.history = h;
            layout.adjust = super::logit_adjust::pack_adjust(&opts.adjust, rows, &mut packed);
            layout.prompt = super::sampling_extras::pack_prompt_rows(opts, &mut packed);
        }
        let extra = ctx.logits_indices.len() - ctx.sampling.len();
        if !ctx.sampling.is_empty() && extra != info.prompt_rows {
            return Err(crate::KernelError::Shape {
                op: "begin_step",
                detail: format!(
                    "{extra} logits rows after the sampling rows but {} prompt rows",
                    info.prompt_rows
                ),
            });
        }
        let mut buf = b.alloc_i32(packed.len())?;
        b.dev
            .stream
            .memcpy_htod(&packed, &mut *buf)
            .map_err(|e| super::device_err("begin_step upload", e))?;
        Ok(CudaStep {
            ctx,
            buf,
            layout,
            opts: info,
        })
    }

    /// A device view of one packed array.
    pub(crate) fn view(&self, s: Span) -> CudaView<'_, i32> {
        self.buf.slice(s.start..s.start + s.len)
    }

    /// A device view of one packed array past its first `skip` elements
    /// (`skip` at most its length).
    pub(crate) fn view_from(&self, s: Span, skip: usize) -> CudaView<'_, i32> {
        let skip = skip.min(s.len);
        self.buf.slice(s.start + skip..s.start + s.len)
    }

    /// The context this step was built from.
    pub fn context(&self) -> &ForwardContext {
        &self.ctx
    }
}
