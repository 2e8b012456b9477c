//! The mixture-of-experts ops of the CUDA backend (`moe_route`,
//! `moe_routes_from_host`, `moe_experts`) against an f64 reference on the
//! same bf16-rounded inputs, and against the CPU backend where it
//! implements them (until it does, its `Unsupported` is noted and the f64
//! reference alone decides). Routing: exact ids (ties to the lower index;
//! only rows with a nonzero gap under 1e-6 between ranked probabilities are
//! compared as weight multisets), weights within 1e-5. Expert MLPs:
//! relative L2 error at most 1e-2, on random routes, experts without
//! tokens, one expert for every token, rows 1 / 7 / 64 / 300 / past one
//! chunk, widths that are not tile multiples (and not multiples of 8), and
//! Qwen3-30B-A3B's sizes; bitwise determinism and batch independence; bad
//! routes and shapes as errors; a captured graph replayed with new routes,
//! on both paths. The GEMV path (few rows) at 1, 2, 4, 8 and 16 rows and
//! just past the switch-over, odd top_k and repeated experts, against the
//! f64 reference, the CPU backend and the grouped and grouped-GEMV paths
//! forced on the same inputs (the grouped GEMV, a timing-only path, also
//! past one chunk and at 64 rows of Qwen3-30B-A3B). The shared-expert gate
//! (`sigmoid_gate_rows`) against the CPU.
//! Outputs are NaN-poisoned before each op, so an unwritten element fails.
//!
//! Without a CUDA device or driver every test prints a notice and passes
//! (fails where PAGODA_REQUIRE_GPU=1 says a GPU must be present).
#![cfg(feature = "cuda")]

mod common;

#[allow(dead_code)]
const PORTABLE: bool = false;

use common::moe::{all_experts, check_rel, routes, Experts as Layer};
use common::*;
use pagoda_kernels::cpu::{CpuBackend, CpuWeight, WeightDtype};
use pagoda_kernels::cuda::testing::{gpu_poisoned as gpu, sampling_step};
use pagoda_kernels::cuda::{CudaBackend, CudaWeight, MoePath, MOE_GEMV_MAX_ROWS};
use pagoda_kernels::{Backend, HostTensor, KernelError, SamplingRow};
use std::sync::atomic::{AtomicBool, Ordering};

fn cpu() -> CpuBackend {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(16));
    backend(threads, WeightDtype::F32)
}

/// A layer's stacked experts loaded on each backend.
trait Load {
    fn gpu(&self, g: &CudaBackend) -> (CudaWeight, CudaWeight);
    fn cpu(&self, c: &CpuBackend) -> (CpuWeight, CpuWeight);
}

impl Load for Layer {
    fn gpu(&self, g: &CudaBackend) -> (CudaWeight, CudaWeight) {
        let (gu, dn) = self.host();
        (g.load_weight(gu).unwrap(), g.load_weight(dn).unwrap())
    }

    fn cpu(&self, c: &CpuBackend) -> (CpuWeight, CpuWeight) {
        let (gu, dn) = self.host();
        (c.load_weight(gu).unwrap(), c.load_weight(dn).unwrap())
    }
}

static CPU_NOTICE: AtomicBool = AtomicBool::new(false);

/// The CPU backend's result, or `None` (noted once) while it has no MoE ops.
fn cpu_result<T>(r: pagoda_kernels::Result<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(KernelError::Unsupported(m)) => {
            if !CPU_NOTICE.swap(true, Ordering::Relaxed) {
                eprintln!("notice: CPU backend has no MoE ops yet ({m}); f64 reference only");
            }
            None
        }
        Err(e) => panic!("CPU backend failed: {e}"),
    }
}

