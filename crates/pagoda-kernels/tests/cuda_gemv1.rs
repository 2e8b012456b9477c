//! The batch-1 GEMV kernels (kernels/gemv1.cu, `CudaBackend::set_gemv1`)
//! against the CPU backend and against the `gemv.cu` kernels they replace,
//! on the same bf16 inputs, at one row:
//! - `linear` with and without a bias and `add_linear` into an f32 residual,
//!   at shapes of every split-K width (1 to 8 warps per output: N from 1 to
//!   4,096, K from 8 to 16,384, K not a multiple of 256, N not a multiple
//!   of 8): every element within half a bf16 ulp of the CPU's f32 result
//!   plus f32 summation slack;
//! - `linear3` (q, k, v in one launch, biases on two) against the CPU;
//! - `norm_linear3` and `norm_gate_up_silu` (the RMSNorm folded into the
//!   load; the SiLU gate in the output) in modes `On` and `All`, fusions on
//!   and off, against the CPU (relative L2 under 1e-2) and against the
//!   `gemv.cu` sequence (under 2e-3), at a tiny shape, Qwen3-0.6B's layer
//!   and a 4,096-wide layer whose gate/up weight is over
//!   `LARGE_WEIGHT_BYTES` (there `On` runs `rms_norm` then the batch-1
//!   gate/up GEMV with the SiLU in its output, `All` the fused-norm one);
//! - which launches the modes choose (`norm_fusion_for`).
//!
//! Outputs are NaN-poisoned, so an element left unwritten fails.
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
use pagoda_kernels::cuda::{CudaBackend, Gemv1, SmallLinear, LARGE_WEIGHT_BYTES};
use pagoda_kernels::{Backend, HostTensor};

fn weight<B: Backend>(b: &B, shape: Vec<usize>, data: &[f32]) -> B::Weight {
    b.load_weight(HostTensor::f32(shape, data.to_vec()))
        .unwrap()
}

/// Asserts every element of `got` within half a bf16 ulp of `want` plus
/// `slack[i]`.
fn check_rounded_once(what: &str, got: &[f32], want: &[f32], slack: &[f64]) {
    let mut bad = Vec::new();
    for (i, (&gv, &wv)) in got.iter().zip(want).enumerate() {
        let half_ulp = if wv == 0.0 {
            0.0
        } else {
            2f64.powi((wv.abs() as f64).log2().floor() as i32 - 8)
        };
        let bound = half_ulp + slack[i];
        if !gv.is_finite() || (gv as f64 - wv as f64).abs() > bound {
            bad.push(format!("{i}: got {gv}, want {wv} (bound {bound:.3e})"));
        }
    }
    assert!(
        bad.is_empty(),
        "{what}: {} of {} elements off, e.g. {}",
        bad.len(),
        got.len(),
        bad[..bad.len().min(5)].join("; ")
    );
}

/// No NaN/inf, relative L2 error under `tol`.
fn check_rel(what: &str, got: &[f32], want: &[f32], tol: f64) {
    if let Some(i) = got.iter().position(|v| !v.is_finite()) {
        panic!("{what}: element {i} is {} (unwritten or overflow)", got[i]);
    }
    let e = rel_err_l2(got, want);
    assert!(e < tol, "{what}: relative error {e:.3e} (bar {tol:.0e})");
}

/// (inner, out): every split width (see gemv1.rs `split_for`), K % 256 !=
/// 0, N % 8 != 0, one output, K = 8.
const SHAPES: &[(usize, usize)] = &[
    (8, 5),
    (24, 37),
    (520, 1),
    (1000, 129),
    (2048, 1024),
    (3072, 1000),
    (1024, 3),
    (16384, 16),
    (4096, 264),
    (1024, 4096),
];

