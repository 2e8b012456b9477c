//! The CUDA backend's decode fusions against the unfused ops: the CPU
//! backend's `norm_linear3` / `norm_gate_up_silu` (their default bodies:
//! `rms_norm`, then `linear3`, or `linear` and `silu_mul`) and the CUDA
//! backend's own op sequence (fusions off).
//!
//! - `norm_linear3` (RMSNorm folded into the q/k/v GEMV's input load, one
//!   launch) with biases on some of the three;
//! - `norm_gate_up_silu` (RMSNorm in, SiLU(gate) * up out, one launch);
//! - `qk_norm_rope_store_kv` (head norms, rope and the KV store, one
//!   launch): the bits of the sequence, bf16 and FP8 caches;
//!
//! at 1..=9 rows on every small-row path, fusions on and off, at a tiny
//! shape (K = 200, odd output counts) and the Qwen3-0.6B layer shape (hidden
//! 1024, q/k/v 2048/1024/1024, gate_up 2 x 3072), plus a step of rows whose
//! normalized copy does not fit the fused kernel (it must fall back). Each
//! case asserts whether the fused launch ran (`norm_fusion_for`), no NaN
//! (outputs are NaN-poisoned, so an element left unwritten fails), relative
//! L2 error under 1e-2 against the CPU and under 2e-3 against the unfused
//! CUDA sequence (the two differ only where the per-block inverse RMS
//! rounds a normalized element the other way).
//!
//! Without a CUDA device every test prints a notice and passes (fails where
//! PAGODA_REQUIRE_GPU=1 says a GPU must be present).
#![cfg(feature = "cuda")]

mod common;

#[allow(dead_code)]
const PORTABLE: bool = false;

use common::*;
use pagoda_kernels::cpu::{CpuBackend, WeightDtype};
use pagoda_kernels::cuda::testing::{gpu_poisoned as gpu, rel_err_l2};
use pagoda_kernels::cuda::{CudaBackend, SmallLinear, NORM_SMEM_BYTES};
use pagoda_kernels::{Backend, HostTensor, KvCacheDtype, KvCacheShape, RopeStyle};

const PATHS: [SmallLinear; 4] = [
    SmallLinear::Auto,
    SmallLinear::Warp,
    SmallLinear::Mma,
    SmallLinear::Cublas,
];

fn weight<B: Backend>(b: &B, shape: Vec<usize>, data: &[f32]) -> B::Weight {
    b.load_weight(HostTensor::f32(shape, data.to_vec()))
        .unwrap()
}

fn check(what: &str, got: &[f32], cpu: &[f32], unfused: &[f32]) {
    if let Some(i) = got.iter().position(|v| !v.is_finite()) {
        panic!("{what}: element {i} is {} (unwritten or overflow)", got[i]);
    }
    let e = rel_err_l2(got, cpu);
    assert!(e < 1e-2, "{what}: relative error {e:.3e} against the CPU");
    let e = rel_err_l2(got, unfused);
    assert!(
        e < 2e-3,
        "{what}: relative error {e:.3e} against the unfused sequence"
    );
}

/// One layer's norm and products on both backends.
struct Layer<W> {
    norm: W,
    qkv: [W; 3],
    bias: [W; 3],
    gate_up: W,
}

fn layer<B: Backend>(b: &B, host: &HostLayer) -> Layer<B::Weight> {
    let h = host.hidden;
    Layer {
        norm: weight(b, vec![h], &host.norm),
        qkv: [0, 1, 2].map(|i| weight(b, vec![host.dims[i], h], &host.qkv[i])),
        bias: [0, 1, 2].map(|i| weight(b, vec![host.dims[i]], &host.bias[i])),
        gate_up: weight(b, vec![2 * host.inter, h], &host.gate_up),
    }
}

struct HostLayer {
    hidden: usize,
    inter: usize,
    dims: [usize; 3],
    norm: Vec<f32>,
    qkv: [Vec<f32>; 3],
    bias: [Vec<f32>; 3],
    gate_up: Vec<f32>,
}

