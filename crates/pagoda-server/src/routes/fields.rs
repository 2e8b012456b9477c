//! Which top-level request fields pagoda honours, ignores or refuses, checked
//! on the raw JSON body before it is read into a request type.
//!
//! Every field of a generation request is in exactly one of three lists:
//! - honoured ([`HONOURED_COMMON`] and the endpoint's own list): read and
//!   acted on by the handler;
//! - ignored ([`IGNORED`]): fields of OpenAI's API that cannot change what is
//!   generated, accepted and dropped;
//! - refused unless neutral ([`NEUTRAL`]): options of OpenAI or vLLM that
//!   pagoda does not implement yet; accepted only with the value that leaves
//!   the output as it is (null, empty, the default), otherwise a 400 naming
//!   the field.
//!
//! Any other field is a 400 naming it, so a client never gets output that
//! silently disregards something it asked for.

use crate::error::ApiError;
use serde_json::Value;

/// The generation endpoint a body was sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// Honoured by both endpoints.
pub const HONOURED_COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "stop",
    "stop_token_ids",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "stream",
    "stream_options",
    "logprobs",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "grammar",
    "json_schema",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "min_tokens",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "return_tokens_as_token_ids",
    "prompt_logprobs",
    "echo",
];
/// Honoured by `/v1/completions` only.
pub const HONOURED_COMPLETIONS: &[&str] = &["prompt"];
/// Honoured by `/v1/chat/completions` only.
pub const HONOURED_CHAT: &[&str] = &[
    "messages",
    "top_logprobs",
    "add_generation_prompt",
    "chat_template_kwargs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "continue_final_message",
];

/// Accepted and dropped: none of these can change the generated output.
/// - `user`: an end-user id for the provider's abuse monitoring;
/// - `store`, `metadata`: whether and with which tags the provider keeps the
///   completion for later retrieval (pagoda keeps nothing);
/// - `service_tier`: the provider's billing and latency tier;
/// - `safety_identifier`: `user`'s newer name;
/// - `prompt_cache_key`: a routing hint for the provider's prompt cache
///   (pagoda's prefix cache needs none);
/// - `request_id` (vLLM): an id for the provider's logs; the response keeps
///   pagoda's own id.
///
/// Each is logged once (the first time a request brings it) so an operator
/// can see what clients send.
pub const IGNORED: &[&str] = &[
    "user",
    "store",
    "metadata",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
    "request_id",
];

/// A field pagoda does not implement yet and the values that leave the
/// output unchanged.
pub struct Neutral {
    pub name: &'static str,
    /// `None`: both endpoints.
    pub only: Option<Endpoint>,
    /// What is accepted, as the refusal says it.
    pub accepted: &'static str,
    pub is_neutral: fn(&Value, &Value) -> bool,
}

fn null(v: &Value, _: &Value) -> bool {
    v.is_null()
}
fn null_or_false(v: &Value, _: &Value) -> bool {
    v.is_null() || *v == Value::Bool(false)
}
fn null_or_empty(v: &Value, _: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}
fn null_or_zero(v: &Value, _: &Value) -> bool {
    v.is_null() || v.as_f64() == Some(0.0)
}
fn null_or_one(v: &Value, _: &Value) -> bool {
    v.is_null() || v.as_f64() == Some(1.0)
}
/// Without functions, `auto` means no call.
fn no_tool_choice(v: &Value, _: &Value) -> bool {
    v.is_null() || matches!(v.as_str(), Some("none" | "auto"))
}
fn best_of_n(v: &Value, body: &Value) -> bool {
    let n = body.get("n").and_then(Value::as_i64).unwrap_or(1);
    v.is_null() || v.as_i64() == Some(n)
}
fn text_modality(v: &Value, _: &Value) -> bool {
    v.is_null() || *v == serde_json::json!(["text"])
}
fn default_special_tokens(v: &Value, body: &Value) -> bool {
    // Completions add the tokenizer's special tokens; chat leaves them to
    // the template. `messages` tells the two apart.
    let default = body.get("messages").is_none_or(Value::is_null);
    v.is_null() || *v == Value::Bool(default)
}

