//! Sliding windows, logit soft-capping and head_dim 256 in the fast CUDA
//! attention kernels (tiled prefill, split-K decode) against the CPU
//! backend on the same bf16-rounded K/V/Q: windows 1, 5, 16, 33, 511 to
//! 2048 and 4096 (and none), soft-caps none, 2 and 50, head_dim 64, 128 and
//! 256, GQA groups 1 to 8 (6 and 3 run masked decode instantiations), block
//! sizes 3, 16 and 32, prompts after cached prefixes (chunked prefill, up to
//! 6,000 cached tokens), decode steps whose contexts run past the window
//! over hundreds of blocks, and mixed steps with padding rows.
//!
//! Every case first asserts which kernel the backend picks for it
//! (`CudaBackend::attention_kernel_for`; the attention op takes exactly that
//! one), so a variant that silently fell back to the general kernel fails
//! here; prefill cases run on both the grouped kernel (the default) and the
//! tiled one (forced). The KV positions a kernel
//! must never read (before the window: for decode every earlier position,
//! for prefill every 64-key tile wholly before the first row's window) hold
//! NaN on the GPU in steps without padding rows (which read block 0's first
//! slot, wherever it lies), and such a step also starts from a cache
//! filled with NaN, so reading any of them, or any unstored slot, shows as a
//! non-finite output; the output is NaN-poisoned too, so every element must
//! be written. Errors: relative L2 below 2e-2 per row and 1e-2 overall.
//! One test captures the windowed split-K decode in a CUDA graph and
//! replays it for other context lengths.
//! Without a CUDA device every test prints a notice and passes (fails where
//! PAGODA_REQUIRE_GPU=1 says a GPU must be present).
#![cfg(feature = "cuda")]

mod common;

#[allow(dead_code)]
const PORTABLE: bool = false;

use common::*;
use pagoda_kernels::cpu::WeightDtype;
use pagoda_kernels::cuda::testing::{gpu_poisoned as gpu, rel_err_l2 as rel_err};
use pagoda_kernels::cuda::{attention_kernel, AttentionKernel, CudaBackend};
use pagoda_kernels::{AttentionParams, Backend, ForwardContext, KvCacheShape, SamplingRow};

const WINDOWS: [Option<usize>; 6] = [None, Some(1), Some(5), Some(16), Some(33), Some(4096)];
const SOFTCAPS: [Option<f32>; 3] = [None, Some(2.0), Some(50.0)];
const HEAD_DIMS: [usize; 3] = [64, 128, 256];
/// (num_heads, num_kv_heads), cycled through the cases.
const GQA: [(usize, usize); 6] = [(4, 4), (8, 2), (8, 1), (16, 2), (6, 1), (6, 2)];
const BLOCK_SIZES: [usize; 3] = [16, 3, 32];

struct Case {
    seqs: Vec<SeqSpec>,
    heads: (usize, usize),
    head_dim: usize,
    block_size: usize,
    pad: usize,
    window: Option<usize>,
    softcap: Option<f32>,
}

impl Case {
    fn params(&self) -> AttentionParams {
        AttentionParams {
            num_heads: self.heads.0,
            num_kv_heads: self.heads.1,
            head_dim: self.head_dim,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
            window: self.window,
            softcap: self.softcap,
            kv_group: 0,
        }
    }

    fn describe(&self) -> String {
        format!(
            "seqs {:?} heads {}/{} hd {} bs {} pad {} window {:?} softcap {:?}",
            self.seqs
                .iter()
                .map(|q| (q.context_len, q.query_len))
                .collect::<Vec<_>>(),
            self.heads.0,
            self.heads.1,
            self.head_dim,
            self.block_size,
            self.pad,
            self.window,
            self.softcap
        )
    }