/// Runs `moe_experts` on host routes on both backends and checks both
/// against the f64 reference; returns the CUDA output.
#[allow(clippy::too_many_arguments)]
fn case(
    g: &CudaBackend,
    c: &CpuBackend,
    l: &Layer,
    gw: &(CudaWeight, CudaWeight),
    cw: &(CpuWeight, CpuWeight),
    x: &[f32],
    ids: &[u32],
    w: &[f32],
    k: usize,
    label: &str,
) -> Vec<f32> {
    let rows = x.len() / l.hidden;
    let want = l.reference(x, ids, w, k);
    let xt = g.tensor_from_host(rows, l.hidden, x).unwrap();
    let routes = g.moe_routes_from_host(ids, w, k).unwrap();
    let y = g.moe_experts(&xt, &routes, &gw.0, &gw.1, l.e).unwrap();
    assert_eq!(g.dims(&y), (rows, l.hidden), "{label}: output dims");
    let got = g.tensor_to_host(&y).unwrap();
    check_rel(&format!("{label} cuda vs f64"), &got, &want, 1e-2);
    let xc = c.tensor_from_host(rows, l.hidden, x).unwrap();
    if let Some(rc) = cpu_result(c.moe_routes_from_host(ids, w, k)) {
        if let Some(yc) = cpu_result(c.moe_experts(&xc, &rc, &cw.0, &cw.1, l.e)) {
            let cpu_out = c.tensor_to_host(&yc).unwrap();
            let want_cpu: Vec<f64> = cpu_out.iter().map(|&v| v as f64).collect();
            check_rel(&format!("{label} cuda vs cpu"), &got, &want_cpu, 1e-2);
        }
    }
    got
}

/// Softmax over each row in f64, the top `k` (ties to the lower index),
/// renormalized or not; plus whether the row has a near-tie (a nonzero gap
/// under 1e-6 among its `k + 1` largest probabilities).
fn reference_route(
    logits: &[f32],
    e: usize,
    k: usize,
    renorm: bool,
) -> Vec<(Vec<u32>, Vec<f64>, bool)> {
    logits
        .chunks(e)
        .map(|row| {
            let m = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
            let ex: Vec<f64> = row.iter().map(|&v| (v as f64 - m).exp()).collect();
            let s: f64 = ex.iter().sum();
            let mut order: Vec<usize> = (0..e).collect();
            order.sort_by(|&a, &b| ex[b].total_cmp(&ex[a]).then(a.cmp(&b)));
            let near = (0..k.min(e - 1)).any(|t| {
                let gap = (ex[order[t]] - ex[order[t + 1]]) / s;
                gap > 0.0 && gap < 1e-6
            });
            let mut w: Vec<f64> = order[..k].iter().map(|&i| ex[i] / s).collect();
            if renorm {
                let t: f64 = w.iter().sum();
                w.iter_mut().for_each(|v| *v /= t);
            }
            (order[..k].iter().map(|&i| i as u32).collect(), w, near)
        })
        .collect()
}

fn check_route(what: &str, ids: &[u32], w: &[f32], want: &[(Vec<u32>, Vec<f64>, bool)], k: usize) {
    let mut near_ties = 0;
    for (r, (wi, ww, near)) in want.iter().enumerate() {
        let (gi, gw) = (&ids[r * k..][..k], &w[r * k..][..k]);
        if *near {
            near_ties += 1;
            let mut a: Vec<f64> = gw.iter().map(|&v| v as f64).collect();
            let mut b = ww.clone();
            a.sort_by(f64::total_cmp);
            b.sort_by(f64::total_cmp);
            for (x, y) in a.iter().zip(&b) {
                assert!(
                    (x - y).abs() <= 1e-5,
                    "{what}: row {r} (near-tie) weights {gw:?} vs {ww:?}"
                );
            }
            continue;
        }
        assert_eq!(gi, &wi[..], "{what}: row {r} ids");
        for t in 0..k {
            assert!(
                (gw[t] as f64 - ww[t]).abs() <= 1e-5,
                "{what}: row {r} weight {t}: {} vs {}",
                gw[t],
                ww[t]
            );
        }
    }
    eprintln!(
        "{what}: {} rows, ids exact ({near_ties} near-tie rows compared by weights)",
        want.len()
    );
}

