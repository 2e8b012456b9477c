//! Every op of the CUDA backend against the CPU backend (f32 weights, the
//! same bf16-rounded inputs) on fresh random inputs: odd and even shapes,
//! block boundaries, GQA ratios 1/2/4/8, head_dim 64 and 128, prefill with a
//! cached prefix, mixed prefill+decode steps and slot -1 padding. Outputs are
//! NaN-poisoned before each op, so an element left unwritten fails the check.
//!
//! Without a CUDA device or driver every test prints a notice and passes
//! (fails where PAGODA_REQUIRE_GPU=1 says a GPU must be present).
#![cfg(feature = "cuda")]

mod common;

#[allow(dead_code)]
const PORTABLE: bool = false;

use common::*;
use pagoda_core::{BlockCopy, BlockId};
use pagoda_kernels::cpu::{CpuBackend, WeightDtype};
use pagoda_kernels::cuda::testing::gpu_poisoned as gpu;
use pagoda_kernels::cuda::{CudaBackend, CudaOptions};
use pagoda_kernels::{Backend, HostTensor, KernelError, KvCacheShape, RopeStyle};

fn cpu() -> CpuBackend {
    backend(2, WeightDtype::F32)
}

/// Asserts no NaN/inf and `‖got − want‖ / ‖want‖ < 1e-2`.
fn check(what: &str, got: &[f32], want: &[f32]) {
    check_tol(what, got, want, 1e-2)
}

/// Uploads the same rows to both backends.
fn pair(
    g: &CudaBackend,
    c: &CpuBackend,
    rows: usize,
    cols: usize,
    data: &[f32],
) -> (
    pagoda_kernels::cuda::CudaTensor,
    pagoda_kernels::cpu::CpuTensor,
) {
    (
        g.tensor_from_host(rows, cols, data).unwrap(),
        c.tensor_from_host(rows, cols, data).unwrap(),
    )
}

fn wpair(
    g: &CudaBackend,
    c: &CpuBackend,
    shape: Vec<usize>,
    data: Vec<f32>,
) -> (
    pagoda_kernels::cuda::CudaWeight,
    pagoda_kernels::cpu::CpuWeight,
) {
    let t = HostTensor::f32(shape, data);
    (g.load_weight(t.clone()).unwrap(), c.load_weight(t).unwrap())
}

const SHAPES: &[(usize, usize)] = &[(1, 1), (3, 17), (7, 64), (33, 1000), (5, 4097)];

#[test]
fn new_fails_with_a_device_error_or_succeeds() {
    match CudaBackend::new(CudaOptions::default()) {
        Ok(b) => assert!(b.name().starts_with("cuda:0")),
        Err(KernelError::Device(msg)) => assert!(msg.contains("CUDA"), "{msg}"),
        Err(e) => panic!("unexpected error kind: {e}"),
    }
}

#[test]
fn tensor_round_trip_is_exact_for_bf16_values() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(1);
    for &(r, c) in SHAPES {
        let x = rvec(&mut rng, r * c, 3.0);
        let t = g.tensor_from_host(r, c, &x).unwrap();
        assert_eq!(g.dims(&t), (r, c));
        assert_eq!(g.tensor_to_host(&t).unwrap(), x);
    }
    assert!(g.tensor_from_host(2, 2, &[1.0]).is_err());
}

