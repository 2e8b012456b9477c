//! Device memory for activations and scratch: a caching pool while the
//! engine warms up, one fixed arena once it serves.
//!
//! Every activation an op returns, and every scratch buffer a kernel needs,
//! comes from [`Pool::take`]; dropping the [`DeviceBuf`] gives it back.
//!
//! Two phases:
//! - **Warm-up** (from creation): a `take` reuses a freed buffer of the same
//!   rounded size, else allocates one with `cuMemAlloc`. Beside it, a shadow
//!   [`FirstFit`] replays every take and give-back on a virtual address
//!   space, so the pool knows how large an arena would have served all the
//!   work so far ([`Pool::arena_need`]).
//! - **Arena**, after [`Pool::freeze`] (the engine calls it after its
//!   profiling steps, before sizing the KV cache): the cached buffers are
//!   freed and one allocation of the measured need plus headroom replaces
//!   them. A `take` is then a first-fit range of the arena and a drop
//!   returns it; **no device memory is ever allocated again**. A take that
//!   does not fit is [`KernelError::OutOfMemory`]: the op, and so the one
//!   step that asked, fails, and every range it held comes back as its
//!   buffers drop.
//!
//! What lives across steps (a captured graph's input and output buffers,
//! the cuBLASLt workspace) comes from [`Pool::take_static`]: a plain
//! allocation outside the arena, freed on drop, made at start-up only.
//!
//! Safety of reuse: all work runs on one stream in order, so a range given
//! back while queued kernels still use it is safe to hand out again (the
//! next user's work runs after them). Graph replays write into arena ranges
//! that were live at capture time; that is safe because nothing holds an
//! arena buffer across a replay (the runner holds only static buffers
//! then), and the stream serializes everything.
//!
//! Sizes are rounded up to 512 bytes, which keeps every range aligned.

use super::device_err;
use crate::arena::FirstFit;
use crate::{KernelError, Result};
use cudarc::driver::{result, sys, CudaSlice, CudaStream};
use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

const GRANULE: usize = 512;
/// The arena holds the measured need times this, plus [`ARENA_SLACK`]:
/// steps of other shapes than the profiled ones may fragment it more.
const ARENA_HEADROOM: f64 = 1.25;
const ARENA_SLACK: usize = 4 << 20;

/// Where a handed-out range lives.
#[derive(Clone, Copy)]
enum Lease {
    /// A warm-up buffer, and its range in the shadow allocator.
    Cached { shadow: usize },
    /// A range of the arena at this offset.
    Arena { off: usize },
    /// A static allocation (freed on drop).
    Static,
}

enum Phase {
    Warmup {
        /// Free warm-up buffers by byte size.
        by_size: HashMap<usize, Vec<sys::CUdeviceptr>>,
        /// Every warm-up buffer (in use or free).
        all: Vec<sys::CUdeviceptr>,
        bytes: usize,
        shadow: FirstFit,
    },
    Arena {
        base: sys::CUdeviceptr,
        ranges: FirstFit,
    },
}

/// The pool; shared by every [`DeviceBuf`] it handed out.
pub(crate) struct Pool {
    stream: Arc<CudaStream>,
    phase: Mutex<Phase>,
}

