//! `qk_norm_rope` on CUDA: the q/k head RMSNorm and rotary embedding of an
//! attention layer in one launch (kernels/qk_norm_rope.cu) instead of four,
//! with the same bits as the four ops (`head_rms_norm` twice, `rope`
//! twice). Every check of those ops is made here too, so a bad shape is the
//! same [`KernelError::Shape`]; shapes the kernel does not take (head_dim
//! over 1024, an FP8 table) run the four ops instead.
//!
//! [`qk_norm_rope_store_kv`] also stores the step's K/V into the KV cache
//! from the same launch (`qk_norm_rope_store_*`: store_kv's checks and
//! bits), where the decode fusions are on and the one-launch kernel takes
//! the shape; else it runs `qk_norm_rope` then `store_kv`.

use super::ops::{check_rows, rows_threads};
use super::storage::{CudaKvCache, CudaStep, CudaTensor, CudaWeight, WeightBuf};
use super::{attention, ops, CudaBackend};
use crate::{KernelError, Result, RopeStyle};
use cudarc::driver::LaunchConfig;

fn shape_err(detail: String) -> KernelError {
    KernelError::Shape {
        op: "qk_norm_rope",
        detail,
    }
}

fn i32_of(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| shape_err(format!("{v} does not fit in 32 bits")))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn qk_norm_rope(
    b: &CudaBackend,
    q: &mut CudaTensor,
    k: &mut CudaTensor,
    norms: Option<(&CudaWeight, &CudaWeight)>,
    eps: f32,
    step: &CudaStep,
    cos_sin: &CudaWeight,
    head_dim: usize,
    style: RopeStyle,
) -> Result<()> {
    launch(b, q, k, norms, eps, step, cos_sin, head_dim, style, None)
}

/// `qk_norm_rope`, then `store_kv` of k and v into `cache` (group 0), in
/// one launch where the fusions are on and the shapes allow.
#[allow(clippy::too_many_arguments)]
pub(crate) fn qk_norm_rope_store_kv(
    b: &CudaBackend,
    q: &mut CudaTensor,
    k: &mut CudaTensor,
    v: &CudaTensor,
    norms: Option<(&CudaWeight, &CudaWeight)>,
    eps: f32,
    step: &CudaStep,
    cos_sin: &CudaWeight,
    head_dim: usize,
    style: RopeStyle,
    cache: &mut CudaKvCache,
) -> Result<()> {
    let fits = b.decode_fusion()
        && cache.shape.head_dim == head_dim
        && k.cols == cache.shape.num_kv_heads * head_dim;
    if fits && fused(q, k, cos_sin, head_dim) {
        attention::check_store(k, v, cache, step, 0)?;
        return launch(
            b,
            q,
            k,
            norms,
            eps,
            step,
            cos_sin,
            head_dim,
            style,
            Some((v, cache)),
        );
    }
    qk_norm_rope(b, q, k, norms, eps, step, cos_sin, head_dim, style)?;
    attention::store_kv(b, k, v, cache, step, 0)
}

/// Whether the one-launch kernel takes these shapes.
fn fused(q: &CudaTensor, k: &CudaTensor, cos_sin: &CudaWeight, head_dim: usize) -> bool {
    let rd = cos_sin.cols;
    head_dim > 0
        && head_dim <= 1024
        && !matches!(cos_sin.data, WeightBuf::Fp8 { .. })
        && q.rows == k.rows
        && q.cols.is_multiple_of(head_dim)
        && k.cols.is_multiple_of(head_dim)
        && rd <= head_dim
        && rd.is_multiple_of(2)
}