#[test]
fn elementwise_ops_match_cpu() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut rng = Rng::new(2);
    for &(r, n) in SHAPES {
        let (a, b) = (rvec(&mut rng, r * n, 4.0), rvec(&mut rng, r * n, 4.0));
        let (ga, ca) = pair(&g, &c, r, n, &a);
        let (gb, cb) = pair(&g, &c, r, n, &b);
        let what = format!("[{r}, {n}]");

        let (gy, cy) = (
            g.silu_mul2(&ga, &gb).unwrap(),
            c.silu_mul2(&ca, &cb).unwrap(),
        );
        check(
            &format!("silu_mul2 {what}"),
            &g.tensor_to_host(&gy).unwrap(),
            cy.data(),
        );

        let gu = rvec(&mut rng, r * 2 * n, 4.0);
        let (ggu, cgu) = pair(&g, &c, r, 2 * n, &gu);
        let (gy, cy) = (g.silu_mul(&ggu).unwrap(), c.silu_mul(&cgu).unwrap());
        assert_eq!(g.dims(&gy), (r, n));
        check(
            &format!("silu_mul {what}"),
            &g.tensor_to_host(&gy).unwrap(),
            cy.data(),
        );

        let (mut gx, mut cx) = pair(&g, &c, r, n, &a);
        g.add(&mut gx, &gb).unwrap();
        c.add(&mut cx, &cb).unwrap();
        check(
            &format!("add {what}"),
            &g.tensor_to_host(&gx).unwrap(),
            cx.data(),
        );

        g.relu(&mut gx).unwrap();
        c.relu(&mut cx).unwrap();
        check(
            &format!("relu {what}"),
            &g.tensor_to_host(&gx).unwrap(),
            cx.data(),
        );

        // Gemma's gated MLP, embedding scale and logit soft-capping.
        let (gy, cy) = (
            g.gelu_tanh_mul(&ggu).unwrap(),
            c.gelu_tanh_mul(&cgu).unwrap(),
        );
        check(
            &format!("gelu_tanh_mul {what}"),
            &g.tensor_to_host(&gy).unwrap(),
            cy.data(),
        );
        let (mut gx, mut cx) = pair(&g, &c, r, n, &a);
        g.scale(&mut gx, 25.25).unwrap();
        c.scale(&mut cx, 25.25).unwrap();
        g.softcap(&mut gx, 30.0).unwrap();
        c.softcap(&mut cx, 30.0).unwrap();
        check(
            &format!("scale, softcap {what}"),
            &g.tensor_to_host(&gx).unwrap(),
            cx.data(),
        );
    }
    let (ga, _) = pair(&g, &c, 2, 3, &[1.0; 6]);
    let (mut gb, _) = pair(&g, &c, 3, 2, &[1.0; 6]);
    assert!(g.add(&mut gb, &ga).is_err());
    assert!(g.silu_mul(&ga).is_err());
    assert!(g.gelu_tanh_mul(&ga).is_err());
    let (mut gx, _) = pair(&g, &c, 2, 3, &[1.0; 6]);
    assert!(g.softcap(&mut gx, 0.0).is_err());
}

#[test]
fn norms_match_cpu() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut rng = Rng::new(3);
    for &(r, n) in SHAPES {
        let what = format!("[{r}, {n}]");
        let x = rvec(&mut rng, r * n, 2.0);
        let res = rvec(&mut rng, r * n, 2.0);
        let w: Vec<f32> = (0..n).map(|_| bf(1.0 + 0.5 * rng.uniform())).collect();
        let bias = rvec(&mut rng, n, 1.0);
        let (gx, cx) = pair(&g, &c, r, n, &x);
        let (gw, cw) = wpair(&g, &c, vec![n], w);
        let (gbias, cbias) = wpair(&g, &c, vec![n], bias);

        let (gy, cy) = (
            g.rms_norm(&gx, &gw, 1e-6).unwrap(),
            c.rms_norm(&cx, &cw, 1e-6).unwrap(),
        );
        check(
            &format!("rms_norm {what}"),
            &g.tensor_to_host(&gy).unwrap(),
            cy.data(),
        );

        let (mut gr, mut cr) = pair(&g, &c, r, n, &res);
        let gy = g.add_rms_norm(&mut gr, &gx, &gw, 1e-6).unwrap();
        let cy = c.add_rms_norm(&mut cr, &cx, &cw, 1e-6).unwrap();
        check(
            &format!("add_rms_norm {what}"),
            &g.tensor_to_host(&gy).unwrap(),
            cy.data(),
        );
        check(
            &format!("add_rms_norm residual {what}"),
            &g.tensor_to_host(&gr).unwrap(),
            cr.data(),
        );

        let gy = g.layer_norm(&gx, &gw, &gbias, 1e-5).unwrap();
        let cy = c.layer_norm(&cx, &cw, &cbias, 1e-5).unwrap();
        check(
            &format!("layer_norm {what}"),
            &g.tensor_to_host(&gy).unwrap(),
            cy.data(),
        );
    }
    for hd in [64, 128] {
        for (r, heads) in [(1, 1), (5, 3), (19, 16)] {
            let x = rvec(&mut rng, r * heads * hd, 3.0);
            let w: Vec<f32> = (0..hd).map(|_| bf(1.0 + 0.5 * rng.uniform())).collect();
            let (mut gx, mut cx) = pair(&g, &c, r, heads * hd, &x);
            let (gw, cw) = wpair(&g, &c, vec![hd], w);
            g.head_rms_norm(&mut gx, &gw, hd, 1e-6).unwrap();
            c.head_rms_norm(&mut cx, &cw, hd, 1e-6).unwrap();
            let what = format!("head_rms_norm rows {r} heads {heads} hd {hd}");
            check(&what, &g.tensor_to_host(&gx).unwrap(), cx.data());
        }
    }
    let (gx, _) = pair(&g, &c, 2, 4, &[1.0; 8]);
    let (gw, _) = wpair(&g, &c, vec![3], vec![1.0; 3]);
    assert!(g.rms_norm(&gx, &gw, 1e-6).is_err());
}

