//! Mixture-of-experts test data and the f64 reference the MoE tests of both
//! backends check against: random stacked expert weights, random routes,
//! the experts' weighted SwiGLU MLPs in f64, and a relative-error check.

use super::{rvec, Rng};
use pagoda_kernels::HostTensor;
use rayon::prelude::*;

/// One layer's stacked experts (bf16-rounded values): `gate_up` `[e * 2 *
/// inter, hidden]` (each expert's gate rows, then its up rows), `down` `[e
/// * hidden, inter]`.
pub struct Experts {
    pub e: usize,
    pub hidden: usize,
    pub inter: usize,
    pub gate_up: Vec<f32>,
    pub down: Vec<f32>,
}

impl Experts {
    /// Random weights scaled so gate, up and the outputs are of order 1.
    pub fn random(rng: &mut Rng, e: usize, hidden: usize, inter: usize) -> Experts {
        let s_in = (3.0 / hidden as f32).sqrt();
        let s_out = (3.0 / inter.max(1) as f32).sqrt();
        Experts {
            e,
            hidden,
            inter,
            gate_up: rvec(rng, e * 2 * inter * hidden, s_in),
            down: rvec(rng, e * hidden * inter, s_out),
        }
    }

    /// The two stacked weights as host tensors.
    pub fn host(&self) -> (HostTensor, HostTensor) {
        (
            HostTensor::f32(
                vec![self.e * 2 * self.inter, self.hidden],
                self.gate_up.clone(),
            ),
            HostTensor::f32(vec![self.e * self.hidden, self.inter], self.down.clone()),
        )
    }

    /// [`reference`] on these weights, values only.
    pub fn reference(&self, x: &[f32], ids: &[u32], w: &[f32], k: usize) -> Vec<f64> {
        let (h, i) = (self.hidden, self.inter);
        reference(x, (h, i), ids, w, k, &self.gate_up, &self.down).0
    }
}

/// `sum_k w_k * down_e(silu(gate_e x) * up_e x)` per row of `x` in f64 on
/// the given stacked weight values (`(hidden, inter)` their sizes), and
/// each element's scale `sum_k |w_k| sum |down| |act|` for tolerances.
pub fn reference(
    x: &[f32],
    (hidden, inter): (usize, usize),
    ids: &[u32],
    ws: &[f32],
    top_k: usize,
    gate_up: &[f32],
    down: &[f32],
) -> (Vec<f64>, Vec<f64>) {
    let rows = x.len() / hidden.max(1);
    let dot =
        |a: &[f32], b: &[f32]| -> f64 { a.iter().zip(b).map(|(&p, &q)| p as f64 * q as f64).sum() };
    let per_row: Vec<(Vec<f64>, Vec<f64>)> = (0..rows)
        .into_par_iter()
        .map(|r| {
            let xr = &x[r * hidden..][..hidden];
            let (mut y, mut scale) = (vec![0f64; hidden], vec![0f64; hidden]);
            for k in 0..top_k {
                let (e, w) = (ids[r * top_k + k] as usize, ws[r * top_k + k] as f64);
                let act: Vec<f64> = (0..inter)
                    .map(|i| {
                        let g = dot(&gate_up[(e * 2 * inter + i) * hidden..][..hidden], xr);
                        let u = dot(
                            &gate_up[(e * 2 * inter + inter + i) * hidden..][..hidden],
                            xr,
                        );
                        g / (1.0 + (-g).exp()) * u
                    })
                    .collect();
                for o in 0..hidden {
                    let d = &down[(e * hidden + o) * inter..][..inter];
                    let v: f64 = d.iter().zip(&act).map(|(&a, &b)| a as f64 * b).sum();
                    let m: f64 = d
                        .iter()
                        .zip(&act)
                        .map(|(&a, &b)| (a as f64 * b).abs())
                        .sum();
                    y[o] += w * v;
                    scale[o] += w.abs() * m;
                }
            }
            (y, scale)
        })
        .collect();
    let (y, scale): (Vec<_>, Vec<_>) = per_row.into_iter().unzip();
    (y.concat(), scale.concat())
}

/// Expert ids `0..e`, the pool of [`routes`] over every expert.
pub fn all_experts(e: usize) -> Vec<u32> {
    (0..e as u32).collect()
}

/// `rows` rows of `top_k` distinct experts each, drawn from `pool`, with
/// positive weights summing to 1.
pub fn routes(rng: &mut Rng, rows: usize, top_k: usize, pool: &[u32]) -> (Vec<u32>, Vec<f32>) {
    let (mut ids, mut ws) = (Vec::new(), Vec::new());
    let mut p = pool.to_vec();
    for _ in 0..rows {
        rng.shuffle(&mut p);
        ids.extend_from_slice(&p[..top_k]);
        let raw: Vec<f32> = (0..top_k).map(|_| 0.1 + rng.uniform().abs()).collect();
        let s: f32 = raw.iter().sum();
        ws.extend(raw.iter().map(|v| v / s));
    }
    (ids, ws)
}

/// Asserts `got` has `want`'s length, every element finite (outputs are
/// NaN-poisoned, so an unwritten one fails) and a relative L2 error of at
/// most `tol`; prints and returns the error.
pub fn check_rel(what: &str, got: &[f32], want: &[f64], tol: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().position(|v| !v.is_finite()) {
        panic!("{what}: element {i} is {} (unwritten or overflow)", got[i]);
    }
    let (mut num, mut den) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w) * (g as f64 - w);
        den += w * w;
    }
    let e = (num / den.max(f64::MIN_POSITIVE)).sqrt();
    eprintln!("{what}: relative error {e:.2e}");
    assert!(e <= tol, "{what}: relative error {e:.3e} > {tol:e}");
    e
}

/// `v` as f64, for [`check_rel`] against another f32 output.
pub fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}
