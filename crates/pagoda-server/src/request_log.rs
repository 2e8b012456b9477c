//! One info line per finished generation request (target
//! `pagoda_server::request`): its response id, route, HTTP status, prompt,
//! output and cached tokens, time to first token, total time, and finish
//! reason(s).
//!
//! A [`RequestLog`] is made once a request's sequences are submitted; it logs
//! when [`RequestLog::finish`] is called, or, if the request never got there
//! (its client went away, or its stream stalled), when it is dropped, with
//! status 499 (client closed the request) and finish reason `abort`. So
//! every submitted request is logged exactly once.

use crate::openai::Usage;
use pagoda_engine::FinishReason;
use std::time::Instant;

/// Status logged for a request whose client went away first (nginx's code).
pub const CLIENT_CLOSED: u16 = 499;

/// What a request's log line gathers as it runs.
#[derive(Debug)]
pub struct RequestLog {
    id: String,
    route: &'static str,
    received: Instant,
    first_output: Option<Instant>,
    reasons: Vec<FinishReason>,
    usage: Usage,
    logged: bool,
}

impl RequestLog {
    pub fn new(id: impl Into<String>, route: &'static str, received: Instant) -> Self {
        RequestLog {
            id: id.into(),
            route,
            received,
            first_output: None,
            reasons: Vec::new(),
            usage: Usage::new(0, 0, 0),
            logged: false,
        }
    }

    /// Notes an output arriving now (the first one sets the TTFT).
    pub fn output(&mut self, finish: Option<FinishReason>) {
        self.first_output.get_or_insert_with(Instant::now);
        if let Some(r) = finish {
            self.reasons.push(r);
        }
    }

    /// Notes a finished choice: when its first output came, and why it ended.
    pub fn choice(&mut self, first_output: Option<Instant>, reason: FinishReason) {
        if let Some(at) = first_output {
            self.first_output = Some(self.first_output.map_or(at, |t| t.min(at)));
        }
        self.reasons.push(reason);
    }

    pub fn set_usage(&mut self, usage: Usage) {
        self.usage = usage;
    }

    /// Logs the line with `status`.
    pub fn finish(mut self, status: u16) {
        self.emit(status);
    }

    /// The distinct finish reasons, comma-separated (`abort` if none).
    fn reasons(&self) -> String {
        let mut names: Vec<&str> = Vec::new();
        for r in &self.reasons {
            if !names.contains(&r.as_str()) {
                names.push(r.as_str());
            }
        }
        if names.is_empty() {
            "abort".into()
        } else {
            names.join(",")
        }
    }

    fn emit(&mut self, status: u16) {
        if self.logged {
            return;
        }
        self.logged = true;
        let ms = |d: std::time::Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
        let ttft_ms = self.first_output.map(|t| ms(t - self.received));
        tracing::info!(
            target: "pagoda_server::request",
            id = %self.id,
            route = self.route,
            status,
            prompt_tokens = self.usage.prompt_tokens,
            output_tokens = self.usage.completion_tokens,
            cached_tokens = self.usage.prompt_tokens_details.cached_tokens,
            ttft_ms,
            total_ms = ms(self.received.elapsed()),
            finish_reason = %self.reasons(),
            "request finished"
        );
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        self.emit(CLIENT_CLOSED);
    }
}
