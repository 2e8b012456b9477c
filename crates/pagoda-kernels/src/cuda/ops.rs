//! Launches of the row-wise and elementwise kernels, and `linear` /
//! `add_linear` through cuBLASLt.
//!
//! Every op checks shapes (and every index it will read, against the step's
//! precomputed maxima) on the host before queuing work, so a bad request is a
//! [`KernelError::Shape`], never an out-of-bounds device access. Launches of
//! zero elements are skipped. `linear` is one cuBLASLt GEMM (bf16 operands,
//! f32 compute, bf16 out; plans cached per shape); with a bias, the GEMM
//! accumulates into an f32 scratch and one kernel adds the bias and rounds,
//! so the output is rounded to bf16 once, as in PyTorch's bf16 `F.linear`.
//! With few rows (decode) it is instead one GEMV pass over the weights with
//! the bias fused, also rounded once; which GEMV, and up to how many rows,
//! is decided in [`super::gemv`] alone.
//! `add_linear` is the same product added into the f32 residual stream (GEMM
//! with beta 1, or the GEMV's f32-accumulating variant).
//! The residual stream is f32 ([`Act::F32`]): `embedding` makes it, the norms
//! read it, `add`/`add_position_embedding`/`add_linear` accumulate into it;
//! the other ops take bf16 activations only and refuse the residual with a
//! shape error.

use super::storage::{Act, CudaStep, CudaTensor, CudaWeight, WeightBuf};
use super::CudaBackend;
use crate::{KernelError, Result, RopeStyle};
use cudarc::driver::{CudaSlice, LaunchConfig};
use half::bf16;

const THREADS: u32 = 256;

fn shape_err(op: &'static str, detail: String) -> KernelError {
    KernelError::Shape { op, detail }
}

/// An FP8 linear weight passed where a table is read.
fn fp8_table(op: &'static str) -> KernelError {
    shape_err(op, "expects a table, got an FP8 linear weight".into())
}

/// A grid-stride launch over `n` elements.
pub(crate) fn elems_cfg(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, 1 << 20) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Threads of a block that owns one row of `cols` elements.
pub(crate) fn rows_threads(cols: usize) -> u32 {
    (cols.div_ceil(32) * 32).clamp(32, 1024) as u32
}

/// One block per row of `cols` elements.
fn rows_cfg(rows: usize, cols: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (rows_threads(cols), 1, 1),
        shared_mem_bytes: 0,
    }
}

fn i32_of(v: usize, op: &'static str) -> Result<i32> {
    i32::try_from(v).map_err(|_| shape_err(op, format!("{v} does not fit in 32 bits")))
}