#[test]
fn moe_route_matches_the_f64_softmax_top_k() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(1);
    for &(e, k, rows, renorm) in &[
        (8, 2, 7, true),
        (60, 4, 64, false),
        (128, 8, 300, true),
        (128, 8, 1, false),
        (200, 1, 33, true),
        (3, 3, 5, false),
        (33, 6, 17, true),
    ] {
        // bf16 logits (exact ties between equal values are common).
        let logits = rvec(&mut rng, rows * e, 4.0);
        let t = g.tensor_from_host(rows, e, &logits).unwrap();
        let r = g.moe_route(&t, k, renorm).unwrap();
        let (ids, w) = g.routes_to_host(&r).unwrap();
        let want = reference_route(&logits, e, k, renorm);
        check_route(
            &format!("route bf16 E{e} k{k} rows{rows}"),
            &ids,
            &w,
            &want,
            k,
        );
        // f32 logits (the residual-stream kind of tensor).
        let logits = rvec_f32(&mut rng, rows * e, 4.0);
        let t = g.residual_from_host(rows, e, &logits).unwrap();
        let r = g.moe_route(&t, k, renorm).unwrap();
        let (ids, w) = g.routes_to_host(&r).unwrap();
        let want = reference_route(&logits, e, k, renorm);
        check_route(
            &format!("route f32 E{e} k{k} rows{rows}"),
            &ids,
            &w,
            &want,
            k,
        );
    }
    // All-equal rows: the lowest ids, each 1/E (1/k renormalized).
    let (e, k, rows) = (16, 4, 3);
    let t = g.tensor_from_host(rows, e, &vec![0.5; rows * e]).unwrap();
    for renorm in [false, true] {
        let r = g.moe_route(&t, k, renorm).unwrap();
        let (ids, w) = g.routes_to_host(&r).unwrap();
        let want_w = if renorm {
            1.0 / k as f32
        } else {
            1.0 / e as f32
        };
        for row in 0..rows {
            assert_eq!(
                &ids[row * k..][..k],
                &[0, 1, 2, 3],
                "ties go to the lower index"
            );
            for &v in &w[row * k..][..k] {
                assert!((v - want_w).abs() <= 1e-6, "tie weight {v} vs {want_w}");
            }
        }
    }
    // Zero rows.
    let t = g.tensor_from_host(0, 8, &[]).unwrap();
    let r = g.moe_route(&t, 2, true).unwrap();
    assert_eq!(g.routes_to_host(&r).unwrap().0.len(), 0);
}

#[test]
fn moe_experts_matches_the_reference_on_routes() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut rng = Rng::new(2);
    // (experts, hidden, top_k, rows, &all_experts(inter)): widths off the 64- and
    // 128-column tiles and the 32-wide k step, tile heights 16, 64 and 128
    // (from 192 pairs an expert: rows 1000, 500 and 400 below), and widths
    // that are not multiples of 8 (the element-copy path).
    let layers: &[(usize, usize, usize, usize, &[usize])] = &[
        (8, 96, 40, 2, &[1, 7, 64, 300, 1000]),
        (16, 64, 128, 4, &[1, 64, 300]),
        (4, 20, 12, 2, &[7, 64, 500]),
        (6, 136, 72, 6, &[5, 100, 400]),
    ];
    for &(e, hidden, inter, k, rows_list) in layers {
        let l = Layer::random(&mut rng, e, hidden, inter);
        let (gw, cw) = (l.gpu(&g), l.cpu(&c));
        for &rows in rows_list {
            let x = rvec(&mut rng, rows * hidden, 1.0);
            let (ids, w) = routes(&mut rng, rows, k, &all_experts(e));
            let label = format!("experts E{e} H{hidden} I{inter} k{k} rows{rows}");
            case(&g, &c, &l, &gw, &cw, &x, &ids, &w, k, &label);
        }
    }
}

