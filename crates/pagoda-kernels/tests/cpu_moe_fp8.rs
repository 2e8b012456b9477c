//! FP8 expert weights on the CPU backend (the reference of the CUDA FP8
//! expert kernels): `load_experts` under FP8 weights and `load_fp8_experts`
//! give stacked experts whose `moe_experts` equals an f64 reference on the
//! dequantized weights (each expert's rows quantized with their own scale;
//! inputs not quantized), on random routings with experts that get no
//! token and with every token on one expert; without FP8 weights
//! `load_experts` is `load_weight`; the FP8 result differs from the exact
//! one (the experts really are FP8) by at most the E4M3 error.

mod common;

#[allow(dead_code)]
const PORTABLE: bool = false;

use common::moe::{reference, routes};
use common::*;
use pagoda_kernels::cpu::{CpuBackend, WeightDtype};
use pagoda_kernels::{Backend, Fp8Matrix};

/// Weights with a few large values per row (as real weights have), so the
/// per-row scales differ and small values land in E4M3's subnormal range.
fn weights(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let v = rng.uniform() * scale;
            if i % 97 == 5 {
                v * 8.0
            } else if i % 13 == 0 {
                v * 1e-3
            } else {
                v
            }
        })
        .collect()
}

fn fp8_backend(fp8: bool) -> CpuBackend {
    backend(3, WeightDtype::F32).with_fp8_weights(fp8)
}

#[test]
fn fp8_experts_equal_the_dequantized_reference() {
    let (e, hidden, inter) = (6, 32, 24);
    let mut rng = Rng::new(21);
    let gate_up = weights(&mut rng, e * 2 * inter * hidden, 0.4);
    let down = weights(&mut rng, e * hidden * inter, 0.4);
    let gu_q = Fp8Matrix::quantize(e * 2 * inter, hidden, &gate_up).unwrap();
    let dn_q = Fp8Matrix::quantize(e * hidden, inter, &down).unwrap();
    let (gu_d, dn_d) = (gu_q.dequantize(), dn_q.dequantize());
    let b = fp8_backend(true);
    // Quantized at load, and given as FP8 (an FP8 checkpoint's form).
    let at_load = (
        b.load_experts(weight2(e * 2 * inter, hidden, gate_up.clone()))
            .unwrap(),
        b.load_experts(weight2(e * hidden, inter, down.clone()))
            .unwrap(),
    );
    let given = (
        b.load_fp8_experts(gu_q.clone()).unwrap(),
        b.load_fp8_experts(dn_q.clone()).unwrap(),
    );
    let all: Vec<u32> = (0..e as u32).collect();
    // Experts 0 and 4 never get a token.
    let some: Vec<u32> = vec![1, 2, 3, 5];
    let cases = [
        (1, 2, all.clone()),
        (5, 2, some.clone()),
        (16, 3, all.clone()),
        (40, 2, some),
        (9, 1, vec![3]),
        (33, 1, vec![0]),
        (0, 2, all),
    ];
    for (rows, top_k, pool) in cases {
        let x = rvec_f32(&mut rng, rows * hidden, 1.0);
        let (ids, ws) = routes(&mut rng, rows, top_k, &pool);
        let r = b.moe_routes_from_host(&ids, &ws, top_k).unwrap();
        let xt = tensor(&b, rows, hidden, &x);
        let (want, scale) = reference(&x, (hidden, inter), &ids, &ws, top_k, &gu_d, &dn_d);
        let y1 = host(
            &b,
            &b.moe_experts(&xt, &r, &at_load.0, &at_load.1, e).unwrap(),
        );
        let y2 = host(&b, &b.moe_experts(&xt, &r, &given.0, &given.1, e).unwrap());
        let what = format!("rows {rows} top-{top_k} pool {pool:?}");
        assert_close(&what, &y1, &want, &scale, 1e-6, 1e-5);
        assert_eq!(y1, y2, "{what}: quantized at load vs given as FP8");
        if rows > 0 {
            // The experts really are FP8: away from the exact weights' result
            // by more than rounding, and within E4M3's error (3 mantissa
            // bits: each weight within 1/16 relative, or 1/1024 of its row's
            // scale below the normal range) compounded through gate, up and
            // down: well under 3 * 1/16 of the output's scale.
            let (exact, _) = reference(&x, (hidden, inter), &ids, &ws, top_k, &gate_up, &down);
            let max_dev = y1
                .iter()
                .zip(&exact)
                .zip(&scale)
                .map(|((&g, &w), &s)| (g as f64 - w).abs() / s.max(1e-12))
                .fold(0f64, f64::max);
            assert!(
                max_dev > 1e-5 && max_dev < 3.0 / 16.0,
                "{what}: FP8 vs exact {max_dev}"
            );
        }
    }
}

#[test]
fn load_experts_is_load_weight_without_fp8_weights() {
    let (e, hidden, inter) = (3, 16, 8);
    let mut rng = Rng::new(4);
    let gate_up = rvec_f32(&mut rng, e * 2 * inter * hidden, 0.5);
    let down = rvec_f32(&mut rng, e * hidden * inter, 0.5);
    for dtype in [WeightDtype::F32, WeightDtype::BF16] {
        let b = backend(2, dtype);
        let a = (
            b.load_experts(weight2(e * 2 * inter, hidden, gate_up.clone()))
                .unwrap(),
            b.load_experts(weight2(e * hidden, inter, down.clone()))
                .unwrap(),
        );
        let w = (
            b.load_weight(weight2(e * 2 * inter, hidden, gate_up.clone()))
                .unwrap(),
            b.load_weight(weight2(e * hidden, inter, down.clone()))
                .unwrap(),
        );
        assert_eq!(a, w, "{dtype:?}");
        assert!(!a.0.is_fp8());
    }
}
