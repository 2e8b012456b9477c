//! A caching pool of device buffers for activations and scratch.
//!
//! Every activation an op returns, and every scratch buffer a kernel needs,
//! comes from [`Pool::take`]: a buffer of the same byte size freed earlier is
//! reused, else a new one is allocated with `cuMemAlloc` (synchronous, never
//! stream-ordered, so it is legal while a stream is being captured into a
//! CUDA graph). Dropping a [`DeviceBuf`] gives its memory back to the pool,
//! never to the driver; the pool frees everything when the backend is dropped.
//!
//! Guarantees:
//! - After the first step of a given shape, steps of that shape allocate no
//!   device memory (the sizes repeat, so every `take` is a hit).
//! - All work runs on one stream in order, so a buffer given back while
//!   queued kernels still use it is safe to hand out again: the next user's
//!   kernels run after them.
//! - Graph replays write into buffers that were pooled at capture time; that
//!   is safe because no pooled buffer is held across a replay (the runner
//!   holds only static buffers then), and the stream serializes everything.
//!
//! Sizes are rounded up to 512 bytes so tensors of nearby shapes share
//! buffers; the pool's total is what `cuMemGetInfo` reports as used, so the
//! KV cache is sized after a profiling step has filled it.

use super::device_err;
use crate::Result;
use cudarc::driver::{result, sys, CudaSlice, CudaStream, LaunchArgs, PushKernelArg};
use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

const GRANULE: usize = 512;

/// Free buffers by byte size, and the total the pool owns.
#[derive(Default)]
struct Free {
    by_size: HashMap<usize, Vec<sys::CUdeviceptr>>,
    all: Vec<sys::CUdeviceptr>,
    bytes: usize,
}

/// The pool; shared by every [`DeviceBuf`] it handed out.
pub(crate) struct Pool {
    stream: Arc<CudaStream>,
    free: Mutex<Free>,
}

impl Pool {
    pub fn new(stream: Arc<CudaStream>) -> Arc<Pool> {
        Arc::new(Pool {
            stream,
            free: Mutex::new(Free::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Free> {
        // A panic while holding the lock leaves the lists consistent.
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer of `len` elements of `T` (at least one), contents undefined.
    pub fn take<T>(self: &Arc<Self>, len: usize) -> Result<DeviceBuf<T>> {
        let len = len.max(1);
        let bytes = (len * std::mem::size_of::<T>()).div_ceil(GRANULE) * GRANULE;
        let reused = self.lock().by_size.get_mut(&bytes).and_then(|v| v.pop());
        let ptr = match reused {
            Some(p) => p,
            None => {
                self.stream
                    .context()
                    .bind_to_thread()
                    .map_err(|e| device_err("bind context", e))?;
                // SAFETY: a plain device allocation of `bytes` bytes.
                let p = unsafe { result::malloc_sync(bytes) }
                    .map_err(|e| device_err(&format!("allocate {bytes} bytes"), e))?;
                let mut f = self.lock();
                f.all.push(p);
                f.bytes += bytes;
                p
            }
        };
        // SAFETY: `ptr` holds `bytes >= len * size_of::<T>()` bytes and is
        // owned by the pool; the slice is leaked back on drop, never freed.
        let slice = unsafe { self.stream.upgrade_device_ptr::<T>(ptr, len) };
        Ok(DeviceBuf {
            slice: ManuallyDrop::new(slice),
            home: Some((self.clone(), bytes)),
        })
    }

    fn give_back(&self, bytes: usize, ptr: sys::CUdeviceptr) {
        self.lock().by_size.entry(bytes).or_default().push(ptr);
    }

    /// Bytes of device memory the pool owns (in use or free).
    pub fn reserved_bytes(&self) -> usize {
        self.lock().bytes
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Queued kernels may still use pooled memory: wait, then free.
        let _ = self.stream.synchronize();
        let f = self.lock();
        for &p in &f.all {
            // SAFETY: allocated by `malloc_sync` above; no DeviceBuf outlives
            // the pool (each holds an Arc to it).
            let _ = unsafe { result::free_sync(p) };
        }
    }
}

/// A device buffer: from the [`Pool`] (given back on drop), or a plain
/// cudarc allocation (freed on drop). Derefs to the `CudaSlice`.
pub struct DeviceBuf<T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    home: Option<(Arc<Pool>, usize)>,
}

impl<T> DeviceBuf<T> {
    /// Wraps a cudarc allocation the pool does not own.
    pub(crate) fn unpooled(slice: CudaSlice<T>) -> Self {
        DeviceBuf {
            slice: ManuallyDrop::new(slice),
            home: None,
        }
    }
}

impl<T> Drop for DeviceBuf<T> {
    fn drop(&mut self) {
        // SAFETY: `slice` is not used after this.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        match self.home.take() {
            Some((pool, bytes)) => pool.give_back(bytes, slice.leak()),
            None => drop(slice),
        }
    }
}

impl<T> Deref for DeviceBuf<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.slice
    }
}

impl<T> DerefMut for DeviceBuf<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }
}

// Kernel arguments: a DeviceBuf passes as its slice.
unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b DeviceBuf<T>> for LaunchArgs<'a> {
    fn arg(&mut self, arg: &'b DeviceBuf<T>) -> &mut Self {
        self.arg(&*arg.slice)
    }
}

unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b mut DeviceBuf<T>> for LaunchArgs<'a> {
    fn arg(&mut self, arg: &'b mut DeviceBuf<T>) -> &mut Self {
        self.arg(&mut *arg.slice)
    }
}
