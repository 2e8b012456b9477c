//! The Mistral tool-call format: text, then `[TOOL_CALLS]` and a JSON list
//! `[{"name": "f", "arguments": {..}}, ..]`, or (newer models)
//! `[TOOL_CALLS]name[ARGS]{..}`, repeated for several calls.
//!
//! Text before `[TOOL_CALLS]` is content, streamed as it comes (but for a
//! tail that may be the start of the marker); from the marker on, the output
//! is held to its end and parsed. `[TOOL_CALLS]` is a special token, which
//! the engine leaves out of the text; so an output that starts with `[` is
//! also held and parsed as a bare call list. What does not parse is handed
//! out unchanged as content.

use super::{call_from_json, partial_marker, ParsedCall, Piece, TextParser};

pub const MARKER: &str = "[TOOL_CALLS]";
pub const ARGS: &str = "[ARGS]";

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// At the start: no text yet, or only blanks.
    #[default]
    Start,
    Content,
    /// From the marker (or a leading `[`) on: held to the end.
    Calls,
}

#[derive(Debug, Default)]
pub struct MistralParser {
    buf: String,
    mode: Mode,
    /// Blanks between the text and the marker: no content if calls follow.
    pending_ws: String,
}

/// The calls after the marker (`text` starts right after it), or of a bare list.
pub fn parse_calls(text: &str) -> Option<Vec<ParsedCall>> {
    let t = text.trim();
    if t.starts_with('[') {
        let list: Vec<serde_json::Value> = serde_json::from_str(t).ok()?;
        if list.is_empty() {
            return None;
        }
        return list
            .iter()
            .map(|v| call_from_json(v, &["arguments", "parameters"]))
            .collect();
    }
    // name[ARGS]{..}, the next ones each after another [TOOL_CALLS].
    let mut calls = Vec::new();
    for part in t.split(MARKER) {
        let (name, args) = part.trim().split_once(ARGS)?;
        let name = name.trim();
        let value: serde_json::Value = serde_json::from_str(args.trim()).ok()?;
        if name.is_empty() || !value.is_object() {
            return None;
        }
        calls.push(ParsedCall {
            name: name.to_string(),
            arguments: serde_json::to_string(&value).ok()?,
        });
    }
    Some(calls)
}

impl TextParser for MistralParser {
    fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.buf.push_str(text);
        if self.mode == Mode::Calls {
            return;
        }
        if self.mode == Mode::Start {
            let head = self.buf.trim_start();
            if head.is_empty() || (MARKER.starts_with(head) && head.len() < MARKER.len()) {
                return;
            }
            self.mode = if head.starts_with('[') {
                Mode::Calls
            } else {
                Mode::Content
            };
            if self.mode == Mode::Calls {
                return;
            }
        }
        if let Some(pos) = self.buf.find(MARKER) {
            let before: String = self.buf.drain(..pos).collect();
            let kept = before.trim_end().len();
            out.push(Piece::Content(before[..kept].to_string()));
            self.pending_ws = before[kept..].to_string();
            self.mode = Mode::Calls;
            return;
        }
        // Trailing blanks wait: they are no content if the marker follows.
        let hold = partial_marker(&self.buf, MARKER);
        let ready = self.buf[..self.buf.len() - hold].trim_end().len();
        let ready: String = self.buf.drain(..ready).collect();
        out.push(Piece::Content(ready));
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        let text = std::mem::take(&mut self.buf);
        if self.mode == Mode::Calls {
            let trimmed = text.trim_start();
            let body = trimmed.strip_prefix(MARKER).unwrap_or(trimmed);
            if let Some(calls) = parse_calls(body) {
                out.extend(calls.into_iter().map(Piece::Call));
                return;
            }
        }
        out.push(Piece::Content(std::mem::take(&mut self.pending_ws)));
        out.push(Piece::Content(text));
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{call, check_splits, content};
    use super::*;

    fn new() -> Box<dyn TextParser> {
        Box::new(MistralParser::default())
    }

    #[test]
    fn list_after_marker_with_text_before() {
        check_splits(
            &new,
            "Sure. [TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]",
            &[content("Sure."), call("a", r#"{"x":1}"#), call("b", "{}")],
        );
    }

    #[test]
    fn bare_list_and_newer_format() {
        check_splits(
            &new,
            "[{\"name\": \"a\", \"arguments\": {}}]",
            &[call("a", "{}")],
        );
        check_splits(
            &new,
            "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]b[ARGS]{}",
            &[call("get_weather", r#"{"city":"Paris"}"#), call("b", "{}")],
        );
    }

    #[test]
    fn malformed_calls_and_text_stay_content() {
        for text in [
            "Hello [TOOL_CALL",
            "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}",
            "[1, 2, 3]",
            "x [TOOL_CALLS]f[ARGS]not json",
            "[TOOL_CALLS][]",
            "Plain é text.",
        ] {
            check_splits(&new, text, &[content(text)]);
        }
    }
}
