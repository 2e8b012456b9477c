//! The one place a kernel of ours is launched: [`Launch`], built by
//! [`Device::launch`], collects the arguments and queues the kernel with the
//! driver's `cuLaunchKernelEx`, so launch attributes can be set.
//!
//! Programmatic dependent launch (PDL): where [`Device::pdl`] holds
//! (compute capability 9.0 and newer, see [`pdl_supported`]; [`PDL_ENV`]
//! turns it off), every launch carries
//! `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`, so a kernel's
//! blocks may be scheduled while the kernel before it still runs,
//! hiding the launch gap between small kernels (batch-1 decode). That is
//! sound because every kernel of ours opens with `PDL_ENTRY()` (the
//! kernels' prelude), which waits for the previous kernel to complete and
//! its writes to be visible before anything is read (a host-side test
//! checks every kernel body). cuBLASLt's kernels launch without the
//! attribute, so they start after the kernel before them completes, and
//! ours after them still wait. Under stream capture the attribute becomes
//! a programmatic edge of the graph (CUDA 12.3 and newer), so decode
//! graphs keep the overlap.
//!
//! Every launch site reads
//! `b.dev.launch("name")?.out(&mut y).arg(&x).arg(&n).run(cfg)?`: the kernel
//! by name, its arguments in the order of its `extern "C"` signature
//! (`out` for buffers it writes, `arg` for the rest), the grid.
//! The launch itself is the one `unsafe` launch of the crate; what makes it
//! sound is the launch site's part of the contract (see [`Launch::run`]).
//!
//! What is checked at run time: the argument count, and each argument's
//! byte size against the kernel's parameter list as the driver reports it
//! (`cuFuncGetParamInfo`, read once when the module loads); a mismatch is a
//! [`KernelError::Device`] naming the kernel, never a launch. Device
//! pointers are copied out of their buffers when passed, and the borrow of
//! every argument lasts until the launch, so no buffer can be dropped in
//! between.
//!
//! Costs: no allocation; up to [`MAX_ARGS`] arguments of 8 bytes on the
//! stack, two map lookups and one driver call per launch.

use super::device::Device;
use super::device_err;
use super::pool::DeviceBuf;
use super::storage::Act;
use crate::{KernelError, Result};
use cudarc::driver::{
    sys, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, LaunchConfig,
};
use std::ffi::c_void;
use std::marker::PhantomData;

/// Most arguments a kernel of ours takes.
pub(crate) const MAX_ARGS: usize = 32;

/// One argument's bytes as the driver reads them (a device pointer or a
/// scalar of up to 8 bytes, in native byte order from the first byte).
#[derive(Clone, Copy, Default)]
#[repr(C, align(8))]
pub(crate) struct Word([u8; 8]);

impl Word {
    fn of(bytes: &[u8]) -> Word {
        let mut w = [0u8; 8];
        w[..bytes.len()].copy_from_slice(bytes);
        Word(w)
    }
}

/// A value a kernel takes: a device buffer (passed as its address) or a
/// scalar. `word` gives its bytes and their count.
pub(crate) trait KernelArg {
    fn word(&self, stream: &CudaStream) -> (Word, u8);
}

macro_rules! scalar_arg {
    ($($t:ty),*) => {$(
        impl KernelArg for $t {
            fn word(&self, _: &CudaStream) -> (Word, u8) {
                (Word::of(&self.to_ne_bytes()), std::mem::size_of::<$t>() as u8)
            }
        }
    )*};
}
scalar_arg!(i32, u32, i64, u64, f32, u16, u8);

/// A device address: the argument of a pointer parameter.
fn address(p: sys::CUdeviceptr) -> (Word, u8) {
    (Word::of(&p.to_ne_bytes()), 8)
}

// Device pointers: the stream's event tracking is off (`Device::open`), so
// the guard `device_ptr` returns does nothing and may drop at once.
impl<T> KernelArg for CudaSlice<T> {
    fn word(&self, stream: &CudaStream) -> (Word, u8) {
        address(self.device_ptr(stream).0)
    }
}

impl<T> KernelArg for CudaView<'_, T> {
    fn word(&self, stream: &CudaStream) -> (Word, u8) {
        address(self.device_ptr(stream).0)
    }
}

impl<T> KernelArg for CudaViewMut<'_, T> {
    fn word(&self, stream: &CudaStream) -> (Word, u8) {
        address(self.device_ptr(stream).0)
    }
}

impl<T> KernelArg for DeviceBuf<T> {
    fn word(&self, stream: &CudaStream) -> (Word, u8) {
        (**self).word(stream)
    }
}

