//! A chat choice's generated text -> its message (content, reasoning, tool
//! calls) or its stream deltas, through the request's [`OutputParser`].
//!
//! Tool calls get fresh `call_<random>` ids; streamed, a call is two deltas
//! as OpenAI sends them: `{index, id, type, function: {name, arguments: ""}}`
//! then `{index, function: {arguments}}`. A choice that made a call and
//! stopped (not cut off by `max_tokens`) finishes with `tool_calls`.

use crate::openai::{
    ChatDelta, ChatMessageOut, FunctionCallDelta, FunctionCallOut, ToolCallDelta, ToolCallOut,
};
use crate::reasoning::{OutputParser, ReasoningFormat};
use crate::tools::{merge, new_call_id, Piece, TextParser, ToolFormat};
use pagoda_engine::FinishReason;

/// How a request's output is split up.
#[derive(Debug, Clone, Copy, Default)]
pub struct OutputFormat {
    pub reasoning: Option<ReasoningFormat>,
    pub tools: Option<ToolFormat>,
}

impl OutputFormat {
    pub fn parser(self) -> OutputParser {
        OutputParser::new(
            self.reasoning.map(ReasoningFormat::parser),
            self.tools.map(ToolFormat::parser),
        )
    }
}

/// `finish_reason` of a choice.
pub fn finish_reason(reason: FinishReason, made_calls: bool) -> &'static str {
    match reason {
        FinishReason::Stop if made_calls => "tool_calls",
        r => r.as_str(),
    }
}

/// The message of a whole output.
pub fn message(format: OutputFormat, text: &str) -> ChatMessageOut {
    let pieces = crate::tools::parse_all(&mut format.parser(), text);
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut tool_calls = Vec::new();
    for p in pieces {
        match p {
            Piece::Content(c) => content.push_str(&c),
            Piece::Reasoning(r) => reasoning.push_str(&r),
            Piece::Call(c) => tool_calls.push(ToolCallOut {
                id: new_call_id(),
                kind: "function",
                function: FunctionCallOut {
                    name: c.name,
                    arguments: c.arguments,
                },
            }),
        }
    }
    ChatMessageOut {
        role: "assistant",
        // Null rather than empty when the message calls tools or only thinks.
        content: (!content.is_empty() || (tool_calls.is_empty() && reasoning.is_empty()))
            .then_some(content),
        reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
        tool_calls,
    }
}

/// One choice's parser while it streams.
pub struct StreamState {
    parser: OutputParser,
    pieces: Vec<Piece>,
    calls: usize,
}

impl StreamState {
    pub fn new(format: OutputFormat) -> Self {
        StreamState {
            parser: format.parser(),
            pieces: Vec::new(),
            calls: 0,
        }
    }

    /// Whether the choice has made a call.
    pub fn made_calls(&self) -> bool {
        self.calls > 0
    }

    /// The deltas for `text`; with `last`, also everything held back.
    pub fn deltas(&mut self, text: &str, last: bool) -> Vec<ChatDelta> {
        if !text.is_empty() {
            self.parser.push(text, &mut self.pieces);
        }
        if last {
            self.parser.finish(&mut self.pieces);
        }
        let pieces = merge(std::mem::take(&mut self.pieces));
        let mut out = Vec::with_capacity(pieces.len());
        for p in pieces {
            match p {
                Piece::Content(c) => out.push(ChatDelta {
                    content: Some(c),
                    ..ChatDelta::default()
                }),
                Piece::Reasoning(r) => out.push(ChatDelta {
                    reasoning_content: Some(r),
                    ..ChatDelta::default()
                }),
                Piece::Call(c) => {
                    let index = self.calls;
                    self.calls += 1;
                    let call =
                        |id: Option<String>, name: Option<String>, arguments: String| ChatDelta {
                            tool_calls: Some(vec![ToolCallDelta {
                                index,
                                kind: id.as_ref().map(|_| "function"),
                                id,
                                function: FunctionCallDelta {
                                    name,
                                    arguments: Some(arguments),
                                },
                            }]),
                            ..ChatDelta::default()
                        };
                    out.push(call(Some(new_call_id()), Some(c.name), String::new()));
                    out.push(call(None, None, c.arguments));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HERMES: OutputFormat = OutputFormat {
        reasoning: None,
        tools: Some(ToolFormat::Hermes),
    };

    #[test]
    fn message_with_calls_and_no_text_has_null_content() {
        let m = message(
            HERMES,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
        );
        assert_eq!(m.content, None);
        assert_eq!(m.tool_calls.len(), 1);
        assert_eq!(m.tool_calls[0].function.arguments, r#"{"a":1}"#);
        assert!(m.tool_calls[0].id.starts_with("call_"));
        let json = serde_json::to_value(&m).unwrap();
        assert_eq!(json["tool_calls"][0]["type"], "function");
        assert!(json["content"].is_null());
        assert!(json.get("reasoning_content").is_none());

        let plain = message(OutputFormat::default(), "");
        assert_eq!(plain.content.as_deref(), Some(""));
        assert!(serde_json::to_value(&plain)
            .unwrap()
            .get("tool_calls")
            .is_none());
    }

    #[test]
    fn streamed_calls_come_as_openai_deltas() {
        let mut s = StreamState::new(HERMES);
        let mut deltas = Vec::new();
        for piece in [
            "Hi <tool",
            "_call>{\"name\": \"f\", ",
            "\"arguments\": {}}</tool_call>",
        ] {
            deltas.extend(s.deltas(piece, false));
        }
        deltas.extend(s.deltas("", true));
        let json: Vec<_> = deltas
            .iter()
            .map(|d| serde_json::to_value(d).unwrap())
            .collect();
        assert_eq!(json[0], serde_json::json!({"content": "Hi"}));
        let first = &json[1]["tool_calls"][0];
        assert_eq!(first["index"], 0);
        assert_eq!(first["type"], "function");
        assert!(first["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(
            first["function"],
            serde_json::json!({"name": "f", "arguments": ""})
        );
        assert_eq!(
            json[2]["tool_calls"][0],
            serde_json::json!({"index": 0, "function": {"arguments": "{}"}})
        );
        assert_eq!(json.len(), 3);
        assert!(s.made_calls());
        assert_eq!(finish_reason(FinishReason::Stop, true), "tool_calls");
        assert_eq!(finish_reason(FinishReason::Length, true), "length");
    }
}
