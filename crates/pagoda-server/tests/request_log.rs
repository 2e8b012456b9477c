//! The log lines of a serving process, captured as JSON: one line per
//! finished request (id, status, tokens, TTFT, total time, finish reason),
//! including a streaming client that went away, and the engine's periodic
//! status line while busy.

mod common;

use common::*;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    fn lines(&self) -> Vec<Value> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The request lines (message "request finished").
    fn requests(&self) -> Vec<Value> {
        self.lines()
            .into_iter()
            .filter(|l| l["message"] == "request finished")
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_finished_request_is_logged_once_and_the_engine_reports_while_busy() {
    let capture = Capture::default();
    let writer = capture.clone();
    tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_env_filter("info")
        .with_writer(move || writer.clone())
        .init();
    let s = start(Options {
        log_interval: Some(Duration::from_millis(100)),
        ..Options::default()
    })
    .await;

    // Non-streaming.
    let (status, v) = s
        .post("/v1/completions", &greedy("The capital of France is", 20))
        .await;
    assert_eq!(status, 200, "{v}");
    let mut body = greedy("The capital of France is", 20);
    body["ignore_eos"] = json!(true);
    let (_, v) = s.post("/v1/completions", &body).await;
    let id = v["id"].as_str().unwrap().to_string();
    let line = capture
        .requests()
        .into_iter()
        .find(|l| l["id"] == id.as_str())
        .unwrap_or_else(|| panic!("no line for {id}: {:?}", capture.lines()));
    assert_eq!(line["level"], "INFO");
    assert_eq!(line["route"], "/v1/completions");
    assert_eq!(line["status"], 200);
    assert_eq!(line["prompt_tokens"], v["usage"]["prompt_tokens"]);
    assert_eq!(line["output_tokens"], 20);
    assert_eq!(
        line["cached_tokens"],
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
    );
    assert_eq!(line["finish_reason"], "length");
    let (ttft, total) = (
        line["ttft_ms"].as_f64().unwrap(),
        line["total_ms"].as_f64().unwrap(),
    );
    assert!(0.0 < ttft && ttft <= total, "{line}");

    // Streaming chat.
    let messages = json!([{"role": "user", "content": "Say hi"}]);
    let payloads = s
        .stream(
            "/v1/chat/completions",
            &json!({"messages": messages, "max_tokens": 5, "stream": true, "ignore_eos": true}),
        )
        .await;
    let chunk: Value = serde_json::from_str(&payloads[0]).unwrap();
    let id = chunk["id"].as_str().unwrap().to_string();
    let line = capture
        .requests()
        .into_iter()
        .find(|l| l["id"] == id.as_str())
        .unwrap_or_else(|| panic!("no line for {id}"));
    assert_eq!(line["status"], 200);
    assert_eq!(line["output_tokens"], 5);
    assert_eq!(line["finish_reason"], "length");

    // A streaming client that goes away: logged as 499, abort.
    let mut r = s.open_stream("Tell me about Rome.", 1500).await;
    let first = r.chunk().await.unwrap().unwrap();
    let first: Value = serde_json::from_str(
        std::str::from_utf8(&first)
            .unwrap()
            .trim()
            .trim_start_matches("data: "),
    )
    .unwrap();
    let id = first["id"].as_str().unwrap().to_string();
    drop(r);
    let mut line = None;
    for _ in 0..500 {
        line = capture
            .requests()
            .into_iter()
            .find(|l| l["id"] == id.as_str());
        if line.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let line = line.unwrap_or_else(|| panic!("no line for {id}"));
    assert_eq!(line["status"], 499);
    assert_eq!(line["finish_reason"], "abort");

    // Exactly one line per request.
    assert_eq!(capture.requests().len(), 4);
    // The engine's status line, from its own thread.
    let engine: Vec<Value> = capture
        .lines()
        .into_iter()
        .filter(|l| l["target"] == "pagoda_engine::stats")
        .collect();
    assert!(!engine.is_empty());
    for l in &engine {
        for field in [
            "running",
            "waiting",
            "prompt_tokens_per_s",
            "generation_tokens_per_s",
            "kv_usage_percent",
            "prefix_hit_percent",
        ] {
            assert!(l[field].is_number(), "{field} in {l}");
        }
    }
    assert!(engine
        .iter()
        .any(|l| l["generation_tokens_per_s"].as_f64() > Some(0.0)));
}
