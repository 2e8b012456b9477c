//! Paged KV writes, copy-on-write block copies and paged attention.
//!
//! Cache layout `[num_blocks, block_size, num_kv_heads, head_dim]` in bf16
//! or FP8 E4M3 bytes (each kernel has an instantiation per element type,
//! chosen by the cache; FP8 takes the layer's scales from the cache's
//! device buffer): the K (or V) of one token and kv head is `head_dim`
//! contiguous elements at
//! `((slot * num_kv_heads) + kv_head) * head_dim`. Every slot and block id a
//! launch will touch is checked on the host first (from the step's maxima, or
//! the copy list), so a bad request is a shape error, never a stray write.
//!
//! Attention goes to one of four kernels, chosen by
//! [`super::attention_path::attention_kernel`] (through
//! `CudaBackend::attention_kernel_for`): the split-K decode kernel
//! (`attention_decode.rs`), the grouped prefill kernel
//! (`attention_prefill_mma.rs`) or the tiled one (`attention_prefill.rs`),
//! or, for what they do not take (other head dims, decode groups past 8),
//! one launch of the general `paged_attention_bf16` over (token, head) for
//! any mix of prefill and decode (see `kernels/attention.cu`), which supports
//! head_dim up to 256. All of them take the sliding window and the soft-cap,
//! and all need num_heads to be a multiple of num_kv_heads.

use super::attention_path::AttentionKernel;
use super::ops::elems_cfg;
use super::storage::{CudaKvCache, CudaStep, CudaTensor};
use super::{device_err, CudaBackend};
use pagoda_core::BlockCopy;

use crate::{AttentionParams, KernelError, Result};
use cudarc::driver::LaunchConfig;

/// Largest head_dim the attention kernel handles (8 values per lane).
const MAX_HEAD_DIM: usize = 256;
/// Warps per attention block (must match `ATT_WARPS` in attention.cu).
const ATT_WARPS: u32 = 4;

fn shape_err(op: &'static str, detail: String) -> KernelError {
    KernelError::Shape { op, detail }
}

/// The window as the kernels take it: 0 for none (a window past i32 covers
/// every context anyway, positions being 32-bit). The cap is passed as
/// `softcap.unwrap_or(0.0)` (0: none).
pub(crate) fn window_arg(p: &AttentionParams) -> i32 {
    p.window.and_then(|w| i32::try_from(w).ok()).unwrap_or(0)
}

fn i32_of(v: usize, op: &'static str) -> Result<i32> {
    i32::try_from(v).map_err(|_| shape_err(op, format!("{v} does not fit in 32 bits")))
}

/// `store_kv`'s checks: k and v `[tokens, kv width]`, the group valid,
/// every slot in the cache or -1.
pub(crate) fn check_store(
    k: &CudaTensor,
    v: &CudaTensor,
    cache: &CudaKvCache,
    step: &CudaStep,
    group: usize,
) -> Result<()> {
    let op = "store_kv";
    let width = cache.shape.num_kv_heads * cache.shape.head_dim;
    let t = step.ctx.num_tokens();
    for (name, x) in [("k", k), ("v", v)] {
        if x.rows != t || x.cols != width {
            return Err(shape_err(
                op,
                format!(
                    "{name} is [{}, {}], expected [{t}, {width}]",
                    x.rows, x.cols
                ),
            ));
        }
    }
    step.ctx
        .check_kv_group(group)
        .map_err(|e| shape_err(op, e))?;
    let slots = cache.num_slots() as i64;
    if let Some(&bad) = step
        .ctx
        .slot_mapping_of(group)
        .iter()
        .find(|&&s| s < -1 || s >= slots)
    {
        return Err(shape_err(
            op,
            format!("slot {bad} outside the cache ({slots} slots)"),
        ));
    }
    Ok(())
}