#[test]
fn experts_without_tokens_and_one_expert_for_all() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut rng = Rng::new(3);
    let (e, hidden, inter) = (32, 96, 40);
    let l = Layer::random(&mut rng, e, hidden, inter);
    let (gw, cw) = (l.gpu(&g), l.cpu(&c));
    // Only experts 0 and 5 get tokens (30 get none).
    let rows = 7;
    let x = rvec(&mut rng, rows * hidden, 1.0);
    let ids: Vec<u32> = (0..rows).flat_map(|_| [5, 0]).collect();
    let w: Vec<f32> = (0..rows).flat_map(|_| [0.7, 0.3]).collect();
    case(
        &g,
        &c,
        &l,
        &gw,
        &cw,
        &x,
        &ids,
        &w,
        2,
        "experts 0 and 5 only",
    );
    // Every token picks expert 3 (k = 1), at rows 1, 64 and 300.
    for rows in [1, 64, 300] {
        let x = rvec(&mut rng, rows * hidden, 1.0);
        let ids = vec![3u32; rows];
        let w: Vec<f32> = (0..rows).map(|_| 0.5 + rng.uniform().abs()).collect();
        case(
            &g,
            &c,
            &l,
            &gw,
            &cw,
            &x,
            &ids,
            &w,
            1,
            &format!("all on expert 3, rows {rows}"),
        );
    }
    // Every token picks experts 31 and 3 (the last expert included).
    let rows = 300;
    let x = rvec(&mut rng, rows * hidden, 1.0);
    let ids: Vec<u32> = (0..rows).flat_map(|_| [31, 3]).collect();
    let w: Vec<f32> = (0..rows).flat_map(|_| [0.25, 0.75]).collect();
    case(
        &g,
        &c,
        &l,
        &gw,
        &cw,
        &x,
        &ids,
        &w,
        2,
        "all on experts 31 and 3",
    );
    // An expert named twice in a row counts twice (CUDA against f64 only:
    // the contract allows it, the CPU backend may not take it).
    let rows = 7;
    let x = rvec(&mut rng, rows * hidden, 1.0);
    let ids: Vec<u32> = (0..rows).flat_map(|_| [2, 2, 1]).collect();
    let w: Vec<f32> = (0..rows).flat_map(|_| [0.5, 0.25, 0.25]).collect();
    let xt = g.tensor_from_host(rows, hidden, &x).unwrap();
    let r = g.moe_routes_from_host(&ids, &w, 3).unwrap();
    let y = g.moe_experts(&xt, &r, &gw.0, &gw.1, e).unwrap();
    check_rel(
        "expert 2 twice per row cuda vs f64",
        &g.tensor_to_host(&y).unwrap(),
        &l.reference(&x, &ids, &w, 3),
        1e-2,
    );
    // Zero rows.
    let xt = g.tensor_from_host(0, hidden, &[]).unwrap();
    let r = g.moe_routes_from_host(&[], &[], 2).unwrap();
    let y = g.moe_experts(&xt, &r, &gw.0, &gw.1, e).unwrap();
    assert_eq!(g.dims(&y), (0, hidden));
}

#[test]
fn rows_past_one_chunk() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut rng = Rng::new(4);
    // 4,396 rows: a full 4,096-row chunk (tile height 64) and a 300-row
    // remainder (600 pairs over 64 experts: tile height 16).
    let (e, hidden, inter, k, rows) = (64, 64, 32, 2, 4396);
    let l = Layer::random(&mut rng, e, hidden, inter);
    let (gw, cw) = (l.gpu(&g), l.cpu(&c));
    let x = rvec(&mut rng, rows * hidden, 1.0);
    let (ids, w) = routes(&mut rng, rows, k, &all_experts(e));
    case(&g, &c, &l, &gw, &cw, &x, &ids, &w, k, "two chunks");
    check_rel(
        "two chunks, grouped GEMV vs f64",
        &run_on(&g, &l, &gw, &x, &ids, &w, k, MoePath::GroupedGemv),
        &l.reference(&x, &ids, &w, k),
        1e-2,
    );
}