#[test]
fn linear_matches_cpu() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut rng = Rng::new(4);
    for (rows, inner, out) in [
        (1, 64, 64),
        (5, 96, 33),
        (17, 1000, 257),
        (128, 576, 1536),
        (3, 7, 1),
        // The decode path (gemv_bf16): 1..=8 rows, K a multiple of 8,
        // odd N, and the Qwen3-0.6B shapes.
        (1, 1024, 2048),
        (2, 8, 5),
        (3, 3072, 1024),
        (4, 1024, 6144),
        (6, 2048, 1023),
        (7, 16, 3),
        (8, 1024, 4099),
        (9, 1024, 512),
    ] {
        let x = rvec(&mut rng, rows * inner, 1.0);
        let w = rvec(&mut rng, out * inner, 0.2);
        let bias = rvec(&mut rng, out, 1.0);
        let (gx, cx) = pair(&g, &c, rows, inner, &x);
        let (gw, cw) = wpair(&g, &c, vec![out, inner], w);
        let (gb, cb) = wpair(&g, &c, vec![out], bias);
        let what = format!("linear [{rows}, {inner}] x [{out}, {inner}]^T");
        let gy = g.linear(&gx, &gw, None).unwrap();
        let cy = c.linear(&cx, &cw, None).unwrap();
        assert_eq!(g.dims(&gy), (rows, out));
        check(&what, &g.tensor_to_host(&gy).unwrap(), cy.data());
        let gy = g.linear(&gx, &gw, Some(&gb)).unwrap();
        let cy = c.linear(&cx, &cw, Some(&cb)).unwrap();
        check(
            &format!("{what} + bias"),
            &g.tensor_to_host(&gy).unwrap(),
            cy.data(),
        );
    }
    let (gx, _) = pair(&g, &c, 2, 4, &[1.0; 8]);
    let (gw, _) = wpair(&g, &c, vec![3, 5], vec![1.0; 15]);
    assert!(g.linear(&gx, &gw, None).is_err());
}

/// A biased `linear` rounds to bf16 once, like PyTorch's bf16 `F.linear`:
/// every element lies within half a bf16 ulp of the f32 product plus bias
/// (the CPU's, on the same bf16 values), plus f32 summation slack. Rounding
/// the product to bf16 first and the sum again breaks that bound wherever
/// the first rounding crosses a rounding boundary of the sum, which with
/// biases larger than the products happens in a good share of elements.
/// Covers the GEMM path (more than 8 rows) and the fused-bias gemv path.
#[test]
fn biased_linear_rounds_to_bf16_once() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut rng = Rng::new(12);
    for (rows, inner, out) in [(9, 64, 96), (64, 512, 256), (300, 128, 64), (4, 256, 128)] {
        let x = rvec(&mut rng, rows * inner, 1.0);
        let w = rvec(&mut rng, out * inner, 0.2);
        let bias = rvec(&mut rng, out, 8.0);
        // f32 summation slack: a small multiple of f32 epsilon times the
        // sum of the magnitudes of the terms.
        let slack: Vec<f64> = (0..rows * out)
            .map(|i| {
                let (r, o) = (i / out, i % out);
                let sum_abs: f64 = (0..inner)
                    .map(|k| (x[r * inner + k] as f64 * w[o * inner + k] as f64).abs())
                    .sum();
                1e-5 * sum_abs
            })
            .collect();
        let (gx, cx) = pair(&g, &c, rows, inner, &x);
        let (gw, cw) = wpair(&g, &c, vec![out, inner], w);
        let (gb, cb) = wpair(&g, &c, vec![out], bias);
        let got = g
            .tensor_to_host(&g.linear(&gx, &gw, Some(&gb)).unwrap())
            .unwrap();
        let want = c.linear(&cx, &cw, Some(&cb)).unwrap().data().to_vec();
        let mut bad = Vec::new();
        for (i, (&gv, &wv)) in got.iter().zip(&want).enumerate() {
            // Half a bf16 ulp of `wv`: 2^(exponent - 8).
            let half_ulp = if wv == 0.0 {
                0.0
            } else {
                2f64.powi((wv.abs() as f64).log2().floor() as i32 - 8)
            };
            let bound = half_ulp + slack[i];
            if !gv.is_finite() || (gv as f64 - wv as f64).abs() > bound {
                bad.push(format!(
                    "[{}, {}]: got {gv}, want {wv} (bound {bound:.3e})",
                    i / out,
                    i % out
                ));
            }
        }
        assert!(
            bad.is_empty(),
            "linear [{rows}, {inner}] x [{out}, {inner}]^T + bias: {} of {} elements \
             rounded more than once, e.g. {}",
            bad.len(),
            got.len(),
            bad[..bad.len().min(5)].join("; ")
        );
    }
}

