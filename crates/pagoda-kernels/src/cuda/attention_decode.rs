//! Paged attention for decode steps (every sequence has one query token):
//! the split-K, GQA-aware kernels of `kernels/attention_decode.cu` and
//! `kernels/attention_decode_mma.cu`.
//!
//! Owns the choice of kernel for (cache element type, head_dim, group)
//! ([`partition_kernel`]) and the two launches: the partition kernel over
//! (sequence, kv head, partition of [`PARTITION`] tokens), each block
//! attending all query heads of its kv head's group, then
//! `paged_decode_reduce_bf16` over (sequence, head) to merge the partitions
//! of sequences that have several. A bf16 cache runs
//! `paged_decode_attention_bf16_hd{64,128,256}_g{1,2,4,8}` (CUDA cores), an
//! FP8 cache `paged_decode_attention_fp8_tc_hd{64,128,256}` (tensor cores,
//! every group of 1..=8), or the CUDA-core
//! `paged_decode_attention_fp8_hd*_g*` where the backend is told to
//! ([`DECODE_KERNEL_ENV`] = `cores`, or `CudaBackend::force_core_decode`, to
//! compare the two). All take the same arguments, grid and block, and write
//! the same partials, so the choice changes nothing else.
//! The layer's sliding window and soft-cap are kernel arguments.
//!
//! Invariants:
//! - Launch shapes and kernel arguments depend only on the step's shape
//!   (num_seqs, heads, head_dim, block_size, max_blocks_per_seq) and the
//!   layer's constant parameters (window, soft-cap, scale), never on context
//!   lengths, so a captured decode graph replays for any step of the same
//!   shape. [`partitions`] is `ceil(min(window, max_blocks_per_seq *
//!   block_size) / PARTITION)` (no window term without a window); blocks
//!   past a sequence's end exit at once.
//! - Token `i` is sequence `i` (checked: `cu_seqlens_q[i] == i`), and it
//!   attends cache positions `0..=context_lens[i]`, or only the last
//!   `window` of them: the partitions then start at the window's first
//!   position, so blocks before it are never read and a long context costs
//!   what its window costs.
//! - Scratch comes from the backend's pool (two f32 buffers of
//!   `num_seqs * num_heads * partitions * (head_dim + 2)` floats in all,
//!   only when `partitions > 1`); no other device allocation.
//! - [`supported`] is false for head_dims outside
//!   [`super::attention_path::FAST_HEAD_DIMS`], groups past 8 and steps with
//!   a query of another length; callers then use the general kernel of
//!   [`super::attention`].
//!
//! Costs: each K/V byte a sequence's length reaches is read once per kv head
//! group with 16-byte loads; the partials add `2 * (head_dim + 2) * 4` bytes
//! per (sequence, head, partition) for multi-partition sequences (about 1%
//! of the K/V bytes at head_dim 128, group 2). The kernel file's header has
//! the numbers at the Qwen3-0.6B shape.

use super::attention::{check, window_arg};
use super::storage::{CudaKvCache, CudaStep, CudaTensor};
use super::CudaBackend;
use crate::{AttentionParams, ForwardContext, KernelError, Result};
use cudarc::driver::LaunchConfig;

/// Tokens per partition (must match `DEC_PARTITION` in attention_decode.cu).
pub(crate) const PARTITION: usize = 512;
/// Threads per partition block (must match `DEC_THREADS`).
const THREADS: u32 = 128;
/// Threads per reduce block.
const REDUCE_THREADS: u32 = 128;
/// Largest grid y/z dimension.
const MAX_GRID_YZ: usize = 65_535;

