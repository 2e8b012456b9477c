//! `linear` / `add_linear` with an FP8 weight (`--quantization fp8`).
//!
//! The weight is E4M3 codes `[out, in]` with one f32 scale per output
//! channel, made at load ([`crate::Fp8Matrix`]). Each call:
//! 1. `quant_rows_fp8` (kernels/fp8_linear.cu) quantizes the bf16 input per
//!    token into step-arena scratch: one f32 scale per row (amax / 448) and
//!    the codes of `x / scale`, in one kernel (a row of up to 16,384 values
//!    is read from global memory once);
//! 2. the FP8 GEMM (`blaslt.rs`, f32 accumulation) on the path the device
//!    was found to run at load ([`Fp8GemmPath`], chosen by `fp8_path.rs`):
//!    - `OuterVec`: one cuBLASLt GEMM applies both scale vectors through
//!      the outer-vector scale modes and writes bf16, or adds into the f32
//!      residual (`add_linear`); a bias is added as for bf16 weights (a
//!      biased bf16 output goes through an f32 scratch, rounded once);
//!    - `UnitScaled` (Hopper: cuBLASLt refuses outer-vector scales there):
//!      cuBLASLt with tensor-wide scales of 1 writes the raw f32 sums into
//!      step-arena scratch, and `fp8_rescale_bf16` / `fp8_rescale_acc_f32`
//!      multiply row `t`, column `o` by `sx[t] * sw[o]`, add the bias, and
//!      round to bf16 once or add into the f32 residual. The scratch holds
//!      at most [`SCRATCH_BYTES`]: longer inputs run as several GEMMs of
//!      consecutive row ranges.
//!
//! Every row count takes the GEMM (there is no FP8 GEMV), so a decode step
//! reads each weight byte once through cuBLASLt. The arithmetic is the
//! reference of `fp8_matrix.rs` (what the CPU backend computes), up to the
//! order of the f32 sums. Nothing here allocates device memory outside the
//! step arena, so both paths run inside captured graphs.

use super::blaslt::Fp8Scales;
use super::fp8_path::Fp8GemmPath;
use super::ops::{elems_cfg, fill_f32, Dest};
use super::pool::DeviceBuf;
use super::storage::CudaTensor;
use super::CudaBackend;
use crate::{KernelError, Result};
use cudarc::driver::{CudaSlice, DevicePtrMut, LaunchConfig};
use half::bf16;

/// Threads of a `quant_rows_fp8` block (must match `QFP8_THREADS`).
const QUANT_THREADS: u32 = 256;
/// Threads of an `fp8_rescale_*` block (must match `FP8_RESCALE_THREADS`).
const RESCALE_THREADS: usize = 256;
/// The most f32 scratch one unit-scaled FP8 linear call takes.
pub(crate) const SCRATCH_BYTES: usize = 128 << 20;

fn to_i32(v: usize, op: &'static str) -> Result<i32> {
    i32::try_from(v).map_err(|_| KernelError::Shape {
        op,
        detail: format!("{v} does not fit in 32 bits"),
    })
}

/// Checks that cuBLASLt's FP8 GEMM takes an `[out, in]` weight: rows of
/// the codes 16-byte aligned, output rows of whole 16-byte groups.
pub(crate) fn check_shape(rows: usize, cols: usize) -> Result<()> {
    if !cols.is_multiple_of(16) || !rows.is_multiple_of(8) || cols == 0 {
        return Err(KernelError::Unsupported(format!(
            "an FP8 weight of [{rows}, {cols}] on CUDA (out_features must be a multiple \
             of 8 and in_features a multiple of 16)"
        )));
    }
    Ok(())
}

/// Rows of one unit-scaled GEMM of `out` features: as many as fit in
/// [`SCRATCH_BYTES`] of f32, a multiple of 16 (at least 16).
pub(crate) fn chunk_rows(out: usize) -> usize {
    (SCRATCH_BYTES / (4 * out.max(1)) / 16 * 16).max(16)
}

/// An FP8 weight as the GEMM takes it: `(codes, scales, out)`.
pub(crate) type Fp8Weight<'a> = (&'a CudaSlice<u8>, &'a CudaSlice<f32>, usize);

