//! Requests that ask too much and clients that stop reading: large texts are
//! tokenized off the async workers (so `/health` keeps answering) and a
//! prompt too long for the model is refused from its length alone; a request
//! may start only so many sequences; the default `max_tokens` fits a small KV
//! cache; a stream whose client stops reading is paused (the engine computes
//! only a bounded number of tokens past what the server buffered), aborted
//! after the stall timeout, and returns its KV blocks.

mod common;

use common::*;
use pagoda_engine::{RequestOutput, DEFAULT_PAUSE_BACKLOG};
use pagoda_server::openai::{SamplingFields, Usage};
use pagoda_server::request_log::RequestLog;
use pagoda_server::routes::generation::submit_all;
use pagoda_server::routes::params::ChoiceParams;
use pagoda_server::sse::{stream_response, ChunkFormatter};
use pagoda_server::{AppState, ServerConfig};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// `len` bytes of distinct pseudo-random words (no two alike, so the
/// tokenizer's word cache does not make it cheap).
fn words(len: usize, seed: u64) -> String {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let mut s = String::with_capacity(len + 16);
    while s.len() < len {
        let n = 3 + (x >> 60) as usize % 7;
        for _ in 0..n {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            s.push((b'a' + ((x >> 33) % 26) as u8) as char);
        }
        s.push(' ');
    }
    s.truncate(len);
    s
}

