//! `POST /v1/chat/completions`: request, response and stream chunk.

use super::common::{SamplingFields, Usage};
use pagoda_model::tokenizer::MessageContent;
use serde::{Deserialize, Serialize};

/// One message as sent: `content` a string or a list of `{type: "text", text}`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<ChatMessageIn>,
    /// Filled by [`crate::routes::parse_request`] from the same body.
    #[serde(skip)]
    pub sampling: SamplingFields,
    /// Return the sampled tokens' logprobs.
    #[serde(default)]
    pub logprobs: bool,
    /// With `logprobs`: also the most likely tokens at each position (0..=20).
    #[serde(default)]
    pub top_logprobs: Option<i64>,
    /// End the prompt with the assistant turn's header (default true).
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// Extra variables for the chat template (e.g. `enable_thinking`).
    #[serde(default)]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Continue the last message instead of starting a new turn (vLLM's and
    /// transformers' option; excludes `add_generation_prompt: true`).
    #[serde(default)]
    pub continue_final_message: Option<bool>,
    /// vLLM: the reply starts with the last message's text when that
    /// message is the assistant's.
    #[serde(default)]
    pub echo: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatMessageOut {
    pub role: &'static str,
    pub content: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ChatMessageOut,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

/// `delta` of a stream chunk: the role on a choice's first chunk, then text.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// `object: "chat.completion.chunk"`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}
