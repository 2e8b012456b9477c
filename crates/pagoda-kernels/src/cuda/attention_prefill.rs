//! Tiled prefill attention: the launch of `prefill_attention_bf16_hd{64,128}`
//! (see `kernels/attention_prefill.cu`) for steps whose longest query is more
//! than one token.
//!
//! Semantics are exactly those of the simple `paged_attention_bf16` launch in
//! [`super::attention`] (causal over the paged cache, cached prefix, GQA, any
//! mix of prompt chunks and decode tokens in one step), and the host-side
//! checks are the same function ([`super::attention::check`]), so every
//! block id the kernel reads has been checked against the cache first.
//!
//! Invariants: head_dim is 64 or 128 (the caller falls back to the simple
//! kernel otherwise); the grid is sized from the step's real longest query
//! (computed here from `cu_seqlens_q`, not trusted from `max_query_len`), so
//! every row of q is written. The grid depends on that length, so this
//! launch belongs to eager prefill steps, not to captured decode graphs.
//!
//! Costs: one launch; no device memory besides the output; grid
//! `(ceil(max_query_len / 64), num_seqs, num_heads)` blocks of 128 threads,
//! each reading its Q tile once and every key its last row sees once (K and
//! V through L2, once per query head); 35 KB (head_dim 128) or 18 KB of
//! static shared memory per block. O(num_seqs) host work for the grid size.

use super::attention::check;
use super::storage::{CudaKvCache, CudaStep, CudaTensor};
use super::{device_err, CudaBackend};
use crate::{AttentionParams, KernelError, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// Query rows per block (must match `PF_BLOCK_M` in attention_prefill.cu).
const BLOCK_M: usize = 64;
/// Threads per block (must match `PF_THREADS`).
const THREADS: u32 = 128;

/// Whether the tiled kernel has an instantiation for `head_dim`.
pub(crate) fn supports_head_dim(head_dim: usize) -> bool {
    matches!(head_dim, 64 | 128)
}

fn u32_of(v: usize, op: &'static str) -> Result<u32> {
    u32::try_from(v).map_err(|_| KernelError::Shape {
        op,
        detail: format!("{v} does not fit in 32 bits"),
    })
}

/// Causal paged attention for a step with prompt chunks, on tensor cores.
pub(crate) fn prefill_attention(
    b: &CudaBackend,
    q: &CudaTensor,
    cache: &CudaKvCache,
    step: &CudaStep,
    p: &AttentionParams,
) -> Result<CudaTensor> {
    let op = "prefill_attention";
    check(q, cache, step, p)?;
    let kernel = match p.head_dim {
        64 => "prefill_attention_bf16_hd64",
        128 => "prefill_attention_bf16_hd128",
        d => {
            return Err(KernelError::Unsupported(format!(
                "tiled prefill attention with head_dim {d} (takes 64 or 128)"
            )))
        }
    };
    let mut y = b.output(q.rows, q.cols)?;
    let ctx = &step.ctx;
    let num_seqs = ctx.num_seqs();
    let longest = (0..num_seqs).map(|i| ctx.query_len(i)).max().unwrap_or(0);
    if y.numel() == 0 || p.num_heads == 0 || longest == 0 {
        return Ok(y);
    }
    let grid_y = u32_of(num_seqs, op)?;
    let grid_z = u32_of(p.num_heads, op)?;
    if grid_y > 65_535 || grid_z > 65_535 {
        return Err(KernelError::Unsupported(format!(
            "{num_seqs} sequences x {} heads exceed the launch grid",
            p.num_heads
        )));
    }
    let cfg = LaunchConfig {
        grid_dim: (u32_of(longest.div_ceil(BLOCK_M), op)?, grid_y, grid_z),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let (cu_q, ctx_lens, tables) = (
        step.view(step.cu_seqlens_q),
        step.view(step.context_lens),
        step.view(step.block_tables),
    );
    let i32_of = |v: usize| -> Result<i32> {
        i32::try_from(v).map_err(|_| KernelError::Shape {
            op,
            detail: format!("{v} does not fit in 32 bits"),
        })
    };
    let (mbps, bs, nh, nkv) = (
        i32_of(ctx.max_blocks_per_seq)?,
        i32_of(cache.shape.block_size)?,
        i32_of(p.num_heads)?,
        i32_of(p.num_kv_heads)?,
    );
    let mut l = b.dev.stream.launch_builder(b.dev.kernel(kernel)?);
    l.arg(y.bf16_mut(op)?)
        .arg(q.bf16(op)?)
        .arg(&cache.k)
        .arg(&cache.v)
        .arg(&cu_q)
        .arg(&ctx_lens)
        .arg(&tables)
        .arg(&mbps)
        .arg(&bs)
        .arg(&nh)
        .arg(&nkv)
        .arg(&p.scale);
    unsafe { l.launch(cfg) }.map_err(|e| device_err(op, e))?;
    Ok(y)
}
