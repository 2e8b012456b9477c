//! Paged KV writes and attention of the CPU backend against an f64 reference
//! that keeps each sequence's K/V as a plain array of positions: prefill with
//! and without a cached prefix, mixed varlen batches, decode, GQA ratios 1-4,
//! head_dim 64 and 128, block boundaries, shuffled block tables, padding;
//! sliding windows (prefill tiles and decode splits past the window) and
//! logit soft-capping; the FP8 cache (values as `fp8.rs` rounds them, with
//! scales) through the same cases.

mod common;

/// This binary tests the default (vectorized where the CPU allows) kernels.
#[allow(dead_code)]
const PORTABLE: bool = false;

use common::*;
use pagoda_kernels::cpu::{CpuBackend, CpuKvCache, WeightDtype};
use pagoda_kernels::fp8::{e4m3_to_f32, f32_to_e4m3};
use pagoda_kernels::{AttentionParams, Backend, KvCacheDtype, KvCacheShape};

/// Per sequence, per position, the `[num_kv_heads * head_dim]` K and V.
struct SeqKv {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

struct Case {
    seqs: Vec<SeqSpec>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    pad: usize,
}

/// Runs one case with full attention.
fn run_case(b: &CpuBackend, rng: &mut Rng, c: &Case) {
    run_case_with(b, rng, c, None, None)
}

/// Runs one case: stores prefixes, stores the step's K/V, attends, compares.
fn run_case_with(
    b: &CpuBackend,
    rng: &mut Rng,
    c: &Case,
    window: Option<usize>,
    softcap: Option<f32>,
) {
    run_case_scaled(b, rng, c, window, softcap, (1.0, 1.0))
}

/// [`run_case_with`] with K/V scales for an FP8 cache: the cache must hold
/// what `fp8.rs` makes of each value (x / scale, rounded, times scale), and
/// attention must equal the reference over those values.
fn run_case_scaled(
    b: &CpuBackend,
    rng: &mut Rng,
    c: &Case,
    window: Option<usize>,
    softcap: Option<f32>,
    (ks, vs): (f32, f32),
) {
    let (nh, nkv, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
    let width = nkv * hd;
    let blocks_needed: usize = c
        .seqs
        .iter()
        .map(|s| (s.context_len + s.query_len).div_ceil(c.block_size))
        .sum();
    let shape = KvCacheShape {
        num_blocks: blocks_needed + 3,
        block_size: c.block_size,
        num_kv_heads: nkv,
        head_dim: hd,
    };
    let mut cache = b.alloc_kv_cache(shape).unwrap();
    b.set_kv_scales(&mut cache, ks, vs).unwrap();
    let step = paged_step(rng, &c.seqs, c.block_size, shape.num_blocks, c.pad);
    let kv: Vec<SeqKv> = c
        .seqs
        .iter()
        .map(|s| {
            let n = s.context_len + s.query_len;
            SeqKv {
                k: (0..n).map(|_| rng.vec(width)).collect(),
                v: (0..n).map(|_| rng.vec(width)).collect(),
            }
        })
        .collect();

    // What the cache keeps of each value (itself, for an f32 cache).
    let round = |x: f32, s: f32| {
        if cache.is_fp8() {
            e4m3_to_f32(f32_to_e4m3(x / s)) * s
        } else {
            x
        }
    };
    let kept: Vec<SeqKv> = kv
        .iter()
        .map(|x| SeqKv {
            k: x.k
                .iter()
                .map(|r| r.iter().map(|&v| round(v, ks)).collect())
                .collect(),
            v: x.v
                .iter()
                .map(|r| r.iter().map(|&v| round(v, vs)).collect())
                .collect(),
        })
        .collect();

    // 1. An earlier step stored the cached prefixes.
    let pre = prefix_step(&step, &c.seqs);
    let pre_step = b.begin_step(&pre).unwrap();
    let collect = |range: &dyn Fn(&SeqSpec) -> std::ops::Range<usize>,
                   pick: fn(&SeqKv) -> &Vec<Vec<f32>>| {
        let mut out = Vec::new();
        for (s, kv) in c.seqs.iter().zip(&kv) {
            for p in range(s) {
                out.extend_from_slice(&pick(kv)[p]);
            }
        }
        out
    };
    let prefix = |s: &SeqSpec| 0..s.context_len;
    let (pk, pv) = (collect(&prefix, |x| &x.k), collect(&prefix, |x| &x.v));
    let rows = pre.num_tokens();
    b.store_kv(
        &tensor(b, rows, width, &pk),
        &tensor(b, rows, width, &pv),
        &mut cache,
        &pre_step,
    )
    .unwrap();

    // 2. This step stores its own tokens (padding rows carry garbage, slot -1).
    let new = |s: &SeqSpec| s.context_len..s.context_len + s.query_len;
    let (mut nk, mut nv) = (collect(&new, |x| &x.k), collect(&new, |x| &x.v));
    nk.extend(rng.vec(c.pad * width).iter().map(|v| v * 100.0));
    nv.extend(rng.vec(c.pad * width).iter().map(|v| v * 100.0));
    let rows = step.ctx.num_tokens();
    let s = b.begin_step(&step.ctx).unwrap();
    b.store_kv(
        &tensor(b, rows, width, &nk),
        &tensor(b, rows, width, &nv),
        &mut cache,
        &s,
    )
    .unwrap();
    check_cache(&cache, &step, &c.seqs, &kept);

    // 3. Attention against the reference.
    let q = rng.vec(rows * nh * hd);
    let params = AttentionParams {
        num_heads: nh,
        num_kv_heads: nkv,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        window,
        softcap,
        kv_group: 0,
    };
    let o = b
        .attention(&tensor(b, rows, nh * hd, &q), &cache, &s, &params)
        .unwrap();
    assert_eq!(b.dims(&o), (rows, nh * hd));
    let got = host(b, &o);
    assert!(
        got.iter().all(|v| v.is_finite()),
        "every output written, padding included"
    );
    let real_rows = rows - c.pad;
    let want = reference(&q, &c.seqs, &kept, &params);
    let what = format!(
        "attention heads={nh}/{nkv} hd={hd} bs={} seqs={:?} window={window:?} softcap={softcap:?}",
        c.block_size, c.seqs
    );
    // Outputs are convex combinations of V values in [-1, 1].
    assert_close_rel(&what, &got[..real_rows * nh * hd], &want, 2e-5, 1e-4);
}

/// Every stored token's K/V sits at its slot; padding wrote nothing.
fn check_cache(cache: &CpuKvCache, step: &PagedStep, seqs: &[SeqSpec], kv: &[SeqKv]) {
    let bs = step.ctx.block_size;
    let width = cache.shape().num_kv_heads * cache.shape().head_dim;
    let mut written = vec![false; cache.shape().num_blocks * bs];
    for (i, s) in seqs.iter().enumerate() {
        for p in 0..s.context_len + s.query_len {
            let slot = step.tables[i][p / bs] as usize * bs + p % bs;
            written[slot] = true;
            assert_eq!(
                &cache.k()[slot * width..][..width],
                &kv[i].k[p][..],
                "K at {slot}"
            );
            assert_eq!(
                &cache.v()[slot * width..][..width],
                &kv[i].v[p][..],
                "V at {slot}"
            );
        }
    }
    for (slot, w) in written.iter().enumerate() {
        if !w {
            assert!(
                cache.k()[slot * width..][..width].iter().all(|&v| v == 0.0),
                "slot {slot} untouched"
            );
            assert!(
                cache.v()[slot * width..][..width].iter().all(|&v| v == 0.0),
                "slot {slot} untouched"
            );
        }
    }
}

/// Naive causal GQA attention in f64 over the plain per-sequence K/V.
fn reference(q: &[f32], seqs: &[SeqSpec], kv: &[SeqKv], p: &AttentionParams) -> Vec<f64> {
    let (nh, hd) = (p.num_heads, p.head_dim);
    let group = nh / p.num_kv_heads;
    let mut out = Vec::new();
    let mut row = 0;
    for (s, kv) in seqs.iter().zip(kv) {
        for j in 0..s.query_len {
            for h in 0..nh {
                let qv = &q[(row * nh + h) * hd..][..hd];
                let off = (h / group) * hd;
                let n = s.context_len + j + 1;
                // transformers' sliding window: kv_idx > q_idx - window.
                let first = p.window.map_or(0, |w| n.saturating_sub(w));
                let scores: Vec<f64> = (first..n)
                    .map(|pos| {
                        let k = &kv.k[pos][off..off + hd];
                        let s = qv
                            .iter()
                            .zip(k)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            * p.scale as f64;
                        match p.softcap {
                            Some(c) => c as f64 * (s / c as f64).tanh(),
                            None => s,
                        }
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for d in 0..hd {
                    out.push(
                        (first..n)
                            .map(|pos| e[pos - first] * kv.v[pos][off + d] as f64)
                            .sum::<f64>()
                            / sum,
                    );
                }
            }
            row += 1;
        }
    }
    out
}

fn seq(context_len: usize, query_len: usize) -> SeqSpec {
    SeqSpec {
        context_len,
        query_len,
    }
}

#[test]
fn prefill_without_prefix_over_gqa_ratios_and_head_dims() {
    let b = backend(2, WeightDtype::F32);
    let mut rng = Rng::new(11);
    for (nh, nkv) in [(4, 4), (4, 2), (9, 3), (8, 2)] {
        for hd in [64, 128] {
            for bs in [16, 5] {
                let c = Case {
                    seqs: vec![seq(0, 37)],
                    num_heads: nh,
                    num_kv_heads: nkv,
                    head_dim: hd,
                    block_size: bs,
                    pad: 0,
                };
                run_case(&b, &mut rng, &c);
            }
        }
    }
}

#[test]
fn prefill_with_cached_prefix_and_mixed_varlen_batch() {
    let b = backend(2, WeightDtype::F16);
    let mut rng = Rng::new(12);
    let batches = [
        vec![seq(16, 16)],
        vec![seq(13, 20)],
        vec![seq(0, 1), seq(31, 2), seq(7, 9), seq(0, 40), seq(5, 33)],
        vec![seq(50, 1), seq(0, 17), seq(3, 1), seq(15, 33)],
    ];
    for seqs in batches {
        for (nh, nkv, hd) in [(9, 3, 64), (6, 2, 128), (3, 3, 64), (8, 2, 64)] {
            let c = Case {
                seqs: seqs.clone(),
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: hd,
                block_size: 8,
                pad: 0,
            };
            run_case(&b, &mut rng, &c);
        }
    }
}

#[test]
fn decode_steps_cross_block_boundaries() {
    let b = backend(2, WeightDtype::F32);
    let mut rng = Rng::new(13);
    // Context lengths around multiples of the block size.
    for ctx_len in [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 200] {
        for (nh, nkv) in [(9, 3), (4, 1), (2, 2)] {
            let c = Case {
                seqs: vec![seq(ctx_len, 1), seq(ctx_len / 2 + 3, 1)],
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: 64,
                block_size: 8,
                pad: 0,
            };
            run_case(&b, &mut rng, &c);
        }
    }
}

#[test]
fn padding_tokens_with_slot_minus_one_are_skipped() {
    let b = backend(2, WeightDtype::F32);
    let mut rng = Rng::new(14);
    for pad in [1, 3] {
        let c = Case {
            seqs: vec![seq(10, 1), seq(4, 6), seq(22, 1)],
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 64,
            block_size: 4,
            pad,
        };
        run_case(&b, &mut rng, &c);
    }
}

#[test]
fn single_thread_and_large_prefill_agree_with_reference() {
    let b = backend(1, WeightDtype::BF16);
    let mut rng = Rng::new(15);
    let c = Case {
        seqs: vec![seq(100, 150), seq(0, 130), seq(300, 45), seq(520, 1)],
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
        block_size: 16,
        pad: 0,
    };
    run_case(&b, &mut rng, &c);
}

#[test]
fn sliding_window_and_softcap_match_reference() {
    let b = backend(2, WeightDtype::F32);
    let mut rng = Rng::new(17);
    let batches = [
        vec![seq(0, 37)],
        vec![seq(13, 20), seq(0, 1), seq(40, 1)],
        vec![seq(300, 1), seq(2, 70), seq(5, 1)],
    ];
    for seqs in batches {
        for window in [1, 4, 8, 33, 1000] {
            for softcap in [None, Some(0.5f32)] {
                let c = Case {
                    seqs: seqs.clone(),
                    num_heads: 4,
                    num_kv_heads: 2,
                    head_dim: 64,
                    block_size: 8,
                    pad: 0,
                };
                run_case_with(&b, &mut rng, &c, Some(window), softcap);
            }
        }
        let c = Case {
            seqs: seqs.clone(),
            num_heads: 2,
            num_kv_heads: 1,
            head_dim: 256,
            block_size: 16,
            pad: 0,
        };
        run_case_with(&b, &mut rng, &c, None, Some(0.3));
        run_case_with(&b, &mut rng, &c, Some(7), None);
    }
}

#[test]
fn bad_slots_blocks_and_head_layouts_are_errors() {
    let b = backend(1, WeightDtype::F32);
    let mut rng = Rng::new(16);
    let shape = KvCacheShape {
        num_blocks: 4,
        block_size: 4,
        num_kv_heads: 2,
        head_dim: 8,
    };
    let mut cache = b.alloc_kv_cache(shape).unwrap();
    assert_eq!(b.kv_cache_bytes(shape), 2 * 4 * 4 * 2 * 8 * 4);
    let step = paged_step(&mut rng, &[seq(0, 3)], 4, 4, 0);
    let x = tensor(&b, 3, 16, &rng.vec(48));
    let q = tensor(&b, 3, 32, &rng.vec(96));
    let params = AttentionParams {
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 8,
        scale: 0.3,
        window: None,
        softcap: None,
        kv_group: 0,
    };

    let mut bad = step.ctx.clone();
    bad.slot_mapping[1] = 16;
    assert!(b
        .store_kv(&x, &x, &mut cache, &b.begin_step(&bad).unwrap())
        .is_err());
    let mut bad = step.ctx.clone();
    bad.block_tables[0] = 4;
    assert!(b
        .attention(&q, &cache, &b.begin_step(&bad).unwrap(), &params)
        .is_err());
    let s = b.begin_step(&step.ctx).unwrap();
    assert!(b.store_kv(&q, &q, &mut cache, &s).is_err());
    let gqa = AttentionParams {
        num_heads: 3,
        ..params
    };
    assert!(b
        .attention(&tensor(&b, 3, 24, &rng.vec(72)), &cache, &s, &gqa)
        .is_err());
    for bad in [
        AttentionParams {
            window: Some(0),
            ..params
        },
        AttentionParams {
            softcap: Some(0.0),
            ..params
        },
        AttentionParams {
            softcap: Some(f32::NAN),
            ..params
        },
    ] {
        assert!(b.attention(&q, &cache, &s, &bad).is_err(), "{bad:?}");
    }
    let wrong_kv = AttentionParams {
        num_kv_heads: 1,
        ..params
    };
    assert!(b.attention(&q, &cache, &s, &wrong_kv).is_err());
}

/// The FP8 cache: prefill with and without a prefix, decode across blocks,
/// windows and soft-caps, head_dim 64/128/256, with unit and other scales.
#[test]
fn fp8_cache_matches_reference_over_its_rounded_values() {
    let b = backend(4, WeightDtype::F32)
        .with_kv_cache_dtype(KvCacheDtype::Fp8)
        .unwrap();
    assert!(b.kv_cache_fp8());
    let mut rng = Rng::new(81);
    for (hd, nh, nkv) in [(64, 4, 2), (128, 8, 2), (256, 4, 1)] {
        for scales in [(1.0, 1.0), (0.02, 0.5)] {
            for (window, softcap) in [(None, None), (Some(40), Some(20.0))] {
                let c = Case {
                    seqs: vec![seq(0, 37), seq(50, 20), seq(300, 1), seq(17, 1)],
                    num_heads: nh,
                    num_kv_heads: nkv,
                    head_dim: hd,
                    block_size: 16,
                    pad: 2,
                };
                run_case_scaled(&b, &mut rng, &c, window, softcap, scales);
            }
        }
    }
    // A cache of half the bytes; bf16 is not a CPU cache.
    let shape = KvCacheShape {
        num_blocks: 8,
        block_size: 16,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let f32b = backend(1, WeightDtype::F32);
    assert_eq!(4 * b.kv_cache_bytes(shape), f32b.kv_cache_bytes(shape));
    let e = backend(1, WeightDtype::F32)
        .with_kv_cache_dtype(KvCacheDtype::Bf16)
        .unwrap_err();
    assert!(e.to_string().contains("bf16"), "{e}");
}