macro_rules! neutral {
    ($name:literal, $only:expr, $accepted:literal, $f:expr) => {
        Neutral {
            name: $name,
            only: $only,
            accepted: $accepted,
            is_neutral: $f,
        }
    };
}

const CHAT: Option<Endpoint> = Some(Endpoint::Chat);
const COMPL: Option<Endpoint> = Some(Endpoint::Completions);

/// Not implemented yet; refused unless neutral.
pub const NEUTRAL: &[Neutral] = &[
    neutral!("functions", CHAT, "null or []", null_or_empty),
    neutral!(
        "function_call",
        CHAT,
        "null, \"none\" or \"auto\" without functions",
        no_tool_choice
    ),
    neutral!(
        "add_special_tokens",
        None,
        "null or the default (true for completions, false for chat)",
        default_special_tokens
    ),
    neutral!("chat_template", CHAT, "null", null),
    neutral!("documents", CHAT, "null", null),
    neutral!("best_of", COMPL, "null or equal to n", best_of_n),
    neutral!("suffix", COMPL, "null or \"\"", null_or_empty),
    neutral!("use_beam_search", None, "null or false", null_or_false),
    neutral!("length_penalty", None, "null or 1", null_or_one),
    neutral!("truncate_prompt_tokens", None, "null", null),
    neutral!("guided_decoding_backend", None, "null", null),
    neutral!("guided_whitespace_pattern", None, "null", null),
    neutral!("reasoning_effort", CHAT, "null", null),
    neutral!("modalities", CHAT, "null or [\"text\"]", text_modality),
    neutral!("audio", CHAT, "null", null),
    neutral!("prediction", CHAT, "null", null),
    neutral!("web_search_options", CHAT, "null", null),
    neutral!("verbosity", CHAT, "null", null),
    neutral!("priority", None, "null or 0", null_or_zero),
    neutral!("cache_salt", None, "null", null),
    neutral!("prompt_embeds", COMPL, "null", null),
    neutral!("logits_processors", None, "null or []", null_or_empty),
    neutral!("mm_processor_kwargs", CHAT, "null or {}", null_or_empty),
    neutral!("kv_transfer_params", None, "null", null),
    neutral!("vllm_xargs", None, "null or {}", null_or_empty),
];

/// Logs, once per process, that a request brought an ignored field.
fn warn_once(name: &'static str) {
    static WARNED: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let Ok(mut warned) = WARNED.lock() else {
        return;
    };
    if !warned.contains(&name) {
        warned.push(name);
        tracing::warn!(
            field = name,
            "a request set '{name}', which cannot change the output and is ignored \
             (logged once)"
        );
    }
}

fn applies(only: Option<Endpoint>, endpoint: Endpoint) -> bool {
    only.is_none_or(|e| e == endpoint)
}

