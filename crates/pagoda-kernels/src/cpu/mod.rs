//! The CPU backend: f32 activations, weights in f32/f16/bf16 or GGUF blocks, its own rayon pool.
//!
//! Every op runs inside the backend's thread pool (`CpuOptions::threads`
//! threads), parallel over rows, output features, or (token, head) pairs.
//! Activations are plain row-major f32 ([`CpuTensor`]); weight matrices are
//! stored in [`WeightDtype`] and widened to f32 in registers (decode GEMV) or
//! per tile (prefill GEMM); accumulation is always f32. With
//! [`CpuBackend::with_quantized_weights`], quantized GGUF matrices keep their
//! blocks and decode through integer block dot products ([`quant`]). The KV
//! cache (`kv_cache.rs`) is f32, or FP8 E4M3 bytes with per-layer scales
//! ([`CpuBackend::with_kv_cache_dtype`]), dequantized to f32 as attention
//! reads it.
//!
//! This backend is also the reference other backends are tested against, so
//! every op is checked against a naive f64 implementation in `tests/`.
//!
//! Files: [`storage`] (types), [`matmul`] + [`gemv`] + [`quant`] + [`amx`] (linear), [`attention`]
//! (store_kv, paged attention), [`norm`], [`ops`] (embedding, rope,
//! activations), [`moe`] (mixture-of-experts routing and expert MLPs),
//! `math`, `convert` and `simd` (vectorized helpers).

pub(crate) mod amx;
mod attention;
mod convert;
mod gemv;
mod kv_cache;
mod math;
mod matmul;
mod moe;
mod norm;
mod ops;
mod par;
pub mod quant;
pub(crate) mod simd;
mod storage;

pub use moe::CpuRoutes;
pub use simd::set_simd_enabled;
pub use storage::{CpuKvCache, CpuStep, CpuTensor, CpuWeight, WeightData, WeightDtype};

use crate::{
    AttentionParams, Backend, ForwardContext, HostTensor, KernelError, KvCacheShape, Result,
    RopeStyle,
};

/// How to build a [`CpuBackend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuOptions {
    /// Worker threads of the backend's pool (0 = one per available core).
    pub threads: usize,
    /// Storage dtype of weight matrices and tables.
    pub weight_dtype: WeightDtype,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            threads: 0,
            weight_dtype: WeightDtype::F32,
        }
    }
}

/// The CPU implementation of [`crate::Backend`].
pub struct CpuBackend {
    pool: rayon::ThreadPool,
    threads: usize,
    weight_dtype: WeightDtype,
    keep_quantized: bool,
    kv_fp8: bool,
    fp8_weights: bool,
    bf16_linear_inputs: bool,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("threads", &self.threads)
            .field("weight_dtype", &self.weight_dtype)
            .field("keep_quantized", &self.keep_quantized)
            .field("kv_fp8", &self.kv_fp8)
            .finish()
    }
}

