//! Paged attention for decode steps (every sequence has one query token):
//! the split-K, GQA-aware kernels of `kernels/attention_decode.cu` and
//! `kernels/attention_decode_mma.cu`.
//!
//! Owns the choice of kernel for (cache element type, head_dim, group)
//! ([`partition_kernel`]), of the partition size ([`partition_size`]) and
//! the launch of the partition kernel over
//! (sequence, kv head, partition of 64 to [`MAX_PARTITION`] tokens), each block
//! attending all query heads of its kv head's group. Where the step splits
//! finer than [`MAX_PARTITION`] (small batches), in sequences of several
//! partitions the block that finishes last merges them (counted in the
//! backend's [`MERGE_COUNTERS`] counters, one per (sequence, kv head));
//! otherwise (512-token partitions, grids of more pairs than the counters,
//! or when told to: [`CudaBackend::set_separate_decode_merge`]) a second
//! launch `paged_decode_reduce_bf16` over (sequence, head) does (on an
//! H200, Qwen3-0.6B shape, 1,000-token contexts: merging in the kernel took
//! batch 1 from 1.074 to 1.029 ms a step and batch 8 from 1.499 to 1.473,
//! but batch 64, whose partitions are 512 tokens, from 3.779 to 3.846).
//! A bf16 cache runs
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
//!   block_size) / part)` (no window term without a window); blocks past a
//!   sequence's end exit at once.
//! - The partition `part` is [`MAX_PARTITION`] unless the step has too few
//!   (sequence, kv head) pairs to fill the GPU: [`partition_size`] halves it,
//!   down to [`MIN_PARTITION`], while `num_seqs * num_kv_heads * (512 /
//!   part)` is under 1.5 blocks per multiprocessor ([`BLOCKS_PER_SM_X2`];
//!   batch 1 with 8 kv heads at a 1,000-token context: 16 blocks at 512,
//!   128 at 64).
//!   Finer partitions need more partials; while the step memory warms up any
//!   amount is taken (the profiling steps measure it), and once it is frozen
//!   a step splits only as far as the largest partials of the warm-up (or
//!   [`MAX_SPLIT_FLOATS`], the arena's fixed slack, where larger), so a
//!   later small step never asks the arena for more than it was sized for.
//! - Token `i` is sequence `i` (checked: `cu_seqlens_q[i] == i`), and it
//!   attends cache positions `0..=context_lens[i]`, or only the last
//!   `window` of them: the partitions then start at the window's first
//!   position, so blocks before it are never read and a long context costs
//!   what its window costs.
//! - The merge counters are zero before and after every launch (the merging
//!   block resets its own), so a graph replays with them as captured; the
//!   host never touches them after creating them.
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

/// Every partition size the kernels take, ascending, each half the next.
pub const PARTITION_SIZES: [usize; 4] = [64, 128, 256, 512];
/// The largest partition in tokens (must match `DEC_PARTITION` in
/// attention_decode.cu, which sizes the kernels' shared memory by it).
pub(crate) const MAX_PARTITION: usize = PARTITION_SIZES[PARTITION_SIZES.len() - 1];
/// The smallest partition [`partition_size`] chooses.
pub(crate) const MIN_PARTITION: usize = PARTITION_SIZES[0];
/// A step splits contexts finer while `num_seqs * num_kv_heads * (512 /
/// part)` is under `BLOCKS_PER_SM_X2 / 2` blocks per multiprocessor (1.5:
/// on an H200 at the Qwen3-0.6B shape, 1,000-token contexts, the best sizes
/// measured were 64 at batch 1, 128 at 4-8, 256 at 16 and 512 from 32,
/// which this reproduces; 2 took 256 at batch 32, 7% slower than 512).
const BLOCKS_PER_SM_X2: usize = 3;
/// f32 partials (`num_seqs * num_heads * partitions * (head_dim + 2)`) a
/// finer split may always take once the step memory is frozen: 4 MiB, the
/// step arena's fixed slack beyond its profiled need.
const MAX_SPLIT_FLOATS: usize = 1 << 20;
/// The environment variable that fixes the partition of new backends (one
/// of [`PARTITION_SIZES`], or `auto`: chosen by the step's shape).
pub const PARTITION_ENV: &str = "PAGODA_DECODE_PARTITION";
/// Threads per partition block (must match `DEC_THREADS`).
const THREADS: u32 = 128;
/// Threads per reduce block.
const REDUCE_THREADS: u32 = 128;
/// Merge counters the backend holds (128 KiB): a step of up to this many
/// (sequence, kv head) pairs merges its partitions in the partition
/// kernel (batch 4,096 at 8 kv heads), a larger one in a second launch.
pub(crate) const MERGE_COUNTERS: usize = 1 << 15;
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
/// attention on the CUDA-core kernel (value `cores`; `auto` or `mma` keeps
/// the tensor-core one; any other value is an error).
pub const DECODE_KERNEL_ENV: &str = "PAGODA_DECODE_ATTENTION";

