//! The CPU backend's mixture-of-experts ops against a straightforward f64
//! reference on seeded random data: routing (softmax, top-k with ties to the
//! lower index, renormalization) and the expert MLPs over stacked weights in
//! every storage (f32, f16, bf16, kept Q8_0 blocks), with experts that get no
//! rows, every row on one expert, decode-sized and prefill-sized row counts;
//! the shared-expert gate (`sigmoid_gate_rows`).

mod common;

#[allow(dead_code)]
const PORTABLE: bool = false;

use common::moe::{reference, routes};
use common::*;
use pagoda_kernels::cpu::{CpuBackend, CpuOptions, WeightDtype};
use pagoda_kernels::{Backend, GgmlType, HostData, HostTensor, QuantData};

const DTYPES: [WeightDtype; 3] = [WeightDtype::F32, WeightDtype::F16, WeightDtype::BF16];

/// Reference routing: f64 softmax, experts sorted by probability (stable,
/// so ties go to the lower index), the first `top_k`, optionally renormalized.
fn route_ref(logits: &[f32], e: usize, top_k: usize, renorm: bool) -> (Vec<u32>, Vec<f64>) {
    let (mut ids, mut ws) = (Vec::new(), Vec::new());
    for row in logits.chunks(e) {
        let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
        let ex: Vec<f64> = row.iter().map(|&x| (x as f64 - max).exp()).collect();
        let sum: f64 = ex.iter().sum();
        let mut idx: Vec<usize> = (0..e).collect();
        idx.sort_by(|&a, &b| ex[b].partial_cmp(&ex[a]).unwrap());
        let chosen = &idx[..top_k];
        let s: f64 = chosen.iter().map(|&i| ex[i] / sum).sum();
        for &i in chosen {
            ids.push(i as u32);
            ws.push(if renorm { ex[i] / sum / s } else { ex[i] / sum });
        }
    }
    (ids, ws)
}

#[test]
fn routing_matches_reference_with_and_without_renormalization() {
    let b = backend(2, WeightDtype::F32);
    let mut rng = Rng::new(7);
    for (rows, e, top_k) in [(1, 8, 2), (13, 8, 2), (5, 16, 4), (3, 128, 8), (4, 3, 3)] {
        let logits = rvec_f32(&mut rng, rows * e, 4.0);
        for renorm in [false, true] {
            let routes = b
                .moe_route(&tensor(&b, rows, e, &logits), top_k, renorm)
                .unwrap();
            let (ids, ws) = route_ref(&logits, e, top_k, renorm);
            assert_eq!(routes.ids(), &ids[..], "{rows}x{e} top-{top_k}");
            assert_close_rel("route weights", routes.weights(), &ws, 1e-7, 1e-5);
            if renorm {
                for row in routes.weights().chunks(top_k) {
                    assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
                }
            }
        }
    }
}

#[test]
fn routing_ties_go_to_the_lower_expert() {
    let b = backend(1, WeightDtype::F32);
    // Row 0: all equal; row 1: experts 5 and 2 tie for first, 1 and 6 for third.
    let logits = [[0.0f32; 8], [0.0, 1.0, 3.0, -1.0, 0.5, 3.0, 1.0, -2.0]].concat();
    let routes = b.moe_route(&tensor(&b, 2, 8, &logits), 3, false).unwrap();
    assert_eq!(routes.ids(), &[0, 1, 2, 2, 5, 1]);
    for w in &routes.weights()[..3] {
        assert!((w - 0.125).abs() < 1e-7);
    }
    let renormed = b.moe_route(&tensor(&b, 2, 8, &logits), 3, true).unwrap();
    for w in &renormed.weights()[..3] {
        assert!((w - 1.0 / 3.0).abs() < 1e-6);
    }
}

