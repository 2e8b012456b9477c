//! `POST /v1/completions`: prompts (text, texts, token ids, lists of ids)
//! -> one choice per prompt and `n`, as one JSON response or an SSE stream of
//! `text_completion` chunks.

use super::generation::{collect_and_log, submit_all, UsageTally};
use super::logprobs::{completion_logprobs, prompt_logprobs};
use super::params::{check_num_seqs, logprobs_count, ChoiceParams};
use crate::error::{ApiError, JsonBody};
use crate::openai::{CompletionChoice, CompletionRequest, CompletionResponse, Prompt};
use crate::request_log::RequestLog;
use crate::sse::{stream_response, to_json, ChunkFormatter};
use crate::state::{unix_now, AppState};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use pagoda_engine::RequestOutput;
use pagoda_model::tokenizer::Tokenizer;
use std::sync::Arc;
use std::time::Instant;

/// A prompt's token ids, and its text when it was given as text.
type PromptIds = (Vec<u32>, Option<String>);

/// How many prompts `prompt` holds.
fn num_prompts(prompt: &Prompt) -> usize {
    match prompt {
        Prompt::Text(_) | Prompt::Ids(_) => 1,
        Prompt::Texts(ts) => ts.len(),
        Prompt::IdLists(ls) => ls.len(),
    }
}

/// Refuses a text prompt too long for the model, from its length alone.
fn check_text_lens(state: &AppState, prompt: &Prompt) -> Result<(), ApiError> {
    match prompt {
        Prompt::Text(t) => state.text.check_len(t.len(), "prompt"),
        Prompt::Texts(ts) => ts
            .iter()
            .try_for_each(|t| state.text.check_len(t.len(), "prompt")),
        Prompt::Ids(_) | Prompt::IdLists(_) => Ok(()),
    }
}

/// The prompts' token ids, and their text (for `echo`). Blocking.
fn prompt_ids(tokenizer: &Tokenizer, prompt: Prompt) -> Result<Vec<PromptIds>, ApiError> {
    let prompts: Vec<PromptIds> = match prompt {
        Prompt::Text(t) => vec![(tokenizer.encode(&t, true)?, Some(t))],
        Prompt::Texts(ts) => ts
            .into_iter()
            .map(|t| Ok((tokenizer.encode(&t, true)?, Some(t))))
            .collect::<Result<_, ApiError>>()?,
        Prompt::Ids(ids) => vec![(ids, None)],
        Prompt::IdLists(lists) => lists.into_iter().map(|ids| (ids, None)).collect(),
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid_param(
            "prompt",
            "the prompt list is empty",
        ));
    }
    Ok(prompts)
}

