//! `linear` / `add_linear` with an FP8 weight (`--quantization fp8`).
//!
//! The weight is E4M3 codes `[out, in]` with one f32 scale per output
//! channel, made at load ([`crate::Fp8Matrix`]). Each call:
//! 1. `quant_rows_fp8` (kernels/fp8_linear.cu) quantizes the bf16 input per
//!    token into step-arena scratch: one f32 scale per row (amax / 448) and
//!    the codes of `x / scale`, in one kernel (a row of up to 16,384 values
//!    is read from global memory once);
//! 2. one cuBLASLt FP8 GEMM (`blaslt.rs`, f32 accumulation) applies both
//!    scale vectors through the outer-vector scale modes and writes bf16, or
//!    adds into the f32 residual (`add_linear`);
//! 3. a bias, where there is one, is added as for bf16 weights: a biased
//!    bf16 output goes through an f32 scratch and is rounded once.
//!
//! Every row count takes the GEMM (there is no FP8 GEMV), so a decode step
//! reads each weight byte once through cuBLASLt. The arithmetic is the
//! reference of `fp8_matrix.rs` (what the CPU backend computes), up to the
//! order of the f32 sums.

use super::blaslt::Fp8Scales;
use super::ops::{elems_cfg, fill_f32, Dest};
use super::storage::CudaTensor;
use super::{device_err, CudaBackend};
use crate::{KernelError, Result};
use cudarc::driver::{CudaSlice, DevicePtrMut, LaunchConfig, PushKernelArg};
use half::bf16;

/// Threads of a `quant_rows_fp8` block (must match `QFP8_THREADS`).
const QUANT_THREADS: u32 = 256;

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

/// The product of a checked `linear`/`add_linear` with an FP8 weight
/// `(codes, scales, out)` into `dest`.
pub(crate) fn product(
    b: &CudaBackend,
    op: &'static str,
    x: &CudaTensor,
    (codes, w_scales, out): (&CudaSlice<u8>, &CudaSlice<f32>, usize),
    bias: Option<&CudaSlice<bf16>>,
    mut dest: Dest<'_>,
) -> Result<()> {
    let xd = x.bf16(op)?;
    let (rows, inner) = (x.rows, x.cols);
    if rows == 0 || out == 0 {
        return Ok(());
    }
    check_shape(out, inner)?;
    let cols = to_i32(inner, op)?;
    to_i32(rows, op)?;
    // 1. The input's codes and per-row scales.
    let mut xq = b.pool.take::<u8>(rows * inner)?;
    let mut xs = b.alloc_f32(rows)?;
    let mut l = b.dev.stream.launch_builder(b.dev.kernel("quant_rows_fp8")?);
    l.arg(&mut *xq).arg(&mut *xs).arg(xd).arg(&cols);
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (QUANT_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    unsafe { l.launch(cfg) }.map_err(|e| device_err("linear (fp8 input)", e))?;
    let scales = |xs| Fp8Scales { w: w_scales, x: xs };
    let n = rows * out;
    let (nr, nc) = (to_i32(rows, op)?, to_i32(out, op)?);
    let stream = b.dev.stream.clone();
    match (&mut dest, bias) {
        (Dest::Bf16(y), Some(bias)) => {
            // f32 product plus the bias, rounded to bf16 once.
            let mut acc = b.alloc_f32(n)?;
            fill_f32(b, &mut acc, n, 0)?;
            {
                let (ap, _g) = acc.device_ptr_mut(&stream);
                b.lt.gemm_fp8(out, rows, inner, codes, &xq, scales(&xs), ap, n, true)?;
            }
            let name = "add_bias_round_bf16";
            let mut l = b.dev.stream.launch_builder(b.dev.kernel(name)?);
            l.arg(&mut **y).arg(&*acc).arg(bias).arg(&nr).arg(&nc);
            unsafe { l.launch(elems_cfg(n)) }.map_err(|e| device_err(op, e))?;
        }
        (Dest::Bf16(y), None) => {
            let len = y.len();
            let (yp, _g) = y.device_ptr_mut(&stream);
            b.lt.gemm_fp8(out, rows, inner, codes, &xq, scales(&xs), yp, len, false)?;
        }
        (Dest::AccF32(y), bias) => {
            {
                let len = y.len();
                let (yp, _g) = y.device_ptr_mut(&stream);
                b.lt.gemm_fp8(out, rows, inner, codes, &xq, scales(&xs), yp, len, true)?;
            }
            if let Some(bias) = bias {
                let mut l = b.dev.stream.launch_builder(b.dev.kernel("add_bias_f32")?);
                l.arg(&mut **y).arg(bias).arg(&nr).arg(&nc);
                unsafe { l.launch(elems_cfg(n)) }.map_err(|e| device_err(op, e))?;
            }
        }
    }
    Ok(())
}