/// An activation passes as its buffer, whichever its type (the launch site
/// picks the kernel that matches it).
impl KernelArg for Act {
    fn word(&self, stream: &CudaStream) -> (Word, u8) {
        match self {
            Act::Bf16(d) => d.word(stream),
            Act::F32(d) => d.word(stream),
        }
    }
}

/// The parameter sizes of `f` in bytes, as the driver reports them, or
/// `None` where it cannot (the launch then checks only the count limit).
pub(crate) fn param_sizes(f: &CudaFunction) -> Option<Vec<u8>> {
    let mut sizes = Vec::new();
    for i in 0..=MAX_ARGS {
        let (mut off, mut size) = (0usize, 0usize);
        // SAFETY: a query on a loaded function into two locals.
        let r = unsafe { sys::cuFuncGetParamInfo(f.cu_function(), i, &mut off, &mut size) };
        match r {
            sys::CUresult::CUDA_SUCCESS => sizes.push(u8::try_from(size).ok()?),
            // Past the last parameter (every kernel of ours has one).
            sys::CUresult::CUDA_ERROR_INVALID_VALUE if !sizes.is_empty() => return Some(sizes),
            _ => return None,
        }
    }
    // More parameters than a launch can pass: every launch of it fails.
    Some(sizes)
}

/// The environment variable that turns programmatic dependent launch off
/// (`off`, `0` or `false`; `on`, `1`, `true` or `auto` leaves it on where
/// supported, the default; any other value is an error).
pub const PDL_ENV: &str = "PAGODA_PDL";

/// Whether the device and driver take programmatic dependent launch inside
/// graphs: compute capability 9.0 and newer, and a driver that captures it
/// into graphs as programmatic edges (CUDA 12.3, version 12030, and newer).
pub(crate) fn pdl_supported(cc: (i32, i32), driver_version: i32) -> bool {
    cc.0 >= 9 && driver_version >= 12030
}

/// Whether `env` (the value of [`PDL_ENV`], if set) leaves PDL on.
pub(crate) fn pdl_env_on(env: Option<&str>) -> Result<bool> {
    crate::knob::parse(PDL_ENV, env, &crate::knob::on_off_names(true), true)
}

/// The driver's CUDA version (e.g. 13000 for 13.0), or 0 if it cannot say.
pub(crate) fn driver_version() -> i32 {
    let mut v = 0;
    // SAFETY: a query into a local.
    let r = unsafe { sys::cuDriverGetVersion(&mut v) };
    if r == sys::CUresult::CUDA_SUCCESS {
        v
    } else {
        0
    }
}

/// Why a launch's arguments do not fit the kernel's parameters, if they do
/// not: `got` the sizes passed, `want` the kernel's (if known).
fn mismatch(got: &[u8], count: usize, want: Option<&[u8]>) -> Option<String> {
    if count > MAX_ARGS {
        return Some(format!("{count} arguments, more than {MAX_ARGS}"));
    }
    match want {
        Some(w) if w != got => Some(format!(
            "arguments of {got:?} bytes, the kernel's parameters are {w:?} bytes"
        )),
        _ => None,
    }
}

/// One kernel launch being put together: see the module docs.
pub(crate) struct Launch<'a> {
    dev: &'a Device,
    name: &'a str,
    func: sys::CUfunction,
    params: Option<&'a [u8]>,
    words: [Word; MAX_ARGS],
    sizes: [u8; MAX_ARGS],
    count: usize,
    /// Every argument stays borrowed until the launch.
    _args: PhantomData<&'a ()>,
}

impl Device {
    /// Starts a launch of the loaded kernel `name`.
    pub fn launch<'a>(&'a self, name: &'a str) -> Result<Launch<'a>> {
        let func = self.kernel(name)?.cu_function();
        Ok(Launch {
            dev: self,
            name,
            func,
            params: self.params.get(name).map(|p| p.as_slice()),
            words: [Word::default(); MAX_ARGS],
            sizes: [0; MAX_ARGS],
            count: 0,
            _args: PhantomData,
        })
    }
}

impl<'a> Launch<'a> {
    /// Appends the next argument (a buffer the kernel reads, or a scalar by
    /// reference to its value).
    pub fn arg<A: KernelArg + ?Sized>(&mut self, a: &'a A) -> &mut Self {
        if self.count < MAX_ARGS {
            let (w, s) = a.word(&self.dev.stream);
            self.words[self.count] = w;
            self.sizes[self.count] = s;
        }
        self.count += 1;
        self
    }

