//! `linear`: `y = x @ w^T (+ bias)` for `x: [rows, k]`, `w: [n, k]`.
//!
//! Paths, chosen by the weight's storage and the number of rows (on CPUs
//! with AMX, quantized weights take [`super::amx`]'s tile GEMM from its
//! `MIN_ROWS` rows instead of the last three):
//! - `rows <= GEMV_MAX_ROWS` (decode): [`super::gemv`], one pass over the
//!   weights per group of up to 4 rows, memory-bandwidth bound; for
//!   quantized weights, up to `QUANT_MAX_ROWS` rows, [`super::quant`]'s
//!   integer block dot products, one pass over the blocks.
//! - for Q4_K / Q5_K / Q6_K blocks on the SIMD paths, from
//!   [`super::quant::kgemm::min_rows`] rows (batched decode from 8 with
//!   VNNI, from 17 on AVX2 but for Q6_K, which takes it past
//!   `QUANT_MAX_ROWS`),
//!   [`super::quant::kgemm`]'s integer GEMM over 8-bit activations; more
//!   rows than `QUANT_MAX_ROWS` otherwise (prefill):
//!   the `gemm` crate's f32 kernels (multi-threaded).
//!   Weights stored as f16/bf16 or quantized blocks are widened to f32 in chunks of output
//!   features first (once per call, shared by every row), so a narrow weight
//!   costs `n * k` conversions against `2 * rows * n * k` flops. The f32
//!   chunk lives in a per-thread scratch buffer of at most `SCRATCH_BYTES`
//!   that is reused across calls (a fresh buffer per call costs a page fault
//!   per 4 KiB, which on a VM took as long as the GEMM itself).

use super::gemv;
use super::quant;
use super::storage::{CpuTensor, CpuWeight, ViewData, WeightView};
use crate::{KernelError, Result};
use gemm::Parallelism;
use rayon::prelude::*;

/// Most rows computed by GEMV passes (in groups of `gemv::MAX_ROWS`); measured
/// faster than widening the weights and running a GEMM up to here.
const GEMV_MAX_ROWS: usize = 16;

/// Most rows computed by the quantized block kernels (which unpack each
/// block once per group of rows); more rows dequantize tiles to f32 for the
/// GEMM, which is faster per row once the weights are reused enough. A
/// batched decode step of up to this many sequences stays on the blocks
/// (but for the k-quants' GEMM from `quant::kgemm::min_rows` rows).
/// Measured (`cargo bench -p pagoda-kernels --bench cpu_ops -- 2 linear`,
/// AVX-512 VNNI, Q4_1 / Q8_0 / Q4_K): at 32 rows the blocks take 0.7-1.0x
/// the tiles' time, at 64 rows 1.0-1.3x. The block kernels equal f32
/// products over the 8-bit activations at every row count
/// (quant/tests.rs); the activation rounding itself is what the model
/// goldens see (golden_moe's Q8_0 check says where it matters).
pub(crate) const QUANT_MAX_ROWS: usize = 32;

/// Whether `rows` x rows against blocks of `ty` with `k` columns take
/// [`super::amx`]'s tile GEMM (on CPUs with AMX): from its `MIN_ROWS` (8)
/// for Q4_1, Q8_0 and the other types that [`quant::kgemm`] does not
/// prefer, from `KGEMM_MIN_ROWS` (32) for the k-quants, which it does.
/// Measured whole decode steps on a 2-core Sapphire Rapids guest (`pagoda
/// bench decode --batch-sizes ... --context 200`, median ms a step, tiles
/// against the path taken without them; weights streamed from memory, which
/// `amx_timing`'s repeated single products do not show): SmolLM2-135M Q4_1
/// 40 / 40-43 at 8 rows, 53-55 / 69 at 16; Qwen2.5-1.5B Q4_K_M 273-295 /
/// 228-232 at 16 rows, 341-383 / 306-341 at 24, 353-370 / 441-465 (the
/// tiles before blocks were widened straight to bf16) at 32.
pub(crate) fn takes_amx(ty: crate::GgmlType, rows: usize, k: usize) -> bool {
    let min = if quant::kgemm::preferred(ty, quant::Isa::detect()) {
        super::amx::KGEMM_MIN_ROWS
    } else {
        super::amx::MIN_ROWS
    };
    quant::supported(ty) && rows >= min && super::amx::takes(rows, k)
}

