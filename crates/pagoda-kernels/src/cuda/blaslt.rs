//! bf16 GEMMs through cuBLASLt, with one cached plan per shape.
//!
//! `linear` of more than a few rows computes, row-major,
//! `y[rows, out] = x[rows, in] @ w[out, in]^T`, which column-major is
//! `y'[out, rows] = op(w')[out, in] * x'[in, rows]` with `w'` transposed.
//! Two output modes: bf16 `y = w x` ([`LtGemm::gemm`]), and `y += w x` into
//! an f32 `y` ([`LtGemm::gemm_acc_f32`]: beta = 1 with C = D, how
//! `add_linear` adds a projection into the f32 residual stream unrounded).
//! For each `(out, rows, in, mode)` the first call builds the matmul
//! descriptor (f32 compute and scale, bf16 A/B), the three layouts and asks
//! cuBLASLt's heuristic for its best algorithm under a 32 MiB workspace;
//! later calls with that shape reuse the plan, so a step's GEMMs cost one
//! `cublasLtMatmul` each on the host. The workspace is allocated once (a
//! fixed buffer, so GEMMs can be captured into CUDA graphs).
//!
//! Plans live as long as the backend; shapes repeat (decode batch sizes,
//! prompt chunk lengths), so the cache stays small.

use super::device_err;
use super::pool::{DeviceBuf, Pool};
use crate::{KernelError, Result};
use cudarc::cublaslt::{result, sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// Workspace cuBLASLt may use (NVIDIA's recommendation for Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

/// A cuBLASLt handle, its workspace and the plans by `(m, n, k)`.
pub(crate) struct LtGemm {
    handle: sys::cublasLtHandle_t,
    workspace: DeviceBuf<u8>,
    plans: Mutex<HashMap<(u64, u64, u64, bool), Plan>>,
    stream: Arc<CudaStream>,
}

// SAFETY: the handle and plans are only used through `&self` methods that
// hold the plans' mutex while touching them, and all GEMMs go to one stream.
unsafe impl Send for LtGemm {}
unsafe impl Sync for LtGemm {}

fn lt_err(what: &str, e: impl std::fmt::Debug) -> KernelError {
    KernelError::Device(format!("cuBLASLt {what}: {e:?}"))
}

impl LtGemm {
    pub fn new(stream: Arc<CudaStream>, pool: &Arc<Pool>) -> Result<Self> {
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| device_err("bind context", e))?;
        let handle = result::create_handle().map_err(|e| lt_err("create handle", e))?;
        Ok(LtGemm {
            handle,
            workspace: pool.take::<u8>(WORKSPACE_BYTES)?,
            plans: Mutex::new(HashMap::new()),
            stream,
        })
    }

    /// The plan of `(m, n, k)`; `acc_f32` makes C/D f32 (else bf16).
    fn plan(&self, m: u64, n: u64, k: u64, acc_f32: bool) -> Result<Plan> {
        let bf = sys::cudaDataType::CUDA_R_16BF;
        let out_type = if acc_f32 {
            sys::cudaDataType::CUDA_R_32F
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
            // A = w stored [k, m] column-major (transposed), B = x [k, n], C [m, n].
            let a = result::create_matrix_layout(bf, k, m, k as i64)
                .map_err(|e| lt_err("layout A", e))?;
            let b = result::create_matrix_layout(bf, k, n, k as i64)
                .map_err(|e| lt_err("layout B", e))?;
            let c = result::create_matrix_layout(out_type, m, n, m as i64)
                .map_err(|e| lt_err("layout C", e))?;
            let pref = result::create_matmul_pref().map_err(|e| lt_err("preference", e))?;
            let ws = WORKSPACE_BYTES;
            result::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const usize as *const c_void,
                std::mem::size_of::<usize>(),
            )
            .map_err(|e| lt_err("workspace preference", e))?;
            let heuristic = result::get_matmul_algo_heuristic(self.handle, desc, a, b, c, c, pref);
            let _ = result::destroy_matmul_pref(pref);
            let heuristic = heuristic.map_err(|e| {
                lt_err(
                    &format!("no algorithm for a bf16 GEMM of m={m} n={n} k={k}"),
                    e,
                )
            })?;
            Ok(Plan {
                desc,
                a,
                b,
                c,
                algo: heuristic.algo,
            })
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
        check_len(m, n, k, w, x, y.len())?;
        let (yp, _gy) = y.device_ptr_mut(&self.stream);
        self.run(m, n, k, w, x, yp, false)
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
        check_len(m, n, k, w, x, y.len())?;
        let (yp, _gy) = y.device_ptr_mut(&self.stream);
        self.run(m, n, k, w, x, yp, true)
    }

    /// One `cublasLtMatmul` with the cached plan of the shape and mode;
    /// `yp` is C and D (beta 1 when accumulating, else 0).
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        m: usize,
        n: usize,
        k: usize,
        w: &CudaSlice<bf16>,
        x: &CudaSlice<bf16>,
        yp: cudarc::driver::sys::CUdeviceptr,
        acc_f32: bool,
    ) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| device_err("bind context", e))?;
        let key = (m as u64, n as u64, k as u64, acc_f32);
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        let p = match plans.entry(key) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => v.insert(self.plan(key.0, key.1, key.2, acc_f32)?),
        };
        let alpha = 1.0f32;
        let beta = if acc_f32 { 1.0f32 } else { 0.0f32 };
        let stream = &self.stream;
        let (wp, _gw) = w.device_ptr(stream);
        let (xp, _gx) = x.device_ptr(stream);
        let (ws, _gws) = self.workspace.device_ptr(stream);
        // SAFETY: the plan's layouts match the sizes checked by the caller;
        // the pointers are live device buffers; the workspace is
        // WORKSPACE_BYTES; C and D are the same buffer with the same layout
        // (in-place, which cuBLASLt allows).
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
                yp as *const c_void,
                p.c,
                yp as *mut c_void,
                p.c,
                &p.algo,
                ws as *mut c_void,
                WORKSPACE_BYTES,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| lt_err("matmul", e))
    }
}

/// Shape check of a GEMM's buffers (elements of w, x and y).
fn check_len(
    m: usize,
    n: usize,
    k: usize,
    w: &CudaSlice<bf16>,
    x: &CudaSlice<bf16>,
    y_len: usize,
) -> Result<()> {
    if w.len() < m * k || x.len() < k * n || y_len < m * n {
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
        let plans = self.plans.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, p) in plans.drain() {
            // SAFETY: created in `plan`, destroyed once here.
            unsafe {
                let _ = result::destroy_matrix_layout(p.a);
                let _ = result::destroy_matrix_layout(p.b);
                let _ = result::destroy_matrix_layout(p.c);
                let _ = result::destroy_matmul_desc(p.desc);
            }
        }
        // SAFETY: created in `new`, destroyed once here.
        unsafe {
            let _ = result::destroy_handle(self.handle);
        }
    }
}