/// The environment variable that makes new backends merge split decode
/// attention in a second launch (value `separate`; `auto` or `fused`
/// merges in the partition kernel; any other value is an error), to compare
/// the two.
pub const DECODE_MERGE_ENV: &str = "PAGODA_DECODE_MERGE";

/// Whether [`DECODE_MERGE_ENV`] asks for the separate merge launch.
pub(crate) fn separate_merge_from_env() -> Result<bool> {
    let c = [("auto", false), ("fused", false), ("separate", true)];
    crate::knob::choice(DECODE_MERGE_ENV, &c, false)
}

/// Whether [`DECODE_KERNEL_ENV`] asks for the CUDA-core FP8 kernel.
pub(crate) fn cores_from_env() -> Result<bool> {
    let c = [("auto", false), ("mma", false), ("cores", true)];
    crate::knob::choice(DECODE_KERNEL_ENV, &c, false)
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

/// `n` where the kernels take partitions of `n` tokens, else an error
/// naming the sizes they take.
pub(crate) fn check_partition(n: usize) -> Result<usize> {
    if PARTITION_SIZES.contains(&n) {
        Ok(n)
    } else {
        Err(KernelError::Unsupported(format!(
            "a decode attention partition of {n} tokens (the kernels take {PARTITION_SIZES:?})"
        )))
    }
}

/// [`PARTITION_ENV`]: `None` when unset or `auto`, an error for a value
/// that is neither `auto` nor one of [`PARTITION_SIZES`].
pub(crate) fn partition_from_env() -> Result<Option<usize>> {
    match std::env::var(PARTITION_ENV) {
        Err(_) => Ok(None),
        Ok(v) if v.trim().eq_ignore_ascii_case("auto") || v.trim().is_empty() => Ok(None),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) => check_partition(n).map(Some),
            Err(_) => Err(KernelError::Unsupported(format!(
                "{PARTITION_ENV}={v:?}: expected auto or one of {PARTITION_SIZES:?}"
            ))),
        },
    }
}

/// The widest span a query of this step can see: the block table's width
/// in tokens, or the window where narrower.
fn span(ctx: &ForwardContext, window: Option<usize>) -> usize {
    let width = ctx.max_blocks_per_seq * ctx.block_size;
    window.map_or(width, |w| w.min(width)).max(1)
}

/// Partitions of `part` tokens (the grid's z) over the widest span a query
/// of this step can see.
pub(crate) fn partitions(ctx: &ForwardContext, window: Option<usize>, part: usize) -> usize {
    span(ctx, window).div_ceil(part)
}

/// f32 partials of `seqs` sequences of layer `p` split into `parts`.
fn split_floats(p: &AttentionParams, seqs: usize, parts: usize) -> usize {
    seqs * p.num_heads * parts * (p.head_dim + 2)
}

/// Tokens per partition for `seqs` one-token queries of layer `p` on a GPU
/// of `sms` multiprocessors, splitting finer only while the partials stay
/// within `max_floats` (see the module docs): a function of the step's
/// shape and constants only.
pub(crate) fn partition_size(
    ctx: &ForwardContext,
    p: &AttentionParams,
    seqs: usize,
    sms: usize,
    max_floats: usize,
) -> usize {
    let mut part = MAX_PARTITION;
    while part > MIN_PARTITION
        && 2 * seqs * p.num_kv_heads * (MAX_PARTITION / part) < BLOCKS_PER_SM_X2 * sms
    {
        let next = part / 2;
        let parts = partitions(ctx, p.window, next);
        if parts > MAX_GRID_YZ || split_floats(p, seqs, parts) > max_floats {
            break;
        }
        part = next;
    }
    part
}