#[test]
fn qwen3_30b_a3b_sizes() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut rng = Rng::new(5);
    let (e, hidden, inter, k) = (128, 2048, 768, 8);
    let l = Layer::random(&mut rng, e, hidden, inter);
    let (gw, cw) = (l.gpu(&g), l.cpu(&c));
    // Row 1 takes the GEMV path, 64 the 16-row tiles, 600 (4,800 pairs) the
    // 64-row ones.
    for rows in [1, 64, 600] {
        let x = rvec(&mut rng, rows * hidden, 1.0);
        let (ids, w) = routes(&mut rng, rows, k, &all_experts(e));
        case(
            &g,
            &c,
            &l,
            &gw,
            &cw,
            &x,
            &ids,
            &w,
            k,
            &format!("qwen3-30b-a3b rows {rows}"),
        );
        if rows == 64 {
            check_rel(
                "qwen3-30b-a3b rows 64 grouped GEMV vs f64",
                &run_on(&g, &l, &gw, &x, &ids, &w, k, MoePath::GroupedGemv),
                &l.reference(&x, &ids, &w, k),
                1e-2,
            );
        }
    }
    // Routing on the device end to end: router logits -> routes -> experts.
    let rows = 64;
    let x = rvec(&mut rng, rows * hidden, 1.0);
    let logits = rvec(&mut rng, rows * e, 3.0);
    let xt = g.tensor_from_host(rows, hidden, &x).unwrap();
    let lt = g.tensor_from_host(rows, e, &logits).unwrap();
    let r = g.moe_route(&lt, k, true).unwrap();
    let (ids, w) = g.routes_to_host(&r).unwrap();
    check_route(
        "qwen3-30b-a3b router",
        &ids,
        &w,
        &reference_route(&logits, e, k, true),
        k,
    );
    let y = g.moe_experts(&xt, &r, &gw.0, &gw.1, e).unwrap();
    let got = g.tensor_to_host(&y).unwrap();
    check_rel(
        "qwen3-30b-a3b routed on the device cuda vs f64",
        &got,
        &l.reference(&x, &ids, &w, k),
        1e-2,
    );
    let xc = c.tensor_from_host(rows, hidden, &x).unwrap();
    let lc = c.tensor_from_host(rows, e, &logits).unwrap();
    if let Some(rc) = cpu_result(c.moe_route(&lc, k, true)) {
        if let Some(yc) = cpu_result(c.moe_experts(&xc, &rc, &cw.0, &cw.1, e)) {
            let want: Vec<f64> = c
                .tensor_to_host(&yc)
                .unwrap()
                .iter()
                .map(|&v| v as f64)
                .collect();
            check_rel("qwen3-30b-a3b routed cuda vs cpu", &got, &want, 1e-2);
        }
    }
}

#[test]
fn outputs_are_deterministic_and_independent_of_the_batch() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(6);
    let (e, hidden, inter, k, rows) = (16, 64, 128, 4, 300);
    let l = Layer::random(&mut rng, e, hidden, inter);
    let gw = l.gpu(&g);
    let x = rvec(&mut rng, rows * hidden, 1.0);
    let (ids, w) = routes(&mut rng, rows, k, &all_experts(e));
    let run = |x: &[f32], ids: &[u32], w: &[f32], path: MoePath| {
        let n = x.len() / hidden;
        let xt = g.tensor_from_host(n, hidden, x).unwrap();
        let r = g.moe_routes_from_host(ids, w, k).unwrap();
        let y = g.moe_experts_on(&xt, &r, &gw.0, &gw.1, e, path).unwrap();
        g.tensor_to_host(&y).unwrap()
    };
    assert_eq!(
        MoePath::for_shape(rows, k, e, hidden, inter),
        MoePath::Grouped
    );
    let a = run(&x, &ids, &w, MoePath::Grouped);
    let b = run(&x, &ids, &w, MoePath::Grouped);
    assert!(a == b, "two runs of the same batch differ");
    // Grouped: a row alone (16-row tiles) and inside the batch (64-row
    // tiles). GEMV: a row alone and inside a batch of 4 (the path's rows
    // are independent).
    let gemv4 = run(&x[..4 * hidden], &ids[..4 * k], &w[..4 * k], MoePath::Gemv);
    for r in [0, 3, 137, 299] {
        let (xr, ir, wr) = (
            &x[r * hidden..][..hidden],
            &ids[r * k..][..k],
            &w[r * k..][..k],
        );
        let alone = run(xr, ir, wr, MoePath::Grouped);
        assert!(
            alone == a[r * hidden..][..hidden],
            "row {r} alone differs from row {r} in a batch of {rows} (grouped)"
        );
        if r < 4 {
            let alone = run(xr, ir, wr, MoePath::Gemv);
            assert!(
                alone == gemv4[r * hidden..][..hidden],
                "row {r} alone differs from row {r} in a batch of 4 (GEMV)"
            );
        }
    }
    eprintln!("notice: moe_experts bitwise deterministic and batch-independent on each path");
}

