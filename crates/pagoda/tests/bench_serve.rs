//! `pagoda bench serve` against a real `pagoda serve`: the built binary
//! serves the default SmolLM2 model on a free loopback port (`--port 0`, the
//! address read from its startup lines), the load generator sends 8 prompts
//! of 32 tokens for 8 tokens each, 4 at a time, and its JSON line is checked
//! against the workload's arithmetic and the server's own `/metrics` counters.
//! The server is killed by a guard whatever happens.
//!
//! Cost: one model load (a second or two in release) and a few seconds of
//! generation on 2 threads.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn default_model() -> PathBuf {
    let p =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-default-model.sh",
        p.display()
    );
    p
}

/// A running `pagoda serve`, killed and reaped on drop.
struct Server {
    child: Child,
    /// `host:port` it listens on.
    addr: String,
    /// Its stderr lines, read on a thread (so the pipe never fills).
    log: mpsc::Receiver<String>,
}

impl Server {
    fn start(model: &Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pagoda"))
            .args(["serve", "--model"])
            .arg(model)
            .args([
                "--port",
                "0",
                "--threads",
                "2",
                "--kv-cache-memory",
                "256MiB",
            ])
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start pagoda serve");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        // The guard exists before the wait, so a timeout still kills it.
        let mut server = Server {
            child,
            addr: String::new(),
            log,
        };
        let mut seen = Vec::new();
        while server.addr.is_empty() {
            match server.log.recv_timeout(Duration::from_secs(120)) {
                Ok(line) => {
                    if let Some(rest) = line.trim().strip_prefix("listening: http://") {
                        server.addr = rest.split_whitespace().next().unwrap_or("").to_string();
                    }
                    seen.push(line);
                }
                Err(_) => panic!("pagoda serve did not start listening: {seen:#?}"),
            }
        }
        server
    }

    /// A plain HTTP/1.0 GET (the body of the reply).
    fn get(&self, path: &str) -> String {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        write!(s, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        let (head, body) = reply.split_once("\r\n\r\n").unwrap();
        assert!(
            head.starts_with("HTTP/1.") && head.contains(" 200 "),
            "{head}"
        );
        body.to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of an unlabelled Prometheus counter.
fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{metrics}"))
}

#[test]
fn bench_serve_against_pagoda_serve() {
    let server = Server::start(&default_model());
    let before = server.get("/metrics");
    let out = Command::new(env!("CARGO_BIN_EXE_pagoda"))
        .args(["bench", "serve", "--url"])
        .arg(format!("http://{}", server.addr))
        .args(["--num-prompts", "8", "--max-concurrency", "4"])
        .args(["--input-len", "32", "--output-len", "8"])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench serve failed: {stderr}\n{stdout}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "not one JSON line: {stdout}");
    let r: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    let f = |k: &str| {
        r[k].as_f64()
            .unwrap_or_else(|| panic!("{k} missing or not a number: {r}"))
    };

    // The workload's arithmetic: 8 prompts of exactly 32 tokens, 8 tokens
    // each (ignore_eos), and the server's own counters agree.
    assert_eq!(f("completed"), 8.0);
    assert_eq!(f("failed"), 0.0);
    assert_eq!(f("total_input_tokens"), 8.0 * 32.0);
    assert_eq!(f("total_output_tokens"), 8.0 * 8.0);
    let after = server.get("/metrics");
    for (name, expected) in [
        ("pagoda_prompt_tokens_total", 256.0),
        ("pagoda_generation_tokens_total", 64.0),
    ] {
        assert_eq!(
            counter(&after, name) - counter(&before, name),
            expected,
            "{name}"
        );
    }

    // Rates are the totals over the duration.
    let d = f("duration_s");
    assert!(d > 0.0 && d < 300.0, "duration {d}");
    let near = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1.0);
    assert!(near(f("request_throughput"), 8.0 / d));
    assert!(near(f("output_tok_per_s"), 64.0 / d));
    assert!(near(f("total_tok_per_s"), (256.0 + 64.0) / d));

    // Latencies: positive, ordered, and bounded by the whole run.
    for m in ["ttft", "itl", "tpot", "e2e"] {
        let (mean, p50, p99) = (
            f(&format!("mean_{m}_ms")),
            f(&format!("p50_{m}_ms")),
            f(&format!("p99_{m}_ms")),
        );
        assert!(mean > 0.0 && p50 > 0.0, "{m}: {r}");
        assert!(p50 <= p99 && p99 <= d * 1e3 + 1.0, "{m}: {r}");
    }
    assert!(f("mean_ttft_ms") < f("mean_e2e_ms"));
    assert!(f("p99_e2e_ms") <= d * 1e3 + 1.0);
    // Each request's E2E is its TTFT plus 7 gaps; on average TPOT is the gap.
    assert!(f("mean_tpot_ms") * 7.0 <= f("mean_e2e_ms"));
}
