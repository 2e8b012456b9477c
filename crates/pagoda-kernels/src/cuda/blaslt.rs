//! bf16 and FP8 GEMMs through cuBLASLt, with a bounded set of cached plans.
//!
//! `linear` of more than a few rows computes, row-major,
//! `y[rows, out] = x[rows, in] @ w[out, in]^T`, which column-major is
//! `y'[out, rows] = op(w')[out, in] * x'[in, rows]` with `w'` transposed.
//! Two output modes: bf16 `y = w x` ([`LtGemm::gemm`]), and `y += w x` into
//! an f32 `y` ([`LtGemm::gemm_acc_f32`]: beta = 1 with C = D, how
//! `add_linear` adds a projection into the f32 residual stream unrounded).
//!
//! FP8 weights ([`LtGemm::gemm_fp8`]): A (the weight) and B (the input)
//! are E4M3 codes, each with an outer-vector f32 scale
//! (`CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F`, cuBLASLt 12.9+): one per
//! row of op(A) (the weight's output channels) and one per column of B (the
//! tokens), so `y[t, o] = sx[t] * sw[o] * sum qx[t, :] * qw[o, :]` in f32,
//! out in either mode above. Scale pointers are set on the plan's
//! descriptor before each call (under the plans' lock).
//!
//! Plans are keyed by `(out, bucket(rows), in, mode)`: [`bucket`] rounds the
//! row count up to one of a few dozen sizes (multiples of 16 up to 128, then
//! four steps per octave). A plan holds the matmul descriptor (f32 compute
//! and scale, bf16 A/B), the three layouts and cuBLASLt's heuristic choice
//! of algorithm for the bucket's size under a 32 MiB workspace; a call sets
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
//! is [`super::blaslt_tune`]'s business; a plan keeps it for its lifetime.

use super::blaslt_cache::GemmTuning;
use super::blaslt_tune::{default_cache_file, heuristics, GemmTuningStats, Tuner};
use super::device_err;
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

/// What a plan computes: f32 accumulation into C (else a bf16 output), and
/// FP8 operands with outer-vector scales (else bf16 operands).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Mode {
    pub acc_f32: bool,
    pub fp8: bool,
}

impl Mode {
    /// The mode's name in the tuning cache (one of `blaslt_cache::MODE_TAGS`).
    pub fn tag(self) -> &'static str {
        match (self.fp8, self.acc_f32) {
            (false, false) => "bf16",
            (false, true) => "acc_f32",
            (true, false) => "fp8",
            (true, true) => "fp8_acc_f32",
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
        Ok(LtGemm {
            handle,
            workspace: pool.take_static::<u8>(WORKSPACE_BYTES)?,
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
        let out_type = if mode.acc_f32 {
            sys::cudaDataType::CUDA_R_32F
        } else {
            bf
        };
        let in_type = if mode.fp8 {
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
            if mode.fp8 {
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
                let what = if mode.fp8 {
                    "an FP8 (outer-vector scaled)"
                } else {
                    "a bf16"
                };
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
        let (yp, _gy) = y.device_ptr_mut(&self.stream);
        let mode = Mode {
            acc_f32: false,
            fp8: false,
        };
        self.run(m, n, k, w, x, yp, mode, None)
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
        let (yp, _gy) = y.device_ptr_mut(&self.stream);
        let mode = Mode {
            acc_f32: true,
            fp8: false,
        };
        self.run(m, n, k, w, x, yp, mode, None)
    }

    /// The FP8 product (see the module docs): `w` `[m, k]` and `x` `[n, k]`
    /// E4M3 codes with their scales, into a bf16 `y` or added into an f32
    /// `y` (`acc_f32`), given as its device pointer of `y_len` elements.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_fp8(
        &self,
        m: usize,
        n: usize,
        k: usize,
        w: &CudaSlice<u8>,
        x: &CudaSlice<u8>,
        scales: Fp8Scales<'_>,
        yp: cudarc::driver::sys::CUdeviceptr,
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
        // cuBLASLt's FP8 kernels need 16-byte aligned rows.
        if !k.is_multiple_of(16) {
            return Err(KernelError::Unsupported(format!(
                "an FP8 GEMM with in_features = {k} (must be a multiple of 16)"
            )));
        }
        let mode = Mode { acc_f32, fp8: true };
        self.run(m, n, k, w, x, yp, mode, Some(scales))
    }

    /// One `cublasLtMatmul` with the cached plan of the shape and mode;
    /// `yp` is C and D (beta 1 when accumulating, else 0).
    #[allow(clippy::too_many_arguments)]
    fn run<T>(
        &self,
        m: usize,
        n: usize,
        k: usize,
        w: &CudaSlice<T>,
        x: &CudaSlice<T>,
        yp: cudarc::driver::sys::CUdeviceptr,
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
            Entry::Vacant(v) => v.insert(self.new_plan(key, n, w, x, yp, scales.as_ref())?),
        };
        p.set_cols(n)?;
        if let Some(sc) = &scales {
            self.set_scales(p, sc)?;
        }
        if self.matmul(p, w, x, yp, mode.acc_f32).is_ok() {
            return Ok(());
        }
        // The bucket's algorithm does not take this row count: a one-off
        // plan of the exact shape.
        let (exact, _) = self.plan(key.0, n, key.2, mode, 1)?;
        if let Some(sc) = &scales {
            self.set_scales(&exact, sc)?;
        }
        self.matmul(&exact, w, x, yp, mode.acc_f32)
    }

    /// Points an FP8 plan's A and B scales at this call's vectors.
    pub(super) fn set_scales(&self, p: &Plan, sc: &Fp8Scales<'_>) -> Result<()> {
        let (wp, _gw) = sc.w.device_ptr(&self.stream);
        let (xp, _gx) = sc.x.device_ptr(&self.stream);
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
            // SAFETY: the descriptor is live (owned by the plan); the buffer
            // is a pointer, the attribute's type; the vectors outlive the
            // queued matmul (the caller holds them until it is queued, and
            // the pool recycles memory only in stream order).
            unsafe {
                result::set_matmul_desc_attribute(
                    p.desc,
                    attr,
                    (&ptr) as *const *const c_void as *const c_void,
                    std::mem::size_of::<*const c_void>(),
                )
            }
            .map_err(|e| lt_err(what, e))?;
        }
        Ok(())
    }

    /// One `cublasLtMatmul` of plan `p` (its layouts set to the call's
    /// shape); `yp` is C and D (beta 1 when accumulating, else 0).
    fn matmul<T>(
        &self,
        p: &Plan,
        w: &CudaSlice<T>,
        x: &CudaSlice<T>,
        yp: cudarc::driver::sys::CUdeviceptr,
        acc_f32: bool,
    ) -> Result<()> {
        self.matmul_with(p, &p.algo, w, x, yp, yp, acc_f32)
    }

    /// [`Self::matmul`] with algorithm `algo`, C at `cp` and D at `dp`
    /// (both of the plan's C layout).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_with<T>(
        &self,
        p: &Plan,
        algo: &sys::cublasLtMatmulAlgo_t,
        w: &CudaSlice<T>,
        x: &CudaSlice<T>,
        cp: cudarc::driver::sys::CUdeviceptr,
        dp: cudarc::driver::sys::CUdeviceptr,
        acc_f32: bool,
    ) -> Result<()> {
        let alpha = 1.0f32;
        let beta = if acc_f32 { 1.0f32 } else { 0.0f32 };
        let stream = &self.stream;
        let (wp, _gw) = w.device_ptr(stream);
        let (xp, _gx) = x.device_ptr(stream);
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
    use super::bucket;

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
