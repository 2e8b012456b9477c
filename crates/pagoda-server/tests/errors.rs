//! Refusals in OpenAI's error shape with the right status, none of which
//! disturbs a request running beside it: 400 (malformed JSON, wrong types,
//! out-of-range values, over-long prompts, unknown model), 401 (API key),
//! 413 (body over the limit), 503 with Retry-After (waiting queue full).

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::Duration;

fn assert_error(status: u16, v: &Value, want_status: u16, param: Option<&str>) {
    assert_eq!(status, want_status, "{v}");
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_400s_and_do_not_disturb_a_running_stream() {
    let s = start(Options::default()).await;
    let prompt = "A short story about a cat:";
    let (_, reference) = s.post("/v1/completions", &greedy(prompt, 40)).await;
    let want = reference["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();

    // A stream runs while the bad requests arrive.
    let mut body = greedy(prompt, 40);
    body["stream"] = json!(true);
    let client = s.client.clone();
    let url = s.url("/v1/completions");
    let running = tokio::spawn(async move {
        let r = client.post(url).json(&body).send().await.unwrap();
        sse_payloads(&r.text().await.unwrap())
    });

    let r = s
        .client
        .post(s.url("/v1/completions"))
        .header("content-type", "application/json")
        .body("{\"prompt\": \"hi\", ")
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    assert_error(status, &v, 400, None);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("malformed JSON"));

    let cases = [
        (
            "/v1/completions",
            json!({"prompt": "hi", "temperature": "hot"}),
            Some("temperature"),
        ),
        ("/v1/completions", json!({"prompt": 42}), None),
        ("/v1/completions", json!({"max_tokens": 5}), None),
        (
            "/v1/completions",
            json!({"prompt": "hi", "temperature": -0.5}),
            Some("temperature"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "top_p": 0}),
            Some("top_p"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "top_p": 1.5}),
            Some("top_p"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": 0}),
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "n": 0}),
            Some("n"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "model": "gpt-4"}),
            Some("model"),
        ),
        ("/v1/completions", json!({"prompt": []}), Some("prompt")),
        (
            "/v1/completions",
            json!({"prompt": "hi", "logprobs": 99}),
            Some("logprobs"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": 5000}),
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [999999]}),
            Some("prompt"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": []}),
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            Some("messages[0].role"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
            Some("top_logprobs"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -3}),
            Some("max_completion_tokens"),
        ),
        ("/tokenize", json!({}), None),
        ("/detokenize", json!({"tokens": [4000000]}), Some("tokens")),
    ];
    for (path, body, param) in &cases {
        let (status, v) = s.post(path, body).await;
        assert_error(status, &v, 400, *param);
    }
    // A prompt longer than max_model_len (2048 tokens).
    let long = "word ".repeat(3000);
    let (status, v) = s.post("/v1/completions", &json!({"prompt": long})).await;
    assert_error(status, &v, 400, Some("prompt"));
    assert!(v["error"]["message"].as_str().unwrap().contains("2048"));
    let (status, v) = s.post("/v1/nothing", &json!({})).await;
    assert_error(status, &v, 404, None);

    let chunks = chunks(&running.await.unwrap());
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, want);
    assert_eq!(s.metric("pagoda_num_requests_running").await, 0.0);
    assert!(s.metric("pagoda_requests_total{status=\"400\"}").await >= cases.len() as f64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_is_required_when_set_and_bodies_are_limited() {
    let s = start(Options {
        api_key: Some("sekrit".into()),
        ..Options::default()
    })
    .await;
    let body = greedy("Hello", 2);
    let r = s
        .client
        .post(s.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    assert_error(status, &r.json().await.unwrap(), 401, None);
    let r = s
        .client
        .get(s.url("/v1/models"))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    assert_error(status, &r.json().await.unwrap(), 401, None);
    let r = s
        .client
        .post(s.url("/v1/completions"))
        .bearer_auth("sekrit")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // Health stays open; metrics need the key (tests/auth.rs).
    assert_eq!(s.get("/health").await.0, 200);
    assert_eq!(s.get("/metrics").await.0, 401);

    // 9 MiB body over the 8 MiB limit.
    let big = json!({"prompt": "x".repeat(9 << 20)});
    let r = s
        .client
        .post(s.url("/v1/completions"))
        .bearer_auth("sekrit")
        .json(&big)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    assert_error(status, &r.json().await.unwrap(), 413, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_waiting_queue_answers_503_with_retry_after() {
    let s = start(Options {
        max_num_seqs: 1,
        max_waiting: Some(1),
        ..Options::default()
    })
    .await;
    // A runs (the only sequence slot), B waits, C is refused.
    let mut a_resp = s.open_stream("Count slowly:", 1500).await;
    let first = a_resp.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    let client = s.client.clone();
    let url = s.url("/v1/completions");
    let b = tokio::spawn(async move {
        let r = client
            .post(url)
            .json(&greedy("Hi", 3))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    });
    let waiting = s
        .wait_metric("pagoda_num_requests_waiting", |v| v == 1.0)
        .await;
    assert_eq!(waiting, 1.0);
    let r = s
        .client
        .post(s.url("/v1/completions"))
        .json(&greedy("Hi", 3))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    assert_error(503, &r.json().await.unwrap(), 503, None);

    // Dropping A aborts it; B then runs to completion.
    drop(a_resp);
    let (status, v) = tokio::time::timeout(Duration::from_secs(30), b)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, 200, "{v}");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 3);
}
