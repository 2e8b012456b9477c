//! A chat request's tools, tool choice and tool history, checked.
//!
//! - `tools`: a list of `{type: "function", function: {name, description?,
//!   parameters?}}`, handed to the chat template unchanged as `tools` (as
//!   transformers does), also with `tool_choice: "none"` (as vLLM does by
//!   default);
//! - `tool_choice`: `"none"` (no parsing of calls), `"auto"` (the default
//!   with tools: the model may call, the server's format is parsed),
//!   `"required"` or `{type: "function", function: {name}}` (a grammar forces
//!   one or more calls, or one call of that function);
//! - history: assistant messages may carry `tool_calls` (whose
//!   `function.arguments` JSON text is parsed into a mapping, which is what
//!   tool-calling templates iterate over or `tojson`, as vLLM does), `tool`
//!   messages carry `tool_call_id`; `name` is passed on.
//!
//! Every refusal is a 400 naming the offending field.

use super::grammar::{tool_call_grammar, FunctionDef};
use super::ToolFormat;
use crate::error::ApiError;
use crate::openai::ChatMessageIn;
use pagoda_model::tokenizer::{ChatMessage, MessageContent};
use serde_json::{json, Map, Value};

/// What the request asks of tool calling.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Function(String),
}

/// A request's tools, checked.
#[derive(Debug, Clone)]
pub struct RequestTools {
    /// As given, for the template (empty: no `tools` variable).
    pub tools: Vec<Value>,
    pub functions: Vec<FunctionDef>,
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true): several calls in one turn.
    pub parallel: bool,
}

/// How a request's output is handled.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPlan {
    /// The format whose calls are parsed out of the output.
    pub parse: Option<ToolFormat>,
    /// The Lark grammar forcing calls (`required` or a named function).
    pub grammar: Option<String>,
}

fn bad(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, msg)
}

impl RequestTools {
    /// Reads `tools`, `tool_choice` and `parallel_tool_calls`.
    pub fn read(
        tools: Option<Vec<Value>>,
        choice: Option<Value>,
        parallel: Option<bool>,
    ) -> Result<Self, ApiError> {
        let tools = tools.unwrap_or_default();
        let mut functions = Vec::with_capacity(tools.len());
        for (i, tool) in tools.iter().enumerate() {
            let at = |f: &str| format!("tools[{i}]{f}");
            if tool.get("type").and_then(Value::as_str) != Some("function") {
                return Err(bad(
                    &at(".type"),
                    "only tools of type \"function\" are supported",
                ));
            }
            let Some(f) = tool.get("function").and_then(Value::as_object) else {
                return Err(bad(&at(".function"), "a tool needs a \"function\" object"));
            };
            let name = match f.get("name").and_then(Value::as_str) {
                Some(n) if !n.is_empty() => n.to_string(),
                _ => {
                    return Err(bad(
                        &at(".function.name"),
                        "a function needs a non-empty name",
                    ))
                }
            };
            let parameters = match f.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object"}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => {
                    return Err(bad(
                        &at(".function.parameters"),
                        "parameters must be a JSON Schema object",
                    ))
                }
            };
            functions.push(FunctionDef { name, parameters });
        }
        let choice = match choice {
            None | Some(Value::Null) if functions.is_empty() => ToolChoice::None,
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => {
                    return Err(bad(
                        "tool_choice",
                        format!(
                            "tool_choice must be \"none\", \"auto\", \"required\" or \
                             {{\"type\": \"function\", \"function\": {{\"name\": ..}}}}, got {other:?}"
                        ),
                    ))
                }
            },
            Some(v) => {
                let name = (v.get("type").and_then(Value::as_str) == Some("function"))
                    .then(|| v.pointer("/function/name").and_then(Value::as_str))
                    .flatten();
                match name {
                    Some(n) => ToolChoice::Function(n.to_string()),
                    None => {
                        return Err(bad(
                            "tool_choice",
                            format!(
                                "tool_choice as an object must be {{\"type\": \"function\", \
                                 \"function\": {{\"name\": ..}}}}, got {v}"
                            ),
                        ))
                    }
                }
            }
        };
        match &choice {
            ToolChoice::Required | ToolChoice::Function(_) if functions.is_empty() => {
                return Err(bad(
                    "tool_choice",
                    "this tool_choice needs a non-empty tools list",
                ))
            }
            ToolChoice::Function(n) if !functions.iter().any(|f| &f.name == n) => {
                return Err(bad(
                    "tool_choice",
                    format!("tool_choice names the function {n:?}, which is not in tools"),
                ))
            }
            _ => {}
        }
        Ok(RequestTools {
            tools,
            functions,
            choice,
            parallel: parallel.unwrap_or(true),
        })
    }

    /// What to parse and force, given the server's format (`format`) and the
    /// id of Mistral's `[TOOL_CALLS]` token (`marker_token`).
    pub fn plan(
        &self,
        format: Option<ToolFormat>,
        marker_token: Option<u32>,
    ) -> Result<ToolPlan, ApiError> {
        if self.functions.is_empty() || self.choice == ToolChoice::None {
            return Ok(ToolPlan {
                parse: None,
                grammar: None,
            });
        }
        let Some(format) = format else {
            return Err(bad(
                "tools",
                "tools need a tool-call parser, and the model's chat template does not \
                 show the format of its calls: start the server with --tool-call-parser \
                 (hermes, llama3_json or mistral), or send tool_choice \"none\"",
            ));
        };
        let grammar = match &self.choice {
            ToolChoice::Required => Some(tool_call_grammar(
                format,
                &self.functions,
                self.parallel,
                marker_token,
            )),
            ToolChoice::Function(name) => {
                let f: Vec<_> = self
                    .functions
                    .iter()
                    .filter(|f| &f.name == name)
                    .take(1)
                    .cloned()
                    .collect();
                Some(tool_call_grammar(format, &f, false, marker_token))
            }
            _ => None,
        };
        Ok(ToolPlan {
            parse: Some(format),
            grammar,
        })
    }
}