    /// Cached positions of `seq` that the kernel must not read: before the
    /// window of its first query token (decode), or before the 64-key tile
    /// holding it (prefill: a tile is 64 keys, or 32 at head_dim 256).
    fn unread_below(&self, seq: usize, kernel: AttentionKernel) -> usize {
        let Some(w) = self.window else { return 0 };
        let first = (self.seqs[seq].context_len + 1).saturating_sub(w);
        match kernel {
            AttentionKernel::TiledPrefill | AttentionKernel::MmaPrefill => first / 64 * 64,
            _ => first,
        }
    }
}

/// [`run_case`] on the grouped prefill kernel, then on the tiled one.
fn run_prefill_case(g: &CudaBackend, rng: &mut Rng, c: &Case) {
    for (tiled, kernel) in [
        (false, AttentionKernel::MmaPrefill),
        (true, AttentionKernel::TiledPrefill),
    ] {
        g.force_tiled_prefill(tiled);
        run_case(g, rng, c, kernel);
    }
    g.force_tiled_prefill(false);
}

/// Builds the case on both backends (poisoned cache, stored prefix with the
/// never-read positions NaN on the GPU, stored step K/V), checks that the
/// step takes `expect`, attends on both and compares.
fn run_case(g: &CudaBackend, rng: &mut Rng, c: &Case, expect: AttentionKernel) {
    let cpu = backend(2, WeightDtype::F32);
    let what = c.describe();
    let ((nh, nkv), hd, bs) = (c.heads, c.head_dim, c.block_size);
    let width = nkv * hd;
    let needed: usize = c
        .seqs
        .iter()
        .map(|q| (q.context_len + q.query_len).div_ceil(bs))
        .sum();
    let shape = KvCacheShape {
        num_blocks: needed + 3,
        block_size: bs,
        num_kv_heads: nkv,
        head_dim: hd,
    };
    let mut gc = g.alloc_kv_cache(shape).unwrap();
    let mut cc = cpu.alloc_kv_cache(shape).unwrap();
    let step = paged_step(rng, &c.seqs, bs, shape.num_blocks, c.pad);
    let p = c.params();
    let kernel = g.attention_kernel_for(&step.ctx, &p);
    assert_eq!(kernel, expect, "{what}: attention takes {kernel:?}");

    // Every slot NaN on the GPU where no padding row reads block 0's
    // unstored slots; else the same large finite values on both backends.
    let all = paged_step(rng, &[s(0, shape.num_blocks * bs)], bs, shape.num_blocks, 0);
    let n = all.ctx.num_tokens() * width;
    if c.pad == 0 {
        let x = vec![f32::NAN; n];
        store_step_kv(g, &mut gc, &all.ctx, &x, &x);
    } else {
        let (k, v) = (rvec(rng, n, 60.0), rvec(rng, n, 3000.0));
        store_step_kv(g, &mut gc, &all.ctx, &k, &v);
        store_step_kv(&cpu, &mut cc, &all.ctx, &k, &v);
    }

    // The cached prefixes; positions the kernel must skip are NaN on the
    // GPU (without padding rows, which may read any block's first slot).
    let pre = prefix_step(&step, &c.seqs);
    let rows = pre.num_tokens();
    let (k, v) = (rvec(rng, rows * width, 1.0), rvec(rng, rows * width, 1.0));
    let (mut gk, mut gv) = (k.clone(), v.clone());
    let mut row = 0;
    for (i, q) in c.seqs.iter().enumerate() {
        let below = if c.pad == 0 {
            c.unread_below(i, kernel)
        } else {
            0
        };
        for pos in 0..q.context_len {
            if pos < below {
                gk[row * width..(row + 1) * width].fill(f32::NAN);
                gv[row * width..(row + 1) * width].fill(f32::NAN);
            }
            row += 1;
        }
    }
    store_step_kv(g, &mut gc, &pre, &gk, &gv);
    store_step_kv(&cpu, &mut cc, &pre, &k, &v);

    // The step's own K/V, then attention on both.
    let t = step.ctx.num_tokens();
    let (k, v) = (rvec(rng, t * width, 1.0), rvec(rng, t * width, 1.0));
    store_step_kv(g, &mut gc, &step.ctx, &k, &v);
    store_step_kv(&cpu, &mut cc, &step.ctx, &k, &v);
    // Sharper scores with a cap, so that the cap bends them.
    let q = rvec(
        rng,
        t * nh * hd,
        if c.softcap.is_some() { 6.0 } else { 2.0 },
    );
    let gs = g.begin_step(&step.ctx).unwrap();
    let cs = cpu.begin_step(&step.ctx).unwrap();
    let gq = g.tensor_from_host(t, nh * hd, &q).unwrap();
    let cq = cpu.tensor_from_host(t, nh * hd, &q).unwrap();
    let go = g
        .attention(&gq, &gc, &gs, &p)
        .unwrap_or_else(|e| panic!("{what}: attention failed: {e}"));
    let co = cpu.attention(&cq, &cc, &cs, &p).unwrap();
    let got = g
        .tensor_to_host(&go)
        .unwrap_or_else(|e| panic!("{what}: kernel fault or download failed: {e}"));
    let want = co.data();
    assert_eq!(got.len(), want.len(), "{what}: output length");

    // Row r belongs to (sequence, query index) for the messages.
    let owners: Vec<(usize, usize)> = (0..step.ctx.num_seqs())
        .flat_map(|i| (0..step.ctx.query_len(i)).map(move |j| (i, j)))
        .collect();
    let w = nh * hd;
    if let Some(i) = got.iter().position(|x| !x.is_finite()) {
        let bad = got.iter().filter(|x| !x.is_finite()).count();
        let (sq, j) = owners[i / w];
        panic!(
            "{what} ({kernel:?}): {bad} non-finite outputs (unwritten, or a position outside \
             the window or an unstored slot was read); first at seq {sq} query {j} head {}",
            (i % w) / hd
        );
    }
    for (r, &(sq, j)) in owners.iter().enumerate() {
        let e = rel_err(&got[r * w..(r + 1) * w], &want[r * w..(r + 1) * w]);
        assert!(
            e < 2e-2,
            "{what} ({kernel:?}): seq {sq} query {j} relative error {e:.3e}; got[..4] {:?} \
             want[..4] {:?}",
            &got[r * w..r * w + 4],
            &want[r * w..r * w + 4]
        );
    }
    let e = rel_err(&got, want);
    assert!(
        e < 1e-2,
        "{what} ({kernel:?}): overall relative error {e:.3e}"
    );
}

