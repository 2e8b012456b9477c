//! Slow and idle clients: a client that sends nothing, or its head or body
//! too slowly, is cut off; an idle kept-alive connection closes after the
//! keep-alive timeout (which may be longer than the header timeout); past
//! the connection cap a client gets a 503 at once while `/health` still
//! answers, and a freed slot serves again.

mod common;

use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n";

/// Reads one response head (and whatever came with it) from `tcp`.
async fn read_response(tcp: &mut TcpStream) -> String {
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_slow_heads_are_cut_after_the_header_timeout() {
    let s = start(Options {
        config: |c| c.header_read_timeout = Duration::from_millis(600),
        ..Options::default()
    })
    .await;
    // Connects and sends nothing.
    let t = Instant::now();
    let mut silent = TcpStream::connect(s.addr()).await.unwrap();
    let (got, closed) = read_until_closed(&mut silent, Duration::from_secs(5)).await;
    assert_eq!(got, "");
    let after = closed - t;
    assert!(after >= Duration::from_millis(500), "{after:?}");
    assert!(after < Duration::from_secs(3), "{after:?}");

    // Sends its head one byte every 100 ms (it would take 3 s).
    let t = Instant::now();
    let tcp = TcpStream::connect(s.addr()).await.unwrap();
    let (mut rd, mut wr) = tcp.into_split();
    let trickle = tokio::spawn(async move {
        for b in b"GET /health HTTP/1.1\r\nhost: localhost\r\nx-pad: 0123456789\r\n\r\n" {
            if wr.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut got = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), rd.read_to_end(&mut got)).await;
    let after = t.elapsed();
    assert!(n.is_ok(), "not cut off");
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert!(after < Duration::from_secs(2), "{after:?}");
    trickle.abort();

    // A prompt client is served.
    assert_eq!(s.get("/health").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_close_after_their_own_timeout() {
    // Keep-alive longer than the header timeout: idling 1.2 s between
    // requests is fine, then the connection closes after 2.5 s of idling.
    let s = start(Options {
        config: |c| {
            c.header_read_timeout = Duration::from_millis(500);
            c.keep_alive_timeout = Duration::from_millis(2500);
        },
        ..Options::default()
    })
    .await;
    let mut tcp = TcpStream::connect(s.addr()).await.unwrap();
    tcp.write_all(HEALTH).await.unwrap();
    assert!(read_response(&mut tcp).await.starts_with("HTTP/1.1 200"));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    tcp.write_all(HEALTH).await.unwrap();
    assert!(read_response(&mut tcp).await.starts_with("HTTP/1.1 200"));
    let idle_from = Instant::now();
    let (got, closed) = read_until_closed(&mut tcp, Duration::from_secs(10)).await;
    assert_eq!(got, "");
    let idle = closed - idle_from;
    assert!(idle >= Duration::from_millis(2300), "{idle:?}");
    assert!(idle < Duration::from_secs(5), "{idle:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_gets_408_and_the_connection_closes() {
    let s = start(Options {
        config: |c| c.body_read_timeout = Duration::from_millis(800),
        ..Options::default()
    })
    .await;
    let body = br#"{"prompt": "Hello there, how are you?", "max_tokens": 2}"#;
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    let t = Instant::now();
    let mut tcp = TcpStream::connect(s.addr()).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    // One byte every 100 ms, stopping as soon as an answer comes (writing
    // into a closed connection could reset it before the answer is read).
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    for b in body {
        tcp.write_all(&[*b]).await.unwrap();
        if let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_millis(100), tcp.read(&mut buf)).await
        {
            got.extend_from_slice(&buf[..n]);
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "not cut off");
    }
    let (rest, _) = read_until_closed(&mut tcp, Duration::from_secs(5)).await;
    let after = t.elapsed();
    got.extend_from_slice(rest.as_bytes());
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    let json: Value = serde_json::from_str(text.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(json["error"]["code"], "request_timeout", "{json}");
    assert!(after >= Duration::from_millis(700), "{after:?}");
    assert!(after < Duration::from_secs(3), "{after:?}");
    // Nothing reached the engine.
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
async fn past_the_cap_clients_get_503_at_once_and_health_still_answers() {
    let s = start(Options {
        config: |c| c.max_connections = Some(2),
        ..Options::default()
    })
    .await;
    // Connections past the cap close after one answer: no pooling.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut idle = vec![
        TcpStream::connect(s.addr()).await.unwrap(),
        TcpStream::connect(s.addr()).await.unwrap(),
    ];
    // Both are accepted (and held) before the next connection.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let t = Instant::now();
    let r = client
        .post(s.url("/v1/completions"))
        .json(&greedy("Hello", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "too_many_connections", "{v}");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    let r = client.get(s.url("/health")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        client
            .get(s.url("/v1/models"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        503
    );

    // One leaves: its slot serves again.
    idle.pop();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = client.get(s.url("/v1/models")).send().await.unwrap();
        if r.status().as_u16() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the freed slot is never reused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
