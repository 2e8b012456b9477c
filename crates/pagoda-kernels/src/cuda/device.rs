//! Opening a CUDA device: the driver context, one stream and the kernel
//! module (the cuBLASLt handle lives in [`super::blaslt`]).
//!
//! cudarc loads libcuda, libnvrtc and libcublasLt lazily and panics when one is
//! missing; [`Device::open`] first asks whether each library can be opened,
//! then runs the whole setup under `catch_unwind`, so a machine without CUDA
//! gets a [`KernelError::Device`] naming what is missing, never a panic.
//! Programmatic dependent launch (see [`super::launch`]) is decided here:
//! on where the device and driver support it and [`launch::PDL_ENV`] does
//! not turn it off, after one probe launch with the attribute succeeded.
//!
//! Costs: context creation (~0.1-0.5 s) and, on a cold kernel cache, one
//! NVRTC compile (see [`super::compile`]).

use super::{compile, launch};
use crate::{KernelError, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// An open device with everything the ops launch on.
pub(crate) struct Device {
    /// Keeps the context alive for the stream, handle and module; bound to
    /// the launching thread by each launch.
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub kernels: HashMap<&'static str, CudaFunction>,
    /// Each kernel's parameter sizes in bytes, where the driver reports
    /// them (see [`super::launch`]).
    pub params: HashMap<&'static str, Vec<u8>>,
    /// The device and driver take programmatic dependent launch (see
    /// [`launch::pdl_supported`]), and a launch with it succeeded.
    pdl_supported: bool,
    /// Launches carry the programmatic-dependent-launch attribute.
    pdl: AtomicBool,
    pub name: String,
}

fn err(detail: String) -> KernelError {
    KernelError::Device(detail)
}

/// Checks that the three libraries can be opened, naming the first that cannot.
fn check_libraries() -> Result<()> {
    // SAFETY: these only try to dlopen the candidate names.
    let present = unsafe {
        [
            (
                cudarc::driver::sys::is_culib_present(),
                "libcuda.so (the NVIDIA driver)",
            ),
            (cudarc::nvrtc::sys::is_culib_present(), "libnvrtc (CUDA 13)"),
            (
                cudarc::cublaslt::sys::is_culib_present(),
                "libcublasLt (CUDA 13)",
            ),
        ]
    };
    for (ok, what) in present {
        if !ok {
            return Err(err(format!(
                "CUDA is not available: cannot open {what}; install the driver and the CUDA 13 \
                 runtime libraries, or add their directory to LD_LIBRARY_PATH"
            )));
        }
    }
    Ok(())
}

impl Device {
    /// Opens device `ordinal` (see the module docs for failure behaviour).
    pub fn open(ordinal: usize) -> Result<Device> {
        check_libraries()?;
        match std::panic::catch_unwind(|| Self::open_inner(ordinal)) {
            Ok(r) => r,
            Err(payload) => {
                let msg = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".into());
                Err(err(format!(
                    "CUDA is not available: loading the CUDA libraries failed: {msg}"
                )))
            }
        }
    }

    fn open_inner(ordinal: usize) -> Result<Device> {
        let count = CudaContext::device_count()
            .map_err(|e| err(format!("CUDA is not available: no usable device ({e:?})")))?;
        if ordinal >= count.max(0) as usize {
            return Err(err(format!(
                "CUDA device {ordinal} does not exist ({count} device(s) found)"
            )));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| err(format!("cannot open CUDA device {ordinal}: {e:?}")))?;
        // One stream only: cudarc's cross-stream event tracking is not needed.
        // SAFETY: all work of this context is submitted to `stream` below.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(|e| err(format!("cannot create a CUDA stream: {e:?}")))?;
        let cc = ctx
            .compute_capability()
            .map_err(|e| err(format!("cannot read the compute capability: {e:?}")))?;
        let cubin = compile::load_or_compile(cc)
            .map_err(|e| err(format!("cannot compile the CUDA kernels: {e}")))?;
        let module = ctx
            .load_module(Ptx::from_binary(cubin))
            .map_err(|e| err(format!("cannot load the CUDA kernels: {e:?}")))?;
        let mut kernels = HashMap::new();
        let mut params = HashMap::new();
        for &k in compile::KERNELS {
            let f = module
                .load_function(k)
                .map_err(|e| err(format!("kernel {k} missing from the module: {e:?}")))?;
            if let Some(p) = launch::param_sizes(&f) {
                params.insert(k, p);
            }
            kernels.insert(k, f);
        }
        super::attention_prefill::configure(&kernels)?;
        super::attention_prefill_mma::configure(&kernels)?;
        let gpu = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let name = format!("cuda:{ordinal} ({gpu}, sm_{}{}, bf16)", cc.0, cc.1);
        let pdl_supported = launch::pdl_supported(cc, launch::driver_version());
        let dev = Device {
            ctx,
            stream,
            kernels,
            params,
            pdl_supported,
            pdl: AtomicBool::new(false),
            name,
        };
        let env = std::env::var(launch::PDL_ENV).ok();
        let wanted = pdl_supported && launch::pdl_env_on(env.as_deref());
        if wanted && !dev.probe_pdl() {
            return Ok(Device {
                pdl_supported: false,
                ..dev
            });
        }
        dev.pdl.store(wanted, Ordering::Relaxed);
        Ok(dev)
    }

    /// Whether the driver takes a launch with the attribute: one empty
    /// `fill_u32` (no element written) launched with it, then a wait.
    fn probe_pdl(&self) -> bool {
        self.pdl.store(true, Ordering::Relaxed);
        let (null, bits, n) = (0u64, 0u32, 0i64);
        let cfg = cudarc::driver::LaunchConfig::for_num_elems(1);
        let ok = self
            .launch("fill_u32")
            .and_then(|mut l| l.arg(&null).arg(&bits).arg(&n).run(cfg))
            .is_ok()
            && self.stream.synchronize().is_ok();
        self.pdl.store(false, Ordering::Relaxed);
        ok
    }

    /// Whether launches carry the programmatic-dependent-launch attribute.
    pub fn pdl(&self) -> bool {
        self.pdl.load(Ordering::Relaxed)
    }

    /// Turns programmatic dependent launch on or off where the device and
    /// driver support it (always off elsewhere); returns whether it is on.
    /// Launches queued (or graphs captured) before keep their setting.
    pub fn set_pdl(&self, on: bool) -> bool {
        let on = on && self.pdl_supported;
        self.pdl.store(on, Ordering::Relaxed);
        on
    }

    /// A loaded kernel by name.
    pub fn kernel(&self, name: &str) -> Result<&CudaFunction> {
        self.kernels
            .get(name)
            .ok_or_else(|| err(format!("kernel {name} is not loaded")))
    }
}
