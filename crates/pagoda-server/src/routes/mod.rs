//! The router: OpenAI routes under `/v1` (behind the API key when one is
//! set), vLLM's `/tokenize` and `/detokenize` (also behind the key),
//! `/metrics` (behind the key unless [`crate::ServerConfig::public_metrics`])
//! and the open `/health`. Every response's status is counted for
//! `/metrics`; every error, the router's own 404 and 405 included, has
//! OpenAI's JSON shape; bodies are limited to
//! [`crate::ServerConfig::max_body_bytes`].
//!
//! - [`auth`]: the API key check;
//! - [`fields`]: which request fields are honoured, ignored or refused;
//! - [`params`]: request options -> engine sampling parameters;
//! - [`structured`]: structured-output fields -> one checked constraint;
//! - [`generation`]: submitting choices and reading them back;
//! - [`logprobs`]: engine logprobs -> OpenAI's shapes;
//! - [`chat_output`]: a chat output -> content, reasoning and tool calls;
//! - [`completions`], [`chat`], [`misc`]: the handlers.

pub mod auth;
pub mod chat;
pub mod chat_output;
pub mod completions;
pub mod fields;
pub mod generation;
pub mod logprobs;
pub mod misc;
pub mod params;
pub mod structured;

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

/// A generation request with its shared sampling fields.
pub trait HasSampling {
    /// The endpoint whose fields [`fields::check_fields`] checks.
    const ENDPOINT: fields::Endpoint;
    fn sampling_mut(&mut self) -> &mut crate::openai::SamplingFields;
}

impl HasSampling for crate::openai::CompletionRequest {
    const ENDPOINT: fields::Endpoint = fields::Endpoint::Completions;
    fn sampling_mut(&mut self) -> &mut crate::openai::SamplingFields {
        &mut self.sampling
    }
}

impl HasSampling for crate::openai::ChatCompletionRequest {
    const ENDPOINT: fields::Endpoint = fields::Endpoint::Chat;
    fn sampling_mut(&mut self) -> &mut crate::openai::SamplingFields {
        &mut self.sampling
    }
}

/// Reads a generation request and its sampling fields from one body,
/// refusing fields the endpoint neither honours nor may ignore.
pub fn parse_request<T: serde::de::DeserializeOwned + HasSampling>(
    body: &serde_json::Value,
) -> Result<T, ApiError> {
    if !body.is_object() {
        return Err(ApiError::invalid("the request body must be a JSON object"));
    }
    fields::check_fields(body, T::ENDPOINT)?;
    let mut request: T = crate::error::from_value(body)?;
    *request.sampling_mut() = crate::error::from_value(body)?;
    Ok(request)
}

/// All routes over `state`.
pub fn router(state: AppState) -> Router {
    let mut protected = Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/models", get(misc::models))
        .route("/tokenize", post(misc::tokenize))
        .route("/detokenize", post(misc::detokenize));
    let mut open = Router::new().route("/health", get(misc::health));
    if state.config.public_metrics {
        open = open.route("/metrics", get(misc::metrics));
    } else {
        protected = protected.route("/metrics", get(misc::metrics));
    }
    let protected = protected.route_layer(middleware::from_fn_with_state(
        state.clone(),
        auth::require_api_key,
    ));
    Router::new()
        .merge(protected)
        .merge(open)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .layer(middleware::from_fn(json_errors))
        .layer(middleware::from_fn_with_state(state.clone(), count_status))
        .with_state(state)
}

async fn not_found(req: Request) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        code: Some("not_found"),
        ..ApiError::invalid(format!(
            "no route for {} {}",
            req.method(),
            req.uri().path()
        ))
    }
}

async fn count_status(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let response = next.run(req).await;
    state.metrics.record_response(response.status().as_u16());
    response
}

/// Gives an error response that is not JSON yet (axum's 405, an extractor's
/// plain-text rejection) OpenAI's JSON shape, keeping its status and its
/// `Allow` and `Retry-After` headers.
async fn json_errors(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let uri = req.uri().clone();
    let response = next.run(req).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let retry_after = response.headers().get(header::RETRY_AFTER).cloned();
    let reason = status.canonical_reason().unwrap_or("error").to_lowercase();
    let (message, code) = match (status, &allow) {
        (StatusCode::METHOD_NOT_ALLOWED, Some(allowed)) => (
            format!(
                "method {method} is not allowed for {} (allowed: {})",
                uri.path(),
                allowed.to_str().unwrap_or("?")
            ),
            Some("method_not_allowed"),
        ),
        (StatusCode::METHOD_NOT_ALLOWED, None) => (
            format!("method {method} is not allowed for {}", uri.path()),
            Some("method_not_allowed"),
        ),
        _ => (format!("{reason} ({method} {})", uri.path()), None),
    };
    let kind = if status.is_server_error() {
        "internal_server_error"
    } else {
        "invalid_request_error"
    };
    let mut json = ApiError {
        status,
        kind,
        code,
        ..ApiError::invalid(message)
    }
    .into_response();
    for (name, value) in [(header::ALLOW, allow), (header::RETRY_AFTER, retry_after)] {
        if let Some(v) = value {
            json.headers_mut().insert(name, v);
        }
    }
    json
}