impl CpuBackend {
    /// Starts the backend's thread pool.
    pub fn new(opts: CpuOptions) -> Result<Self> {
        let threads = if opts.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            opts.threads
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("pagoda-cpu-{i}"))
            .build()
            .map_err(|e| KernelError::Device(format!("cannot start {threads} CPU threads: {e}")))?;
        Ok(CpuBackend {
            pool,
            threads,
            weight_dtype: opts.weight_dtype,
            keep_quantized: false,
            kv_fp8: false,
            fp8_weights: false,
            bf16_linear_inputs: false,
        })
    }

    /// Whether quantized GGUF matrices of a type with kernels
    /// ([`quant::supported`]) keep their blocks (`true`) or are dequantized
    /// to the weight dtype at load (`false`, the default of [`CpuBackend::new`]).
    pub fn with_quantized_weights(mut self, keep: bool) -> Self {
        self.keep_quantized = keep;
        self
    }

    /// The KV cache element type: `Auto` (f32) or `Fp8` (E4M3 bytes with a
    /// per-layer scale, see [`crate::kv_dtype`]). `Bf16` is refused: this
    /// backend has no bf16 cache, and storing f32 instead would not be
    /// what was asked for.
    pub fn with_kv_cache_dtype(mut self, dtype: crate::KvCacheDtype) -> Result<Self> {
        self.kv_fp8 = match dtype {
            crate::KvCacheDtype::Auto => false,
            crate::KvCacheDtype::Fp8 => true,
            crate::KvCacheDtype::Bf16 => {
                return Err(KernelError::Unsupported(
                    "a bf16 KV cache on the CPU (its cache is f32; use auto or fp8)".into(),
                ))
            }
        };
        Ok(self)
    }

    /// Whether `load_linear` quantizes dense linear weights to FP8
    /// (`--quantization fp8`). On the CPU this is the reference of the FP8
    /// arithmetic ([`crate::fp8_matrix`]): the weights are held as their
    /// dequantized f32 values (no memory saved) and each linear layer
    /// quantize-dequantizes its input per token; it is for checking
    /// accuracy, not for speed.
    pub fn with_fp8_weights(mut self, on: bool) -> Self {
        self.fp8_weights = on;
        self
    }

    /// Whether every linear layer rounds its input to bf16 (nearest even)
    /// first: a model of a device that keeps bf16 activations between
    /// layers, off by default. Tests use it to measure how far a model's
    /// logits move under bf16-level input differences (the FP8 reference
    /// keeps f32 inputs; see `tests/common/fp8_calibration.rs` of the
    /// engine).
    pub fn with_bf16_linear_inputs(mut self, on: bool) -> Self {
        self.bf16_linear_inputs = on;
        self
    }

    /// Whether quantized matrices keep their blocks.
    pub fn keeps_quantized(&self) -> bool {
        self.keep_quantized
    }

    /// Threads in the pool.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Storage dtype of weight matrices.
    pub fn weight_dtype(&self) -> WeightDtype {
        self.weight_dtype
    }

    /// Runs an op in the pool.
    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.pool.install(f)
    }

    /// Runs an elementwise op producing `elements` outputs: on the calling
    /// thread when small (see [`par`]), else in the pool.
    fn run_rows<T: Send>(&self, elements: usize, f: impl FnOnce() -> T + Send) -> T {
        if elements <= par::SEQ_MAX {
            f()
        } else {
            self.pool.install(f)
        }
    }
}