pub(crate) fn check_rows(op: &'static str, x: &CudaTensor, step: &CudaStep) -> Result<()> {
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

fn same_dims(op: &'static str, a: &CudaTensor, b: &CudaTensor) -> Result<()> {
    if (a.rows, a.cols) != (b.rows, b.cols) {
        return Err(shape_err(
            op,
            format!("[{}, {}] vs [{}, {}]", a.rows, a.cols, b.rows, b.cols),
        ));
    }
    Ok(())
}

/// Fills the first `n` elements of `d` with the bf16 bit pattern `bits`.
pub(crate) fn fill(b: &CudaBackend, d: &mut CudaSlice<bf16>, n: usize, bits: u16) -> Result<()> {
    let n = n as i64;
    let mut l = b.dev.launch("fill_u16")?;
    l.arg(d).arg(&bits).arg(&n);
    l.run(elems_cfg(n as usize))?;
    Ok(())
}

/// Fills the first `n` elements of `d` with the f32 bit pattern `bits`.
pub(crate) fn fill_f32(b: &CudaBackend, d: &mut CudaSlice<f32>, n: usize, bits: u32) -> Result<()> {
    let n = n as i64;
    let mut l = b.dev.launch("fill_u32")?;
    l.arg(d).arg(&bits).arg(&n);
    l.run(elems_cfg(n as usize))?;
    Ok(())
}

/// Rows of a table read by index: `x[r] = table[idx[r] + offset]`
/// (embedding) or `x[r] += table[idx[r] + offset]` (position embedding).
struct TableRows {
    op: &'static str,
    idx: super::storage::Span,
    /// Largest `idx[r] + offset`, checked against the table.
    max_row: Option<usize>,
    offset: usize,
    accumulate: bool,
}

fn table_rows(
    b: &CudaBackend,
    x: &mut CudaTensor,
    table: &CudaWeight,
    step: &CudaStep,
    t: TableRows,
) -> Result<()> {
    let op = t.op;
    if let Some(m) = t.max_row {
        if m >= table.rows {
            return Err(shape_err(
                op,
                format!("row {m} out of range ({} rows)", table.rows),
            ));
        }
    }
    if table.cols != x.cols {
        return Err(shape_err(
            op,
            format!("table has {} columns, x {}", table.cols, x.cols),
        ));
    }
    let n = x.numel();
    if n == 0 {
        return Ok(());
    }
    let (nr, nc, off) = (
        i32_of(x.rows, op)?,
        i32_of(x.cols, op)?,
        i32_of(t.offset, op)?,
    );
    let idx = step.view(t.idx);
    let name = match (&table.data, &x.data, t.accumulate) {
        (WeightBuf::Bf16(_), Act::Bf16(_), false) => "gather_rows_bf16",
        (WeightBuf::F32(_), Act::Bf16(_), false) => "gather_rows_f32",
        (WeightBuf::Bf16(_), Act::F32(_), false) => "gather_rows_bf16_f32",
        (WeightBuf::F32(_), Act::F32(_), false) => "gather_rows_f32_f32",
        (WeightBuf::Bf16(_), Act::Bf16(_), true) => "add_rows_bf16",
        (WeightBuf::F32(_), Act::Bf16(_), true) => "add_rows_f32",
        (WeightBuf::Bf16(_), Act::F32(_), true) => "add_rows_bf16_f32",
        (WeightBuf::F32(_), Act::F32(_), true) => "add_rows_f32_f32",
        (WeightBuf::Fp8 { .. }, _, _) => return Err(fp8_table(op)),
    };
    let mut l = b.dev.launch(name)?;
    l.out(&mut x.data);
    match &table.data {
        WeightBuf::Bf16(d) => l.arg(d),
        WeightBuf::F32(d) => l.arg(d),
        WeightBuf::Fp8 { codes, .. } => l.arg(codes),
    };
    l.arg(&idx).arg(&off).arg(&nr).arg(&nc);
    l.run(elems_cfg(n))?;
    Ok(())
}

pub(crate) fn embedding(
    b: &CudaBackend,
    step: &CudaStep,
    table: &CudaWeight,
) -> Result<CudaTensor> {
    // The residual stream starts here, in f32.
    let mut y = b.output_f32(step.ctx.num_tokens(), table.cols)?;
    let t = TableRows {
        op: "embedding",
        idx: step.input_ids,
        max_row: step.max_input_id.map(|m| m as usize),
        offset: 0,
        accumulate: false,
    };
    table_rows(b, &mut y, table, step, t)?;
    Ok(y)
}

pub(crate) fn add_position_embedding(
    b: &CudaBackend,
    x: &mut CudaTensor,
    step: &CudaStep,
    table: &CudaWeight,
    offset: usize,
) -> Result<()> {
    check_rows("add_position_embedding", x, step)?;
    let t = TableRows {
        op: "add_position_embedding",
        idx: step.positions,
        max_row: step.max_position.map(|m| m as usize + offset),
        offset,
        accumulate: true,
    };
    table_rows(b, x, table, step, t)
}

pub(crate) fn gather_logits_rows(
    b: &CudaBackend,
    x: &CudaTensor,
    step: &CudaStep,
) -> Result<CudaTensor> {
    let idx = &step.ctx.logits_indices;
    if let Some(&bad) = idx.iter().find(|&&r| r as usize >= x.rows) {
        return Err(shape_err(
            "gather_logits_rows",
            format!("row {bad} of {}", x.rows),
        ));
    }
    // The rows keep x's precision (the residual stream stays f32).
    let mut y = match x.data {
        Act::Bf16(_) => b.output(idx.len(), x.cols)?,
        Act::F32(_) => b.output_f32(idx.len(), x.cols)?,
    };
    let n = y.numel();
    if n == 0 {
        return Ok(y);
    }
    let op = "gather_logits_rows";
    let (nr, nc, off) = (i32_of(y.rows, op)?, i32_of(y.cols, op)?, 0i32);
    let rows = step.view(step.logits_indices);
    let name = match x.data {
        Act::Bf16(_) => "gather_rows_bf16",
        Act::F32(_) => "gather_rows_f32_f32",
    };
    let mut l = b.dev.launch(name)?;
    l.out(&mut y.data)
        .arg(&x.data)
        .arg(&rows)
        .arg(&off)
        .arg(&nr)
        .arg(&nc);
    l.run(elems_cfg(n))?;
    Ok(y)
}

pub(crate) fn linear(
    b: &CudaBackend,
    x: &CudaTensor,
    w: &CudaWeight,
    bias: Option<&CudaWeight>,
) -> Result<CudaTensor> {
    let op = "linear";
    let bias = check_linear(op, x, w, bias)?;
    let mut y = b.output(x.rows, w.rows)?;
    product(b, op, x, w, bias, Dest::Bf16(y.bf16_mut(op)?))?;
    Ok(y)
}

/// Three products of `x` ([`crate::Backend::linear3`]): with FP8 weights
/// one quantization of `x` for the three GEMMs; one GEMV launch where the
/// small-row path takes all three together (bf16 weights of the same input
/// width); else three `linear`s.
pub(crate) fn linear3(
    b: &CudaBackend,
    x: &CudaTensor,
    w: [&CudaWeight; 3],
    bias: [Option<&CudaWeight>; 3],
) -> Result<[CudaTensor; 3]> {
    let op = "linear";
    if let [Some(f0), Some(f1), Some(f2)] = w.map(fp8_weight) {
        // FP8 weights: the input quantized once for the three GEMMs.
        let [b0, b1, b2] = check_linear3(op, x, w, bias)?;
        let mut ys = outputs3(b, x.rows, w)?;
        let [y0, y1, y2] = &mut ys;
        super::fp8_linear::products(
            b,
            op,
            x,
            [
                (f0, b0, Dest::Bf16(y0.bf16_mut(op)?)),
                (f1, b1, Dest::Bf16(y1.bf16_mut(op)?)),
                (f2, b2, Dest::Bf16(y2.bf16_mut(op)?)),
            ],
        )?;
        return Ok(ys);
    }
    let bf16_weights = w.iter().all(|w| matches!(w.data, WeightBuf::Bf16(_)));
    let out: usize = w.iter().map(|w| w.rows).sum();
    let kernel = b.small_linear().kernel_for(x.rows, out, x.cols);
    let Some(kernel) = kernel.filter(|_| bf16_weights) else {
        return Ok([
            linear(b, x, w[0], bias[0])?,
            linear(b, x, w[1], bias[1])?,
            linear(b, x, w[2], bias[2])?,
        ]);
    };
    let biases = check_linear3(op, x, w, bias)?;
    launch_linear3(b, op, kernel, x, w, biases)
}

/// An FP8 weight's codes, scales and rows; `None` for other weights.
fn fp8_weight(w: &CudaWeight) -> Option<super::fp8_linear::Fp8Weight<'_>> {
    match &w.data {
        WeightBuf::Fp8 { codes, scales } => Some((codes, scales, w.rows)),
        _ => None,
    }
}