fn assert_refusal(v: &Value, param: &str, needle: &str) {
    let e = &v["error"];
    assert_eq!(e["type"], "invalid_request_error", "{v}");
    assert_eq!(e["param"], param, "{v}");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains(needle), "{msg}");
    // No engine request id leaks into a message.
    assert!(
        !msg.split("request ")
            .skip(1)
            .any(|rest| rest.starts_with(|c: char| c.is_ascii_digit())),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_while_large_texts_are_tokenized() {
    let s = start(Options {
        max_model_len: 8192,
        ..Options::default()
    })
    .await;
    // Just under the byte bound, so each text is tokenized in full.
    let limit = s.tokenizer.max_bytes_per_token().unwrap() * 8192;
    let texts: Vec<String> = (0..4).map(|i| words(limit - 100, i)).collect();
    let started = Instant::now();
    let tasks: Vec<_> = texts
        .into_iter()
        .map(|t| {
            let (client, url) = (s.client.clone(), s.url("/tokenize"));
            tokio::spawn(async move {
                let r = client
                    .post(url)
                    .json(&json!({"prompt": t}))
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                (status, Instant::now())
            })
        })
        .collect();
    let mut worst = Duration::ZERO;
    let mut probes = 0;
    while tasks.iter().any(|t| !t.is_finished()) {
        let t0 = Instant::now();
        let (status, _) = s.get("/health").await;
        assert_eq!(status, 200);
        worst = worst.max(t0.elapsed());
        probes += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut first_done = None;
    for t in tasks {
        let (status, done) = t.await.unwrap();
        // Over max_model_len tokens: refused, but only after tokenizing.
        assert!(status == 200 || status == 400, "{status}");
        first_done = Some(first_done.map_or(done, |d: Instant| d.min(done)));
    }
    let busy = first_done.unwrap() - started;
    eprintln!("tokenizing took {busy:?}; {probes} /health probes, the slowest {worst:?}");
    assert!(probes >= 3, "tokenizing was too quick to tell ({busy:?})");
    assert!(
        worst * 4 < busy,
        "/health took {worst:?} while tokenizing took {busy:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_prompt_is_refused_without_tokenizing_it() {
    let s = start(Options::default()).await;
    let huge = words(7 << 20, 9);
    for (path, body, param) in [
        (
            "/v1/completions",
            json!({"prompt": huge, "max_tokens": 4}),
            "prompt",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": huge}]}),
            "messages",
        ),
        ("/tokenize", json!({"prompt": huge}), "prompt"),
    ] {
        let t0 = Instant::now();
        let (status, v) = s.post(path, &body).await;
        let took = t0.elapsed();
        assert_eq!(status, 400, "{path}: {v}");
        assert_refusal(&v, param, "2048 tokens");
        assert_eq!(v["error"]["code"], "context_length_exceeded");
        // Tokenizing 7 MiB takes seconds; measuring its length does not.
        assert!(took < Duration::from_millis(1500), "{path}: {took:?}");
    }
    // Just over max_model_len tokens but within the byte bound: tokenized,
    // then refused all the same.
    let (status, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": words(20_000, 3), "max_tokens": 4}),
        )
        .await;
    assert_eq!(status, 400, "{v}");
    assert_refusal(&v, "prompt", "2048 tokens");
    assert_eq!(
        s.handle
            .stats()
            .await
            .unwrap()
            .counters
            .num_requests_admitted,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequences_per_request_are_capped() {
    let s = start(Options {
        max_seqs_per_request: 256,
        ..Options::default()
    })
    .await;
    let prompts = vec!["hi"; 500];
    let (status, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": prompts, "n": 128, "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, 400, "{v}");
    assert_refusal(&v, "n", "limit of 256");
    let (status, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": vec!["hi"; 257], "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, 400, "{v}");
    assert_refusal(&v, "prompt", "257 sequences");
    let (status, v) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "n": 128, "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 128);
    let stats = s.handle.stats().await.unwrap();
    assert_eq!(stats.counters.num_requests_admitted, 128);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_max_tokens_fits_a_small_kv_cache() {
    // 22 blocks of 16 tokens: 352 slots.
    let s = start(Options {
        num_blocks: 22,
        ..Options::default()
    })
    .await;
    let messages = json!([{"role": "user", "content": "Write a long story about a dragon."}]);
    let (status, v) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": messages, "temperature": 0, "ignore_eos": true}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let completion = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // As much as the whole cache can hold: prompt + output - 1 KV slots.
    assert_eq!(prompt + completion - 1, 352, "{v}");

    let (status, v) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": messages, "max_tokens": 1000}),
        )
        .await;
    assert_eq!(status, 400, "{v}");
    assert_refusal(&v, "max_tokens", "KV cache holds 352 tokens");
    let (status, v) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": words(2000, 1)}]}),
        )
        .await;
    assert_eq!(status, 400, "{v}");
    assert_refusal(&v, "messages", "KV cache holds 352");
}

/// One chunk per output (its text), nothing else.
struct OneChunkPerToken;

impl ChunkFormatter for OneChunkPerToken {
    fn start(&mut self) -> Vec<String> {
        Vec::new()
    }
    fn output(&mut self, _: usize, out: &RequestOutput) -> Vec<String> {
        vec![out.text_delta.clone()]
    }
    fn usage_chunk(&mut self) -> String {
        String::new()
    }
    fn usage(&self) -> Usage {
        Usage::new(0, 0, 0)
    }
}

/// A client that stops reading is, to the stream, a response body nobody
/// polls (the kernel's socket buffers, megabytes on loopback, only delay
/// that point): hold the response of a stream and never read its body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_client_stops_reading_is_aborted_and_returns_its_blocks() {
    let s = start(Options::default()).await;
    let mut config = ServerConfig::new(MODEL_NAME, 2048);
    config.kv_cache_tokens = Some(1024 * BLOCK_SIZE);
    let state = AppState::new(config, s.handle.clone(), s.tokenizer.clone());
    let fields: SamplingFields =
        serde_json::from_value(json!({"max_tokens": 1500, "ignore_eos": true, "temperature": 0}))
            .unwrap();
    let params = ChoiceParams::from_fields(&fields).unwrap();
    let ids = s.tokenizer.encode("Tell me about Rome.", true).unwrap();
    let choices = submit_all(&state, &[ids], &params, None, Instant::now())
        .await
        .unwrap();
    let stall = Duration::from_secs(1);
    let started = Instant::now();
    let log = RequestLog::new("cmpl-test", "/v1/completions", Instant::now());
    let response = stream_response(choices, OneChunkPerToken, false, stall, log);

    let aborted = loop {
        let stats = s.handle.stats().await.unwrap();
        if stats.counters.num_aborted == 1 || started.elapsed() > Duration::from_secs(120) {
            break started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let stats = s.handle.stats().await.unwrap();
    assert_eq!(stats.counters.num_aborted, 1, "{stats:?}");
    assert!(aborted >= stall);
    // Paused: the server read its 64-chunk buffer and the output it holds,
    // and the engine computed at most the unread outputs that pause a
    // request beyond that before the stall timeout.
    assert!(stats.counters.generation_tokens >= 64, "{stats:?}");
    assert!(
        stats.counters.generation_tokens <= 64 + 1 + DEFAULT_PAUSE_BACKLOG as u64,
        "{stats:?}"
    );
    assert_eq!(stats.num_in_flight, 0);
    let sc = stats.scheduler;
    assert_eq!(sc.num_running + sc.num_waiting, 0);
    // What is still used is only what the prefix cache keeps.
    assert!(
        sc.num_blocks_used <= sc.radix_cached_tokens.div_ceil(BLOCK_SIZE),
        "{sc:?}"
    );
    assert_eq!(
        s.metric("pagoda_request_success_total{finished_reason=\"abort\"}")
            .await,
        1.0
    );
    assert_eq!(s.metric("pagoda_num_requests_paused").await, 0.0);
    assert_eq!(
        s.metric("pagoda_num_pauses_total").await,
        sc.counters.num_pauses as f64
    );
    // What was buffered is still there to read: 64 chunks, no [DONE].
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    // (Raw token text, so frames are counted rather than split on "\n\n".)
    let body = String::from_utf8_lossy(&body);
    assert_eq!(body.matches("data: ").count(), 64, "{body}");
    assert!(!body.contains("[DONE]"));

    // A reader that keeps up is never aborted.
    let mut stream = greedy("Hello", 200);
    stream["stream"] = json!(true);
    stream["ignore_eos"] = json!(true);
    let payloads = s.stream("/v1/completions", &stream).await;
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
}