pub(crate) use math::dot;

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type KvCache = CpuKvCache;
    type Step = CpuStep;
    type Graph = crate::NoGraph;
    type Routes = CpuRoutes;

    fn name(&self) -> String {
        let dtype = match self.weight_dtype {
            WeightDtype::F32 => "f32",
            WeightDtype::F16 => "f16",
            WeightDtype::BF16 => "bf16",
        };
        let quant = if self.keep_quantized {
            " (quantized kept)"
        } else {
            ""
        };
        let simd = match simd::level_name() {
            "" => String::new(),
            level => format!(", {level}"),
        };
        // Kept blocks take the tile GEMM for batched rows where it runs.
        let simd = if self.keep_quantized && amx::available() {
            simd + ", amx-bf16"
        } else {
            simd
        };
        format!(
            "cpu ({} threads, {dtype} weights{quant}{simd})",
            self.threads
        )
    }

    fn load_weight(&self, w: HostTensor) -> Result<CpuWeight> {
        CpuWeight::from_host(w, self.weight_dtype, self.keep_quantized)
    }

    fn load_linear(&self, w: HostTensor) -> Result<CpuWeight> {
        if !self.fp8_weights {
            return self.load_weight(w);
        }
        let m = crate::fp8_matrix::quantize_host(&w)?;
        Ok(CpuWeight::from_fp8(&m))
    }

    fn load_fp8_linear(&self, w: crate::Fp8Matrix) -> Result<CpuWeight> {
        Ok(CpuWeight::from_fp8(&w))
    }

    fn load_experts(&self, w: HostTensor) -> Result<CpuWeight> {
        if !self.fp8_weights {
            return self.load_weight(w);
        }
        let m = crate::fp8_matrix::quantize_host(&w)?;
        self.load_fp8_experts(m)
    }

    fn load_fp8_experts(&self, w: crate::Fp8Matrix) -> Result<CpuWeight> {
        Ok(CpuWeight::from_fp8_experts(&w))
    }

    fn scope<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    fn load_table(&self, t: HostTensor) -> Result<CpuWeight> {
        CpuWeight::from_host(t, WeightDtype::F32, false)
    }

    fn alloc_kv_cache(&self, shape: KvCacheShape) -> Result<CpuKvCache> {
        CpuKvCache::new(shape, self.kv_fp8)
    }

    fn kv_cache_bytes(&self, shape: KvCacheShape) -> usize {
        let elem = if self.kv_fp8 {
            1
        } else {
            std::mem::size_of::<f32>()
        };
        2 * shape.elements() * elem
    }

    fn kv_cache_fp8(&self) -> bool {
        self.kv_fp8
    }

    fn set_kv_scales(&self, cache: &mut CpuKvCache, k_scale: f32, v_scale: f32) -> Result<()> {
        cache.set_scales(k_scale, v_scale)
    }

    fn tensor_from_host(&self, rows: usize, cols: usize, data: &[f32]) -> Result<CpuTensor> {
        if data.len() != rows * cols {
            return Err(KernelError::Shape {
                op: "tensor_from_host",
                detail: format!("{} values for [{rows}, {cols}]", data.len()),
            });
        }
        Ok(CpuTensor {
            rows,
            cols,
            data: data.to_vec(),
        })
    }

    fn tensor_to_host(&self, x: &CpuTensor) -> Result<Vec<f32>> {
        Ok(x.data.clone())
    }

    fn dims(&self, x: &CpuTensor) -> (usize, usize) {
        (x.rows, x.cols)
    }

    fn begin_step(&self, ctx: &ForwardContext) -> Result<CpuStep> {
        CpuStep::new(ctx)
    }

    fn embedding(&self, step: &CpuStep, table: &CpuWeight) -> Result<CpuTensor> {
        self.run_rows(step.ctx.num_tokens() * table.cols, || {
            ops::embedding(step, table)
        })
    }

    fn linear(&self, x: &CpuTensor, w: &CpuWeight, bias: Option<&CpuWeight>) -> Result<CpuTensor> {
        if !w.fp8_act && !self.bf16_linear_inputs {
            return self.run(|| matmul::linear(x, w, bias, self.threads));
        }
        let mut xq = x.clone();
        if self.bf16_linear_inputs {
            convert::round_to_bf16(&mut xq.data);
        }
        if w.fp8_act {
            // The reference of an FP8 layer: the input as the device sees
            // it after its per-token quantization.
            for row in xq.data.chunks_mut(x.cols.max(1)) {
                crate::fp8_matrix::quant_dequant_row(row);
            }
        }
        self.run(|| matmul::linear(&xq, w, bias, self.threads))
    }

    fn linear3(
        &self,
        x: &CpuTensor,
        w: [&CpuWeight; 3],
        bias: [Option<&CpuWeight>; 3],
    ) -> Result<[CpuTensor; 3]> {
        // Decode-sized steps on quantized weights: one pass for the three.
        let fused = !self.bf16_linear_inputs;
        if let Some(ys) = fused
            .then(|| self.run(|| matmul::linear3_quant(x, w, bias, self.threads)))
            .flatten()
        {
            return Ok(ys);
        }
        Ok([
            self.linear(x, w[0], bias[0])?,
            self.linear(x, w[1], bias[1])?,
            self.linear(x, w[2], bias[2])?,
        ])
    }

    fn rms_norm(&self, x: &CpuTensor, w: &CpuWeight, eps: f32) -> Result<CpuTensor> {
        self.run_rows(x.data.len(), || norm::rms_norm(x, w, eps))
    }

    fn add_rms_norm(
        &self,
        residual: &mut CpuTensor,
        x: &CpuTensor,
        w: &CpuWeight,
        eps: f32,
    ) -> Result<CpuTensor> {
        self.run_rows(x.data.len(), || norm::add_rms_norm(residual, x, w, eps))
    }

    fn head_rms_norm(
        &self,
        x: &mut CpuTensor,
        w: &CpuWeight,
        head_dim: usize,
        eps: f32,
    ) -> Result<()> {
        self.run_rows(x.data.len(), || norm::head_rms_norm(x, w, head_dim, eps))
    }

    fn layer_norm(
        &self,
        x: &CpuTensor,
        w: &CpuWeight,
        b: &CpuWeight,
        eps: f32,
    ) -> Result<CpuTensor> {
        self.run_rows(x.data.len(), || norm::layer_norm(x, w, b, eps))
    }

    fn rope(
        &self,
        x: &mut CpuTensor,
        step: &CpuStep,
        cos_sin: &CpuWeight,
        head_dim: usize,
        style: RopeStyle,
    ) -> Result<()> {
        self.run_rows(x.data.len(), || {
            ops::rope(x, step, cos_sin, head_dim, style)
        })
    }

    fn silu_mul(&self, gate_up: &CpuTensor) -> Result<CpuTensor> {
        self.run_rows(gate_up.data.len(), || ops::silu_mul(gate_up))
    }

    fn silu_mul2(&self, gate: &CpuTensor, up: &CpuTensor) -> Result<CpuTensor> {
        self.run_rows(gate.data.len(), || ops::silu_mul2(gate, up))
    }

    fn gelu_tanh_mul(&self, gate_up: &CpuTensor) -> Result<CpuTensor> {
        self.run_rows(gate_up.data.len(), || ops::gelu_tanh_mul(gate_up))
    }

    fn scale(&self, x: &mut CpuTensor, factor: f32) -> Result<()> {
        self.run_rows(x.data.len(), || ops::scale(x, factor))
    }

    fn softcap(&self, x: &mut CpuTensor, cap: f32) -> Result<()> {
        self.run_rows(x.data.len(), || ops::softcap(x, cap))
    }

    fn relu(&self, x: &mut CpuTensor) -> Result<()> {
        self.run_rows(x.data.len(), || ops::relu(x))
    }

    fn add(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        self.run_rows(x.data.len(), || ops::add(x, y))
    }

    fn add_position_embedding(
        &self,
        x: &mut CpuTensor,
        step: &CpuStep,
        table: &CpuWeight,
        offset: usize,
    ) -> Result<()> {
        self.run_rows(x.data.len(), || {
            ops::add_position_embedding(x, step, table, offset)
        })
    }

    fn gather_logits_rows(&self, x: &CpuTensor, step: &CpuStep) -> Result<CpuTensor> {
        ops::gather_logits_rows(x, step)
    }

    fn store_kv_in_group(
        &self,
        k: &CpuTensor,
        v: &CpuTensor,
        cache: &mut CpuKvCache,
        step: &CpuStep,
        group: usize,
    ) -> Result<()> {
        attention::store_kv(k, v, cache, step, group)
    }

    fn copy_blocks(&self, cache: &mut CpuKvCache, copies: &[pagoda_core::BlockCopy]) -> Result<()> {
        cache.copy_blocks(copies)
    }

    fn attention(
        &self,
        q: &CpuTensor,
        cache: &CpuKvCache,
        step: &CpuStep,
        params: &AttentionParams,
    ) -> Result<CpuTensor> {
        self.run(|| attention::attention(q, cache, step, params))
    }

    fn moe_route(
        &self,
        router_logits: &CpuTensor,
        top_k: usize,
        renormalize: bool,
    ) -> Result<CpuRoutes> {
        moe::route(router_logits, top_k, renormalize)
    }

    fn moe_routes_from_host(
        &self,
        ids: &[u32],
        weights: &[f32],
        top_k: usize,
    ) -> Result<CpuRoutes> {
        moe::routes_from_host(ids, weights, top_k)
    }

    fn moe_experts(
        &self,
        x: &CpuTensor,
        routes: &CpuRoutes,
        gate_up: &CpuWeight,
        down: &CpuWeight,
        num_experts: usize,
    ) -> Result<CpuTensor> {
        self.run(|| moe::experts(x, routes, gate_up, down, num_experts, self.threads))
    }

    fn sigmoid_gate_rows(&self, x: &mut CpuTensor, gate: &CpuTensor) -> Result<()> {
        moe::sigmoid_gate_rows(x, gate)
    }
}