/// The partition kernel for `head_dim`, a group of `group` query heads per
/// kv head (groups 3, 5, 6, 7 run the next instantiation up, masked) and
/// the cache's element type (`fp8`: FP8 bytes, else bf16).
fn kernel_name(head_dim: usize, group: usize, fp8: bool) -> Option<&'static str> {
    let g = match group {
        1 => 1,
        2 => 2,
        3 | 4 => 4,
        5..=8 => 8,
        _ => return None,
    };
    Some(match (fp8, head_dim, g) {
        (false, 64, 1) => "paged_decode_attention_bf16_hd64_g1",
        (false, 64, 2) => "paged_decode_attention_bf16_hd64_g2",
        (false, 64, 4) => "paged_decode_attention_bf16_hd64_g4",
        (false, 64, 8) => "paged_decode_attention_bf16_hd64_g8",
        (false, 128, 1) => "paged_decode_attention_bf16_hd128_g1",
        (false, 128, 2) => "paged_decode_attention_bf16_hd128_g2",
        (false, 128, 4) => "paged_decode_attention_bf16_hd128_g4",
        (false, 128, 8) => "paged_decode_attention_bf16_hd128_g8",
        (false, 256, 1) => "paged_decode_attention_bf16_hd256_g1",
        (false, 256, 2) => "paged_decode_attention_bf16_hd256_g2",
        (false, 256, 4) => "paged_decode_attention_bf16_hd256_g4",
        (false, 256, 8) => "paged_decode_attention_bf16_hd256_g8",
        (true, 64, 1) => "paged_decode_attention_fp8_hd64_g1",
        (true, 64, 2) => "paged_decode_attention_fp8_hd64_g2",
        (true, 64, 4) => "paged_decode_attention_fp8_hd64_g4",
        (true, 64, 8) => "paged_decode_attention_fp8_hd64_g8",
        (true, 128, 1) => "paged_decode_attention_fp8_hd128_g1",
        (true, 128, 2) => "paged_decode_attention_fp8_hd128_g2",
        (true, 128, 4) => "paged_decode_attention_fp8_hd128_g4",
        (true, 128, 8) => "paged_decode_attention_fp8_hd128_g8",
        (true, 256, 1) => "paged_decode_attention_fp8_hd256_g1",
        (true, 256, 2) => "paged_decode_attention_fp8_hd256_g2",
        (true, 256, 4) => "paged_decode_attention_fp8_hd256_g4",
        (true, 256, 8) => "paged_decode_attention_fp8_hd256_g8",
        _ => return None,
    })
}

/// The tensor-core FP8 partition kernel for `head_dim` (any group of 1..=8).
fn fp8_tc_kernel_name(head_dim: usize) -> Option<&'static str> {
    Some(match head_dim {
        64 => "paged_decode_attention_fp8_tc_hd64",
        128 => "paged_decode_attention_fp8_tc_hd128",
        256 => "paged_decode_attention_fp8_tc_hd256",
        _ => return None,
    })
}

/// The partition kernel a step runs: over an FP8 cache the tensor-core one
/// unless `cuda_cores` asks for the CUDA-core one, which a bf16 cache always
/// takes ([`kernel_name`]); `None` where neither takes (head_dim, group).
pub(crate) fn partition_kernel(
    head_dim: usize,
    group: usize,
    fp8: bool,
    cuda_cores: bool,
) -> Option<&'static str> {
    let cores = kernel_name(head_dim, group, fp8)?;
    if fp8 && !cuda_cores {
        fp8_tc_kernel_name(head_dim)
    } else {
        Some(cores)
    }
}

/// The environment variable that makes new backends run FP8-cache decode
/// attention on the CUDA-core kernel (value `cores`; anything else keeps the
/// tensor-core one).
pub const DECODE_KERNEL_ENV: &str = "PAGODA_DECODE_ATTENTION";

/// Whether [`DECODE_KERNEL_ENV`] asks for the CUDA-core FP8 kernel.
pub(crate) fn cores_from_env() -> bool {
    std::env::var(DECODE_KERNEL_ENV).is_ok_and(|v| v.trim().eq_ignore_ascii_case("cores"))
}

impl CudaBackend {
    /// The partition kernel a decode step of layer `p` runs on this backend
    /// (its cache element type and [`CudaBackend::force_core_decode`]), or
    /// `None` where no decode kernel takes the layer.
    pub fn decode_kernel_for(&self, p: &AttentionParams) -> Option<&'static str> {
        let group = p.num_heads / p.num_kv_heads.max(1);
        partition_kernel(p.head_dim, group, self.kv_fp8, self.core_decode())
    }
}

/// Partitions (the grid's z) of the widest span a query of this step can
/// see: the block table's width in tokens, or the window where narrower.
pub(crate) fn partitions(ctx: &ForwardContext, window: Option<usize>) -> usize {
    let width = ctx.max_blocks_per_seq * ctx.block_size;
    window
        .map_or(width, |w| w.min(width))
        .div_ceil(PARTITION)
        .max(1)
}