fn host_layer(rng: &mut Rng, hidden: usize, dims: [usize; 3], inter: usize) -> HostLayer {
    let norm = (0..hidden).map(|_| bf(1.0 + 0.5 * rng.uniform())).collect();
    HostLayer {
        hidden,
        inter,
        dims,
        norm,
        qkv: dims.map(|n| rvec(rng, n * hidden, 0.1)),
        bias: dims.map(|n| rvec(rng, n, 1.0)),
        gate_up: rvec(rng, 2 * inter * hidden, 0.1),
    }
}

fn run_shape(g: &CudaBackend, c: &CpuBackend, host: &HostLayer, rows_list: &[usize], seed: u64) {
    let mut rng = Rng::new(seed);
    let (gl, cl) = (layer(g, host), layer(c, host));
    let h = host.hidden;
    let out3: usize = host.dims.iter().sum();
    for &rows in rows_list {
        // The residual stream: f32, of a scale far from 1 (the norm matters).
        let x = rvec_f32(&mut rng, rows * h, 6.0);
        let gx = g.residual_from_host(rows, h, &x).unwrap();
        let cx = c.tensor_from_host(rows, h, &x).unwrap();
        let (gb, cb) = (
            [Some(&gl.bias[0]), None, Some(&gl.bias[2])],
            [Some(&cl.bias[0]), None, Some(&cl.bias[2])],
        );
        let cq = c
            .norm_linear3(
                &cx,
                &cl.norm,
                1e-6,
                [&cl.qkv[0], &cl.qkv[1], &cl.qkv[2]],
                cb,
            )
            .unwrap();
        let cg = c
            .norm_gate_up_silu(&cx, &cl.norm, 1e-6, &cl.gate_up)
            .unwrap();
        // The CUDA sequence with the fusions off, on the same path.
        for path in PATHS {
            g.set_small_linear(path);
            let run = |fused: bool| {
                g.set_decode_fusion(fused);
                let w = [&gl.qkv[0], &gl.qkv[1], &gl.qkv[2]];
                let q = g.norm_linear3(&gx, &gl.norm, 1e-6, w, gb).unwrap();
                let q = q.map(|t| {
                    assert_eq!(g.dims(&t).0, rows);
                    g.tensor_to_host(&t).unwrap()
                });
                let a = g
                    .norm_gate_up_silu(&gx, &gl.norm, 1e-6, &gl.gate_up)
                    .unwrap();
                assert_eq!(g.dims(&a), (rows, host.inter));
                (q, g.tensor_to_host(&a).unwrap())
            };
            let (uq, ua) = run(false);
            let (fq, fa) = run(true);
            let what = format!("{path:?} rows {rows} hidden {h}");
            // Where the fused launch runs: the CUDA-core GEMV, up to 8 rows
            // (on Auto up to 4 here: small weights), rows fitting.
            let warp_rows = match path {
                SmallLinear::Auto => rows <= 4,
                SmallLinear::Warp => rows <= 8,
                _ => false,
            };
            let fits = rows * h * 2 <= NORM_SMEM_BYTES;
            assert_eq!(
                g.norm_fusion_for(rows, out3, h),
                warp_rows && fits,
                "{what}: fused q/k/v launch"
            );
            assert_eq!(
                g.norm_fusion_for(rows, 2 * host.inter, h),
                warp_rows && fits,
                "{what}: fused gate/up launch"
            );
            for i in 0..3 {
                let what = format!("{what} norm_linear3 product {i}");
                check(&what, &fq[i], cq[i].data(), &uq[i]);
                // Off, the sequence itself: equal to CPU within bf16.
                check(&format!("{what} (unfused)"), &uq[i], cq[i].data(), &uq[i]);
            }
            check(&format!("{what} norm_gate_up_silu"), &fa, cg.data(), &ua);
        }
    }
    g.set_decode_fusion(true);
    g.set_small_linear(SmallLinear::from_env());
}

#[test]
fn fused_norm_products_match_the_sequence() {
    let Some(g) = gpu() else { return };
    let c = backend(2, WeightDtype::F32);
    let mut rng = Rng::new(41);
    let rows: Vec<usize> = (1..=9).collect();
    // A tiny shape: K not a multiple of 32, odd output counts.
    let tiny = host_layer(&mut rng, 200, [37, 8, 5], 21);
    run_shape(&g, &c, &tiny, &rows, 1);
    // Qwen3-0.6B's layer.
    let qwen = host_layer(&mut rng, 1024, [2048, 1024, 1024], 3072);
    run_shape(&g, &c, &qwen, &[1, 2, 3, 4, 8], 2);
    // 6-8 rows of 4096 do not fit the fused kernel's shared memory: the
    // sequence runs (and the Warp path still takes the plain GEMV).
    let wide = host_layer(&mut rng, 4096, [64, 16, 16], 40);
    run_shape(&g, &c, &wide, &[1, 5, 6, 8], 3);
}

