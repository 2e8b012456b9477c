//! The CUDA backend: bf16 weights and activations with f32 accumulation and
//! an f32 residual stream, a bf16 (or FP8 E4M3, `with_kv_cache_dtype`)
//! paged KV cache, cuBLASLt GEMMs and
//! NVRTC-compiled kernels for everything else.
//!
//! Built behind the `cuda` feature. The binary links no CUDA library: cudarc
//! opens libcuda, libnvrtc and libcublasLt at run time, so [`CudaBackend::new`]
//! on a machine without them returns [`KernelError::Device`] saying which one
//! is missing (cudarc's panic on a missing library is caught and turned into
//! that error).
//!
//! All work goes to one non-blocking stream in submission order; ops return as
//! soon as their work is queued, and only `tensor_to_host` (and the test
//! helpers) wait for the device. A kernel fault therefore surfaces as an error
//! of a later synchronizing call.
//!
//! Files: [`device`] (context, libraries, kernel module), [`compile`] (NVRTC
//! and its disk cache), [`blaslt`] (cuBLASLt GEMMs; each plan's algorithm
//! chosen in [`blaslt_tune`], cached on disk by [`blaslt_cache`]), [`storage`] (types, the packed step), [`ops`] (linear,
//! norms, elementwise ops; the small-row GEMV choice in [`gemv`]; the fused
//! q/k norm and rope in [`qk_norm_rope`]), [`attention`] (store_kv, copy_blocks, paged
//! attention; the kernel choice in [`attention_path`], the split-K decode,
//! grouped prefill and tiled prefill kernels' launches in `attention_decode`,
//! `attention_prefill_mma` and `attention_prefill`), [`moe`] (mixture-of-experts routing and expert
//! MLPs), [`fp8_linear`] and [`fp8_path`] (FP8 weights' linear layers and
//! the GEMM path the device runs them on), [`testing`] (helpers of the CUDA test binaries); the kernels
//! themselves are in `kernels/*.cu`.

mod attention;
mod attention_decode;
mod attention_path;
mod attention_prefill;
mod attention_prefill_mma;
mod blaslt;
mod blaslt_cache;
mod blaslt_tune;
mod compile;
mod device;
mod fp8_linear;
mod fp8_path;
mod gemv;
mod graph;
mod launch;
mod logit_adjust;
mod moe;
mod moe_stream;
mod ops;
mod pool;
mod qk_norm_rope;
mod sampling;
mod sampling_extras;
mod storage;
pub mod testing;
mod token_masks;

pub use attention_decode::{DECODE_KERNEL_ENV, DECODE_MERGE_ENV, PARTITION_ENV, PARTITION_SIZES};
pub use attention_path::{
    attention_kernel, prefer_tiled, AttentionKernel, FAST_HEAD_DIMS, PREFILL_KERNEL_ENV,
};
pub use blaslt_cache::{GemmTuning, GEMM_TUNING_ENV};
pub use blaslt_tune::GemmTuningStats;
pub use device::KernelStartup;
pub use fp8_path::Fp8GemmPath;
pub use gemv::{GemvKernel, SmallLinear, DECODE_FUSION_ENV, LARGE_WEIGHT_BYTES, SMALL_LINEAR_ENV};
pub use graph::CudaGraphRunner;
pub use launch::PDL_ENV;
pub use moe::{CudaRoutes, MoePath, GEMV_MAX_ROWS as MOE_GEMV_MAX_ROWS};
pub use moe_stream::MOE_KERNEL_ENV;
pub use pool::DeviceBuf;
pub use storage::{Act, CudaKvCache, CudaStep, CudaTensor, CudaWeight, WeightBuf};

use crate::{
    AttentionParams, Backend, DeviceSamples, ForwardContext, HostTensor, KernelError, KvCacheShape,
    Result, RopeStyle, SamplingOptions, TokenMasks,
};
use half::bf16;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// How to build a [`CudaBackend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CudaOptions {
    /// CUDA device ordinal.
    pub device: usize,
}