/// Whether the decode kernels take this step: a head_dim of
/// [`super::attention_path::FAST_HEAD_DIMS`], a group of 1..=8 query heads
/// per kv head, one query token per sequence, and a grid within CUDA's
/// limits.
pub(crate) fn supported(ctx: &ForwardContext, p: &AttentionParams) -> bool {
    p.num_kv_heads > 0
        && p.num_heads.is_multiple_of(p.num_kv_heads)
        && kernel_name(p.head_dim, p.num_heads / p.num_kv_heads, false).is_some()
        && ctx.num_tokens() == ctx.num_seqs()
        && ctx
            .cu_seqlens_q
            .iter()
            .enumerate()
            .all(|(i, &c)| c as usize == i)
        && partitions(ctx, p.window) <= MAX_GRID_YZ
        && p.num_heads <= MAX_GRID_YZ
}

fn i32_of(v: usize, op: &'static str) -> Result<i32> {
    i32::try_from(v).map_err(|_| KernelError::Shape {
        op,
        detail: format!("{v} does not fit in 32 bits"),
    })
}

/// Decode attention: `q` is `[num_seqs, num_heads * head_dim]`, one token
/// per sequence; returns the same shape. Errors as `attention` does, and
/// [`KernelError::Unsupported`] for a step [`supported`] rejects.
pub(crate) fn decode_attention(
    b: &CudaBackend,
    q: &CudaTensor,
    cache: &CudaKvCache,
    step: &CudaStep,
    p: &AttentionParams,
) -> Result<CudaTensor> {
    check(q, cache, step, p)?;
    if !supported(&step.ctx, p) {
        return Err(KernelError::Unsupported(format!(
            "decode attention with {p:?} over {} tokens in {} sequences",
            step.ctx.num_tokens(),
            step.ctx.num_seqs()
        )));
    }
    let mut y = b.output(q.rows, q.cols)?;
    decode_attention_into(b, q, cache, step, p, step.ctx.num_seqs(), &mut y)?;
    Ok(y)
}

/// The leading one-token queries of a mixed step the split-K kernel can
/// take, before the grouped prefill kernel runs the rest: how many of the
/// first sequences have a one-token query (the scheduler puts decodes
/// first), or 0 where there are none, every sequence is one (a pure decode
/// step), or the decode kernel does not take the layer. The decode kernel
/// reads row `i` of q for sequence `i`, which holds for such a prefix.
pub(crate) fn decode_prefix(ctx: &ForwardContext, p: &AttentionParams) -> usize {
    let n = ctx
        .cu_seqlens_q
        .windows(2)
        .take_while(|w| w[1].wrapping_sub(w[0]) == 1)
        .count();
    let takes = p.num_kv_heads > 0
        && p.num_heads.is_multiple_of(p.num_kv_heads)
        && kernel_name(p.head_dim, p.num_heads / p.num_kv_heads, false).is_some()
        && partitions(ctx, p.window) <= MAX_GRID_YZ
        && p.num_heads <= MAX_GRID_YZ;
    if takes && n < ctx.num_seqs() {
        n
    } else {
        0
    }
}