/// The messages as the template gets them. `developer` becomes `system`
/// unless the template knows `developer` (`knows_developer`).
pub fn template_messages(
    messages: &[ChatMessageIn],
    knows_developer: bool,
) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "user" | "assistant" | "tool" => m.role.as_str(),
            "developer" if knows_developer => "developer",
            "developer" => "system",
            _ => {
                return Err(bad(
                    &format!("messages[{i}].role"),
                    format!(
                        "messages[{i}].role '{}' is not supported (use system, developer, \
                         user, assistant or tool)",
                        m.role
                    ),
                ))
            }
        };
        let mut extra = Map::new();
        if let Some(calls) = &m.tool_calls {
            if role != "assistant" {
                return Err(bad(
                    &format!("messages[{i}].tool_calls"),
                    "only assistant messages carry tool_calls",
                ));
            }
            let calls = calls
                .iter()
                .enumerate()
                .map(|(j, c)| history_call(c, &format!("messages[{i}].tool_calls[{j}]")))
                .collect::<Result<Vec<_>, _>>()?;
            extra.insert("tool_calls".into(), Value::Array(calls));
        }
        if let Some(id) = &m.tool_call_id {
            extra.insert("tool_call_id".into(), Value::String(id.clone()));
        }
        if let Some(name) = &m.name {
            extra.insert("name".into(), Value::String(name.clone()));
        }
        let content = match &m.content {
            // An assistant turn that only calls tools has no content.
            None if m.tool_calls.is_some() => None,
            None => Some(MessageContent::Text(String::new())),
            Some(c) => {
                Some(MessageContent::Text(c.to_text().map_err(|e| {
                    bad(&format!("messages[{i}].content"), e.to_string())
                })?))
            }
        };
        out.push(ChatMessage {
            role: role.to_string(),
            content,
            extra,
        });
    }
    Ok(out)
}

