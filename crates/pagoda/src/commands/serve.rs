//! `pagoda serve`: loads the model, starts the engine thread, and serves the
//! OpenAI-compatible API (see the `pagoda-server` crate) until SIGINT or
//! SIGTERM; then stops accepting, lets requests in flight finish (bounded),
//! stops the engine, and exits 0.

use super::{open, run_on_device, CacheArgs, EngineTask, ModelArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use pagoda_core::SchedulerConfig;
use pagoda_engine::{EngineHandle, HandleOptions, LlmEngine, ShutdownMode};
use pagoda_kernels::Backend;
use pagoda_server::reasoning::ReasoningFormat;
use pagoda_server::tools::ToolFormat;
use pagoda_server::ServerConfig;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The environment variable the API key is read from when no option gives it.
pub const API_KEY_ENV: &str = "PAGODA_API_KEY";

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1", value_name = "HOST")]
    pub host: String,
    /// Port to listen on (0: any free port).
    #[arg(long, default_value_t = 8000, value_name = "PORT")]
    pub port: u16,
    /// Model name clients send as `model` (default: the model file's name).
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,
    /// Require `Authorization: Bearer KEY` on the API routes and /metrics
    /// (visible in `ps`: prefer --api-key-file or the PAGODA_API_KEY
    /// environment variable, used when neither option is given).
    #[arg(long, value_name = "KEY", conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// Read the API key from this file (surrounding whitespace is ignored).
    #[arg(long, value_name = "PATH")]
    pub api_key_file: Option<PathBuf>,
    /// Serve /metrics without the API key.
    #[arg(long)]
    pub public_metrics: bool,
    /// Answer 503 (Retry-After) while this many requests wait to be scheduled.
    #[arg(long, value_name = "N")]
    pub max_waiting: Option<usize>,
    /// Seconds requests in flight may run after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub shutdown_timeout: u64,
    /// Seconds a client has to send a request's head (from connecting, or
    /// from the request's first byte on a kept-alive connection).
    #[arg(long, default_value_t = 10, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub header_read_timeout: u64,
    /// Seconds a client has to send a request's body once its head is in
    /// (then 408).
    #[arg(long, default_value_t = 30, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub body_read_timeout: u64,
    /// Seconds a kept-alive connection may idle between requests.
    #[arg(long, default_value_t = 60, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub keep_alive_timeout: u64,
    /// Connections served at once; past it clients get 503 while /health
    /// still answers (default: below the open-file limit, which is raised
    /// to its hard limit at start; at most 8192).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: Option<u64>,
    /// Most sequences (prompts x n) one request may start; more is a 400.
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub max_seqs_per_request: usize,
    /// Seconds a stream may wait on a client that stopped reading before its
    /// request is aborted and its KV blocks freed.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub stream_stall_timeout: u64,
    /// While requests run, log the engine's status (running/waiting,
    /// tokens/s, KV usage, prefix hit rate) every SECONDS (0: never).
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub log_stats_interval: u64,
    /// The format of tool calls in the model's output, parsed into
    /// `tool_calls` (default: told from the chat template: `<tool_call>`
    /// hermes, `[TOOL_CALLS]` mistral, Llama 3 headers with `<|python_tag|>`
    /// or `"parameters"` llama3_json; otherwise requests with tools are
    /// refused unless tool_choice is none).
    #[arg(long, value_name = "FORMAT", value_parser = ["hermes", "llama3_json", "mistral"])]
    pub tool_call_parser: Option<String>,
    /// Move the model's `<think>` sections into `reasoning_content`
    /// (deepseek_r1: the output starts inside the thinking).
    #[arg(long, value_name = "FORMAT", value_parser = ["qwen3", "deepseek_r1"])]
    pub reasoning_parser: Option<String>,
    /// With tool_choice "none", leave the request's tools out of the chat
    /// template (by default the template sees them, as in vLLM).
    #[arg(long)]
    pub exclude_tools_when_tool_choice_none: bool,
}

