//! The CUDA decode attention kernels (split-K over partitions of 512 tokens,
//! one block per (sequence, kv head, partition) attending the kv head's
//! whole query group) against the CPU backend on the same bf16-rounded
//! K/V/Q. Every step has one query token per sequence, so `attention`
//! dispatches to the decode path; the cases cover context lengths giving
//! one, two and many partitions (0 .. 3000 cached tokens, around the
//! partition and block boundaries), batches of 64 sequences, GQA groups 1 to
//! 8 (3, 5, 6, 7 run a masked instantiation), head_dim 64 and 128, block
//! sizes 3 to 32, sharp and flat softmaxes, and padding rows (slot -1,
//! context 0, reading block 0). Outputs are NaN-poisoned first, so every
//! element must be written; errors are checked over the whole output and per
//! (row, head). One test checks that the decode path really runs (it takes
//! its split-K scratch from the pool, the general kernel takes none), also
//! at head_dim 256 with a window and a cap; `cuda_attention_variants` covers
//! those variants' numbers.
//! Without a CUDA device every test prints a notice and passes
//! (fails where PAGODA_REQUIRE_GPU=1 says a GPU must be present).
#![cfg(feature = "cuda")]

mod common;

#[allow(dead_code)]
const PORTABLE: bool = false;

use common::*;
use pagoda_kernels::cpu::WeightDtype;
use pagoda_kernels::cuda::testing::{gpu_poisoned as gpu, rel_err_l2 as rel_err};
use pagoda_kernels::cuda::CudaBackend;
use pagoda_kernels::{AttentionParams, Backend, KvCacheShape};

/// Tokens per partition of the decode kernel (`DEC_PARTITION`).
const PARTITION: usize = 512;

struct Case {
    /// Cached tokens per sequence before the step (each adds one token).
    ctx_lens: Vec<usize>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    /// Padding rows (slot -1, context 0) appended to the batch.
    pad: usize,
    /// Range of q's entries: larger values make the softmax sharper.
    q_scale: f32,
}

impl Case {
    fn new(ctx_lens: &[usize], heads: (usize, usize), head_dim: usize, block_size: usize) -> Self {
        Case {
            ctx_lens: ctx_lens.to_vec(),
            num_heads: heads.0,
            num_kv_heads: heads.1,
            head_dim,
            block_size,
            pad: 0,
            q_scale: 2.0,
        }
    }

    fn describe(&self) -> String {
        let parts: Vec<usize> = self
            .ctx_lens
            .iter()
            .map(|&c| (c + 1).div_ceil(PARTITION))
            .collect();
        format!(
            "decode heads {}/{} (group {}) hd {} bs {} pad {} q_scale {} ctx_lens {:?} \
             (partitions {:?})",
            self.num_heads,
            self.num_kv_heads,
            self.num_heads / self.num_kv_heads,
            self.head_dim,
            self.block_size,
            self.pad,
            self.q_scale,
            self.ctx_lens,
            parts
        )
    }
}

