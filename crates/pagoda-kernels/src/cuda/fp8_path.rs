//! Which FP8 GEMM path the device runs ([`Fp8GemmPath`]), chosen once, when
//! the first FP8 weight is loaded (never inside a step).
//!
//! cuBLASLt's outer-vector scale modes (one scale per output channel and
//! per token, applied inside the GEMM) exist only where cuBLASLt has such
//! kernels: on a Hopper H200 with cuBLASLt 13.0 every such matmul returns
//! `CUBLAS_STATUS_INVALID_VALUE`. So the choice is measured, not assumed:
//! each candidate computes a small FP8 linear layer (bf16 output, and added
//! into an f32 residual) through the real code path (`fp8_linear.rs`), and
//! the result is compared with the CPU reference of `fp8_matrix.rs`.
//! - `OuterVec` is taken when it runs and matches;
//! - else `UnitScaled` (tensor-wide scales of 1, f32 sums, a rescaling
//!   kernel), when cuBLASLt refused outer-vector scales (invalid value, not
//!   supported, no algorithm) or they computed a wrong result;
//! - any other failure, or `UnitScaled` failing too, is an error of the
//!   load: FP8 weights are then unavailable, never silently wrong.
//!
//! Where `OuterVec` was taken, a later shape cuBLASLt refuses it for runs
//! that one call unit-scaled (`fp8_linear.rs`).
//!
//! [`CudaBackend::with_fp8_gemm_path`] forces one path (tests, benchmarks):
//! it is still checked, and its failure is the load's error.
//! [`CudaBackend::fp8_gemm_note`] says what was chosen and why, for the
//! start-up log.

use super::ops::Dest;
use super::CudaBackend;
use crate::fp8_matrix::{quant_dequant_row, Fp8Matrix};
use crate::{Backend, KernelError, Result};
use std::sync::Mutex;

/// How FP8 linear layers apply the weight's and the input's scales (also
/// the scaling of an FP8 GEMM plan in `blaslt.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8GemmPath {
    /// cuBLASLt applies both scale vectors (outer-vector scale modes).
    OuterVec,
    /// cuBLASLt with tensor-wide scales of 1 into f32 scratch, then a
    /// kernel multiplies each element by its row's and column's scales.
    UnitScaled,
}

impl std::fmt::Display for Fp8GemmPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Fp8GemmPath::OuterVec => {
                "cuBLASLt FP8 GEMM with outer-vector (per-channel, per-token) scales"
            }
            Fp8GemmPath::UnitScaled => {
                "cuBLASLt FP8 GEMM with unit tensor-wide scales into f32, then a per-channel, \
                 per-token rescaling kernel"
            }
        })
    }
}

/// The choice of one backend (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Fp8PathState {
    forced: Option<Fp8GemmPath>,
    /// The path and a line saying why, once chosen.
    chosen: Mutex<Option<(Fp8GemmPath, String)>>,
}

/// Relative L2 error a path may show on the check (FP8 scaled correctly is
/// below 1e-3 there: bf16 rounding and the order of the sums; a scale
/// applied to the wrong axis, or not at all, is far above).
const CHECK_TOL: f64 = 1e-2;

impl CudaBackend {
    /// Forces the FP8 GEMM path instead of choosing it (see [`fp8_path`]);
    /// it is still checked when the first FP8 weight loads.
    ///
    /// [`fp8_path`]: self
    pub fn with_fp8_gemm_path(mut self, path: Fp8GemmPath) -> Self {
        self.fp8_gemm = Fp8PathState {
            forced: Some(path),
            chosen: Mutex::new(None),
        };
        self
    }

    /// The FP8 GEMM path, once an FP8 weight has been loaded.
    pub fn fp8_gemm_path(&self) -> Option<Fp8GemmPath> {
        let chosen = self
            .fp8_gemm
            .chosen
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        chosen.as_ref().map(|c| c.0)
    }

    /// A line for the log: the FP8 GEMM path and why (once chosen).
    pub fn fp8_gemm_note(&self) -> Option<String> {
        let chosen = self
            .fp8_gemm
            .chosen
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        chosen.as_ref().map(|c| c.1.clone())
    }
}

