//! Subcommands and the options they share.

pub mod bench;
pub mod bench_decode;
pub mod bench_serve;
pub mod bench_workload;
pub mod chat;
pub mod device;
pub mod generate;
pub mod in_order;
pub mod info;
pub mod interrupt;
pub mod memory;
pub mod sampling;
pub mod serve;

use crate::progress;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
pub use device::{run_on_device, EngineTask};
use pagoda_model::open::{open_model, ModelFiles, OpenOptions};
pub use sampling::SamplingArgs;
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
    /// A Hugging Face tokenizer.json (or a directory with one) to use instead
    /// of the model's own tokenizer; tokenizer_config.json and
    /// chat_template.jinja next to it are read too.
    #[arg(long, value_name = "PATH")]
    pub tokenizer: Option<PathBuf>,
    /// A Jinja chat template file to use instead of the model's own.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// CPU threads for the forward pass (default: one per core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// How the CPU backend stores weight matrices: auto (the default) keeps
    /// quantized GGUF matrices in their blocks (integer kernels with 8-bit
    /// activations as llama.cpp's, least memory and memory traffic) and
    /// stores the rest in f16; f32/f16/bf16 dequantize everything at load
    /// (f32 is exact for dequantized GGUF weights).
    #[arg(long, value_enum, value_name = "DTYPE")]
    pub weight_dtype: Option<WeightDtypeArg>,
    /// Quantize the dense linear layers' weights at load: fp8 stores them
    /// as FP8 E4M3 with one scale per output channel and quantizes their
    /// inputs per token (FP8 GEMMs on CUDA; on the CPU a slow reference
    /// path for checking accuracy). Embeddings and the LM head stay as they
    /// are. FP8 checkpoints (compressed-tensors) load as FP8 without it.
    #[arg(long, value_enum, value_name = "METHOD")]
    pub quantization: Option<QuantizationArg>,
    #[command(flatten)]
    pub device: device::DeviceArgs,
}

impl ModelArgs {
    /// The CPU weight storage: --weight-dtype, auto by default.
    pub fn cpu_weight_dtype(&self) -> WeightDtypeArg {
        self.weight_dtype.unwrap_or(WeightDtypeArg::Auto)
    }
}

/// Weight quantization at load (`--quantization`).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantizationArg {
    Fp8,
}

/// Weight storage dtype on the CPU.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtypeArg {
    /// Quantized GGUF blocks as stored, f16 for the other matrices.
    Auto,
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
    /// Memory for the KV cache, e.g. 512MiB or 2GiB (default: 1GiB on the
    /// CPU; on CUDA, what --gpu-memory-utilization leaves).
    #[arg(long, value_name = "SIZE")]
    pub kv_cache_memory: Option<String>,
    /// Instead of --kv-cache-memory: this fraction of the memory still
    /// available once the weights are loaded (e.g. 0.5).
    #[arg(long, value_name = "F")]
    pub kv_cache_fraction: Option<f64>,
    /// Longest prompt + output per sequence (default: the model's context length).
    #[arg(long, value_name = "N")]
    pub max_model_len: Option<usize>,
    /// Token budget of one step: decodes count one each, prompt chunks fill
    /// the rest (default: 2048 on the CPU, 8192 on CUDA).
    #[arg(long, value_name = "N")]
    pub max_num_batched_tokens: Option<usize>,
    /// Most prompt tokens in a step that also decodes: bounds how much
    /// arriving prompts slow the tokens of running requests (the
    /// inter-token latency's tail); 0: no cap beyond the step budget
    /// (default: 2048 for `serve` on CUDA, else none).
    #[arg(long, value_name = "N")]
    pub mixed_prefill_budget: Option<usize>,
    /// Most sequences running at once.
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub max_num_seqs: usize,
    /// Turn off sharing of prompt prefixes between requests (the radix cache).
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// KV cache element type: auto (f32 on the CPU, bf16 on CUDA), bf16
    /// (CUDA), or fp8 (alias fp8_e4m3: E4M3 bytes with per-layer K/V scales,
    /// 1.0 unless the checkpoint has k_scale/v_scale; twice the tokens of
    /// bf16 in the same memory).
    #[arg(long, default_value = "auto", value_name = "DTYPE")]
    pub kv_cache_dtype: pagoda_kernels::KvCacheDtype,
}

impl CacheArgs {
    /// Fails fast on a malformed --kv-cache-memory, before the model is opened.
    pub fn check_kv_cache_memory(&self) -> Result<()> {
        if let Some(size) = &self.kv_cache_memory {
            if parse_size(size).is_err() {
                bail!("invalid --kv-cache-memory {size:?}: expected a size such as 512MiB, 2GiB or 1000000");
            }
        }
        Ok(())
    }
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
    args.device.check()?;
    let pb = progress::bar(1, "opening", quiet);
    let files = open_model(&OpenOptions {
        model: args.model.clone(),
        config: args.config.clone(),
        dummy_weights: args.dummy_weights,
        tokenizer: args.tokenizer.clone(),
    })?;
    pb.finish_and_clear();
    let mut files = files;
    if let Some(path) = &args.chat_template {
        let source = read_chat_template(path)?;
        let Some(tokenizer) = files.tokenizer.as_mut() else {
            bail!("--chat-template: the model has no tokenizer to use it with");
        };
        let Some(tokenizer) = std::sync::Arc::get_mut(tokenizer) else {
            bail!("--chat-template: the tokenizer is already shared");
        };
        tokenizer
            .set_chat_template(&source)
            .with_context(|| format!("--chat-template {}", path.display()))?;
        if let Some(template) = tokenizer.chat_template() {
            check_chat_template(template)
                .with_context(|| format!("--chat-template {}", path.display()))?;
        }
    }
    Ok(files)
}

/// Reads a `--chat-template` file.
pub fn read_chat_template(path: &std::path::Path) -> Result<String> {
    std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the chat template file {}", path.display()))
}

/// Renders a one-message conversation, so that a template that cannot
/// render fails at start-up rather than on every request.
pub fn check_chat_template(template: &pagoda_model::tokenizer::ChatTemplate) -> Result<()> {
    let probe = [pagoda_model::tokenizer::ChatMessage::new("user", "Hello")];
    template
        .apply(&probe, true)
        .context("the chat template does not render a one-message conversation")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{check_chat_template, parse_size, read_chat_template};
    use pagoda_model::tokenizer::ChatTemplate;

    #[test]
    fn chat_template_files_fail_clearly() {
        let missing = std::path::Path::new("/nonexistent/template.jinja");
        let e = read_chat_template(missing).unwrap_err();
        assert!(
            format!("{e:#}").contains("cannot read the chat template file"),
            "{e:#}"
        );
        let good = ChatTemplate::new("{{ messages[0].content }}", None, None).unwrap();
        check_chat_template(&good).unwrap();
        let raising = ChatTemplate::new("{{ raise_exception('no') }}", None, None).unwrap();
        let e = check_chat_template(&raising).unwrap_err();
        assert!(format!("{e:#}").contains("does not render"), "{e:#}");
        assert!(ChatTemplate::new("{% for %}", None, None).is_err());
    }

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