/// Whether `rows` x rows against blocks of `ty` take [`quant::kgemm`] (where
/// [`takes_amx`] does not): the
/// k-quants on the SIMD paths from [`quant::kgemm::min_rows`] rows (8 with
/// VNNI, 17 on AVX2; batched decode steps included, measured by
/// `decode_rows_timing` in quant/kgemm_tests.rs against the block kernels;
/// Q6_K on AVX2 past `QUANT_MAX_ROWS`).
/// Q4_1 takes it for batched decode steps alone: from `min_rows` (16 with
/// VNNI, 17 on AVX2) to `QUANT_MAX_ROWS`.
pub(crate) fn takes_kgemm(ty: crate::GgmlType, rows: usize, isa: quant::Isa) -> bool {
    quant::kgemm::handles(ty, isa)
        && rows >= quant::kgemm::min_rows(ty, isa)
        && (rows <= QUANT_MAX_ROWS || quant::kgemm::preferred(ty, isa))
}

/// Size of the per-thread buffer narrow weights are widened into.
const SCRATCH_BYTES: usize = 8 << 20;

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

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
    linear_into(&x.data, rows, w.view(), bias, &mut y.data, threads);
    Ok(y)
}

/// Three projections of the same `x` (q, k and v) through quantized
/// weights in one parallel pass ([`quant::fused`]: the activations quantized
/// once, one fork-join for the three). `None` (nothing computed) when some
/// weight is not kept in blocks, the step has more than `QUANT_MAX_ROWS`
/// rows or enough for some weight to take [`quant::kgemm`]
/// ([`takes_kgemm`]), or a shape or bias does not fit: the caller then runs three
/// `linear` calls, which report any shape error.
pub fn linear3_quant(
    x: &CpuTensor,
    w: [&CpuWeight; 3],
    bias: [Option<&CpuWeight>; 3],
    threads: usize,
) -> Option<[CpuTensor; 3]> {
    let (rows, k) = (x.rows, x.cols);
    if rows == 0 || rows > QUANT_MAX_ROWS || k == 0 {
        return None;
    }
    let isa = quant::Isa::detect();
    let mut types = [crate::GgmlType::F32; 3];
    let mut biases: [Option<&[f32]>; 3] = [None; 3];
    for i in 0..3 {
        let ViewData::Quant(ty, _) = w[i].view().data else {
            return None;
        };
        if w[i].cols != k || w[i].fp8_act || takes_kgemm(ty, rows, isa) || takes_amx(ty, rows, k) {
            return None;
        }
        types[i] = ty;
        if let Some(b) = bias[i] {
            biases[i] = Some(b.as_f32().filter(|v| v.len() == w[i].rows)?);
        }
    }
    let mut ys = w.map(|w| CpuTensor::for_overwrite(rows, w.rows));
    let views = w.map(|w| w.view());
    let mut targets: Vec<quant::fused::Target<'_>> = Vec::with_capacity(3);
    for ((y, v), ty) in ys.iter_mut().zip(&views).zip(types) {
        let ViewData::Quant(_, bytes) = v.data else {
            return None;
        };
        targets.push(quant::fused::Target {
            ty,
            w: bytes,
            y: &mut y.data,
        });
    }
    if !quant::fused::matmul_many(&x.data, rows, k, &mut targets, threads, isa) {
        return None;
    }
    for (y, b) in ys.iter_mut().zip(biases) {
        let n = y.cols;
        add_bias(&mut y.data, n, b);
    }
    Some(ys)
}

/// `y = x @ w^T (+ bias)` for `x: [rows, w.cols]` and `y: [rows, w.rows]`
/// (every element of `y` written), on any rows of a weight; shapes are the
/// caller's to check.
pub(crate) fn linear_into(
    x: &[f32],
    rows: usize,
    w: WeightView<'_>,
    bias: Option<&[f32]>,
    y: &mut [f32],
    threads: usize,
) {
    let (k, n) = (w.cols, w.rows);
    debug_assert!(x.len() == rows * k && y.len() == rows * n);
    if rows == 0 || n == 0 {
        return;
    }
    if k == 0 {
        match bias {
            Some(b) => y.chunks_exact_mut(n).for_each(|r| r.copy_from_slice(b)),
            None => y.fill(0.0),
        }
        return;
    }
    if let ViewData::Quant(ty, bytes) = w.data {
        if takes_amx(ty, rows, k) {
            super::amx::matmul(x, rows, w, y, threads);
            add_bias(y, n, bias);
            return;
        }
        let isa = quant::Isa::detect();
        let done = if takes_kgemm(ty, rows, isa) {
            quant::kgemm::matmul(x, rows, k, ty, bytes, y, threads, isa)
        } else {
            rows <= QUANT_MAX_ROWS && quant::matmul(x, rows, k, ty, bytes, y, threads, isa)
        };
        if done {
            add_bias(y, n, bias);
            return;
        }
        gemm_chunked(x, rows, k, w, bias, y, threads);
        return;
    }
    if rows <= GEMV_MAX_ROWS {
        if rows == 1 {
            gemv::gemv_t(x, 1, w, y, threads);
        } else {
            // Groups of up to gemv::MAX_ROWS rows, one pass over the weights each.
            let mut t = vec![0f32; n * gemv::MAX_ROWS];
            for r0 in (0..rows).step_by(gemv::MAX_ROWS) {
                let g = (rows - r0).min(gemv::MAX_ROWS);
                let t = &mut t[..n * g];
                gemv::gemv_t(&x[r0 * k..(r0 + g) * k], g, w, t, threads);
                for (j, col) in t.chunks_exact(g).enumerate() {
                    for (r, v) in col.iter().enumerate() {
                        y[(r0 + r) * n + j] = *v;
                    }
                }
            }
        }
        add_bias(y, n, bias);
        return;
    }
    gemm_chunked(x, rows, k, w, bias, y, threads);
}

