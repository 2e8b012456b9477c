//! `--device`: which backend runs the model, and building an engine on it.
//!
//! Every command that runs a model hands its device-independent body to
//! [`run_on_device`] as an [`EngineTask`], whose one method is generic over
//! the backend; this module picks the backend, loads the weights onto it,
//! sizes the KV cache and builds the [`LlmEngine`], so no command holds code
//! per device. Without the `cuda` feature `--device cuda` fails with a clear
//! message before any weight is read.
//!
//! KV cache element type: `--kv-cache-dtype` (an FP8 cache takes the
//! checkpoint's per-layer `k_scale` / `v_scale` where it has them).
//!
//! Start-up report: every phase of building the engine is timed
//! ([`crate::startup`]) and logged at info level once it is ready.
//!
//! KV cache sizing: `--kv-cache-memory` when given; otherwise on the CPU
//! `--kv-cache-fraction` of the available host memory, or 1 GiB; on CUDA
//! `--gpu-memory-utilization` of the device's total memory minus what is in
//! use once the weights are loaded (activations live in the remainder).

use super::{parse_size, CacheArgs, ModelArgs, QuantizationArg, WeightDtypeArg};
use crate::progress;
use crate::startup::{StartupReport, TimedSource};
use anyhow::{bail, Context, Result};
use clap::Args;
use pagoda_engine::engine::stop_token_ids;
use pagoda_engine::structured::StructuredBuild;
use pagoda_engine::{LlmEngine, ModelRunner, SchedulerConfig};
use pagoda_kernels::cpu::{CpuBackend, CpuOptions, WeightDtype};
use pagoda_kernels::{Backend, KvCacheDtype};
use pagoda_model::arch::BuildOptions;
use pagoda_model::open::{ModelFiles, ModelFormat};

/// KV cache size on the CPU when no option names one.
const DEFAULT_CPU_KV_CACHE: &str = "1GiB";

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    /// A CUDA device ordinal.
    Cuda(usize),
}

impl std::str::FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Device::Cuda(n)),
                _ => Err(format!("unknown device {s:?}: use cpu, cuda or cuda:N")),
            },
        }
    }
}

/// Device options shared by every command that runs a model.
#[derive(Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Where the model runs: cpu, cuda (device 0) or cuda:N.
    #[arg(long, default_value = "cpu", value_name = "DEVICE")]
    pub device: Device,
    /// On CUDA: the fraction of the device's memory pagoda may fill; the KV
    /// cache gets this share of the total minus what is in use once the
    /// weights are loaded (ignored when --kv-cache-memory is given).
    #[arg(long, default_value_t = 0.9, value_name = "F")]
    pub gpu_memory_utilization: f64,
    /// On CUDA: run decode steps eagerly instead of replaying the CUDA
    /// graphs captured at start-up.
    #[arg(long)]
    pub enforce_eager: bool,
}

impl DeviceArgs {
    /// Refuses a device this binary cannot use, before any file is read.
    pub fn check(&self) -> Result<()> {
        if matches!(self.device, Device::Cuda(_)) && !cfg!(feature = "cuda") {
            bail!("this binary was built without CUDA support; rebuild with --features cuda");
        }
        let util = self.gpu_memory_utilization;
        if !(util > 0.0 && util <= 1.0) {
            bail!("--gpu-memory-utilization must be in (0, 1], got {util}");
        }
        Ok(())
    }
}

/// A command's body once its engine exists, for whichever backend it runs on.
pub trait EngineTask {
    type Output;
    fn run<B: Backend>(self, engine: LlmEngine<B>) -> Result<Self::Output>;
}

