//! Row-wise ops: embedding lookups, rotary embedding, activations, adds and
//! the gather of logits rows. All are O(elements), parallel over rows, and
//! check every index they read (token ids, positions, row numbers) before use.

use super::par;
use super::storage::{CpuStep, CpuTensor, CpuWeight};
use crate::{KernelError, Result, RopeStyle};

fn shape_err(op: &'static str, detail: String) -> KernelError {
    KernelError::Shape { op, detail }
}

fn check_rows(op: &'static str, x: &CpuTensor, step: &CpuStep) -> Result<()> {
    if x.rows != step.ctx.num_tokens() {
        return Err(shape_err(
            op,
            format!(
                "{} rows but the step has {} tokens",
                x.rows,
                step.ctx.num_tokens()
            ),
        ));
    }
    Ok(())
}

/// Gathers `table` rows `ids[i]` (each checked `< table.rows`).
fn gather(op: &'static str, table: &CpuWeight, ids: &[usize]) -> Result<CpuTensor> {
    if let Some(&bad) = ids.iter().find(|&&r| r >= table.rows) {
        return Err(shape_err(
            op,
            format!("row {bad} out of range ({} rows)", table.rows),
        ));
    }
    let mut y = CpuTensor::for_overwrite(ids.len(), table.cols);
    if table.cols > 0 {
        par::chunks(&mut y.data, table.cols, |i, o| table.row_to_f32(ids[i], o));
    }
    Ok(y)
}

pub fn embedding(step: &CpuStep, table: &CpuWeight) -> Result<CpuTensor> {
    let ids: Vec<usize> = step.ctx.input_ids.iter().map(|&t| t as usize).collect();
    gather("embedding", table, &ids)
}

pub fn gather_logits_rows(x: &CpuTensor, step: &CpuStep) -> Result<CpuTensor> {
    let idx = &step.ctx.logits_indices;
    if let Some(&bad) = idx.iter().find(|&&r| r as usize >= x.rows) {
        return Err(shape_err(
            "gather_logits_rows",
            format!("row {bad} of {}", x.rows),
        ));
    }
    let mut y = CpuTensor::for_overwrite(idx.len(), x.cols);
    for (o, &r) in y.data.chunks_exact_mut(x.cols.max(1)).zip(idx) {
        let r = r as usize;
        o.copy_from_slice(&x.data[r * x.cols..(r + 1) * x.cols]);
    }
    Ok(y)
}

pub fn add_position_embedding(
    x: &mut CpuTensor,
    step: &CpuStep,
    table: &CpuWeight,
    offset: usize,
) -> Result<()> {
    check_rows("add_position_embedding", x, step)?;
    if table.cols != x.cols {
        return Err(shape_err(
            "add_position_embedding",
            format!("table has {} columns, x {}", table.cols, x.cols),
        ));
    }
    let ids: Vec<usize> = step
        .ctx
        .positions
        .iter()
        .map(|&p| p as usize + offset)
        .collect();
    let pe = gather("add_position_embedding", table, &ids)?;
    add(x, &pe)
}

pub fn rope(
    x: &mut CpuTensor,
    step: &CpuStep,
    cos_sin: &CpuWeight,
    head_dim: usize,
    style: RopeStyle,
) -> Result<()> {
    check_rows("rope", x, step)?;
    let rd = cos_sin.cols;
    if head_dim == 0 || !x.cols.is_multiple_of(head_dim) || rd > head_dim || !rd.is_multiple_of(2) {
        return Err(shape_err(
            "rope",
            format!("cols {}, head_dim {head_dim}, rotary_dim {rd}", x.cols),
        ));
    }
    let positions = &step.ctx.positions;
    if let Some(&bad) = positions.iter().find(|&&p| p as usize >= cos_sin.rows) {
        return Err(shape_err(
            "rope",
            format!("position {bad} beyond the table's {} rows", cos_sin.rows),
        ));
    }
    if rd == 0 || x.cols == 0 {
        return Ok(());
    }
    let half = rd / 2;
    par::chunks(&mut x.data, x.cols, |i, row| {
        let mut cs = [0f32; 512];
        let mut heap = Vec::new();
        let cs: &mut [f32] = if rd <= cs.len() {
            &mut cs[..rd]
        } else {
            heap.resize(rd, 0.0);
            &mut heap
        };
        cos_sin.row_to_f32(positions[i] as usize, cs);
        let (cos, sin) = cs.split_at(half);
        for h in row.chunks_exact_mut(head_dim) {
            match style {
                RopeStyle::Neox => {
                    let (a, b) = h[..rd].split_at_mut(half);
                    for i in 0..half {
                        let (x1, x2) = (a[i], b[i]);
                        a[i] = x1 * cos[i] - x2 * sin[i];
                        b[i] = x2 * cos[i] + x1 * sin[i];
                    }
                }
                RopeStyle::Interleaved => {
                    for i in 0..half {
                        let (x1, x2) = (h[2 * i], h[2 * i + 1]);
                        h[2 * i] = x1 * cos[i] - x2 * sin[i];
                        h[2 * i + 1] = x2 * cos[i] + x1 * sin[i];
                    }
                }
            }
        }
    });
    Ok(())
}