/// Asserts `r` is a shape error.
fn shape<T>(r: pagoda_kernels::Result<T>, what: &str) {
    match r {
        Err(KernelError::Shape { .. }) => {}
        Err(e) => panic!("{what}: expected a shape error, got {e}"),
        Ok(_) => panic!("{what}: expected a shape error, got a result"),
    }
}

#[test]
fn bad_routes_and_shapes_are_errors() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(7);
    let (e, hidden, inter) = (4, 32, 16);
    let l = Layer::random(&mut rng, e, hidden, inter);
    let (gu, dn) = l.gpu(&g);
    let x = g
        .tensor_from_host(2, hidden, &rvec(&mut rng, 2 * hidden, 1.0))
        .unwrap();
    // An id at the expert count.
    let r = g.moe_routes_from_host(&[0, 4, 1, 2], &[0.5; 4], 2).unwrap();
    shape(g.moe_experts(&x, &r, &gu, &dn, e), "id 4 of 4 experts");
    // Routes for another row count.
    let r = g.moe_routes_from_host(&[0, 1], &[0.5; 2], 2).unwrap();
    shape(g.moe_experts(&x, &r, &gu, &dn, e), "routes for 1 of 2 rows");
    // Host routes that do not fit top_k.
    shape(
        g.moe_routes_from_host(&[0, 1, 2], &[0.5; 3], 2),
        "3 ids, k 2",
    );
    shape(
        g.moe_routes_from_host(&[0, 1], &[0.5], 1),
        "2 ids, 1 weight",
    );
    shape(g.moe_routes_from_host(&[0, 1], &[0.5; 2], 0), "k 0");
    // Weights of the wrong shape, or another expert count.
    let r = g.moe_routes_from_host(&[0, 1, 2, 3], &[0.5; 4], 2).unwrap();
    shape(
        g.moe_experts(&x, &r, &dn, &gu, e),
        "gate_up and down swapped",
    );
    shape(g.moe_experts(&x, &r, &gu, &dn, 3), "3 experts");
    shape(g.moe_experts(&x, &r, &gu, &dn, 0), "0 experts");
    // Routing with top_k 0 or above the expert count.
    let logits = g.tensor_from_host(2, e, &[0.0; 8]).unwrap();
    shape(g.moe_route(&logits, 0, true), "route k 0");
    shape(g.moe_route(&logits, 5, true), "route k 5 of 4");
    // A well-formed call still works after the refusals.
    let y = g.moe_experts(&x, &r, &gu, &dn, e).unwrap();
    assert!(g.tensor_to_host(&y).unwrap().iter().all(|v| v.is_finite()));
}

/// Runs one layer on `path` (host routes) and returns the output.
#[allow(clippy::too_many_arguments)]
fn run_on(
    g: &CudaBackend,
    l: &Layer,
    gw: &(CudaWeight, CudaWeight),
    x: &[f32],
    ids: &[u32],
    w: &[f32],
    k: usize,
    path: MoePath,
) -> Vec<f32> {
    let rows = x.len() / l.hidden;
    let xt = g.tensor_from_host(rows, l.hidden, x).unwrap();
    let r = g.moe_routes_from_host(ids, w, k).unwrap();
    let y = g.moe_experts_on(&xt, &r, &gw.0, &gw.1, l.e, path).unwrap();
    g.tensor_to_host(&y).unwrap()
}