/// The product of a checked `linear`/`add_linear` with an FP8 weight
/// `(codes, scales, out)` into `dest`, on the device's FP8 GEMM path.
pub(crate) fn product(
    b: &CudaBackend,
    op: &'static str,
    x: &CudaTensor,
    w: Fp8Weight<'_>,
    bias: Option<&CudaSlice<bf16>>,
    dest: Dest<'_>,
) -> Result<()> {
    products(b, op, x, [(w, bias, dest)])
}

/// The products of one checked input with `N` FP8 weights (`linear`, and
/// `linear3`'s q/k/v): the input is quantized once and every GEMM takes the
/// same codes and scales, each on the device's FP8 GEMM path.
pub(crate) fn products<const N: usize>(
    b: &CudaBackend,
    op: &'static str,
    x: &CudaTensor,
    outs: [(Fp8Weight<'_>, Option<&CudaSlice<bf16>>, Dest<'_>); N],
) -> Result<()> {
    let path = super::fp8_path::select(b)?;
    for &((codes, w_scales, out), _, _) in &outs {
        check_weight(op, x, codes, w_scales, out)?;
    }
    if x.rows == 0 || outs.iter().all(|o| o.0 .2 == 0) {
        return Ok(());
    }
    let q = quantize(b, op, x)?;
    for (w, bias, mut dest) in outs {
        if w.2 == 0 {
            continue;
        }
        match gemm_on(b, path, op, &q, w, bias, &mut dest) {
            // A shape cuBLASLt has no outer-vector kernel for (refused
            // before anything is written): this product takes the other path.
            Err(e) if path == Fp8GemmPath::OuterVec && super::fp8_path::is_refusal(&e) => {
                gemm_on(b, Fp8GemmPath::UnitScaled, op, &q, w, bias, &mut dest)?
            }
            r => r?,
        }
    }
    Ok(())
}

/// [`product`] on a given path, with no fallback (`fp8_path.rs` checks
/// each path with it at load).
pub(crate) fn product_on(
    b: &CudaBackend,
    path: Fp8GemmPath,
    op: &'static str,
    x: &CudaTensor,
    (codes, w_scales, out): Fp8Weight<'_>,
    bias: Option<&CudaSlice<bf16>>,
    dest: &mut Dest<'_>,
) -> Result<()> {
    check_weight(op, x, codes, w_scales, out)?;
    if x.rows == 0 || out == 0 {
        return Ok(());
    }
    let q = quantize(b, op, x)?;
    gemm_on(b, path, op, &q, (codes, w_scales, out), bias, dest)
}

/// Checks an FP8 weight of `out` rows against the input `x` (bf16, its
/// width the weight's): shapes cuBLASLt takes, codes and scales present,
/// 32-bit sizes.
fn check_weight(
    op: &'static str,
    x: &CudaTensor,
    codes: &CudaSlice<u8>,
    w_scales: &CudaSlice<f32>,
    out: usize,
) -> Result<()> {
    x.bf16(op)?;
    let (rows, inner) = (x.rows, x.cols);
    if rows == 0 || out == 0 {
        return Ok(());
    }
    check_shape(out, inner)?;
    if w_scales.len() < out || codes.len() < out * inner {
        return Err(KernelError::Shape {
            op,
            detail: format!(
                "an FP8 weight of {out} rows holds {} scales",
                w_scales.len()
            ),
        });
    }
    to_i32(inner, op)?;
    to_i32(rows, op)?;
    to_i32(rows * out, op)?;
    Ok(())
}