/// A step of mixed prefill (with cached prefixes) and decode sequences plus
/// padding, over shuffled blocks.
fn mixed_step(rng: &mut Rng, block_size: usize, pad: usize) -> PagedStep {
    let seqs = [
        SeqSpec {
            context_len: 0,
            query_len: 13,
        },
        SeqSpec {
            context_len: 37,
            query_len: 1,
        },
        SeqSpec {
            context_len: 16,
            query_len: 5,
        },
        SeqSpec {
            context_len: 3,
            query_len: 1,
        },
    ];
    paged_step(rng, &seqs, block_size, 64, pad)
}

#[test]
fn table_and_row_ops_match_cpu() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut rng = Rng::new(5);
    let ps = mixed_step(&mut rng, 16, 2);
    let (gs, cs) = (
        g.begin_step(&ps.ctx).unwrap(),
        c.begin_step(&ps.ctx).unwrap(),
    );
    let t = ps.ctx.num_tokens();
    for hidden in [1, 64, 333] {
        let (ge, ce) = wpair(&g, &c, vec![100, hidden], rvec(&mut rng, 100 * hidden, 1.0));
        let gy = g.embedding(&gs, &ge).unwrap();
        let cy = c.embedding(&cs, &ce).unwrap();
        assert_eq!(g.dims(&gy), (t, hidden));
        check(
            &format!("embedding hidden {hidden}"),
            &g.tensor_to_host(&gy).unwrap(),
            cy.data(),
        );

        // Learned positions with OPT's offset of 2.
        let (gp, cp) = wpair(&g, &c, vec![64, hidden], rvec(&mut rng, 64 * hidden, 1.0));
        let x = rvec(&mut rng, t * hidden, 1.0);
        let (mut gx, mut cx) = pair(&g, &c, t, hidden, &x);
        g.add_position_embedding(&mut gx, &gs, &gp, 2).unwrap();
        c.add_position_embedding(&mut cx, &cs, &cp, 2).unwrap();
        check(
            &format!("add_position_embedding {hidden}"),
            &g.tensor_to_host(&gx).unwrap(),
            cx.data(),
        );
        assert!(g.add_position_embedding(&mut gx, &gs, &gp, 40).is_err());

        let gl = g.gather_logits_rows(&gx, &gs).unwrap();
        let cl = c.gather_logits_rows(&cx, &cs).unwrap();
        assert_eq!(g.dims(&gl), (ps.ctx.logits_indices.len(), hidden));
        check(
            &format!("gather_logits_rows {hidden}"),
            &g.tensor_to_host(&gl).unwrap(),
            cl.data(),
        );
    }
    let (small, _) = wpair(&g, &c, vec![10, 4], vec![0.5; 40]);
    assert!(
        g.embedding(&gs, &small).is_err(),
        "token ids up to 99 exceed 10 rows"
    );
}

