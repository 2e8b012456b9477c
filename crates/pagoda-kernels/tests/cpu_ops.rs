//! Every non-attention op of the CPU backend against a naive f64 reference on
//! seeded random inputs, over several shapes including odd sizes.

mod common;

/// This binary tests the default (vectorized where the CPU allows) kernels.
#[allow(dead_code)]
const PORTABLE: bool = false;

use common::*;
use pagoda_kernels::cpu::WeightDtype;
use pagoda_kernels::{Backend, ForwardContext, HostData, HostTensor, RopeStyle};

const DTYPES: [WeightDtype; 3] = [WeightDtype::F32, WeightDtype::F16, WeightDtype::BF16];

/// `x @ w^T + bias` in f64 and the per-element scale `sum |x| |w| + |bias|`.
fn linear_ref(
    x: &[f32],
    rows: usize,
    k: usize,
    w: &[f32],
    n: usize,
    bias: Option<&[f32]>,
) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0f64; rows * n];
    let mut s = vec![0f64; rows * n];
    for r in 0..rows {
        for j in 0..n {
            let (mut acc, mut mag) = (0f64, 0f64);
            for i in 0..k {
                let p = x[r * k + i] as f64 * w[j * k + i] as f64;
                acc += p;
                mag += p.abs();
            }
            let b = bias.map_or(0.0, |b| b[j] as f64);
            y[r * n + j] = acc + b;
            s[r * n + j] = mag + b.abs();
        }
    }
    (y, s)
}

#[test]
fn linear_matches_reference_for_all_row_counts_and_dtypes() {
    let mut rng = Rng::new(1);
    let shapes = [(5, 3), (33, 17), (70, 130), (129, 64), (64, 576)];
    for dtype in DTYPES {
        let b = backend(2, dtype);
        for rows in [1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 64, 100] {
            for &(n, k) in &shapes {
                for with_bias in [false, true] {
                    let x = rng.vec(rows * k);
                    let w = rng.vec(n * k);
                    let bias = rng.vec(n);
                    let wr: Vec<f32> = w.iter().map(|&v| round(v, dtype)).collect();
                    let wt = b.load_weight(weight2(n, k, w)).unwrap();
                    let bt = b
                        .load_weight(HostTensor::f32(vec![n], bias.clone()))
                        .unwrap();
                    let xt = tensor(&b, rows, k, &x);
                    let y = b.linear(&xt, &wt, with_bias.then_some(&bt)).unwrap();
                    assert_eq!(b.dims(&y), (rows, n));
                    let (want, scale) =
                        linear_ref(&x, rows, k, &wr, n, with_bias.then_some(&bias[..]));
                    let what = format!("linear {dtype:?} rows={rows} n={n} k={k} bias={with_bias}");
                    assert_close(&what, &host(&b, &y), &want, &scale, 1e-6, 1e-5);
                }
            }
        }
    }
}

#[test]
fn linear_accepts_narrow_host_weights_and_rejects_bad_shapes() {
    let mut rng = Rng::new(2);
    let (rows, n, k) = (3, 9, 20);
    let x = rng.vec(rows * k);
    let w: Vec<half::f16> = rng
        .vec(n * k)
        .into_iter()
        .map(half::f16::from_f32)
        .collect();
    let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
    for dtype in DTYPES {
        let b = backend(1, dtype);
        let wt = b
            .load_weight(HostTensor {
                shape: vec![n, k],
                data: HostData::F16(w.clone()),
            })
            .unwrap();
        let wr: Vec<f32> = wf.iter().map(|&v| round(v, dtype)).collect();
        let y = b.linear(&tensor(&b, rows, k, &x), &wt, None).unwrap();
        let (want, scale) = linear_ref(&x, rows, k, &wr, n, None);
        assert_close("linear f16 host", &host(&b, &y), &want, &scale, 1e-6, 1e-5);
        assert!(b
            .linear(
                &tensor(&b, rows, k + 1, &rng.vec(rows * (k + 1))),
                &wt,
                None
            )
            .is_err());
    }
}