/// The CUDA implementation of [`crate::Backend`].
pub struct CudaBackend {
    dev: device::Device,
    /// Activations and scratch (see [`pool`]).
    pool: std::sync::Arc<pool::Pool>,
    /// GEMMs of more than a few rows (see [`blaslt`]).
    lt: blaslt::LtGemm,
    /// When set, fresh outputs are filled with NaN before the op writes them
    /// (tests use it to catch elements an op leaves unwritten).
    poison: AtomicBool,
    /// Host waits for the device so far (see [`CudaBackend::host_syncs`]).
    syncs: AtomicU64,
    /// Prefill steps take the tiled kernel instead of the grouped one (see
    /// [`CudaBackend::force_tiled_prefill`]).
    tiled_prefill: AtomicBool,
    /// FP8-cache decode attention takes the CUDA-core kernel instead of the
    /// tensor-core one (see [`CudaBackend::force_core_decode`]).
    core_decode: AtomicBool,
    /// Tokens per decode-attention partition, or 0 to choose by the step's
    /// shape (see [`CudaBackend::set_decode_partition`]).
    decode_partition: AtomicUsize,
    /// The most f32 partials a split decode step took while the step
    /// memory warmed up (see [`attention_decode`]).
    split_floats_seen: AtomicUsize,
    /// The decode attention's merge counters, zero between launches (see
    /// [`attention_decode`]); never read or written by the host after
    /// they are zeroed here.
    decode_counters: cudarc::driver::CudaSlice<u32>,
    /// Split decode attention merges in a second launch instead of in the
    /// partition kernel's last block (see
    /// [`CudaBackend::set_separate_decode_merge`]).
    separate_decode_merge: AtomicBool,
    /// The small-row linear path ([`SmallLinear`] as `to_u8`; see
    /// [`CudaBackend::set_small_linear`]).
    small_linear: AtomicU8,
    /// Decode fusions on (see [`CudaBackend::set_decode_fusion`]).
    decode_fusion: AtomicBool,
    /// Token masks of structured outputs (see [`token_masks`]).
    masks: std::sync::Mutex<token_masks::MaskBuffer>,
    /// KV caches hold FP8 E4M3 bytes (see [`crate::kv_dtype`]), else bf16.
    kv_fp8: bool,
    /// Whether `load_linear` quantizes to FP8 (see [`fp8_linear`]).
    fp8_weights: bool,
    /// The FP8 GEMM path (see [`fp8_path`]).
    fp8_gemm: fp8_path::Fp8PathState,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.dev.name)
            .finish()
    }
}

/// A driver, cuBLAS or launch failure as a [`KernelError`].
pub(crate) fn device_err(what: &str, e: impl std::fmt::Debug) -> KernelError {
    let s = format!("{e:?}");
    if s.contains("OUT_OF_MEMORY") {
        KernelError::OutOfMemory(format!("{what}: {s}"))
    } else {
        KernelError::Device(format!("{what}: {s}"))
    }
}

/// `data` holds exactly `rows * cols` values.
fn check_host_rows(rows: usize, cols: usize, data: &[f32], op: &'static str) -> Result<()> {
    if data.len() != rows * cols {
        return Err(KernelError::Shape {
            op,
            detail: format!("{} values for [{rows}, {cols}]", data.len()),
        });
    }
    Ok(())
}

impl CudaBackend {
    /// Opens device `opts.device`, loads cuBLAS and the kernels (compiling
    /// them with NVRTC on first use, then from the disk cache).
    pub fn new(opts: CudaOptions) -> Result<Self> {
        let dev = device::Device::open(opts.device)?;
        // Read on first use; a bad value stops the backend here instead.
        moe_stream::from_env()?;
        let pool = pool::Pool::new(dev.stream.clone());
        let decode_counters = dev
            .stream
            .alloc_zeros::<u32>(attention_decode::MERGE_COUNTERS)
            .map_err(|e| device_err("decode merge counters", e))?;
        Ok(CudaBackend {
            lt: blaslt::LtGemm::new(dev.stream.clone(), &pool, GemmTuning::from_env()?)?,
            pool,
            dev,
            poison: AtomicBool::new(false),
            syncs: AtomicU64::new(0),
            tiled_prefill: AtomicBool::new(attention_path::tiled_from_env()?),
            core_decode: AtomicBool::new(attention_decode::cores_from_env()?),
            decode_partition: AtomicUsize::new(
                attention_decode::partition_from_env()?.unwrap_or(0),
            ),
            split_floats_seen: AtomicUsize::new(0),
            decode_counters,
            separate_decode_merge: AtomicBool::new(attention_decode::separate_merge_from_env()?),
            small_linear: AtomicU8::new(SmallLinear::from_env()?.to_u8()),
            decode_fusion: AtomicBool::new(gemv::fusion_from_env()?),
            masks: Default::default(),
            kv_fp8: false,
            fp8_weights: false,
            fp8_gemm: Default::default(),
        })
    }

    /// The KV cache element type: `Auto` and `Bf16` give bf16, `Fp8` FP8
    /// E4M3 bytes with a per-layer K and V scale (half the bytes per token).
    pub fn with_kv_cache_dtype(mut self, dtype: crate::KvCacheDtype) -> Result<Self> {
        self.kv_fp8 = dtype == crate::KvCacheDtype::Fp8;
        Ok(self)
    }

    /// Whether `load_linear` quantizes dense linear weights to FP8 E4M3
    /// with one scale per output channel (`--quantization fp8`; see
    /// [`fp8_linear`]).
    pub fn with_fp8_weights(mut self, on: bool) -> Self {
        self.fp8_weights = on;
        self
    }

    /// What opening the device took: context, kernel compiles (or cache
    /// reads) and module loading, for the start-up report.
    pub fn kernel_startup(&self) -> KernelStartup {
        self.dev.startup
    }

