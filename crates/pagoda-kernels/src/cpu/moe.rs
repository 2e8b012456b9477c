//! Mixture-of-experts on the CPU: routing ([`route`], [`routes_from_host`])
//! and the expert MLPs ([`experts`]), as [`crate::Backend::moe_route`] and
//! [`crate::Backend::moe_experts`] define them.
//!
//! - Routing: per row, an f32 softmax over all experts, the `top_k` largest
//!   probabilities (ties to the lower expert index), optionally divided by
//!   their sum. Routes stay on the host ([`CpuRoutes`]).
//! - Experts: the (row, choice) pairs are grouped by expert (a counting
//!   sort, O(rows * top_k)); each expert with rows gathers them and runs
//!   two ordinary linears on its own rows of the stacked weights
//!   ([`super::matmul::linear_into`] on a [`super::storage::WeightView`]:
//!   no copy of the weights, any storage, kept quantized blocks included),
//!   experts in parallel on the pool. Each row's output is then the sum of
//!   its choices in choice order, so the result does not depend on the
//!   thread count or on how the experts were scheduled.
//! - Shared-expert gates ([`sigmoid_gate_rows`]): each row scaled by the
//!   sigmoid of its gate logit.

use super::matmul::linear_into;
use super::storage::{CpuTensor, CpuWeight};
use crate::{KernelError, Result};
use rayon::prelude::*;

/// Each row's chosen experts and their weights, `top_k` per row.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuRoutes {
    pub(crate) top_k: usize,
    /// Row `r`'s experts: `ids[r * top_k..][..top_k]`.
    pub(crate) ids: Vec<u32>,
    /// Their weights, at the same places.
    pub(crate) weights: Vec<f32>,
}

impl CpuRoutes {
    /// Experts chosen per row.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Rows routed.
    pub fn rows(&self) -> usize {
        self.ids.len() / self.top_k.max(1)
    }

    /// Expert ids, `top_k` per row.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Route weights, `top_k` per row.
    pub fn weights(&self) -> &[f32] {
        &self.weights
    }
}

fn shape_err(op: &'static str, detail: String) -> KernelError {
    KernelError::Shape { op, detail }
}

/// Softmax, top-k and optional renormalization of each row of `logits`
/// (`[rows, num_experts]`).
pub fn route(logits: &CpuTensor, top_k: usize, renormalize: bool) -> Result<CpuRoutes> {
    let e = logits.cols;
    if top_k == 0 || top_k > e {
        return Err(shape_err(
            "moe_route",
            format!("top_k {top_k} out of 1..={e} experts"),
        ));
    }
    let rows = logits.rows;
    let mut ids = vec![0u32; rows * top_k];
    let mut weights = vec![0f32; rows * top_k];
    let mut probs = vec![0f32; e];
    let mut taken = vec![false; e];
    for r in 0..rows {
        let row = &logits.data[r * e..(r + 1) * e];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for (p, &l) in probs.iter_mut().zip(row) {
            *p = (l - max).exp();
            sum += *p;
        }
        probs.iter_mut().for_each(|p| *p /= sum);
        taken.fill(false);
        let (ids, ws) = (
            &mut ids[r * top_k..(r + 1) * top_k],
            &mut weights[r * top_k..(r + 1) * top_k],
        );
        for (id, w) in ids.iter_mut().zip(ws.iter_mut()) {
            // The first largest untaken probability (NaNs are never larger,
            // so k distinct experts are always chosen).
            let mut best = taken.iter().position(|t| !t).unwrap_or(0);
            for j in best + 1..e {
                if !taken[j] && probs[j] > probs[best] {
                    best = j;
                }
            }
            taken[best] = true;
            *id = best as u32;
            *w = probs[best];
        }
        if renormalize {
            let s: f32 = ws.iter().sum();
            ws.iter_mut().for_each(|w| *w /= s);
        }
    }
    Ok(CpuRoutes {
        top_k,
        ids,
        weights,
    })
}

/// Routes given on the host (see [`crate::Backend::moe_routes_from_host`]).
pub fn routes_from_host(ids: &[u32], weights: &[f32], top_k: usize) -> Result<CpuRoutes> {
    if top_k == 0 || ids.len() != weights.len() || !ids.len().is_multiple_of(top_k) {
        return Err(shape_err(
            "moe_routes_from_host",
            format!(
                "{} ids and {} weights for top_k {top_k}",
                ids.len(),
                weights.len()
            ),
        ));
    }
    Ok(CpuRoutes {
        top_k,
        ids: ids.to_vec(),
        weights: weights.to_vec(),
    })
}