/// One `tool_calls` entry of the history, with its arguments parsed.
fn history_call(call: &Value, at: &str) -> Result<Value, ApiError> {
    let mut call = call.clone();
    let Some(f) = call.get_mut("function").and_then(Value::as_object_mut) else {
        return Err(bad(
            &format!("{at}.function"),
            "a tool call needs a \"function\" object",
        ));
    };
    if !f.get("name").is_some_and(Value::is_string) {
        return Err(bad(
            &format!("{at}.function.name"),
            "a tool call needs a function name",
        ));
    }
    let args = match f.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
            bad(
                &format!("{at}.function.arguments"),
                format!("arguments are not valid JSON: {e}"),
            )
        })?,
        Some(v) => v.clone(),
    };
    f.insert("arguments".into(), args);
    Ok(call)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}),
        ]
    }

    fn param(e: ApiError) -> String {
        e.param.unwrap_or_default()
    }

    #[test]
    fn choice_defaults_and_plans() {
        let t = RequestTools::read(Some(tools()), None, None).unwrap();
        assert_eq!(t.choice, ToolChoice::Auto);
        let plan = t.plan(Some(ToolFormat::Hermes), None).unwrap();
        assert_eq!(plan.parse, Some(ToolFormat::Hermes));
        assert_eq!(plan.grammar, None);
        // No format: refused, unless the choice is none.
        assert_eq!(param(t.plan(None, None).unwrap_err()), "tools");
        let none = RequestTools::read(Some(tools()), Some(json!("none")), None).unwrap();
        assert_eq!(none.plan(None, None).unwrap().parse, None);
        assert_eq!(none.tools.len(), 1, "tools still reach the template");
        let empty = RequestTools::read(None, Some(json!("auto")), None).unwrap();
        assert_eq!(empty.plan(None, None).unwrap().parse, None);
        let default = RequestTools::read(None, None, None).unwrap();
        assert_eq!(default.choice, ToolChoice::None);

        let req = RequestTools::read(Some(tools()), Some(json!("required")), None).unwrap();
        let g = req
            .plan(Some(ToolFormat::Hermes), None)
            .unwrap()
            .grammar
            .unwrap();
        assert!(
            g.contains("get_weather") && g.contains("<tool_call>"),
            "{g}"
        );
        let named = RequestTools::read(
            Some(tools()),
            Some(json!({"type": "function", "function": {"name": "get_weather"}})),
            None,
        )
        .unwrap();
        assert_eq!(named.choice, ToolChoice::Function("get_weather".into()));
        let g = named
            .plan(Some(ToolFormat::Llama3Json), None)
            .unwrap()
            .grammar
            .unwrap();
        assert!(g.starts_with("start: call\n"), "{g}");
    }

    #[test]
    fn bad_tools_and_choices_name_the_field() {
        let e = |t: Option<Vec<Value>>, c: Option<Value>| {
            param(RequestTools::read(t, c, None).unwrap_err())
        };
        assert_eq!(
            e(Some(vec![json!({"type": "code"})]), None),
            "tools[0].type"
        );
        assert_eq!(
            e(Some(vec![json!({"type": "function"})]), None),
            "tools[0].function"
        );
        assert_eq!(
            e(
                Some(vec![json!({"type": "function", "function": {"name": ""}})]),
                None
            ),
            "tools[0].function.name"
        );
        assert_eq!(
            e(
                Some(vec![
                    json!({"type": "function", "function": {"name": "f", "parameters": 1}})
                ]),
                None
            ),
            "tools[0].function.parameters"
        );
        assert_eq!(e(None, Some(json!("required"))), "tool_choice");
        assert_eq!(e(Some(tools()), Some(json!("sometimes"))), "tool_choice");
        assert_eq!(
            e(
                Some(tools()),
                Some(json!({"type": "function", "function": {"name": "nope"}}))
            ),
            "tool_choice"
        );
        assert_eq!(
            e(Some(tools()), Some(json!({"type": "function"}))),
            "tool_choice"
        );
    }

    #[test]
    fn history_arguments_become_mappings() {
        let msgs: Vec<ChatMessageIn> = serde_json::from_value(json!([
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
              "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "22 C"},
        ]))
        .unwrap();
        let out = template_messages(&msgs, false).unwrap();
        assert_eq!(out[0].role, "system");
        assert_eq!(
            out[0].content,
            Some(MessageContent::Text("Be brief.".into()))
        );
        assert_eq!(out[2].content, None);
        assert_eq!(
            out[2].extra["tool_calls"][0]["function"]["arguments"],
            json!({"city": "Paris"})
        );
        assert_eq!(out[2].extra["tool_calls"][0]["id"], "call_1");
        assert_eq!(out[3].role, "tool");
        assert_eq!(out[3].extra["tool_call_id"], "call_1");
        assert_eq!(template_messages(&msgs, true).unwrap()[0].role, "developer");

        let bad: Vec<ChatMessageIn> = serde_json::from_value(json!([
            {"role": "assistant", "tool_calls": [{"type": "function",
              "function": {"name": "f", "arguments": "{not json"}}]},
        ]))
        .unwrap();
        assert_eq!(
            param(template_messages(&bad, false).unwrap_err()),
            "messages[0].tool_calls[0].function.arguments"
        );
        let role: Vec<ChatMessageIn> =
            serde_json::from_value(json!([{"role": "robot", "content": "x"}])).unwrap();
        assert_eq!(
            param(template_messages(&role, false).unwrap_err()),
            "messages[0].role"
        );
    }
}