    /// Fill every fresh output with NaN before the op writes it (for tests).
    pub fn set_poison_outputs(&self, on: bool) {
        self.poison.store(on, Ordering::Relaxed);
    }

    /// Run prefill attention on the tiled kernel (one query head per block)
    /// instead of the grouped one, to compare the two; new backends start
    /// from [`PREFILL_KERNEL_ENV`] (`tiled`), else the grouped kernel.
    pub fn force_tiled_prefill(&self, on: bool) {
        self.tiled_prefill.store(on, Ordering::Relaxed);
    }

    /// Programmatic dependent launch of the kernels (see `launch.rs`): on
    /// by default where the GPU (compute capability 9.0 and newer) and
    /// driver take it, unless [`PDL_ENV`] is `off`. Returns whether it is
    /// on (never where unsupported). Graphs captured before a change keep
    /// the setting they recorded.
    pub fn set_pdl(&self, on: bool) -> bool {
        self.dev.set_pdl(on)
    }

    /// Whether kernels launch with programmatic dependent launch.
    pub fn pdl(&self) -> bool {
        self.dev.pdl()
    }

    /// Run decode attention over an FP8 cache on the CUDA-core kernel
    /// instead of the tensor-core one, to compare the two; new backends
    /// start from [`DECODE_KERNEL_ENV`] (`cores`), else tensor cores.
    pub fn force_core_decode(&self, on: bool) {
        self.core_decode.store(on, Ordering::Relaxed);
    }

    /// Tokens per partition of the split-K decode attention: `None` (the
    /// default) chooses by the step's shape
    /// ([`CudaBackend::decode_partition_for`]), `Some(n)` takes `n` for every
    /// step (one of [`PARTITION_SIZES`]), to compare them; another `n` is an
    /// error. New backends start from [`PARTITION_ENV`]. Graphs
    /// captured before a change keep the partition they recorded.
    pub fn set_decode_partition(&self, tokens: Option<usize>) -> Result<()> {
        let n = match tokens {
            None => 0,
            Some(n) => attention_decode::check_partition(n)?,
        };
        self.decode_partition.store(n, Ordering::Relaxed);
        Ok(())
    }

    /// Merge the partitions of split decode attention in a second launch
    /// (`paged_decode_reduce_bf16`) instead of in the partition kernel's
    /// last block, to compare the two (tests, benchmarks); new backends start
    /// from [`DECODE_MERGE_ENV`] (`separate`). Graphs captured before a
    /// change keep the way they recorded.
    pub fn set_separate_decode_merge(&self, on: bool) {
        self.separate_decode_merge.store(on, Ordering::Relaxed);
    }

    /// Whether [`CudaBackend::set_separate_decode_merge`] is on.
    pub(crate) fn separate_decode_merge(&self) -> bool {
        self.separate_decode_merge.load(Ordering::Relaxed)
    }

    /// The decode attention's merge counters (see [`attention_decode`]).
    pub(crate) fn decode_counters(&self) -> &cudarc::driver::CudaSlice<u32> {
        &self.decode_counters
    }

    /// The forced partition of [`CudaBackend::set_decode_partition`].
    pub(crate) fn decode_partition(&self) -> Option<usize> {
        Some(self.decode_partition.load(Ordering::Relaxed)).filter(|&n| n > 0)
    }

    /// The most f32 partials a split decode step took while warming up.
    pub(crate) fn split_floats_seen(&self) -> usize {
        self.split_floats_seen.load(Ordering::Relaxed)
    }

    /// Records the partials of a split decode step while warming up.
    pub(crate) fn note_split_floats(&self, floats: usize) {
        self.split_floats_seen.fetch_max(floats, Ordering::Relaxed);
    }

    /// Streaming multiprocessors of the device.
    pub fn multiprocessors(&self) -> usize {
        self.dev.sms
    }

    /// Whether [`CudaBackend::force_core_decode`] is on.
    pub(crate) fn core_decode(&self) -> bool {
        self.core_decode.load(Ordering::Relaxed)
    }

    /// Which kernels run linear layers of few rows (see [`gemv`]); new
    /// backends start from [`SMALL_LINEAR_ENV`], else [`SmallLinear::Auto`].
    /// Graphs captured before a change keep the kernels they recorded.
    pub fn set_small_linear(&self, path: SmallLinear) {
        self.small_linear.store(path.to_u8(), Ordering::Relaxed);
    }

    /// Whether the decode fusions run: `gate_up_silu` takes the SiLU into
    /// the CUDA-core GEMV's output where that GEMV runs the product, and
    /// `qk_norm_rope_store_kv` is one launch; off, both run the op
    /// sequence. New backends start from [`DECODE_FUSION_ENV`] (`off`),
    /// else on. Graphs captured before a change keep theirs.
    pub fn set_decode_fusion(&self, on: bool) {
        self.decode_fusion.store(on, Ordering::Relaxed);
    }