pub(crate) fn store_kv(
    b: &CudaBackend,
    k: &CudaTensor,
    v: &CudaTensor,
    cache: &mut CudaKvCache,
    step: &CudaStep,
    group: usize,
) -> Result<()> {
    let op = "store_kv";
    check_store(k, v, cache, step, group)?;
    let width = cache.shape.num_kv_heads * cache.shape.head_dim;
    let t = step.ctx.num_tokens();
    let n = t * width;
    if n == 0 {
        return Ok(());
    }
    let (nr, w) = (i32_of(t, op)?, i32_of(width, op)?);
    let slot_view = step.view(step.slot_mapping_of(group));
    // Eight elements per thread where slot rows allow 16-byte accesses.
    let (kernel, per_thread) = match (width.is_multiple_of(8), cache.fp8) {
        (true, false) => ("store_kv_v8_bf16", 8),
        (false, false) => ("store_kv_bf16", 1),
        (true, true) => ("store_kv_v8_fp8", 8),
        (false, true) => ("store_kv_fp8", 1),
    };
    let mut l = b.dev.launch(kernel)?;
    l.out(&mut cache.k)
        .out(&mut cache.v)
        .arg(k.bf16(op)?)
        .arg(v.bf16(op)?)
        .arg(&cache.scales)
        .arg(&slot_view)
        .arg(&nr)
        .arg(&w);
    l.run(elems_cfg(n / per_thread))?;
    Ok(())
}

/// Copies run concurrently, so no copy's `dst` may be another copy's `src`
/// (the block manager never plans that: a copy-on-write target is a fresh block).
pub(crate) fn copy_blocks(
    b: &CudaBackend,
    cache: &mut CudaKvCache,
    copies: &[BlockCopy],
) -> Result<()> {
    let op = "copy_blocks";
    let s = cache.shape;
    let mut ops: Vec<i32> = Vec::with_capacity(copies.len() * 3);
    for (i, c) in copies.iter().enumerate() {
        if c.src.0 as usize >= s.num_blocks
            || c.dst.0 as usize >= s.num_blocks
            || c.num_tokens > s.block_size
        {
            return Err(shape_err(
                op,
                format!(
                    "{c:?} outside a cache of {} blocks of {}",
                    s.num_blocks, s.block_size
                ),
            ));
        }
        let clash = copies
            .iter()
            .enumerate()
            .any(|(j, o)| j != i && o.src == c.dst && o.num_tokens > 0);
        if clash && c.num_tokens > 0 {
            return Err(shape_err(
                op,
                format!("block {} is both a source and a destination", c.dst.0),
            ));
        }
        ops.extend([c.src.0 as i32, c.dst.0 as i32, c.num_tokens as i32]);
    }
    let slot_elems = s.num_kv_heads * s.head_dim;
    let max_tokens = copies.iter().map(|c| c.num_tokens).max().unwrap_or(0);
    if max_tokens == 0 || slot_elems == 0 {
        return Ok(());
    }
    // From the pool, like every per-step buffer (no device allocation once warm).
    let mut ops_dev = b.alloc_i32(ops.len())?;
    b.dev
        .stream
        .memcpy_htod(&ops, &mut *ops_dev)
        .map_err(|e| device_err("copy_blocks upload", e))?;
    let block_elems = (s.block_size * slot_elems) as i64;
    let se = i32_of(slot_elems, op)?;
    let per_copy = elems_cfg(max_tokens * slot_elems);
    let cfg = LaunchConfig {
        grid_dim: (per_copy.grid_dim.0, i32_of(copies.len(), op)? as u32, 1),
        ..per_copy
    };
    let kernel = if cache.fp8 {
        "copy_blocks_fp8"
    } else {
        "copy_blocks_bf16"
    };
    let mut l = b.dev.launch(kernel)?;
    l.out(&mut cache.k)
        .out(&mut cache.v)
        .arg(&ops_dev)
        .arg(&block_elems)
        .arg(&se);
    l.run(cfg)?;
    Ok(())
}

