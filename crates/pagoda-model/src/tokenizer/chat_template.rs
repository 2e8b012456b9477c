//! Chat templates: a conversation -> the prompt text the model was trained on.
//!
//! Templates are the Jinja sources models ship (`tokenizer.chat_template` in
//! GGUF, `chat_template` in `tokenizer_config.json`), rendered with minijinja
//! set up like transformers' sandboxed Jinja environment: `trim_blocks` and
//! `lstrip_blocks` on, loop controls (`break`/`continue`), Python string and
//! dict methods (`.strip()`, `.startswith()`, `.split()`, `.items()` via
//! minijinja-contrib's pycompat), `raise_exception(msg)`, `strftime_now(fmt)`
//! and a `tojson` that writes JSON the way Python's `json.dumps` does (`", "`
//! and `": "` separators, no HTML escaping, non-ASCII kept).
//!
//! Values print as in Python (`True`, `False`, `None`).
//!
//! Context variables: `messages`, `add_generation_prompt`, `bos_token`,
//! `eos_token`, `tools` (when given) and any extra keyword arguments.
//! Message content given as a list of `{type: "text", text}` parts is flattened
//! to one string (parts joined by `"\n"`), so every template sees strings.
//!
//! Invariants: a template is compiled once, at construction (syntax errors
//! surface there); every failure is a [`ModelError::ChatTemplate`] naming the
//! cause. Cost: rendering is linear in the template's output.

mod strftime;

use crate::{ModelError, Result};
use minijinja::value::Kwargs;
use minijinja::{Environment, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

const TEMPLATE_NAME: &str = "chat_template";

/// One message of a conversation, as in the OpenAI chat API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool` ...
    pub role: String,
    /// The text; None for e.g. an assistant message that only calls tools.
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// Other fields (`name`, `tool_calls`, `tool_call_id` ...), passed to the
    /// template unchanged.
    #[serde(flatten)]
    pub extra: Map<String, Json>,
}

impl ChatMessage {
    /// A message with plain text content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: Some(MessageContent::Text(content.into())),
            extra: Map::new(),
        }
    }
}

/// Message content: a string or a list of typed parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of a message's content; only `type: "text"` parts are supported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

impl MessageContent {
    /// The content as one string (text parts joined by newlines).
    pub fn to_text(&self) -> Result<String> {
        match self {
            Self::Text(s) => Ok(s.clone()),
            Self::Parts(parts) => {
                let texts = parts
                    .iter()
                    .map(|p| match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => Ok(t.as_str()),
                        ("text", None) => Err(template_err("a text content part has no text")),
                        (other, _) => Err(template_err(format!(
                            "content parts of type {other:?} are not supported (only \"text\")"
                        ))),
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(texts.join("\n"))
            }
        }
    }
}

/// What to render besides the messages.
#[derive(Debug, Clone, Default)]
pub struct ChatTemplateOptions {
    /// End the prompt with the header of an assistant turn.
    pub add_generation_prompt: bool,
    /// Tool (function) definitions, in OpenAI's JSON shape.
    pub tools: Option<Vec<Json>>,
    /// Further template variables (`chat_template_kwargs`, e.g. `enable_thinking`).
    pub extra: Map<String, Json>,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the strings the template
    /// sees as `bos_token`/`eos_token`.
    pub fn new(source: &str, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.set_formatter(python_formatter);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| template_err(format!("cannot compile: {}", describe(&e))))?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos_token,
            eos_token,
        })
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`, optionally ending with an assistant turn's header.
    pub fn apply(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let options = ChatTemplateOptions {
            add_generation_prompt,
            ..Default::default()
        };
        self.render(messages, &options)
    }

    /// Renders `messages` with all options.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        options: &ChatTemplateOptions,
    ) -> Result<String> {
        let mut rendered_messages = Vec::with_capacity(messages.len());
        for m in messages {
            let mut obj = Map::new();
            obj.insert("role".into(), Json::String(m.role.clone()));
            let content = match &m.content {
                Some(c) => Json::String(c.to_text()?),
                None => Json::Null,
            };
            obj.insert("content".into(), content);
            for (k, v) in &m.extra {
                obj.entry(k.clone()).or_insert_with(|| v.clone());
            }
            rendered_messages.push(Json::Object(obj));
        }

        let mut ctx = options.extra.clone();
        ctx.insert("messages".into(), Json::Array(rendered_messages));
        ctx.insert(
            "add_generation_prompt".into(),
            Json::Bool(options.add_generation_prompt),
        );
        let text = |s: &Option<String>| s.clone().map(Json::String).unwrap_or(Json::Null);
        ctx.entry("bos_token")
            .or_insert_with(|| text(&self.bos_token));
        ctx.entry("eos_token")
            .or_insert_with(|| text(&self.eos_token));
        if let Some(tools) = &options.tools {
            ctx.insert("tools".into(), Json::Array(tools.clone()));
        }

        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| template_err(describe(&e)))?;
        template
            .render(Value::from_serialize(&ctx))
            .map_err(|e| template_err(format!("cannot render: {}", describe(&e))))
    }
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .finish()
    }
}

fn template_err(msg: impl Into<String>) -> ModelError {
    ModelError::ChatTemplate(msg.into())
}

/// A minijinja error with its chain of causes, on one line.
fn describe(e: &minijinja::Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Prints values as Python's Jinja does: `True`/`False`, `None`.
fn python_formatter(
    out: &mut minijinja::Output,
    state: &minijinja::State,
    value: &Value,
) -> std::result::Result<(), minijinja::Error> {
    let python = match value.kind() {
        minijinja::value::ValueKind::Bool if value.is_true() => "True",
        minijinja::value::ValueKind::Bool => "False",
        minijinja::value::ValueKind::None => "None",
        _ => return minijinja::escape_formatter(out, state, value),
    };
    out.write_str(python).map_err(minijinja::Error::from)
}

/// `raise_exception(msg)`: templates reject conversations they cannot render.
fn raise_exception(msg: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("template raised: {msg}"),
    ))
}

/// `strftime_now(fmt)`: the current UTC time formatted as C's strftime does.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime::format_utc(&format, secs)
}

/// `x | tojson(indent=None)`, formatted like Python's `json.dumps(x,
/// ensure_ascii=False, indent=indent)`.
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    // Accepted for compatibility; Python's defaults are what we write anyway.
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let json = if sort_keys.unwrap_or(false) {
        sort_json_keys(json)
    } else {
        json
    };
    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let fmt = serde_json::ser::PrettyFormatter::with_indent(&pad);
            let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
            json.serialize(&mut ser)
        }
        None => {
            let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
            json.serialize(&mut ser)
        }
    };
    written
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let text = String::from_utf8(out)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from_safe_string(text))
}

fn sort_json_keys(v: Json) -> Json {
    match v {
        Json::Object(map) => {
            let mut entries: Vec<_> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Json::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sort_json_keys(v)))
                    .collect(),
            )
        }
        Json::Array(items) => Json::Array(items.into_iter().map(sort_json_keys).collect()),
        other => other,
    }
}

/// Compact JSON with Python's default separators `", "` and `": "`.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

#[cfg(test)]
mod tests;