    /// Whether the decode fusions are on.
    pub fn decode_fusion(&self) -> bool {
        self.decode_fusion.load(Ordering::Relaxed)
    }

    /// The current small-row linear path.
    pub fn small_linear(&self) -> SmallLinear {
        SmallLinear::from_u8(self.small_linear.load(Ordering::Relaxed))
    }

    /// The attention kernel this backend runs for `ctx` and `p`
    /// ([`attention_kernel`] with [`CudaBackend::force_tiled_prefill`]
    /// applied; every kernel reads bf16 and FP8 caches alike).
    pub fn attention_kernel_for(
        &self,
        ctx: &ForwardContext,
        p: &AttentionParams,
    ) -> AttentionKernel {
        prefer_tiled(ctx, p, self.tiled_prefill.load(Ordering::Relaxed))
    }

    /// How many times the host has waited for the device (every
    /// `synchronize`, download, device-sampling and graph-replay wait): the
    /// engine's tests check it grows by one per sampling step.
    pub fn host_syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Waits for all queued work; reports a kernel fault if one happened.
    pub fn synchronize(&self) -> Result<()> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.dev
            .stream
            .synchronize()
            .map_err(|e| device_err("synchronize", e))
    }

    /// `(free, total)` bytes of device memory (`cuMemGetInfo`), once queued
    /// work is done; sizes the KV cache from what the weights left.
    pub fn mem_get_info(&self) -> Result<(usize, usize)> {
        self.synchronize()?;
        self.dev
            .ctx
            .mem_get_info()
            .map_err(|e| device_err("mem_get_info", e))
    }

    /// Device-to-device copy bandwidth in bytes per second (read + write
    /// counted), the ceiling memory-bound kernels are judged against:
    /// `reps` copies of `bytes` after one warm-up copy, timed on the host
    /// around a synchronization.
    pub fn measure_copy_bandwidth(&self, bytes: usize, reps: usize) -> Result<f64> {
        let n = (bytes / 2).max(1);
        let src = self.pool.take::<u16>(n)?;
        let mut dst = self.pool.take::<u16>(n)?;
        let copy = |dst: &mut DeviceBuf<u16>| {
            self.dev
                .stream
                .memcpy_dtod(&*src, &mut **dst)
                .map_err(|e| device_err("copy", e))
        };
        copy(&mut dst)?;
        self.synchronize()?;
        let t = std::time::Instant::now();
        for _ in 0..reps.max(1) {
            copy(&mut dst)?;
        }
        self.synchronize()?;
        let secs = t.elapsed().as_secs_f64();
        Ok((2 * n * 2 * reps.max(1)) as f64 / secs)
    }

    /// K and V of one layer's cache as f32 (for tests and debugging): bf16
    /// widened, or FP8 bytes decoded by [`crate::fp8`] times the scales.
    pub fn kv_cache_to_host(&self, cache: &CudaKvCache) -> Result<(Vec<f32>, Vec<f32>)> {
        let n = cache.shape.elements();
        let (kb, vb) = self.kv_cache_bytes_to_host(cache)?;
        if cache.fp8 {
            let sc = self.download_raw(&cache.scales, 2)?;
            let dec = |b: Vec<u8>, s: f32| -> Vec<f32> {
                b.into_iter()
                    .map(|x| crate::fp8::e4m3_to_f32(x) * s)
                    .collect()
            };
            return Ok((dec(kb, sc[0]), dec(vb, sc[1])));
        }
        let dec = |b: Vec<u8>| -> Vec<f32> {
            b.chunks_exact(2)
                .take(n)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect()
        };
        Ok((dec(kb), dec(vb)))
    }

    /// The raw bytes of one layer's K and V (bf16 pairs, or FP8 codes).
    pub fn kv_cache_bytes_to_host(&self, cache: &CudaKvCache) -> Result<(Vec<u8>, Vec<u8>)> {
        let n = cache.shape.elements() * if cache.fp8 { 1 } else { 2 };
        Ok((
            self.download_raw(&cache.k, n)?,
            self.download_raw(&cache.v, n)?,
        ))
    }

    /// Bytes of one KV cache element.
    fn kv_elem_bytes(&self) -> usize {
        if self.kv_fp8 {
            1
        } else {
            std::mem::size_of::<bf16>()
        }
    }

    /// The first `n` elements of `d` as f32 (waits for the device).
    fn download(&self, d: &cudarc::driver::CudaSlice<bf16>, n: usize) -> Result<Vec<f32>> {
        Ok(self
            .download_raw(d, n)?
            .into_iter()
            .map(|x| x.to_f32())
            .collect())
    }

    /// The first `n` elements of `d` as they are (waits for the device).
    fn download_raw<T: cudarc::driver::DeviceRepr + Default + Clone>(
        &self,
        d: &cudarc::driver::CudaSlice<T>,
        n: usize,
    ) -> Result<Vec<T>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.dev
            .stream
            .clone_dtoh(&d.slice(..n))
            .map_err(|e| device_err("copy to host", e))
    }

    /// A residual-stream activation (f32, like `embedding`'s output) from
    /// host rows: for tests of the ops that read or accumulate into it.
    pub fn residual_from_host(&self, rows: usize, cols: usize, data: &[f32]) -> Result<CudaTensor> {
        let op = "residual_from_host";
        check_host_rows(rows, cols, data, op)?;
        let data = self.upload(data.to_vec(), op)?;
        Ok(CudaTensor {
            rows,
            cols,
            data: Act::F32(DeviceBuf::unpooled(data)),
        })
    }

    /// Copies `host` to a new device buffer (one element where `host` is
    /// empty, so no zero-byte allocation is made).
    fn upload<T: cudarc::driver::DeviceRepr + Default>(
        &self,
        mut host: Vec<T>,
        op: &str,
    ) -> Result<cudarc::driver::CudaSlice<T>> {
        if host.is_empty() {
            host.push(T::default());
        }
        self.dev
            .stream
            .clone_htod(&host)
            .map_err(|e| device_err(op, e))
    }

    /// A bf16 buffer of `n` elements (at least one), NaN-filled when poisoning.
    pub(crate) fn alloc_bf16(&self, n: usize) -> Result<DeviceBuf<bf16>> {
        // Every op writes each element it later reads; poisoning (or the op)
        // initializes the rest before any read that matters.
        let mut d = self.pool.take::<bf16>(n)?;
        if self.poison.load(Ordering::Relaxed) {
            ops::fill(self, &mut d, n, 0x7fc0)?;
        }
        Ok(d)
    }

    /// A scratch buffer of `n` f32 (at least one) from the pool, contents
    /// undefined. Allocation-free once a step of the same shape has run.
    pub(crate) fn alloc_f32(&self, n: usize) -> Result<DeviceBuf<f32>> {
        self.pool.take::<f32>(n)
    }

    /// An f32 activation buffer of `n` elements, NaN-filled when poisoning.
    fn alloc_f32_act(&self, n: usize) -> Result<DeviceBuf<f32>> {
        let mut d = self.pool.take::<f32>(n)?;
        if self.poison.load(Ordering::Relaxed) {
            ops::fill_f32(self, &mut d, n, 0x7fc0_0000)?;
        }
        Ok(d)
    }

    /// A scratch buffer of `n` i32 (at least one) from the pool.
    pub(crate) fn alloc_i32(&self, n: usize) -> Result<DeviceBuf<i32>> {
        self.pool.take::<i32>(n)
    }

    /// Bytes the activation pool holds (in use or cached for reuse while
    /// warming up; the arena once frozen).
    pub fn pool_reserved_bytes(&self) -> usize {
        self.pool.reserved_bytes()
    }

    /// The arena size the work so far needed (before the freeze), or the
    /// highest arena offset used (after it); see [`pool`].
    pub fn pool_arena_need(&self) -> usize {
        self.pool.arena_need()
    }

    /// Whether the step memory is frozen into its arena (see [`pool`]).
    pub fn step_memory_frozen(&self) -> bool {
        self.pool.is_frozen()
    }

    /// cuBLASLt plans made so far (bounded: one per GEMM shape and row
    /// bucket).
    pub fn gemm_plans(&self) -> usize {
        self.lt.num_plans()
    }

    /// Drops every GEMM plan and picks later plans' algorithms as `mode`
    /// says, with `cache_file` as the disk cache (`None`: none). Tuning
    /// stays open until [`Self::finish_gemm_tuning`] (or the freeze of the
    /// step memory). For tests and benchmarks: graphs captured before keep
    /// the algorithms they captured.
    pub fn set_gemm_tuning(&self, mode: GemmTuning, cache_file: Option<std::path::PathBuf>) {
        self.lt.set_tuning(mode, cache_file)
    }

    /// Ends the timing of new GEMM plans and writes the choices made to the
    /// disk cache (the engine's warm-up does this when it freezes the step
    /// memory); returns what tuning did.
    pub fn finish_gemm_tuning(&self) -> GemmTuningStats {
        self.lt.finish_tuning()
    }

    /// What GEMM tuning did so far (see [`blaslt_tune`]).
    pub fn gemm_tuning_stats(&self) -> GemmTuningStats {
        self.lt.tuning_stats()
    }

    /// A static buffer of `n` i32 outside the arena (graph inputs/outputs).
    pub(crate) fn alloc_static_i32(&self, n: usize) -> Result<DeviceBuf<i32>> {
        self.pool.take_static::<i32>(n)
    }

    /// A fresh `[rows, cols]` bf16 activation.
    pub(crate) fn output(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        Ok(CudaTensor {
            rows,
            cols,
            data: Act::Bf16(self.alloc_bf16(rows * cols)?),
        })
    }

    /// A fresh `[rows, cols]` f32 activation (the residual stream).
    pub(crate) fn output_f32(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        Ok(CudaTensor {
            rows,
            cols,
            data: Act::F32(self.alloc_f32_act(rows * cols)?),
        })
    }
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;
    type KvCache = CudaKvCache;
    type Step = CudaStep;
    type Graph = CudaGraphRunner;
    type Routes = CudaRoutes;

    fn name(&self) -> String {
        if self.dev.pdl() {
            format!("{}, PDL", self.dev.name)
        } else {
            self.dev.name.clone()
        }
    }

    fn load_weight(&self, w: HostTensor) -> Result<CudaWeight> {
        let (rows, cols) = storage::host_dims(&w, "load_weight")?;
        let data = self.upload(storage::host_to_bf16(w.data), "load_weight")?;
        Ok(CudaWeight {
            rows,
            cols,
            data: WeightBuf::Bf16(data),
        })
    }

    fn load_linear(&self, w: HostTensor) -> Result<CudaWeight> {
        if !self.fp8_weights {
            return self.load_weight(w);
        }
        let m = crate::fp8_matrix::quantize_host(&w)?;
        self.load_fp8_linear(m)
    }

    fn load_fp8_linear(&self, w: crate::Fp8Matrix) -> Result<CudaWeight> {
        fp8_linear::check_shape(w.rows, w.cols)?;
        fp8_path::select(self)?;
        let (rows, cols) = (w.rows, w.cols);
        let codes = self.upload(w.codes, "load_fp8_linear")?;
        let scales = self.upload(w.scales, "load_fp8_linear")?;
        Ok(CudaWeight {
            rows,
            cols,
            data: WeightBuf::Fp8 { codes, scales },
        })
    }

    fn load_experts(&self, w: HostTensor) -> Result<CudaWeight> {
        if !self.fp8_weights {
            return self.load_weight(w);
        }
        let m = crate::fp8_matrix::quantize_host(&w)?;
        self.load_fp8_experts(m)
    }

    fn load_fp8_experts(&self, w: crate::Fp8Matrix) -> Result<CudaWeight> {
        // The expert kernels widen the codes themselves (no FP8 GEMM, so
        // any architecture the bf16 ones run on).
        let (rows, cols) = (w.rows, w.cols);
        let codes = self.upload(w.codes, "load_fp8_experts")?;
        let scales = self.upload(w.scales, "load_fp8_experts")?;
        Ok(CudaWeight {
            rows,
            cols,
            data: WeightBuf::Fp8 { codes, scales },
        })
    }

    fn load_table(&self, t: HostTensor) -> Result<CudaWeight> {
        let (rows, cols) = storage::host_dims(&t, "load_table")?;
        let data = self.upload(t.into_f32_vec(), "load_table")?;
        Ok(CudaWeight {
            rows,
            cols,
            data: WeightBuf::F32(data),
        })
    }

    fn alloc_kv_cache(&self, shape: KvCacheShape) -> Result<CudaKvCache> {
        let n = shape.elements().max(1) * self.kv_elem_bytes();
        let alloc = || {
            self.dev
                .stream
                .alloc_zeros::<u8>(n)
                .map_err(|e| device_err(&format!("KV cache {shape:?}"), e))
        };
        Ok(CudaKvCache {
            shape,
            fp8: self.kv_fp8,
            k: alloc()?,
            v: alloc()?,
            scales: self.upload(vec![1.0f32, 1.0], "KV cache scales")?,
        })
    }

    fn kv_cache_bytes(&self, shape: KvCacheShape) -> usize {
        2 * shape.elements() * self.kv_elem_bytes()
    }

    fn kv_cache_fp8(&self) -> bool {
        self.kv_fp8
    }

    fn set_kv_scales(&self, cache: &mut CudaKvCache, k_scale: f32, v_scale: f32) -> Result<()> {
        for (name, s) in [("k_scale", k_scale), ("v_scale", v_scale)] {
            crate::kv_dtype::check_kv_scale(name, s).map_err(|detail| KernelError::Shape {
                op: "set_kv_scales",
                detail,
            })?;
        }
        if !cache.fp8 {
            if k_scale == 1.0 && v_scale == 1.0 {
                return Ok(());
            }
            return Err(KernelError::Unsupported(
                "KV cache scales on a bf16 cache".into(),
            ));
        }
        // Queued on the stream like every op, so ops queued before it still
        // read the old scales and those after it the new ones.
        self.dev
            .stream
            .memcpy_htod(&[k_scale, v_scale], &mut cache.scales)
            .map_err(|e| device_err("set_kv_scales", e))
    }

    fn tensor_from_host(&self, rows: usize, cols: usize, data: &[f32]) -> Result<CudaTensor> {
        let op = "tensor_from_host";
        check_host_rows(rows, cols, data, op)?;
        let host: Vec<bf16> = data.iter().map(|&v| bf16::from_f32(v)).collect();
        let data = self.upload(host, op)?;
        Ok(CudaTensor {
            rows,
            cols,
            data: Act::Bf16(DeviceBuf::unpooled(data)),
        })
    }

    fn tensor_to_host(&self, x: &CudaTensor) -> Result<Vec<f32>> {
        match &x.data {
            Act::Bf16(d) => self.download(d, x.numel()),
            Act::F32(d) => self.download_raw(d, x.numel()),
        }
    }

    fn dims(&self, x: &CudaTensor) -> (usize, usize) {
        (x.rows, x.cols)
    }

    fn begin_step(&self, ctx: &ForwardContext) -> Result<CudaStep> {
        CudaStep::new(ctx, self)
    }

    fn embedding(&self, step: &CudaStep, table: &CudaWeight) -> Result<CudaTensor> {
        ops::embedding(self, step, table)
    }

    fn linear(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        bias: Option<&CudaWeight>,
    ) -> Result<CudaTensor> {
        ops::linear(self, x, w, bias)
    }

    fn linear3(
        &self,
        x: &CudaTensor,
        w: [&CudaWeight; 3],
        bias: [Option<&CudaWeight>; 3],
    ) -> Result<[CudaTensor; 3]> {
        ops::linear3(self, x, w, bias)
    }

    fn add_linear(
        &self,
        residual: &mut CudaTensor,
        x: &CudaTensor,
        w: &CudaWeight,
        bias: Option<&CudaWeight>,
    ) -> Result<()> {
        ops::add_linear(self, residual, x, w, bias)
    }

    fn gate_up_silu(&self, h: &CudaTensor, gate_up: &CudaWeight) -> Result<CudaTensor> {
        ops::gate_up_silu(self, h, gate_up)
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaWeight, eps: f32) -> Result<CudaTensor> {
        ops::rms_norm(self, x, w, eps)
    }

    fn add_rms_norm(
        &self,
        residual: &mut CudaTensor,
        x: &CudaTensor,
        w: &CudaWeight,
        eps: f32,
    ) -> Result<CudaTensor> {
        ops::add_rms_norm(self, residual, x, w, eps)
    }

    fn head_rms_norm(
        &self,
        x: &mut CudaTensor,
        w: &CudaWeight,
        head_dim: usize,
        eps: f32,
    ) -> Result<()> {
        ops::head_rms_norm(self, x, w, head_dim, eps)
    }

    fn layer_norm(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        b: &CudaWeight,
        eps: f32,
    ) -> Result<CudaTensor> {
        ops::layer_norm(self, x, w, b, eps)
    }

    fn rope(
        &self,
        x: &mut CudaTensor,
        step: &CudaStep,
        cos_sin: &CudaWeight,
        head_dim: usize,
        style: RopeStyle,
    ) -> Result<()> {
        ops::rope(self, x, step, cos_sin, head_dim, style)
    }

    #[allow(clippy::too_many_arguments)]
    fn qk_norm_rope(
        &self,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        norms: Option<(&CudaWeight, &CudaWeight)>,
        eps: f32,
        step: &CudaStep,
        cos_sin: &CudaWeight,
        head_dim: usize,
        style: RopeStyle,
    ) -> Result<()> {
        qk_norm_rope::qk_norm_rope(self, q, k, norms, eps, step, cos_sin, head_dim, style)
    }

    fn qk_norm_rope_store_kv(
        &self,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        v: &CudaTensor,
        norms: Option<(&CudaWeight, &CudaWeight)>,
        eps: f32,
        step: &CudaStep,
        cos_sin: &CudaWeight,
        head_dim: usize,
        style: RopeStyle,
        cache: &mut CudaKvCache,
    ) -> Result<()> {
        qk_norm_rope::qk_norm_rope_store_kv(
            self, q, k, v, norms, eps, step, cos_sin, head_dim, style, cache,
        )
    }

    fn silu_mul(&self, gate_up: &CudaTensor) -> Result<CudaTensor> {
        ops::silu_mul(self, gate_up)
    }

    fn silu_mul2(&self, gate: &CudaTensor, up: &CudaTensor) -> Result<CudaTensor> {
        ops::silu_mul2(self, gate, up)
    }

    fn relu(&self, x: &mut CudaTensor) -> Result<()> {
        ops::relu(self, x)
    }

    fn gelu_tanh_mul(&self, gate_up: &CudaTensor) -> Result<CudaTensor> {
        ops::gelu_tanh_mul(self, gate_up)
    }

    fn scale(&self, x: &mut CudaTensor, factor: f32) -> Result<()> {
        ops::scale(self, x, factor)
    }

    fn softcap(&self, x: &mut CudaTensor, cap: f32) -> Result<()> {
        ops::softcap(self, x, cap)
    }

    fn add(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
        ops::add(self, x, y)
    }

    fn add_position_embedding(
        &self,
        x: &mut CudaTensor,
        step: &CudaStep,
        table: &CudaWeight,
        offset: usize,
    ) -> Result<()> {
        ops::add_position_embedding(self, x, step, table, offset)
    }

    fn gather_logits_rows(&self, x: &CudaTensor, step: &CudaStep) -> Result<CudaTensor> {
        ops::gather_logits_rows(self, x, step)
    }

    fn store_kv_in_group(
        &self,
        k: &CudaTensor,
        v: &CudaTensor,
        cache: &mut CudaKvCache,
        step: &CudaStep,
        group: usize,
    ) -> Result<()> {
        attention::store_kv(self, k, v, cache, step, group)
    }

    fn copy_blocks(
        &self,
        cache: &mut CudaKvCache,
        copies: &[pagoda_core::BlockCopy],
    ) -> Result<()> {
        attention::copy_blocks(self, cache, copies)
    }

    fn attention(
        &self,
        q: &CudaTensor,
        cache: &CudaKvCache,
        step: &CudaStep,
        params: &AttentionParams,
    ) -> Result<CudaTensor> {
        attention::attention(self, q, cache, step, params)
    }

    fn moe_route(
        &self,
        router_logits: &CudaTensor,
        top_k: usize,
        renormalize: bool,
    ) -> Result<CudaRoutes> {
        moe::route(self, router_logits, top_k, renormalize)
    }

    fn moe_routes_from_host(
        &self,
        ids: &[u32],
        weights: &[f32],
        top_k: usize,
    ) -> Result<CudaRoutes> {
        moe::routes_from_host(self, ids, weights, top_k)
    }

    fn moe_experts(
        &self,
        x: &CudaTensor,
        routes: &CudaRoutes,
        gate_up: &CudaWeight,
        down: &CudaWeight,
        num_experts: usize,
    ) -> Result<CudaTensor> {
        moe::experts(self, x, routes, gate_up, down, num_experts)
    }

    fn sigmoid_gate_rows(&self, x: &mut CudaTensor, gate: &CudaTensor) -> Result<()> {
        moe::sigmoid_gate_rows(self, x, gate)
    }

    fn warmup_row_counts(&self, max_rows: usize) -> Vec<usize> {
        // Every GEMM plan bucket above the gemv sizes, below the largest step.
        let mut rows = Vec::new();
        let mut n = self.small_linear().min_cublas_rows() as u64;
        while (n as usize) < max_rows {
            let b = blaslt::bucket(n);
            if b as usize >= max_rows {
                break;
            }
            rows.push(b as usize);
            n = b + 1;
        }
        rows
    }

    fn freeze_step_memory(&self) -> Result<Option<usize>> {
        self.lt.finish_tuning();
        self.pool.freeze().map(Some)
    }

    fn gemm_tuning_summary(&self) -> Option<String> {
        Some(self.lt.tuning_stats().summary())
    }

    fn samples_on_device(&self) -> bool {
        true
    }

    fn sample(&self, logits: &CudaTensor, step: &CudaStep) -> Result<Vec<u32>> {
        Ok(self.sample_full(logits, step)?.tokens)
    }

    fn begin_step_with(&self, ctx: &ForwardContext, opts: &SamplingOptions) -> Result<CudaStep> {
        CudaStep::with_options(ctx, opts, self)
    }

    fn sample_full(&self, logits: &CudaTensor, step: &CudaStep) -> Result<DeviceSamples> {
        let rows = step.ctx.sampling.len();
        logit_adjust::launch_adjust(self, logits, rows, &step.layout.adjust, |s| step.view(s))?;
        let opts = step.opts.present.then(|| {
            (
                step.view(step.layout.options),
                step.view(step.layout.history),
            )
        });
        sampling_extras::sample_rows(self, logits, step, opts, &step.opts)
    }

    fn apply_token_masks(&self, logits: &CudaTensor, masks: &TokenMasks) -> Result<()> {
        token_masks::apply(self, logits, masks)
    }

    fn supports_graphs(&self) -> bool {
        true
    }

    fn capture_graph(
        &self,
        step: CudaStep,
        forward: &mut dyn FnMut(&CudaStep) -> Result<CudaTensor>,
    ) -> Result<CudaGraphRunner> {
        graph::capture(self, step, forward)
    }

    fn replay_graph_with(
        &self,
        graph: &mut CudaGraphRunner,
        ctx: &ForwardContext,
        opts: &SamplingOptions,
    ) -> Result<DeviceSamples> {
        graph::replay(self, graph, ctx, opts, &mut || Ok(TokenMasks::default()))
    }

    fn replay_graph_masked(
        &self,
        graph: &mut CudaGraphRunner,
        ctx: &ForwardContext,
        opts: &SamplingOptions,
        masks: &mut dyn FnMut() -> Result<TokenMasks>,
    ) -> Result<DeviceSamples> {
        graph::replay(self, graph, ctx, opts, masks)
    }
}