/// [`check_linear`] of each of `linear3`'s products.
fn check_linear3<'w>(
    op: &'static str,
    x: &CudaTensor,
    w: [&CudaWeight; 3],
    bias: [Option<&'w CudaWeight>; 3],
) -> Result<[Option<&'w CudaSlice<bf16>>; 3]> {
    Ok([
        check_linear(op, x, w[0], bias[0])?,
        check_linear(op, x, w[1], bias[1])?,
        check_linear(op, x, w[2], bias[2])?,
    ])
}

/// Fresh outputs of `rows` rows for `linear3`'s three weights.
fn outputs3(b: &CudaBackend, rows: usize, w: [&CudaWeight; 3]) -> Result<[CudaTensor; 3]> {
    Ok([
        b.output(rows, w[0].rows)?,
        b.output(rows, w[1].rows)?,
        b.output(rows, w[2].rows)?,
    ])
}

/// The one GEMV launch of a checked `linear3` into fresh outputs.
fn launch_linear3(
    b: &CudaBackend,
    op: &'static str,
    kernel: super::gemv::GemvKernel,
    x: &CudaTensor,
    w: [&CudaWeight; 3],
    biases: [Option<&CudaSlice<bf16>>; 3],
) -> Result<[CudaTensor; 3]> {
    let mut ys = outputs3(b, x.rows, w)?;
    let [y0, y1, y2] = &mut ys;
    let outs: [&mut CudaSlice<bf16>; 3] = [
        &mut **y0.bf16_mut(op)?,
        &mut **y1.bf16_mut(op)?,
        &mut **y2.bf16_mut(op)?,
    ];
    let ws = [w[0].bf16(op)?, w[1].bf16(op)?, w[2].bf16(op)?];
    let dims = [w[0].rows, w[1].rows, w[2].rows];
    super::gemv::launch3(
        b,
        op,
        kernel,
        (x.rows, x.cols),
        x.bf16(op)?,
        ws,
        dims,
        biases,
        outs,
    )?;
    Ok(ys)
}