#[test]
fn batch1_linear_matches_cpu() {
    let Some(g) = gpu() else { return };
    let c = backend(2, WeightDtype::F32);
    let mut rng = Rng::new(51);
    g.set_small_linear(SmallLinear::Auto);
    g.set_gemv1(Gemv1::On);
    for &(inner, out) in SHAPES {
        let w = rvec(&mut rng, out * inner, 0.2);
        let bias = rvec(&mut rng, out, 8.0);
        let (gw, cw) = (
            weight(&g, vec![out, inner], &w),
            weight(&c, vec![out, inner], &w),
        );
        let (gb, cb) = (weight(&g, vec![out], &bias), weight(&c, vec![out], &bias));
        let x = rvec(&mut rng, inner, 1.0);
        let slack: Vec<f64> = (0..out)
            .map(|o| {
                let s: f64 = (0..inner)
                    .map(|k| (x[k] as f64 * w[o * inner + k] as f64).abs())
                    .sum();
                2e-5 * s
            })
            .collect();
        let gx = g.tensor_from_host(1, inner, &x).unwrap();
        let cx = c.tensor_from_host(1, inner, &x).unwrap();
        for with_bias in [false, true] {
            let what = format!("[1, {inner}] x [{out}, {inner}]^T bias {with_bias}");
            let (gbias, cbias) = if with_bias {
                (Some(&gb), Some(&cb))
            } else {
                (None, None)
            };
            let gy = g.linear(&gx, &gw, gbias).unwrap();
            let cy = c.linear(&cx, &cw, cbias).unwrap();
            assert_eq!(g.dims(&gy), (1, out));
            let got = g.tensor_to_host(&gy).unwrap();
            check_rounded_once(&format!("{what} linear"), &got, cy.data(), &slack);
            let res = rvec_f32(&mut rng, out, 2.0);
            let mut gr = g.residual_from_host(1, out, &res).unwrap();
            let mut cr = c.tensor_from_host(1, out, &res).unwrap();
            g.add_linear(&mut gr, &gx, &gw, gbias).unwrap();
            c.add_linear(&mut cr, &cx, &cw, cbias).unwrap();
            let got = g.tensor_to_host(&gr).unwrap();
            check_rel(&format!("{what} add_linear"), &got, cr.data(), 1e-5);
        }
    }
}

#[test]
fn batch1_linear3_matches_cpu() {
    let Some(g) = gpu() else { return };
    let c = backend(2, WeightDtype::F32);
    let mut rng = Rng::new(52);
    g.set_gemv1(Gemv1::On);
    for (inner, dims) in [(200, [37usize, 8, 5]), (1024, [2048, 1024, 1024])] {
        let ws: Vec<Vec<f32>> = dims
            .iter()
            .map(|&n| rvec(&mut rng, n * inner, 0.2))
            .collect();
        let bs: Vec<Vec<f32>> = dims.iter().map(|&n| rvec(&mut rng, n, 1.0)).collect();
        let gw: Vec<_> = (0..3)
            .map(|i| weight(&g, vec![dims[i], inner], &ws[i]))
            .collect();
        let cw: Vec<_> = (0..3)
            .map(|i| weight(&c, vec![dims[i], inner], &ws[i]))
            .collect();
        let gb: Vec<_> = (0..3).map(|i| weight(&g, vec![dims[i]], &bs[i])).collect();
        let cb: Vec<_> = (0..3).map(|i| weight(&c, vec![dims[i]], &bs[i])).collect();
        let x = rvec(&mut rng, inner, 1.0);
        let gx = g.tensor_from_host(1, inner, &x).unwrap();
        let cx = c.tensor_from_host(1, inner, &x).unwrap();
        let gbias = [Some(&gb[0]), None, Some(&gb[2])];
        let cbias = [Some(&cb[0]), None, Some(&cb[2])];
        let got = g.linear3(&gx, [&gw[0], &gw[1], &gw[2]], gbias).unwrap();
        let want = c.linear3(&cx, [&cw[0], &cw[1], &cw[2]], cbias).unwrap();
        for i in 0..3 {
            let what = format!("linear3 inner {inner} product {i}");
            assert_eq!(g.dims(&got[i]), (1, dims[i]), "{what}");
            let y = g.tensor_to_host(&got[i]).unwrap();
            check_rel(&what, &y, want[i].data(), 1e-2);
        }
    }
}

/// One layer's norm, q/k/v and gate/up weights, on the host.
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
    HostLayer {
        hidden,
        inter,
        dims,
        norm: (0..hidden).map(|_| bf(1.0 + 0.5 * rng.uniform())).collect(),
        qkv: dims.map(|n| rvec(rng, n * hidden, 0.1)),
        bias: dims.map(|n| rvec(rng, n, 1.0)),
        gate_up: rvec(rng, 2 * inter * hidden, 0.1),
    }
}

