//! Opening a CUDA device: the driver context, its compute stream and the kernel
//! modules, one per compile unit, with every kernel looked up by name in
//! the module that holds it (the cuBLASLt handle lives in
//! [`super::blaslt`]).
//!
//! cudarc loads libcuda, libnvrtc and libcublasLt lazily and panics when one is
//! missing; [`Device::open`] first asks whether each library can be opened,
//! then runs the whole setup under `catch_unwind`, so a machine without CUDA
//! gets a [`KernelError::Device`] naming what is missing, never a panic.
//! Programmatic dependent launch (see [`super::launch`]) is decided here:
//! on where the device and driver support it and [`launch::PDL_ENV`] does
//! not turn it off, after one probe launch with the attribute succeeded.
//!
//! Costs: context creation (~0.1-0.5 s) and, on a cold kernel cache, the
//! NVRTC compiles of the missing units, side by side (see
//! [`super::compile`]); [`KernelStartup`] records what they took.

use super::{compile, launch};
use crate::{KernelError, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
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
    /// Streaming multiprocessors (the decode attention sizes its grid by them).
    pub sms: usize,
    /// What opening took, for the start-up report.
    pub startup: KernelStartup,
}

/// Wall times of opening the device, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KernelStartup {
    /// Driver context and stream creation.
    pub context_s: f64,
    /// Reading the cached CUBINs and compiling the missing units (wall).
    pub compile_s: f64,
    /// The slowest single unit's compile (0 when all were cached).
    pub slowest_unit_s: f64,
    /// Units compiled now, and units read from the disk cache.
    pub units_compiled: usize,
    pub units_cached: usize,
    /// Loading the modules and looking every kernel up.
    pub load_s: f64,
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
        let t = std::time::Instant::now();
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| err(format!("cannot open CUDA device {ordinal}: {e:?}")))?;
        // One compute stream: cudarc's cross-stream event tracking is not
        // needed. SAFETY: all work of this context is submitted to `stream`
        // below, but for the token mask uploads, whose stream orders itself
        // against this one with events of its own (`token_masks.rs`).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(|e| err(format!("cannot create a CUDA stream: {e:?}")))?;
        let cc = ctx
            .compute_capability()
            .map_err(|e| err(format!("cannot read the compute capability: {e:?}")))?;
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| err(format!("cannot read the multiprocessor count: {e:?}")))?
            .max(1) as usize;
        let context_s = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        let units = compile::load_or_compile_all(cc)
            .map_err(|e| err(format!("cannot compile the CUDA kernels: {e}")))?;
        let compile_s = t.elapsed().as_secs_f64();
        let mut startup = KernelStartup {
            context_s,
            compile_s,
            slowest_unit_s: units.iter().map(|u| u.compile_s).fold(0.0, f64::max),
            units_compiled: units.iter().filter(|u| !u.cached).count(),
            units_cached: units.iter().filter(|u| u.cached).count(),
            load_s: 0.0,
        };
        let t = std::time::Instant::now();
        let mut modules = Vec::with_capacity(units.len());
        for u in units {
            let m = ctx
                .load_module(Ptx::from_binary(u.cubin))
                .map_err(|e| err(format!("cannot load the CUDA kernels of {}: {e:?}", u.name)))?;
            modules.push((u.name, m));
        }
        let kernels = find_kernels(&modules, compile::KERNELS)?;
        let params = kernels
            .iter()
            .filter_map(|(&k, f)| launch::param_sizes(f).map(|p| (k, p)))
            .collect();
        startup.load_s = t.elapsed().as_secs_f64();
        super::attention_prefill::configure(&kernels)?;
        super::attention_prefill_mma::configure(&kernels)?;
        super::moe_stream::configure(&kernels)?;
        super::moe::configure(&kernels)?;
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
            sms,
            startup,
        };
        let env = std::env::var(launch::PDL_ENV).ok();
        let wanted = launch::pdl_env_on(env.as_deref())? && pdl_supported;
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

/// Each of `names` from the module that holds it: the first module, in
/// unit order, that has it (the compile tests check that exactly one unit
/// declares each); a name no module has is an error.
fn find_kernels(
    modules: &[(&str, Arc<CudaModule>)],
    names: &[&'static str],
) -> Result<HashMap<&'static str, CudaFunction>> {
    let mut kernels = HashMap::with_capacity(names.len());
    for &k in names {
        let f = modules
            .iter()
            .find_map(|(_, m)| m.load_function(k).ok())
            .ok_or_else(|| err(format!("kernel {k} missing from every module")))?;
        kernels.insert(k, f);
    }
    Ok(kernels)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a GPU: every kernel is in exactly one of the loaded modules (a
    /// machine without CUDA skips, see `testing`).
    #[test]
    fn every_kernel_is_in_exactly_one_loaded_module() {
        let Some(_) = super::super::testing::gpu() else {
            return;
        };
        let dev = Device::open(0).expect("device opens");
        assert_eq!(dev.kernels.len(), compile::KERNELS.len());
        assert!(dev.startup.units_compiled + dev.startup.units_cached > 1);
        let ctx = &dev.ctx;
        let units = compile::load_or_compile_all(ctx.compute_capability().unwrap()).unwrap();
        let modules: Vec<_> = units
            .iter()
            .map(|u| ctx.load_module(Ptx::from_binary(u.cubin.clone())).unwrap())
            .collect();
        for &k in compile::KERNELS {
            let n = modules
                .iter()
                .filter(|m| m.load_function(k).is_ok())
                .count();
            assert_eq!(n, 1, "{k} is in {n} modules");
        }
    }
}
