//! Hugging Face model directory -> tokenizer parts.
//!
//! Reads, in a model directory (or next to a `tokenizer.json` given by path):
//! - `tokenizer.json` (required): the whole `tokenizers` pipeline.
//! - `tokenizer_config.json` (optional): `bos_token` / `eos_token` (a string
//!   or an AddedToken object with `content`), `add_bos_token`,
//!   `add_eos_token`, `chat_template` (a string, or a list of
//!   `{name, template}` of which `default` or else the first is used).
//! - `chat_template.jinja` or `chat_template.json` (optional): a chat template
//!   that takes precedence over the one in `tokenizer_config.json`, as in
//!   transformers.
//! - `generation_config.json`, else `config.json` (optional): extra
//!   `eos_token_id`s (an id or a list) that also end generation.
//!
//! BOS handling: when `tokenizer.json`'s post-processor already adds BOS, that
//! is kept; `add_bos_token: true` in the config adds it where the
//! post-processor does not.

use super::{tok_err, TokenizerParts};
use crate::{ModelError, Result};
use serde_json::Value;
use std::path::Path;

pub(crate) fn load(dir: &Path) -> Result<TokenizerParts> {
    load_file(&dir.join("tokenizer.json"))
}

/// Loads a `tokenizer.json` of any name; the optional files are read from
/// its directory.
pub(crate) fn load_file(tokenizer_path: &Path) -> Result<TokenizerParts> {
    let dir = tokenizer_path.parent().unwrap_or(Path::new("."));
    let bytes = read(tokenizer_path)?;
    let inner = tokenizers::Tokenizer::from_bytes(&bytes)
        .map_err(|e| tok_err(format!("cannot parse {}: {e}", tokenizer_path.display())))?;

    let config = read_json_if_present(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
    let token_id = |key: &str| -> Option<u32> {
        let token = match config.get(key)? {
            Value::String(s) => s.as_str(),
            Value::Object(o) => o.get("content")?.as_str()?,
            _ => return None,
        };
        inner.token_to_id(token)
    };
    let bos_token_id = token_id("bos_token");
    let mut eos_token_ids: Vec<u32> = token_id("eos_token").into_iter().collect();
    let generation = match read_json_if_present(&dir.join("generation_config.json"))? {
        Some(v) => Some(v),
        None => read_json_if_present(&dir.join("config.json"))?,
    };
    if let Some(eos) = generation.as_ref().and_then(|g| g.get("eos_token_id")) {
        eos_token_ids.extend(ids_of(eos));
    }

    // Does the post-processor itself put BOS in front?
    let post_processor_adds_bos = match bos_token_id {
        Some(bos) => inner
            .encode_fast("a", true)
            .map(|e| e.get_ids().first() == Some(&bos))
            .unwrap_or(false),
        None => false,
    };
    let flag = |key: &str| config.get(key).and_then(Value::as_bool);
    let add_bos_token = bos_token_id.is_some()
        && (post_processor_adds_bos || flag("add_bos_token").unwrap_or(false));
    let add_eos_token = !eos_token_ids.is_empty() && flag("add_eos_token").unwrap_or(false);

    let chat_template_source = chat_template(dir, &config)?;
    Ok(TokenizerParts {
        vocab_size: inner.get_vocab_size(true),
        inner,
        bos_token_id,
        eos_token_ids,
        add_bos_token,
        add_eos_token,
        chat_template_source,
        normalizer: None,
    })
}

/// The chat template: `chat_template.jinja`, else `chat_template.json`, else
/// `tokenizer_config.json`'s `chat_template`.
fn chat_template(dir: &Path, config: &Value) -> Result<Option<String>> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        let bytes = read(&jinja)?;
        return String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| tok_err(format!("{} is not UTF-8", jinja.display())));
    }
    if let Some(v) = read_json_if_present(&dir.join("chat_template.json"))? {
        if let Some(t) = template_of(v.get("chat_template")) {
            return Ok(Some(t));
        }
    }
    Ok(template_of(config.get("chat_template")))
}

/// A `chat_template` value: a string, or a list of `{name, template}`.
fn template_of(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => {
            let named = |name: &str| {
                list.iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some(name))
            };
            let chosen = named("default").or_else(|| list.first())?;
            chosen.get("template")?.as_str().map(str::to_string)
        }
        _ => None,
    }
}

/// `eos_token_id` as an id or a list of ids.
fn ids_of(v: &Value) -> Vec<u32> {
    let one = |v: &Value| v.as_u64().and_then(|x| u32::try_from(x).ok());
    match v {
        Value::Array(list) => list.iter().filter_map(one).collect(),
        other => one(other).into_iter().collect(),
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn read_json_if_present(path: &Path) -> Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let bytes = read(path)?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| tok_err(format!("cannot parse {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_template_list_prefers_default() {
        let v =
            json!([{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]);
        assert_eq!(template_of(Some(&v)).as_deref(), Some("D"));
        let v = json!([{"name": "rag", "template": "R"}]);
        assert_eq!(template_of(Some(&v)).as_deref(), Some("R"));
        assert_eq!(template_of(Some(&json!("S"))).as_deref(), Some("S"));
        assert_eq!(template_of(Some(&json!(3))), None);
    }

    #[test]
    fn eos_ids_accept_one_or_many() {
        assert_eq!(ids_of(&json!(7)), [7]);
        assert_eq!(ids_of(&json!([1, 2, -3])), [1, 2]);
    }
}
