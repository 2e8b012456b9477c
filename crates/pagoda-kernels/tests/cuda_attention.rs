//! Paged attention of the CUDA backend against the CPU backend on the same
//! bf16-rounded K/V/Q: prefill with and without a cached prefix, decode,
//! mixed varlen steps, GQA ratios 1/2/4/8, head_dim 64 and 128, block sizes
//! that do and do not divide the lengths, shuffled block tables and slot -1
//! padding; sliding windows and logit soft-capping (head_dim 64 and 256,
//! which take the tiled prefill and split-K decode kernels, and 32, the
//! general kernel, at the tiny Gemma 3 / Gemma 2 shapes and windows; the
//! `cuda_attention_variants` tests cover those variants in depth). The
//! output is NaN-poisoned first, so every element must be written. Without a CUDA device every test prints a notice and passes
//! (fails where PAGODA_REQUIRE_GPU=1 says a GPU must be present).
#![cfg(feature = "cuda")]

mod common;

#[allow(dead_code)]
const PORTABLE: bool = false;

use common::*;
use pagoda_kernels::cpu::WeightDtype;
use pagoda_kernels::cuda::testing::{gpu_poisoned as gpu, rel_err_l2 as rel_err};
use pagoda_kernels::cuda::CudaBackend;
use pagoda_kernels::{AttentionParams, Backend, KernelError, KvCacheShape};

struct Case {
    seqs: Vec<SeqSpec>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    pad: usize,
}

/// [`run_case_with`] with full attention.
fn run_case(g: &CudaBackend, rng: &mut Rng, c: &Case) {
    run_case_with(g, rng, c, None, None)
}

/// Stores prefixes and the step's K/V on both backends, attends, compares.
fn run_case_with(
    g: &CudaBackend,
    rng: &mut Rng,
    c: &Case,
    window: Option<usize>,
    softcap: Option<f32>,
) {
    let cpu = backend(2, WeightDtype::F32);
    let (nh, nkv, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
    let width = nkv * hd;
    let needed: usize = c
        .seqs
        .iter()
        .map(|s| (s.context_len + s.query_len).div_ceil(c.block_size))
        .sum();
    let shape = KvCacheShape {
        num_blocks: needed + 3,
        block_size: c.block_size,
        num_kv_heads: nkv,
        head_dim: hd,
    };
    let mut gc = g.alloc_kv_cache(shape).unwrap();
    let mut cc = cpu.alloc_kv_cache(shape).unwrap();
    let step = paged_step(rng, &c.seqs, c.block_size, shape.num_blocks, c.pad);

    // 1. An earlier step stored the cached prefixes.
    let pre = prefix_step(&step, &c.seqs);
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

    // 2. This step stores its own K/V, then attends.
    let t = step.ctx.num_tokens();
    let (k, v) = (rvec(rng, t * width, 1.0), rvec(rng, t * width, 1.0));
    let q = rvec(rng, t * nh * hd, 2.0);
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
        window,
        softcap,
        kv_group: 0,
    };
    let gq = g.tensor_from_host(t, nh * hd, &q).unwrap();
    let cq = cpu.tensor_from_host(t, nh * hd, &q).unwrap();
    let go = g.attention(&gq, &gc, &gs, &p).unwrap();
    let co = cpu.attention(&cq, &cc, &cs, &p).unwrap();
    let got = g.tensor_to_host(&go).unwrap();
    let want = co.data();
    let what = format!(
        "attention seqs {:?} heads {nh}/{nkv} hd {hd} bs {} pad {} window {window:?} softcap {softcap:?}",
        c.seqs, c.block_size, c.pad
    );
    if let Some(i) = got.iter().position(|x| !x.is_finite()) {
        panic!("{what}: element {i} is {} (unwritten?)", got[i]);
    }
    let e = rel_err(&got, want);
    assert!(e < 1e-2, "{what}: relative error {e:.3e}");
    // Each row on its own too, so a wrong short row cannot hide in the norm.
    let w = nh * hd;
    for r in 0..t {
        let e = rel_err(&got[r * w..(r + 1) * w], &want[r * w..(r + 1) * w]);
        assert!(e < 2e-2, "{what}: row {r} relative error {e:.3e}");
    }
}

#[test]
fn prefill_without_prefix() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(11);
    for (nh, nkv) in [(4, 4), (4, 2), (8, 2), (8, 1)] {
        for hd in [64, 128] {
            let c = Case {
                seqs: vec![s(0, 1), s(0, 17), s(0, 64), s(0, 33)],
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: hd,
                block_size: 16,
                pad: 0,
            };
            run_case(&g, &mut rng, &c);
        }
    }
}

