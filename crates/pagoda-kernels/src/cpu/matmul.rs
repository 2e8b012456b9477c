//! `linear`: `y = x @ w^T (+ bias)` for `x: [rows, k]`, `w: [n, k]`.
//!
//! Two paths, chosen by the number of rows:
//! - `rows <= gemv::MAX_ROWS` (decode): [`super::gemv`], one pass over the
//!   weights, memory-bandwidth bound.
//! - more rows (prefill): the `gemm` crate's f32 kernels (multi-threaded).
//!   Weights stored as f16/bf16 are widened to f32 in chunks of output
//!   features first (once per call, shared by every row), so a narrow weight
//!   costs `n * k` conversions against `2 * rows * n * k` flops, and a scratch
//!   buffer of at most `CHUNK_N * k` f32.

use super::gemv;
use super::storage::{CpuTensor, CpuWeight, WeightData};
use crate::{KernelError, Result};
use gemm::Parallelism;
use rayon::prelude::*;

/// Most output features widened to f32 at once (bounds the scratch buffer to
/// `CHUNK_N * k` f32, 9 MiB for k = 576).
const CHUNK_N: usize = 4096;

/// Weight rows per conversion task.
const CONVERT_ROWS: usize = 64;

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
            Some(b) => y
                .data
                .chunks_exact_mut(n)
                .for_each(|r| r.copy_from_slice(b)),
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
    gemm_chunked(&x.data, rows, k, w, bias, &mut y.data, threads);
    Ok(y)
}

/// `y = x @ w^T + bias` through the `gemm` crate. A narrow weight is widened
/// to f32 in chunks of at most `CHUNK_N` output features (in parallel), each
/// chunk then multiplied by one multi-threaded gemm call.
fn gemm_chunked(
    x: &[f32],
    rows: usize,
    k: usize,
    w: &CpuWeight,
    bias: Option<&[f32]>,
    y: &mut [f32],
    threads: usize,
) {
    let n = w.rows;
    if let Some(b) = bias {
        y.par_chunks_mut(n).for_each(|r| r.copy_from_slice(b));
    }
    let chunk_n = CHUNK_N.min(n);
    let mut buf = Vec::new();
    let mut j0 = 0;
    while j0 < n {
        let j1 = (j0 + chunk_n).min(n);
        let wt: &[f32] = match &w.data {
            WeightData::F32(v) => &v[j0 * k..j1 * k],
            _ => {
                buf.resize((j1 - j0) * k, 0.0);
                buf.par_chunks_mut(CONVERT_ROWS * k)
                    .enumerate()
                    .for_each(|(c, out)| {
                        let r0 = j0 + c * CONVERT_ROWS;
                        w.rows_to_f32(r0, r0 + out.len() / k, out);
                    });
                &buf
            }
        };
        // SAFETY: dst is columns j0..j1 of y ([rows, n], row stride n); lhs is
        // x ([rows, k], row-major); rhs is wt^T ([k, j1 - j0], element (i, j)
        // at wt[j * k + i]). All three lie inside their slices.
        unsafe {
            gemm::gemm(
                rows,
                j1 - j0,
                k,
                y.as_mut_ptr().add(j0),
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
                if threads > 1 {
                    Parallelism::Rayon(threads)
                } else {
                    Parallelism::None
                },
            );
        }
        j0 = j1;
    }
}