/// `pagoda serve`'s mixed-step prefill budget on CUDA unless one is given: a
/// quarter of the step budget, which bounds the inter-token latency's tail
/// (a 256-stream decode step with 8,192 prompt tokens takes several times
/// one without) at some cost in throughput (BENCHMARKS.md has both).
const SERVE_MIXED_PREFILL_BUDGET: usize = 2048;

pub fn run(mut args: ServeArgs) -> Result<()> {
    args.cache.check_kv_cache_memory()?;
    if args.cache.mixed_prefill_budget.is_none()
        && matches!(args.model.device.device, super::device::Device::Cuda(_))
    {
        args.cache.mixed_prefill_budget = Some(SERVE_MIXED_PREFILL_BUDGET);
    }
    let api_key = resolve_api_key(
        args.api_key.as_deref(),
        args.api_key_file.as_deref(),
        std::env::var_os(API_KEY_ENV),
    )?;
    let files = open(&args.model, false)?;
    let Some(tokenizer) = files.tokenizer.clone() else {
        bail!("the model has no tokenizer, so it cannot be served over text APIs");
    };
    let name = args.served_model_name.clone().unwrap_or_else(|| {
        files
            .path
            .as_ref()
            .and_then(|p| p.file_stem().or_else(|| p.file_name()))
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "pagoda".into())
    });
    let (handle, sched) = run_on_device(
        files,
        &args.model,
        &args.cache,
        false,
        Spawn {
            max_waiting: args.max_waiting,
            log_interval: (args.log_stats_interval > 0)
                .then(|| Duration::from_secs(args.log_stats_interval)),
        },
    )?;
    let mut config = ServerConfig::new(name.clone(), sched.max_model_len);
    config.tool_call_parser = match args.tool_call_parser.as_deref() {
        Some(n) => ToolFormat::from_name(n),
        None => tokenizer
            .chat_template()
            .and_then(|t| ToolFormat::detect(t.source())),
    };
    config.exclude_tools_when_tool_choice_none = args.exclude_tools_when_tool_choice_none;
    config.reasoning_parser = args
        .reasoning_parser
        .as_deref()
        .and_then(ReasoningFormat::from_name);
    let parsers = format!(
        "tool calls: {}, reasoning: {}",
        config.tool_call_parser.map_or("none", ToolFormat::name),
        config
            .reasoning_parser
            .map_or("none", ReasoningFormat::name)
    );
    config.host = args.host.clone();
    config.port = args.port;
    config.public_metrics = args.public_metrics;
    let has_key = api_key.is_some();
    config.api_key = api_key;
    config.shutdown_timeout = Duration::from_secs(args.shutdown_timeout);
    config.header_read_timeout = Duration::from_secs(args.header_read_timeout);
    config.body_read_timeout = Duration::from_secs(args.body_read_timeout);
    config.keep_alive_timeout = Duration::from_secs(args.keep_alive_timeout);
    config.max_connections = args
        .max_connections
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    // Idle clients must not exhaust a low default open-file limit.
    let fd_limit = match pagoda_server::listen::raise_fd_limit() {
        Ok(limit) => limit,
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-file limit");
            pagoda_server::listen::fd_limit()
        }
    };
    config.kv_cache_tokens = Some(sched.num_blocks * sched.block_size);
    if args.max_seqs_per_request == 0 {
        bail!("--max-seqs-per-request must be at least 1");
    }
    config.max_seqs_per_request = args.max_seqs_per_request;
    config.stream_stall_timeout = Duration::from_secs(args.stream_stall_timeout.max(1));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("pagoda-http")
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let server = pagoda_server::Server::bind(config, handle.clone(), tokenizer).await?;
        let addr = server.local_addr()?;
        let url = format!("http://{addr}");
        let auth = if has_key {
            " -H 'Authorization: Bearer $KEY'"
        } else {
            ""
        };
        eprintln!("pagoda serve");
        eprintln!("  model:     {name} (max_model_len {})", sched.max_model_len);
        eprintln!(
            "  KV cache:  {} tokens ({} blocks of {})",
            sched.num_blocks * sched.block_size,
            sched.num_blocks,
            sched.block_size
        );
        eprintln!("  listening: {url}  (OpenAI API under {url}/v1)");
        eprintln!("  parsers:   {parsers}");
        let limits = server.limits();
        eprintln!(
            "  connections: up to {} (then 503; /health on {} more), open-file limit {}",
            limits.max_connections,
            limits.overflow,
            fd_limit.map_or("unlimited".to_string(), |l| l.to_string())
        );
        eprintln!("  try:");
        eprintln!(
            "    curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} \\\n      \
             -d '{{\"model\": \"{name}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}], \"max_tokens\": 64}}'"
        );
        server.run(pagoda_server::shutdown_signal()).await?;
        eprintln!("pagoda serve: stopped accepting; stopping the engine");
        // Requests still running after the drain timeout are aborted.
        handle.shutdown(ShutdownMode::Abort).await?;
        anyhow::Ok(())
    })
}