    /// Appends the next argument, a buffer the kernel writes (the same as
    /// [`Self::arg`]; the exclusive borrow says so at the launch site).
    pub fn out<A: KernelArg + ?Sized>(&mut self, a: &'a mut A) -> &mut Self {
        self.arg(a)
    }

    /// Queues the kernel on the device's stream with grid `cfg`.
    ///
    /// The launch site guarantees, beyond what is checked here (count and
    /// sizes, see the module docs):
    /// - the arguments match the kernel's `extern "C"` signature in order
    ///   and type (a pointer where it takes a pointer, of the element type
    ///   it reads; the scalar type it declares);
    /// - every buffer passed is live (borrowed until here, and freed only
    ///   after the stream's queued work, see [`super::pool`]) and large
    ///   enough for every index the kernel reads or writes at this grid,
    ///   checked on the host before the launch;
    /// - the buffers belong to this device's context and are used on its
    ///   one stream only, so stream order serializes every access to them.
    pub fn run(&mut self, cfg: LaunchConfig) -> Result<()> {
        let n = self.count.min(MAX_ARGS);
        if let Some(why) = mismatch(&self.sizes[..n], self.count, self.params) {
            return Err(KernelError::Device(format!("kernel {}: {why}", self.name)));
        }
        let mut ptrs = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
        for (p, w) in ptrs.iter_mut().zip(self.words.iter_mut()).take(n) {
            *p = (w as *mut Word).cast();
        }
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue { pad: [0; 64] },
        };
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.dev.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(self.dev.pdl()),
        };
        self.dev
            .ctx
            .bind_to_thread()
            .map_err(|e| device_err(self.name, e))?;
        // SAFETY: `func` is a kernel of the module this device holds, on the
        // context just bound; `ptrs[..n]` point at `words`, which live until
        // the call returns (the driver copies the arguments at launch), and
        // their count and sizes match the kernel's parameters (checked
        // above); `config` and `attr` live across the call. Type, order,
        // liveness and bounds of the buffers are the launch site's part of
        // the contract documented on this function; with it, the kernel
        // reads and writes only live memory of this stream.
        unsafe {
            sys::cuLaunchKernelEx(&config, self.func, ptrs.as_mut_ptr(), std::ptr::null_mut())
        }
        .result()
        .map_err(|e| device_err(self.name, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_keep_their_bytes_from_the_first() {
        let (w, n) = (Word::of(&7i32.to_ne_bytes()), 4);
        assert_eq!(i32::from_ne_bytes(w.0[..n].try_into().unwrap()), 7);
        assert_eq!(&w.0[4..], &[0; 4]);
        let w = Word::of(&(-1.5f32).to_ne_bytes());
        assert_eq!(f32::from_ne_bytes(w.0[..4].try_into().unwrap()), -1.5);
        let w = Word::of(&u64::MAX.to_ne_bytes());
        assert_eq!(w.0, [0xff; 8]);
        assert_eq!(std::mem::align_of::<Word>(), 8);
    }

    #[test]
    fn mismatched_arguments_are_named() {
        assert_eq!(mismatch(&[8, 4], 2, Some(&[8, 4])), None);
        assert_eq!(mismatch(&[8, 4], 2, None), None);
        let m = mismatch(&[8, 4], 2, Some(&[8, 8])).expect("size");
        assert!(m.contains("[8, 4]") && m.contains("[8, 8]"), "{m}");
        assert!(mismatch(&[8], 1, Some(&[8, 4])).is_some());
        assert!(mismatch(&[8; MAX_ARGS], MAX_ARGS + 1, None).is_some());
    }

    #[test]
    fn pdl_only_on_hopper_and_newer_with_a_capturing_driver() {
        assert!(pdl_supported((9, 0), 13000));
        assert!(pdl_supported((10, 0), 12030));
        assert!(pdl_supported((12, 1), 13000));
        // Ampere and Ada have no programmatic dependent launch.
        assert!(!pdl_supported((8, 0), 13000));
        assert!(!pdl_supported((8, 9), 13000));
        // Drivers before CUDA 12.3 do not capture it into graphs.
        assert!(!pdl_supported((9, 0), 12020));
        assert!(!pdl_supported((9, 0), 0));
    }

    #[test]
    fn pdl_env_turns_it_off_only_when_asked() {
        for on in [None, Some("on"), Some(""), Some("1"), Some("auto")] {
            assert!(pdl_env_on(on).unwrap(), "{on:?}");
        }
        for off in ["off", "OFF", " 0", "false", "False "] {
            assert!(!pdl_env_on(Some(off)).unwrap(), "{off}");
        }
        assert!(pdl_env_on(Some("of")).is_err());
    }
}
