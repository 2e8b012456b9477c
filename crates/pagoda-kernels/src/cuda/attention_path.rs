//! Which CUDA attention kernel takes a step: the one decision behind
//! `Backend::attention` on CUDA, a pure function of host data (the step's
//! [`ForwardContext`] and the layer's [`AttentionParams`]) so that it is
//! tested without a GPU.
//!
//! - [`AttentionKernel::SplitKDecode`] (`attention_decode.rs`): every
//!   sequence has exactly one query token.
//! - [`AttentionKernel::MmaPrefill`] (`attention_prefill_mma.rs`): any
//!   other step with a query longer than one token (prompt chunks, cached
//!   prefixes, decode tokens mixed in), K/V read once per query group. A
//!   mixed step's leading one-token queries (the scheduler puts decodes
//!   first) go to the split-K decode kernel in the same call
//!   (`attention_decode::decode_prefix`), into the same output.
//! - [`AttentionKernel::TiledPrefill`] (`attention_prefill.rs`): the same
//!   steps, one query head per block; taken only where the grouped kernel
//!   does not apply, or where the backend is told to prefer it
//!   ([`prefer_tiled`]: `PAGODA_PREFILL_ATTENTION=tiled`, or
//!   `CudaBackend::force_tiled_prefill`, to compare the two).
//! - [`AttentionKernel::General`] (`attention.rs`): what is left, i.e. a
//!   head_dim outside [`FAST_HEAD_DIMS`], a query group past 8 (decode), a
//!   grid past CUDA's limits, or a step whose `max_query_len` says one token
//!   while a sequence has more.
//!
//! Sliding windows and soft-capping are parameters of every kernel, so they
//! never change the choice.

use super::{attention_decode, attention_prefill, attention_prefill_mma};
use crate::{AttentionParams, ForwardContext};

/// Head dims the tiled prefill and split-K decode kernels are instantiated
/// for (Llama/Qwen/Mistral at 64 and 128, Gemma at 256). Other head dims
/// (32, 80, 96, 112 or 160 of some smaller or older models) run the general
/// kernel, which takes any head_dim up to 256. The decode kernel spreads a
/// K/V row over head_dim / 8 lanes, which must be a power of two from 8 (a
/// group of 8 heads) to 32; the prefill kernel needs a multiple of 16 whose
/// 16-byte row chunks split its 128 threads evenly. Each instantiation costs
/// compile time and module size, so a model that needs another one adds it
/// here, to both kernel files' entry points and to `compile::KERNELS`.
pub const FAST_HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// The kernel [`attention_kernel`] picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKernel {
    /// `paged_decode_attention_bf16_hd*_g*`, over an FP8 cache
    /// `paged_decode_attention_fp8_tc_hd*` (+ the partition merge).
    SplitKDecode,
    /// `prefill_mma_attention_{bf16,fp8}_hd*`: query heads of a kv head packed
    /// into one block, double-buffered K/V, on tensor cores.
    MmaPrefill,
    /// `prefill_attention_{bf16,fp8}_hd*` on tensor cores, one head per block.
    TiledPrefill,
    /// `paged_attention_{bf16,fp8}`, one block per (token, head).
    General,
}

/// The kernel the CUDA backend runs for this step and layer (after the
/// checks every path shares, which may still refuse the step).
pub fn attention_kernel(ctx: &ForwardContext, p: &AttentionParams) -> AttentionKernel {
    if ctx.max_query_len == 1 && attention_decode::supported(ctx, p) {
        AttentionKernel::SplitKDecode
    } else if ctx.max_query_len > 1 && attention_prefill_mma::supported(ctx, p) {
        AttentionKernel::MmaPrefill
    } else if ctx.max_query_len > 1 && attention_prefill::supported(ctx, p) {
        AttentionKernel::TiledPrefill
    } else {
        AttentionKernel::General
    }
}

/// [`attention_kernel`] with the tiled prefill kernel in place of the
/// grouped one where `tiled` says so and the tiled kernel applies (it takes
/// every step the grouped one takes).
pub fn prefer_tiled(ctx: &ForwardContext, p: &AttentionParams, tiled: bool) -> AttentionKernel {
    match attention_kernel(ctx, p) {
        AttentionKernel::MmaPrefill if tiled && attention_prefill::supported(ctx, p) => {
            AttentionKernel::TiledPrefill
        }
        k => k,
    }
}

/// The environment variable that makes new backends prefer the tiled
/// prefill kernel (value `tiled`; `auto` or `grouped` keeps the grouped one;
/// any other value is an error).
pub const PREFILL_KERNEL_ENV: &str = "PAGODA_PREFILL_ATTENTION";