/// The layer's `norm_linear3` and `norm_gate_up_silu` on `b` (q, k, v, act).
fn norm_products<B: Backend>(b: &B, host: &HostLayer, x: &B::Tensor) -> Vec<Vec<f32>> {
    let h = host.hidden;
    let norm = weight(b, vec![h], &host.norm);
    let qkv = [0, 1, 2].map(|i| weight(b, vec![host.dims[i], h], &host.qkv[i]));
    let bias = [0, 1, 2].map(|i| weight(b, vec![host.dims[i]], &host.bias[i]));
    let gate_up = weight(b, vec![2 * host.inter, h], &host.gate_up);
    let [q, k, v] = b
        .norm_linear3(
            x,
            &norm,
            1e-6,
            [&qkv[0], &qkv[1], &qkv[2]],
            [Some(&bias[0]), None, Some(&bias[2])],
        )
        .unwrap();
    let a = b.norm_gate_up_silu(x, &norm, 1e-6, &gate_up).unwrap();
    [q, k, v, a]
        .iter()
        .map(|t| b.tensor_to_host(t).unwrap())
        .collect()
}

fn run_norm_layer(g: &CudaBackend, c: &CpuBackend, host: &HostLayer, seed: u64) {
    let mut rng = Rng::new(seed);
    let h = host.hidden;
    let x = rvec_f32(&mut rng, h, 6.0);
    let gx = g.residual_from_host(1, h, &x).unwrap();
    let cx = c.tensor_from_host(1, h, &x).unwrap();
    let want = norm_products(c, host, &cx);
    g.set_small_linear(SmallLinear::Auto);
    g.set_decode_fusion(true);
    g.set_gemv1(Gemv1::Off);
    let old = norm_products(g, host, &gx);
    for mode in [Gemv1::On, Gemv1::All] {
        for fusion in [true, false] {
            g.set_gemv1(mode);
            g.set_decode_fusion(fusion);
            let got = norm_products(g, host, &gx);
            for (i, name) in ["q", "k", "v", "silu(gate) * up"].iter().enumerate() {
                let what = format!("{mode:?} fusion {fusion} hidden {h} {name}");
                check_rel(&what, &got[i], &want[i], 1e-2);
                check_rel(&format!("{what} vs gemv.cu"), &got[i], &old[i], 2e-3);
            }
        }
    }
    g.set_decode_fusion(true);
    g.set_gemv1(Gemv1::from_env());
}

#[test]
fn batch1_norm_products_match_cpu_and_gemv() {
    let Some(g) = gpu() else { return };
    let c = backend(2, WeightDtype::F32);
    let mut rng = Rng::new(53);
    let tiny = host_layer(&mut rng, 200, [37, 8, 5], 21);
    run_norm_layer(&g, &c, &tiny, 1);
    let qwen = host_layer(&mut rng, 1024, [2048, 1024, 1024], 3072);
    run_norm_layer(&g, &c, &qwen, 2);
    // gate_up [2 * 1600, 4096] bf16 is 25 MiB: over LARGE_WEIGHT_BYTES.
    let wide = host_layer(&mut rng, 4096, [64, 16, 16], 1600);
    const { assert!(2 * 1600 * 4096 * 2 >= LARGE_WEIGHT_BYTES) };
    run_norm_layer(&g, &c, &wide, 3);
}

/// Which launches each mode takes: `All` folds the norm at one row at any
/// weight size, `On` and `Off` only under `LARGE_WEIGHT_BYTES`; more rows
/// are never affected.
#[test]
fn batch1_modes_choose_the_fused_launches() {
    let Some(g) = gpu() else { return };
    g.set_small_linear(SmallLinear::Auto);
    g.set_decode_fusion(true);
    // Llama-3.1-8B gate_up and Qwen3-0.6B's.
    let (big, small) = ((28672, 4096), (6144, 1024));
    for (mode, at_big) in [(Gemv1::Off, false), (Gemv1::On, false), (Gemv1::All, true)] {
        g.set_gemv1(mode);
        assert_eq!(g.norm_fusion_for(1, big.0, big.1), at_big, "{mode:?}");
        assert!(g.norm_fusion_for(1, small.0, small.1), "{mode:?}");
        assert!(!g.norm_fusion_for(2, big.0, big.1), "{mode:?} 2 rows");
    }
    g.set_decode_fusion(false);
    assert!(!g.norm_fusion_for(1, big.0, big.1));
    g.set_decode_fusion(true);
    g.set_gemv1(Gemv1::from_env());
}
