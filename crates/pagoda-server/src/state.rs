//! What every route shares: the engine handle, the tokenizer (and its lane to
//! the blocking pool, [`TextWork`]), the server's settings and the metrics.
//! Cheap to clone (one `Arc`).

use crate::metrics::Metrics;
use crate::text::TextWork;
use crate::ServerConfig;
use pagoda_engine::EngineHandle;
use pagoda_model::tokenizer::Tokenizer;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Shared state of the routes.
#[derive(Clone)]
pub struct AppState(pub Arc<Inner>);

pub struct Inner {
    pub handle: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    /// Runs tokenizer work off the async workers.
    pub text: TextWork,
    pub config: ServerConfig,
    pub metrics: Metrics,
    /// Unix time the server started (the model card's `created`).
    pub started: u64,
    /// Makes response ids unique within the process.
    next_id: AtomicU64,
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    pub fn new(config: ServerConfig, handle: EngineHandle, tokenizer: Arc<Tokenizer>) -> Self {
        AppState(Arc::new(Inner {
            handle,
            text: TextWork::new(tokenizer.clone(), config.max_model_len),
            tokenizer,
            config,
            metrics: Metrics::default(),
            started: unix_now(),
            next_id: AtomicU64::new(0),
        }))
    }

    /// A fresh response id such as `cmpl-18c2...-7`.
    pub fn response_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.started)
    }

    /// Checks the request's `model` against the served name (absent: fine).
    pub fn check_model(&self, model: Option<&str>) -> Result<(), crate::ApiError> {
        match model {
            Some(m) if m != self.config.served_model_name => Err(crate::ApiError::invalid_param(
                "model",
                format!(
                    "the model '{m}' does not exist; this server serves '{}'",
                    self.config.served_model_name
                ),
            )
            .with_code("model_not_found")),
            _ => Ok(()),
        }
    }
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