#[test]
fn rope_matches_cpu() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut rng = Rng::new(6);
    let ps = mixed_step(&mut rng, 16, 1);
    let (gs, cs) = (
        g.begin_step(&ps.ctx).unwrap(),
        c.begin_step(&ps.ctx).unwrap(),
    );
    let t = ps.ctx.num_tokens();
    for (hd, rd, heads) in [(64, 64, 3), (128, 128, 2), (64, 32, 4), (128, 64, 1)] {
        // A real cos/sin table (theta 10000), kept in f32 by load_table.
        let max_pos = 64;
        let mut table = Vec::with_capacity(max_pos * rd);
        for p in 0..max_pos {
            let ang: Vec<f32> = (0..rd / 2)
                .map(|i| p as f32 / 10000f32.powf(2.0 * i as f32 / rd as f32))
                .collect();
            table.extend(ang.iter().map(|a| a.cos()));
            table.extend(ang.iter().map(|a| a.sin()));
        }
        let ht = HostTensor::f32(vec![max_pos, rd], table);
        let (gt, ct) = (g.load_table(ht.clone()).unwrap(), c.load_table(ht).unwrap());
        for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
            let x = rvec(&mut rng, t * heads * hd, 2.0);
            let (mut gx, mut cx) = pair(&g, &c, t, heads * hd, &x);
            g.rope(&mut gx, &gs, &gt, hd, style).unwrap();
            c.rope(&mut cx, &cs, &ct, hd, style).unwrap();
            let what = format!("rope {style:?} hd {hd} rd {rd} heads {heads}");
            check(&what, &g.tensor_to_host(&gx).unwrap(), cx.data());
        }
    }
}

#[test]
fn store_kv_and_copy_blocks_match_cpu() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut rng = Rng::new(7);
    // Widths of 128, 128, 512 (16-byte path) and 36 (one element per thread).
    for (block_size, nkv, hd) in [(16, 2, 64), (5, 1, 128), (32, 8, 64), (7, 3, 12)] {
        let ps = mixed_step(&mut rng, block_size, 3);
        let shape = KvCacheShape {
            num_blocks: 64,
            block_size,
            num_kv_heads: nkv,
            head_dim: hd,
        };
        let mut gc = g.alloc_kv_cache(shape).unwrap();
        let mut cc = c.alloc_kv_cache(shape).unwrap();
        let (gs, cs) = (
            g.begin_step(&ps.ctx).unwrap(),
            c.begin_step(&ps.ctx).unwrap(),
        );
        let t = ps.ctx.num_tokens();
        let w = nkv * hd;
        let (k, v) = (rvec(&mut rng, t * w, 2.0), rvec(&mut rng, t * w, 2.0));
        let (gk, ck) = pair(&g, &c, t, w, &k);
        let (gv, cv) = pair(&g, &c, t, w, &v);
        g.store_kv(&gk, &gv, &mut gc, &gs).unwrap();
        c.store_kv(&ck, &cv, &mut cc, &cs).unwrap();
        let (hk, hv) = g.kv_cache_to_host(&gc).unwrap();
        // Stored values are bf16 inputs, so the caches agree exactly (padding
        // rows with slot -1 wrote nothing on either side).
        assert_eq!(hk, &cc.k()[..], "store_kv K bs {block_size}");
        assert_eq!(hv, &cc.v()[..], "store_kv V bs {block_size}");

        let b0 = ps.tables[0][0];
        let b2 = *ps.tables[2].last().expect("every sequence has a block");
        let free: Vec<u32> = (0..64u32)
            .filter(|b| !ps.tables.iter().any(|t| t.contains(b)))
            .collect();
        let copies = [
            BlockCopy {
                src: BlockId(b0),
                dst: BlockId(free[0]),
                num_tokens: block_size,
            },
            BlockCopy {
                src: BlockId(b2),
                dst: BlockId(free[1]),
                num_tokens: block_size / 2 + 1,
            },
        ];
        g.copy_blocks(&mut gc, &copies).unwrap();
        c.copy_blocks(&mut cc, &copies).unwrap();
        let (hk, hv) = g.kv_cache_to_host(&gc).unwrap();
        assert_eq!(hk, &cc.k()[..], "copy_blocks K bs {block_size}");
        assert_eq!(hv, &cc.v()[..], "copy_blocks V bs {block_size}");
        let bad = [BlockCopy {
            src: BlockId(64),
            dst: BlockId(0),
            num_tokens: 1,
        }];
        assert!(g.copy_blocks(&mut gc, &bad).is_err());
    }
}

