//! Tool calling: the request's `tools` and `tool_choice`, the parsers that
//! turn a model's output into OpenAI `tool_calls`, and the grammars that
//! force a call for `tool_choice: required` or a named function.
//!
//! - [`request`]: `tools` / `tool_choice` read and checked, and the history
//!   (`tool_calls` of assistant messages, `tool` messages) for the template;
//! - [`hermes`], [`llama3`], [`mistral`]: one parser per output format;
//! - [`grammar`]: the Lark grammar that only admits calls in that format.
//!
//! Every parser is a [`TextParser`]: text goes in as it is generated, in any
//! split, and [`Piece`]s come out. A call is handed out whole, once its
//! closing marker (or the end of the output) is seen and its JSON parsed;
//! text that looked like a call but does not parse is handed out unchanged as
//! content, never dropped and never an error. The pieces do not depend on how
//! the text was split (the tests check every split), so a streamed response
//! says exactly what the same response unstreamed says.
//!
//! Which format a server parses: `--tool-call-parser`, else
//! [`ToolFormat::detect`] on the chat template (a template that writes
//! `<tool_call>` is Hermes, `[TOOL_CALLS]` Mistral, Llama 3's header tokens
//! with `<|python_tag|>` or `"parameters"` Llama 3 JSON), else none: requests
//! that need a parser (non-empty `tools` with a `tool_choice` other than
//! `none`) are refused.

pub mod grammar;
pub mod hermes;
pub mod llama3;
pub mod mistral;
pub mod request;

use std::hash::{BuildHasher, Hasher};

/// The format of tool calls in a model's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// Hermes / Qwen: `<tool_call>{"name": .., "arguments": {..}}</tool_call>`, one or many.
    Hermes,
    /// Llama 3.x: `{"name": .., "parameters": {..}}` (optionally after
    /// `<|python_tag|>`, several separated by `;`), as the whole output.
    Llama3Json,
    /// Mistral: `[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]`, or
    /// `[TOOL_CALLS]name[ARGS]{..}` repeated.
    Mistral,
}

impl ToolFormat {
    /// The names `--tool-call-parser` takes.
    pub const NAMES: &'static [&'static str] = &["hermes", "llama3_json", "mistral"];

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "hermes" => Some(Self::Hermes),
            "llama3_json" => Some(Self::Llama3Json),
            "mistral" => Some(Self::Mistral),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Hermes => "hermes",
            Self::Llama3Json => "llama3_json",
            Self::Mistral => "mistral",
        }
    }

    /// The format a chat template writes tool calls in, if it can tell.
    pub fn detect(template: &str) -> Option<Self> {
        if template.contains("<tool_call>") {
            Some(Self::Hermes)
        } else if template.contains("[TOOL_CALLS]") {
            Some(Self::Mistral)
        } else if template.contains("<|start_header_id|>")
            && (template.contains("<|python_tag|>") || template.contains("\"parameters\""))
        {
            Some(Self::Llama3Json)
        } else {
            None
        }
    }

    /// A fresh parser of this format.
    pub fn parser(self) -> Box<dyn TextParser> {
        match self {
            Self::Hermes => Box::new(hermes::HermesParser::default()),
            Self::Llama3Json => Box::new(llama3::Llama3Parser::default()),
            Self::Mistral => Box::new(mistral::MistralParser::default()),
        }
    }
}

/// A tool call as parsed: the function's name and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

/// What a parser hands out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Text for `content`.
    Content(String),
    /// Text for `reasoning_content`.
    Reasoning(String),
    /// A complete tool call.
    Call(ParsedCall),
}

/// Turns generated text, given in pieces of any size, into [`Piece`]s.
pub trait TextParser: Send {
    /// Takes the next text; appends what can be told already to `out`.
    fn push(&mut self, text: &str, out: &mut Vec<Piece>);
    /// The output ended: appends everything still held back.
    fn finish(&mut self, out: &mut Vec<Piece>);
}

/// Runs `parser` over a whole text; adjacent text pieces are merged.
pub fn parse_all(parser: &mut dyn TextParser, text: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    parser.push(text, &mut out);
    parser.finish(&mut out);
    merge(out)
}

/// Merges adjacent pieces of the same text kind and drops empty ones.
pub fn merge(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::with_capacity(pieces.len());
    for p in pieces {
        match (out.last_mut(), p) {
            (_, Piece::Content(s) | Piece::Reasoning(s)) if s.is_empty() => {}
            (Some(Piece::Content(a)), Piece::Content(b)) => a.push_str(&b),
            (Some(Piece::Reasoning(a)), Piece::Reasoning(b)) => a.push_str(&b),
            (_, p) => out.push(p),
        }
    }
    out
}

