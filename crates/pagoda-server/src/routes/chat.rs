//! `POST /v1/chat/completions`: messages through the model's chat template
//! (with the assistant's generation prompt) -> choices, as one JSON response
//! or an SSE stream of `chat.completion.chunk`s whose first delta per choice
//! is `{role: "assistant"}`.
//!
//! Roles: `system`, `user`, `assistant`, and `developer` (OpenAI's newer name
//! for `system`, passed as `system` to a template that never mentions
//! `developer`, as vLLM does). `add_generation_prompt` (default true) and
//! `chat_template_kwargs` reach the template; kwargs may not replace the
//! variables the server sets (`messages`, `add_generation_prompt`, `tools`).
//! `continue_final_message` renders without the generation prompt and cuts
//! the rendering right after the last message's text (transformers' rule),
//! so the model continues that message. `echo` (vLLM's) puts the last
//! message's text in front of the reply when that message is the
//! assistant's (in the first chunk of a stream).

use super::generation::{collect_and_log, submit_all, UsageTally};
use super::logprobs::chat_logprobs;
use super::params::{logprobs_count, ChoiceParams};
use crate::error::{ApiError, JsonBody};
use crate::openai::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatDelta, ChatMessageIn, ChatMessageOut, Usage,
};
use crate::request_log::RequestLog;
use crate::sse::{stream_response, to_json, ChunkFormatter};
use crate::state::{unix_now, AppState};
use crate::text::LenCheck;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use pagoda_engine::RequestOutput;
use pagoda_model::tokenizer::{ChatMessage, ChatTemplateOptions, MessageContent, Tokenizer};
use std::sync::Arc;
use std::time::Instant;

/// Template variables the server sets itself.
const RESERVED_KWARGS: &[&str] = &["messages", "add_generation_prompt", "tools"];

/// `options` for a request's `add_generation_prompt` and
/// `chat_template_kwargs`, refusing kwargs that would replace what the
/// server sets.
pub fn template_options(
    add_generation_prompt: Option<bool>,
    kwargs: Option<serde_json::Map<String, serde_json::Value>>,
) -> Result<ChatTemplateOptions, ApiError> {
    let extra = kwargs.unwrap_or_default();
    if let Some(k) = RESERVED_KWARGS.iter().find(|k| extra.contains_key(**k)) {
        return Err(ApiError::invalid_param(
            "chat_template_kwargs",
            format!("chat_template_kwargs may not set '{k}' (the server sets it)"),
        ));
    }
    Ok(ChatTemplateOptions {
        add_generation_prompt: add_generation_prompt.unwrap_or(true),
        tools: None,
        extra,
    })
}

/// Renders `messages` with the chat template and tokenizes the result,
/// refusing (per `check`) a rendering too long for the model untokenized.
/// Blocking: call it through [`crate::text::TextWork::run`].
pub fn chat_prompt_ids(
    tokenizer: &Tokenizer,
    messages: &[ChatMessageIn],
    options: &ChatTemplateOptions,
    add_special_tokens: bool,
    continue_final: bool,
    check: &LenCheck,
) -> Result<Vec<u32>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages must not be empty",
        ));
    }
    let Some(template) = tokenizer.chat_template() else {
        return Err(ApiError::invalid(
            "the model has no chat template; use /v1/completions",
        ));
    };
    let knows_developer = template.source().contains("developer");
    let mut rendered = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "user" | "assistant" => m.role.as_str(),
            "developer" if knows_developer => "developer",
            "developer" => "system",
            _ => {
                return Err(ApiError::invalid_param(
                    &format!("messages[{i}].role"),
                    format!(
                        "messages[{i}].role '{}' is not supported (use system, developer, \
                         user or assistant)",
                        m.role
                    ),
                ))
            }
        };
        let text = match &m.content {
            None => String::new(),
            Some(c) => c.to_text().map_err(|e| {
                ApiError::invalid_param(&format!("messages[{i}].content"), e.to_string())
            })?,
        };
        rendered.push(ChatMessage {
            content: Some(MessageContent::Text(text)),
            ..ChatMessage::new(role, "")
        });
    }
    let mut text = template.render(&rendered, options)?;
    if continue_final {
        let last = rendered.last().and_then(|m| match &m.content {
            Some(MessageContent::Text(t)) => Some(t.as_str()),
            _ => None,
        });
        text = cut_after_final_message(&text, last.unwrap_or(""))?;
    }
    check.check(text.len(), "messages")?;
    Ok(tokenizer.encode(&text, add_special_tokens)?)
}

/// transformers' `continue_final_message`: the rendering up to the end of
/// the last occurrence of the final message's text (with its trailing
/// whitespace where the template kept it), dropping the template's
/// end-of-turn for it.
pub fn cut_after_final_message(rendered: &str, last: &str) -> Result<String, ApiError> {
    let stripped = last.trim();
    let Some(at) = rendered.rfind(stripped) else {
        return Err(ApiError::invalid_param(
            "continue_final_message",
            "the final message does not appear in the chat template's rendering, \
             so it cannot be continued",
        ));
    };
    let lstripped = last.trim_start();
    let end = if rendered.get(at..at + lstripped.len()) == Some(last) {
        at + lstripped.len()
    } else {
        at + stripped.len()
    };
    Ok(rendered[..end].to_string())
}

