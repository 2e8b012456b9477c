//! `linear`: `y = x @ w^T (+ bias)` for `x: [rows, k]`, `w: [n, k]`.
//!
//! Two paths, chosen by the number of rows:
//! - `rows <= gemv::MAX_ROWS` (decode): [`super::gemv`], one pass over the
//!   weights, memory-bandwidth bound.
//! - more rows (prefill): the `gemm` crate's f32 kernels, parallel over tiles
//!   of output features. Weights stored as f16/bf16 are converted to f32 one
//!   tile at a time (each tile is converted once per call and reused by every
//!   row), so a narrow weight costs `n * k` conversions against
//!   `2 * rows * n * k` flops.

use super::gemv;
use super::storage::{CpuTensor, CpuWeight, WeightData};
use crate::{KernelError, Result};
use gemm::Parallelism;
use rayon::prelude::*;

/// Output features per GEMM task.
const TILE_N: usize = 64;

/// A raw output pointer shared by tasks that write disjoint columns.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: used only to hand disjoint column ranges of one buffer to tasks.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

pub fn linear(
    x: &CpuTensor,
    w: &CpuWeight,
    bias: Option<&CpuWeight>,
    threads: usize,
) -> Result<CpuTensor> {
    let (rows, k, n) = (x.rows, x.cols, w.rows);
    if w.cols != k {
        return Err(KernelError::Shape {
            op: "linear",
            detail: format!("x is [{rows}, {k}] but w is [{n}, {}]", w.cols),
        });
    }
    let bias = match bias {
        Some(b) => match b.as_f32() {
            Some(v) if v.len() == n => Some(v),
            _ => {
                return Err(KernelError::Shape {
                    op: "linear",
                    detail: format!("bias must be {n} f32 values"),
                })
            }
        },
        None => None,
    };
    let mut y = CpuTensor::for_overwrite(rows, n);
    if rows == 0 || n == 0 {
        return Ok(y);
    }
    if k == 0 {
        match bias {
            Some(b) => y.data.chunks_exact_mut(n).for_each(|r| r.copy_from_slice(b)),
            None => y.data.fill(0.0),
        }
        return Ok(y);
    }
    if rows <= gemv::MAX_ROWS {
        if rows == 1 {
            gemv::gemv_t(&x.data, 1, w, &mut y.data, threads);
        } else {
            let mut t = vec![0f32; n * rows];
            gemv::gemv_t(&x.data, rows, w, &mut t, threads);
            for (j, col) in t.chunks_exact(rows).enumerate() {
                for (r, v) in col.iter().enumerate() {
                    y.data[r * n + j] = *v;
                }
            }
        }
        if let Some(b) = bias {
            for row in y.data.chunks_exact_mut(n) {
                for (o, b) in row.iter_mut().zip(b) {
                    *o += b;
                }
            }
        }
        return Ok(y);
    }
    gemm_tiled(&x.data, rows, k, w, bias, &mut y.data);
    Ok(y)
}

/// `y = x @ w^T + bias` through the `gemm` crate, parallel over `TILE_N` output features.
fn gemm_tiled(
    x: &[f32],
    rows: usize,
    k: usize,
    w: &CpuWeight,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    let n = w.rows;
    if let Some(b) = bias {
        y.par_chunks_mut(n).for_each(|r| r.copy_from_slice(b));
    }
    let yp = SendPtr(y.as_mut_ptr());
    let tiles = n.div_ceil(TILE_N);
    (0..tiles)
        .into_par_iter()
        .for_each_init(Vec::new, |buf: &mut Vec<f32>, t| {
            let yp = yp;
            let (j0, j1) = (t * TILE_N, ((t + 1) * TILE_N).min(n));
            let wt: &[f32] = match &w.data {
                WeightData::F32(v) => &v[j0 * k..j1 * k],
                _ => {
                    buf.resize((j1 - j0) * k, 0.0);
                    w.rows_to_f32(j0, j1, buf);
                    buf
                }
            };
            // SAFETY: dst covers columns j0..j1 of every row of y ([rows, n]); tasks
            // write disjoint column ranges. lhs is x ([rows, k], row-major); rhs is
            // wt^T ([k, j1 - j0], element (i, j) at wt[j * k + i]).
            unsafe {
                gemm::gemm(
                    rows,
                    j1 - j0,
                    k,
                    yp.0.add(j0),
                    1,
                    n as isize,
                    bias.is_some(),
                    x.as_ptr(),
                    1,
                    k as isize,
                    wt.as_ptr(),
                    k as isize,
                    1,
                    1.0,
                    1.0,
                    false,
                    false,
                    false,
                    Parallelism::None,
                );
            }
        });
}