/// Adds `bias` (n values) to every row of `y`.
fn add_bias(y: &mut [f32], n: usize, bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for row in y.chunks_exact_mut(n) {
            for (o, b) in row.iter_mut().zip(b) {
                *o += b;
            }
        }
    }
}

/// `y = x @ w^T + bias` through the `gemm` crate. A narrow weight is widened
/// to f32 in chunks that fit the scratch buffer (in parallel), each chunk then
/// multiplied by one multi-threaded gemm call.
fn gemm_chunked(
    x: &[f32],
    rows: usize,
    k: usize,
    w: WeightView<'_>,
    bias: Option<&[f32]>,
    y: &mut [f32],
    threads: usize,
) {
    let n = w.rows;
    if let Some(b) = bias {
        y.par_chunks_mut(n).for_each(|r| r.copy_from_slice(b));
    }
    if let ViewData::F32(v) = w.data {
        return gemm_f32(x, rows, k, v, 0, n, n, y, bias.is_some(), threads);
    }
    // Output features per chunk: what fits the scratch buffer, whole GEMM tiles.
    let chunk_n = (SCRATCH_BYTES / 4 / k).next_multiple_of(16).min(n);
    SCRATCH.with(|cell| {
        // Another op running on this thread (a nested task) holds the buffer:
        // fall back to a fresh one.
        let mut fresh = Vec::new();
        let mut held = cell.try_borrow_mut();
        let buf = match held.as_mut() {
            Ok(b) => &mut **b,
            Err(_) => &mut fresh,
        };
        widen_and_multiply(x, rows, k, w, y, bias.is_some(), threads, chunk_n, buf);
    });
}

/// Widens `w` chunk by chunk into `buf` and multiplies each chunk.
#[allow(clippy::too_many_arguments)]
fn widen_and_multiply(
    x: &[f32],
    rows: usize,
    k: usize,
    w: WeightView<'_>,
    y: &mut [f32],
    read_dst: bool,
    threads: usize,
    chunk_n: usize,
    buf: &mut Vec<f32>,
) {
    let n = w.rows;
    let mut j0 = 0;
    while j0 < n {
        let j1 = (j0 + chunk_n).min(n);
        buf.resize((j1 - j0) * k, 0.0);
        let out = &mut buf[..(j1 - j0) * k];
        out.par_chunks_mut(CONVERT_ROWS * k)
            .enumerate()
            .for_each(|(c, out)| {
                let r0 = j0 + c * CONVERT_ROWS;
                w.rows_to_f32(r0, r0 + out.len() / k, out);
            });
        gemm_f32(x, rows, k, out, j0, j1, n, y, read_dst, threads);
        j0 = j1;
    }
}

/// `y[:, j0..j1] (+)= x @ wt^T` for `wt` = rows `j0..j1` of the weight, in f32.
#[allow(clippy::too_many_arguments)]
fn gemm_f32(
    x: &[f32],
    rows: usize,
    k: usize,
    wt: &[f32],
    j0: usize,
    j1: usize,
    n: usize,
    y: &mut [f32],
    read_dst: bool,
    threads: usize,
) {
    assert!(x.len() >= rows * k && wt.len() >= (j1 - j0) * k && y.len() >= rows * n && j1 <= n);
    // SAFETY: dst is columns j0..j1 of y ([rows, n], row stride n); lhs is
    // x ([rows, k], row-major); rhs is wt^T ([k, j1 - j0], element (i, j)
    // at wt[j * k + i]). All three lie inside their slices (asserted above).
    unsafe {
        gemm::gemm(
            rows,
            j1 - j0,
            k,
            y.as_mut_ptr().add(j0),
            1,
            n as isize,
            read_dst,
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
}