/// `with_bf16_linear_inputs` rounds the input of every linear layer to
/// bf16 first and changes nothing else: its result equals the plain
/// backend's on the rounded input, bit for bit (f32 weights, and FP8 ones
/// whose input is then quantized per token), and differs on the unrounded
/// one.
#[test]
fn bf16_linear_inputs_round_the_input_and_nothing_else() {
    let mut rng = Rng::new(5);
    let (rows, n, k) = (3, 8, 48);
    let x = rvec_f32(&mut rng, rows * k, 2.0);
    let xr: Vec<f32> = x.iter().map(|&v| bf(v)).collect();
    assert_ne!(x, xr);
    let w = weight2(n, k, rvec_f32(&mut rng, n * k, 1.0));
    let bias = HostTensor::f32(vec![n], rvec_f32(&mut rng, n, 0.5));
    for fp8 in [false, true] {
        let plain = backend(1, WeightDtype::F32).with_fp8_weights(fp8);
        let rounding = backend(1, WeightDtype::F32)
            .with_fp8_weights(fp8)
            .with_bf16_linear_inputs(true);
        let run = |b: &pagoda_kernels::cpu::CpuBackend, x: &[f32]| {
            let wt = b.load_linear(w.clone()).unwrap();
            let bt = b.load_weight(bias.clone()).unwrap();
            let xt = tensor(b, rows, k, x);
            let y = host(b, &b.linear(&xt, &wt, Some(&bt)).unwrap());
            let [a, _, _] = b.linear3(&xt, [&wt, &wt, &wt], [None; 3]).unwrap();
            (y, host(b, &a))
        };
        let got = run(&rounding, &x);
        assert_eq!(got, run(&plain, &xr), "fp8 {fp8}: the rounded input");
        assert_ne!(got.0, run(&plain, &x).0, "fp8 {fp8}: the input unrounded");
    }
}

fn rms_ref(x: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
    let ms = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps as f64).sqrt();
    x.iter()
        .zip(w)
        .map(|(&v, &g)| v as f64 * inv * g as f64)
        .collect()
}

/// Small shapes run on the calling thread, the last ones (> 16K elements) in the pool.
const ROW_SHAPES: [(usize, usize); 6] = [(1, 8), (3, 576), (5, 13), (7, 130), (2, 1), (40, 576)];

#[test]
fn rms_norm_and_add_rms_norm_match_reference() {
    let mut rng = Rng::new(3);
    let b = backend(2, WeightDtype::F16);
    let eps = 1e-5;
    for (rows, cols) in ROW_SHAPES {
        let x = rng.vec(rows * cols);
        let d = rng.vec(rows * cols);
        let w = rng.vec(cols);
        let wt = b
            .load_weight(HostTensor::f32(vec![cols], w.clone()))
            .unwrap();
        let y = b.rms_norm(&tensor(&b, rows, cols, &x), &wt, eps).unwrap();
        let want: Vec<f64> = x.chunks(cols).flat_map(|r| rms_ref(r, &w, eps)).collect();
        assert_close_rel("rms_norm", &host(&b, &y), &want, 1e-6, 1e-5);

        let mut res = tensor(&b, rows, cols, &x);
        let y = b
            .add_rms_norm(&mut res, &tensor(&b, rows, cols, &d), &wt, eps)
            .unwrap();
        let sum: Vec<f32> = x.iter().zip(&d).map(|(a, b)| a + b).collect();
        assert_eq!(host(&b, &res), sum, "residual += x");
        let want: Vec<f64> = sum.chunks(cols).flat_map(|r| rms_ref(r, &w, eps)).collect();
        assert_close_rel("add_rms_norm", &host(&b, &y), &want, 1e-6, 1e-5);
    }
}