/// Builds the engine on the device `model.device` names and runs `task` on it.
pub fn run_on_device<T: EngineTask>(
    files: ModelFiles,
    model: &ModelArgs,
    cache: &CacheArgs,
    quiet: bool,
    task: T,
) -> Result<T::Output> {
    if model.quantization == Some(QuantizationArg::Fp8) && files.format == ModelFormat::Gguf {
        bail!(
            "--quantization fp8 needs unquantized weights (a Hugging Face safetensors \
             directory or --dummy-weights), not a GGUF file"
        );
    }
    let mut report = StartupReport::start();
    match model.device.device {
        Device::Cpu => {
            let backend = report.time("device", || -> Result<CpuBackend> {
                Ok(cpu_backend(model)?.with_kv_cache_dtype(cache.kv_cache_dtype)?)
            })?;
            task.run(build_engine(
                backend,
                files,
                cache,
                &model.device,
                quiet,
                report,
            )?)
        }
        Device::Cuda(ordinal) => run_on_cuda(ordinal, files, model, cache, quiet, report, task),
    }
}

#[cfg(feature = "cuda")]
fn run_on_cuda<T: EngineTask>(
    ordinal: usize,
    files: ModelFiles,
    model: &ModelArgs,
    cache: &CacheArgs,
    quiet: bool,
    mut report: StartupReport,
    task: T,
) -> Result<T::Output> {
    use pagoda_kernels::cuda::{CudaBackend, CudaOptions};
    model.device.check()?;
    if cache.kv_cache_fraction.is_some() {
        bail!("--kv-cache-fraction sizes the cache from host memory; on CUDA use --gpu-memory-utilization or --kv-cache-memory");
    }
    if model.weight_dtype.is_some() {
        tracing::warn!("--weight-dtype applies to the CPU only; CUDA keeps weights in bf16");
    }
    let backend = report
        .time("device", || {
            CudaBackend::new(CudaOptions { device: ordinal })
        })?
        .with_fp8_weights(model.quantization == Some(QuantizationArg::Fp8))
        .with_kv_cache_dtype(cache.kv_cache_dtype)?;
    let k = backend.kernel_startup();
    tracing::info!(
        "CUDA kernels: {} units compiled (the slowest in {:.2} s), {} from the disk cache, \
         in {:.2} s; modules loaded in {:.2} s",
        k.units_compiled,
        k.slowest_unit_s,
        k.units_cached,
        k.compile_s,
        k.load_s
    );
    report.add("device.context", k.context_s);
    report.add("device.kernels_compile", k.compile_s);
    report.add("device.kernels_slowest_unit", k.slowest_unit_s);
    report.add("device.kernels_load", k.load_s);
    task.run(build_engine(
        backend,
        files,
        cache,
        &model.device,
        quiet,
        report,
    )?)
}

#[cfg(not(feature = "cuda"))]
fn run_on_cuda<T: EngineTask>(
    _ordinal: usize,
    _files: ModelFiles,
    _model: &ModelArgs,
    _cache: &CacheArgs,
    _quiet: bool,
    _report: StartupReport,
    _task: T,
) -> Result<T::Output> {
    bail!("this binary was built without CUDA support; rebuild with --features cuda")
}

/// A backend that knows how much memory its KV cache may take, and how many
/// tokens one step takes when --max-num-batched-tokens is not given.
trait KvBudget: Backend {
    /// The step token budget by default: large enough that prompt chunks
    /// keep the device busy, small enough that decodes sharing the step are
    /// not held up long.
    const DEFAULT_MAX_NUM_BATCHED_TOKENS: usize;

    /// The prompt tokens of a step that also decodes, by default (`None`:
    /// the step budget).
    const DEFAULT_MIXED_PREFILL_BUDGET: Option<usize>;

    /// Bytes for the KV cache, read once the weights are on the device and
    /// the activation peak has been profiled; `util` is
    /// --gpu-memory-utilization.
    fn kv_cache_budget(&self, cache: &CacheArgs, util: f64) -> Result<usize>;

    /// Seconds the backend spent choosing GEMM algorithms by timing them
    /// (during the profiling steps), for the start-up report.
    fn gemm_tuning_secs(&self) -> f64 {
        0.0
    }

    /// A line for the start-up log on how the loaded weights run, if any.
    fn weight_note(&self) -> Option<String> {
        None
    }
}