/// Asserts no NaN/inf and `‖got − want‖ / ‖want‖ < tol` (`‖got‖ < tol`
/// where `want` is all zeros).
fn check_tol(what: &str, got: &[f32], want: &[f32], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().position(|v| !v.is_finite()) {
        panic!("{what}: element {i} is {} (unwritten or overflow)", got[i]);
    }
    let (mut num, mut den) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    let rel = if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    };
    assert!(
        rel < tol,
        "{what}: relative error {rel:.3e} (bar {tol:.0e})"
    );
}

/// `n` random values in `[-scale, scale)` at full f32 precision (residual
/// stream values are not bf16-representable in general).
/// The f32 residual stream: `embedding` makes it, `add_linear`, `add` and
/// `add_position_embedding` accumulate into it without rounding to bf16 (so
/// the CPU's f32 results are matched to f32 accuracy, far below bf16's
/// 2^-9), the norms read it, and the bf16-only ops refuse it.
#[test]
fn residual_stream_ops_match_cpu() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut rng = Rng::new(8);
    // Products of bf16 inputs accumulated in f32: only summation order differs.
    const F32_TOL: f64 = 1e-5;

    for (rows, inner, out) in [
        (1, 64, 64),
        (3, 1024, 1024),
        (8, 3072, 1024),
        (9, 1024, 1024),
        (17, 1000, 257),
        (128, 2048, 1024),
        (3, 7, 5),
    ] {
        let what = format!("add_linear [{rows}, {inner}] x [{out}, {inner}]^T");
        let x = rvec(&mut rng, rows * inner, 1.0);
        let w = rvec(&mut rng, out * inner, 0.2);
        let bias = rvec(&mut rng, out, 1.0);
        let res = rvec_f32(&mut rng, rows * out, 2.0);
        let (gx, cx) = pair(&g, &c, rows, inner, &x);
        let (gw, cw) = wpair(&g, &c, vec![out, inner], w);
        let (gb, cb) = wpair(&g, &c, vec![out], bias);
        for with_bias in [false, true] {
            let mut gr = g.residual_from_host(rows, out, &res).unwrap();
            let mut cr = c.tensor_from_host(rows, out, &res).unwrap();
            let (gbias, cbias) = if with_bias {
                (Some(&gb), Some(&cb))
            } else {
                (None, None)
            };
            g.add_linear(&mut gr, &gx, &gw, gbias).unwrap();
            c.add_linear(&mut cr, &cx, &cw, cbias).unwrap();
            assert!(gr.is_f32());
            check_tol(
                &format!("{what} bias {with_bias}"),
                &g.tensor_to_host(&gr).unwrap(),
                cr.data(),
                F32_TOL,
            );
        }
        // Into a bf16 activation (OPT's post-norm layers): linear, then add.
        let res16 = rvec(&mut rng, rows * out, 2.0);
        let (mut gr, mut cr) = pair(&g, &c, rows, out, &res16);
        g.add_linear(&mut gr, &gx, &gw, Some(&gb)).unwrap();
        c.add_linear(&mut cr, &cx, &cw, Some(&cb)).unwrap();
        assert!(!gr.is_f32());
        check(
            &format!("{what} into bf16"),
            &g.tensor_to_host(&gr).unwrap(),
            cr.data(),
        );
        let mut wrong = g.residual_from_host(rows, out + 1, &vec![0.0; rows * (out + 1)]);
        assert!(g
            .add_linear(wrong.as_mut().unwrap(), &gx, &gw, None)
            .is_err());
    }

    for &(r, n) in SHAPES {
        let what = format!("[{r}, {n}]");
        let res = rvec_f32(&mut rng, r * n, 2.0);
        let x = rvec(&mut rng, r * n, 2.0);
        let w: Vec<f32> = (0..n).map(|_| bf(1.0 + 0.5 * rng.uniform())).collect();
        let bias = rvec(&mut rng, n, 1.0);
        let (gw, cw) = wpair(&g, &c, vec![n], w);
        let (gbias, cbias) = wpair(&g, &c, vec![n], bias);
        let gres = g.residual_from_host(r, n, &res).unwrap();
        let cres = c.tensor_from_host(r, n, &res).unwrap();
        let (gx, cx) = pair(&g, &c, r, n, &x);

        let gy = g.rms_norm(&gres, &gw, 1e-6).unwrap();
        let cy = c.rms_norm(&cres, &cw, 1e-6).unwrap();
        assert!(!gy.is_f32(), "norms return bf16");
        check(
            &format!("rms_norm of f32 {what}"),
            &g.tensor_to_host(&gy).unwrap(),
            cy.data(),
        );
        let gy = g.layer_norm(&gres, &gw, &gbias, 1e-5).unwrap();
        let cy = c.layer_norm(&cres, &cw, &cbias, 1e-5).unwrap();
        check(
            &format!("layer_norm of f32 {what}"),
            &g.tensor_to_host(&gy).unwrap(),
            cy.data(),
        );

        let mut gr = g.residual_from_host(r, n, &res).unwrap();
        let mut cr = c.tensor_from_host(r, n, &res).unwrap();
        let gy = g.add_rms_norm(&mut gr, &gx, &gw, 1e-6).unwrap();
        let cy = c.add_rms_norm(&mut cr, &cx, &cw, 1e-6).unwrap();
        check(
            &format!("add_rms_norm into f32 {what}"),
            &g.tensor_to_host(&gy).unwrap(),
            cy.data(),
        );
        check_tol(
            &format!("add_rms_norm f32 residual {what}"),
            &g.tensor_to_host(&gr).unwrap(),
            cr.data(),
            1e-6,
        );

        let mut gr = g.residual_from_host(r, n, &res).unwrap();
        let mut cr = c.tensor_from_host(r, n, &res).unwrap();
        g.add(&mut gr, &gx).unwrap();
        c.add(&mut cr, &cx).unwrap();
        check_tol(
            &format!("add bf16 into f32 {what}"),
            &g.tensor_to_host(&gr).unwrap(),
            cr.data(),
            1e-6,
        );
        let gres2 = g.residual_from_host(r, n, &res).unwrap();
        g.add(&mut gr, &gres2).unwrap();
        c.add(&mut cr, &cres).unwrap();
        check_tol(
            &format!("add f32 into f32 {what}"),
            &g.tensor_to_host(&gr).unwrap(),
            cr.data(),
            1e-6,
        );

        // The bf16-only ops refuse the residual stream.
        let (mut gx2, _) = pair(&g, &c, r, n, &x);
        assert!(g.add(&mut gx2, &gres).is_err(), "bf16 += f32");
        assert!(g.linear(&gres, &gw, None).is_err());
        assert!(g.silu_mul2(&gres, &gx).is_err());
        let mut gr = g.residual_from_host(r, n, &res).unwrap();
        assert!(g.relu(&mut gr).is_err());
    }

    // embedding starts the f32 stream; positions add into it; the logits
    // rows keep its precision.
    let ps = mixed_step(&mut rng, 16, 2);
    let (gs, cs) = (
        g.begin_step(&ps.ctx).unwrap(),
        c.begin_step(&ps.ctx).unwrap(),
    );
    for hidden in [64, 333] {
        let (ge, ce) = wpair(&g, &c, vec![100, hidden], rvec(&mut rng, 100 * hidden, 1.0));
        let (gp, cp) = wpair(&g, &c, vec![64, hidden], rvec(&mut rng, 64 * hidden, 1.0));
        let mut gx = g.embedding(&gs, &ge).unwrap();
        let mut cx = c.embedding(&cs, &ce).unwrap();
        assert!(gx.is_f32(), "embedding makes the f32 residual stream");
        g.add_position_embedding(&mut gx, &gs, &gp, 2).unwrap();
        c.add_position_embedding(&mut cx, &cs, &cp, 2).unwrap();
        check_tol(
            &format!("embedding + positions in f32, hidden {hidden}"),
            &g.tensor_to_host(&gx).unwrap(),
            cx.data(),
            1e-6,
        );
        let gl = g.gather_logits_rows(&gx, &gs).unwrap();
        let cl = c.gather_logits_rows(&cx, &cs).unwrap();
        assert!(gl.is_f32());
        check_tol(
            &format!("gather_logits_rows of f32, hidden {hidden}"),
            &g.tensor_to_host(&gl).unwrap(),
            cl.data(),
            1e-7,
        );
        let t = ps.ctx.num_tokens();
        let mut gq = g
            .residual_from_host(t, hidden, &vec![0.5; t * hidden])
            .unwrap();
        let ht = HostTensor::f32(vec![64, hidden], vec![1.0; 64 * hidden]);
        let table = g.load_table(ht).unwrap();
        assert!(g
            .rope(&mut gq, &gs, &table, hidden, RopeStyle::Neox)
            .is_err());
    }
}