/// Decode attention of the first `seqs` sequences into rows `0..seqs` of
/// `y` (each has a one-token query at row `i` of q: a decode step, or the
/// [`decode_prefix`] of a mixed one); other rows of `y` are left alone.
pub(crate) fn decode_attention_into(
    b: &CudaBackend,
    q: &CudaTensor,
    cache: &CudaKvCache,
    step: &CudaStep,
    p: &AttentionParams,
    seqs: usize,
    y: &mut CudaTensor,
) -> Result<()> {
    let op = "decode_attention";
    if seqs == 0 {
        return Ok(());
    }
    let group = p.num_heads / p.num_kv_heads.max(1);
    let Some(name) = partition_kernel(p.head_dim, group, cache.fp8, b.core_decode()) else {
        return Err(KernelError::Unsupported(format!(
            "decode attention with {p:?}"
        )));
    };
    if seqs > step.ctx.num_seqs() || seqs > q.rows || y.rows != q.rows || y.cols != q.cols {
        return Err(KernelError::Shape {
            op,
            detail: format!(
                "{seqs} decode rows of a {}-sequence step, q [{}, {}], y [{}, {}]",
                step.ctx.num_seqs(),
                q.rows,
                q.cols,
                y.rows,
                y.cols
            ),
        });
    }
    // Slots and positions are 32-bit in the kernel.
    i32_of(cache.num_slots(), op)?;
    i32_of(step.ctx.max_blocks_per_seq * cache.shape.block_size, op)?;
    if y.numel() == 0 || seqs == 0 {
        return Ok(());
    }
    let parts = partitions(&step.ctx, p.window);
    let per_head = seqs * p.num_heads * parts;
    let (acc_len, ml_len) = if parts > 1 {
        (per_head * p.head_dim, per_head * 2)
    } else {
        (1, 1)
    };
    let mut part_acc = b.alloc_f32(acc_len)?;
    let mut part_ml = b.alloc_f32(ml_len)?;
    let (ctx_lens, tables) = (
        step.view(step.context_lens),
        step.view(step.block_tables_of(p.kv_group)),
    );
    let (mbps, bs, nh, nkv, hd, np) = (
        i32_of(step.ctx.max_blocks_per_seq, op)?,
        i32_of(cache.shape.block_size, op)?,
        i32_of(p.num_heads, op)?,
        i32_of(p.num_kv_heads, op)?,
        i32_of(p.head_dim, op)?,
        i32_of(parts, op)?,
    );
    let (window, softcap) = (window_arg(p), p.softcap.unwrap_or(0.0));
    let cfg = LaunchConfig {
        grid_dim: (i32_of(seqs, op)? as u32, nkv as u32, np as u32),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = b.dev.launch(name)?;
    l.out(y.bf16_mut(op)?)
        .out(&mut part_acc)
        .out(&mut part_ml)
        .arg(q.bf16(op)?)
        .arg(&cache.k)
        .arg(&cache.v)
        .arg(&cache.scales)
        .arg(&ctx_lens)
        .arg(&tables)
        .arg(&mbps)
        .arg(&bs)
        .arg(&nh)
        .arg(&nkv)
        .arg(&np)
        .arg(&p.scale)
        .arg(&window)
        .arg(&softcap);
    l.run(cfg)?;
    if parts == 1 {
        return Ok(());
    }
    let cfg = LaunchConfig {
        grid_dim: (seqs as u32, nh as u32, 1),
        block_dim: (REDUCE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = b.dev.launch("paged_decode_reduce_bf16")?;
    l.out(y.bf16_mut(op)?)
        .arg(&part_acc)
        .arg(&part_ml)
        .arg(&ctx_lens)
        .arg(&mbps)
        .arg(&bs)
        .arg(&nh)
        .arg(&hd)
        .arg(&np)
        .arg(&window);
    l.run(cfg)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_choice_covers_groups_up_to_eight() {
        for hd in super::super::attention_path::FAST_HEAD_DIMS {
            for (g, fp8) in (1..=8).flat_map(|g| [(g, false), (g, true)]) {
                let name = kernel_name(hd, g, fp8).expect("supported");
                assert_eq!(name.contains("_fp8_"), fp8, "{name}");
                let inst = match g {
                    1 => 1,
                    2 => 2,
                    3 | 4 => 4,
                    _ => 8,
                };
                assert!(name.ends_with(&format!("_hd{hd}_g{inst}")), "{name}");
                assert!(inst >= g);
                assert!(super::super::compile::KERNELS.contains(&name));
            }
            assert!(kernel_name(hd, 0, false).is_none());
            assert!(kernel_name(hd, 9, true).is_none());
        }
        for hd in [32, 80, 96, 192, 512] {
            assert!(kernel_name(hd, 2, false).is_none());
            assert!(kernel_name(hd, 2, true).is_none());
        }
    }

    #[test]
    fn fp8_caches_take_the_tensor_core_kernel_unless_told_otherwise() {
        for hd in super::super::attention_path::FAST_HEAD_DIMS {
            for g in 1..=8 {
                let tc = partition_kernel(hd, g, true, false).expect("supported");
                assert_eq!(tc, format!("paged_decode_attention_fp8_tc_hd{hd}"));
                assert!(super::super::compile::KERNELS.contains(&tc));
                for cores in [false, true] {
                    // A bf16 cache keeps the CUDA-core kernel either way.
                    assert_eq!(
                        partition_kernel(hd, g, false, cores),
                        kernel_name(hd, g, false)
                    );
                }
                assert_eq!(
                    partition_kernel(hd, g, true, true),
                    kernel_name(hd, g, true)
                );
            }
            // Shapes no decode kernel takes stay refused on both paths.
            for fp8 in [false, true] {
                assert!(partition_kernel(hd, 0, fp8, false).is_none());
                assert!(partition_kernel(hd, 9, fp8, false).is_none());
                assert!(partition_kernel(hd, 16, fp8, true).is_none());
            }
        }
        for hd in [32, 80, 96, 192] {
            assert!(partition_kernel(hd, 2, true, false).is_none());
            assert!(partition_kernel(hd, 2, false, false).is_none());
        }
    }

    #[test]
    fn tensor_core_kernel_shares_the_partition_and_warps() {
        // The tensor-core kernel reuses DEC_PARTITION, DEC_THREADS and
        // DEC_PARAMS of attention_decode.cu, so one launch fits both.
        let src = include_str!("kernels/attention_decode_mma.cu");
        assert!(!src.contains("#define DEC_PARTITION"));
        assert!(!src.contains("#define DEC_WARPS"));
        for hd in super::super::attention_path::FAST_HEAD_DIMS {
            let entry = format!("paged_decode_attention_fp8_tc_hd{hd}(DEC_PARAMS(fp8))");
            assert!(src.contains(&entry), "{entry}");
        }
    }

    #[test]
    fn decode_prefix_is_the_leading_one_token_queries_of_a_mixed_step() {
        let ctx = |q: &[u32]| {
            let mut cu = vec![0u32];
            for &n in q {
                cu.push(cu.last().unwrap() + n);
            }
            ForwardContext {
                block_size: 16,
                max_blocks_per_seq: 8,
                context_lens: vec![5; q.len()],
                seq_lens: q.iter().map(|n| 5 + n).collect(),
                cu_seqlens_q: cu,
                ..Default::default()
            }
        };
        let p = AttentionParams::causal(32, 8, 128);
        assert_eq!(decode_prefix(&ctx(&[1, 1, 1, 40, 1]), &p), 3);
        assert_eq!(decode_prefix(&ctx(&[1, 7]), &p), 1);
        // No decodes first, or nothing but decodes: no split.
        assert_eq!(decode_prefix(&ctx(&[40, 1, 1]), &p), 0);
        assert_eq!(decode_prefix(&ctx(&[1, 1, 1]), &p), 0);
        // A layer the decode kernel does not take (a group of 16, head_dim 96).
        assert_eq!(
            decode_prefix(&ctx(&[1, 40]), &AttentionParams::causal(32, 2, 128)),
            0
        );
        assert_eq!(
            decode_prefix(&ctx(&[1, 40]), &AttentionParams::causal(8, 8, 96)),
            0
        );
    }

    #[test]
    fn partitions_cover_the_window_only() {
        let ctx = ForwardContext {
            block_size: 16,
            max_blocks_per_seq: 2048, // 32,768 tokens
            ..Default::default()
        };
        assert_eq!(partitions(&ctx, None), 64);
        assert_eq!(partitions(&ctx, Some(4096)), 8);
        assert_eq!(partitions(&ctx, Some(4097)), 9);
        assert_eq!(partitions(&ctx, Some(512)), 1);
        assert_eq!(partitions(&ctx, Some(1)), 1);
        assert_eq!(partitions(&ctx, Some(1 << 40)), 64);
        let narrow = ForwardContext {
            max_blocks_per_seq: 3,
            ..ctx
        };
        assert_eq!(partitions(&narrow, Some(4096)), 1);
    }

    #[test]
    fn partition_size_matches_the_kernel_source() {
        let src = include_str!("kernels/attention_decode.cu");
        assert!(src.contains(&format!("#define DEC_PARTITION {PARTITION}\n")));
        assert!(src.contains(&format!("#define DEC_WARPS {}\n", THREADS / 32)));
    }
}