fn cpu_backend(model: &ModelArgs) -> Result<CpuBackend> {
    let threads = model.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let chosen = model.cpu_weight_dtype();
    let weight_dtype = match chosen {
        WeightDtypeArg::Auto | WeightDtypeArg::F16 => WeightDtype::F16,
        WeightDtypeArg::F32 => WeightDtype::F32,
        WeightDtypeArg::Bf16 => WeightDtype::BF16,
    };
    Ok(CpuBackend::new(CpuOptions {
        threads,
        weight_dtype,
    })?
    .with_quantized_weights(chosen == WeightDtypeArg::Auto)
    .with_fp8_weights(model.quantization == Some(QuantizationArg::Fp8)))
}

impl KvBudget for CpuBackend {
    const DEFAULT_MAX_NUM_BATCHED_TOKENS: usize = 2048;
    const DEFAULT_MIXED_PREFILL_BUDGET: Option<usize> = None;

    fn kv_cache_budget(&self, cache: &CacheArgs, _util: f64) -> Result<usize> {
        match (&cache.kv_cache_memory, cache.kv_cache_fraction) {
            (Some(size), _) => parse_size(size),
            (None, Some(f)) if f > 0.0 && f <= 1.0 => {
                let available = available_memory().context(
                    "--kv-cache-fraction: cannot read available memory; use --kv-cache-memory",
                )?;
                Ok((available as f64 * f) as usize)
            }
            (None, Some(f)) => bail!("--kv-cache-fraction must be in (0, 1], got {f}"),
            (None, None) => parse_size(DEFAULT_CPU_KV_CACHE),
        }
    }
}

/// The CUDA backend with its memory-utilization target.
#[cfg(feature = "cuda")]
impl KvBudget for pagoda_kernels::cuda::CudaBackend {
    const DEFAULT_MAX_NUM_BATCHED_TOKENS: usize = 8192;
    /// None: offline work keeps its throughput (`pagoda serve` sets its own,
    /// see `SERVE_MIXED_PREFILL_BUDGET`).
    const DEFAULT_MIXED_PREFILL_BUDGET: Option<usize> = None;

    fn gemm_tuning_secs(&self) -> f64 {
        self.gemm_tuning_stats().secs
    }

    /// The FP8 GEMM path chosen when FP8 weights loaded.
    fn weight_note(&self) -> Option<String> {
        self.fp8_gemm_note()
    }

    fn kv_cache_budget(&self, cache: &CacheArgs, util: f64) -> Result<usize> {
        if let Some(size) = &cache.kv_cache_memory {
            return parse_size(size);
        }
        let (free, total) = self.mem_get_info()?;
        let used = total.saturating_sub(free);
        let pool = self.pool_reserved_bytes();
        let allowed = (total as f64 * util) as usize;
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        if allowed <= used {
            bail!(
                "--gpu-memory-utilization {}: {:.2} GiB of the device's {:.2} GiB are already in use \
                 with the weights and the activation peak, leaving nothing for the KV cache",
                util,
                gib(used),
                gib(total)
            );
        }
        tracing::info!(
            "device memory: {:.2} GiB total, {:.2} GiB in use after loading and profiling \
             (activation peak {:.2} GiB); KV cache gets {:.2} GiB",
            gib(total),
            gib(used),
            gib(pool),
            gib(allowed - used)
        );
        Ok(allowed - used)
    }
}