/// Shapes the fused kernels refuse or do not take are errors or the
/// sequence, never a wrong result: a norm weight of the wrong width, a
/// weight of another input width, an odd gate_up.
#[test]
fn fused_norm_products_check_shapes() {
    let Some(g) = gpu() else { return };
    g.set_small_linear(SmallLinear::Warp);
    g.set_decode_fusion(true);
    let h = 64;
    let x = g.residual_from_host(2, h, &vec![1.0; 2 * h]).unwrap();
    let w = |rows: usize, cols: usize| weight(&g, vec![rows, cols], &vec![0.5; rows * cols]);
    let (norm, bad_norm) = (w(1, h), w(1, h + 8));
    let (q, k, v, other) = (w(16, h), w(8, h), w(8, h), w(8, h + 8));
    assert!(g
        .norm_linear3(&x, &bad_norm, 1e-6, [&q, &k, &v], [None, None, None])
        .is_err());
    assert!(g
        .norm_linear3(&x, &norm, 1e-6, [&q, &other, &v], [None, None, None])
        .is_err());
    let bad_bias = w(1, 7);
    assert!(g
        .norm_linear3(&x, &norm, 1e-6, [&q, &k, &v], [Some(&bad_bias), None, None])
        .is_err());
    assert!(g.norm_gate_up_silu(&x, &bad_norm, 1e-6, &q).is_err());
    assert!(g.norm_gate_up_silu(&x, &norm, 1e-6, &other).is_err());
    // An odd gate_up takes the sequence, which refuses it.
    assert!(g.norm_gate_up_silu(&x, &norm, 1e-6, &w(7, h)).is_err());
    // Every value 0.5 * 64 * (normalized 1.0 * 0.5): the exact answer.
    let y = g.norm_gate_up_silu(&x, &norm, 1e-6, &q).unwrap();
    let y = g.tensor_to_host(&y).unwrap();
    let d = 16.0f32;
    let want = d / (1.0 + (-d).exp()) * d;
    assert!(
        y.iter().all(|&v| (v - want).abs() <= want * 4e-3),
        "{y:?} != {want}"
    );
    g.set_small_linear(SmallLinear::from_env());
}

/// A cos/sin table of `max_pos` rows for rotary width `rd` (theta 10000).
fn rope_table(max_pos: usize, rd: usize) -> Vec<f32> {
    let mut t = Vec::with_capacity(max_pos * rd);
    for p in 0..max_pos {
        let ang: Vec<f32> = (0..rd / 2)
            .map(|i| p as f32 / 10000f32.powf(2.0 * i as f32 / rd as f32))
            .collect();
        t.extend(ang.iter().map(|a| a.cos()));
        t.extend(ang.iter().map(|a| a.sin()));
    }
    t
}

