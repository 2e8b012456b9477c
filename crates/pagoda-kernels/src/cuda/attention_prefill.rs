//! Tiled prefill attention: the launch of
//! `prefill_attention_{bf16,fp8}_hd{64,128,256}` (see
//! `kernels/attention_prefill.cu`; the cache's element type picks the
//! instantiation: FP8 tiles are dequantized to bf16 as they load) for steps
//! whose longest query is more than one token, one query head per block.
//! The grouped kernel (`attention_prefill_mma.rs`) takes these steps by
//! default, over either cache; this one runs where a backend is told to
//! prefer it (`PAGODA_PREFILL_ATTENTION=tiled`,
//! `CudaBackend::force_tiled_prefill`), as the fallback and the reference
//! the grouped kernel is timed and checked against. Both kernels take one
//! parameter list: their launch ([`launch`]) and shared-memory setup
//! ([`raise_smem`]) live here.
//!
//! Semantics are exactly those of the simple `paged_attention_bf16` launch in
//! [`super::attention`] (causal over the paged cache, cached prefix, GQA, any
//! mix of prompt chunks and decode tokens in one step, the layer's sliding
//! window and soft-cap as kernel arguments), and the host-side checks are the
//! same function ([`super::attention::check`]), so every block id the kernel
//! reads has been checked against the cache first.
//!
//! Invariants: head_dim is one of [`super::attention_path::FAST_HEAD_DIMS`]
//! (the caller falls back to the simple kernel otherwise); the grid is sized
//! from the step's real longest query (computed here from `cu_seqlens_q`,
//! not trusted from `max_query_len`), so every row of q is written. The grid
//! depends on that length, so this launch belongs to eager prefill steps,
//! not to captured decode graphs. With a window, a query tile reads only the
//! key tiles its rows' windows reach (at most `window + 64` keys past the
//! tile's first row's first key), whatever the context length.
//!
//! Costs: one launch; no device memory besides the output; grid
//! `(ceil(max_query_len / 64), num_seqs, num_heads)` blocks of 128 threads,
//! each reading its Q tile once and every key its rows see once (K and V
//! through L2, once per query head); [`smem_bytes`] of dynamic shared memory
//! per block (18 KB at head_dim 64, 35 KB at 128, 67.5 KB at 256, the last
//! past the 48 KB default, raised by [`configure`] when the module loads).
//! O(num_seqs) host work for the grid size.

use super::attention::{check, window_arg};
use super::attention_path::FAST_HEAD_DIMS;
use super::storage::{CudaKvCache, CudaStep, CudaTensor};
use super::CudaBackend;
use crate::{AttentionParams, ForwardContext, KernelError, Result};
use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaFunction, LaunchConfig};
use std::collections::HashMap;

/// Query rows per block (must match `PF_BLOCK_M` in attention_prefill.cu).
const BLOCK_M: usize = 64;
/// Threads per block (must match `PF_THREADS`).
const THREADS: u32 = 128;
/// Rows of shared memory per block (must match `PF_SMEM_ROWS`), each
/// `head_dim + PAD` bf16 (`PF_PAD`).
const SMEM_ROWS: usize = 128;
const PAD: usize = 8;
/// Largest grid y/z dimension.
const MAX_GRID_YZ: usize = 65_535;

/// The entry point for `head_dim` and the cache's element type (`fp8`:
/// FP8 bytes, else bf16), if the kernel is instantiated for them.
fn kernel_name(head_dim: usize, fp8: bool) -> Option<&'static str> {
    Some(match (fp8, head_dim) {
        (false, 64) => "prefill_attention_bf16_hd64",
        (false, 128) => "prefill_attention_bf16_hd128",
        (false, 256) => "prefill_attention_bf16_hd256",
        (true, 64) => "prefill_attention_fp8_hd64",
        (true, 128) => "prefill_attention_fp8_hd128",
        (true, 256) => "prefill_attention_fp8_hd256",
        _ => return None,
    })
}

/// Dynamic shared memory of one block at `head_dim`.
pub(crate) fn smem_bytes(head_dim: usize) -> usize {
    SMEM_ROWS * (head_dim + PAD) * 2
}

/// Lets every instantiation use the dynamic shared memory it needs (past
/// 48 KB only at head_dim 256: 67,584 bytes, within every GPU that runs
/// these kernels at all, sm_80 and newer, which have 99 KB or more).
pub(crate) fn configure(kernels: &HashMap<&'static str, CudaFunction>) -> Result<()> {
    raise_smem(
        kernels,
        FAST_HEAD_DIMS
            .iter()
            .flat_map(|&h| [(h, false), (h, true)])
            .map(|(hd, fp8)| (kernel_name(hd, fp8), smem_bytes(hd))),
    )
}

