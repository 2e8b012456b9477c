//! Prometheus metrics in the text exposition format, without a metrics crate.
//!
//! The server records what only it sees: HTTP responses by status, and per
//! request the time to first token, the gaps between tokens and the
//! end-to-end latency (histograms with fixed buckets). Everything the engine
//! knows (token counters, finished requests by reason, running/waiting/paused
//! requests, KV blocks, prefix cache hits, preemptions, pauses) is read from
//! [`EngineStats`] at scrape time, so the two never disagree.
//!
//! Costs: recording is an atomic add per counter and one short mutex hold
//! per histogram sample; rendering is linear in the number of series.

use pagoda_engine::{EngineStats, FinishReason};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

/// Bucket upper bounds in seconds (vLLM's TTFT scale, shared by all three).
const BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
];

/// A cumulative histogram of durations.
#[derive(Debug, Clone)]
struct Histogram {
    /// counts[i]: samples <= BUCKETS[i] (not yet cumulative).
    counts: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS.len()],
            count: 0,
            sum: 0.0,
        }
    }
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        if let Some(i) = BUCKETS.iter().position(|&b| seconds <= b) {
            self.counts[i] += 1;
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (b, c) in BUCKETS.iter().zip(&self.counts) {
            cumulative += c;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

#[derive(Debug, Default)]
struct Recorded {
    /// HTTP responses of the API routes by status code.
    responses: BTreeMap<u16, u64>,
    time_to_first_token: Histogram,
    inter_token_latency: Histogram,
    e2e_latency: Histogram,
}

/// The server's own metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    recorded: Mutex<Recorded>,
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Recorded) -> R) -> R {
        let mut guard = match self.recorded.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut guard)
    }

    pub fn record_response(&self, status: u16) {
        self.with(|r| *r.responses.entry(status).or_insert(0) += 1);
    }

    pub fn record_time_to_first_token(&self, d: Duration) {
        self.with(|r| r.time_to_first_token.observe(d.as_secs_f64()));
    }

    pub fn record_inter_token_latency(&self, d: Duration) {
        self.with(|r| r.inter_token_latency.observe(d.as_secs_f64()));
    }

    pub fn record_e2e_latency(&self, d: Duration) {
        self.with(|r| r.e2e_latency.observe(d.as_secs_f64()));
    }

    /// The exposition text: the server's metrics, then the engine's `stats`.
    pub fn render(&self, stats: Option<&EngineStats>) -> String {
        let mut out = String::new();
        let recorded = self.with(|r| {
            (
                r.responses.clone(),
                r.time_to_first_token.clone(),
                r.inter_token_latency.clone(),
                r.e2e_latency.clone(),
            )
        });
        let (responses, ttft, itl, e2e) = recorded;
        let _ = writeln!(
            out,
            "# HELP pagoda_requests_total HTTP requests to the API, by response status.\n\
             # TYPE pagoda_requests_total counter"
        );
        for (status, n) in &responses {
            let _ = writeln!(out, "pagoda_requests_total{{status=\"{status}\"}} {n}");
        }
        ttft.render(
            &mut out,
            "pagoda_time_to_first_token_seconds",
            "Time from submission to a request's first token.",
        );
        itl.render(
            &mut out,
            "pagoda_inter_token_latency_seconds",
            "Time between consecutive tokens of a request.",
        );
        e2e.render(
            &mut out,
            "pagoda_e2e_request_latency_seconds",
            "Time from receiving a generation request to its last token.",
        );
        if let Some(s) = stats {
            render_engine(&mut out, s);
        }
        out
    }
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

fn render_engine(out: &mut String, s: &EngineStats) {
    let c = &s.counters;
    let sc = &s.scheduler;
    let _ = writeln!(
        out,
        "# HELP pagoda_request_success_total Requests finished, by finish reason.\n\
         # TYPE pagoda_request_success_total counter"
    );
    for reason in [
        FinishReason::Stop,
        FinishReason::Length,
        FinishReason::Abort,
    ] {
        let _ = writeln!(
            out,
            "pagoda_request_success_total{{finished_reason=\"{}\"}} {}",
            reason.as_str(),
            c.num_finished(reason)
        );
    }
    let counters = [
        (
            "pagoda_request_failed_total",
            "Requests ended by a failed engine step.",
            c.num_failed,
        ),
        (
            "pagoda_request_rejected_total",
            "Submissions the engine refused.",
            c.num_requests_rejected,
        ),
        (
            "pagoda_prompt_tokens_total",
            "Prompt tokens of requests that started generating.",
            c.prompt_tokens,
        ),
        (
            "pagoda_generation_tokens_total",
            "Tokens generated.",
            c.generation_tokens,
        ),
        (
            "pagoda_prefix_cache_queries_total",
            "Tokens looked up in the prefix cache.",
            sc.counters.prefix_cache_queried_tokens,
        ),
        (
            "pagoda_prefix_cache_hits_total",
            "Looked-up tokens found in the prefix cache.",
            sc.counters.prefix_cache_hit_tokens,
        ),
        (
            "pagoda_num_preemptions_total",
            "Requests preempted to free KV blocks.",
            sc.counters.num_preemptions,
        ),
        (
            "pagoda_num_pauses_total",
            "Requests paused because their stream was not read.",
            sc.counters.num_pauses,
        ),
        (
            "pagoda_engine_steps_total",
            "Engine steps run.",
            c.num_steps,
        ),
    ];
    for (name, help, v) in counters {
        metric(out, name, "counter", help, v);
    }
    let gauges = [
        (
            "pagoda_num_requests_running",
            "Requests in the running batch.",
            sc.num_running,
        ),
        (
            "pagoda_num_requests_waiting",
            "Requests waiting to be scheduled.",
            sc.num_waiting,
        ),
        (
            "pagoda_num_requests_paused",
            "Requests paused until their client reads their stream.",
            sc.num_paused,
        ),
        (
            "pagoda_kv_cache_blocks_used",
            "KV cache blocks in use (running requests and the prefix cache).",
            sc.num_blocks_used,
        ),
        (
            "pagoda_kv_cache_blocks_total",
            "KV cache blocks in all.",
            sc.num_blocks_total,
        ),
        (
            "pagoda_prefix_cache_tokens",
            "Tokens held by the prefix cache.",
            sc.radix_cached_tokens,
        ),
    ];
    for (name, help, v) in gauges {
        metric(out, name, "gauge", help, v);
    }
    let usage = if sc.num_blocks_total == 0 {
        0.0
    } else {
        sc.num_blocks_used as f64 / sc.num_blocks_total as f64
    };
    metric(
        out,
        "pagoda_kv_cache_usage_perc",
        "gauge",
        "Fraction of KV blocks in use.",
        usage,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::default();
        m.record_time_to_first_token(Duration::from_millis(3));
        m.record_time_to_first_token(Duration::from_millis(300));
        m.record_time_to_first_token(Duration::from_secs(1000));
        m.record_response(200);
        m.record_response(200);
        let text = m.render(None);
        assert!(text.contains("pagoda_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n"));
        assert!(text.contains("pagoda_time_to_first_token_seconds_bucket{le=\"0.5\"} 2\n"));
        assert!(text.contains("pagoda_time_to_first_token_seconds_bucket{le=\"80\"} 2\n"));
        assert!(text.contains("pagoda_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("pagoda_time_to_first_token_seconds_count 3\n"));
        assert!(text.contains("pagoda_requests_total{status=\"200\"} 2\n"));
    }
}
