//! Reasoning parsers: the model's thinking, written between `<think>` and
//! `</think>`, goes to `reasoning_content`; the rest stays `content`.
//!
//! - `qwen3`: an output that starts (after blanks) with `<think>` thinks
//!   until `</think>`; any other output is all content (e.g. with
//!   `enable_thinking: false`, whose template closes the thinking in the
//!   prompt);
//! - `deepseek_r1`: the output starts inside the thinking (the template
//!   wrote `<think>` in the prompt); a leading `<think>` is skipped.
//!
//! With no `</think>`, everything after the start of the thinking is
//! reasoning (the output was cut off while thinking). Blanks right after
//! `</think>` are dropped. Tags are held back while they may be completing,
//! so they never leak into either field; the pieces do not depend on how the
//! text is split.

use crate::tools::{partial_marker, Piece, TextParser};

pub const THINK_START: &str = "<think>";
pub const THINK_END: &str = "</think>";

/// Which reasoning format a server parses (`--reasoning-parser`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningFormat {
    Qwen3,
    DeepSeekR1,
}

impl ReasoningFormat {
    pub const NAMES: &'static [&'static str] = &["qwen3", "deepseek_r1"];

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "qwen3" => Some(Self::Qwen3),
            "deepseek_r1" => Some(Self::DeepSeekR1),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Qwen3 => "qwen3",
            Self::DeepSeekR1 => "deepseek_r1",
        }
    }

    pub fn parser(self) -> ReasoningParser {
        ReasoningParser {
            format: self,
            state: State::Start,
            buf: String::new(),
            after_think: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Start,
    Thinking,
    Content,
}

#[derive(Debug)]
pub struct ReasoningParser {
    format: ReasoningFormat,
    state: State,
    buf: String,
    /// `</think>` was just seen and no content followed yet.
    after_think: bool,
}

impl ReasoningParser {
    fn content(&mut self, text: &str, out: &mut Vec<Piece>) {
        let text = if self.after_think {
            text.trim_start()
        } else {
            text
        };
        if !text.is_empty() {
            self.after_think = false;
            out.push(Piece::Content(text.to_string()));
        }
    }
}

impl TextParser for ReasoningParser {
    fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.buf.push_str(text);
        loop {
            match self.state {
                State::Start => {
                    let head = self.buf.trim_start();
                    if head.is_empty()
                        || (THINK_START.starts_with(head) && head.len() < THINK_START.len())
                    {
                        return;
                    }
                    if let Some(rest) = head.strip_prefix(THINK_START) {
                        self.buf = rest.to_string();
                        self.state = State::Thinking;
                    } else if self.format == ReasoningFormat::DeepSeekR1 {
                        self.state = State::Thinking;
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Thinking => {
                    if let Some(pos) = self.buf.find(THINK_END) {
                        out.push(Piece::Reasoning(self.buf[..pos].to_string()));
                        self.buf.drain(..pos + THINK_END.len());
                        self.state = State::Content;
                        self.after_think = true;
                        continue;
                    }
                    let hold = partial_marker(&self.buf, THINK_END);
                    let ready: String = self.buf.drain(..self.buf.len() - hold).collect();
                    out.push(Piece::Reasoning(ready));
                    return;
                }
                State::Content => {
                    let text = std::mem::take(&mut self.buf);
                    self.content(&text, out);
                    return;
                }
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        let rest = std::mem::take(&mut self.buf);
        match (self.state, self.format) {
            (State::Thinking, _) | (State::Start, ReasoningFormat::DeepSeekR1) => {
                out.push(Piece::Reasoning(rest))
            }
            _ => self.content(&rest, out),
        }
    }
}

/// The parsers a chat response runs: reasoning first, then tool calls on
/// what the reasoning parser leaves as content.
pub struct OutputParser {
    reasoning: Option<ReasoningParser>,
    tools: Option<Box<dyn TextParser>>,
    scratch: Vec<Piece>,
}

impl OutputParser {
    pub fn new(reasoning: Option<ReasoningParser>, tools: Option<Box<dyn TextParser>>) -> Self {
        OutputParser {
            reasoning,
            tools,
            scratch: Vec::new(),
        }
    }

    fn route(&mut self, out: &mut Vec<Piece>) {
        for piece in self.scratch.drain(..) {
            match (&mut self.tools, piece) {
                (Some(t), Piece::Content(c)) => t.push(&c, out),
                (_, p) => out.push(p),
            }
        }
    }
}

impl TextParser for OutputParser {
    fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        match &mut self.reasoning {
            Some(r) => {
                r.push(text, &mut self.scratch);
                self.route(out);
            }
            None => match &mut self.tools {
                Some(t) => t.push(text, out),
                None => out.push(Piece::Content(text.to_string())),
            },
        }
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        if let Some(r) = &mut self.reasoning {
            r.finish(&mut self.scratch);
            self.route(out);
        }
        if let Some(t) = &mut self.tools {
            t.finish(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::testing::{call, check_splits, content, reasoning};
    use crate::tools::ToolFormat;

    fn qwen3() -> Box<dyn TextParser> {
        Box::new(ReasoningFormat::Qwen3.parser())
    }

    fn r1() -> Box<dyn TextParser> {
        Box::new(ReasoningFormat::DeepSeekR1.parser())
    }

    #[test]
    fn qwen3_thinking_then_answer() {
        check_splits(
            &qwen3,
            "<think>\nLet me think.\n</think>\n\nThe answer is 4.",
            &[reasoning("\nLet me think.\n"), content("The answer is 4.")],
        );
    }

    #[test]
    fn qwen3_without_thinking_is_all_content() {
        for text in ["The answer is 4.", "  <thin", "a <think>b</think>"] {
            check_splits(&qwen3, text, &[content(text)]);
        }
        // Cut off while thinking: all reasoning.
        check_splits(&qwen3, "<think>hmm </thi", &[reasoning("hmm </thi")]);
    }

    #[test]
    fn deepseek_r1_starts_inside_the_thinking() {
        check_splits(
            &r1,
            "Okay, 2+2.</think>\n\n4",
            &[reasoning("Okay, 2+2."), content("4")],
        );
        check_splits(&r1, "<think>x</think>y", &[reasoning("x"), content("y")]);
        check_splits(&r1, "still thinking", &[reasoning("still thinking")]);
    }

    #[test]
    fn reasoning_then_tool_calls() {
        let new = || -> Box<dyn TextParser> {
            Box::new(OutputParser::new(
                Some(ReasoningFormat::Qwen3.parser()),
                Some(ToolFormat::Hermes.parser()),
            ))
        };
        check_splits(
            &new,
            "<think>I need the weather. <tool_call> not here</think>\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"P\"}}\n</tool_call>",
            &[
                reasoning("I need the weather. <tool_call> not here"),
                call("w", r#"{"c":"P"}"#),
            ],
        );
    }
}