#[test]
fn head_rms_norm_normalizes_each_head() {
    let mut rng = Rng::new(4);
    let b = backend(2, WeightDtype::BF16);
    for (rows, heads, hd) in [(1, 1, 8), (3, 9, 64), (5, 2, 128), (4, 3, 5), (40, 9, 64)] {
        let cols = heads * hd;
        let x = rng.vec(rows * cols);
        let w = rng.vec(hd);
        let wt = b.load_weight(HostTensor::f32(vec![hd], w.clone())).unwrap();
        let mut t = tensor(&b, rows, cols, &x);
        b.head_rms_norm(&mut t, &wt, hd, 1e-6).unwrap();
        let want: Vec<f64> = x.chunks(hd).flat_map(|h| rms_ref(h, &w, 1e-6)).collect();
        assert_close_rel("head_rms_norm", &host(&b, &t), &want, 1e-6, 1e-5);
        assert!(b.head_rms_norm(&mut t, &wt, hd + 1, 1e-6).is_err());
    }
}

#[test]
fn layer_norm_matches_reference() {
    let mut rng = Rng::new(5);
    let b = backend(2, WeightDtype::F32);
    for (rows, cols) in ROW_SHAPES {
        let x: Vec<f32> = rng.vec(rows * cols).iter().map(|v| v * 3.0 + 0.5).collect();
        let (w, bias) = (rng.vec(cols), rng.vec(cols));
        let wt = b
            .load_weight(HostTensor::f32(vec![cols], w.clone()))
            .unwrap();
        let bt = b
            .load_weight(HostTensor::f32(vec![cols], bias.clone()))
            .unwrap();
        let y = b
            .layer_norm(&tensor(&b, rows, cols, &x), &wt, &bt, 1e-5)
            .unwrap();
        let mut want = Vec::new();
        for r in x.chunks(cols) {
            let mean = r.iter().map(|&v| v as f64).sum::<f64>() / cols as f64;
            let var = r.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / cols as f64;
            let inv = 1.0 / (var + 1e-5).sqrt();
            for i in 0..cols {
                want.push((r[i] as f64 - mean) * inv * w[i] as f64 + bias[i] as f64);
            }
        }
        assert_close_rel("layer_norm", &host(&b, &y), &want, 1e-5, 1e-5);
    }
}

/// A step of one sequence whose tokens sit at the given positions.
fn step_at(positions: &[u32], ids: &[u32]) -> ForwardContext {
    let t = positions.len() as u32;
    let ctx = ForwardContext {
        input_ids: ids.to_vec(),
        positions: positions.to_vec(),
        cu_seqlens_q: vec![0, t],
        cu_seqlens_k: vec![0, t],
        seq_lens: vec![t],
        context_lens: vec![0],
        slot_mapping: vec![-1; t as usize],
        block_tables: vec![0; t.div_ceil(4).max(1) as usize],
        max_blocks_per_seq: t.div_ceil(4).max(1) as usize,
        block_size: 4,
        max_query_len: t as usize,
        max_seq_len: t as usize,
        num_prefills: 1,
        num_prefill_tokens: t as usize,
        num_decode_tokens: 0,
        logits_indices: vec![t - 1],
        sampling: Vec::new(),
        ..Default::default()
    };
    ctx.validate().unwrap();
    ctx
}