/// Loads the model onto `dev`, sizes the KV cache and builds the engine, with
/// a progress bar over the layers.
fn build_engine<B: KvBudget>(
    backend: B,
    files: ModelFiles,
    cache: &CacheArgs,
    device: &DeviceArgs,
    quiet: bool,
    mut report: StartupReport,
) -> Result<LlmEngine<B>> {
    let cfg = files.config.clone();
    let max_model_len = cache.max_model_len.unwrap_or(cfg.max_position_embeddings);
    let max_num_batched_tokens = cache
        .max_num_batched_tokens
        .unwrap_or(B::DEFAULT_MAX_NUM_BATCHED_TOKENS);
    if max_model_len == 0 || max_model_len > cfg.max_position_embeddings {
        bail!(
            "--max-model-len {max_model_len} must be between 1 and the model's context length {}",
            cfg.max_position_embeddings
        );
    }
    if let (Some(window), Err(why)) = (cfg.sliding_window, cfg.check_context_len(max_model_len)) {
        bail!("{why}: pass --max-model-len {window} (or less) to serve it exactly");
    }
    if cache.block_size == 0 {
        bail!("--block-size must be at least 1");
    }
    // Where the device samples, the structured-output compiler builds on a
    // thread of its own while the model loads, so that the first
    // constrained request does not wait for it.
    let structured_build = match &files.tokenizer {
        Some(t) if backend.samples_on_device() => Some(StructuredBuild::start(
            t.clone(),
            cfg.vocab_size,
            stop_token_ids(&cfg.eos_token_ids, Some(t)),
        )),
        _ => None,
    };
    let pb = progress::bar((cfg.num_hidden_layers + 2) as u64, "loading", quiet);
    // Time in the source is reading (or generating) weights; the rest of the
    // build is the backend's conversion and upload.
    let source = TimedSource::new(files.weights.as_ref());
    let t = std::time::Instant::now();
    let model = pagoda_model::arch::build(
        &backend,
        &cfg,
        &source,
        BuildOptions { max_model_len },
        &mut |done, total| {
            pb.set_length(total as u64);
            pb.set_position(done as u64);
        },
    )?;
    pb.finish_and_clear();
    report.add("weights_read", source.secs());
    report.add("weights_upload", t.elapsed().as_secs_f64() - source.secs());
    if let Some(note) = backend.weight_note() {
        tracing::info!("{note}");
    }
    // An FP8 cache takes the checkpoint's per-layer scales, where it has them.
    let kv_scales = if backend.kv_cache_fp8() {
        report.time("weights_read", || {
            pagoda_model::loader::kv_scales::kv_cache_scales(&source, cfg.num_hidden_layers)
        })?
    } else {
        None
    };
    drop(files.weights);
    // A one-block cache first: on a device, the profiling steps bring the
    // step memory to its peak, it is frozen into a fixed arena (no device
    // allocation ever after), and the KV cache is sized from what is left.
    let mut runner = report.time("runner", || {
        ModelRunner::new(backend, model, cache.block_size, 1)
    })?;
    if let Some(scales) = kv_scales {
        tracing::info!("KV cache: FP8 scales from the checkpoint");
        runner.set_kv_scales(scales)?;
    }
    let t = std::time::Instant::now();
    let reserved = report.time("profiling", || {
        runner.reserve_step_memory(max_num_batched_tokens, cache.max_num_seqs, max_model_len)
    })?;
    let tuning = runner.backend().gemm_tuning_secs();
    if tuning > 0.0 {
        report.add("profiling.gemm_tuning", tuning);
    }
    if let Some(bytes) = reserved {
        tracing::info!(
            "step memory: a fixed arena of {:.1} MiB (profiled in {:.2} s)",
            bytes as f64 / (1u64 << 20) as f64,
            t.elapsed().as_secs_f64()
        );
    }
    if let Some(s) = runner.backend().gemm_tuning_summary() {
        tracing::info!("GEMM algorithms: {s}");
    }
    let t_kv = std::time::Instant::now();
    let per_block = ModelRunner::kv_bytes_per_block(runner.backend(), &cfg, cache.block_size);
    let budget = runner
        .backend()
        .kv_cache_budget(cache, device.gpu_memory_utilization)?;
    let mut num_blocks = budget / per_block.max(1);
    if num_blocks == 0 {
        bail!(
            "a KV cache of {budget} bytes holds no KV block ({per_block} bytes each); \
             raise --kv-cache-memory or --gpu-memory-utilization"
        );
    }
    // Slots (block * block_size + offset) are 32-bit in the kernels: cap the
    // cache here, once, rather than fail a step later.
    let max_blocks = i32::MAX as usize / cache.block_size;
    if num_blocks > max_blocks {
        tracing::warn!(
            "the KV cache budget holds {num_blocks} blocks; capped at {max_blocks} \
             (slot indices are 32-bit)"
        );
        num_blocks = max_blocks;
    }
    let kv_dtype = match (runner.kv_cache_fp8(), cache.kv_cache_dtype) {
        (true, _) => "fp8".to_string(),
        (false, KvCacheDtype::Auto) => "auto".to_string(),
        (false, d) => d.to_string(),
    };
    let bytes_per_token = per_block / cache.block_size;
    tracing::info!(
        num_blocks,
        tokens = num_blocks * cache.block_size,
        bytes_per_token,
        "KV cache ({kv_dtype}): {} blocks of {} tokens ({} tokens, {} bytes per token, {:.2} GiB)",
        num_blocks,
        cache.block_size,
        num_blocks * cache.block_size,
        bytes_per_token,
        (num_blocks * per_block) as f64 / (1u64 << 30) as f64
    );
    let layout = runner.kv_layout();
    if layout.num_groups() > 1 {
        tracing::info!(
            "KV cache groups: {} ({} layers; windows {:?}), a block is a page of {} layer slots \
             ({} bytes per token of a page); prefix cache: {}",
            layout.num_groups(),
            layout.num_layers(),
            layout.windows,
            layout.num_slots,
            bytes_per_token,
            match cache.no_prefix_caching {
                true => "off",
                false => "on, whole blocks",
            }
        );
    }
    let kv = pagoda_engine::kv_footprint::kv_footprint(
        &cfg,
        per_block / (cache.block_size * layout.num_slots).max(1),
        max_model_len,
        cache.block_size,
    );
    tracing::info!(
        "KV per sequence: {}",
        pagoda_engine::kv_footprint::describe(&kv, "as cached")
    );
    runner.resize_kv_cache(num_blocks)?;
    report.add("kv_cache", t_kv.elapsed().as_secs_f64());
    if !device.enforce_eager {
        let t = std::time::Instant::now();
        let n = report.time("graphs", || {
            runner.capture_decode_graphs(cache.max_num_seqs, max_model_len)
        })?;
        if n > 0 {
            tracing::info!(
                "captured {n} decode graphs (batch sizes up to {}, contexts up to {:?} tokens) in {:.2} s",
                cache.max_num_seqs,
                runner
                    .graph_widths()
                    .iter()
                    .map(|w| w * cache.block_size)
                    .collect::<Vec<_>>(),
                t.elapsed().as_secs_f64()
            );
        }
    }
    let config = SchedulerConfig {
        block_size: cache.block_size,
        num_blocks,
        max_num_batched_tokens,
        max_num_seqs: cache.max_num_seqs,
        max_model_len,
        enable_prefix_caching: !cache.no_prefix_caching,
    };
    let mut engine = report.time("engine", || LlmEngine::new(runner, files.tokenizer, config))?;
    if let Some(b) = structured_build {
        engine.set_structured_build(b);
    }
    engine.set_mixed_prefill_budget(match cache.mixed_prefill_budget {
        Some(0) => None,
        Some(n) => Some(n),
        None => B::DEFAULT_MIXED_PREFILL_BUDGET,
    });
    report.finish();
    Ok(engine)
}

/// Bytes of memory the OS reports as available (Linux `MemAvailable`).
fn available_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::Device;

    #[test]
    fn devices_parse() {
        assert_eq!("cpu".parse::<Device>(), Ok(Device::Cpu));
        assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda(0)));
        assert_eq!("CUDA:3".parse::<Device>(), Ok(Device::Cuda(3)));
        assert!("cuda:x".parse::<Device>().is_err());
        assert!("tpu".parse::<Device>().is_err());
    }
}
