//! bf16 and FP8 GEMMs through cuBLASLt, with a bounded set of cached plans.
//!
//! `linear` of more than a few rows computes, row-major,
//! `y[rows, out] = x[rows, in] @ w[out, in]^T`, which column-major is
//! `y'[out, rows] = op(w')[out, in] * x'[in, rows]` with `w'` transposed.
//! Two output modes: bf16 `y = w x` ([`LtGemm::gemm`]), and `y += w x` into
//! an f32 `y` ([`LtGemm::gemm_acc_f32`]: beta = 1 with C = D, how
//! `add_linear` adds a projection into the f32 residual stream unrounded).
//!
//! FP8 weights: A (the weight) and B (the input) are E4M3 codes (TN, as
//! cuBLASLt's FP8 kernels require; `k` a multiple of 16 so every row is
//! 16-byte aligned), f32 accumulation, scaled as one of the two
//! [`Fp8GemmPath`]s (`fp8_path.rs` picks the one the device runs):
//! - [`LtGemm::gemm_fp8`], outer-vector scales
//!   (`CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F`, cuBLASLt 12.9+): one f32
//!   per row of op(A) (the weight's output channels) and one per column of B
//!   (the tokens), so `y[t, o] = sx[t] * sw[o] * sum qx[t, :] * qw[o, :]`,
//!   out in either mode above. The scale pointers are set on the plan's
//!   descriptor before each call (under the plans' lock). cuBLASLt refuses
//!   this mode where it has no such kernel (`CUBLAS_STATUS_INVALID_VALUE`
//!   from `cublasLtMatmul` itself, not from the heuristic).
//! - [`LtGemm::gemm_fp8_unit`], tensor-wide scales of 1 (the default scalar
//!   scale mode, as `torch._scaled_mm` runs tensor-wise FP8 on Hopper; both
//!   scale pointers at one static device 1.0, set when the plan is made):
//!   the raw sums `sum qx[t, :] * qw[o, :]` into an f32 D (C = D, beta 0),
//!   for a rescaling kernel to finish.
//!
//! Plans are keyed by `(out, bucket(rows), in, mode)`: [`bucket`] rounds the
//! row count up to one of a few dozen sizes (multiples of 16 up to 128, then
//! four steps per octave; `mode` is the operand type, the FP8 scaling and
//! the output: bf16, or f32 accumulated into or overwritten). A plan holds
//! the matmul descriptor (f32 compute and scale), the three layouts and the
//! algorithm for the bucket's size under a 32 MiB workspace; a call sets
//! the layouts' column count to its own row count and runs that algorithm.
//! So however varied the steps, the plans (and the kernels cuBLASLt loads
//! for them) are bounded by the buckets, and a step's GEMMs cost one
//! `cublasLtMatmul` each on the host. Should cuBLASLt refuse a bucket's
//! algorithm at some row count, that call falls back to a one-off plan of
//! its exact shape. The workspace is allocated once (a static buffer, so
//! GEMMs can be captured into CUDA graphs).
//!
//! Which of cuBLASLt's candidate algorithms a new plan takes (its first
//! heuristic result, a choice timed on the device, or one cached on disk)
//! is [`super::blaslt_tune`]'s business, for every mode alike (its disk
//! cache keys a choice by [`Mode::tag`], so no mode's algorithm serves
//! another's descriptor); a plan keeps it for its lifetime.