pub async fn completions(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<serde_json::Value>,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let req: CompletionRequest = super::parse_request(&body)?;
    state.check_model(req.model.as_deref())?;
    let params = ChoiceParams::from_fields(&req.sampling)?;
    let logprobs = req
        .logprobs
        .map(|v| logprobs_count("logprobs", v))
        .transpose()?;
    if req.echo && logprobs.is_some() {
        return Err(ApiError::invalid_param(
            "echo",
            "echo with logprobs is not supported (prompt logprobs are not computed)",
        ));
    }
    check_num_seqs(
        num_prompts(&req.prompt),
        params.n,
        state.config.max_seqs_per_request,
    )?;
    check_text_lens(&state, &req.prompt)?;
    let tokenizer = state.tokenizer.clone();
    let (prompt, want_echo) = (req.prompt, req.echo);
    let (prompts, echo) = state
        .text
        .run(move |tokenizer, _| {
            let prompts = prompt_ids(tokenizer, prompt)?;
            let echo: Vec<String> = if want_echo {
                prompts
                    .iter()
                    .map(|(ids, text)| match text {
                        Some(t) => Ok(t.clone()),
                        None => Ok(tokenizer.decode(ids, false)?),
                    })
                    .collect::<Result<_, ApiError>>()?
            } else {
                vec![String::new(); prompts.len()]
            };
            Ok((prompts, echo))
        })
        .await?;
    let ids: Vec<Vec<u32>> = prompts.into_iter().map(|(ids, _)| ids).collect();
    let choices = submit_all(&state, &ids, &params, logprobs, received).await?;
    let id = state.response_id("cmpl");
    let log = RequestLog::new(id.clone(), "/v1/completions", received);
    let model = state.config.served_model_name.clone();
    if params.stream {
        let n = choices.len();
        let formatter = CompletionChunks {
            id,
            created: unix_now(),
            model,
            tokenizer,
            echo,
            n_per_prompt: params.n,
            started: vec![false; n],
            offsets: vec![0; n],
            tally: UsageTally::new(ids.len(), n),
            tokens_as_ids: params.tokens_as_ids,
        };
        return Ok(stream_response(
            choices,
            formatter,
            params.include_usage,
            state.config.stream_stall_timeout,
            log,
        ));
    }
    let (results, usage) = collect_and_log(choices, log, ids.len()).await?;
    let choices = results
        .into_iter()
        .map(|r| {
            let prefix = &echo[r.prompt_index];
            let as_ids = params.tokens_as_ids;
            let logprobs = logprobs
                .map(|_| completion_logprobs(&tokenizer, &r.logprobs, prefix.len(), as_ids));
            CompletionChoice {
                index: r.index,
                text: format!("{prefix}{}", r.text),
                logprobs,
                finish_reason: Some(r.finish_reason.as_str()),
                prompt_logprobs: r
                    .prompt_logprobs
                    .as_ref()
                    .map(|e| prompt_logprobs(&tokenizer, e, as_ids)),
            }
        })
        .collect();
    let response = CompletionResponse {
        id,
        object: "text_completion",
        created: unix_now(),
        model,
        choices,
        usage: Some(usage),
    };
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        to_json(&response),
    )
        .into_response())
}

/// Streams `text_completion` chunks.
struct CompletionChunks {
    id: String,
    created: u64,
    model: String,
    tokenizer: Arc<Tokenizer>,
    /// Per prompt: text sent in front of its choices' first chunk.
    echo: Vec<String>,
    n_per_prompt: usize,
    /// Per choice: sent its first chunk.
    started: Vec<bool>,
    /// Per choice: bytes of text sent (for `text_offset`).
    offsets: Vec<usize>,
    tally: UsageTally,
    tokens_as_ids: bool,
}

impl CompletionChunks {
    fn chunk(&self, choices: Vec<CompletionChoice>, usage: Option<crate::openai::Usage>) -> String {
        to_json(&CompletionResponse {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        })
    }
}

impl ChunkFormatter for CompletionChunks {
    fn start(&mut self) -> Vec<String> {
        Vec::new()
    }

    fn output(&mut self, index: usize, out: &RequestOutput) -> Vec<String> {
        let prompt_index = index / self.n_per_prompt.max(1);
        self.tally.observe(index, prompt_index, out);
        let (Some(started), Some(offset)) =
            (self.started.get_mut(index), self.offsets.get_mut(index))
        else {
            return Vec::new();
        };
        let mut text = String::new();
        if !*started {
            *started = true;
            text.push_str(
                self.echo
                    .get(prompt_index)
                    .map(String::as_str)
                    .unwrap_or(""),
            );
        }
        let token_offset = *offset + text.len();
        text.push_str(&out.text_delta);
        *offset += text.len();
        let logprobs = out.logprobs.as_ref().map(|lp| {
            let tokens = [(out.token_id, lp.clone())];
            completion_logprobs(&self.tokenizer, &tokens, token_offset, self.tokens_as_ids)
        });
        if text.is_empty() && logprobs.is_none() && out.finish_reason.is_none() {
            return Vec::new();
        }
        let choice = CompletionChoice {
            index,
            text,
            logprobs,
            finish_reason: out.finish_reason.map(|r| r.as_str()),
            prompt_logprobs: None,
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
