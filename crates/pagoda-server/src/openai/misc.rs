//! `GET /v1/models` and vLLM's `POST /tokenize` and `POST /detokenize`.

use super::chat::ChatMessageIn;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub max_model_len: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

fn yes() -> bool {
    true
}

/// `POST /tokenize`: either `prompt` (text) or `messages` (a chat).
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub prompt: Option<String>,
    #[serde(default)]
    pub messages: Option<Vec<ChatMessageIn>>,
    /// Default: true for `prompt`, false for `messages` (the template writes BOS).
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    #[serde(default = "yes")]
    pub add_generation_prompt: bool,
    #[serde(default)]
    pub return_token_strs: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
    pub token_strs: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}
