//! The CUDA backend's decode fusions against the unfused ops: the CPU
//! backend's sequence and the CUDA backend's own (fusions off).
//!
//! - `gate_up_silu` (the stacked gate/up product with SiLU(gate) * up taken
//!   into the CUDA-core GEMV's output, one launch): the bits of `linear`
//!   then `silu_mul`, at 1..=9 rows on every small-row path, at a tiny shape
//!   (odd output count), the Qwen3-0.6B MLP and a weight over the 24 MiB
//!   that sends 2-4 rows to cuBLASLt on the default path; outputs are
//!   NaN-poisoned, so an element left unwritten fails;
//! - `qk_norm_rope_store_kv` (head norms, rope and the KV store, one
//!   launch): the bits of the sequence, bf16 and FP8 caches.
//!
//! Without a CUDA device every test prints a notice and passes (fails where
//! PAGODA_REQUIRE_GPU=1 says a GPU must be present).
#![cfg(feature = "cuda")]

mod common;

#[allow(dead_code)]
const PORTABLE: bool = false;

use common::*;
use pagoda_kernels::cpu::WeightDtype;
use pagoda_kernels::cuda::testing::{gpu_poisoned as gpu, rel_err_l2};
use pagoda_kernels::cuda::{GemvKernel, SmallLinear};
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

/// `gate_up_silu` with the fusions on equals the sequence with them off bit
/// for bit on every path and row count, and the CPU within bf16.
#[test]
fn gate_up_silu_equals_the_sequence() {
    let Some(g) = gpu() else { return };
    let c = backend(2, WeightDtype::F32);
    let mut rng = Rng::new(41);
    // (hidden, intermediate): tiny, Qwen3-0.6B, over the 24 MiB bound.
    for (h, inter) in [(200, 21), (1024, 3072), (512, 13_000)] {
        let w = rvec(&mut rng, 2 * inter * h, 0.1);
        let (gw, cw) = (
            weight(&g, vec![2 * inter, h], &w),
            weight(&c, vec![2 * inter, h], &w),
        );
        for rows in 1..=9 {
            let x = rvec(&mut rng, rows * h, 1.0);
            let cx = c.tensor_from_host(rows, h, &x).unwrap();
            let want = c
                .tensor_to_host(&c.gate_up_silu(&cx, &cw).unwrap())
                .unwrap();
            let gx = g.tensor_from_host(rows, h, &x).unwrap();
            for path in PATHS {
                g.set_small_linear(path);
                let run = |fused: bool| {
                    g.set_decode_fusion(fused);
                    let y = g.gate_up_silu(&gx, &gw).unwrap();
                    assert_eq!(g.dims(&y), (rows, inter));
                    g.tensor_to_host(&y).unwrap()
                };
                let (unfused, fused) = (run(false), run(true));
                let what = format!(
                    "{path:?} rows {rows} {h}x{inter} (CUDA-core GEMV: {})",
                    path.kernel_for(rows, 2 * inter, h) == Some(GemvKernel::Warp)
                );
                if let Some(i) = fused.iter().position(|v| !v.is_finite()) {
                    panic!(
                        "{what}: element {i} is {} (unwritten or overflow)",
                        fused[i]
                    );
                }
                assert!(
                    fused
                        .iter()
                        .zip(&unfused)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: differs from linear then silu_mul"
                );
                let e = rel_err_l2(&fused, &want);
                assert!(e < 1e-2, "{what}: relative error {e:.3e} against the CPU");
            }
        }
    }
    g.set_decode_fusion(true);
    g.set_small_linear(SmallLinear::from_env().unwrap());
}

/// Shapes the fused launch does not take are the sequence's errors, never a
/// wrong result: an odd gate_up, a weight of another input width; and a
/// known answer.
#[test]
fn gate_up_silu_checks_shapes() {
    let Some(g) = gpu() else { return };
    g.set_small_linear(SmallLinear::Warp);
    g.set_decode_fusion(true);
    let h = 64;
    let x = g.tensor_from_host(2, h, &vec![0.5; 2 * h]).unwrap();
    let w = |rows: usize, cols: usize| weight(&g, vec![rows, cols], &vec![0.5; rows * cols]);
    assert!(g.gate_up_silu(&x, &w(7, h)).is_err());
    assert!(g.gate_up_silu(&x, &w(8, h + 8)).is_err());
    // Every product 0.5 * 0.5 * 64 = 16: silu(16) * 16.
    let y = g.gate_up_silu(&x, &w(16, h)).unwrap();
    assert_eq!(g.dims(&y), (2, 8));
    let y = g.tensor_to_host(&y).unwrap();
    let d = 16.0f32;
    let want = d / (1.0 + (-d).exp()) * d;
    assert!(
        y.iter().all(|&v| (v - want).abs() <= want * 4e-3),
        "{y:?} != {want}"
    );
    g.set_small_linear(SmallLinear::from_env().unwrap());
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
