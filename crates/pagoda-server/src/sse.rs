//! Server-sent events in OpenAI's streaming format: `data: {json}\n\n` per
//! chunk, then `data: [DONE]\n\n`.
//!
//! A stream is a spawned task that reads the choices' outputs and sends
//! chunks into a small bounded channel; the response body is the channel's
//! receiver. When the client goes away, hyper drops the body, the task sees
//! its channel closed (it also waits on that while the engine is silent, e.g.
//! while the request is still queued), returns, and dropping its
//! [`ChoiceStream`]s aborts their requests at once.
//!
//! A failure mid-stream (an engine error) is sent as one `data:` event with an
//! OpenAI error object, followed by `[DONE]`.
//!
//! Backpressure: a client that stops reading (but keeps its connection) first
//! fills the socket buffers, then this channel; the task then waits to send
//! and reads nothing more from the engine: the stream is *paused* (the server
//! formats and buffers nothing more; once
//! [`pagoda_engine::HandleOptions::pause_backlog`] outputs wait unread, the
//! engine pauses the request too: no tokens computed, its KV blocks given
//! back, until the stream is read again). If the channel has no room for
//! [`crate::ServerConfig::stream_stall_timeout`], the task gives up: it
//! returns, which drops its [`ChoiceStream`]s, aborts their requests and
//! returns their KV blocks within one engine step. A client that reads
//! slowly but steadily is never aborted: the clock restarts at every chunk
//! the connection takes.

use crate::error::ApiError;
use crate::openai::Usage;
use crate::request_log::RequestLog;
use crate::routes::generation::ChoiceStream;
use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use pagoda_engine::RequestOutput;
use std::time::Duration;
use tokio::sync::mpsc;

/// Chunks buffered between the task and the connection.
const CHANNEL_CHUNKS: usize = 64;

/// Turns outputs into chunk payloads (JSON text, without the `data: ` frame).
pub trait ChunkFormatter: Send + 'static {
    /// Chunks sent before any output (e.g. chat's `{role: "assistant"}` deltas).
    fn start(&mut self) -> Vec<String>;
    /// Chunks for one output of choice `index`.
    fn output(&mut self, index: usize, out: &RequestOutput) -> Vec<String>;
    /// The last chunk, with usage, when `stream_options.include_usage`.
    fn usage_chunk(&mut self) -> String;
    /// The usage so far (for the request's log line).
    fn usage(&self) -> Usage;
}

fn frame(payload: &str) -> Bytes {
    Bytes::from(format!("data: {payload}\n\n"))
}

/// Why a chunk could not be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SendFailed {
    /// The connection went away.
    Closed,
    /// The client did not take a chunk for the whole stall timeout.
    Stalled,
}

/// Sends `payload`, waiting at most `stall` for room in the channel.
async fn send(tx: &mpsc::Sender<Bytes>, payload: &str, stall: Duration) -> Result<(), SendFailed> {
    match tokio::time::timeout(stall, tx.send(frame(payload))).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(SendFailed::Closed),
        Err(_) => Err(SendFailed::Stalled),
    }
}

/// Starts streaming `choices` through `formatter`; returns the response.
/// A client that takes no chunk for `stall` has its requests aborted. `log`
/// is written when the stream ends (status 499 if the client went away or
/// stalled, 500 after an engine error).
pub fn stream_response<F: ChunkFormatter>(
    choices: Vec<ChoiceStream>,
    mut formatter: F,
    include_usage: bool,
    stall: Duration,
    mut log: RequestLog,
) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(CHANNEL_CHUNKS);
    tokio::spawn(async move {
        let result = pump(choices, &mut formatter, include_usage, stall, &tx, &mut log).await;
        log.set_usage(formatter.usage());
        match result {
            Ok(status) => log.finish(status),
            Err(SendFailed::Closed) => {}
            Err(SendFailed::Stalled) => tracing::warn!(
                seconds = stall.as_secs_f64(),
                "a streaming client stopped reading; aborting its request"
            ),
        }
        // Returning drops the choices (if not yet), which aborts them, and
        // an unfinished log, which logs them as closed by the client.
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// Sends every chunk of `choices`, then `[DONE]`; returns the status to log
/// (200, or the error's after an error event).
async fn pump<F: ChunkFormatter>(
    choices: Vec<ChoiceStream>,
    formatter: &mut F,
    include_usage: bool,
    stall: Duration,
    tx: &mpsc::Sender<Bytes>,
    log: &mut RequestLog,
) -> Result<u16, SendFailed> {
    let mut merged = futures_util::stream::select_all(choices.into_iter().map(|c| c.into_stream()));
    for payload in formatter.start() {
        send(tx, &payload, stall).await?;
    }
    loop {
        let item = tokio::select! {
            item = merged.next() => item,
            // The client went away: returning drops `merged`, which aborts.
            _ = tx.closed() => return Err(SendFailed::Closed),
        };
        let chunks = match item {
            None => break,
            Some((index, Ok(out))) => {
                log.output(out.finish_reason);
                formatter.output(index, &out)
            }
            Some((_, Err(e))) => {
                tracing::warn!(error = %e.message, "stream failed");
                drop(merged);
                send(tx, &e.body_json(), stall).await?;
                send(tx, "[DONE]", stall).await?;
                return Ok(e.status.as_u16());
            }
        };
        for payload in chunks {
            send(tx, &payload, stall).await?;
        }
    }
    if include_usage {
        let usage = formatter.usage_chunk();
        send(tx, &usage, stall).await?;
    }
    send(tx, "[DONE]", stall).await?;
    Ok(200)
}

/// Serializes a chunk; a failure (not expected for these types) becomes an
/// error event rather than a panic.
pub fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| {
        ApiError::internal(format!("cannot serialize a chunk: {e}")).body_json()
    })
}
