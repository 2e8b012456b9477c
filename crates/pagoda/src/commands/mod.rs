//! Subcommands and the options they share.

pub mod bench;
pub mod bench_serve;
pub mod generate;
pub mod info;
pub mod serve;

use crate::progress;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use pagoda_engine::{LlmEngine, ModelRunner, SchedulerConfig};
use pagoda_kernels::cpu::{CpuBackend, CpuOptions, WeightDtype};
use pagoda_model::arch::BuildOptions;
use pagoda_model::open::{open_model, ModelFiles, OpenOptions};
use std::path::PathBuf;

/// Which model to load and how to hold it.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model to load: a .gguf file, or a Hugging Face directory holding
    /// config.json, model.safetensors (or shards with an index) and tokenizer.json.
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// Use deterministic random weights of the model's real shape instead of
    /// loading any (for benchmarks); needs --config or a --model directory.
    #[arg(long)]
    pub dummy_weights: bool,
    /// A Hugging Face config.json describing the model (with --dummy-weights).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// CPU threads for the forward pass (default: one per core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// How the CPU backend stores weight matrices: f32 is exact for dequantized
    /// GGUF weights, f16/bf16 halve memory traffic and decode faster.
    #[arg(long, value_enum, default_value_t = WeightDtypeArg::F16)]
    pub weight_dtype: WeightDtypeArg,
}

/// Weight storage dtype on the CPU.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtypeArg {
    F32,
    F16,
    Bf16,
}

/// KV cache sizing.
#[derive(Args, Debug, Clone)]
pub struct CacheArgs {
    /// Tokens per KV cache block.
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub block_size: usize,
    /// Memory for the KV cache, e.g. 512MiB or 2GiB.
    #[arg(long, default_value = "1GiB", value_name = "SIZE")]
    pub kv_cache_memory: String,
    /// Instead of --kv-cache-memory: this fraction of the memory still
    /// available once the weights are loaded (e.g. 0.5).
    #[arg(long, value_name = "F")]
    pub kv_cache_fraction: Option<f64>,
    /// Longest prompt + output per sequence (default: the model's context length).
    #[arg(long, value_name = "N")]
    pub max_model_len: Option<usize>,
    /// Token budget of one step: decodes count one each, prompt chunks fill the rest.
    #[arg(long, default_value_t = 2048, value_name = "N")]
    pub max_num_batched_tokens: usize,
    /// Most sequences running at once.
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub max_num_seqs: usize,
    /// Turn off sharing of prompt prefixes between requests (the radix cache).
    #[arg(long)]
    pub no_prefix_caching: bool,
}

/// Parses sizes like `512MiB`, `2GiB`, `1.5GB`, `1000000`.
pub fn parse_size(s: &str) -> Result<usize> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().with_context(|| format!("invalid size {s:?}"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => bail!("invalid size unit {other:?} in {s:?} (use B, KiB, MiB, GiB, KB, MB, GB)"),
    };
    Ok((value * mult) as usize)
}

/// Opens the model named by `args` (weights, config, tokenizer).
pub fn open(args: &ModelArgs, quiet: bool) -> Result<ModelFiles> {
    let pb = progress::bar(1, "opening", quiet);
    let files = open_model(&OpenOptions {
        model: args.model.clone(),
        config: args.config.clone(),
        dummy_weights: args.dummy_weights,
    })?;
    pb.finish_and_clear();
    Ok(files)
}

/// Builds a CPU engine for `files`, with a progress bar over the layers.
pub fn build_engine(
    files: ModelFiles,
    model: &ModelArgs,
    cache: &CacheArgs,
    quiet: bool,
) -> Result<LlmEngine<CpuBackend>> {
    let threads = model.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let weight_dtype = match model.weight_dtype {
        WeightDtypeArg::F32 => WeightDtype::F32,
        WeightDtypeArg::F16 => WeightDtype::F16,
        WeightDtypeArg::Bf16 => WeightDtype::BF16,
    };
    let backend = CpuBackend::new(CpuOptions {
        threads,
        weight_dtype,
    })?;
    let cfg = files.config.clone();
    let max_model_len = cache.max_model_len.unwrap_or(cfg.max_position_embeddings);
    if max_model_len == 0 || max_model_len > cfg.max_position_embeddings {
        bail!(
            "--max-model-len {max_model_len} must be between 1 and the model's context length {}",
            cfg.max_position_embeddings
        );
    }
    if cache.block_size == 0 {
        bail!("--block-size must be at least 1");
    }
    let pb = progress::bar((cfg.num_hidden_layers + 2) as u64, "loading", quiet);
    let model = pagoda_model::arch::build(
        &backend,
        &cfg,
        files.weights.as_ref(),
        BuildOptions { max_model_len },
        &mut |done, total| {
            pb.set_length(total as u64);
            pb.set_position(done as u64);
        },
    )?;
    pb.finish_and_clear();
    drop(files.weights);
    let per_block = ModelRunner::kv_bytes_per_block(&backend, &cfg, cache.block_size);
    let budget = match cache.kv_cache_fraction {
        Some(f) if f > 0.0 && f <= 1.0 => {
            let available = available_memory().context(
                "--kv-cache-fraction: cannot read available memory; use --kv-cache-memory",
            )?;
            (available as f64 * f) as usize
        }
        Some(f) => bail!("--kv-cache-fraction must be in (0, 1], got {f}"),
        None => parse_size(&cache.kv_cache_memory)?,
    };
    let num_blocks = budget / per_block.max(1);
    if num_blocks == 0 {
        bail!(
            "--kv-cache-memory {} holds no KV block ({} bytes each)",
            cache.kv_cache_memory,
            per_block
        );
    }
    tracing::info!(
        num_blocks,
        tokens = num_blocks * cache.block_size,
        "KV cache: {} blocks of {} tokens ({} tokens)",
        num_blocks,
        cache.block_size,
        num_blocks * cache.block_size
    );
    let runner = ModelRunner::new(backend, model, cache.block_size, num_blocks)?;
    let config = SchedulerConfig {
        block_size: cache.block_size,
        num_blocks,
        max_num_batched_tokens: cache.max_num_batched_tokens,
        max_num_seqs: cache.max_num_seqs,
        max_model_len,
        enable_prefix_caching: !cache.no_prefix_caching,
    };
    Ok(LlmEngine::new(runner, files.tokenizer, config)?)
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
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
    }
}