/// Checks the head layout, q's shape and every block id the step will read.
pub(crate) fn check(
    q: &CudaTensor,
    cache: &CudaKvCache,
    step: &CudaStep,
    p: &AttentionParams,
) -> Result<()> {
    let op = "attention";
    let s = cache.shape;
    p.check_variants().map_err(|e| shape_err(op, e))?;
    step.ctx
        .check_kv_group(p.kv_group)
        .map_err(|e| shape_err(op, e))?;
    if p.num_kv_heads == 0 || !p.num_heads.is_multiple_of(p.num_kv_heads) {
        return Err(shape_err(
            op,
            format!(
                "num_heads {} not a multiple of num_kv_heads {}",
                p.num_heads, p.num_kv_heads
            ),
        ));
    }
    if p.num_kv_heads != s.num_kv_heads || p.head_dim != s.head_dim {
        return Err(shape_err(
            op,
            format!("params {p:?} do not match the cache {s:?}"),
        ));
    }
    if p.head_dim == 0 || p.head_dim > MAX_HEAD_DIM {
        return Err(KernelError::Unsupported(format!(
            "attention with head_dim {} (the CUDA kernel takes 1..={MAX_HEAD_DIM})",
            p.head_dim
        )));
    }
    let t = step.ctx.num_tokens();
    if q.rows != t || q.cols != p.num_heads * p.head_dim {
        return Err(shape_err(
            op,
            format!(
                "q is [{}, {}], expected [{t}, {}]",
                q.rows,
                q.cols,
                p.num_heads * p.head_dim
            ),
        ));
    }
    if step.ctx.block_size != s.block_size {
        return Err(shape_err(
            op,
            format!(
                "step block_size {} but cache block_size {}",
                step.ctx.block_size, s.block_size
            ),
        ));
    }
    if let Some(m) = step.max_block {
        if m as usize >= s.num_blocks {
            return Err(shape_err(
                op,
                format!("block {m} outside the cache ({} blocks)", s.num_blocks),
            ));
        }
    }
    Ok(())
}

pub(crate) fn attention(
    b: &CudaBackend,
    q: &CudaTensor,
    cache: &CudaKvCache,
    step: &CudaStep,
    p: &AttentionParams,
) -> Result<CudaTensor> {
    let op = "attention";
    check(q, cache, step, p)?;
    match b.attention_kernel_for(&step.ctx, p) {
        AttentionKernel::SplitKDecode => {
            return super::attention_decode::decode_attention(b, q, cache, step, p)
        }
        AttentionKernel::MmaPrefill => {
            // A mixed step's leading decodes take the split-K kernel: the
            // grouped kernel would run a whole query tile, without split-K,
            // for each of their one-row queries.
            let decodes = super::attention_decode::decode_prefix(&step.ctx, p);
            let mut y = b.output(q.rows, q.cols)?;
            super::attention_decode::decode_attention_into(b, q, cache, step, p, decodes, &mut y)?;
            super::attention_prefill_mma::prefill_attention_mma_into(
                b, q, cache, step, p, decodes, &mut y,
            )?;
            return Ok(y);
        }
        AttentionKernel::TiledPrefill => {
            return super::attention_prefill::prefill_attention(b, q, cache, step, p)
        }
        AttentionKernel::General => {}
    }
    let mut y = b.output(q.rows, q.cols)?;
    if y.numel() == 0 || p.num_heads == 0 {
        return Ok(y);
    }
    let cfg = LaunchConfig {
        grid_dim: (
            i32_of(q.rows, op)? as u32,
            i32_of(p.num_heads, op)? as u32,
            1,
        ),
        block_dim: (32 * ATT_WARPS, 1, 1),
        shared_mem_bytes: 0,
    };
    let (token_seq, cu_q, ctx_lens, tables) = (
        step.view(step.token_seq),
        step.view(step.cu_seqlens_q),
        step.view(step.context_lens),
        step.view(step.block_tables_of(p.kv_group)),
    );
    let (mbps, bs, nh, nkv, hd) = (
        i32_of(step.ctx.max_blocks_per_seq, op)?,
        i32_of(cache.shape.block_size, op)?,
        i32_of(p.num_heads, op)?,
        i32_of(p.num_kv_heads, op)?,
        i32_of(p.head_dim, op)?,
    );
    let (window, softcap) = (window_arg(p), p.softcap.unwrap_or(0.0));
    let kernel = if cache.fp8 {
        "paged_attention_fp8"
    } else {
        "paged_attention_bf16"
    };
    let mut l = b.dev.launch(kernel)?;
    l.out(y.bf16_mut(op)?)
        .arg(q.bf16(op)?)
        .arg(&cache.k)
        .arg(&cache.v)
        .arg(&cache.scales)
        .arg(&token_seq)
        .arg(&cu_q)
        .arg(&ctx_lens)
        .arg(&tables)
        .arg(&mbps)
        .arg(&bs)
        .arg(&nh)
        .arg(&nkv)
        .arg(&hd)
        .arg(&p.scale)
        .arg(&window)
        .arg(&softcap);
    l.run(cfg)?;
    Ok(y)
}