#[test]
fn bad_routes_and_shapes_are_errors() {
    let b = backend(1, WeightDtype::F32);
    let logits = tensor(&b, 2, 4, &[0.0; 8]);
    assert!(b.moe_route(&logits, 0, true).is_err());
    assert!(b.moe_route(&logits, 5, true).is_err());
    assert!(b.moe_routes_from_host(&[0, 1, 2], &[1.0; 2], 1).is_err());
    assert!(b.moe_routes_from_host(&[0, 1, 2], &[1.0; 3], 2).is_err());
    assert!(b.moe_routes_from_host(&[], &[], 0).is_err());

    let (e, hidden, inter) = (3, 8, 4);
    let gate_up = b
        .load_weight(weight2(
            e * 2 * inter,
            hidden,
            vec![0.1; e * 2 * inter * hidden],
        ))
        .unwrap();
    let down = b
        .load_weight(weight2(e * hidden, inter, vec![0.1; e * hidden * inter]))
        .unwrap();
    let x = tensor(&b, 2, hidden, &[1.0; 16]);
    let ok = b.moe_routes_from_host(&[0, 2], &[1.0, 1.0], 1).unwrap();
    assert!(b.moe_experts(&x, &ok, &gate_up, &down, e).is_ok());
    // An expert past the count, a row count that differs, a wrong expert count.
    let past = b.moe_routes_from_host(&[0, 3], &[1.0, 1.0], 1).unwrap();
    assert!(b.moe_experts(&x, &past, &gate_up, &down, e).is_err());
    let short = b.moe_routes_from_host(&[0], &[1.0], 1).unwrap();
    assert!(b.moe_experts(&x, &short, &gate_up, &down, e).is_err());
    assert!(b.moe_experts(&x, &ok, &gate_up, &down, 2).is_err());
    assert!(b.moe_experts(&x, &ok, &gate_up, &down, 0).is_err());
    assert!(b.moe_experts(&x, &ok, &down, &gate_up, e).is_err());
}

/// The cases every storage runs: (rows, top_k, experts the routes draw from).
fn cases(e: usize) -> Vec<(usize, usize, Vec<u32>)> {
    let all: Vec<u32> = (0..e as u32).collect();
    // Experts 1 and e - 1 never get a row.
    let some: Vec<u32> = all
        .iter()
        .copied()
        .filter(|&i| i != 1 && i != e as u32 - 1)
        .collect();
    vec![
        (1, 2, all.clone()),
        (3, 2, some.clone()),
        (7, 3, all.clone()),
        (40, 2, some),
        // Every row on one expert (decode- and prefill-sized).
        (5, 1, vec![2]),
        (37, 1, vec![2]),
        (0, 2, all),
    ]
}

#[test]
fn experts_match_reference_in_every_dense_storage() {
    let (e, hidden, inter) = (6, 24, 20);
    let mut rng = Rng::new(11);
    let gate_up = rvec_f32(&mut rng, e * 2 * inter * hidden, 0.4);
    let down = rvec_f32(&mut rng, e * hidden * inter, 0.4);
    for dtype in DTYPES {
        let b = backend(3, dtype);
        let gu_w = b
            .load_weight(weight2(e * 2 * inter, hidden, gate_up.clone()))
            .unwrap();
        let d_w = b
            .load_weight(weight2(e * hidden, inter, down.clone()))
            .unwrap();
        let gu_r: Vec<f32> = gate_up.iter().map(|&v| round(v, dtype)).collect();
        let d_r: Vec<f32> = down.iter().map(|&v| round(v, dtype)).collect();
        for (rows, top_k, pool) in cases(e) {
            let x = rvec_f32(&mut rng, rows * hidden, 1.0);
            let (ids, ws) = routes(&mut rng, rows, top_k, &pool);
            let routes = b.moe_routes_from_host(&ids, &ws, top_k).unwrap();
            let y = b
                .moe_experts(&tensor(&b, rows, hidden, &x), &routes, &gu_w, &d_w, e)
                .unwrap();
            assert_eq!(b.dims(&y), (rows, hidden));
            let (want, scale) = reference(&x, (hidden, inter), &ids, &ws, top_k, &gu_r, &d_r);
            let what = format!("{dtype:?} rows {rows} top-{top_k} pool {pool:?}");
            assert_close(&what, &host(&b, &y), &want, &scale, 1e-6, 1e-5);
        }
    }
}