impl Pool {
    pub fn new(stream: Arc<CudaStream>) -> Arc<Pool> {
        Arc::new(Pool {
            stream,
            phase: Mutex::new(Phase::Warmup {
                by_size: HashMap::new(),
                all: Vec::new(),
                bytes: 0,
                shadow: FirstFit::new(usize::MAX),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Phase> {
        // A panic while holding the lock leaves the phase consistent.
        self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `cuMemAlloc` of `bytes` (synchronous, never stream-ordered, so legal
    /// while a stream is being captured).
    fn device_alloc(&self, bytes: usize) -> Result<sys::CUdeviceptr> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| device_err("bind context", e))?;
        // SAFETY: a plain device allocation of `bytes` bytes.
        unsafe { result::malloc_sync(bytes) }
            .map_err(|e| device_err(&format!("allocate {bytes} bytes"), e))
    }

    /// A buffer of `len` elements of `T` (at least one), contents undefined.
    pub fn take<T>(self: &Arc<Self>, len: usize) -> Result<DeviceBuf<T>> {
        let len = len.max(1);
        let bytes = (len * std::mem::size_of::<T>()).div_ceil(GRANULE) * GRANULE;
        let mut phase = self.lock();
        let (ptr, lease) = match &mut *phase {
            Phase::Warmup {
                by_size,
                all,
                bytes: total,
                shadow,
            } => {
                let ptr = match by_size.get_mut(&bytes).and_then(|v| v.pop()) {
                    Some(p) => p,
                    None => {
                        let p = self.device_alloc(bytes)?;
                        all.push(p);
                        *total += bytes;
                        p
                    }
                };
                let shadow = shadow.alloc(bytes).unwrap_or(0);
                (ptr, Lease::Cached { shadow })
            }
            Phase::Arena { base, ranges } => {
                let off = ranges.alloc(bytes).ok_or_else(|| {
                    KernelError::OutOfMemory(format!(
                        "the activation arena ({} MiB, {} MiB in use) has no room for {bytes} \
                         bytes; lower --max-num-batched-tokens or --max-num-seqs",
                        ranges.limit() >> 20,
                        ranges.live() >> 20
                    ))
                })?;
                (*base + off as sys::CUdeviceptr, Lease::Arena { off })
            }
        };
        drop(phase);
        Ok(self.wrap(ptr, len, bytes, lease))
    }

    /// Takes back, as a buffer of `len` elements of `T`, the very memory at
    /// `ptr` that an earlier [`Self::take`] of the same length handed out
    /// and that has been given back since. How a captured graph's output
    /// (written by every replay) is read after a replay without being held
    /// in between: at replay nothing else is held, so the range is free.
    /// Errors if any of it is in use.
    pub fn claim<T>(self: &Arc<Self>, ptr: sys::CUdeviceptr, len: usize) -> Result<DeviceBuf<T>> {
        let len = len.max(1);
        let bytes = (len * std::mem::size_of::<T>()).div_ceil(GRANULE) * GRANULE;
        let busy = || {
            KernelError::Device(format!(
                "a graph's output ({bytes} bytes) is in use by other work at replay"
            ))
        };
        let mut phase = self.lock();
        let lease = match &mut *phase {
            Phase::Warmup {
                by_size, shadow, ..
            } => {
                let free = by_size.get_mut(&bytes).ok_or_else(busy)?;
                let i = free.iter().position(|&p| p == ptr).ok_or_else(busy)?;
                free.swap_remove(i);
                let shadow = shadow.alloc(bytes).unwrap_or(0);
                Lease::Cached { shadow }
            }
            Phase::Arena { base, ranges } => {
                let off = ptr.checked_sub(*base).ok_or_else(busy)? as usize;
                if !ranges.alloc_at(off, bytes) {
                    return Err(busy());
                }
                Lease::Arena { off }
            }
        };
        drop(phase);
        Ok(self.wrap(ptr, len, bytes, lease))
    }

    /// A static buffer of `len` elements of `T` (at least one), outside the
    /// arena: for what lives across steps. Allocates device memory, so only
    /// start-up code calls it.
    pub fn take_static<T>(self: &Arc<Self>, len: usize) -> Result<DeviceBuf<T>> {
        let len = len.max(1);
        let bytes = (len * std::mem::size_of::<T>()).div_ceil(GRANULE) * GRANULE;
        let ptr = self.device_alloc(bytes)?;
        Ok(self.wrap(ptr, len, bytes, Lease::Static))
    }

    fn wrap<T>(
        self: &Arc<Self>,
        ptr: sys::CUdeviceptr,
        len: usize,
        bytes: usize,
        lease: Lease,
    ) -> DeviceBuf<T> {
        // SAFETY: `ptr` holds `bytes >= len * size_of::<T>()` bytes owned by
        // the pool; the slice is leaked back on drop, never freed by cudarc.
        let slice = unsafe { self.stream.upgrade_device_ptr::<T>(ptr, len) };
        DeviceBuf {
            slice: ManuallyDrop::new(slice),
            home: Some((self.clone(), bytes, lease)),
        }
    }

    fn give_back(&self, bytes: usize, ptr: sys::CUdeviceptr, lease: Lease) {
        let mut phase = self.lock();
        match (&mut *phase, lease) {
            (
                Phase::Warmup {
                    by_size, shadow, ..
                },
                Lease::Cached { shadow: off },
            ) => {
                shadow.release(off, bytes);
                by_size.entry(bytes).or_default().push(ptr);
            }
            (Phase::Arena { ranges, .. }, Lease::Arena { off }) => ranges.release(off, bytes),
            // A static buffer, or a warm-up buffer outliving the warm-up:
            // its own allocation, freed once queued work is done.
            _ => {
                drop(phase);
                let _ = self.stream.synchronize();
                // SAFETY: allocated by `device_alloc` and given back once.
                let _ = unsafe { result::free_sync(ptr) };
            }
        }
    }

    /// Ends the warm-up: frees the cached buffers and allocates the arena
    /// (the measured need times [`ARENA_HEADROOM`] plus [`ARENA_SLACK`]).
    /// Every warm-up buffer must have been given back. Idempotent.
    pub fn freeze(&self) -> Result<usize> {
        let mut phase = self.lock();
        let Phase::Warmup {
            by_size,
            all,
            shadow,
            ..
        } = &mut *phase
        else {
            return Ok(self.arena_bytes_locked(&phase));
        };
        if shadow.live() != 0 {
            return Err(KernelError::Device(format!(
                "activation pool frozen with {} bytes still in use",
                shadow.live()
            )));
        }
        let need = shadow.peak();
        let size =
            ((need as f64 * ARENA_HEADROOM) as usize + ARENA_SLACK).div_ceil(2 << 20) * (2 << 20);
        // Queued kernels may still use cached memory: wait, then free.
        self.stream
            .synchronize()
            .map_err(|e| device_err("synchronize", e))?;
        for &p in all.iter() {
            // SAFETY: allocated by `device_alloc`, all free (shadow.live == 0).
            let _ = unsafe { result::free_sync(p) };
        }
        all.clear();
        by_size.clear();
        let base = self.device_alloc(size)?;
        *phase = Phase::Arena {
            base,
            ranges: FirstFit::new(size),
        };
        Ok(size)
    }

    fn arena_bytes_locked(&self, phase: &Phase) -> usize {
        match phase {
            Phase::Warmup { bytes, .. } => *bytes,
            Phase::Arena { ranges, .. } => ranges.limit(),
        }
    }

    /// Bytes of device memory the pool owns for activations (the warm-up
    /// buffers, in use or free; or the arena), static buffers not counted.
    pub fn reserved_bytes(&self) -> usize {
        self.arena_bytes_locked(&self.lock())
    }

    /// The arena size that would have served every take so far (warm-up),
    /// or the highest arena offset ever used (arena).
    pub fn arena_need(&self) -> usize {
        match &*self.lock() {
            Phase::Warmup { shadow, .. } => shadow.peak(),
            Phase::Arena { ranges, .. } => ranges.peak(),
        }
    }

    /// Whether [`Self::freeze`] has run.
    pub fn is_frozen(&self) -> bool {
        matches!(&*self.lock(), Phase::Arena { .. })
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Queued kernels may still use pooled memory: wait, then free.
        let _ = self.stream.synchronize();
        let phase = self.phase.get_mut().unwrap_or_else(|p| p.into_inner());
        let ptrs = match phase {
            Phase::Warmup { all, .. } => std::mem::take(all),
            Phase::Arena { base, .. } => vec![*base],
        };
        for p in ptrs {
            // SAFETY: allocated by `device_alloc`; no DeviceBuf outlives the
            // pool (each holds an Arc to it).
            let _ = unsafe { result::free_sync(p) };
        }
    }
}

/// A device buffer: from the [`Pool`] (given back on drop), or a plain
/// cudarc allocation (freed on drop). Derefs to the `CudaSlice`.
pub struct DeviceBuf<T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    home: Option<(Arc<Pool>, usize, Lease)>,
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
            Some((pool, bytes, lease)) => pool.give_back(bytes, slice.leak(), lease),
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
