//! Clients that go away and servers that stop: a disconnect mid-stream or
//! while queued aborts the request at once and returns its KV blocks; a
//! shutdown signal lets requests in flight finish, bounded by the timeout.

mod common;

use common::*;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_mid_stream_aborts_and_returns_blocks() {
    let s = start(Options::default()).await;
    let idle = s.handle.stats().await.unwrap().scheduler;
    assert_eq!(idle.num_blocks_used, 0);

    let mut r = s
        .open_stream("Tell me everything about the history of Rome.", 1500)
        .await;
    for _ in 0..3 {
        r.chunk().await.unwrap().unwrap();
    }
    let busy = s.handle.stats().await.unwrap();
    assert_eq!(busy.scheduler.num_running, 1);
    assert!(busy.scheduler.num_blocks_used > 0);
    drop(r);

    let aborted = s
        .wait_metric(
            "pagoda_request_success_total{finished_reason=\"abort\"}",
            |v| v == 1.0,
        )
        .await;
    assert_eq!(aborted, 1.0);
    let stats = s.handle.stats().await.unwrap();
    assert_eq!(stats.scheduler.num_running, 0);
    assert_eq!(stats.scheduler.num_waiting, 0);
    assert_eq!(stats.num_in_flight, 0);
    // What is still used is only what the prefix cache keeps.
    let sc = stats.scheduler;
    assert_eq!(sc.num_blocks_used + sc.num_blocks_free, sc.num_blocks_total);
    assert!(
        sc.num_blocks_used <= sc.radix_cached_tokens.div_ceil(BLOCK_SIZE),
        "{sc:?}"
    );
    // Far fewer tokens than asked for were generated.
    assert!(stats.counters.generation_tokens < 1500);
    assert_eq!(s.metric("pagoda_num_requests_running").await, 0.0);
    // The server still serves.
    let (status, _) = s.post("/v1/completions", &greedy("Hello", 3)).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_while_waiting_removes_the_queued_request() {
    let s = start(Options {
        max_num_seqs: 1,
        ..Options::default()
    })
    .await;
    let mut a_resp = s.open_stream("Count slowly:", 1500).await;
    a_resp.chunk().await.unwrap().unwrap();

    // B waits behind A; its client gives up after 300 ms.
    let b = s
        .client
        .post(s.url("/v1/completions"))
        .timeout(Duration::from_millis(300))
        .json(&greedy("Hi", 3))
        .send()
        .await;
    assert!(b.is_err());
    let waiting = s
        .wait_metric("pagoda_num_requests_waiting", |v| v == 0.0)
        .await;
    assert_eq!(waiting, 0.0);
    let stats = s.handle.stats().await.unwrap();
    assert_eq!(stats.scheduler.num_running, 1);
    assert_eq!(stats.counters.num_aborted, 1);
    drop(a_resp);
    s.wait_metric("pagoda_num_requests_running", |v| v == 0.0)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_streams_in_flight_then_stops() {
    let mut s = start(Options::default()).await;
    let mut r = s.open_stream("Describe a sunrise.", 40).await;
    let mut text = String::from_utf8(r.chunk().await.unwrap().unwrap().to_vec()).unwrap();
    s.signal_shutdown();
    while let Some(c) = r.chunk().await.unwrap() {
        text.push_str(std::str::from_utf8(&c).unwrap());
    }
    let chunks = chunks(&sse_payloads(&text));
    let finishing = chunks.last().unwrap();
    assert_eq!(finishing["choices"][0]["finish_reason"], "length");
    tokio::time::timeout(Duration::from_secs(10), s.stop())
        .await
        .unwrap()
        .unwrap();
    // No longer accepting.
    assert!(s.client.get(s.url("/health")).send().await.is_err());
    s.handle
        .clone()
        .shutdown(pagoda_engine::ShutdownMode::Abort)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_wait_is_bounded() {
    let mut s = start(Options {
        shutdown_timeout: Duration::from_millis(500),
        ..Options::default()
    })
    .await;
    let mut r = s.open_stream("Count slowly:", 1900).await;
    r.chunk().await.unwrap().unwrap();
    let t = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), s.stop())
        .await
        .unwrap()
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    s.handle
        .clone()
        .shutdown(pagoda_engine::ShutdownMode::Abort)
        .await
        .unwrap();
}
