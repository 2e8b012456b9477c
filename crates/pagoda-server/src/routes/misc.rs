//! The small routes: `GET /v1/models`, `GET /health`, `GET /metrics`,
//! `POST /tokenize`, `POST /detokenize`.

use super::chat::chat_prompt_ids;
use crate::error::{ApiError, JsonBody};
use crate::openai::{
    DetokenizeRequest, DetokenizeResponse, ModelCard, ModelList, TokenizeRequest, TokenizeResponse,
};
use crate::sse::to_json;
use crate::state::AppState;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use pagoda_model::tokenizer::ChatTemplateOptions;

fn json<T: serde::Serialize>(value: &T) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], to_json(value)).into_response()
}

pub async fn models(State(state): State<AppState>) -> Response {
    json(&ModelList {
        object: "list",
        data: vec![ModelCard {
            id: state.config.served_model_name.clone(),
            object: "model",
            created: state.started,
            owned_by: "pagoda",
            max_model_len: state.config.max_model_len,
        }],
    })
}

/// 200 while the engine thread is up, 503 once it has stopped.
pub async fn health(State(state): State<AppState>) -> Response {
    if state.handle.is_closed() {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "service_unavailable",
            ..ApiError::invalid("the engine has stopped")
        }
        .into_response()
    } else {
        StatusCode::OK.into_response()
    }
}

pub async fn metrics(State(state): State<AppState>) -> Response {
    let stats = state.handle.stats().await.ok();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(stats.as_ref()),
    )
        .into_response()
}

/// Tokenizes a prompt or a chat (on the blocking pool). Texts longer than
/// `max_model_len` tokens are refused, most of them from their length alone.
pub async fn tokenize(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<TokenizeRequest>,
) -> Result<Response, ApiError> {
    state.check_model(req.model.as_deref())?;
    if let Some(p) = &req.prompt {
        state.text.check_len(p.len(), "prompt")?;
    }
    let max_model_len = state.config.max_model_len;
    let (tokens, token_strs) = state
        .text
        .run(move |tokenizer, check| {
            let (tokens, param) = match (&req.prompt, &req.messages) {
                (Some(p), None) => (
                    tokenizer.encode(p, req.add_special_tokens.unwrap_or(true))?,
                    "prompt",
                ),
                (None, Some(m)) => (
                    chat_prompt_ids(
                        tokenizer,
                        m,
                        &ChatTemplateOptions {
                            add_generation_prompt: req.add_generation_prompt,
                            ..Default::default()
                        },
                        req.add_special_tokens.unwrap_or(false),
                        false,
                        check,
                    )?,
                    "messages",
                ),
                _ => {
                    return Err(ApiError::invalid(
                        "give either 'prompt' (text) or 'messages' (a chat)",
                    ))
                }
            };
            if tokens.len() > max_model_len {
                return Err(ApiError::invalid_param(
                    param,
                    format!(
                        "this model's maximum context length is {max_model_len} tokens, \
                         but the text has {} tokens",
                        tokens.len()
                    ),
                )
                .with_code("context_length_exceeded"));
            }
            let token_strs: Option<Vec<String>> = req.return_token_strs.then(|| {
                tokens
                    .iter()
                    .map(|&t| tokenizer.id_to_token(t).unwrap_or_default())
                    .collect()
            });
            Ok((tokens, token_strs))
        })
        .await?;
    Ok(json(&TokenizeResponse {
        count: tokens.len(),
        max_model_len,
        tokens,
        token_strs,
    }))
}

pub async fn detokenize(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<DetokenizeRequest>,
) -> Result<Response, ApiError> {
    state.check_model(req.model.as_deref())?;
    let vocab = state.tokenizer.vocab_size();
    if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid_param(
            "tokens",
            format!("token id {bad} is outside the vocabulary (size {vocab})"),
        ));
    }
    let tokens = req.tokens;
    let prompt = state
        .text
        .run(move |tokenizer, _| Ok(tokenizer.decode(&tokens, false)?))
        .await?;
    Ok(json(&DetokenizeResponse { prompt }))
}