#[test]
fn routed_experts_match_reference_end_to_end() {
    let (e, hidden, inter, top_k) = (8, 16, 12, 2);
    let mut rng = Rng::new(5);
    let b = backend(2, WeightDtype::F32);
    let gate_up = rvec_f32(&mut rng, e * 2 * inter * hidden, 0.5);
    let down = rvec_f32(&mut rng, e * hidden * inter, 0.5);
    let gu_w = b
        .load_weight(weight2(e * 2 * inter, hidden, gate_up.clone()))
        .unwrap();
    let d_w = b
        .load_weight(weight2(e * hidden, inter, down.clone()))
        .unwrap();
    let rows = 9;
    let x = rvec_f32(&mut rng, rows * hidden, 1.0);
    let logits = rvec_f32(&mut rng, rows * e, 3.0);
    for renorm in [false, true] {
        let routes = b
            .moe_route(&tensor(&b, rows, e, &logits), top_k, renorm)
            .unwrap();
        let y = b
            .moe_experts(&tensor(&b, rows, hidden, &x), &routes, &gu_w, &d_w, e)
            .unwrap();
        let (ids, ws) = route_ref(&logits, e, top_k, renorm);
        let ws: Vec<f32> = ws.iter().map(|&w| w as f32).collect();
        let (want, scale) = reference(&x, (hidden, inter), &ids, &ws, top_k, &gate_up, &down);
        assert_close("routed", &host(&b, &y), &want, &scale, 1e-6, 1e-5);
    }
}

#[test]
fn outputs_do_not_depend_on_the_thread_count() {
    let (e, hidden, inter, top_k, rows) = (5, 32, 24, 2, 23);
    let mut rng = Rng::new(3);
    let gate_up = rvec_f32(&mut rng, e * 2 * inter * hidden, 0.5);
    let down = rvec_f32(&mut rng, e * hidden * inter, 0.5);
    let x = rvec_f32(&mut rng, rows * hidden, 1.0);
    let all: Vec<u32> = (0..e as u32).collect();
    let (ids, ws) = routes(&mut rng, rows, top_k, &all);
    let run = |threads: usize| {
        let b = backend(threads, WeightDtype::BF16);
        let gu = b
            .load_weight(weight2(e * 2 * inter, hidden, gate_up.clone()))
            .unwrap();
        let d = b
            .load_weight(weight2(e * hidden, inter, down.clone()))
            .unwrap();
        let routes = b.moe_routes_from_host(&ids, &ws, top_k).unwrap();
        let y = b
            .moe_experts(&tensor(&b, rows, hidden, &x), &routes, &gu, &d, e)
            .unwrap();
        host(&b, &y)
    };
    assert_eq!(run(1), run(4));
}

