//! The Hermes / Qwen tool-call format: calls written as
//! `<tool_call>\n{"name": "f", "arguments": {..}}\n</tool_call>`, any number,
//! with text around them.
//!
//! Text outside the calls is content, streamed as it comes except for a tail
//! that may be the start of `<tool_call>` and trailing whitespace (which is
//! dropped when a call follows; whitespace right after a call is dropped
//! too). A call's body is held until `</tool_call>` or the end of the
//! output; if it is a JSON object with a `name` (and object `arguments`, or
//! `parameters`) it becomes a call, otherwise the call's text, markers and
//! the whitespace before it included, is handed out as content.

use super::{call_from_json, partial_marker, Piece, TextParser};

pub const START: &str = "<tool_call>";
pub const END: &str = "</tool_call>";

#[derive(Debug, Default)]
pub struct HermesParser {
    /// Text not handed out yet.
    buf: String,
    /// Inside a call (after `<tool_call>`).
    in_call: bool,
    /// Whitespace before the current call, given back if the call is malformed.
    pending_ws: String,
    /// A call just ended and no content followed yet.
    after_call: bool,
}

impl HermesParser {
    /// Hands out the call body `body` (or its text, if it is no call).
    fn close_call(&mut self, body: &str, closed: bool, out: &mut Vec<Piece>) {
        let parsed = serde_json::from_str::<serde_json::Value>(body.trim())
            .ok()
            .and_then(|v| call_from_json(&v, &["arguments", "parameters"]));
        let ws = std::mem::take(&mut self.pending_ws);
        match parsed {
            Some(call) => {
                out.push(Piece::Call(call));
                self.after_call = true;
            }
            None => {
                let end = if closed { END } else { "" };
                out.push(Piece::Content(format!("{ws}{START}{body}{end}")));
                self.after_call = false;
            }
        }
        self.in_call = false;
    }

    /// Hands out content `text`, dropping leading whitespace after a call.
    fn content(&mut self, text: &str, out: &mut Vec<Piece>) {
        let text = if self.after_call {
            text.trim_start()
        } else {
            text
        };
        if !text.is_empty() {
            self.after_call = false;
            out.push(Piece::Content(text.to_string()));
        }
    }
}

impl TextParser for HermesParser {
    fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.buf.push_str(text);
        loop {
            if self.in_call {
                let Some(pos) = self.buf.find(END) else {
                    return;
                };
                let body = self.buf[..pos].to_string();
                self.buf.drain(..pos + END.len());
                self.close_call(&body, true, out);
                continue;
            }
            if let Some(pos) = self.buf.find(START) {
                let before = self.buf[..pos].to_string();
                self.buf.drain(..pos + START.len());
                let before = if self.after_call {
                    before.trim_start()
                } else {
                    &before
                };
                let kept = before.trim_end();
                self.pending_ws = before[kept.len()..].to_string();
                let kept = kept.to_string();
                self.content(&kept, out);
                self.in_call = true;
                continue;
            }
            let hold = partial_marker(&self.buf, START);
            let ready = self.buf[..self.buf.len() - hold].trim_end().len();
            let text: String = self.buf.drain(..ready).collect();
            self.content(&text, out);
            return;
        }
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        let rest = std::mem::take(&mut self.buf);
        if self.in_call {
            self.close_call(&rest, false, out);
        } else {
            self.content(&rest, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{call, check_splits, content};
    use super::*;

    fn new() -> Box<dyn TextParser> {
        Box::new(HermesParser::default())
    }

    #[test]
    fn one_call_with_text_before() {
        check_splits(
            &new,
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            &[
                content("Let me check."),
                call("get_weather", r#"{"city":"Paris"}"#),
            ],
        );
    }

    #[test]
    fn several_calls_and_text_after() {
        check_splits(
            &new,
            "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>\nDone é.",
            &[call("a", "{}"), call("b", r#"{"x":[1,2]}"#), content("Done é.")],
        );
    }

    #[test]
    fn plain_text_is_kept_exactly() {
        for text in ["Hello, world!  ", " a < b <tool", "x\n\n", "", "<tool_call"] {
            let expected: Vec<_> = if text.is_empty() {
                vec![]
            } else {
                vec![content(text)]
            };
            check_splits(&new, text, &expected);
        }
    }

    #[test]
    fn unterminated_last_call_still_parses() {
        check_splits(
            &new,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"</tool\"}}\n",
            &[call("f", r#"{"q":"</tool"}"#)],
        );
    }

    #[test]
    fn malformed_calls_stay_content() {
        let bad = "Hi \n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": }\n</tool_call> bye";
        check_splits(&new, bad, &[content(bad)]);
        let no_name = "<tool_call>{\"arguments\": {}}</tool_call>";
        check_splits(&new, no_name, &[content(no_name)]);
        let cut = "ok <tool_call>{\"name\": \"f\", \"argu";
        check_splits(&new, cut, &[content(cut)]);
        // A good call, then a bad one: the call, then the bad text.
        check_splits(
            &new,
            "<tool_call>{\"name\": \"f\"}</tool_call>\n<tool_call>oops</tool_call>",
            &[call("f", "{}"), content("<tool_call>oops</tool_call>")],
        );
    }
}