/// The API key: `--api-key`, else the contents of `--api-key-file`, else
/// the environment variable (`env`); none of them: no key. An empty key is
/// an error rather than an open server.
pub fn resolve_api_key(
    flag: Option<&str>,
    file: Option<&Path>,
    env: Option<OsString>,
) -> Result<Option<String>> {
    let (key, from) = if let Some(k) = flag {
        (k.to_string(), "--api-key".to_string())
    } else if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the API key file {}", path.display()))?;
        (text, format!("the API key file {}", path.display()))
    } else if let Some(v) = env {
        let Ok(v) = v.into_string() else {
            bail!("{API_KEY_ENV} is not valid UTF-8");
        };
        (v, API_KEY_ENV.to_string())
    } else {
        return Ok(None);
    };
    let key = key.trim();
    if key.is_empty() {
        bail!("the API key from {from} is empty");
    }
    if key.chars().any(|c| c.is_whitespace() || c.is_control()) {
        bail!("the API key from {from} contains whitespace or control characters");
    }
    Ok(Some(key.to_string()))
}

/// Starts the engine thread, on whichever backend the engine was built for.
struct Spawn {
    max_waiting: Option<usize>,
    log_interval: Option<Duration>,
}

impl EngineTask for Spawn {
    type Output = (EngineHandle, SchedulerConfig);

    fn run<B: Backend>(self, engine: LlmEngine<B>) -> Result<Self::Output> {
        let sched = engine.scheduler_config().clone();
        let handle = EngineHandle::spawn_with(
            engine,
            HandleOptions {
                max_waiting: self.max_waiting,
                log_interval: self.log_interval,
                ..HandleOptions::default()
            },
        )?;
        Ok((handle, sched))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_key_from_flag_file_or_environment_in_that_order() {
        let dir = std::env::temp_dir().join(format!("pagoda-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("key");
        std::fs::write(&file, "from-file\n").unwrap();
        let env = || Some(OsString::from("from-env"));
        let k = |f, p, e| resolve_api_key(f, p, e).unwrap();
        assert_eq!(k(Some("flag"), Some(&file), env()).as_deref(), Some("flag"));
        assert_eq!(k(None, Some(&file), env()).as_deref(), Some("from-file"));
        assert_eq!(k(None, None, env()).as_deref(), Some("from-env"));
        assert_eq!(k(None, None, None), None);

        std::fs::write(&file, " \n").unwrap();
        let e = resolve_api_key(None, Some(&file), None).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
        let e = resolve_api_key(None, None, Some(OsString::new())).unwrap_err();
        assert!(e.to_string().contains(API_KEY_ENV), "{e}");
        std::fs::write(&file, "two words").unwrap();
        assert!(resolve_api_key(None, Some(&file), None).is_err());
        let missing = dir.join("missing");
        let e = resolve_api_key(None, Some(&missing), None).unwrap_err();
        assert!(e.to_string().contains("cannot read"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