#[test]
fn rope_rotates_pairs_of_both_styles() {
    let mut rng = Rng::new(6);
    for dtype in DTYPES {
        let b = backend(2, dtype);
        for (heads, hd, rd) in [(3, 64, 64), (2, 128, 64), (1, 10, 6), (4, 8, 0)] {
            for (style, rows) in [
                (RopeStyle::Neox, 5),
                (RopeStyle::Interleaved, 5),
                (RopeStyle::Neox, 300),
            ] {
                let max_pos = 50;
                let table = rng.vec(max_pos * rd);
                let tr: Vec<f32> = table.iter().map(|&v| round(v, dtype)).collect();
                let tt = b.load_weight(weight2(max_pos, rd, table)).unwrap();
                let positions: Vec<u32> = (0..rows).map(|_| rng.below(max_pos) as u32).collect();
                let step = b.begin_step(&step_at(&positions, &vec![0; rows])).unwrap();
                let x = rng.vec(rows * heads * hd);
                let mut t = tensor(&b, rows, heads * hd, &x);
                b.rope(&mut t, &step, &tt, hd, style).unwrap();
                let mut want: Vec<f64> = x.iter().map(|&v| v as f64).collect();
                let half = rd / 2;
                for r in 0..rows {
                    let row = &tr[positions[r] as usize * rd..][..rd];
                    for h in 0..heads {
                        let base = (r * heads + h) * hd;
                        for i in 0..half {
                            let (c, s) = (row[i] as f64, row[half + i] as f64);
                            let (a, bb) = match style {
                                RopeStyle::Neox => (base + i, base + i + half),
                                RopeStyle::Interleaved => (base + 2 * i, base + 2 * i + 1),
                            };
                            let (x1, x2) = (x[a] as f64, x[bb] as f64);
                            want[a] = x1 * c - x2 * s;
                            want[bb] = x2 * c + x1 * s;
                        }
                    }
                }
                assert_close_rel(
                    &format!("rope {style:?} {dtype:?} hd={hd} rd={rd}"),
                    &host(&b, &t),
                    &want,
                    1e-6,
                    1e-5,
                );
            }
        }
        // A position past the table is an error, not a panic.
        let tt = b.load_weight(weight2(4, 8, vec![0.0; 32])).unwrap();
        let step = b.begin_step(&step_at(&[4], &[0])).unwrap();
        let mut t = tensor(&b, 1, 8, &[0.0; 8]);
        assert!(b.rope(&mut t, &step, &tt, 8, RopeStyle::Neox).is_err());
    }
}