/// Step 1: the input's codes and per-row scales (`quant_rows_fp8`), in
/// step-arena scratch. `x` is checked (bf16, at least one row).
fn quantize(b: &CudaBackend, op: &'static str, x: &CudaTensor) -> Result<Quantized> {
    let (rows, inner) = (x.rows, x.cols);
    let cols = to_i32(inner, op)?;
    let mut xq = b.pool.take::<u8>(rows * inner)?;
    let mut xs = b.alloc_f32(rows)?;
    let mut l = b.dev.launch("quant_rows_fp8")?;
    l.out(&mut *xq).out(&mut *xs).arg(x.bf16(op)?).arg(&cols);
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (QUANT_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // In bounds: block r reads row r of x (rows * inner bf16) and writes
    // row r of xq (rows * inner codes) and xs[r] (rows scales).
    l.run(cfg)?;
    Ok(Quantized {
        codes: xq,
        scales: xs,
        rows,
        inner,
    })
}

/// Step 2 for one weight on a given path.
fn gemm_on(
    b: &CudaBackend,
    path: Fp8GemmPath,
    op: &'static str,
    q: &Quantized,
    w: Fp8Weight<'_>,
    bias: Option<&CudaSlice<bf16>>,
    dest: &mut Dest<'_>,
) -> Result<()> {
    match path {
        Fp8GemmPath::OuterVec => outer_vec(b, op, q, w, bias, dest),
        Fp8GemmPath::UnitScaled => unit_scaled(b, op, q, w, bias, dest),
    }
}

/// The input as the GEMM takes it: `rows` rows of `inner` codes, one scale
/// per row, in step-arena scratch.
struct Quantized {
    codes: DeviceBuf<u8>,
    scales: DeviceBuf<f32>,
    rows: usize,
    inner: usize,
}

/// Step 2 with cuBLASLt applying both scale vectors.
fn outer_vec(
    b: &CudaBackend,
    op: &'static str,
    q: &Quantized,
    (codes, w_scales, out): (&CudaSlice<u8>, &CudaSlice<f32>, usize),
    bias: Option<&CudaSlice<bf16>>,
    dest: &mut Dest<'_>,
) -> Result<()> {
    let (rows, inner, xq, xs) = (q.rows, q.inner, &*q.codes, &*q.scales);
    let scales = |xs| Fp8Scales { w: w_scales, x: xs };
    let n = rows * out;
    let (nr, nc) = (to_i32(rows, op)?, to_i32(out, op)?);
    let stream = b.dev.stream.clone();
    match (dest, bias) {
        (Dest::Bf16(y), Some(bias)) => {
            // f32 product plus the bias, rounded to bf16 once.
            let mut acc = b.alloc_f32(n)?;
            fill_f32(b, &mut acc, n, 0)?;
            {
                let (ap, _g) = acc.device_ptr_mut(&stream);
                b.lt.gemm_fp8(out, rows, inner, codes, xq, scales(xs), ap, n, true)?;
            }
            let name = "add_bias_round_bf16";
            let mut l = b.dev.launch(name)?;
            l.out(&mut **y).arg(&*acc).arg(bias).arg(&nr).arg(&nc);
            l.run(elems_cfg(n))?;
        }
        (Dest::Bf16(y), None) => {
            let len = y.len();
            let (yp, _g) = y.device_ptr_mut(&stream);
            b.lt.gemm_fp8(out, rows, inner, codes, xq, scales(xs), yp, len, false)?;
        }
        (Dest::AccF32(y), bias) => {
            {
                let len = y.len();
                let (yp, _g) = y.device_ptr_mut(&stream);
                b.lt.gemm_fp8(out, rows, inner, codes, xq, scales(xs), yp, len, true)?;
            }
            if let Some(bias) = bias {
                let mut l = b.dev.launch("add_bias_f32")?;
                l.out(&mut **y).arg(bias).arg(&nr).arg(&nc);
                l.run(elems_cfg(n))?;
            }
        }
    }
    Ok(())
}

/// Step 2 as a unit-scaled cuBLASLt GEMM into f32 scratch and the
/// rescaling kernel, over row ranges of at most [`chunk_rows`].
fn unit_scaled(
    b: &CudaBackend,
    op: &'static str,
    q: &Quantized,
    (codes, w_scales, out): (&CudaSlice<u8>, &CudaSlice<f32>, usize),
    bias: Option<&CudaSlice<bf16>>,
    dest: &mut Dest<'_>,
) -> Result<()> {
    let (rows, inner) = (q.rows, q.inner);
    let needed = rows * out;
    let have = match dest {
        Dest::Bf16(y) => y.len(),
        Dest::AccF32(y) => y.len(),
    };
    if have < needed {
        return Err(KernelError::Shape {
            op,
            detail: format!("an output of {have} elements for [{rows}, {out}]"),
        });
    }
    let chunk = chunk_rows(out).min(rows);
    let mut acc = b.alloc_f32(chunk * out)?;
    let mut row0 = 0;
    while row0 < rows {
        let n = chunk.min(rows - row0);
        b.lt.gemm_fp8_unit(out, n, inner, codes, &q.codes, row0, &mut acc)?;
        let scales = (&*acc, &*q.scales, w_scales);
        launch_rescale(b, op, dest, scales, bias, (row0, n, out))?;
        row0 += n;
    }
    Ok(())
}

/// One `fp8_rescale_*` launch: rows `row0..row0 + rows` of `y` from the
/// `[rows, cols]` sums `acc` (bounds checked by the caller).
fn launch_rescale(
    b: &CudaBackend,
    op: &'static str,
    y: &mut Dest<'_>,
    (acc, sx, sw): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    bias: Option<&CudaSlice<bf16>>,
    (row0, rows, cols): (usize, usize, usize),
) -> Result<()> {
    let (r0, nr, nc) = (to_i32(row0, op)?, to_i32(rows, op)?, to_i32(cols, op)?);
    let has_bias = i32::from(bias.is_some());
    let name = match y {
        Dest::Bf16(_) => "fp8_rescale_bf16",
        Dest::AccF32(_) => "fp8_rescale_acc_f32",
    };
    let mut l = b.dev.launch(name)?;
    match y {
        Dest::Bf16(y) => l.out(&mut **y),
        Dest::AccF32(y) => l.out(&mut **y),
    };
    l.arg(acc).arg(sx).arg(sw);
    // Without a bias the kernel never reads it: any buffer will do.
    match bias {
        Some(bias) => l.arg(bias),
        None => l.arg(acc),
    };
    l.arg(&has_bias).arg(&r0).arg(&nr).arg(&nc);
    l.run(rescale_cfg(rows, cols))?;
    Ok(())
}

/// The grid of an `fp8_rescale_*` launch over `rows` rows of `cols`
/// columns (a multiple of 4): 4 columns a thread, rows across `y`.
pub(crate) fn rescale_cfg(rows: usize, cols: usize) -> LaunchConfig {
    let x = (cols / 4).div_ceil(RESCALE_THREADS).max(1) as u32;
    let y = rows.clamp(1, 65535) as u32;
    LaunchConfig {
        grid_dim: (x, y, 1),
        block_dim: (RESCALE_THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Runs `fp8_rescale_bf16` (`y` bf16) or `fp8_rescale_acc_f32` (`y` f32)
/// over all `rows` rows (the test hook of `testing::fp8_rescale`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn rescale(
    b: &CudaBackend,
    y: Dest<'_>,
    acc: &CudaSlice<f32>,
    sx: &CudaSlice<f32>,
    sw: &CudaSlice<f32>,
    bias: Option<&CudaSlice<bf16>>,
    rows: usize,
    cols: usize,
) -> Result<()> {
    let op = "fp8 rescale";
    if !cols.is_multiple_of(8) {
        return Err(KernelError::Unsupported(format!(
            "{op} of {cols} columns (must be a multiple of 8)"
        )));
    }
    let n = rows * cols;
    let y_len = match &y {
        Dest::Bf16(y) => y.len(),
        Dest::AccF32(y) => y.len(),
    };
    let short = acc.len() < n
        || sx.len() < rows
        || sw.len() < cols
        || y_len < n
        || bias.is_some_and(|b| b.len() < cols);
    if short {
        return Err(KernelError::Shape {
            op,
            detail: format!("buffers too small for [{rows}, {cols}]"),
        });
    }
    to_i32(n, op)?;
    let mut y = y;
    launch_rescale(b, op, &mut y, (acc, sx, sw), bias, (0, rows, cols))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_fill_the_scratch_in_whole_buckets() {
        assert_eq!(chunk_rows(4096), 8192);
        assert_eq!(chunk_rows(16_384), 2048);
        // The 8B model's fused gate/up: 1,170 rows fit, 1,168 are taken.
        assert_eq!(chunk_rows(28_672), 1168);
        assert_eq!(chunk_rows(1 << 30), 16);
        for out in [8, 24, 4096, 28_672, 152_064] {
            let c = chunk_rows(out);
            assert!(c.is_multiple_of(16) && c * out * 4 <= SCRATCH_BYTES.max(16 * out * 4));
        }
    }

    #[test]
    fn rescale_grid_covers_every_column_and_caps_the_rows() {
        let cfg = rescale_cfg(3, 4104);
        assert_eq!(cfg.grid_dim, (5, 3, 1));
        assert!(cfg.grid_dim.0 as usize * RESCALE_THREADS * 4 >= 4104);
        assert_eq!(rescale_cfg(70_000, 8).grid_dim, (1, 65535, 1));
        assert_eq!(rescale_cfg(0, 8).grid_dim, (1, 1, 1));
    }
}
