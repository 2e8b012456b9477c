//! The small-row linear paths of the CUDA backend (tensor-core GEMV, the
//! CUDA-core GEMV, cuBLASLt; `CudaBackend::set_small_linear`) against the
//! CPU backend on the same bf16 inputs, at every row count 1..=17 (17 is past
//! the last GEMV row count) and odd shapes: K not a multiple of 32, N not a
//! multiple of 8, a single output, K = 8. Checked for each path:
//! - `linear` with and without a bias: every element within half a bf16 ulp
//!   of the CPU's f32 result plus f32 summation slack (rounded to bf16 once);
//! - `add_linear` into an f32 residual, with and without a bias: the f32
//!   sum to f32 accuracy (it adds, never overwrites);
//! - the tensor-core GEMV gives each row the same bits whatever the step's
//!   row count (a row's result does not depend on its batch);
//! - which kernel a shape takes ([`SmallLinear::kernel_for`]);
//! - `linear3` (q, k and v in one launch, on either GEMV) has the bits of
//!   three `linear`s.
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
use pagoda_kernels::cuda::testing::gpu_poisoned as gpu;
use pagoda_kernels::cuda::{CudaBackend, GemvKernel, SmallLinear};
use pagoda_kernels::{Backend, HostTensor};

const PATHS: [SmallLinear; 4] = [
    SmallLinear::Auto,
    SmallLinear::Mma,
    SmallLinear::Warp,
    SmallLinear::Cublas,
];

/// (inner, out): K = 8, K % 32 != 0, N % 8 != 0, N = 1, a router-like and
/// a wider shape.
const SHAPES: &[(usize, usize)] = &[
    (8, 5),
    (24, 37),
    (40, 9),
    (520, 1),
    (1000, 129),
    (2048, 128),
    (4096, 264),
];

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

/// Asserts no NaN/inf and `‖got − want‖ / ‖want‖ < tol`.
fn check_rel(what: &str, got: &[f32], want: &[f32], tol: f64) {
    if let Some(i) = got.iter().position(|v| !v.is_finite()) {
        panic!("{what}: element {i} is {} (unwritten or overflow)", got[i]);
    }
    let rel = pagoda_kernels::cuda::testing::rel_err_l2(got, want);
    assert!(
        rel < tol,
        "{what}: relative error {rel:.3e} (bar {tol:.0e})"
    );
}

fn weight<B: Backend>(b: &B, shape: Vec<usize>, data: &[f32]) -> B::Weight {
    b.load_weight(HostTensor::f32(shape, data.to_vec()))
        .unwrap()
}

#[test]
fn kernel_choice_by_rows_and_path() {
    for rows in 1..=17 {
        let mma = SmallLinear::Mma.kernel_for(rows, 64, 4096);
        assert_eq!(mma, (rows <= 16).then_some(GemvKernel::Mma), "rows {rows}");
        let warp = SmallLinear::Warp.kernel_for(rows, 64, 4096);
        assert_eq!(warp, (rows <= 8).then_some(GemvKernel::Warp), "rows {rows}");
        assert_eq!(SmallLinear::Cublas.kernel_for(rows, 64, 4096), None);
        assert_eq!(SmallLinear::Mma.kernel_for(rows, 64, 4100), None);
    }
}

fn run_path(g: &CudaBackend, c: &CpuBackend, path: SmallLinear, rng: &mut Rng) {
    g.set_small_linear(path);
    assert_eq!(g.small_linear(), path);
    for &(inner, out) in SHAPES {
        let w = rvec(rng, out * inner, 0.2);
        let bias = rvec(rng, out, 8.0);
        let (gw, cw) = (
            weight(g, vec![out, inner], &w),
            weight(c, vec![out, inner], &w),
        );
        let (gb, cb) = (weight(g, vec![out], &bias), weight(c, vec![out], &bias));
        for rows in 1..=17 {
            let what = format!("{path:?} [{rows}, {inner}] x [{out}, {inner}]^T");
            let x = rvec(rng, rows * inner, 1.0);
            let slack: Vec<f64> = (0..rows * out)
                .map(|i| {
                    let (r, o) = (i / out, i % out);
                    let s: f64 = (0..inner)
                        .map(|k| (x[r * inner + k] as f64 * w[o * inner + k] as f64).abs())
                        .sum();
                    2e-5 * s
                })
                .collect();
            let gx = g.tensor_from_host(rows, inner, &x).unwrap();
            let cx = c.tensor_from_host(rows, inner, &x).unwrap();
            for with_bias in [false, true] {
                let (gbias, cbias) = if with_bias {
                    (Some(&gb), Some(&cb))
                } else {
                    (None, None)
                };
                let gy = g.linear(&gx, &gw, gbias).unwrap();
                let cy = c.linear(&cx, &cw, cbias).unwrap();
                assert_eq!(g.dims(&gy), (rows, out));
                check_rounded_once(
                    &format!("{what} linear bias {with_bias}"),
                    &g.tensor_to_host(&gy).unwrap(),
                    cy.data(),
                    &slack,
                );
                let res = rvec_f32(rng, rows * out, 2.0);
                let mut gr = g.residual_from_host(rows, out, &res).unwrap();
                let mut cr = c.tensor_from_host(rows, out, &res).unwrap();
                g.add_linear(&mut gr, &gx, &gw, gbias).unwrap();
                c.add_linear(&mut cr, &cx, &cw, cbias).unwrap();
                check_rel(
                    &format!("{what} add_linear bias {with_bias}"),
                    &g.tensor_to_host(&gr).unwrap(),
                    cr.data(),
                    1e-5,
                );
            }
        }
    }
}