use super::blaslt_cache::GemmTuning;
use super::blaslt_tune::{default_cache_file, heuristics, GemmTuningStats, Tuner};
use super::device_err;
use super::fp8_path::Fp8GemmPath;
use super::pool::{DeviceBuf, Pool};
use crate::{KernelError, Result};
use cudarc::cublaslt::{result, sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// A device address (of a buffer the caller holds while the call queues).
pub(super) type DevPtr = cudarc::driver::sys::CUdeviceptr;

/// Workspace cuBLASLt may use (NVIDIA's recommendation for Hopper).
pub(super) const WORKSPACE_BYTES: usize = 32 << 20;

pub(super) struct Plan {
    pub desc: sys::cublasLtMatmulDesc_t,
    pub a: sys::cublasLtMatrixLayout_t,
    pub b: sys::cublasLtMatrixLayout_t,
    pub c: sys::cublasLtMatrixLayout_t,
    pub algo: sys::cublasLtMatmulAlgo_t,
}

impl Plan {
    /// Points the B and C layouts at `n` columns (the call's row count).
    pub fn set_cols(&self, n: u64) -> Result<()> {
        for layout in [self.b, self.c] {
            // SAFETY: the layout is live (owned by this plan); the buffer is
            // a u64, the attribute's type.
            unsafe {
                result::set_matrix_layout_attribute(
                    layout,
                    sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_COLS,
                    (&n) as *const u64 as *const c_void,
                    std::mem::size_of::<u64>(),
                )
            }
            .map_err(|e| lt_err("layout columns", e))?;
        }
        Ok(())
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created in `LtGemm::plan`, destroyed once here; cuBLASLt
        // reads descriptors when a matmul is queued, never later.
        unsafe {
            let _ = result::destroy_matrix_layout(self.a);
            let _ = result::destroy_matrix_layout(self.b);
            let _ = result::destroy_matrix_layout(self.c);
            let _ = result::destroy_matmul_desc(self.desc);
        }
    }
}

/// The row count a plan is chosen for: `n` rounded up to a multiple of 16
/// up to 128, then to a quarter of its octave (160, 192, 224, 256, 320, ...).
pub(crate) fn bucket(n: u64) -> u64 {
    if n <= 128 {
        return n.max(1).div_ceil(16) * 16;
    }
    let octave = 1u64 << (63 - (n - 1).leading_zeros());
    let step = octave / 4;
    n.div_ceil(step) * step
}

/// What a plan computes: f32 accumulation into C (else a fresh output,
/// beta 0), and FP8 operands with their scaling (else bf16 operands). The
/// output is bf16, except when accumulating and for
/// [`Fp8GemmPath::UnitScaled`] (f32 sums for the rescaling kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Mode {
    pub acc_f32: bool,
    pub fp8: Option<Fp8GemmPath>,
}

impl Mode {
    /// Every mode (the tests check their tags).
    #[cfg(test)]
    const ALL: [Mode; 6] = {
        let (o, u) = (Some(Fp8GemmPath::OuterVec), Some(Fp8GemmPath::UnitScaled));
        [
            Mode {
                acc_f32: false,
                fp8: None,
            },
            Mode {
                acc_f32: true,
                fp8: None,
            },
            Mode {
                acc_f32: false,
                fp8: o,
            },
            Mode {
                acc_f32: true,
                fp8: o,
            },
            Mode {
                acc_f32: false,
                fp8: u,
            },
            Mode {
                acc_f32: true,
                fp8: u,
            },
        ]
    };

    /// Whether C and D are f32 (else bf16).
    pub fn out_f32(self) -> bool {
        self.acc_f32 || self.fp8 == Some(Fp8GemmPath::UnitScaled)
    }

    /// The mode's name in the tuning cache (one of `blaslt_cache::MODE_TAGS`):
    /// each names the operand type, the FP8 scaling and the output, so an
    /// algorithm cached for one descriptor is never tried on another's.
    pub fn tag(self) -> &'static str {
        match (self.fp8, self.acc_f32) {
            (None, false) => "bf16",
            (None, true) => "acc_f32",
            (Some(Fp8GemmPath::OuterVec), false) => "fp8_outer",
            (Some(Fp8GemmPath::OuterVec), true) => "fp8_outer_acc_f32",
            (Some(Fp8GemmPath::UnitScaled), false) => "fp8_unit_f32",
            (Some(Fp8GemmPath::UnitScaled), true) => "fp8_unit_acc_f32",
        }
    }

    /// The GEMM's kind, for errors.
    fn what(self) -> &'static str {
        match self.fp8 {
            None => "a bf16",
            Some(Fp8GemmPath::OuterVec) => "an FP8 (outer-vector scaled)",
            Some(Fp8GemmPath::UnitScaled) => "an FP8 (unit scaled, f32 out)",
        }
    }
}

/// The per-row scales of an FP8 GEMM: `w` one per output feature (`m`),
/// `x` one per row of the input (`n`).
pub(crate) struct Fp8Scales<'a> {
    pub w: &'a CudaSlice<f32>,
    pub x: &'a CudaSlice<f32>,
}

/// A cuBLASLt handle, its workspace and the plans by `(m, bucket(n), k, mode)`.
pub(crate) struct LtGemm {
    pub(super) handle: sys::cublasLtHandle_t,
    workspace: DeviceBuf<u8>,
    /// A static device 1.0f: the tensor-wide scales of unit-scaled plans.
    one: DeviceBuf<f32>,
    plans: Mutex<HashMap<(u64, u64, u64, Mode), Plan>>,
    pub(super) stream: Arc<CudaStream>,
    /// Scratch of the timing runs (see [`super::blaslt_tune`]).
    pub(super) pool: Arc<Pool>,
    /// How new plans choose their algorithm (taken after `plans`).
    pub(super) tuner: Mutex<Tuner>,
}