/// The device's FP8 GEMM path, choosing it on the first call (a few small
/// GEMMs and one host wait; `load_fp8_linear` makes that call).
pub(crate) fn select(b: &CudaBackend) -> Result<Fp8GemmPath> {
    let state = &b.fp8_gemm;
    let mut chosen = state.chosen.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((path, _)) = chosen.as_ref() {
        return Ok(*path);
    }
    let (path, why) = match state.forced {
        Some(path) => match check(b, path)? {
            Ok(()) => (path, format!("FP8 weights: {path} (forced)")),
            Err(e) => {
                return Err(KernelError::Unsupported(format!(
                    "FP8 weights on this device with the {path}: {e}"
                )))
            }
        },
        None => match check(b, Fp8GemmPath::OuterVec)? {
            Ok(()) => {
                let p = Fp8GemmPath::OuterVec;
                (p, format!("FP8 weights: {p}"))
            }
            Err(refused) => match check(b, Fp8GemmPath::UnitScaled)? {
                Ok(()) => {
                    let p = Fp8GemmPath::UnitScaled;
                    (
                        p,
                        format!("FP8 weights: {p} (outer-vector scales: {refused})"),
                    )
                }
                Err(e) => {
                    return Err(KernelError::Unsupported(format!(
                        "FP8 weights on this device: cuBLASLt runs neither outer-vector scaled \
                         FP8 GEMMs ({refused}) nor unit-scaled ones ({e})"
                    )))
                }
            },
        },
    };
    *chosen = Some((path, why));
    Ok(path)
}

/// Whether an error is cuBLASLt declining a configuration (so another path
/// may serve), rather than a device failure.
pub(crate) fn is_refusal(e: &KernelError) -> bool {
    let s = e.to_string();
    s.contains("cuBLASLt")
        && (s.contains("INVALID_VALUE")
            || s.contains("NOT_SUPPORTED")
            || s.contains("no algorithm"))
}

/// Runs a small FP8 linear layer on `path` against the CPU reference:
/// `Ok(Ok(()))` when it matches, `Ok(Err(why))` when cuBLASLt refused the
/// configuration or the result is wrong, `Err` on any other failure.
fn check(b: &CudaBackend, path: Fp8GemmPath) -> Result<std::result::Result<(), String>> {
    // 24 tokens (not a plan bucket), 48 outputs, 64 inputs; channels and
    // tokens of different magnitudes, so a scale on the wrong axis shows.
    let (rows, out, inner) = (24usize, 48usize, 64usize);
    let wave = |i: usize, f: f32| ((i * 7919 % 263) as f32 / 131.0 - 1.0) * f;
    let w: Vec<f32> = (0..out * inner)
        .map(|i| wave(i, 0.05 * (1 + (i / inner) % 5) as f32))
        .collect();
    let x: Vec<f32> = (0..rows * inner)
        .map(|i| {
            let v = wave(i * 3 + 1, 0.5 * (1 + (i / inner) % 7) as f32);
            half::bf16::from_f32(v).to_f32()
        })
        .collect();
    let m = Fp8Matrix::quantize(out, inner, &w)?;
    // The reference: the weight's values times the input quantized per row.
    let wd = m.dequantize();
    let mut want = vec![0f32; rows * out];
    for (t, xr) in x.chunks(inner).enumerate() {
        let mut xq = xr.to_vec();
        quant_dequant_row(&mut xq);
        for o in 0..out {
            let s: f64 = (0..inner)
                .map(|c| xq[c] as f64 * wd[o * inner + c] as f64)
                .sum();
            want[t * out + o] = s as f32;
        }
    }
    let residual: Vec<f32> = (0..rows * out).map(|i| wave(i + 5, 2.0)).collect();
    let codes = b.upload(m.codes, "fp8 path check")?;
    let scales = b.upload(m.scales, "fp8 path check")?;
    let gx = b.tensor_from_host(rows, inner, &x)?;
    let weight = (&codes, &scales, out);
    let op = "fp8 path check";
    // A bf16 output, and the same product added into an f32 residual.
    let mut y = b.alloc_bf16(rows * out)?;
    let mut r = b.upload(residual.clone(), op)?;
    let mut run = || -> Result<()> {
        let mut dest = Dest::Bf16(&mut y);
        super::fp8_linear::product_on(b, path, op, &gx, weight, None, &mut dest)?;
        let mut dest = Dest::AccF32(&mut r);
        super::fp8_linear::product_on(b, path, op, &gx, weight, None, &mut dest)
    };
    match run() {
        Ok(()) => {}
        Err(e) if is_refusal(&e) => return Ok(Err(e.to_string())),
        Err(e) => return Err(e),
    }
    let got_y = b.download(&y, rows * out)?;
    let got_r: Vec<f32> = b.download_raw(&r, rows * out)?;
    let want_r: Vec<f32> = residual.iter().zip(&want).map(|(a, p)| a + p).collect();
    let (ey, er) = (rel_err_l2(&got_y, &want), rel_err_l2(&got_r, &want_r));
    let bad = |v: &[f32]| v.iter().any(|x| !x.is_finite());
    if bad(&got_y) || bad(&got_r) || !(ey < CHECK_TOL && er < CHECK_TOL) {
        return Ok(Err(format!(
            "wrong results on a check against the CPU reference (relative error {ey:.2e} \
             into bf16, {er:.2e} into the f32 residual)"
        )));
    }
    Ok(Ok(()))
}

/// ||got - want||_2 / ||want||_2 (in f64).
fn rel_err_l2(got: &[f32], want: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}
