//! The request fields that ask for structured outputs, as the clients send
//! them: OpenAI's `response_format`, vLLM's `structured_outputs` object and
//! its older top-level `guided_*` fields. Kept raw here; `routes::structured`
//! reads them into one constraint.

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StructuredFields {
    /// `{type: text | json_object | json_schema, json_schema: {name, schema, strict}}`.
    #[serde(default)]
    pub response_format: Option<Value>,
    /// vLLM: `{json | regex | choice | grammar | json_object}`.
    #[serde(default)]
    pub structured_outputs: Option<Value>,
    #[serde(default)]
    pub guided_json: Option<Value>,
    #[serde(default)]
    pub guided_regex: Option<Value>,
    #[serde(default)]
    pub guided_choice: Option<Value>,
    #[serde(default)]
    pub guided_grammar: Option<Value>,
    /// llama.cpp's server: a GBNF (or Lark) grammar string.
    #[serde(default)]
    pub grammar: Option<Value>,
    /// llama.cpp's server: a JSON schema (object or its text).
    #[serde(default)]
    pub json_schema: Option<Value>,
}
