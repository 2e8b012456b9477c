//! `POST /v1/completions`: request, response and stream chunk.

use super::common::{SamplingFields, Usage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `prompt`: text, texts, token ids, or lists of token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub prompt: Prompt,
    /// Filled by [`crate::routes::parse_request`] from the same body.
    #[serde(skip)]
    pub sampling: SamplingFields,
    /// Legacy logprobs: the sampled token's and the `logprobs` most likely.
    #[serde(default)]
    pub logprobs: Option<i64>,
    /// Put the prompt text in front of the completion.
    #[serde(default)]
    pub echo: bool,
}

/// The legacy `logprobs` object of a completion choice.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    /// Byte offset of each token's text in the choice's text.
    pub text_offset: Vec<usize>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
    /// vLLM's prompt logprobs, where asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<super::PromptLogprobs>,
}

/// A response (`object: "text_completion"`) or, when streaming, one chunk.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}
