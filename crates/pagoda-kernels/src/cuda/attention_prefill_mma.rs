//! Grouped prefill attention: the launch of
//! `prefill_mma_attention_{bf16,fp8}_hd{64,128,256}` (see
//! `kernels/attention_prefill_mma.cu`; one kernel templated on the cache's
//! element type), the default kernel for steps whose longest query is more
//! than one token, over bf16 and FP8 E4M3 caches alike. An FP8 tile is
//! fetched as raw bytes with cp.async (double-buffered like bf16) and
//! widened to bf16 in shared memory before its math; the layer's k_scale
//! and v_scale (the cache's device buffer) fold into the scores' scale and
//! the output's normalization.
//!
//! Semantics are exactly those of the tiled kernel
//! ([`super::attention_prefill`]) and of the simple `paged_attention_bf16`
//! launch (causal over the paged cache, cached prefix, GQA, any mix of
//! prompt chunks and decode tokens in one step, the layer's sliding window
//! and soft-cap as kernel arguments); the host-side checks are the same
//! function ([`super::attention::check`], which also makes `num_heads` a
//! multiple of `num_kv_heads`), so every block id the kernel reads has been
//! checked against the cache first.
//!
//! Invariants: head_dim is one of [`FAST_HEAD_DIMS`]; the grid is sized from
//! the step's real longest query (computed here from `cu_seqlens_q`, not
//! trusted from `max_query_len`), so every row of q is written. As for the
//! tiled kernel, the grid depends on that length, so this launch belongs to
//! eager prefill steps, not to captured decode graphs. With a window, a
//! block reads only the key tiles its rows' windows reach.
//!
//! Costs: one launch; no device memory besides the output; grid
//! `(ceil(max_query_len * group / block_m), num_seqs, num_kv_heads)` blocks
//! of 128 threads (`group` = query heads per kv head, `block_m` 128 packed
//! rows, 64 at head_dim 256), each reading its Q rows once and every key its
//! rows see once for all heads of its group; [`smem_bytes`] of dynamic
//! shared memory per block (bf16: 54 KB at head_dim 64, 68 KB at 128, 99 KB
//! at 256; FP8 a little less), raised past the 48 KB default by
//! [`configure`] when the module loads. O(num_seqs) host work for the grid
//! size.

use super::attention_path::FAST_HEAD_DIMS;
use super::attention_prefill::{i32_of, launch, raise_smem, u32_of};
use super::storage::{CudaKvCache, CudaStep, CudaTensor};
use super::CudaBackend;
use crate::{AttentionParams, ForwardContext, KernelError, Result};
use cudarc::driver::{CudaFunction, LaunchConfig};
use std::collections::HashMap;

/// Threads per block (must match `PFM_THREADS`).
const THREADS: u32 = 128;
/// Padding of each shared-memory row in bf16 (must match `PFM_PAD`).
const PAD: usize = 8;
/// Largest grid y/z dimension.
const MAX_GRID_YZ: usize = 65_535;

/// The entry point for `head_dim` over a bf16 (or, `fp8`, an FP8 E4M3)
/// cache, if the kernel is instantiated for it.
fn kernel_name(head_dim: usize, fp8: bool) -> Option<&'static str> {
    Some(match (fp8, head_dim) {
        (false, 64) => "prefill_mma_attention_bf16_hd64",
        (false, 128) => "prefill_mma_attention_bf16_hd128",
        (false, 256) => "prefill_mma_attention_bf16_hd256",
        (true, 64) => "prefill_mma_attention_fp8_hd64",
        (true, 128) => "prefill_mma_attention_fp8_hd128",
        (true, 256) => "prefill_mma_attention_fp8_hd256",
        _ => return None,
    })
}

/// Packed query rows per block and keys per tile at `head_dim` (must match
/// `PfmShape` in the kernel source: 4 warps of 32 rows, 16 at head_dim 256;
/// 64 keys at head_dim 64, else 32).
fn tile(head_dim: usize) -> (usize, usize) {
    let block_m = if head_dim <= 128 { 128 } else { 64 };
    let block_n = if head_dim <= 64 { 64 } else { 32 };
    (block_m, block_n)
}

/// Dynamic shared memory of one block at `head_dim`: the Q rows and two
/// stages of K and V tiles, each row `head_dim + PAD` bf16; over an FP8
/// cache (`fp8`), one bf16 stage and two stages of raw K and V bytes
/// (`head_dim` per row).
pub(crate) fn smem_bytes(head_dim: usize, fp8: bool) -> usize {
    let (m, n) = tile(head_dim);
    if fp8 {
        (m + 2 * n) * (head_dim + PAD) * 2 + 4 * n * head_dim
    } else {
        (m + 4 * n) * (head_dim + PAD) * 2
    }
}

/// Lets every instantiation use the dynamic shared memory it needs (all
/// past 48 KB, at most 101,376 bytes = 99 KB: within every GPU that runs
/// these kernels at all, sm_80 and newer, whose opt-in limit per block is
/// 99 KB (sm_86/89), 163 KB (sm_80) or 227 KB (sm_90)).
pub(crate) fn configure(kernels: &HashMap<&'static str, CudaFunction>) -> Result<()> {
    raise_smem(
        kernels,
        FAST_HEAD_DIMS
            .into_iter()
            .flat_map(|hd| [(hd, false), (hd, true)])
            .map(|(hd, fp8)| (kernel_name(hd, fp8), smem_bytes(hd, fp8))),
    )
}