#[test]
fn small_row_linear_matches_cpu_on_every_path() {
    let Some(g) = gpu() else { return };
    let c = backend(2, WeightDtype::F32);
    let mut rng = Rng::new(31);
    for path in PATHS {
        run_path(&g, &c, path, &mut rng);
    }
}

/// On the tensor-core GEMV a row's output has the same bits alone and in a
/// step of any row count up to 16 (padding a decode step to a graph's size
/// changes nothing for the real rows).
#[test]
fn mma_gemv_rows_do_not_depend_on_the_batch() {
    let Some(g) = gpu() else { return };
    g.set_small_linear(SmallLinear::Mma);
    let mut rng = Rng::new(32);
    let (inner, out) = (1000, 77);
    let w = rvec(&mut rng, out * inner, 0.2);
    let gw = weight(&g, vec![out, inner], &w);
    let x = rvec(&mut rng, 16 * inner, 1.0);
    let alone: Vec<Vec<f32>> = (0..16)
        .map(|r| {
            let gx = g
                .tensor_from_host(1, inner, &x[r * inner..(r + 1) * inner])
                .unwrap();
            g.tensor_to_host(&g.linear(&gx, &gw, None).unwrap())
                .unwrap()
        })
        .collect();
    for rows in [2, 4, 8, 9, 16] {
        let gx = g.tensor_from_host(rows, inner, &x[..rows * inner]).unwrap();
        let y = g
            .tensor_to_host(&g.linear(&gx, &gw, None).unwrap())
            .unwrap();
        for (r, a) in alone.iter().enumerate().take(rows) {
            assert_eq!(
                &y[r * out..(r + 1) * out],
                &a[..],
                "row {r} of {rows} differs from the row alone"
            );
        }
    }
}

/// `linear3` (q, k, v in one launch on either GEMV) gives the bits
/// of three `linear`s on every path and row count, with a bias on some of
/// the three, and matches the CPU's `linear3`.
#[test]
fn linear3_equals_three_linears() {
    let Some(g) = gpu() else { return };
    let c = backend(2, WeightDtype::F32);
    let mut rng = Rng::new(33);
    let inner = 200;
    let dims = [37usize, 8, 5];
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
    for path in PATHS {
        g.set_small_linear(path);
        for rows in 1..=17 {
            let x = rvec(&mut rng, rows * inner, 1.0);
            let gx = g.tensor_from_host(rows, inner, &x).unwrap();
            let cx = c.tensor_from_host(rows, inner, &x).unwrap();
            // Bias on q and v only.
            let gbias = [Some(&gb[0]), None, Some(&gb[2])];
            let cbias = [Some(&cb[0]), None, Some(&cb[2])];
            let fused = g.linear3(&gx, [&gw[0], &gw[1], &gw[2]], gbias).unwrap();
            let want = c.linear3(&cx, [&cw[0], &cw[1], &cw[2]], cbias).unwrap();
            for i in 0..3 {
                let what = format!("{path:?} rows {rows} product {i}");
                let got = g.tensor_to_host(&fused[i]).unwrap();
                let one = g.linear(&gx, &gw[i], gbias[i]).unwrap();
                let one = g.tensor_to_host(&one).unwrap();
                assert_eq!(g.dims(&fused[i]), (rows, dims[i]), "{what}");
                assert!(
                    got.iter()
                        .zip(&one)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: linear3 differs from linear"
                );
                check_rel(&what, &got, want[i].data(), 1e-2);
            }
        }
    }
    // A weight of another input width is refused.
    g.set_small_linear(SmallLinear::Mma);
    let bad = weight(&g, vec![4, inner + 8], &vec![0.0; 4 * (inner + 8)]);
    let gx = g.tensor_from_host(1, inner, &vec![1.0; inner]).unwrap();
    assert!(g
        .linear3(&gx, [&gw[0], &bad, &gw[2]], [None, None, None])
        .is_err());
}