#[test]
fn prefill_after_cached_prefixes_every_window_softcap_and_head_dim() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(301);
    let mut i = 0;
    for hd in HEAD_DIMS {
        for window in WINDOWS {
            for softcap in SOFTCAPS {
                // Prompts around the 64-row tiles, a decode token in the
                // same step, and a chunk after a prefix past the window.
                let seqs = vec![s(0, 70), s(40, 1), s(129, 100), s(4500, 65)];
                let c = Case {
                    seqs,
                    heads: GQA[i % GQA.len()],
                    head_dim: hd,
                    block_size: BLOCK_SIZES[i % BLOCK_SIZES.len()],
                    pad: if i % 4 == 3 { 2 } else { 0 },
                    window,
                    softcap,
                };
                run_prefill_case(&g, &mut rng, &c);
                i += 1;
            }
        }
    }
}

#[test]
fn decode_past_the_window_every_window_softcap_and_head_dim() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(302);
    let mut i = 0;
    for hd in HEAD_DIMS {
        for window in WINDOWS {
            for softcap in SOFTCAPS {
                // Contexts inside, at and past each window, up to 9,000
                // tokens (hundreds of blocks, 18 partitions without one).
                let lens = [0, 3, 15, 16, 33, 600, 4095, 4096, 4097, 5000, 9000];
                let c = Case {
                    seqs: lens.iter().map(|&l| s(l, 1)).collect(),
                    heads: GQA[i % GQA.len()],
                    head_dim: hd,
                    block_size: BLOCK_SIZES[i % BLOCK_SIZES.len()],
                    pad: if i % 4 == 1 { 3 } else { 0 },
                    window,
                    softcap,
                };
                run_case(&g, &mut rng, &c, AttentionKernel::SplitKDecode);
                i += 1;
            }
        }
    }
}