/// Whether [`PREFILL_KERNEL_ENV`] asks for the tiled prefill kernel.
pub(crate) fn tiled_from_env() -> crate::Result<bool> {
    let c = [("auto", false), ("grouped", false), ("tiled", true)];
    crate::knob::choice(PREFILL_KERNEL_ENV, &c, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step of `seqs` (context, query) pairs with `width` blocks of 16 per table.
    fn step(seqs: &[(usize, usize)], width: usize) -> ForwardContext {
        let mut c = ForwardContext {
            block_size: 16,
            max_blocks_per_seq: width,
            ..Default::default()
        };
        c.cu_seqlens_q.push(0);
        c.cu_seqlens_k.push(0);
        for (i, &(ctx, q)) in seqs.iter().enumerate() {
            for j in 0..q {
                c.input_ids.push(0);
                c.positions.push((ctx + j) as u32);
                c.slot_mapping.push(-1);
            }
            c.block_tables.extend(std::iter::repeat_n(0, width));
            c.cu_seqlens_q.push(c.cu_seqlens_q[i] + q as u32);
            c.cu_seqlens_k.push(c.cu_seqlens_k[i] + (ctx + q) as u32);
            c.seq_lens.push((ctx + q) as u32);
            c.context_lens.push(ctx as u32);
            c.max_query_len = c.max_query_len.max(q);
            c.max_seq_len = c.max_seq_len.max(ctx + q);
            c.logits_indices.push(c.cu_seqlens_q[i + 1] - 1);
        }
        c
    }

    fn params(
        nh: usize,
        nkv: usize,
        hd: usize,
        w: Option<usize>,
        cap: Option<f32>,
    ) -> AttentionParams {
        AttentionParams {
            window: w,
            softcap: cap,
            ..AttentionParams::causal(nh, nkv, hd)
        }
    }

    const VARIANTS: [(Option<usize>, Option<f32>); 6] = [
        (None, None),
        (Some(1), None),
        (Some(4096), None),
        (None, Some(50.0)),
        (Some(512), Some(30.0)),
        (Some(1 << 40), Some(2.0)),
    ];

    #[test]
    fn windows_and_softcaps_take_the_fast_kernels() {
        let decode = step(&[(5000, 1), (3, 1), (0, 1)], 2048);
        let prefill = step(&[(700, 130), (0, 1), (10, 5)], 64);
        for hd in FAST_HEAD_DIMS {
            for (nh, nkv) in [(8, 8), (8, 4), (16, 2), (8, 1), (6, 2), (7, 1)] {
                for (w, cap) in VARIANTS {
                    let p = params(nh, nkv, hd, w, cap);
                    assert_eq!(
                        attention_kernel(&decode, &p),
                        AttentionKernel::SplitKDecode,
                        "{p:?}"
                    );
                    assert_eq!(
                        attention_kernel(&prefill, &p),
                        AttentionKernel::MmaPrefill,
                        "{p:?}"
                    );
                    assert_eq!(
                        prefer_tiled(&prefill, &p, true),
                        AttentionKernel::TiledPrefill,
                        "{p:?}"
                    );
                    assert_eq!(
                        prefer_tiled(&decode, &p, true),
                        AttentionKernel::SplitKDecode,
                        "{p:?}"
                    );
                }
            }
        }
    }

    /// Gemma's shapes: Gemma 2 2B/9B and Gemma 3 1B/4B/12B (head_dim 256),
    /// Gemma 3 27B (128), gemma-3-270m (4 heads over 1 kv head at 256).
    #[test]
    fn gemma_shapes_take_the_fast_kernels() {
        let decode = step(&[(9000, 1), (100, 1)], 1024);
        let prefill = step(&[(4000, 2048)], 512);
        for (nh, nkv, hd, w, cap) in [
            (8, 4, 256, 4096, Some(50.0)),
            (16, 8, 256, 4096, Some(50.0)),
            (4, 1, 256, 512, None),
            (8, 4, 256, 1024, None),
            (16, 8, 256, 1024, None),
            (32, 16, 128, 1024, None),
        ] {
            for w in [Some(w), None] {
                let p = params(nh, nkv, hd, w, cap);
                assert_eq!(attention_kernel(&decode, &p), AttentionKernel::SplitKDecode);
                assert_eq!(attention_kernel(&prefill, &p), AttentionKernel::MmaPrefill);
                assert_eq!(
                    prefer_tiled(&prefill, &p, true),
                    AttentionKernel::TiledPrefill
                );
            }
        }
    }

    #[test]
    fn the_rest_falls_back_to_the_general_kernel() {
        let decode = step(&[(100, 1), (3, 1)], 16);
        let prefill = step(&[(10, 40)], 16);
        for (w, cap) in VARIANTS {
            // Head dims without an instantiation.
            for hd in [32, 80, 96, 112, 160, 192] {
                let p = params(8, 2, hd, w, cap);
                assert_eq!(attention_kernel(&decode, &p), AttentionKernel::General);
                assert_eq!(attention_kernel(&prefill, &p), AttentionKernel::General);
            }
            // Decode groups past 8 (the prefill kernels take any group).
            let p = params(32, 2, 128, w, cap);
            assert_eq!(attention_kernel(&decode, &p), AttentionKernel::General);
            assert_eq!(attention_kernel(&prefill, &p), AttentionKernel::MmaPrefill);
            assert_eq!(
                prefer_tiled(&prefill, &p, true),
                AttentionKernel::TiledPrefill
            );
            assert_eq!(
                prefer_tiled(&prefill, &p, false),
                AttentionKernel::MmaPrefill
            );
        }
        // A step that claims one-token queries but has a longer one.
        let mut lying = step(&[(10, 3), (4, 1)], 16);
        lying.max_query_len = 1;
        let p = params(8, 2, 128, Some(4), None);
        assert_eq!(attention_kernel(&lying, &p), AttentionKernel::General);
        // More sequences than a grid dimension holds.
        let wide = step(&vec![(0, 2); 70_000], 1);
        assert_eq!(attention_kernel(&wide, &p), AttentionKernel::General);
    }
}
