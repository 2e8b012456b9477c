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

use crate::error::ApiError;
use crate::routes::generation::ChoiceStream;
use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use pagoda_engine::RequestOutput;
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
}

fn frame(payload: &str) -> Bytes {
    Bytes::from(format!("data: {payload}\n\n"))
}

/// Starts streaming `choices` through `formatter`; returns the response.
pub fn stream_response<F: ChunkFormatter>(
    choices: Vec<ChoiceStream>,
    mut formatter: F,
    include_usage: bool,
) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(CHANNEL_CHUNKS);
    tokio::spawn(async move {
        let mut merged =
            futures_util::stream::select_all(choices.into_iter().map(|c| c.into_stream()));
        for payload in formatter.start() {
            if tx.send(frame(&payload)).await.is_err() {
                return;
            }
        }
        loop {
            let item = tokio::select! {
                item = merged.next() => item,
                // The client went away: returning drops `merged`, which aborts.
                _ = tx.closed() => return,
            };
            let chunks = match item {
                None => break,
                Some((index, Ok(out))) => formatter.output(index, &out),
                Some((_, Err(e))) => {
                    tracing::warn!(error = %e.message, "stream failed");
                    let _ = tx.send(frame(&e.body_json())).await;
                    let _ = tx.send(frame("[DONE]")).await;
                    return;
                }
            };
            for payload in chunks {
                if tx.send(frame(&payload)).await.is_err() {
                    return;
                }
            }
        }
        if include_usage {
            let usage = formatter.usage_chunk();
            if tx.send(frame(&usage)).await.is_err() {
                return;
            }
        }
        let _ = tx.send(frame("[DONE]")).await;
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

/// Serializes a chunk; a failure (not expected for these types) becomes an
/// error event rather than a panic.
pub fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| {
        ApiError::internal(format!("cannot serialize a chunk: {e}")).body_json()
    })
}
