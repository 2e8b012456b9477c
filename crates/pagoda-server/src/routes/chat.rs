//! `POST /v1/chat/completions`: messages through the model's chat template
//! (with the assistant's generation prompt) -> choices, as one JSON response
//! or an SSE stream of `chat.completion.chunk`s whose first delta per choice
//! is `{role: "assistant"}`.
//!
//! Roles: `system`, `user`, `assistant`, `tool`, and `developer` (OpenAI's
//! newer name for `system`, passed as `system` to a template that never
//! mentions `developer`, as vLLM does). `add_generation_prompt` (default
//! true), `chat_template_kwargs` and `tools` reach the template; kwargs may
//! not replace the variables the server sets (`messages`,
//! `add_generation_prompt`, `tools`).
//!
//! Tool calls and reasoning: see [`crate::tools`], [`crate::reasoning`] and
//! [`super::chat_output`]; `tool_choice: required` or a named function sets a
//! grammar as the request's structured-output constraint (and so cannot be
//! combined with another one).
//!
//! `continue_final_message` renders without the generation prompt and cuts
//! the rendering right after the last message's text (transformers' rule),
//! so the model continues that message. `echo` (vLLM's) puts the last
//! message's text in front of the reply when that message is the
//! assistant's (in the first chunk of a stream).

use super::chat_output::{finish_reason, message, OutputFormat, StreamState};
use super::generation::{collect_and_log, submit_all, UsageTally};
use super::logprobs::{chat_logprobs, prompt_logprobs};
use super::params::{logprobs_count, ChoiceParams};
use crate::error::{ApiError, JsonBody};
use crate::openai::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatDelta, ChatMessageIn, Usage,
};
use crate::request_log::RequestLog;
use crate::sse::{stream_response, to_json, ChunkFormatter};
use crate::state::{unix_now, AppState};
use crate::text::LenCheck;
use crate::tools::request::{template_messages, RequestTools, ToolChoice};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use pagoda_core::sampling::StructuredOutput;
use pagoda_engine::RequestOutput;
use pagoda_model::tokenizer::{ChatTemplateOptions, MessageContent, Tokenizer};
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
    let rendered = template_messages(messages, knows_developer)?;
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
    let mut params = ChoiceParams {
        prompt_param: "messages",
        ..ChoiceParams::from_fields(&req.sampling)?
    };
    let tools = RequestTools::read(req.tools, req.tool_choice, req.parallel_tool_calls)?;
    let marker = state.tokenizer.token_to_id(crate::tools::mistral::MARKER);
    let plan = tools.plan(state.config.tool_call_parser, marker)?;
    if let Some(grammar) = plan.grammar {
        if params.sampling.structured.is_some() {
            return Err(ApiError::invalid_param(
                "tool_choice",
                "tool_choice \"required\" or a named function cannot be combined with \
                 another output constraint (response_format, guided decoding)",
            ));
        }
        params.sampling.structured = Some(StructuredOutput::Lark(grammar));
    }
    let format = OutputFormat {
        reasoning: state.config.reasoning_parser,
        tools: plan.parse,
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
    let mut options = template_options(add_generation_prompt, req.chat_template_kwargs)?;
    let excluded =
        tools.choice == ToolChoice::None && state.config.exclude_tools_when_tool_choice_none;
    if !tools.tools.is_empty() && !excluded {
        options.tools = Some(tools.tools);
    }
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
            states: (0..n).map(|_| StreamState::new(format)).collect(),
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
    // One prompt: vLLM puts its logprobs at the top of the response.
    let prompt_lps = results
        .first()
        .and_then(|r| r.prompt_logprobs.as_ref())
        .map(|e| prompt_logprobs(&tokenizer, e, params.tokens_as_ids));
    let choices = results
        .into_iter()
        .map(|r| {
            let mut message = message(format, &r.text);
            if !echo.is_empty() {
                message.content = Some(format!("{echo}{}", message.content.unwrap_or_default()));
            }
            ChatChoice {
                index: r.index,
                logprobs: logprobs
                    .map(|_| chat_logprobs(&tokenizer, &r.logprobs, params.tokens_as_ids)),
                finish_reason: Some(finish_reason(
                    r.finish_reason,
                    !message.tool_calls.is_empty(),
                )),
                message,
            }
        })
        .collect();
    let response = ChatCompletionResponse {
        id,
        object: "chat.completion",
        created: unix_now(),
        model,
        choices,
        usage,
        prompt_logprobs: prompt_lps,
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
    /// Per choice: its output parser.
    states: Vec<StreamState>,
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
                    ..ChatDelta::default()
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
        let last = out.finish_reason.is_some();
        let Some(state) = self.states.get_mut(index) else {
            return Vec::new();
        };
        let mut deltas = state.deltas(&out.text_delta, last);
        let finish = out
            .finish_reason
            .map(|r| finish_reason(r, state.made_calls()));
        if deltas.is_empty() && (logprobs.is_some() || last) {
            deltas.push(ChatDelta::default());
        }
        let count = deltas.len();
        let mut logprobs = logprobs;
        deltas
            .into_iter()
            .enumerate()
            .map(|(i, delta)| {
                let choice = ChatChunkChoice {
                    index,
                    delta,
                    logprobs: logprobs.take(),
                    finish_reason: if i + 1 == count { finish } else { None },
                };
                self.chunk(vec![choice], None)
            })
            .collect()
    }

    fn usage_chunk(&mut self) -> String {
        self.chunk(Vec::new(), Some(self.tally.usage()))
    }

    fn usage(&self) -> crate::openai::Usage {
        self.tally.usage()
    }
}