/// `residual += x @ w^T (+ bias)`, unrounded into an f32 residual; a bf16
/// residual (OPT's post-norm layers make one) takes `linear` then `add`.
pub(crate) fn add_linear(
    b: &CudaBackend,
    residual: &mut CudaTensor,
    x: &CudaTensor,
    w: &CudaWeight,
    bias: Option<&CudaWeight>,
) -> Result<()> {
    let op = "add_linear";
    let bias_d = check_linear(op, x, w, bias)?;
    if (residual.rows, residual.cols) != (x.rows, w.rows) {
        return Err(shape_err(
            op,
            format!(
                "residual is [{}, {}], the product [{}, {}]",
                residual.rows, residual.cols, x.rows, w.rows
            ),
        ));
    }
    match &mut residual.data {
        Act::F32(rd) => product(b, op, x, w, bias_d, Dest::AccF32(rd)),
        Act::Bf16(_) => {
            let y = linear(b, x, w, bias)?;
            add(b, residual, &y)
        }
    }
}

/// [`crate::Backend::gate_up_silu`]: the product with the SiLU in its
/// output (`gemv_silu_bf16`) where the decode fusions are on and the
/// CUDA-core GEMV takes it (the bits of `linear` then `silu_mul` on that
/// GEMV); else `linear` then `silu_mul`.
pub(crate) fn gate_up_silu(
    b: &CudaBackend,
    h: &CudaTensor,
    gate_up: &CudaWeight,
) -> Result<CudaTensor> {
    let op = "gate_up_silu";
    let fused = b.decode_fusion()
        && !h.is_f32()
        && gate_up.rows.is_multiple_of(2)
        && matches!(gate_up.data, WeightBuf::Bf16(_))
        && gate_up.cols == h.cols
        && b.small_linear().kernel_for(h.rows, gate_up.rows, h.cols)
            == Some(super::gemv::GemvKernel::Warp);
    if !fused {
        return silu_mul(b, &linear(b, h, gate_up, None)?);
    }
    let n = gate_up.rows / 2;
    let mut y = b.output(h.rows, n)?;
    let (hd, wd) = (h.bf16(op)?, gate_up.bf16(op)?);
    super::gemv::launch_silu(b, op, (h.rows, n, h.cols), hd, wd, y.bf16_mut(op)?)?;
    Ok(y)
}