/// The launch of `qk_norm_rope`, storing K/V into a cache (checked by the
/// caller) when `store` gives one.
#[allow(clippy::too_many_arguments)]
fn launch(
    b: &CudaBackend,
    q: &mut CudaTensor,
    k: &mut CudaTensor,
    norms: Option<(&CudaWeight, &CudaWeight)>,
    eps: f32,
    step: &CudaStep,
    cos_sin: &CudaWeight,
    head_dim: usize,
    style: RopeStyle,
    store: Option<(&CudaTensor, &mut CudaKvCache)>,
) -> Result<()> {
    let op = "qk_norm_rope";
    let rd = cos_sin.cols;
    if !fused(q, k, cos_sin, head_dim) {
        // The four ops, with their own checks and errors.
        if let Some((qn, kn)) = norms {
            ops::head_rms_norm(b, q, qn, head_dim, eps)?;
            ops::head_rms_norm(b, k, kn, head_dim, eps)?;
        }
        ops::rope(b, q, step, cos_sin, head_dim, style)?;
        return ops::rope(b, k, step, cos_sin, head_dim, style);
    }
    check_rows(op, q, step)?;
    check_rows(op, k, step)?;
    q.bf16(op)?;
    k.bf16(op)?;
    let (qw, kw) = match norms {
        Some((qn, kn)) => (
            Some(qn.vector(head_dim, op)?),
            Some(kn.vector(head_dim, op)?),
        ),
        None => (None, None),
    };
    if let Some(p) = step.max_position {
        if p as usize >= cos_sin.rows {
            return Err(shape_err(format!(
                "position {p} beyond the table's {} rows",
                cos_sin.rows
            )));
        }
    }
    let (qh, kh) = (q.cols / head_dim, k.cols / head_dim);
    let blocks = q.rows * (qh + kh);
    // Nothing to normalize, and no pair to rotate: nothing changes (but
    // K/V still go to the cache).
    if blocks == 0 || (norms.is_none() && rd == 0) {
        return match store {
            Some((v, cache)) if blocks > 0 => attention::store_kv(b, k, v, cache, step, 0),
            _ => Ok(()),
        };
    }
    let cfg = LaunchConfig {
        grid_dim: (i32_of(blocks)? as u32, 1, 1),
        block_dim: (rows_threads(head_dim), 1, 1),
        shared_mem_bytes: 0,
    };
    let has_norm = i32::from(norms.is_some());
    let style: i32 = match style {
        RopeStyle::Neox => 0,
        RopeStyle::Interleaved => 1,
    };
    let (qhi, khi, hd, rdi) = (i32_of(qh)?, i32_of(kh)?, i32_of(head_dim)?, i32_of(rd)?);
    let positions = step.view(step.positions);
    let f32_table = matches!(cos_sin.data, WeightBuf::F32(_));
    let name = match (f32_table, store.as_ref().map(|(_, c)| c.fp8)) {
        (true, None) => "qk_norm_rope_f32",
        (false, None) => "qk_norm_rope_bf16",
        (true, Some(false)) => "qk_norm_rope_store_f32_bf16",
        (false, Some(false)) => "qk_norm_rope_store_bf16_bf16",
        (true, Some(true)) => "qk_norm_rope_store_f32_fp8",
        (false, Some(true)) => "qk_norm_rope_store_bf16_fp8",
    };
    let slots = step.view(step.slot_mapping_of(0));
    let mut l = b.dev.launch(name)?;
    l.out(q.bf16_mut(op)?).out(k.bf16_mut(op)?);
    // Without norms the kernel reads no weight: the table stands in.
    match (qw, kw, &cos_sin.data) {
        (Some(qw), Some(kw), _) => l.arg(qw).arg(kw),
        (_, _, WeightBuf::F32(t)) => l.arg(t).arg(t),
        (_, _, WeightBuf::Bf16(t)) => l.arg(t).arg(t),
        (_, _, WeightBuf::Fp8 { codes, .. }) => l.arg(codes).arg(codes),
    };
    l.arg(&has_norm).arg(&positions);
    match &cos_sin.data {
        WeightBuf::F32(d) => l.arg(d),
        WeightBuf::Bf16(d) => l.arg(d),
        WeightBuf::Fp8 { codes, .. } => l.arg(codes),
    };
    l.arg(&qhi)
        .arg(&khi)
        .arg(&hd)
        .arg(&rdi)
        .arg(&style)
        .arg(&eps);
    if let Some((v, cache)) = store {
        l.out(&mut cache.k)
            .out(&mut cache.v)
            .arg(v.bf16(op)?)
            .arg(&cache.scales)
            .arg(&slots);
    }
    l.run(cfg)?;
    Ok(())
}