/// Stores the cached prefixes and the step's K/V on both backends, attends
/// on both and compares; returns the GPU output.
fn run_case(g: &CudaBackend, rng: &mut Rng, c: &Case) -> Vec<f32> {
    let cpu = backend(2, WeightDtype::F32);
    let (nh, nkv, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
    let width = nkv * hd;
    let seqs: Vec<SeqSpec> = c
        .ctx_lens
        .iter()
        .map(|&context_len| SeqSpec {
            context_len,
            query_len: 1,
        })
        .collect();
    let needed: usize = seqs
        .iter()
        .map(|s| (s.context_len + 1).div_ceil(c.block_size))
        .sum();
    let shape = KvCacheShape {
        num_blocks: needed + 3,
        block_size: c.block_size,
        num_kv_heads: nkv,
        head_dim: hd,
    };
    let what = c.describe();
    let mut gc = g.alloc_kv_cache(shape).unwrap();
    let mut cc = cpu.alloc_kv_cache(shape).unwrap();
    let step = paged_step(rng, &seqs, c.block_size, shape.num_blocks, c.pad);
    assert_eq!(step.ctx.max_query_len, 1, "{what}: not a decode step");

    // 1. Earlier steps stored the cached prefixes.
    let pre = prefix_step(&step, &seqs);
    let rows = pre.num_tokens();
    if rows > 0 {
        let (k, v) = (rvec(rng, rows * width, 1.0), rvec(rng, rows * width, 1.0));
        let gs = g.begin_step(&pre).unwrap();
        let cs = cpu.begin_step(&pre).unwrap();
        let gk = g.tensor_from_host(rows, width, &k).unwrap();
        let gv = g.tensor_from_host(rows, width, &v).unwrap();
        g.store_kv(&gk, &gv, &mut gc, &gs).unwrap();
        let ck = cpu.tensor_from_host(rows, width, &k).unwrap();
        let cv = cpu.tensor_from_host(rows, width, &v).unwrap();
        cpu.store_kv(&ck, &cv, &mut cc, &cs).unwrap();
    }

    // 2. The decode step stores its own K/V, then attends.
    let t = step.ctx.num_tokens();
    let (k, v) = (rvec(rng, t * width, 1.0), rvec(rng, t * width, 1.0));
    let q = rvec(rng, t * nh * hd, c.q_scale);
    let gs = g.begin_step(&step.ctx).unwrap();
    let cs = cpu.begin_step(&step.ctx).unwrap();
    let gk = g.tensor_from_host(t, width, &k).unwrap();
    let gv = g.tensor_from_host(t, width, &v).unwrap();
    g.store_kv(&gk, &gv, &mut gc, &gs).unwrap();
    let ck = cpu.tensor_from_host(t, width, &k).unwrap();
    let cv = cpu.tensor_from_host(t, width, &v).unwrap();
    cpu.store_kv(&ck, &cv, &mut cc, &cs).unwrap();

    let p = AttentionParams {
        num_heads: nh,
        num_kv_heads: nkv,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        window: None,
        softcap: None,
        kv_group: 0,
    };
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
    let ctx_of = |r: usize| c.ctx_lens.get(r).copied().unwrap_or(0);

    let bad: Vec<usize> = (0..got.len()).filter(|&i| !got[i].is_finite()).collect();
    if let Some(&i) = bad.first() {
        let (r, h, d) = (i / (nh * hd), (i / hd) % nh, i % hd);
        panic!(
            "{what}: {} non-finite outputs; first is element {i} = {} (row {r} with \
             context {}, head {h}, dim {d}; unwritten?)",
            bad.len(),
            got[i],
            ctx_of(r)
        );
    }
    // Per (row, head) first, so a wrong head names itself, then overall.
    let mut worst = (0.0f64, 0, 0);
    for r in 0..t {
        for h in 0..nh {
            let at = (r * nh + h) * hd;
            let e = rel_err(&got[at..at + hd], &want[at..at + hd]);
            if e > worst.0 {
                worst = (e, r, h);
            }
        }
    }
    let (e, r, h) = worst;
    assert!(
        e < 2e-2,
        "{what}: row {r} (context {}, {} partitions) head {h} (kv head {}): relative \
         error {e:.3e}; got[..4] {:?} want[..4] {:?}",
        ctx_of(r),
        (ctx_of(r) + 1).div_ceil(PARTITION),
        h / (nh / nkv),
        &got[(r * nh + h) * hd..(r * nh + h) * hd + 4],
        &want[(r * nh + h) * hd..(r * nh + h) * hd + 4],
    );
    let e = rel_err(&got, want);
    assert!(e < 1e-2, "{what}: overall relative error {e:.3e}");
    got
}

/// Context lengths around block (16) and partition (512) boundaries.
const EDGE_LENS: &[usize] = &[
    0, 1, 2, 14, 15, 16, 17, 510, 511, 512, 513, 1000, 1023, 1024, 1025, 2049, 3000,
];

#[test]
fn decode_partition_edges_all_groups_and_head_dims() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(21);
    for heads in [(4, 4), (8, 4), (16, 4), (16, 2)] {
        for hd in [64, 128] {
            let mut c = Case::new(EDGE_LENS, heads, hd, 16);
            c.pad = 2;
            run_case(&g, &mut rng, &c);
        }
    }
}

#[test]
fn decode_masked_groups_3_5_6_7() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(22);
    for heads in [(6, 2), (10, 2), (12, 2), (14, 2), (7, 1)] {
        for hd in [64, 128] {
            let c = Case::new(&[0, 5, 511, 512, 700, 1536], heads, hd, 16);
            run_case(&g, &mut rng, &c);
        }
    }
}

#[test]
fn decode_block_sizes_3_5_32() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(23);
    for bs in [3, 5, 32] {
        for (heads, hd) in [((16, 8), 128), ((8, 1), 64), ((4, 2), 128)] {
            let mut c = Case::new(&[0, 2, 3, 31, 32, 511, 513, 1200, 2047], heads, hd, bs);
            c.pad = 1;
            run_case(&g, &mut rng, &c);
        }
    }
}