/// Where a product goes: a fresh bf16 output, or added into the f32 residual.
pub(crate) enum Dest<'a> {
    Bf16(&'a mut CudaSlice<bf16>),
    AccF32(&'a mut CudaSlice<f32>),
}

/// Checks `x @ w^T (+ bias)`: x bf16 `[rows, in]`, w `[out, in]`, bias `[out]`.
fn check_linear<'w>(
    op: &'static str,
    x: &CudaTensor,
    w: &CudaWeight,
    bias: Option<&'w CudaWeight>,
) -> Result<Option<&'w CudaSlice<bf16>>> {
    x.bf16(op)?;
    if !matches!(w.data, WeightBuf::Fp8 { .. }) {
        w.bf16(op)?;
    }
    if w.cols != x.cols {
        return Err(shape_err(
            op,
            format!("x is [{}, {}], w [{}, {}]", x.rows, x.cols, w.rows, w.cols),
        ));
    }
    bias.map(|bb| bb.vector(w.rows, op)).transpose()
}

/// The product of a checked `linear`/`add_linear` into `dest`.
fn product(
    b: &CudaBackend,
    op: &'static str,
    x: &CudaTensor,
    w: &CudaWeight,
    bias: Option<&CudaSlice<bf16>>,
    mut dest: Dest<'_>,
) -> Result<()> {
    if let Some(w) = fp8_weight(w) {
        return super::fp8_linear::product(b, op, x, w, bias, dest);
    }
    let (xd, wd) = (x.bf16(op)?, w.bf16(op)?);
    let (rows, out, inner) = (x.rows, w.rows, x.cols);
    if rows == 0 || out == 0 {
        return Ok(());
    }
    if inner == 0 {
        // An empty sum: zero (nothing to add into the residual).
        if let Dest::Bf16(y) = &mut dest {
            fill(b, y, rows * out, 0)?;
        }
    } else if let Some(k) = b.small_linear().kernel_for(rows, out, inner) {
        // Decode-sized: one pass over the weights, bias fused (gemv.rs).
        return super::gemv::launch(b, op, k, (rows, out, inner), xd, wd, bias, &mut dest);
    } else if let (Dest::Bf16(y), Some(bias)) = (&mut dest, bias) {
        // A biased bf16 output: the f32 product plus the bias, rounded to
        // bf16 once (as PyTorch's bf16 F.linear does), never the product
        // rounded and then the sum rounded again.
        let n = rows * out;
        let mut acc = b.alloc_f32(n)?;
        fill_f32(b, &mut acc, n, 0)?;
        b.lt.gemm_acc_f32(out, rows, inner, wd, xd, &mut acc)?;
        let (nr, nc) = (i32_of(rows, op)?, i32_of(out, op)?);
        let mut l = b.dev.launch("add_bias_round_bf16")?;
        l.out(&mut **y).arg(&*acc).arg(bias).arg(&nr).arg(&nc);
        l.run(elems_cfg(n))?;
        return Ok(());
    } else {
        // Row-major y[rows, out] = x[rows, in] @ w[out, in]^T (see blaslt.rs).
        match &mut dest {
            Dest::Bf16(y) => b.lt.gemm(out, rows, inner, wd, xd, y)?,
            Dest::AccF32(y) => b.lt.gemm_acc_f32(out, rows, inner, wd, xd, y)?,
        }
    }
    if let Some(bias) = bias {
        let (nr, nc) = (i32_of(rows, op)?, i32_of(out, op)?);
        let name = match dest {
            Dest::Bf16(_) => "add_bias_bf16",
            Dest::AccF32(_) => "add_bias_f32",
        };
        let mut l = b.dev.launch(name)?;
        match &mut dest {
            Dest::Bf16(y) => l.out(&mut **y),
            Dest::AccF32(y) => l.out(&mut **y),
        };
        l.arg(bias).arg(&nr).arg(&nc);
        l.run(elems_cfg(rows * out))?;
    }
    Ok(())
}

