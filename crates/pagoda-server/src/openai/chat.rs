//! `POST /v1/chat/completions`: request, response and stream chunk.

use super::common::{SamplingFields, Usage};
use pagoda_model::tokenizer::MessageContent;
use serde::{Deserialize, Serialize};

/// One message as sent: `content` a string or a list of `{type: "text", text}`;
/// an assistant message may carry `tool_calls`, a `tool` message its
/// `tool_call_id` (see [`crate::tools::request`]).
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(default)]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
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
    /// Functions the model may call.
    #[serde(default)]
    pub tools: Option<Vec<serde_json::Value>>,
    /// `none`, `auto`, `required` or `{type: function, function: {name}}`.
    #[serde(default)]
    pub tool_choice: Option<serde_json::Value>,
    /// Whether a forced choice may make several calls (default true).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
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

/// `function` of a tool call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionCallOut {
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// One tool call of a response message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallOut {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCallOut,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatMessageOut {
    pub role: &'static str,
    /// Null when the message only calls tools.
    pub content: Option<String>,
    /// The model's thinking (with a reasoning parser).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
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
    /// vLLM's prompt logprobs, where asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<super::PromptLogprobs>,
}

/// `delta` of a stream chunk: the role on a choice's first chunk, then text,
/// reasoning or tool calls.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// `function` of a streamed tool call: the name on the call's first delta,
/// then pieces of the arguments.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FunctionCallDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// A streamed tool call: `index` in the message's `tool_calls`; `id` and
/// `type` on its first delta only.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionCallDelta,
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