/// How many bytes at the end of `text` are a proper prefix of `marker` (and
/// so must be held back: the marker may be completing).
pub fn partial_marker(text: &str, marker: &str) -> usize {
    let max = marker.len().saturating_sub(1).min(text.len());
    (1..=max)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

/// A call's name and arguments from a JSON object `{"name": .., <args_key>: {..}}`
/// (`args_keys` in order of preference; absent or null arguments are `{}`);
/// None if it is not that.
pub fn call_from_json(value: &serde_json::Value, args_keys: &[&str]) -> Option<ParsedCall> {
    let obj = value.as_object()?;
    let name = obj.get("name")?.as_str()?;
    if name.is_empty() {
        return None;
    }
    let args = args_keys.iter().find_map(|k| obj.get(*k));
    let arguments = match args {
        None | Some(serde_json::Value::Null) => "{}".to_string(),
        Some(v @ serde_json::Value::Object(_)) => serde_json::to_string(v).ok()?,
        // Some models write the arguments as a JSON string holding an object.
        Some(serde_json::Value::String(s)) => {
            let inner: serde_json::Value = serde_json::from_str(s).ok()?;
            if !inner.is_object() {
                return None;
            }
            serde_json::to_string(&inner).ok()?
        }
        Some(_) => return None,
    };
    Some(ParsedCall {
        name: name.to_string(),
        arguments,
    })
}

/// A fresh tool call id, `call_` and 24 random alphanumerics.
pub fn new_call_id() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut id = String::with_capacity(29);
    id.push_str("call_");
    let mut bits = 0u64;
    for i in 0..24 {
        if i % 8 == 0 {
            // Each RandomState has fresh random keys.
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(i);
            bits = h.finish();
        }
        id.push(ALPHABET[(bits % ALPHABET.len() as u64) as usize] as char);
        bits /= ALPHABET.len() as u64;
    }
    id
}

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_detected_from_templates() {
        assert_eq!(
            ToolFormat::detect("{{ '<tool_call>\\n' }}"),
            Some(ToolFormat::Hermes)
        );
        assert_eq!(
            ToolFormat::detect("{{ '[TOOL_CALLS]' + x }}"),
            Some(ToolFormat::Mistral)
        );
        assert_eq!(
            ToolFormat::detect("<|start_header_id|>{{ '{\"name\": ..., \"parameters\": ...}' }}"),
            Some(ToolFormat::Llama3Json)
        );
        assert_eq!(ToolFormat::detect("<|im_start|>{{ m.content }}"), None);
        for n in ToolFormat::NAMES {
            assert_eq!(ToolFormat::from_name(n).map(ToolFormat::name), Some(*n));
        }
    }

    #[test]
    fn partial_markers_are_held_back() {
        assert_eq!(partial_marker("abc<tool", "<tool_call>"), 5);
        assert_eq!(partial_marker("abc<", "<tool_call>"), 1);
        assert_eq!(partial_marker("abc", "<tool_call>"), 0);
        assert_eq!(partial_marker("<tool_call>", "<tool_call>"), 0);
        assert_eq!(partial_marker("é<", "<x"), 1);
    }

    #[test]
    fn call_ids_look_like_openai_ones() {
        let a = new_call_id();
        let b = new_call_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), 29);
        assert!(a.starts_with("call_"));
        assert!(a[5..].chars().all(|c| c.is_ascii_alphanumeric()));
    }

    #[test]
    fn calls_need_a_name_and_object_arguments() {
        let j = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        let keys = &["arguments"];
        assert_eq!(
            call_from_json(
                &j(r#"{"name": "f", "arguments": {"b": 1, "a": [2]}}"#),
                keys
            ),
            Some(ParsedCall {
                name: "f".into(),
                arguments: r#"{"b":1,"a":[2]}"#.into()
            })
        );
        assert_eq!(
            call_from_json(&j(r#"{"name": "f"}"#), keys).map(|c| c.arguments),
            Some("{}".into())
        );
        assert_eq!(
            call_from_json(&j(r#"{"name": "f", "arguments": "{\"x\": 1}"}"#), keys)
                .map(|c| c.arguments),
            Some(r#"{"x":1}"#.into())
        );
        assert_eq!(call_from_json(&j(r#"{"arguments": {}}"#), keys), None);
        assert_eq!(
            call_from_json(&j(r#"{"name": "f", "arguments": 3}"#), keys),
            None
        );
        assert_eq!(call_from_json(&j(r#"[1]"#), keys), None);
    }
}