#[test]
fn prefill_with_cached_prefix() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(12);
    for (nh, nkv, bs) in [(2, 2, 16), (4, 2, 5), (16, 4, 32), (16, 2, 16)] {
        for hd in [64, 128] {
            let c = Case {
                seqs: vec![s(16, 16), s(7, 9), s(100, 31), s(31, 1)],
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: hd,
                block_size: bs,
                pad: 0,
            };
            run_case(&g, &mut rng, &c);
        }
    }
}

#[test]
fn decode_batches() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(13);
    for (nh, nkv) in [(8, 8), (8, 4), (8, 2), (16, 2)] {
        for hd in [64, 128] {
            let c = Case {
                seqs: vec![s(1, 1), s(15, 1), s(16, 1), s(17, 1), s(300, 1), s(1023, 1)],
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: hd,
                block_size: 16,
                pad: 0,
            };
            run_case(&g, &mut rng, &c);
        }
    }
}

#[test]
fn mixed_prefill_and_decode_with_padding() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(14);
    for (nh, nkv, bs, pad) in [(4, 1, 16, 3), (8, 1, 8, 1), (14, 2, 16, 5), (4, 4, 3, 2)] {
        for hd in [64, 128] {
            let c = Case {
                seqs: vec![s(0, 23), s(40, 1), s(64, 12), s(5, 1), s(0, 1), s(129, 40)],
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: hd,
                block_size: bs,
                pad,
            };
            run_case(&g, &mut rng, &c);
        }
    }
}

/// Decodes first (as the scheduler orders them), then prompt chunks: the
/// leading decodes take the split-K kernel and the rest the grouped one,
/// one output; a one-token query after a chunk stays with the grouped one.
#[test]
fn mixed_steps_with_leading_decodes() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(16);
    for (nh, nkv, bs, pad) in [(8, 8, 16, 0), (32, 8, 16, 3), (16, 2, 8, 1)] {
        for hd in [64, 128, 256] {
            let c = Case {
                seqs: vec![
                    s(40, 1),
                    s(700, 1),
                    s(0, 1),
                    s(64, 12),
                    s(129, 40),
                    s(300, 1),
                ],
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: hd,
                block_size: bs,
                pad,
            };
            run_case(&g, &mut rng, &c);
        }
    }
}

#[test]
fn bad_layouts_are_errors() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(15);
    let shape = KvCacheShape {
        num_blocks: 4,
        block_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let cache = g.alloc_kv_cache(shape).unwrap();
    let step = paged_step(&mut rng, &[s(0, 3)], 16, 4, 0);
    let st = g.begin_step(&step.ctx).unwrap();
    let q = g
        .tensor_from_host(3, 3 * 64, &vec![0.5; 3 * 3 * 64])
        .unwrap();
    let p = AttentionParams {
        num_heads: 3,
        num_kv_heads: 2,
        head_dim: 64,
        scale: 0.125,
        window: None,
        softcap: None,
        kv_group: 0,
    };
    assert!(matches!(
        g.attention(&q, &cache, &st, &p),
        Err(KernelError::Shape { .. })
    ));
    // A block table naming a block past the cache.
    let mut bad = step.ctx.clone();
    bad.block_tables[0] = 9;
    let st = g.begin_step(&bad).unwrap();
    let q = g
        .tensor_from_host(3, 4 * 64, &vec![0.5; 3 * 4 * 64])
        .unwrap();
    let p = AttentionParams { num_heads: 4, ..p };
    assert!(g.attention(&q, &cache, &st, &p).is_err());
    let st = g.begin_step(&step.ctx).unwrap();
    assert!(g.attention(&q, &cache, &st, &p).is_ok());
    let zero_window = AttentionParams {
        window: Some(0),
        ..p
    };
    assert!(g.attention(&q, &cache, &st, &zero_window).is_err());
}

#[test]
fn sliding_window_and_softcap_match_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(16);
    let batches = [
        vec![s(0, 37)],
        vec![s(13, 20), s(0, 1), s(40, 1)],
        vec![s(300, 1), s(2, 70), s(5, 1)],
    ];
    for seqs in batches {
        // head_dim 32: the general kernel, at the tiny Gemma 3 / Gemma 2
        // shapes and windows (6, and 5 with a soft-cap of 2).
        for (nh, nkv, hd) in [(4, 2, 64), (4, 1, 256), (4, 2, 32), (4, 1, 32)] {
            for (window, softcap) in [
                (Some(1), None),
                (Some(5), Some(2.0)),
                (Some(6), None),
                (Some(7), None),
                (Some(33), Some(5.0)),
                (None, Some(0.5)),
                (Some(1000), None),
            ] {
                let c = Case {
                    seqs: seqs.clone(),
                    num_heads: nh,
                    num_kv_heads: nkv,
                    head_dim: hd,
                    block_size: 16,
                    pad: 0,
                };
                run_case_with(&g, &mut rng, &c, window, softcap);
            }
        }
    }
}
