//! Shared helpers of the HTTP tests: a real server on 127.0.0.1 (port 0) in
//! front of the default model (SmolLM2-135M-Instruct Q4_1, f16 weights), and
//! small client helpers (JSON posts, SSE parsing).

#![allow(dead_code)]

use pagoda_engine::{EngineHandle, HandleOptions, LlmEngine, ModelRunner, SchedulerConfig};
use pagoda_kernels::cpu::{CpuBackend, CpuOptions, WeightDtype};
use pagoda_model::arch::{self, BuildOptions};
use pagoda_model::open::{open_model, OpenOptions};
use pagoda_model::tokenizer::Tokenizer;
use pagoda_server::{Server, ServerConfig, ServerError};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const BLOCK_SIZE: usize = 16;
pub const MODEL_NAME: &str = "smollm2-test";

pub fn default_model() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-default-model.sh",
        p.display()
    );
    p
}

/// How a test server differs from the default.
#[derive(Debug, Clone)]
pub struct Options {
    pub num_blocks: usize,
    pub max_model_len: usize,
    pub max_num_seqs: usize,
    pub max_waiting: Option<usize>,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    pub shutdown_timeout: Duration,
    /// Last changes to the server's settings.
    pub config: fn(&mut ServerConfig),
    pub max_seqs_per_request: usize,
    pub stream_stall_timeout: Duration,
    /// The engine's status line interval (`None`: no line).
    pub log_interval: Option<Duration>,
    /// A chat template file (relative to the repository root) replacing the model's.
    pub chat_template: Option<&'static str>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            num_blocks: 1024,
            max_model_len: 2048,
            max_num_seqs: 256,
            max_waiting: None,
            api_key: None,
            max_body_bytes: 8 << 20,
            shutdown_timeout: Duration::from_secs(30),
            config: |_| {},
            max_seqs_per_request: 256,
            stream_stall_timeout: Duration::from_secs(30),
            log_interval: None,
            chat_template: None,
        }
    }
}

pub struct TestServer {
    pub url: String,
    pub handle: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub client: reqwest::Client,
    shutdown: Option<oneshot::Sender<()>>,
    pub task: Option<JoinHandle<Result<(), ServerError>>>,
}

/// Loads the model and starts a server on a free port.
pub async fn start(opts: Options) -> TestServer {
    let files = open_model(&OpenOptions {
        model: Some(default_model()),
        config: None,
        dummy_weights: false,
        tokenizer: None,
    })
    .unwrap();
    let mut files = files;
    if let Some(path) = opts.chat_template {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(path);
        let source = std::fs::read_to_string(&path).unwrap();
        let tokenizer = files.tokenizer.as_mut().unwrap();
        Arc::get_mut(tokenizer)
            .unwrap()
            .set_chat_template(&source)
            .unwrap();
    }
    let tokenizer = files.tokenizer.clone().unwrap();
    let backend = CpuBackend::new(CpuOptions {
        threads: 2,
        weight_dtype: WeightDtype::F16,
    })
    .unwrap();
    let model = arch::build(
        &backend,
        &files.config,
        files.weights.as_ref(),
        BuildOptions {
            max_model_len: opts.max_model_len,
        },
        &mut |_, _| {},
    )
    .unwrap();
    let runner = ModelRunner::new(backend, model, BLOCK_SIZE, opts.num_blocks).unwrap();
    let sched = SchedulerConfig {
        block_size: BLOCK_SIZE,
        num_blocks: opts.num_blocks,
        max_num_batched_tokens: 2048,
        max_num_seqs: opts.max_num_seqs,
        max_model_len: opts.max_model_len,
        enable_prefix_caching: true,
    };
    let engine = LlmEngine::new(runner, Some(tokenizer.clone()), sched).unwrap();
    let handle = EngineHandle::spawn_with(
        engine,
        HandleOptions {
            max_waiting: opts.max_waiting,
            log_interval: opts.log_interval,
            ..HandleOptions::default()
        },
    )
    .unwrap();
    let mut config = ServerConfig::new(MODEL_NAME, opts.max_model_len);
    config.port = 0;
    config.api_key = opts.api_key.clone();
    config.max_body_bytes = opts.max_body_bytes;
    config.shutdown_timeout = opts.shutdown_timeout;
    (opts.config)(&mut config);
    config.kv_cache_tokens = Some(opts.num_blocks * BLOCK_SIZE);
    config.max_seqs_per_request = opts.max_seqs_per_request;
    config.stream_stall_timeout = opts.stream_stall_timeout;
    let server = Server::bind(config, handle.clone(), tokenizer.clone())
        .await
        .unwrap();
    let url = format!("http://{}", server.local_addr().unwrap());
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    TestServer {
        url,
        handle,
        tokenizer,
        client: reqwest::Client::new(),
        shutdown: Some(tx),
        task: Some(task),
    }
}

impl TestServer {
    /// Starts a streamed greedy completion of `prompt` that ignores EOS
    /// and may run to `max_tokens`; the response comes back unread.
    pub async fn open_stream(&self, prompt: &str, max_tokens: usize) -> reqwest::Response {
        let mut body = greedy(prompt, max_tokens);
        body["ignore_eos"] = serde_json::json!(true);
        body["stream"] = serde_json::json!(true);
        self.client
            .post(self.url("/v1/completions"))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// `host:port`, for raw TCP clients.
    pub fn addr(&self) -> &str {
        self.url.trim_start_matches("http://")
    }

    /// POSTs `body` as JSON; returns the status and the parsed body.
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, v)
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let r = self.client.get(self.url(path)).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// POSTs a streaming request; returns every `data:` payload in order.
    pub async fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let r = self
            .client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        assert_eq!(
            r.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        sse_payloads(&r.text().await.unwrap())
    }

    /// Sends the shutdown signal without waiting.
    pub fn signal_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Asks the server to stop and waits for it.
    pub async fn stop(&mut self) -> Result<(), ServerError> {
        self.signal_shutdown();
        match self.task.take() {
            Some(t) => t.await.unwrap(),
            None => Ok(()),
        }
    }

    /// A metric's value from `/metrics` (the first line starting with `name`).
    pub async fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics").await;
        parse_metric(&text, name)
    }

    /// Polls `/metrics` until `pred(value of name)` holds (10 s at most).
    pub async fn wait_metric(&self, name: &str, pred: impl Fn(f64) -> bool) -> f64 {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let v = self.metric(name).await;
            if pred(v) || std::time::Instant::now() > deadline {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

pub fn parse_metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| !l.starts_with('#') && l.split(' ').next() == Some(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
}

/// The payloads of `data: ...` events in an SSE body.
pub fn sse_payloads(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// Parses every payload but the final `[DONE]` (which must be there).
pub fn chunks(payloads: &[String]) -> Vec<Value> {
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
    payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str(p).unwrap())
        .collect()
}

/// A greedy completion request body.
pub fn greedy(prompt: &str, max_tokens: usize) -> Value {
    json!({"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
}

/// Reads what the server sends until it closes the connection (or
/// `limit` passes: then panics); returns the bytes and when it closed.
pub async fn read_until_closed(
    tcp: &mut tokio::net::TcpStream,
    limit: Duration,
) -> (String, std::time::Instant) {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(limit, read)
        .await
        .expect("the server did not close the connection");
    (
        String::from_utf8_lossy(&got).into_owned(),
        std::time::Instant::now(),
    )
}