impl CudaBackend {
    /// Tokens per partition a decode step of `seqs` sequences of layer `p`
    /// runs with: [`CudaBackend::set_decode_partition`]'s where set, else
    /// chosen by the step's shape ([`partition_size`], within the partials
    /// the module docs allow).
    pub fn decode_partition_for(
        &self,
        ctx: &ForwardContext,
        p: &AttentionParams,
        seqs: usize,
    ) -> usize {
        if let Some(n) = self.decode_partition() {
            return n;
        }
        let max_floats = if self.step_memory_frozen() {
            self.split_floats_seen().max(MAX_SPLIT_FLOATS)
        } else {
            usize::MAX
        };
        partition_size(ctx, p, seqs, self.multiprocessors(), max_floats)
    }
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
        && partitions(ctx, p.window, MAX_PARTITION) <= MAX_GRID_YZ
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
        && partitions(ctx, p.window, MAX_PARTITION) <= MAX_GRID_YZ
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
    let part = b.decode_partition_for(&step.ctx, p, seqs);
    let parts = partitions(&step.ctx, p.window, part);
    if parts > MAX_GRID_YZ {
        return Err(KernelError::Shape {
            op,
            detail: format!("{parts} partitions of {part} tokens exceed the grid's {MAX_GRID_YZ}"),
        });
    }
    let per_head = seqs * p.num_heads * parts;
    if parts > 1 && !b.step_memory_frozen() {
        b.note_split_floats(split_floats(p, seqs, parts));
    }
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
    let (mbps, bs, nh, nkv, hd, np, psz) = (
        i32_of(step.ctx.max_blocks_per_seq, op)?,
        i32_of(cache.shape.block_size, op)?,
        i32_of(p.num_heads, op)?,
        i32_of(p.num_kv_heads, op)?,
        i32_of(p.head_dim, op)?,
        i32_of(parts, op)?,
        i32_of(part, op)?,
    );
    let (window, softcap) = (window_arg(p), p.softcap.unwrap_or(0.0));
    let cfg = LaunchConfig {
        grid_dim: (i32_of(seqs, op)? as u32, nkv as u32, np as u32),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // The last block merges where the split is finer than MAX_PARTITION (a
    // small batch: the second launch would cost as much as the attention)
    // and the counters cover the grid's (sequence, kv head) pairs; a null
    // pointer leaves the merge to the second launch.
    let fused = parts > 1
        && part < MAX_PARTITION
        && seqs * p.num_kv_heads <= MERGE_COUNTERS
        && !b.separate_decode_merge();
    let null = 0u64;
    let mut l = b.dev.launch(name)?;
    l.out(y.bf16_mut(op)?).out(&mut part_acc).out(&mut part_ml);
    if fused {
        // Written only by the kernels (see the module docs).
        l.arg(b.decode_counters());
    } else {
        l.arg(&null);
    }
    l.arg(q.bf16(op)?)
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
        .arg(&psz)
        .arg(&p.scale)
        .arg(&window)
        .arg(&softcap);
    l.run(cfg)?;
    if parts == 1 || fused {
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
        .arg(&psz)
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
        assert_eq!(partitions(&ctx, None, 512), 64);
        assert_eq!(partitions(&ctx, None, 64), 512);
        assert_eq!(partitions(&ctx, Some(4096), 512), 8);
        assert_eq!(partitions(&ctx, Some(4097), 512), 9);
        assert_eq!(partitions(&ctx, Some(4097), 128), 33);
        assert_eq!(partitions(&ctx, Some(512), 512), 1);
        assert_eq!(partitions(&ctx, Some(1), 512), 1);
        assert_eq!(partitions(&ctx, Some(1 << 40), 512), 64);
        let narrow = ForwardContext {
            max_blocks_per_seq: 3,
            ..ctx
        };
        assert_eq!(partitions(&narrow, Some(4096), 512), 1);
        assert_eq!(partitions(&narrow, Some(4096), 64), 1);
    }

    fn table_of(tokens: usize) -> ForwardContext {
        ForwardContext {
            block_size: 16,
            max_blocks_per_seq: tokens / 16,
            ..Default::default()
        }
    }

    #[test]
    fn small_batches_split_contexts_finer() {
        // Qwen3-0.6B / Llama-3.1-8B attention on 132 multiprocessors, a
        // 4,096-token table.
        let (ctx, sms) = (table_of(4096), 132);
        for heads in [16, 32] {
            let p = AttentionParams::causal(heads, 8, 128);
            let size = |seqs| partition_size(&ctx, &p, seqs, sms, usize::MAX);
            // The sizes measured fastest on an H200 (BLOCKS_PER_SM_X2).
            assert_eq!(size(1), 64);
            assert_eq!(size(4), 64);
            assert_eq!(size(8), 128);
            assert_eq!(size(16), 256);
            // 32 x 8 pairs already give 132 SMs two blocks each.
            assert_eq!(size(32), 512);
            assert_eq!(size(64), 512);
            assert_eq!(size(256), 512);
        }
        // One kv head: more splitting for the same batch.
        let mqa = AttentionParams::causal(8, 1, 128);
        assert_eq!(partition_size(&ctx, &mqa, 32, sms, usize::MAX), 64);
        assert_eq!(partition_size(&ctx, &mqa, 128, sms, usize::MAX), 256);
        assert_eq!(partition_size(&ctx, &mqa, 512, sms, usize::MAX), 512);
    }

    #[test]
    fn finer_splits_stay_within_the_scratch_bound() {
        let sms = 132;
        let p = AttentionParams::causal(16, 8, 128);
        for tokens in [512, 4096, 40_960, 131_072, 1 << 20] {
            let ctx = table_of(tokens);
            for seqs in [1, 2, 8, 33, 256] {
                for max_floats in [MAX_SPLIT_FLOATS, 1 << 24, usize::MAX] {
                    let part = partition_size(&ctx, &p, seqs, sms, max_floats);
                    assert!(PARTITION_SIZES.contains(&part));
                    let parts = partitions(&ctx, None, part);
                    assert!(parts <= MAX_GRID_YZ);
                    if part < MAX_PARTITION {
                        let floats = split_floats(&p, seqs, parts);
                        assert!(floats <= max_floats, "{tokens} tokens, {seqs} seqs: {part}");
                    }
                }
            }
        }
        // Batch 4 at an 8,192-token table: 64 takes 1.06 M floats, past the
        // fixed bound, so a frozen arena without a larger warm-up stops at 128.
        let size = |tokens, seqs, max| partition_size(&table_of(tokens), &p, seqs, sms, max);
        assert_eq!(size(8192, 4, usize::MAX), 64);
        assert_eq!(size(8192, 4, MAX_SPLIT_FLOATS), 128);
        // The default Qwen3 table (40,960 tokens) at batch 1 stops at 128.
        assert_eq!(size(40_960, 1, MAX_SPLIT_FLOATS), 128);
        // A window bounds the span, so the split goes down to 64 again.
        let windowed = AttentionParams {
            window: Some(4096),
            ..p
        };
        assert_eq!(
            partition_size(&table_of(40_960), &windowed, 1, sms, MAX_SPLIT_FLOATS),
            64
        );
    }

    #[test]
    fn partition_sizes_are_checked() {
        for n in PARTITION_SIZES {
            assert_eq!(check_partition(n).unwrap(), n);
        }
        for n in [0, 1, 32, 100, 1024] {
            assert!(check_partition(n).is_err());
        }
        // partition_size halves from the largest to the smallest.
        assert!(PARTITION_SIZES.windows(2).all(|w| 2 * w[0] == w[1]));
    }

    #[test]
    fn partition_size_matches_the_kernel_source() {
        let src = include_str!("kernels/attention_decode.cu");
        assert!(src.contains(&format!("#define DEC_PARTITION {MAX_PARTITION}\n")));
        assert!(src.contains(&format!("#define DEC_WARPS {}\n", THREADS / 32)));
    }
}