#[test]
fn gemv_path_at_small_batches_and_the_switch_over() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut rng = Rng::new(9);
    // (experts, hidden, inter, top_k, rows): Qwen3-30B-A3B's sizes up to
    // the last GEMV row count and one past; Mixtral-like (8 experts, top
    // 2: GEMV up to 4 rows); an odd top_k; widths that are not multiples
    // of the 128-chunk step (tails).
    let layers: &[(usize, usize, usize, usize, &[usize])] = &[
        (
            128,
            2048,
            768,
            8,
            &[1, 2, 4, 8, MOE_GEMV_MAX_ROWS, MOE_GEMV_MAX_ROWS + 1],
        ),
        (8, 256, 120, 2, &[1, 2, 4, 5]),
        (16, 64, 32, 3, &[1, 2, 5, 6]),
        (12, 1000, 264, 4, &[1, 3, 4]),
    ];
    for &(e, hidden, inter, k, rows_list) in layers {
        let l = Layer::random(&mut rng, e, hidden, inter);
        let (gw, cw) = (l.gpu(&g), l.cpu(&c));
        for &rows in rows_list {
            let x = rvec(&mut rng, rows * hidden, 1.0);
            let (ids, w) = routes(&mut rng, rows, k, &all_experts(e));
            let path = MoePath::for_shape(rows, k, e, hidden, inter);
            let want_gemv = rows <= MOE_GEMV_MAX_ROWS && rows * k <= e;
            assert_eq!(path == MoePath::Gemv, want_gemv, "E{e} k{k} rows{rows}");
            // What the backend runs (the stream kernels in place of the
            // grouped GEMMs at decode-sized steps, by default).
            let path = MoePath::chosen(rows, k, e, (hidden, inter), false);
            let label = format!("E{e} H{hidden} I{inter} k{k} rows{rows} ({path:?})");
            let auto = case(&g, &c, &l, &gw, &cw, &x, &ids, &w, k, &label);
            let want = l.reference(&x, &ids, &w, k);
            for p in [
                MoePath::Gemv,
                MoePath::Grouped,
                MoePath::GroupedGemv,
                MoePath::Stream,
            ] {
                let got = run_on(&g, &l, &gw, &x, &ids, &w, k, p);
                check_rel(&format!("{label} forced {p:?} vs f64"), &got, &want, 1e-2);
                if p == path {
                    assert!(
                        got == auto,
                        "{label}: forced {p:?} differs from the auto path"
                    );
                }
            }
            // Bitwise the same on a second run.
            let again = run_on(&g, &l, &gw, &x, &ids, &w, k, path);
            assert!(again == auto, "{label}: two runs differ");
        }
    }
    // An expert named twice in a row counts twice on the GEMV path too.
    let (e, hidden, inter) = (32, 96, 40);
    let l = Layer::random(&mut rng, e, hidden, inter);
    let gw = l.gpu(&g);
    let rows = 3;
    let x = rvec(&mut rng, rows * hidden, 1.0);
    let ids: Vec<u32> = (0..rows).flat_map(|_| [2, 2, 1]).collect();
    let w: Vec<f32> = (0..rows).flat_map(|_| [0.5, 0.25, 0.25]).collect();
    assert_eq!(MoePath::for_shape(rows, 3, e, hidden, inter), MoePath::Gemv);
    check_rel(
        "GEMV expert 2 twice per row vs f64",
        &run_on(&g, &l, &gw, &x, &ids, &w, 3, MoePath::Gemv),
        &l.reference(&x, &ids, &w, 3),
        1e-2,
    );
    // Widths off 8: the GEMV path refuses, the auto path groups.
    let l = Layer::random(&mut rng, 4, 20, 12);
    let gw = l.gpu(&g);
    let xt = g.tensor_from_host(1, 20, &rvec(&mut rng, 20, 1.0)).unwrap();
    let r = g.moe_routes_from_host(&[1, 3], &[0.5, 0.5], 2).unwrap();
    shape(
        g.moe_experts_on(&xt, &r, &gw.0, &gw.1, 4, MoePath::Gemv),
        "GEMV with hidden 20",
    );
    // An id past the layer is refused before either path.
    let r = g.moe_routes_from_host(&[1, 4], &[0.5, 0.5], 2).unwrap();
    shape(
        g.moe_experts_on(&xt, &r, &gw.0, &gw.1, 4, MoePath::Gemv),
        "GEMV with id 4 of 4",
    );
}

#[test]
fn graph_replays_follow_new_routings() {
    let Some(g) = gpu() else { return };
    g.set_poison_outputs(false);
    // (experts, top_k, rows): 32 pairs over 16 experts group; 8 take the
    // GEMV path.
    for (e, k, n) in [(16, 4, 8), (16, 2, 4)] {
        let path = MoePath::for_shape(n, k, e, 128, 64);
        graph_case(&g, e, k, n);
        eprintln!("notice: moe graph replays ({path:?} path) match eager runs over 6 routings");
    }
}

