//! Normalizations: RMSNorm (plain, fused with the residual add, per head) and
//! LayerNorm. Each row is reduced in f32 (8 partial sums, so the compiler can
//! vectorize) and rows run in parallel.

use super::par;
use super::storage::{CpuTensor, CpuWeight};
use crate::{KernelError, Result};

/// The f32 elements of a vector weight of length `n`.
pub(crate) fn vector<'a>(w: &'a CpuWeight, n: usize, op: &'static str) -> Result<&'a [f32]> {
    match w.as_f32() {
        Some(v) if v.len() == n => Ok(v),
        _ => Err(KernelError::Shape {
            op,
            detail: format!(
                "weight must be a vector of {n} values, got [{}, {}]",
                w.rows, w.cols
            ),
        }),
    }
}

/// Sum of squares of `x`, in f32 with 8 partial sums.
fn sum_sq(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            acc[i] += c[i] * c[i];
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
    acc.iter().sum::<f32>() + tail
}

/// `out = x / rms(x) * w`.
fn rms_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let inv = 1.0 / (sum_sq(x) / x.len() as f32 + eps).sqrt();
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = v * inv * g;
    }
}

pub fn rms_norm(x: &CpuTensor, w: &CpuWeight, eps: f32) -> Result<CpuTensor> {
    let w = vector(w, x.cols, "rms_norm")?;
    let mut y = CpuTensor::for_overwrite(x.rows, x.cols);
    if x.cols == 0 {
        return Ok(y);
    }
    let c = x.cols;
    par::chunks(&mut y.data, c, |i, o| {
        rms_row(&x.data[i * c..(i + 1) * c], w, eps, o)
    });
    Ok(y)
}

pub fn add_rms_norm(
    residual: &mut CpuTensor,
    x: &CpuTensor,
    w: &CpuWeight,
    eps: f32,
) -> Result<CpuTensor> {
    if (residual.rows, residual.cols) != (x.rows, x.cols) {
        return Err(KernelError::Shape {
            op: "add_rms_norm",
            detail: format!(
                "residual [{}, {}] vs x [{}, {}]",
                residual.rows, residual.cols, x.rows, x.cols
            ),
        });
    }
    let w = vector(w, x.cols, "add_rms_norm")?;
    let mut y = CpuTensor::for_overwrite(x.rows, x.cols);
    if x.cols == 0 {
        return Ok(y);
    }
    let c = x.cols;
    par::chunks2(&mut y.data, &mut residual.data, c, |i, o, res| {
        for (a, b) in res.iter_mut().zip(&x.data[i * c..(i + 1) * c]) {
            *a += b;
        }
        rms_row(res, w, eps, o);
    });
    Ok(y)
}

pub fn head_rms_norm(x: &mut CpuTensor, w: &CpuWeight, head_dim: usize, eps: f32) -> Result<()> {
    if head_dim == 0 || !x.cols.is_multiple_of(head_dim) {
        return Err(KernelError::Shape {
            op: "head_rms_norm",
            detail: format!("cols {} not a multiple of head_dim {head_dim}", x.cols),
        });
    }
    let w = vector(w, head_dim, "head_rms_norm")?;
    par::chunks(&mut x.data, x.cols, |_, row| {
        let mut tmp = vec![0f32; head_dim];
        for h in row.chunks_exact_mut(head_dim) {
            rms_row(h, w, eps, &mut tmp);
            h.copy_from_slice(&tmp);
        }
    });
    Ok(())
}

pub fn layer_norm(x: &CpuTensor, w: &CpuWeight, b: &CpuWeight, eps: f32) -> Result<CpuTensor> {
    let w = vector(w, x.cols, "layer_norm")?;
    let b = vector(b, x.cols, "layer_norm")?;
    let mut y = CpuTensor::for_overwrite(x.rows, x.cols);
    if x.cols == 0 {
        return Ok(y);
    }
    let n = x.cols as f32;
    let c = x.cols;
    par::chunks(&mut y.data, c, |i, o| {
        let r = &x.data[i * c..(i + 1) * c];
        {
            let mean = r.iter().sum::<f32>() / n;
            let var = r.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
            let inv = 1.0 / (var + eps).sqrt();
            for (((o, v), g), bb) in o.iter_mut().zip(r).zip(w).zip(b) {
                *o = (v - mean) * inv * g + bb;
            }
        }
    });
    Ok(y)
}