/// Windows around the 512-token decode partition: the partitions start at
/// the window's first position, so a window of 513 spans two and their
/// merge must rescale correctly; sharp scores (a large cap) make a wrong
/// rescale show.
#[test]
fn decode_windows_across_partitions() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(303);
    let lens = [0, 100, 511, 512, 513, 1024, 1500, 2100, 3000];
    for (k, window) in [511, 512, 513, 1000, 1536, 2048].into_iter().enumerate() {
        for hd in HEAD_DIMS {
            let c = Case {
                seqs: lens.iter().map(|&l| s(l, 1)).collect(),
                heads: [(16, 8), (8, 1), (4, 1)][k % 3],
                head_dim: hd,
                block_size: [16, 5, 32][k % 3],
                pad: 0,
                window: Some(window),
                softcap: [None, Some(50.0)][k % 2],
            };
            run_case(&g, &mut rng, &c, AttentionKernel::SplitKDecode);
        }
    }
}

/// Long chunks after long prefixes (Gemma's shapes): the query tiles start
/// thousands of keys past position 0 and must skip every tile before their
/// windows; also the windows 512 and 1024 of Gemma 3.
#[test]
fn long_chunks_after_long_prefixes() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(304);
    for (heads, hd, window, softcap) in [
        ((8, 4), 256, Some(4096), Some(50.0)),
        ((4, 1), 256, Some(512), None),
        ((16, 8), 256, Some(1024), None),
        ((8, 2), 128, Some(33), Some(2.0)),
        ((8, 1), 64, Some(4096), None),
        ((8, 4), 256, None, Some(50.0)),
    ] {
        let c = Case {
            seqs: vec![s(6000, 300), s(2000, 129), s(10, 64)],
            heads,
            head_dim: hd,
            block_size: 16,
            pad: 0,
            window,
            softcap,
        };
        run_prefill_case(&g, &mut rng, &c);
    }
}

/// Mixed steps (prompts, chunks and decodes together, padding rows) at
/// every head_dim and GQA group, with a window and a cap.
#[test]
fn mixed_steps_with_padding() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(305);
    let seqs = vec![
        s(0, 23),
        s(40, 1),
        s(64, 12),
        s(700, 1),
        s(5, 1),
        s(0, 1),
        s(129, 40),
        s(5000, 65),
    ];
    for (i, heads) in GQA.into_iter().enumerate() {
        for hd in HEAD_DIMS {
            let c = Case {
                seqs: seqs.clone(),
                heads,
                head_dim: hd,
                block_size: BLOCK_SIZES[i % 3],
                pad: 1 + i % 3,
                window: [Some(16), Some(4096), Some(1)][i % 3],
                softcap: [Some(50.0), None][i % 2],
            };
            run_prefill_case(&g, &mut rng, &c);
        }
    }
}

/// Head dims without a fast instantiation still work, through the
/// general kernel, with the same variants.
#[test]
fn other_head_dims_take_the_general_kernel() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(306);
    for seqs in [vec![s(9, 70), s(0, 3)], vec![s(300, 1), s(20, 1)]] {
        let c = Case {
            seqs,
            heads: (4, 2),
            head_dim: 96,
            block_size: 16,
            pad: 0,
            window: Some(16),
            softcap: Some(50.0),
        };
        run_case(&g, &mut rng, &c, AttentionKernel::General);
    }
}