/// Whether the grouped kernel takes this step's attention: a head_dim of
/// [`FAST_HEAD_DIMS`], a whole query group, and a grid within CUDA's limits
/// (any window or soft-cap). The caller checks that some query is longer
/// than one.
pub(crate) fn supported(ctx: &ForwardContext, p: &AttentionParams) -> bool {
    kernel_name(p.head_dim, false).is_some()
        && p.num_kv_heads > 0
        && p.num_heads.is_multiple_of(p.num_kv_heads)
        && ctx.num_seqs() <= MAX_GRID_YZ
        && p.num_kv_heads <= MAX_GRID_YZ
}

/// Causal paged attention on tensor cores, K/V read once per query group,
/// of sequences `first..` of the step into their rows of `y` (rows of earlier sequences are left alone: a mixed step's
/// leading decodes go to the split-K kernel instead). The kernel sees the
/// step's arrays from sequence `first` on; q rows stay absolute.
pub(crate) fn prefill_attention_mma_into(
    b: &CudaBackend,
    q: &CudaTensor,
    cache: &CudaKvCache,
    step: &CudaStep,
    p: &AttentionParams,
    first: usize,
    y: &mut CudaTensor,
) -> Result<()> {
    let op = "prefill_attention_mma";
    let Some(kernel) = kernel_name(p.head_dim, cache.fp8) else {
        return Err(KernelError::Unsupported(format!(
            "grouped prefill attention with head_dim {} (takes {FAST_HEAD_DIMS:?})",
            p.head_dim
        )));
    };
    let ctx = &step.ctx;
    if first > ctx.num_seqs() || y.rows != q.rows || y.cols != q.cols {
        return Err(KernelError::Shape {
            op,
            detail: format!(
                "sequences from {first} of {}, q [{}, {}], y [{}, {}]",
                ctx.num_seqs(),
                q.rows,
                q.cols,
                y.rows,
                y.cols
            ),
        });
    }
    let num_seqs = ctx.num_seqs() - first;
    let longest = (first..ctx.num_seqs())
        .map(|i| ctx.query_len(i))
        .max()
        .unwrap_or(0);
    if y.numel() == 0 || p.num_heads == 0 || longest == 0 {
        return Ok(());
    }

    let group = p.num_heads / p.num_kv_heads;
    let grid_y = u32_of(num_seqs, op)?;
    let grid_z = u32_of(p.num_kv_heads, op)?;
    if grid_y > 65_535 || grid_z > 65_535 {
        return Err(KernelError::Unsupported(format!(
            "{num_seqs} sequences x {} kv heads exceed the launch grid",
            p.num_kv_heads
        )));
    }
    // The kernel indexes packed rows (query_len * group) in 32 bits.
    let packed = longest
        .checked_mul(group)
        .ok_or_else(|| KernelError::Shape {
            op,
            detail: format!("{longest} tokens x {group} heads overflow"),
        })?;
    i32_of(packed, op)?;
    let (block_m, _) = tile(p.head_dim);
    let cfg = LaunchConfig {
        grid_dim: (u32_of(packed.div_ceil(block_m), op)?, grid_y, grid_z),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: smem_bytes(p.head_dim, cache.fp8) as u32,
    };
    launch(b, kernel, cfg, y, q, cache, step, p, first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_match_the_kernel_source() {
        let src = include_str!("kernels/attention_prefill_mma.cu");
        assert!(src.contains(&format!("#define PFM_THREADS {THREADS}\n")));
        assert!(src.contains(&format!("#define PFM_PAD {PAD}\n")));
        assert!(src.contains("#define PFM_WARPS 4\n"));
        assert!(src.contains("static constexpr int MT = HD <= 128 ? 2 : 1;"));
        assert!(src.contains("static constexpr int BLOCK_N = HD <= 64 ? 64 : 32;"));
        assert!(src.contains("static constexpr int SMEM_ROWS = BLOCK_M + 4 * BLOCK_N;"));
        for hd in FAST_HEAD_DIMS {
            for (fp8, elem) in [(false, "bf16"), (true, "fp8")] {
                let name = kernel_name(hd, fp8).expect("instantiated");
                assert!(src.contains(&format!("{name}(PFM_ARGS({elem}))")), "{name}");
                assert!(super::super::compile::KERNELS.contains(&name), "{name}");
                // Within the opt-in limit of sm_86/89 (99 KB), and no FP8
                // block needs more than its bf16 twin.
                assert!(smem_bytes(hd, fp8) <= 101_376, "{name}");
            }
            assert!(smem_bytes(hd, true) <= smem_bytes(hd, false));
        }
        assert_eq!(tile(64), (128, 64));
        assert_eq!(tile(128), (128, 32));
        assert_eq!(tile(256), (64, 32));
        assert_eq!(smem_bytes(64, false), 55_296);
        assert_eq!(smem_bytes(128, false), 69_632);
        assert_eq!(smem_bytes(256, false), 101_376);
        assert_eq!(smem_bytes(64, true), 53_248);
        assert_eq!(smem_bytes(128, true), 68_608);
        assert_eq!(smem_bytes(256, true), 100_352);
        for hd in [32, 80, 96, 192] {
            assert!(kernel_name(hd, false).is_none());
            assert!(kernel_name(hd, true).is_none());
        }
    }
}