fn graph_case(g: &CudaBackend, e: usize, k: usize, n: usize) {
    let mut rng = Rng::new(8);
    let (vocab, hidden, inter) = (512, 128, 64);
    let l = Layer::random(&mut rng, e, hidden, inter);
    let (gu, dn) = l.gpu(g);
    let table = g
        .load_weight(weight2(vocab, hidden, rvec(&mut rng, vocab * hidden, 1.0)))
        .unwrap();
    let ones = g
        .load_weight(HostTensor::f32(vec![hidden], vec![1.0; hidden]))
        .unwrap();
    let router = g
        .load_weight(weight2(e, hidden, rvec(&mut rng, e * hidden, 0.5)))
        .unwrap();
    // Embedding -> norm -> router -> routes -> experts: each step's token
    // ids change the routing; the graph's greedy tokens must follow.
    let forward = |s: &pagoda_kernels::cuda::CudaStep| {
        let h = g.embedding(s, &table)?;
        let x = g.rms_norm(&h, &ones, 1e-6)?;
        let logits = g.linear(&x, &router, None)?;
        let routes = g.moe_route(&logits, k, true)?;
        let y = g.moe_experts(&x, &routes, &gu, &dn, e)?;
        g.gather_logits_rows(&y, s)
    };
    let ctx_with = |rng: &mut Rng| {
        let mut ctx = sampling_step(vec![SamplingRow::GREEDY; n]);
        ctx.input_ids = (0..n).map(|_| rng.below(vocab) as u32).collect();
        ctx
    };
    let first = ctx_with(&mut rng);
    let step = g.begin_step(&first).unwrap();
    let mut graph = g.capture_graph(step, &mut |s| forward(s)).unwrap();
    let mut distinct = std::collections::HashSet::new();
    for round in 0..6 {
        let ctx = ctx_with(&mut rng);
        let replayed = g.replay_graph(&mut graph, &ctx).unwrap();
        let s = g.begin_step(&ctx).unwrap();
        let direct = g.sample(&forward(&s).unwrap(), &s).unwrap();
        assert_eq!(
            replayed, direct,
            "round {round}: graph replay and an eager run disagree"
        );
        distinct.insert(replayed);
    }
    assert!(distinct.len() > 1, "every round gave the same tokens");
}

#[test]
fn sigmoid_gate_rows_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut rng = Rng::new(10);
    for (rows, cols, gate_cols) in [(1, 64, 8), (7, 96, 8), (300, 48, 1)] {
        let x = rvec(&mut rng, rows * cols, 2.0);
        let gate = rvec(&mut rng, rows * gate_cols, 6.0);
        let mut xg = g.tensor_from_host(rows, cols, &x).unwrap();
        let gg = g.tensor_from_host(rows, gate_cols, &gate).unwrap();
        g.sigmoid_gate_rows(&mut xg, &gg).unwrap();
        let got = g.tensor_to_host(&xg).unwrap();
        let mut xc = c.tensor_from_host(rows, cols, &x).unwrap();
        let gc = c.tensor_from_host(rows, gate_cols, &gate).unwrap();
        c.sigmoid_gate_rows(&mut xc, &gc).unwrap();
        let want: Vec<f64> = c
            .tensor_to_host(&xc)
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect();
        // One bf16 rounding of the product.
        check_rel(
            &format!("sigmoid gate {rows}x{cols} (gate {gate_cols} wide)"),
            &got,
            &want,
            1e-2,
        );
    }
    // f32 gate logits (a residual-kind tensor) take the other kernel.
    let x = rvec(&mut rng, 3 * 16, 1.0);
    let gate = rvec_f32(&mut rng, 3, 3.0);
    let mut xg = g.tensor_from_host(3, 16, &x).unwrap();
    g.sigmoid_gate_rows(&mut xg, &g.residual_from_host(3, 1, &gate).unwrap())
        .unwrap();
    let want: Vec<f64> = (0..48)
        .map(|i| x[i] as f64 / (1.0 + (-(gate[i / 16] as f64)).exp()))
        .collect();
    check_rel(
        "sigmoid gate f32 logits",
        &g.tensor_to_host(&xg).unwrap(),
        &want,
        1e-2,
    );
    shape(
        g.sigmoid_gate_rows(&mut xg, &g.tensor_from_host(2, 1, &[0.0; 2]).unwrap()),
        "gate for 2 of 3 rows",
    );
}