/// Raises the dynamic shared memory limit of each `(kernel, bytes)` whose
/// block needs more than the 48 KB default (both prefill kernels).
pub(crate) fn raise_smem(
    kernels: &HashMap<&'static str, CudaFunction>,
    entries: impl IntoIterator<Item = (Option<&'static str>, usize)>,
) -> Result<()> {
    for (name, bytes) in entries {
        // Every listed kernel is loaded (the module load checks that).
        let Some((name, f)) = name.and_then(|n| kernels.get(n).map(|f| (n, f))) else {
            continue;
        };
        if bytes > 48 * 1024 {
            f.set_attribute(
                CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
            .map_err(|e| {
                KernelError::Device(format!(
                    "{name} needs {bytes} bytes of shared memory per block: {e:?}"
                ))
            })?;
        }
    }
    Ok(())
}

/// Whether the tiled kernel takes this step's attention: a head_dim of
/// [`FAST_HEAD_DIMS`] and a grid within CUDA's limits (any query group, any
/// window or soft-cap). The caller checks that some query is longer than one.
pub(crate) fn supported(ctx: &ForwardContext, p: &AttentionParams) -> bool {
    kernel_name(p.head_dim, false).is_some()
        && ctx.num_seqs() <= MAX_GRID_YZ
        && p.num_heads <= MAX_GRID_YZ
}

/// `v` as a 32-bit grid dimension.
pub(crate) fn u32_of(v: usize, op: &'static str) -> Result<u32> {
    u32::try_from(v).map_err(|_| KernelError::Shape {
        op,
        detail: format!("{v} does not fit in 32 bits"),
    })
}

/// `v` as a 32-bit kernel argument.
pub(crate) fn i32_of(v: usize, op: &'static str) -> Result<i32> {
    i32::try_from(v).map_err(|_| KernelError::Shape {
        op,
        detail: format!("{v} does not fit in 32 bits"),
    })
}

/// Launches a prefill kernel, the tiled one or the grouped one (one
/// parameter list: `PF_ARGS` and `PFM_ARGS`), on grid `cfg` over sequences
/// `first..` of the step (the step's arrays from sequence `first` on; q and
/// y rows stay absolute). The caller has run [`check`] and sized the grid.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch(
    b: &CudaBackend,
    kernel: &'static str,
    cfg: LaunchConfig,
    y: &mut CudaTensor,
    q: &CudaTensor,
    cache: &CudaKvCache,
    step: &CudaStep,
    p: &AttentionParams,
    first: usize,
) -> Result<()> {
    let op = "prefill_attention";
    let mbps = step.ctx.max_blocks_per_seq;
    let (cu_q, ctx_lens, tables) = (
        step.view_from(step.cu_seqlens_q, first),
        step.view_from(step.context_lens, first),
        step.view_from(step.block_tables_of(p.kv_group), first * mbps),
    );
    let (window, softcap) = (window_arg(p), p.softcap.unwrap_or(0.0));
    let (mbps, bs, nh, nkv) = (
        i32_of(mbps, op)?,
        i32_of(cache.shape.block_size, op)?,
        i32_of(p.num_heads, op)?,
        i32_of(p.num_kv_heads, op)?,
    );
    b.dev
        .launch(kernel)?
        .out(y.bf16_mut(op)?)
        .arg(q.bf16(op)?)
        .arg(&cache.k)
        .arg(&cache.v)
        .arg(&cache.scales)
        .arg(&cu_q)
        .arg(&ctx_lens)
        .arg(&tables)
        .arg(&mbps)
        .arg(&bs)
        .arg(&nh)
        .arg(&nkv)
        .arg(&p.scale)
        .arg(&window)
        .arg(&softcap)
        .run(cfg)
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
    let Some(kernel) = kernel_name(p.head_dim, cache.fp8) else {
        return Err(KernelError::Unsupported(format!(
            "tiled prefill attention with head_dim {} (takes {FAST_HEAD_DIMS:?})",
            p.head_dim
        )));
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
        shared_mem_bytes: smem_bytes(p.head_dim) as u32,
    };
    launch(b, kernel, cfg, &mut y, q, cache, step, p, 0)?;
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_match_the_kernel_source() {
        let src = include_str!("kernels/attention_prefill.cu");
        assert!(src.contains(&format!("#define PF_BLOCK_M {BLOCK_M}\n")));
        assert!(src.contains(&format!("#define PF_THREADS {THREADS}\n")));
        assert!(src.contains(&format!("#define PF_SMEM_ROWS {SMEM_ROWS}\n")));
        assert!(src.contains(&format!("#define PF_PAD {PAD}\n")));
        for hd in FAST_HEAD_DIMS {
            for (fp8, kv) in [(false, "bf16"), (true, "fp8")] {
                let name = kernel_name(hd, fp8).expect("instantiated");
                assert!(src.contains(&format!("{name}(PF_ARGS({kv}))")), "{name}");
                assert!(super::super::compile::KERNELS.contains(&name), "{name}");
            }
        }
        assert_eq!(smem_bytes(128), 34_816);
        assert_eq!(smem_bytes(256), 67_584);
        for hd in [32, 80, 96, 192] {
            assert!(kernel_name(hd, false).is_none());
            assert!(kernel_name(hd, true).is_none());
        }
    }
}
