//! The router: OpenAI routes under `/v1` (behind the API key when one is
//! set), vLLM's `/tokenize` and `/detokenize` (also behind the key), and the
//! open `/health` and `/metrics`. Every response's status is counted for
//! `/metrics`; bodies are limited to [`crate::ServerConfig::max_body_bytes`].
//!
//! - [`params`]: request options -> engine sampling parameters;
//! - [`generation`]: submitting choices and reading them back;
//! - [`logprobs`]: engine logprobs -> OpenAI's shapes;
//! - [`completions`], [`chat`], [`misc`]: the handlers.

pub mod chat;
pub mod completions;
pub mod generation;
pub mod logprobs;
pub mod misc;
pub mod params;

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

/// A generation request with its shared sampling fields.
pub trait HasSampling {
    fn sampling_mut(&mut self) -> &mut crate::openai::SamplingFields;
}

impl HasSampling for crate::openai::CompletionRequest {
    fn sampling_mut(&mut self) -> &mut crate::openai::SamplingFields {
        &mut self.sampling
    }
}

impl HasSampling for crate::openai::ChatCompletionRequest {
    fn sampling_mut(&mut self) -> &mut crate::openai::SamplingFields {
        &mut self.sampling
    }
}

/// Reads a generation request and its sampling fields from one body.
pub fn parse_request<T: serde::de::DeserializeOwned + HasSampling>(
    body: &serde_json::Value,
) -> Result<T, ApiError> {
    if !body.is_object() {
        return Err(ApiError::invalid("the request body must be a JSON object"));
    }
    let mut request: T = crate::error::from_value(body)?;
    *request.sampling_mut() = crate::error::from_value(body)?;
    Ok(request)
}

/// All routes over `state`.
pub fn router(state: AppState) -> Router {
    let protected = Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/models", get(misc::models))
        .route("/tokenize", post(misc::tokenize))
        .route("/detokenize", post(misc::detokenize))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    Router::new()
        .merge(protected)
        .route("/health", get(misc::health))
        .route("/metrics", get(misc::metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), count_status))
        .with_state(state)
}

async fn not_found(req: Request) -> ApiError {
    ApiError {
        status: axum::http::StatusCode::NOT_FOUND,
        code: Some("not_found"),
        ..ApiError::invalid(format!(
            "no route for {} {}",
            req.method(),
            req.uri().path()
        ))
    }
}

/// 401 unless `Authorization: Bearer <key>` matches the configured key.
async fn require_api_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.config.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Compares without stopping at the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn count_status(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let response = next.run(req).await;
    state.metrics.record_response(response.status().as_u16());
    response
}
