//! Fields shared by the completion and chat APIs: sampling options, stop,
//! stream options and usage.

use serde::{Deserialize, Serialize};

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and no choices) before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling options both endpoints take (flattened into their requests).
/// Numbers are read wide (i64/f64) so that out-of-range values reach
/// validation and get a clear message instead of a type error.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplingFields {
    #[serde(default)]
    pub max_tokens: Option<i64>,
    /// The chat API's newer name for `max_tokens` (wins when both are given).
    #[serde(default)]
    pub max_completion_tokens: Option<i64>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    /// vLLM: -1 or 0 disables.
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub min_p: Option<f64>,
    #[serde(default)]
    pub n: Option<i64>,
    #[serde(default)]
    pub stop: Option<StopField>,
    /// vLLM: token ids that end the request besides EOS.
    #[serde(default)]
    pub stop_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    #[serde(default)]
    pub repetition_penalty: Option<f64>,
    #[serde(default)]
    pub ignore_eos: bool,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// `response_format`, `structured_outputs`, `guided_*`.
    #[serde(flatten)]
    pub structured: super::StructuredFields,
    /// Token id (as a string) -> bias in [-100, 100] added to its logit.
    #[serde(default)]
    pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    /// vLLM: only these tokens may be generated.
    #[serde(default)]
    pub allowed_token_ids: Option<Vec<i64>>,
    /// vLLM: words never generated.
    #[serde(default)]
    pub bad_words: Option<Vec<String>>,
    /// vLLM: EOS, stop ids and stop strings do not end the request before
    /// this many tokens.
    #[serde(default)]
    pub min_tokens: Option<i64>,
    /// vLLM: keep the matched stop string (or stop token's text) in the text.
    #[serde(default)]
    pub include_stop_str_in_output: Option<bool>,
    /// vLLM: leave special tokens out of the text (default true).
    #[serde(default)]
    pub skip_special_tokens: Option<bool>,
    /// vLLM: spaces around special tokens in the text (default true).
    #[serde(default)]
    pub spaces_between_special_tokens: Option<bool>,
    /// vLLM: logprob tokens as `token_id:N` instead of their text.
    #[serde(default)]
    pub return_tokens_as_token_ids: Option<bool>,
    /// vLLM: the logprob of each prompt token and this many alternatives.
    #[serde(default)]
    pub prompt_logprobs: Option<i64>,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: usize,
}

/// `usage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}