pub async fn chat_completions(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<serde_json::Value>,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let req: ChatCompletionRequest = super::parse_request(&body)?;
    state.check_model(req.model.as_deref())?;
    let params = ChoiceParams {
        prompt_param: "messages",
        ..ChoiceParams::from_fields(&req.sampling)?
    };
    let top = req
        .top_logprobs
        .map(|v| logprobs_count("top_logprobs", v))
        .transpose()?;
    let logprobs = match (req.logprobs, top) {
        (true, t) => Some(t.unwrap_or(0)),
        (false, None) => None,
        (false, Some(_)) => {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ))
        }
    };
    let tokenizer = state.tokenizer.clone();
    let echo = match req.messages.last() {
        Some(m) if req.echo && m.role == "assistant" => match &m.content {
            Some(c) => c.to_text().map_err(|e| {
                ApiError::invalid_param("messages", format!("the last message: {e}"))
            })?,
            None => String::new(),
        },
        _ => String::new(),
    };
    let messages = req.messages;
    let continue_final = req.continue_final_message.unwrap_or(false);
    let add_generation_prompt = match (continue_final, req.add_generation_prompt) {
        (true, Some(true)) => {
            return Err(ApiError::invalid_param(
                "continue_final_message",
                "continue_final_message and add_generation_prompt cannot both be true",
            ))
        }
        (true, _) => Some(false),
        (false, a) => a,
    };
    let options = template_options(add_generation_prompt, req.chat_template_kwargs)?;
    // The template writes any BOS it wants.
    let ids = vec![
        state
            .text
            .run(move |tok, check| {
                chat_prompt_ids(tok, &messages, &options, false, continue_final, check)
            })
            .await?,
    ];
    let choices = submit_all(&state, &ids, &params, logprobs, received).await?;
    let id = state.response_id("chatcmpl");
    let log = RequestLog::new(id.clone(), "/v1/chat/completions", received);
    let model = state.config.served_model_name.clone();
    if params.stream {
        let n = choices.len();
        let formatter = ChatChunks {
            id,
            created: unix_now(),
            model,
            tokenizer,
            n,
            tally: UsageTally::new(1, n),
            tokens_as_ids: params.tokens_as_ids,
            echo,
        };
        return Ok(stream_response(
            choices,
            formatter,
            params.include_usage,
            state.config.stream_stall_timeout,
            log,
        ));
    }
    let (results, usage) = collect_and_log(choices, log, 1).await?;
    let choices = results
        .into_iter()
        .map(|r| ChatChoice {
            index: r.index,
            logprobs: logprobs
                .map(|_| chat_logprobs(&tokenizer, &r.logprobs, params.tokens_as_ids)),
            message: ChatMessageOut {
                role: "assistant",
                content: format!("{echo}{}", r.text),
            },
            finish_reason: Some(r.finish_reason.as_str()),
        })
        .collect();
    let response = ChatCompletionResponse {
        id,
        object: "chat.completion",
        created: unix_now(),
        model,
        choices,
        usage,
    };
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        to_json(&response),
    )
        .into_response())
}

/// Streams `chat.completion.chunk`s.
struct ChatChunks {
    id: String,
    created: u64,
    model: String,
    tokenizer: Arc<Tokenizer>,
    n: usize,
    tally: UsageTally,
    tokens_as_ids: bool,
    /// Text in front of every choice (`echo`).
    echo: String,
}

impl ChatChunks {
    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> String {
        to_json(&ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        })
    }
}

impl ChunkFormatter for ChatChunks {
    fn start(&mut self) -> Vec<String> {
        (0..self.n)
            .map(|index| {
                let delta = ChatDelta {
                    role: Some("assistant"),
                    content: Some(self.echo.clone()),
                };
                self.chunk(
                    vec![ChatChunkChoice {
                        index,
                        delta,
                        logprobs: None,
                        finish_reason: None,
                    }],
                    None,
                )
            })
            .collect()
    }

    fn output(&mut self, index: usize, out: &RequestOutput) -> Vec<String> {
        self.tally.observe(index, 0, out);
        let logprobs = out.logprobs.as_ref().map(|lp| {
            let tokens = [(out.token_id, lp.clone())];
            chat_logprobs(&self.tokenizer, &tokens, self.tokens_as_ids)
        });
        if out.text_delta.is_empty() && logprobs.is_none() && out.finish_reason.is_none() {
            return Vec::new();
        }
        let delta = ChatDelta {
            role: None,
            content: (!out.text_delta.is_empty()).then(|| out.text_delta.clone()),
        };
        let choice = ChatChunkChoice {
            index,
            delta,
            logprobs,
            finish_reason: out.finish_reason.map(|r| r.as_str()),
        };
        vec![self.chunk(vec![choice], None)]
    }

    fn usage_chunk(&mut self) -> String {
        self.chunk(Vec::new(), Some(self.tally.usage()))
    }

    fn usage(&self) -> crate::openai::Usage {
        self.tally.usage()
    }
}