/// Q8_0 blocks of `data` (rows of whole 32-blocks), as ggml quantizes.
fn q8_0(data: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in data.chunks(32) {
        let amax = block.iter().fold(0f32, |m, &x| m.max(x.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        out.extend(block.iter().map(|&x| (x * inv).round() as i8 as u8));
    }
    out
}

fn quant_weight(rows: usize, cols: usize, data: &[f32]) -> HostTensor {
    HostTensor {
        shape: vec![rows, cols],
        data: HostData::Quant(QuantData {
            ty: GgmlType::Q8_0,
            bytes: q8_0(data),
        }),
    }
}

#[test]
fn kept_quantized_experts_equal_per_expert_linears() {
    let (e, hidden, inter) = (4, 64, 32);
    let mut rng = Rng::new(21);
    let gate_up = rvec_f32(&mut rng, e * 2 * inter * hidden, 0.3);
    let down = rvec_f32(&mut rng, e * hidden * inter, 0.3);
    let b = CpuBackend::new(CpuOptions {
        threads: 2,
        weight_dtype: WeightDtype::F32,
    })
    .unwrap()
    .with_quantized_weights(true);
    let gu_w = b
        .load_weight(quant_weight(e * 2 * inter, hidden, &gate_up))
        .unwrap();
    let d_w = b
        .load_weight(quant_weight(e * hidden, inter, &down))
        .unwrap();
    assert_eq!(gu_w.quant_type(), Some(GgmlType::Q8_0));
    // The same experts as separate weights, run through `linear`.
    let per_expert: Vec<_> = (0..e)
        .map(|i| {
            let gu = &gate_up[i * 2 * inter * hidden..(i + 1) * 2 * inter * hidden];
            let d = &down[i * hidden * inter..(i + 1) * hidden * inter];
            (
                b.load_weight(quant_weight(2 * inter, hidden, gu)).unwrap(),
                b.load_weight(quant_weight(hidden, inter, d)).unwrap(),
            )
        })
        .collect();
    let dequant = |data: &[f32]| -> Vec<f32> {
        let t = quant_weight(1, data.len(), data);
        t.to_f32_vec()
    };
    let (gu_r, d_r) = (dequant(&gate_up), dequant(&down));
    for (rows, top_k, pool) in cases(e) {
        let x = rvec_f32(&mut rng, rows * hidden, 1.0);
        let (ids, ws) = routes(&mut rng, rows, top_k, &pool);
        let routes = b.moe_routes_from_host(&ids, &ws, top_k).unwrap();
        let got = host(
            &b,
            &b.moe_experts(&tensor(&b, rows, hidden, &x), &routes, &gu_w, &d_w, e)
                .unwrap(),
        );
        // Per expert: its rows gathered in order, linears, weighted sum in
        // choice order (what the op promises, so equal to rounding).
        let mut want = vec![0f32; rows * hidden];
        for (i, (gu, d)) in per_expert.iter().enumerate() {
            let mine: Vec<usize> = (0..ids.len()).filter(|&j| ids[j] as usize == i).collect();
            if mine.is_empty() {
                continue;
            }
            let xe: Vec<f32> = mine
                .iter()
                .flat_map(|&j| x[j / top_k * hidden..(j / top_k + 1) * hidden].to_vec())
                .collect();
            let g = b
                .linear(&tensor(&b, mine.len(), hidden, &xe), gu, None)
                .unwrap();
            let h = b.silu_mul(&g).unwrap();
            let o = host(&b, &b.linear(&h, d, None).unwrap());
            for (n, &j) in mine.iter().enumerate() {
                let r = j / top_k;
                for c in 0..hidden {
                    want[r * hidden + c] += ws[j] * o[n * hidden + c];
                }
            }
        }
        let what = format!("Q8_0 rows {rows} top-{top_k}");
        let want64: Vec<f64> = want.iter().map(|&v| v as f64).collect();
        assert_close_rel(&what, &got, &want64, 1e-5, 1e-5);
        // And near the f64 reference (8-bit activations on few rows).
        let (want, scale) = reference(&x, (hidden, inter), &ids, &ws, top_k, &gu_r, &d_r);
        assert_close(&what, &got, &want, &scale, 1e-4, 3e-2);
    }
}

#[test]
fn sigmoid_gate_rows_scales_each_row_by_its_gate() {
    let b = backend(2, WeightDtype::F32);
    let mut rng = Rng::new(11);
    let (rows, cols, gate_cols) = (5, 24, 8);
    let x = rvec_f32(&mut rng, rows * cols, 2.0);
    let mut gate = rvec_f32(&mut rng, rows * gate_cols, 6.0);
    gate[0] = 0.0; // sigmoid(0) = 1/2 exactly
    let mut t = tensor(&b, rows, cols, &x);
    b.sigmoid_gate_rows(&mut t, &tensor(&b, rows, gate_cols, &gate))
        .unwrap();
    let got = b.tensor_to_host(&t).unwrap();
    let want: Vec<f64> = (0..rows * cols)
        .map(|i| {
            let g = gate[(i / cols) * gate_cols] as f64;
            x[i] as f64 / (1.0 + (-g).exp())
        })
        .collect();
    assert_close_rel("sigmoid gate", &got, &want, 1e-7, 1e-6);
    assert_eq!(got[0], x[0] * 0.5);
    // A gate for another row count, or with no columns, is an error.
    let mut t = tensor(&b, rows, cols, &x);
    assert!(b
        .sigmoid_gate_rows(&mut t, &tensor(&b, rows - 1, 1, &gate[..rows - 1]))
        .is_err());
    assert!(b
        .sigmoid_gate_rows(&mut t, &tensor(&b, rows, 0, &[]))
        .is_err());
}
