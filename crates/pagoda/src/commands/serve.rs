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
use pagoda_server::ServerConfig;
use std::time::Duration;

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
    /// Require `Authorization: Bearer KEY` on the API routes.
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Answer 503 (Retry-After) while this many requests wait to be scheduled.
    #[arg(long, value_name = "N")]
    pub max_waiting: Option<usize>,
    /// Seconds requests in flight may run after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub shutdown_timeout: u64,
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
}

pub fn run(args: ServeArgs) -> Result<()> {
    args.cache.check_kv_cache_memory()?;
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
    config.host = args.host.clone();
    config.port = args.port;
    config.api_key = args.api_key.clone();
    config.shutdown_timeout = Duration::from_secs(args.shutdown_timeout);
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
        let auth = if args.api_key.is_some() {
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
            },
        )?;
        Ok((handle, sched))
    }
}