/// `sum_k w_k * down_e(silu(gate_e x) * up_e x)` for each row of `x` over
/// its routes (see [`crate::Backend::moe_experts`]).
pub fn experts(
    x: &CpuTensor,
    routes: &CpuRoutes,
    gate_up: &CpuWeight,
    down: &CpuWeight,
    num_experts: usize,
    threads: usize,
) -> Result<CpuTensor> {
    let (rows, hidden) = (x.rows, x.cols);
    let top_k = routes.top_k;
    let inter = down.cols;
    let bad = |detail: String| Err(shape_err("moe_experts", detail));
    if num_experts == 0 {
        return bad("no experts".into());
    }
    if gate_up.cols != hidden || gate_up.rows != num_experts * 2 * inter {
        return bad(format!(
            "gate_up is [{}, {}], want [{num_experts} * 2 * {inter}, {hidden}]",
            gate_up.rows, gate_up.cols
        ));
    }
    if down.rows != num_experts * hidden {
        return bad(format!(
            "down is [{}, {inter}], want [{num_experts} * {hidden}, {inter}]",
            down.rows
        ));
    }
    if routes.rows() != rows {
        return bad(format!("{} routed rows for {rows} rows", routes.rows()));
    }
    if let Some(&id) = routes.ids.iter().find(|&&id| id as usize >= num_experts) {
        return bad(format!("expert {id} of {num_experts}"));
    }

    // Group the (row, choice) pairs by expert: `order[starts[e]..starts[e + 1]]`
    // are expert e's, as flat indices `r * top_k + k`, in increasing order.
    let n_routes = routes.ids.len();
    let mut starts = vec![0usize; num_experts + 1];
    for &id in &routes.ids {
        starts[id as usize + 1] += 1;
    }
    for e in 0..num_experts {
        starts[e + 1] += starts[e];
    }
    let mut order = vec![0usize; n_routes];
    let mut place = vec![0usize; n_routes];
    let mut fill = starts.clone();
    for (i, &id) in routes.ids.iter().enumerate() {
        let p = &mut fill[id as usize];
        order[*p] = i;
        place[i] = *p;
        *p += 1;
    }

    // Each expert's outputs, one row per route, grouped like `order`.
    let mut y = vec![0f32; n_routes * hidden];
    let mut jobs = Vec::new();
    let mut rest = y.as_mut_slice();
    for e in 0..num_experts {
        let n = starts[e + 1] - starts[e];
        let (mine, tail) = rest.split_at_mut(n * hidden);
        rest = tail;
        if n > 0 {
            jobs.push((e, &order[starts[e]..starts[e + 1]], mine));
        }
    }
    jobs.into_par_iter().for_each(|(e, routes_e, out)| {
        let n = routes_e.len();
        let mut xe = vec![0f32; n * hidden];
        for (dst, &i) in xe.chunks_exact_mut(hidden).zip(routes_e) {
            let r = i / top_k;
            dst.copy_from_slice(&x.data[r * hidden..(r + 1) * hidden]);
        }
        let mut gu = vec![0f32; n * 2 * inter];
        let w = gate_up.view_rows(e * 2 * inter, (e + 1) * 2 * inter);
        linear_into(&xe, n, w, None, &mut gu, threads);
        let mut h = vec![0f32; n * inter];
        for (o, g) in h.chunks_exact_mut(inter).zip(gu.chunks_exact(2 * inter)) {
            super::math::silu_mul_slice(o, &g[..inter], &g[inter..]);
        }
        let w = down.view_rows(e * hidden, (e + 1) * hidden);
        linear_into(&h, n, w, None, out, threads);
    });

    let mut out = CpuTensor::for_overwrite(rows, hidden);
    super::par::chunks(&mut out.data, hidden, |r, o| {
        o.fill(0.0);
        for k in 0..top_k {
            let i = r * top_k + k;
            let w = routes.weights[i];
            let src = &y[place[i] * hidden..(place[i] + 1) * hidden];
            for (o, s) in o.iter_mut().zip(src) {
                *o += w * s;
            }
        }
    });
    Ok(out)
}

/// `x[r, :] *= sigmoid(gate[r, 0])` (see
/// [`crate::Backend::sigmoid_gate_rows`]).
pub fn sigmoid_gate_rows(x: &mut CpuTensor, gate: &CpuTensor) -> Result<()> {
    if gate.rows != x.rows || gate.cols == 0 {
        return Err(shape_err(
            "sigmoid_gate_rows",
            format!(
                "gate is [{}, {}] for {} rows (want [rows, >= 1])",
                gate.rows, gate.cols, x.rows
            ),
        ));
    }
    let cols = x.cols;
    if cols == 0 {
        return Ok(());
    }
    for (r, row) in x.data.chunks_exact_mut(cols).enumerate() {
        let g = gate.data[r * gate.cols];
        let s = 1.0 / (1.0 + (-g).exp());
        row.iter_mut().for_each(|v| *v *= s);
    }
    Ok(())
}
