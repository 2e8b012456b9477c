//! One streamed `POST /v1/completions` of `pagoda bench serve`, timed.
//!
//! The body asks for `max_tokens` tokens with `ignore_eos`, greedy by default,
//! `stream: true` and `stream_options.include_usage`, so the last event before
//! `[DONE]` carries the usage the output token count is read from. Server-sent
//! events are split by [`SseBuffer`], which accepts events cut anywhere across
//! network chunks and `\n` or `\r\n` line ends.
//!
//! A request fails on a transport error, a non-2xx status, an error event in
//! the stream, a stream that ends without `[DONE]`, or one without usage.

use super::metrics::RequestResult;
use serde_json::{json, Value};
use std::time::Instant;

/// What every request of a run shares.
#[derive(Debug, Clone)]
pub struct RequestConfig {
    /// The full `.../v1/completions` URL.
    pub endpoint: String,
    pub model: Option<String>,
    pub api_key: Option<String>,
    pub max_tokens: usize,
    pub temperature: f32,
}

/// Splits a byte stream into the `data:` payloads of its events.
#[derive(Debug, Default)]
pub struct SseBuffer {
    pending: Vec<u8>,
}

impl SseBuffer {
    /// Adds `bytes`; returns the data of every event they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some((end, sep)) = find_event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..end + sep).take(end).collect();
            let text = String::from_utf8_lossy(&event);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if !data.is_empty() {
                events.push(data.join("\n"));
            }
        }
        events
    }
}

/// The end of the first complete event and the length of its blank-line
/// separator.
fn find_event_end(b: &[u8]) -> Option<(usize, usize)> {
    (0..b.len()).find_map(|i| {
        if b[i..].starts_with(b"\n\n") {
            Some((i, 2))
        } else if b[i..].starts_with(b"\r\n\r\n") {
            Some((i, 4))
        } else {
            None
        }
    })
}

/// Sends `prompt` and times its stream.
pub async fn send(
    client: &reqwest::Client,
    config: &RequestConfig,
    prompt: &[u32],
) -> Result<RequestResult, String> {
    let mut body = json!({
        "prompt": prompt,
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(model) = &config.model {
        body["model"] = json!(model);
    }
    let mut request = client.post(&config.endpoint).json(&body);
    if let Some(key) = &config.api_key {
        request = request.bearer_auth(key);
    }
    let started = Instant::now();
    let mut response = request.send().await.map_err(|e| chain(&e))?;
    let status = response.status();
    if !status.is_success() {
        let text = response.text().await.unwrap_or_default();
        return Err(format!("HTTP {status}: {}", text.trim()));
    }
    let mut sse = SseBuffer::default();
    let mut ttft = None;
    let mut last_chunk = started;
    let mut itl = Vec::new();
    let mut usage: Option<(usize, usize)> = None;
    loop {
        let bytes = match response.chunk().await {
            Ok(Some(b)) => b,
            Ok(None) => return Err("the stream ended without [DONE]".into()),
            Err(e) => return Err(format!("reading the stream: {}", chain(&e))),
        };
        let now = Instant::now();
        for data in sse.push(&bytes) {
            if data.trim() == "[DONE]" {
                let Some((prompt_tokens, output_tokens)) = usage else {
                    return Err("the stream carried no usage".into());
                };
                return Ok(RequestResult {
                    prompt_tokens,
                    output_tokens,
                    ttft_s: ttft.unwrap_or_else(|| now.duration_since(started).as_secs_f64()),
                    itl_s: itl,
                    e2e_s: now.duration_since(started).as_secs_f64(),
                });
            }
            let event: Value =
                serde_json::from_str(&data).map_err(|e| format!("bad event {data:?}: {e}"))?;
            if let Some(error) = event.get("error") {
                return Err(format!("error event: {error}"));
            }
            if let Some(u) = event.get("usage").filter(|u| !u.is_null()) {
                let field = |k: &str| u.get(k).and_then(Value::as_u64).map(|v| v as usize);
                usage = field("prompt_tokens").zip(field("completion_tokens"));
            }
            let has_text = event["choices"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["text"].as_str().is_some_and(|t| !t.is_empty()))
            });
            if has_text {
                match ttft {
                    None => ttft = Some(now.duration_since(started).as_secs_f64()),
                    Some(_) => itl.push(now.duration_since(last_chunk).as_secs_f64()),
                }
                last_chunk = now;
            }
        }
    }
}

/// An error and its causes on one line (reqwest's message alone omits the
/// cause, e.g. "connection refused").
fn chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        line.push_str(": ");
        line.push_str(&s.to_string());
        source = s.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::SseBuffer;

    #[test]
    fn events_split_across_chunks_are_joined() {
        let stream = b"data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\n: comment\n\ndata: [DONE]\n\n";
        // Every way of cutting the stream in two gives the same events.
        for cut in 0..stream.len() {
            let mut sse = SseBuffer::default();
            let mut events = sse.push(&stream[..cut]);
            events.extend(sse.push(&stream[cut..]));
            assert_eq!(events, ["{\"a\":1}", "{\"b\":2}", "[DONE]"], "cut at {cut}");
        }
    }

    #[test]
    fn incomplete_event_waits_for_its_end() {
        let mut sse = SseBuffer::default();
        assert!(sse.push(b"data: {\"x\"").is_empty());
        assert!(sse.push(b":3}\n").is_empty());
        assert_eq!(sse.push(b"\n"), ["{\"x\":3}"]);
    }
}