pub(crate) fn rms_norm(
    b: &CudaBackend,
    x: &CudaTensor,
    w: &CudaWeight,
    eps: f32,
) -> Result<CudaTensor> {
    let op = "rms_norm";
    let wd = w.vector(x.cols, op)?;
    let mut y = b.output(x.rows, x.cols)?;
    if x.numel() == 0 {
        return Ok(y);
    }
    let nc = i32_of(x.cols, op)?;
    let name = match x.data {
        Act::Bf16(_) => "rms_norm_bf16",
        Act::F32(_) => "rms_norm_f32",
    };
    let mut l = b.dev.launch(name)?;
    l.out(y.bf16_mut(op)?)
        .arg(&x.data)
        .arg(wd)
        .arg(&nc)
        .arg(&eps);
    l.run(rows_cfg(x.rows, x.cols))?;
    Ok(y)
}

pub(crate) fn add_rms_norm(
    b: &CudaBackend,
    residual: &mut CudaTensor,
    x: &CudaTensor,
    w: &CudaWeight,
    eps: f32,
) -> Result<CudaTensor> {
    let op = "add_rms_norm";
    same_dims(op, residual, x)?;
    let wd = w.vector(x.cols, op)?;
    let mut y = b.output(x.rows, x.cols)?;
    if x.numel() == 0 {
        return Ok(y);
    }
    let nc = i32_of(x.cols, op)?;
    let xd = x.bf16(op)?;
    let name = match residual.data {
        Act::Bf16(_) => "add_rms_norm_bf16",
        Act::F32(_) => "add_rms_norm_f32",
    };
    let mut l = b.dev.launch(name)?;
    l.out(y.bf16_mut(op)?)
        .out(&mut residual.data)
        .arg(xd)
        .arg(wd)
        .arg(&nc)
        .arg(&eps);
    l.run(rows_cfg(x.rows, x.cols))?;
    Ok(y)
}

pub(crate) fn head_rms_norm(
    b: &CudaBackend,
    x: &mut CudaTensor,
    w: &CudaWeight,
    head_dim: usize,
    eps: f32,
) -> Result<()> {
    let op = "head_rms_norm";
    if head_dim == 0 || !x.cols.is_multiple_of(head_dim) {
        return Err(shape_err(
            op,
            format!("cols {} not a multiple of head_dim {head_dim}", x.cols),
        ));
    }
    let wd = w.vector(head_dim, op)?;
    let heads = x.numel() / head_dim;
    let xd = x.bf16_mut(op)?;
    if heads == 0 {
        return Ok(());
    }
    let hd = i32_of(head_dim, op)?;
    let mut l = b.dev.launch("head_rms_norm_bf16")?;
    l.arg(xd).arg(wd).arg(&hd).arg(&eps);
    l.run(rows_cfg(heads, head_dim))?;
    Ok(())
}

pub(crate) fn layer_norm(
    b: &CudaBackend,
    x: &CudaTensor,
    w: &CudaWeight,
    bias: &CudaWeight,
    eps: f32,
) -> Result<CudaTensor> {
    let op = "layer_norm";
    let wd = w.vector(x.cols, op)?;
    let bd = bias.vector(x.cols, op)?;
    let mut y = b.output(x.rows, x.cols)?;
    if x.numel() == 0 {
        return Ok(y);
    }
    let nc = i32_of(x.cols, op)?;
    let name = match x.data {
        Act::Bf16(_) => "layer_norm_bf16",
        Act::F32(_) => "layer_norm_f32",
    };
    let mut l = b.dev.launch(name)?;
    l.out(y.bf16_mut(op)?)
        .arg(&x.data)
        .arg(wd)
        .arg(bd)
        .arg(&nc)
        .arg(&eps);
    l.run(rows_cfg(x.rows, x.cols))?;
    Ok(y)
}

