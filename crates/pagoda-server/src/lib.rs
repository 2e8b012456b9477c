//! pagoda-server: an OpenAI-compatible HTTP API in front of an
//! [`EngineHandle`].
//!
//! The engine runs on its own thread; this crate only parses requests, turns
//! them into [`pagoda_engine::EngineRequest`]s, and turns the outputs back
//! into OpenAI JSON or server-sent events. It never schedules or computes.
//!
//! - [`openai`]: request and response types;
//! - [`routes`]: the handlers and the router;
//! - [`tools`], [`reasoning`]: tool calls and thinking parsed out of chat
//!   outputs, and the grammars that force calls;
//! - [`sse`]: streaming responses;
//! - [`error`]: [`ServerError`], and [`ApiError`] (OpenAI's error JSON);
//! - [`metrics`]: Prometheus text for `/metrics`;
//! - [`request_log`]: one log line per finished request;
//! - [`state`]: what the handlers share;
//! - [`text`]: tokenizer work off the async threads, and the byte bound that
//!   refuses a prompt too long for the model before tokenizing it;
//! - [`listen`]: the accept loop, the connection cap and the fd limit;
//! - [`conn`]: one connection, with header, body and keep-alive timeouts.
//!
//! Invariants: a client that disconnects aborts its requests at once (their
//! engine streams are dropped with the handler or the stream task); a
//! client that sends nothing, or too slowly, is cut off by a timeout; past
//! the connection cap clients get a 503 at once while `/health` keeps
//! answering; a shutdown signal stops accepting connections, lets requests
//! in flight finish for at most [`ServerConfig::shutdown_timeout`], then
//! returns.

pub mod conn;
pub mod error;
pub mod listen;
pub mod metrics;
pub mod openai;
pub mod reasoning;
pub mod request_log;
pub mod routes;
pub mod sse;
pub mod state;
pub mod text;
pub mod tools;

pub use error::{ApiError, ServerError};
pub use state::AppState;

use pagoda_engine::EngineHandle;
use pagoda_model::tokenizer::Tokenizer;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Settings of the HTTP server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub host: String,
    /// 0 picks a free port (see [`Server::local_addr`]).
    pub port: u16,
    /// The name clients send as `model` and `/v1/models` lists.
    pub served_model_name: String,
    /// When set, `/v1/*`, `/tokenize`, `/detokenize` and (unless
    /// `public_metrics`) `/metrics` need `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Serve `/metrics` without the API key.
    pub public_metrics: bool,
    /// The engine's longest prompt + output (from its scheduler config).
    pub max_model_len: usize,
    /// Larger request bodies get 413.
    pub max_body_bytes: usize,
    /// How long requests in flight may run after a shutdown signal.
    pub shutdown_timeout: Duration,
    /// Time to send a request's head: from connect on a fresh connection,
    /// from its first byte on a kept-alive one.
    pub header_read_timeout: Duration,
    /// Time to send a request's body, from the end of its head (then 408).
    pub body_read_timeout: Duration,
    /// How long a kept-alive connection may idle between requests.
    pub keep_alive_timeout: Duration,
    /// Connections served at once (past it: 503, `/health` still answers);
    /// None: sized below the file-descriptor limit ([`listen::Limits`]).
    pub max_connections: Option<usize>,
    /// Token slots of the engine's whole KV cache (blocks x block size), so
    /// that the default `max_tokens` fits the cache. `None`: not checked.
    pub kv_cache_tokens: Option<usize>,
    /// Most sequences (prompts x `n`) one request may start.
    pub max_seqs_per_request: usize,
    /// How long a stream may stay blocked on a client that does not read
    /// before its requests are aborted (see [`sse`]).
    pub stream_stall_timeout: Duration,
    /// The format tool calls are parsed in (None: requests with tools and a
    /// tool_choice other than none are refused); see [`tools::ToolFormat::detect`].
    pub tool_call_parser: Option<tools::ToolFormat>,
    /// Splits `<think>` sections into `reasoning_content` (None: no split).
    pub reasoning_parser: Option<reasoning::ReasoningFormat>,
    /// With `tool_choice: "none"`, keep `tools` from the template (by
    /// default they reach it, as in vLLM).
    pub exclude_tools_when_tool_choice_none: bool,
}

impl ServerConfig {
    /// Defaults for everything but the model's name and length.
    pub fn new(served_model_name: impl Into<String>, max_model_len: usize) -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8000,
            served_model_name: served_model_name.into(),
            api_key: None,
            public_metrics: false,
            max_model_len,
            max_body_bytes: 8 << 20,
            shutdown_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            keep_alive_timeout: Duration::from_secs(60),
            max_connections: None,
            kv_cache_tokens: None,
            max_seqs_per_request: 256,
            stream_stall_timeout: Duration::from_secs(30),
            tool_call_parser: None,
            reasoning_parser: None,
            exclude_tools_when_tool_choice_none: false,
        }
    }
}

/// A bound, not yet serving, server.
pub struct Server {
    listener: tokio::net::TcpListener,
    state: AppState,
    limits: listen::Limits,
}

impl Server {
    /// Binds `config.host:config.port`.
    pub async fn bind(
        config: ServerConfig,
        handle: EngineHandle,
        tokenizer: Arc<Tokenizer>,
    ) -> Result<Self, ServerError> {
        let addr = format!("{}:{}", config.host, config.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|source| ServerError::Bind { addr, source })?;
        let fd_limit = listen::fd_limit();
        let limits = listen::Limits::new(fd_limit, config.max_connections);
        if let Some(fds) = fd_limit {
            let needed = (limits.max_connections + limits.overflow) as u64 + 64;
            if needed > fds {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    fd_limit = fds,
                    "the connection cap is near the open-file limit; \
                     accepting may stall (backing off) before the cap is reached"
                );
            }
        }
        Ok(Server {
            listener,
            state: AppState::new(config, handle, tokenizer),
            limits,
        })
    }

    /// The connection limits in force.
    pub fn limits(&self) -> listen::Limits {
        self.limits
    }

    pub fn local_addr(&self) -> Result<SocketAddr, ServerError> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves until `shutdown` resolves, then drains (bounded wait).
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let drain = self.state.config.shutdown_timeout;
        listen::serve(self.listener, self.state, self.limits, shutdown, drain).await;
        Ok(())
    }
}

/// Binds and serves until `shutdown_signal` resolves.
pub async fn serve(
    config: ServerConfig,
    handle: EngineHandle,
    tokenizer: Arc<Tokenizer>,
    shutdown_signal: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    Server::bind(config, handle, tokenizer)
        .await?
        .run(shutdown_signal)
        .await
}

/// Resolves on SIGINT (Ctrl-C) or, on Unix, SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
}
