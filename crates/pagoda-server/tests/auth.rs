//! The API key: `/metrics` is behind it unless `public_metrics`, `/health`
//! never is; the Bearer scheme is case-insensitive; a wrong key of any
//! length, another scheme or no header get 401 in OpenAI's shape.

mod common;

use common::*;
use serde_json::Value;

const KEY: &str = "sk-test-0123456789";

async fn status_with(s: &TestServer, path: &str, auth: Option<&str>) -> (u16, String) {
    let mut r = s.client.get(s.url(path));
    if let Some(a) = auth {
        r = r.header("authorization", a);
    }
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_the_key_and_the_scheme_is_case_insensitive() {
    let s = start(Options {
        api_key: Some(KEY.into()),
        ..Options::default()
    })
    .await;
    for path in ["/metrics", "/v1/models"] {
        for auth in [
            None,
            Some("Bearer wrong"),
            Some("Bearer sk-test-012345678"),
            Some("Bearer sk-test-01234567890"),
            Some("Basic sk-test-0123456789"),
            Some("sk-test-0123456789"),
        ] {
            let (status, body) = status_with(&s, path, auth).await;
            assert_eq!(status, 401, "{path} {auth:?}: {body}");
            let v: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["error"]["type"], "authentication_error", "{body}");
            assert_eq!(v["error"]["code"], "invalid_api_key", "{body}");
        }
        for auth in [
            "Bearer sk-test-0123456789",
            "bearer sk-test-0123456789",
            "BEARER  sk-test-0123456789 ",
        ] {
            let (status, body) = status_with(&s, path, Some(auth)).await;
            assert_eq!(status, 200, "{path} {auth}: {body}");
        }
    }
    let (_, text) = status_with(&s, "/metrics", Some(&format!("bearer {KEY}"))).await;
    assert!(parse_metric(&text, "pagoda_requests_total{status=\"401\"}") >= 12.0);
    assert_eq!(status_with(&s, "/health", None).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_metrics_stay_open_while_the_api_needs_the_key() {
    let s = start(Options {
        api_key: Some(KEY.into()),
        config: |c| c.public_metrics = true,
        ..Options::default()
    })
    .await;
    assert_eq!(status_with(&s, "/metrics", None).await.0, 200);
    assert_eq!(status_with(&s, "/health", None).await.0, 200);
    assert_eq!(status_with(&s, "/v1/models", None).await.0, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_key_everything_is_open() {
    let s = start(Options::default()).await;
    assert_eq!(status_with(&s, "/metrics", None).await.0, 200);
    assert_eq!(
        status_with(&s, "/v1/models", Some("Bearer anything"))
            .await
            .0,
        200
    );
}