pub(crate) fn rope(
    b: &CudaBackend,
    x: &mut CudaTensor,
    step: &CudaStep,
    cos_sin: &CudaWeight,
    head_dim: usize,
    style: RopeStyle,
) -> Result<()> {
    let op = "rope";
    check_rows(op, x, step)?;
    x.bf16(op)?;
    let rd = cos_sin.cols;
    if head_dim == 0 || !x.cols.is_multiple_of(head_dim) || rd > head_dim || !rd.is_multiple_of(2) {
        return Err(shape_err(
            op,
            format!("cols {}, head_dim {head_dim}, rotary_dim {rd}", x.cols),
        ));
    }
    if let Some(p) = step.max_position {
        if p as usize >= cos_sin.rows {
            return Err(shape_err(
                op,
                format!("position {p} beyond the table's {} rows", cos_sin.rows),
            ));
        }
    }
    if rd == 0 || x.numel() == 0 {
        return Ok(());
    }
    let heads = x.cols / head_dim;
    let (nr, nh, hd, rdi) = (
        i32_of(x.rows, op)?,
        i32_of(heads, op)?,
        i32_of(head_dim, op)?,
        i32_of(rd, op)?,
    );
    let style: i32 = match style {
        RopeStyle::Neox => 0,
        RopeStyle::Interleaved => 1,
    };
    let positions = step.view(step.positions);
    let name = match cos_sin.data {
        WeightBuf::F32(_) => "rope_f32",
        WeightBuf::Bf16(_) => "rope_bf16",
        WeightBuf::Fp8 { .. } => return Err(fp8_table(op)),
    };
    // x: the (head, pair) items of a row; y: rows (the kernel loops past
    // the grid's 65,535).
    let per_row = heads * (rd / 2);
    let cfg = LaunchConfig {
        grid_dim: (
            per_row.div_ceil(THREADS as usize) as u32,
            x.rows.min(65_535) as u32,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = b.dev.launch(name)?;
    l.out(x.bf16_mut(op)?).arg(&positions);
    match &cos_sin.data {
        WeightBuf::F32(d) => l.arg(d),
        WeightBuf::Bf16(d) => l.arg(d),
        WeightBuf::Fp8 { codes, .. } => l.arg(codes),
    };
    l.arg(&nr).arg(&nh).arg(&hd).arg(&rdi).arg(&style);
    l.run(cfg)?;
    Ok(())
}

pub(crate) fn silu_mul(b: &CudaBackend, gate_up: &CudaTensor) -> Result<CudaTensor> {
    let op = "silu_mul";
    let gd = gate_up.bf16(op)?;
    if !gate_up.cols.is_multiple_of(2) {
        return Err(shape_err(op, format!("odd column count {}", gate_up.cols)));
    }
    let n = gate_up.cols / 2;
    let mut y = b.output(gate_up.rows, n)?;
    if y.numel() == 0 {
        return Ok(y);
    }
    let (nr, nc) = (i32_of(gate_up.rows, op)?, i32_of(n, op)?);
    let total = y.numel();
    // Eight elements per thread where rows allow 16-byte accesses.
    let (kernel, per_thread) = if n.is_multiple_of(8) {
        ("silu_mul_v8_bf16", 8)
    } else {
        ("silu_mul_bf16", 1)
    };
    let mut l = b.dev.launch(kernel)?;
    l.out(y.bf16_mut(op)?).arg(gd).arg(&nr).arg(&nc);
    l.run(elems_cfg(total / per_thread))?;
    Ok(y)
}

pub(crate) fn silu_mul2(b: &CudaBackend, gate: &CudaTensor, up: &CudaTensor) -> Result<CudaTensor> {
    let op = "silu_mul2";
    same_dims(op, gate, up)?;
    let (gd, ud) = (gate.bf16(op)?, up.bf16(op)?);
    let mut y = b.output(gate.rows, gate.cols)?;
    let n = y.numel();
    if n == 0 {
        return Ok(y);
    }
    let n64 = n as i64;
    let mut l = b.dev.launch("silu_mul2_bf16")?;
    l.out(y.bf16_mut(op)?).arg(gd).arg(ud).arg(&n64);
    l.run(elems_cfg(n))?;
    Ok(y)
}

pub(crate) fn gelu_tanh_mul(b: &CudaBackend, gate_up: &CudaTensor) -> Result<CudaTensor> {
    let op = "gelu_tanh_mul";
    let gd = gate_up.bf16(op)?;
    if !gate_up.cols.is_multiple_of(2) {
        return Err(shape_err(op, format!("odd column count {}", gate_up.cols)));
    }
    let n = gate_up.cols / 2;
    let mut y = b.output(gate_up.rows, n)?;
    if y.numel() == 0 {
        return Ok(y);
    }
    let (nr, nc) = (i32_of(gate_up.rows, op)?, i32_of(n, op)?);
    let total = y.numel();
    // Eight elements per thread where rows allow 16-byte accesses.
    let (kernel, per_thread) = if n.is_multiple_of(8) {
        ("gelu_tanh_mul_v8_bf16", 8)
    } else {
        ("gelu_tanh_mul_bf16", 1)
    };
    let mut l = b.dev.launch(kernel)?;
    l.out(y.bf16_mut(op)?).arg(gd).arg(&nr).arg(&nc);
    l.run(elems_cfg(total / per_thread))?;
    Ok(y)
}

/// `x = f(x, arg)` in place for the `{name}_bf16` / `{name}_f32` kernel pair
/// (`scale`, `softcap`), on an activation or the f32 residual.
fn unary_in_place(b: &CudaBackend, x: &mut CudaTensor, name: &'static str, arg: f32) -> Result<()> {
    let n = x.numel();
    if n == 0 {
        return Ok(());
    }
    let n64 = n as i64;
    let kernel = match (&x.data, name) {
        (Act::Bf16(_), "scale") => "scale_bf16",
        (Act::F32(_), "scale") => "scale_f32",
        (Act::Bf16(_), _) => "softcap_bf16",
        (Act::F32(_), _) => "softcap_f32",
    };
    let mut l = b.dev.launch(kernel)?;
    l.out(&mut x.data).arg(&arg).arg(&n64);
    l.run(elems_cfg(n))?;
    Ok(())
}

pub(crate) fn scale(b: &CudaBackend, x: &mut CudaTensor, factor: f32) -> Result<()> {
    unary_in_place(b, x, "scale", factor)
}

pub(crate) fn softcap(b: &CudaBackend, x: &mut CudaTensor, cap: f32) -> Result<()> {
    if !(cap.is_finite() && cap > 0.0) {
        return Err(shape_err(
            "softcap",
            format!("cap {cap} is not positive and finite"),
        ));
    }
    unary_in_place(b, x, "softcap", cap)
}

pub(crate) fn relu(b: &CudaBackend, x: &mut CudaTensor) -> Result<()> {
    let n = x.numel();
    let xd = x.bf16_mut("relu")?;
    if n == 0 {
        return Ok(());
    }
    let n64 = n as i64;
    let mut l = b.dev.launch("relu_bf16")?;
    l.arg(xd).arg(&n64);
    l.run(elems_cfg(n))?;
    Ok(())
}

pub(crate) fn add(b: &CudaBackend, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
    same_dims("add", x, y)?;
    let n = x.numel();
    if n == 0 {
        return Ok(());
    }
    let n64 = n as i64;
    let name = match (&x.data, &y.data) {
        (Act::Bf16(_), Act::Bf16(_)) => "add_bf16",
        (Act::F32(_), Act::Bf16(_)) => "add_f32_bf16",
        (Act::F32(_), Act::F32(_)) => "add_f32_f32",
        (Act::Bf16(_), Act::F32(_)) => {
            return Err(shape_err(
                "add",
                "cannot add the f32 residual stream into a bf16 activation".into(),
            ))
        }
    };
    let mut l = b.dev.launch(name)?;
    l.out(&mut x.data).arg(&y.data).arg(&n64);
    l.run(elems_cfg(n))?;
    Ok(())
}