#[test]
fn decode_batch_of_64_sequences() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(24);
    // Qwen3-0.6B's head layout, then a group of 8 at head_dim 64.
    for (heads, hd, bs) in [((16, 8), 128, 16), ((8, 1), 64, 16), ((16, 4), 128, 32)] {
        let lens: Vec<usize> = (0..64)
            .map(|i| match i % 8 {
                0 => rng.below(3001),
                1 => 1000,
                2 => rng.below(20),
                _ => rng.below(1100),
            })
            .collect();
        let mut c = Case::new(&lens, heads, hd, bs);
        c.pad = 3;
        run_case(&g, &mut rng, &c);
    }
}

#[test]
fn decode_sharp_softmax_across_partitions() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(25);
    // Large q: the softmax is nearly one-hot, and each partition's max is far
    // from the others', so a wrong rescale in the merge shows at once.
    for (heads, hd) in [((16, 8), 128), ((8, 1), 64), ((8, 2), 128)] {
        let mut c = Case::new(&[600, 1100, 2500, 3000, 40], heads, hd, 16);
        c.q_scale = 24.0;
        run_case(&g, &mut rng, &c);
    }
}

#[test]
fn decode_only_padding_and_single_tokens() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(26);
    for (heads, hd) in [((16, 8), 128), ((8, 1), 64)] {
        let mut c = Case::new(&[0, 0, 0], heads, hd, 16);
        c.pad = 5;
        run_case(&g, &mut rng, &c);
        // One sequence only, long enough for several partitions.
        let c = Case::new(&[2100], heads, hd, 16);
        run_case(&g, &mut rng, &c);
    }
}

/// The decode path takes `num_seqs * num_heads * partitions * head_dim`
/// f32 of split-K scratch from the pool; the general kernel takes none. A
/// fresh backend's pool therefore grows by at least that much only when the
/// decode kernels ran (head_dim 128, group 8; head_dim 256 with a sliding
/// window and soft-capping, its partitions covering the window only), and
/// not for head_dim 96, which falls back to the general kernel.
#[test]
fn decode_steps_take_the_split_k_path() {
    let Some(_) = gpu() else { return };
    let mut rng = Rng::new(27);
    for (hd, window, expect_decode) in [
        (128, None, true),
        (96, None, false),
        (256, Some(1024), true),
    ] {
        let g = gpu().expect("CUDA backend");
        let (nh, nkv, bs) = (16, 2, 16);
        let lens = [3000usize, 10, 600, 1];
        let seqs: Vec<SeqSpec> = lens
            .iter()
            .map(|&context_len| SeqSpec {
                context_len,
                query_len: 1,
            })
            .collect();
        let blocks: usize = lens.iter().map(|l| (l + 1).div_ceil(bs)).sum();
        let shape = KvCacheShape {
            num_blocks: blocks + 1,
            block_size: bs,
            num_kv_heads: nkv,
            head_dim: hd,
        };
        let mut cache = g.alloc_kv_cache(shape).unwrap();
        let step = paged_step(&mut rng, &seqs, bs, shape.num_blocks, 0);
        let st = g.begin_step(&step.ctx).unwrap();
        let t = step.ctx.num_tokens();
        let kv = rvec(&mut rng, t * nkv * hd, 1.0);
        let gk = g.tensor_from_host(t, nkv * hd, &kv).unwrap();
        g.store_kv(&gk, &gk, &mut cache, &st).unwrap();
        let q = g
            .tensor_from_host(t, nh * hd, &rvec(&mut rng, t * nh * hd, 1.0))
            .unwrap();
        let p = AttentionParams {
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            scale: 0.1,
            window,
            softcap: window.map(|_| 50.0),
            kv_group: 0,
        };
        let width = step.ctx.max_blocks_per_seq * bs;
        assert!(
            width.div_ceil(PARTITION) >= 6,
            "test needs a wide block table"
        );
        let parts = window.map_or(width, |w| w.min(width)).div_ceil(PARTITION);
        let scratch = t * nh * parts * hd * 4;
        let before = g.pool_reserved_bytes();
        let y = g.attention(&q, &cache, &st, &p).unwrap();
        g.synchronize().unwrap();
        let grew = g.pool_reserved_bytes() - before;
        drop(y);
        if expect_decode {
            assert!(
                grew >= scratch,
                "hd {hd}: pool grew by {grew} bytes, expected the decode path's \
                 {scratch} bytes of split-K scratch (did attention dispatch to it?)"
            );
        } else {
            assert!(
                grew < scratch,
                "hd {hd}: pool grew by {grew} bytes (>= {scratch}): an unsupported head_dim \
                 took the decode path"
            );
        }
    }
    // And a group of 8 through that path computes the right thing.
    let g = gpu().expect("CUDA backend");
    run_case(
        &g,
        &mut rng,
        &Case::new(&[3000, 10, 600, 1], (16, 2), 128, 16),
    );
}