/// Refuses any field of `body` (a JSON object) that `endpoint` neither
/// honours nor may ignore, and any not-yet-supported field whose value
/// would change the output.
pub fn check_fields(body: &Value, endpoint: Endpoint) -> Result<(), ApiError> {
    let Some(obj) = body.as_object() else {
        return Ok(());
    };
    let own = match endpoint {
        Endpoint::Completions => HONOURED_COMPLETIONS,
        Endpoint::Chat => HONOURED_CHAT,
    };
    for (key, value) in obj {
        let k = key.as_str();
        if HONOURED_COMMON.contains(&k) || own.contains(&k) {
            continue;
        }
        if let Some(name) = IGNORED.iter().find(|n| **n == k) {
            if !value.is_null() {
                warn_once(name);
            }
            continue;
        }
        if let Some(n) = NEUTRAL
            .iter()
            .find(|n| n.name == k && applies(n.only, endpoint))
        {
            if (n.is_neutral)(value, body) {
                continue;
            }
            if k == "best_of" && value.as_i64().is_some_and(|b| b >= 1) {
                let n = body.get("n").and_then(Value::as_i64).unwrap_or(1);
                if value.as_i64().is_some_and(|b| b < n) {
                    return Err(ApiError::invalid_param(
                        k,
                        format!("best_of must be at least n ({n}), got {value}"),
                    ));
                }
            }
            return Err(ApiError::invalid_param(
                k,
                format!(
                    "'{k}' is not supported yet (accepted: {}), got {value}",
                    n.accepted
                ),
            )
            .with_code("unsupported_parameter"));
        }
        return Err(ApiError::invalid_param(
            k,
            format!("unknown parameter '{k}' (not supported by this endpoint)"),
        )
        .with_code("unknown_parameter"));
    }
    if let Some(opts) = obj.get("stream_options").and_then(Value::as_object) {
        for (key, value) in opts {
            match key.as_str() {
                "include_usage" => {}
                "continuous_usage_stats" if null_or_false(value, body) => {}
                _ => {
                    return Err(ApiError::invalid_param(
                        &format!("stream_options.{key}"),
                        format!(
                            "stream_options.{key} is not supported (only include_usage), \
                             got {value}"
                        ),
                    )
                    .with_code("unsupported_parameter"))
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(body: Value, e: Endpoint) -> Option<String> {
        check_fields(&body, e).err().and_then(|e| e.param)
    }

    #[test]
    fn lists_are_disjoint() {
        let mut all: Vec<&str> = HONOURED_COMMON
            .iter()
            .chain(HONOURED_COMPLETIONS)
            .chain(HONOURED_CHAT)
            .chain(IGNORED)
            .copied()
            .collect();
        all.extend(NEUTRAL.iter().map(|n| n.name));
        let mut sorted = all.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), all.len());
    }

    #[test]
    fn neutral_values_pass_and_others_name_the_field() {
        let c = Endpoint::Chat;
        for ok in [
            json!({"response_format": {"type": "text"}, "tools": [], "tool_choice": "none"}),
            json!({"tools": [{"type": "function"}], "tool_choice": "required",
                   "parallel_tool_calls": false}),
            json!({"logit_bias": {"5": 1}, "min_tokens": 3, "skip_special_tokens": false}),
            json!({"priority": 0, "request_id": "r", "safety_identifier": "s"}),
            json!({"user": "u", "store": false, "metadata": {"a": "b"}, "service_tier": "auto"}),
            json!({"stream_options": {"include_usage": true}, "messages": [],
                   "add_special_tokens": false}),
        ] {
            assert_eq!(check_fields(&ok, c), Ok(()), "{ok}");
        }
        for (bad, name) in [
            (
                json!({"guided_decoding_backend": "xgrammar"}),
                "guided_decoding_backend",
            ),
            (
                json!({"function_call": "auto", "functions": [{}]}),
                "functions",
            ),
            (json!({"priority": 3}), "priority"),
            (json!({"suffix": "x"}), "suffix"),
            (json!({"frobnicate": 1}), "frobnicate"),
            (
                json!({"stream_options": {"continuous_usage_stats": true}}),
                "stream_options.continuous_usage_stats",
            ),
        ] {
            assert_eq!(param(bad.clone(), c).as_deref(), Some(name), "{bad}");
        }
        // Completions: no chat-only fields, echo honoured, best_of vs n.
        let p = Endpoint::Completions;
        assert_eq!(param(json!({"tools": []}), p).as_deref(), Some("tools"));
        assert_eq!(
            check_fields(&json!({"echo": true, "best_of": 2, "n": 2}), p),
            Ok(())
        );
        assert_eq!(param(json!({"best_of": 3}), p).as_deref(), Some("best_of"));
        assert_eq!(param(json!({"suffix": "x"}), p).as_deref(), Some("suffix"));
    }
}
