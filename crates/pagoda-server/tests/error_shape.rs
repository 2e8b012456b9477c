//! Every refusal has OpenAI's error shape, the router's own included: 404
//! for an unknown path, 405 (with `Allow`) for a known path and the wrong
//! method; a JSON body followed by anything but whitespace is a 400.

mod common;

use common::*;
use serde_json::Value;

async fn send(
    s: &TestServer,
    method: reqwest::Method,
    path: &str,
    body: &str,
) -> reqwest::Response {
    s.client
        .request(method, s.url(path))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

fn assert_openai_error(v: &Value) {
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_and_method_not_allowed_are_json() {
    let s = start(Options::default()).await;
    let cases = [
        (reqwest::Method::GET, "/v1/completions", 405, Some("POST")),
        (
            reqwest::Method::PUT,
            "/v1/chat/completions",
            405,
            Some("POST"),
        ),
        (reqwest::Method::POST, "/health", 405, Some("GET,HEAD")),
        (reqwest::Method::DELETE, "/v1/models", 405, Some("GET,HEAD")),
        (reqwest::Method::GET, "/v2/completions", 404, None),
        (reqwest::Method::POST, "/", 404, None),
    ];
    for (method, path, status, allow) in cases {
        let r = send(&s, method.clone(), path, "{}").await;
        assert_eq!(r.status().as_u16(), status, "{method} {path}");
        if let Some(allow) = allow {
            assert_eq!(r.headers()["allow"], allow, "{method} {path}");
        }
        assert_eq!(r.headers()["content-type"], "application/json");
        let v: Value = r.json().await.unwrap();
        assert_openai_error(&v);
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        if status == 405 {
            assert_eq!(v["error"]["code"], "method_not_allowed", "{v}");
            assert!(
                v["error"]["message"].as_str().unwrap().contains(path),
                "{v}"
            );
        }
    }
    assert!(s.metric("pagoda_requests_total{status=\"405\"}").await >= 4.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailing_data_after_the_json_body_is_a_400() {
    let s = start(Options::default()).await;
    for (path, body) in [
        ("/v1/completions", r#"{"prompt":"hi","max_tokens":2} xyz"#),
        ("/v1/completions", r#"{"prompt":"hi","max_tokens":2}{}"#),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}]"#,
        ),
        ("/tokenize", r#"{"prompt":"hi"} 1"#),
    ] {
        let r = send(&s, reqwest::Method::POST, path, body).await;
        assert_eq!(r.status().as_u16(), 400, "{body}");
        let v: Value = r.json().await.unwrap();
        assert_openai_error(&v);
        assert!(
            v["error"]["message"].as_str().unwrap().contains("trailing"),
            "{v}"
        );
    }
    // Trailing whitespace is fine.
    let r = send(
        &s,
        reqwest::Method::POST,
        "/v1/completions",
        "{\"prompt\":\"hi\",\"max_tokens\":2} \r\n\t\n",
    )
    .await;
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        s.handle
            .stats()
            .await
            .unwrap()
            .counters
            .num_requests_admitted,
        1
    );
}
