//! The Llama 3.x JSON tool-call format: the whole output is one call
//! `{"name": "f", "parameters": {..}}` (`arguments` is taken too), or
//! several separated by `;`, optionally after `<|python_tag|>`.
//!
//! An output whose first non-blank text is `{` or `<|python_tag|>` is held
//! to its end and then parsed; if it is not a list of calls it is handed out
//! unchanged as content. Any other output is content, streamed as it comes.

use super::{call_from_json, ParsedCall, Piece, TextParser};

pub const PYTHON_TAG: &str = "<|python_tag|>";

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing but whitespace (or a prefix of `<|python_tag|>`) yet.
    #[default]
    Undecided,
    /// Plain text.
    Content,
    /// Maybe calls: held to the end.
    Calls,
}

#[derive(Debug, Default)]
pub struct Llama3Parser {
    buf: String,
    mode: Mode,
}

/// The calls of a whole output, if it is nothing but calls.
pub fn parse_calls(text: &str) -> Option<Vec<ParsedCall>> {
    let mut rest = text.trim_start();
    rest = rest.strip_prefix(PYTHON_TAG).unwrap_or(rest);
    let mut calls = Vec::new();
    loop {
        rest = rest.trim_start();
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<serde_json::Value>();
        let value = values.next()?.ok()?;
        let used = values.byte_offset();
        calls.push(call_from_json(&value, &["parameters", "arguments"])?);
        rest = rest[used..].trim_start();
        if rest.is_empty() {
            return Some(calls);
        }
        rest = rest.strip_prefix(';')?;
        if rest.trim().is_empty() {
            return Some(calls);
        }
    }
}

impl TextParser for Llama3Parser {
    fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        match self.mode {
            Mode::Content => {
                out.push(Piece::Content(text.to_string()));
                return;
            }
            Mode::Calls => {
                self.buf.push_str(text);
                return;
            }
            Mode::Undecided => self.buf.push_str(text),
        }
        let head = self.buf.trim_start();
        if head.is_empty() || (PYTHON_TAG.starts_with(head) && head.len() < PYTHON_TAG.len()) {
            return;
        }
        if head.starts_with('{') || head.starts_with(PYTHON_TAG) {
            self.mode = Mode::Calls;
        } else {
            self.mode = Mode::Content;
            out.push(Piece::Content(std::mem::take(&mut self.buf)));
        }
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        let text = std::mem::take(&mut self.buf);
        if self.mode == Mode::Calls {
            if let Some(calls) = parse_calls(&text) {
                out.extend(calls.into_iter().map(Piece::Call));
                return;
            }
        }
        out.push(Piece::Content(text));
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{call, check_splits, content};
    use super::*;

    fn new() -> Box<dyn TextParser> {
        Box::new(Llama3Parser::default())
    }

    #[test]
    fn one_call() {
        check_splits(
            &new,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
            &[call("get_weather", r#"{"city":"Paris"}"#)],
        );
    }

    #[test]
    fn python_tag_and_several_calls() {
        check_splits(
            &new,
            " <|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"n\": 1}}",
            &[call("a", "{}"), call("b", r#"{"n":1}"#)],
        );
    }

    #[test]
    fn text_and_other_json_stay_content() {
        for text in [
            "The weather is {nice}.",
            "{\"answer\": 42}",
            "{\"name\": \"f\", \"parameters\": {}} and more",
            "<|python_tag|>print(1)",
            "<|pyth",
            " Hello é",
        ] {
            check_splits(&new, text, &[content(text)]);
        }
    }
}