fn silu(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

#[test]
fn activations_and_adds_match_reference() {
    let mut rng = Rng::new(7);
    let b = backend(2, WeightDtype::F32);
    for (rows, n) in [(1, 1), (3, 1536), (7, 13), (100, 64), (30, 1536)] {
        let gu: Vec<f32> = rng.vec(rows * 2 * n).iter().map(|v| v * 8.0).collect();
        let y = b.silu_mul(&tensor(&b, rows, 2 * n, &gu)).unwrap();
        let want: Vec<f64> = gu
            .chunks(2 * n)
            .flat_map(|r| (0..n).map(move |i| silu(r[i] as f64) * r[n + i] as f64))
            .collect();
        assert_close_rel("silu_mul", &host(&b, &y), &want, 1e-6, 1e-5);

        let (g, u) = gu.split_at(rows * n);
        let y = b
            .silu_mul2(&tensor(&b, rows, n, g), &tensor(&b, rows, n, u))
            .unwrap();
        let want: Vec<f64> = g
            .iter()
            .zip(u)
            .map(|(&g, &u)| silu(g as f64) * u as f64)
            .collect();
        assert_close_rel("silu_mul2", &host(&b, &y), &want, 1e-6, 1e-5);

        let mut t = tensor(&b, rows, n, g);
        b.relu(&mut t).unwrap();
        let want: Vec<f64> = g.iter().map(|&v| (v as f64).max(0.0)).collect();
        assert_close_rel("relu", &host(&b, &t), &want, 0.0, 0.0);

        let mut t = tensor(&b, rows, n, g);
        b.add(&mut t, &tensor(&b, rows, n, u)).unwrap();
        let want: Vec<f64> = g
            .iter()
            .zip(u)
            .map(|(&a, &c)| a as f64 + c as f64)
            .collect();
        assert_close_rel("add", &host(&b, &t), &want, 0.0, 1e-7);
    }
    let mut t = tensor(&b, 2, 3, &[0.0; 6]);
    assert!(b.add(&mut t, &tensor(&b, 3, 2, &[0.0; 6])).is_err());
    assert!(b.silu_mul(&tensor(&b, 2, 3, &[0.0; 6])).is_err());
}

#[test]
fn embedding_position_embedding_and_logits_gather() {
    let mut rng = Rng::new(8);
    for dtype in DTYPES {
        let b = backend(2, dtype);
        for (vocab, hidden, rows) in [(37, 24, 9), (50, 576, 40)] {
            let table = rng.vec(vocab * hidden);
            let tr: Vec<f32> = table.iter().map(|&v| round(v, dtype)).collect();
            let tt = b.load_weight(weight2(vocab, hidden, table)).unwrap();
            let ids: Vec<u32> = (0..rows).map(|_| rng.below(vocab) as u32).collect();
            let positions: Vec<u32> = (0..rows as u32).map(|p| p + 3).collect();
            let mut ctx = step_at(&positions, &ids);
            ctx.logits_indices = vec![8, 0, 4];
            let step = b.begin_step(&ctx).unwrap();
            let mut x = b.embedding(&step, &tt).unwrap();
            let want: Vec<f64> = ids
                .iter()
                .flat_map(|&i| {
                    tr[i as usize * hidden..][..hidden]
                        .iter()
                        .map(|&v| v as f64)
                })
                .collect();
            assert_close_rel("embedding", &host(&b, &x), &want, 0.0, 0.0);

            let offset = 2;
            b.add_position_embedding(&mut x, &step, &tt, offset)
                .unwrap();
            let want: Vec<f64> = (0..rows)
                .flat_map(|r| {
                    let (e, p) = (ids[r] as usize, positions[r] as usize + offset);
                    (0..hidden)
                        .map(|c| tr[e * hidden + c] as f64 + tr[p * hidden + c] as f64)
                        .collect::<Vec<_>>()
                })
                .collect();
            assert_close_rel("add_position_embedding", &host(&b, &x), &want, 0.0, 1e-7);

            let g = b.gather_logits_rows(&x, &step).unwrap();
            let xs = host(&b, &x);
            let want: Vec<f64> = [8usize, 0, 4]
                .iter()
                .flat_map(|&r| xs[r * hidden..][..hidden].iter().map(|&v| v as f64))
                .collect();
            assert_close_rel("gather_logits_rows", &host(&b, &g), &want, 0.0, 0.0);

            // Out-of-vocabulary ids and positions past the table are errors.
            let bad = b.begin_step(&step_at(&[0], &[vocab as u32])).unwrap();
            assert!(b.embedding(&bad, &tt).is_err());
            let mut x1 = tensor(&b, 1, hidden, &vec![0.0; hidden]);
            let late = b.begin_step(&step_at(&[vocab as u32 - 1], &[0])).unwrap();
            assert!(b.add_position_embedding(&mut x1, &late, &tt, 1).is_err());
        }
    }
}

#[test]
fn weights_keep_vectors_in_f32_and_matrices_in_the_chosen_dtype() {
    for dtype in DTYPES {
        let b = backend(1, dtype);
        let v = b
            .load_weight(HostTensor::f32(vec![3], vec![0.1, 0.2, 0.3]))
            .unwrap();
        assert_eq!(v.dtype(), WeightDtype::F32);
        let m = b.load_weight(weight2(2, 3, vec![0.1; 6])).unwrap();
        assert_eq!(m.dtype(), dtype);
        assert_eq!((m.rows(), m.cols()), (2, 3));
        assert!(b
            .load_weight(HostTensor {
                shape: vec![2, 2],
                data: HostData::F32(vec![0.0; 3])
            })
            .is_err());
    }
}

#[test]
fn begin_step_rejects_inconsistent_metadata() {
    let b = backend(1, WeightDtype::F32);
    let mut ctx = step_at(&[0, 1, 2], &[1, 2, 3]);
    assert!(b.begin_step(&ctx).is_ok());
    ctx.cu_seqlens_q = vec![3, 0];
    assert!(b.begin_step(&ctx).is_err());
    let mut ctx = step_at(&[0, 1, 2], &[1, 2, 3]);
    ctx.block_size = 0;
    assert!(b.begin_step(&ctx).is_err());
    let mut ctx = step_at(&[0, 1, 2], &[1, 2, 3]);
    ctx.logits_indices = vec![3];
    assert!(b.begin_step(&ctx).is_err());
}