/// `ctx` with every block table widened to `width` blocks (zeros past each
/// sequence's own), as the engine pads decode steps to a graph's width.
fn widen(mut ctx: ForwardContext, tables: &[Vec<u32>], width: usize) -> ForwardContext {
    let n = ctx.num_seqs();
    ctx.max_blocks_per_seq = width;
    ctx.block_tables = vec![0; n * width];
    for (i, t) in tables.iter().enumerate() {
        ctx.block_tables[i * width..i * width + t.len()].copy_from_slice(t);
    }
    ctx.sampling = vec![SamplingRow::GREEDY; n];
    ctx.validate().expect("consistent widened step");
    ctx
}

/// A decode graph captured over the split-K kernel with a window and a cap
/// replays for steps of the same shape whose contexts are anything from 0
/// to past the window: the greedy token of every replayed row is an argmax
/// of the same attention launched directly (the output read as logits).
/// The capture's contexts are all short, so a grid or an argument that
/// depended on them would show.
#[test]
fn decode_graphs_replay_windowed_attention_for_any_context() {
    let Some(g) = gpu() else { return };
    g.set_poison_outputs(false);
    let mut rng = Rng::new(307);
    let (n, bs, width) = (4usize, 16usize, 400usize); // tables of 6,400 tokens
    for ((nh, nkv), hd, window, softcap) in [
        ((8, 4), 256, Some(512), Some(50.0)),
        ((16, 2), 128, Some(1000), None),
        ((8, 1), 64, None, Some(2.0)),
    ] {
        let shape = KvCacheShape {
            num_blocks: n * width + 1,
            block_size: bs,
            num_kv_heads: nkv,
            head_dim: hd,
        };
        let mut cache = g.alloc_kv_cache(shape).unwrap();
        let all = paged_step(
            &mut rng,
            &[s(0, shape.num_blocks * bs)],
            bs,
            shape.num_blocks,
            0,
        );
        let rows = all.ctx.num_tokens() * nkv * hd;
        let (k, v) = (rvec(&mut rng, rows, 1.0), rvec(&mut rng, rows, 1.0));
        store_step_kv(&g, &mut cache, &all.ctx, &k, &v);
        let p = AttentionParams {
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            window,
            softcap,
            kv_group: 0,
        };
        let q = g
            .tensor_from_host(n, nh * hd, &rvec(&mut rng, n * nh * hd, 4.0))
            .unwrap();
        let decode = |rng: &mut Rng, lens: &[usize]| {
            let seqs: Vec<SeqSpec> = lens.iter().map(|&l| s(l, 1)).collect();
            let st = paged_step(rng, &seqs, bs, shape.num_blocks, 0);
            widen(st.ctx, &st.tables, width)
        };
        let first = decode(&mut rng, &[10, 20, 30, 40]);
        assert_eq!(attention_kernel(&first, &p), AttentionKernel::SplitKDecode);
        let step = g.begin_step(&first).unwrap();
        let mut graph = g
            .capture_graph(step, &mut |st| g.attention(&q, &cache, st, &p))
            .expect("capture");
        for round in 0..4 {
            let lens: Vec<usize> = (0..n).map(|_| rng.below(width * bs)).collect();
            let ctx = decode(&mut rng, &lens);
            let ids = g.replay_graph(&mut graph, &ctx).expect("replay");
            let st = g.begin_step(&ctx).unwrap();
            let direct = g
                .tensor_to_host(&g.attention(&q, &cache, &st, &p).unwrap())
                .unwrap();
            let cols = nh * hd;
            for (r, &id) in ids.iter().enumerate() {
                let row = &direct[r * cols..(r + 1) * cols];
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                assert_eq!(
                    row[id as usize], max,
                    "heads {nh}/{nkv} hd {hd} window {window:?} softcap {softcap:?} round \
                     {round}: row {r} (context {}) replayed argmax {id} is {} but the direct \
                     launch's maximum is {max}",
                    lens[r], row[id as usize]
                );
            }
        }
    }
}