pub fn silu_mul(gate_up: &CpuTensor) -> Result<CpuTensor> {
    if !gate_up.cols.is_multiple_of(2) {
        return Err(shape_err(
            "silu_mul",
            format!("odd column count {}", gate_up.cols),
        ));
    }
    let n = gate_up.cols / 2;
    let mut y = CpuTensor::for_overwrite(gate_up.rows, n);
    if n == 0 {
        return Ok(y);
    }
    par::chunks(&mut y.data, n, |i, o| {
        let (g, u) = gate_up.data[i * 2 * n..(i + 1) * 2 * n].split_at(n);
        super::math::silu_mul_slice(o, g, u);
    });
    Ok(y)
}

/// transformers' `gelu_pytorch_tanh`:
/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const K: f32 = 0.797_884_6; // sqrt(2 / pi)
    0.5 * x * (1.0 + (K * (x + 0.044_715 * x * x * x)).tanh())
}

pub fn gelu_tanh_mul(gate_up: &CpuTensor) -> Result<CpuTensor> {
    if !gate_up.cols.is_multiple_of(2) {
        return Err(shape_err(
            "gelu_tanh_mul",
            format!("odd column count {}", gate_up.cols),
        ));
    }
    let n = gate_up.cols / 2;
    let mut y = CpuTensor::for_overwrite(gate_up.rows, n);
    if n == 0 {
        return Ok(y);
    }
    par::chunks(&mut y.data, n, |i, o| {
        let (g, u) = gate_up.data[i * 2 * n..(i + 1) * 2 * n].split_at(n);
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            *o = gelu_tanh(g) * u;
        }
    });
    Ok(y)
}

pub fn scale(x: &mut CpuTensor, factor: f32) -> Result<()> {
    par::chunks(&mut x.data, 4096, |_, c| {
        c.iter_mut().for_each(|v| *v *= factor)
    });
    Ok(())
}

pub fn softcap(x: &mut CpuTensor, cap: f32) -> Result<()> {
    if !(cap.is_finite() && cap > 0.0) {
        return Err(shape_err(
            "softcap",
            format!("cap {cap} is not positive and finite"),
        ));
    }
    par::chunks(&mut x.data, 4096, |_, c| {
        c.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh())
    });
    Ok(())
}

pub fn silu_mul2(gate: &CpuTensor, up: &CpuTensor) -> Result<CpuTensor> {
    if (gate.rows, gate.cols) != (up.rows, up.cols) {
        return Err(shape_err(
            "silu_mul2",
            format!(
                "gate [{}, {}] vs up [{}, {}]",
                gate.rows, gate.cols, up.rows, up.cols
            ),
        ));
    }
    let mut y = CpuTensor::for_overwrite(gate.rows, gate.cols);
    const CHUNK: usize = 4096;
    par::chunks(&mut y.data, CHUNK, |i, o| {
        let r = i * CHUNK..i * CHUNK + o.len();
        super::math::silu_mul_slice(o, &gate.data[r.clone()], &up.data[r]);
    });
    Ok(y)
}

pub fn relu(x: &mut CpuTensor) -> Result<()> {
    par::chunks(&mut x.data, 4096, |_, c| {
        c.iter_mut().for_each(|v| *v = v.max(0.0))
    });
    Ok(())
}

pub fn add(x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
    if (x.rows, x.cols) != (y.rows, y.cols) {
        return Err(shape_err(
            "add",
            format!("x [{}, {}] vs y [{}, {}]", x.rows, x.cols, y.rows, y.cols),
        ));
    }
    const CHUNK: usize = 4096;
    par::chunks(&mut x.data, CHUNK, |i, c| {
        for (a, b) in c.iter_mut().zip(&y.data[i * CHUNK..]) {
            *a += b;
        }
    });
    Ok(())
}