// SAFETY: the handle and plans are only used through `&self` methods that
// hold the plans' mutex while touching them, and all GEMMs go to one stream.
unsafe impl Send for LtGemm {}
unsafe impl Sync for LtGemm {}

fn lt_err(what: &str, e: impl std::fmt::Debug) -> KernelError {
    KernelError::Device(format!("cuBLASLt {what}: {e:?}"))
}

impl LtGemm {
    /// The handle for `stream`, choosing algorithms as `tuning` says (with
    /// the default disk cache of this GPU).
    pub fn new(stream: Arc<CudaStream>, pool: &Arc<Pool>, tuning: GemmTuning) -> Result<Self> {
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| device_err("bind context", e))?;
        let handle = result::create_handle().map_err(|e| lt_err("create handle", e))?;
        let gpu = stream.context().name().unwrap_or_default();
        let mut one = pool.take_static::<f32>(1)?;
        stream
            .memcpy_htod(&[1.0f32], &mut *one)
            .map_err(|e| device_err("FP8 unit scale", e))?;
        Ok(LtGemm {
            handle,
            workspace: pool.take_static::<u8>(WORKSPACE_BYTES)?,
            one,
            plans: Mutex::new(HashMap::new()),
            stream,
            pool: pool.clone(),
            tuner: Mutex::new(Tuner::new(tuning, &gpu, default_cache_file(&gpu))),
        })
    }

    /// Drops every plan and restarts tuning in `mode` with the disk cache
    /// `file` (`None`: no disk cache). For tests and benchmarks: plans made
    /// later may take other algorithms than graphs captured before.
    pub fn set_tuning(&self, mode: GemmTuning, file: Option<PathBuf>) {
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self.stream.synchronize();
        plans.clear();
        let gpu = self.stream.context().name().unwrap_or_default();
        *self.tuner.lock().unwrap_or_else(|p| p.into_inner()) = Tuner::new(mode, &gpu, file);
    }

    /// Ends the timing of new plans (later ones take the first heuristic
    /// result or a cached choice) and writes the new choices to the cache.
    pub fn finish_tuning(&self) -> GemmTuningStats {
        let mut t = self.tuner.lock().unwrap_or_else(|p| p.into_inner());
        t.open = false;
        t.save();
        t.stats.clone()
    }

    /// What tuning did so far.
    pub fn tuning_stats(&self) -> GemmTuningStats {
        self.tuner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stats
            .clone()
    }

    /// The plan of `(m, n, k)` in `mode`, with up to `count` heuristic
    /// algorithms (best first; the plan takes the first).
    pub(super) fn plan(
        &self,
        m: u64,
        n: u64,
        k: u64,
        mode: Mode,
        count: i32,
    ) -> Result<(Plan, Vec<sys::cublasLtMatmulAlgo_t>)> {
        let bf = sys::cudaDataType::CUDA_R_16BF;
        let out_type = if mode.out_f32() {
            sys::cudaDataType::CUDA_R_32F
        } else {
            bf
        };
        let in_type = if mode.fp8.is_some() {
            sys::cudaDataType::CUDA_R_8F_E4M3
        } else {
            bf
        };
        // SAFETY: every object is created here and checked; attribute
        // buffers are live locals of the size passed.
        unsafe {
            let desc = result::create_matmul_desc(
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cudaDataType::CUDA_R_32F,
            )
            .map_err(|e| lt_err("matmul desc", e))?;
            let t: i32 = 1;
            result::set_matmul_desc_attribute(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&t) as *const i32 as *const c_void,
                std::mem::size_of::<i32>(),
            )
            .map_err(|e| lt_err("transa", e))?;
            match mode.fp8 {
                None => {}
                Some(Fp8GemmPath::OuterVec) => {
                    let outer =
                        sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
                    for (attr, what) in [
                        (
                            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                            "A scale mode",
                        ),
                        (
                            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                            "B scale mode",
                        ),
                    ] {
                        result::set_matmul_desc_attribute(
                            desc,
                            attr,
                            (&outer) as *const _ as *const c_void,
                            std::mem::size_of::<u32>(),
                        )
                        .map_err(|e| lt_err(what, e))?;
                    }
                }
                Some(Fp8GemmPath::UnitScaled) => {
                    // The default (scalar) scale modes, pointed at a device
                    // 1.0 that lives as long as the plans.
                    let (one, _g) = self.one.device_ptr(&self.stream);
                    set_scale_pointers(desc, one, one)?;
                }
            }
            // A = w stored [k, m] column-major (transposed), B = x [k, n], C [m, n].
            let a = result::create_matrix_layout(in_type, k, m, k as i64)
                .map_err(|e| lt_err("layout A", e))?;
            let b = result::create_matrix_layout(in_type, k, n, k as i64)
                .map_err(|e| lt_err("layout B", e))?;
            let c = result::create_matrix_layout(out_type, m, n, m as i64)
                .map_err(|e| lt_err("layout C", e))?;
            let mut plan = Plan {
                desc,
                a,
                b,
                c,
                algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
            };
            let pref = result::create_matmul_pref().map_err(|e| lt_err("preference", e))?;
            let ws = WORKSPACE_BYTES;
            result::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const usize as *const c_void,
                std::mem::size_of::<usize>(),
            )
            .map_err(|e| lt_err("workspace preference", e))?;
            let algos = heuristics(self.handle, &plan, pref, count);
            let _ = result::destroy_matmul_pref(pref);
            let algos = algos.map_err(|e| {
                let what = mode.what();
                lt_err(
                    &format!("no algorithm for {what} GEMM of m={m} n={n} k={k}"),
                    e,
                )
            })?;
            plan.algo = algos[0];
            Ok((plan, algos))
        }
    }

    /// `y = op(w) * x` in the column-major terms of the module docs: `m`
    /// output features, `n` rows, `k` inner. The buffers must hold
    /// `m*k`, `k*n` and `m*n` elements.
    pub fn gemm(
        &self,
        m: usize,
        n: usize,
        k: usize,
        w: &CudaSlice<bf16>,
        x: &CudaSlice<bf16>,
        y: &mut CudaSlice<bf16>,
    ) -> Result<()> {
        check_len(m, n, k, w.len(), x.len(), y.len())?;
        let (wp, _gw) = w.device_ptr(&self.stream);
        let (xp, _gx) = x.device_ptr(&self.stream);
        let (yp, _gy) = y.device_ptr_mut(&self.stream);
        let mode = Mode {
            acc_f32: false,
            fp8: None,
        };
        self.run(m, n, k, (wp, xp, yp), mode, None)
    }

    /// `y += op(w) * x` with `y` f32 (see [`Self::gemm`] for the shapes).
    pub fn gemm_acc_f32(
        &self,
        m: usize,
        n: usize,
        k: usize,
        w: &CudaSlice<bf16>,
        x: &CudaSlice<bf16>,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        check_len(m, n, k, w.len(), x.len(), y.len())?;
        let (wp, _gw) = w.device_ptr(&self.stream);
        let (xp, _gx) = x.device_ptr(&self.stream);
        let (yp, _gy) = y.device_ptr_mut(&self.stream);
        let mode = Mode {
            acc_f32: true,
            fp8: None,
        };
        self.run(m, n, k, (wp, xp, yp), mode, None)
    }

    /// The FP8 product with outer-vector scales (see the module docs): `w`
    /// `[m, k]` and `x` `[n, k]` E4M3 codes with their scales, into a bf16
    /// `y` or added into an f32 `y` (`acc_f32`), given as its device pointer
    /// of `y_len` elements.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_fp8(
        &self,
        m: usize,
        n: usize,
        k: usize,
        w: &CudaSlice<u8>,
        x: &CudaSlice<u8>,
        scales: Fp8Scales<'_>,
        yp: DevPtr,
        y_len: usize,
        acc_f32: bool,
    ) -> Result<()> {
        check_len(m, n, k, w.len(), x.len(), y_len)?;
        if scales.w.len() < m || scales.x.len() < n {
            return Err(KernelError::Shape {
                op: "linear (fp8)",
                detail: format!("scales too short for a GEMM of m={m} n={n}"),
            });
        }
        check_fp8_shape(m, k)?;
        let (wp, _gw) = w.device_ptr(&self.stream);
        let (xp, _gx) = x.device_ptr(&self.stream);
        let mode = Mode {
            acc_f32,
            fp8: Some(Fp8GemmPath::OuterVec),
        };
        self.run(m, n, k, (wp, xp, yp), mode, Some(scales))
    }

    /// The FP8 product with unit scales (see the module docs): `w` `[m, k]`
    /// codes times rows `x_row0..x_row0 + n` of the `[_, k]` codes `x`, the
    /// raw f32 sums into `d` (`[n, m]` row-major; overwritten).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_fp8_unit(
        &self,
        m: usize,
        n: usize,
        k: usize,
        w: &CudaSlice<u8>,
        x: &CudaSlice<u8>,
        x_row0: usize,
        d: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let x_rows = x.len() / k.max(1);
        if x_row0 + n > x_rows {
            return Err(KernelError::Shape {
                op: "linear (fp8)",
                detail: format!("rows {x_row0}..{} of an input of {x_rows}", x_row0 + n),
            });
        }
        check_len(m, n, k, w.len(), n * k, d.len())?;
        check_fp8_shape(m, k)?;
        let (wp, _gw) = w.device_ptr(&self.stream);
        let (xp, _gx) = x.device_ptr(&self.stream);
        let (dp, _gd) = d.device_ptr_mut(&self.stream);
        // Still 16-byte aligned: buffers start on 512-byte granules (or
        // cuMemAlloc's 256), and a row is `k` bytes, a multiple of 16.
        let xp = xp + (x_row0 * k) as u64;
        let mode = Mode {
            acc_f32: false,
            fp8: Some(Fp8GemmPath::UnitScaled),
        };
        self.run(m, n, k, (wp, xp, dp), mode, None)
    }

    /// One `cublasLtMatmul` with the cached plan of the shape and mode;
    /// `(wp, xp, yp)` are live device buffers the caller checked (and holds
    /// until the matmul is queued), `yp` C and D (beta 1 when accumulating,
    /// else 0).
    fn run(
        &self,
        m: usize,
        n: usize,
        k: usize,
        ptrs: (DevPtr, DevPtr, DevPtr),
        mode: Mode,
        scales: Option<Fp8Scales<'_>>,
    ) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| device_err("bind context", e))?;
        let n = n as u64;
        let key = (m as u64, bucket(n), k as u64, mode);
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        let p = match plans.entry(key) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => v.insert(self.new_plan(key, n, ptrs, scales.as_ref())?),
        };
        p.set_cols(n)?;
        if let Some(sc) = &scales {
            self.set_scales(p, sc)?;
        }
        if self.matmul(p, ptrs, mode.acc_f32).is_ok() {
            return Ok(());
        }
        // The bucket's algorithm does not take this row count: a one-off
        // plan of the exact shape.
        let (exact, _) = self.plan(key.0, n, key.2, mode, 1)?;
        if let Some(sc) = &scales {
            self.set_scales(&exact, sc)?;
        }
        self.matmul(&exact, ptrs, mode.acc_f32)
    }

    /// Points an FP8 plan's A and B scales at this call's vectors.
    /// (The vectors outlive the queued matmul: the caller holds them until
    /// it is queued, and the pool recycles memory only in stream order.)
    pub(super) fn set_scales(&self, p: &Plan, sc: &Fp8Scales<'_>) -> Result<()> {
        let (wp, _gw) = sc.w.device_ptr(&self.stream);
        let (xp, _gx) = sc.x.device_ptr(&self.stream);
        set_scale_pointers(p.desc, wp, xp)
    }

    /// One `cublasLtMatmul` of plan `p` (its layouts set to the call's
    /// shape) on `(wp, xp, yp)`; `yp` is C and D (beta 1 when accumulating,
    /// else 0).
    fn matmul(
        &self,
        p: &Plan,
        (wp, xp, yp): (DevPtr, DevPtr, DevPtr),
        acc_f32: bool,
    ) -> Result<()> {
        self.matmul_with(p, &p.algo, (wp, xp), yp, yp, acc_f32)
    }

    /// [`Self::matmul`] with algorithm `algo`, A and B at `(wp, xp)`, C at
    /// `cp` and D at `dp` (both of the plan's C layout).
    pub(super) fn matmul_with(
        &self,
        p: &Plan,
        algo: &sys::cublasLtMatmulAlgo_t,
        (wp, xp): (DevPtr, DevPtr),
        cp: DevPtr,
        dp: DevPtr,
        acc_f32: bool,
    ) -> Result<()> {
        let alpha = 1.0f32;
        let beta = if acc_f32 { 1.0f32 } else { 0.0f32 };
        let stream = &self.stream;
        let (ws, _gws) = self.workspace.device_ptr(stream);
        // SAFETY: the plan's layouts match the sizes checked by the caller;
        // the pointers are live device buffers; the workspace is
        // WORKSPACE_BYTES; C and D have the same layout, and are the same
        // buffer (in-place, which cuBLASLt allows) or disjoint ones.
        unsafe {
            result::matmul(
                self.handle,
                p.desc,
                (&alpha) as *const f32 as *const c_void,
                (&beta) as *const f32 as *const c_void,
                wp as *const c_void,
                p.a,
                xp as *const c_void,
                p.b,
                cp as *const c_void,
                p.c,
                dp as *mut c_void,
                p.c,
                algo,
                ws as *mut c_void,
                WORKSPACE_BYTES,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| lt_err("matmul", e))
    }

    /// Plans made so far (bounded by the buckets of the row counts seen).
    pub fn num_plans(&self) -> usize {
        self.plans.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// Points a descriptor's A and B scales at `wp` and `xp` (device f32
/// scalars or vectors, per the descriptor's scale modes; they must stay live
/// while matmuls of the descriptor are queued).
fn set_scale_pointers(desc: sys::cublasLtMatmulDesc_t, wp: DevPtr, xp: DevPtr) -> Result<()> {
    for (attr, ptr, what) in [
        (
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
            wp,
            "A scale pointer",
        ),
        (
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
            xp,
            "B scale pointer",
        ),
    ] {
        let ptr = ptr as *const c_void;
        // SAFETY: the descriptor is live (owned by a plan being made or
        // used); the buffer is a pointer, the attribute's type.
        unsafe {
            result::set_matmul_desc_attribute(
                desc,
                attr,
                (&ptr) as *const *const c_void as *const c_void,
                std::mem::size_of::<*const c_void>(),
            )
        }
        .map_err(|e| lt_err(what, e))?;
    }
    Ok(())
}

/// cuBLASLt's FP8 layout rules for `m` output features and `k` inputs:
/// rows of the codes (`k` bytes) and of a bf16 or f32 output (`m`
/// elements) whole 16-byte groups.
fn check_fp8_shape(m: usize, k: usize) -> Result<()> {
    if !k.is_multiple_of(16) || !m.is_multiple_of(8) {
        return Err(KernelError::Unsupported(format!(
            "an FP8 GEMM of {m} outputs and in_features = {k} (in_features must be a \
             multiple of 16 and outputs of 8)"
        )));
    }
    Ok(())
}

/// Shape check of a GEMM's buffers (elements of w, x and y).
fn check_len(m: usize, n: usize, k: usize, w_len: usize, x_len: usize, y_len: usize) -> Result<()> {
    if w_len < m * k || x_len < k * n || y_len < m * n {
        return Err(KernelError::Shape {
            op: "linear",
            detail: format!("buffers too small for a GEMM of m={m} n={n} k={k}"),
        });
    }
    Ok(())
}

impl Drop for LtGemm {
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
        self.plans
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        // SAFETY: created in `new`, destroyed once here (after its plans).
        unsafe {
            let _ = result::destroy_handle(self.handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{bucket, Mode};
    use crate::cuda::blaslt_cache::MODE_TAGS;

    #[test]
    fn every_mode_has_its_own_cache_tag() {
        let tags: Vec<_> = Mode::ALL.iter().map(|m| m.tag()).collect();
        let distinct: std::collections::BTreeSet<_> = tags.iter().collect();
        assert_eq!(distinct.len(), Mode::ALL.len(), "{tags:?}");
        for t in &tags {
            assert!(MODE_TAGS.contains(t), "{t} not in MODE_TAGS");
        }
        assert_eq!(MODE_TAGS.len(), tags.len());
        // The f32 output of unit-scaled FP8 and of accumulation only.
        let f32_out: Vec<_> = Mode::ALL
            .iter()
            .filter(|m| m.out_f32())
            .map(|m| m.tag())
            .collect();
        assert_eq!(
            f32_out,
            [
                "acc_f32",
                "fp8_outer_acc_f32",
                "fp8_unit_f32",
                "fp8_unit_acc_f32"
            ]
        );
    }

    #[test]
    fn buckets_cover_every_row_count_and_stay_few() {
        let mut seen = std::collections::BTreeSet::new();
        for n in 1..=16384u64 {
            let b = bucket(n);
            assert!(b >= n && b < n + n / 4 + 16, "bucket({n}) = {b}");
            assert_eq!(bucket(b), b, "a bucket is its own bucket");
            seen.insert(b);
        }
        assert!(seen.len() <= 40, "{} buckets", seen.len());
    }
}