/// `qk_norm_rope_store_kv` in one launch gives q, k and both caches the
/// bits of `qk_norm_rope` then `store_kv` (the fusions off), on bf16 and
/// FP8 caches (scales 0.5 / 0.25), with and without the head norms, at
/// decode steps of 1..=4 rows plus a padding row (slot -1, never written)
/// and a prefill step; and the CPU backend's sequence within bf16.
#[test]
fn qk_norm_rope_store_kv_equals_the_sequence() {
    for dtype in [KvCacheDtype::Bf16, KvCacheDtype::Fp8] {
        let Some(g) = gpu() else { return };
        let g = g.with_kv_cache_dtype(dtype).unwrap();
        let c = backend(2, WeightDtype::F32);
        let mut rng = Rng::new(43);
        let (qh, kh, hd, block) = (16usize, 8usize, 128usize, 16usize);
        let table = rope_table(512, hd);
        let gt = g
            .load_table(HostTensor::f32(vec![512, hd], table.clone()))
            .unwrap();
        let ct = c.load_table(HostTensor::f32(vec![512, hd], table)).unwrap();
        let nq = rvec(&mut rng, hd, 1.0);
        let nk = rvec(&mut rng, hd, 1.0);
        let (gqn, gkn) = (weight(&g, vec![hd], &nq), weight(&g, vec![hd], &nk));
        let (cqn, ckn) = (weight(&c, vec![hd], &nq), weight(&c, vec![hd], &nk));
        let steps: Vec<(Vec<SeqSpec>, usize)> = vec![
            (
                vec![SeqSpec {
                    context_len: 40,
                    query_len: 1,
                }],
                0,
            ),
            (
                vec![
                    SeqSpec {
                        context_len: 7,
                        query_len: 1
                    };
                    3
                ],
                1,
            ),
            (
                vec![
                    SeqSpec {
                        context_len: 100,
                        query_len: 1
                    };
                    4
                ],
                0,
            ),
            (
                vec![SeqSpec {
                    context_len: 5,
                    query_len: 20,
                }],
                0,
            ),
        ];
        for (seqs, pad) in steps {
            for with_norm in [true, false] {
                let step = paged_step(&mut rng, &seqs, block, 64, pad);
                let t = step.ctx.num_tokens();
                let shape = KvCacheShape {
                    num_blocks: 64,
                    block_size: block,
                    num_kv_heads: kh,
                    head_dim: hd,
                };
                let what = format!("{dtype} {t} rows norm {with_norm}");
                let (q, k, v) = (
                    rvec(&mut rng, t * qh * hd, 2.0),
                    rvec(&mut rng, t * kh * hd, 2.0),
                    rvec(&mut rng, t * kh * hd, 2.0),
                );
                let gs = g.begin_step(&step.ctx).unwrap();
                let run = |fused: bool| {
                    g.set_decode_fusion(fused);
                    let mut cache = g.alloc_kv_cache(shape).unwrap();
                    if dtype == KvCacheDtype::Fp8 {
                        g.set_kv_scales(&mut cache, 0.5, 0.25).unwrap();
                    }
                    let mut gq = g.tensor_from_host(t, qh * hd, &q).unwrap();
                    let mut gk = g.tensor_from_host(t, kh * hd, &k).unwrap();
                    let gv = g.tensor_from_host(t, kh * hd, &v).unwrap();
                    let norms = with_norm.then_some((&gqn, &gkn));
                    g.qk_norm_rope_store_kv(
                        &mut gq,
                        &mut gk,
                        &gv,
                        norms,
                        1e-6,
                        &gs,
                        &gt,
                        hd,
                        RopeStyle::Neox,
                        &mut cache,
                    )
                    .unwrap();
                    let (ck, cv) = g.kv_cache_to_host(&cache).unwrap();
                    (
                        g.tensor_to_host(&gq).unwrap(),
                        g.tensor_to_host(&gk).unwrap(),
                        ck,
                        cv,
                    )
                };
                let unfused = run(false);
                let fused = run(true);
                let bits = |a: &[f32], b: &[f32]| {
                    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
                };
                assert!(bits(&fused.0, &unfused.0), "{what}: q differs");
                assert!(bits(&fused.1, &unfused.1), "{what}: k differs");
                assert!(bits(&fused.2, &unfused.2), "{what}: k cache differs");
                assert!(bits(&fused.3, &unfused.3), "{what}: v cache differs");
                // Something was stored (the cache started at zero).
                assert!(fused.2.iter().any(|&x| x != 0.0), "{what}: nothing stored");
                // The CPU's q and k within bf16 accuracy.
                let cs = c.begin_step(&step.ctx).unwrap();
                let mut cq = c.tensor_from_host(t, qh * hd, &q).unwrap();
                let mut ck = c.tensor_from_host(t, kh * hd, &k).unwrap();
                let norms = with_norm.then_some((&cqn, &ckn));
                c.qk_norm_rope(&mut cq, &mut ck, norms, 1e-6, &cs, &ct, hd, RopeStyle::Neox)
                    .unwrap();
                assert!(rel_err_l2(&fused.0, cq.data()) < 1e-2, "{what}: q vs CPU");
                assert!(rel_err_l2(&fused.1, ck.data()) < 1e-2, "{what}: k vs CPU");
            }
        }
        g.set_decode_fusion(true);
    }
}
