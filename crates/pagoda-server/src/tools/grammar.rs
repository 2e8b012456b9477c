//! Lark grammars (llguidance's dialect) that admit only tool calls in a
//! format, for `tool_choice: required` and a named function: the output is
//! one call (or, with `parallel`, one or more), each naming one of the given
//! functions with arguments valid under its `parameters` schema (embedded as
//! `%json`), so the format's parser always finds the calls.
//!
//! Per format:
//! - Hermes: `<tool_call>\n{"name": .., "arguments": ..}\n</tool_call>`,
//!   several separated by `\n`;
//! - Llama 3 JSON: `{"name": .., "parameters": ..}`, several separated by `; `;
//! - Mistral: the `[TOOL_CALLS]` token (by id, when the vocabulary has it)
//!   and a JSON list of `{"name": .., "arguments": ..}`.
//!
//! The JSON is written as chat templates write calls (`tojson`, Python's
//! `", "` and `": "` separators, no other whitespace): the form the model
//! saw in training, and no room for runs of blanks.

use super::ToolFormat;
use serde_json::{json, Value};

/// A function the output may call.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionDef {
    pub name: String,
    /// JSON Schema of the arguments (`{"type": "object"}` when the tool gave none).
    pub parameters: Value,
}

/// The schema of one call object `{"name": name, <args_key>: arguments}`.
fn call_schema(functions: &[FunctionDef], args_key: &str) -> Value {
    let one = |f: &FunctionDef| {
        json!({
            "type": "object",
            "properties": {
                "name": {"const": f.name},
                args_key: f.parameters,
            },
            "required": ["name", args_key],
            "additionalProperties": false,
        })
    };
    match functions {
        [f] => one(f),
        fs => json!({"anyOf": fs.iter().map(one).collect::<Vec<_>>()}),
    }
}

/// llguidance's JSON options (`x-guidance`, at a `%json` schema's top level):
/// Python's separators and no free whitespace.
fn json_layout() -> Value {
    json!({"whitespace_flexible": false, "key_separator": ": ", "item_separator": ", "})
}

/// `schema` with [`json_layout`] set.
fn laid_out(mut schema: Value) -> Value {
    schema["x-guidance"] = json_layout();
    schema
}

/// A Lark string literal.
fn lit(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// The grammar of calls to `functions` (not empty) in `format`: exactly one
/// call, or with `parallel` one or more. `marker_token` is the id of
/// Mistral's `[TOOL_CALLS]` token, if the vocabulary has one.
pub fn tool_call_grammar(
    format: ToolFormat,
    functions: &[FunctionDef],
    parallel: bool,
    marker_token: Option<u32>,
) -> String {
    let repeat = |sep: &str| {
        if parallel {
            format!("start: call ({} call)*\n", lit(sep))
        } else {
            "start: call\n".to_string()
        }
    };
    match format {
        ToolFormat::Hermes => format!(
            "{}call: {} body {}\nbody: %json {}\n",
            repeat("\n"),
            lit(&format!("{}\n", super::hermes::START)),
            lit(&format!("\n{}", super::hermes::END)),
            laid_out(call_schema(functions, "arguments"))
        ),
        ToolFormat::Llama3Json => format!(
            "{}call: %json {}\n",
            repeat("; "),
            laid_out(call_schema(functions, "parameters"))
        ),
        ToolFormat::Mistral => {
            let mut list = json!({
                "type": "array",
                "items": call_schema(functions, "arguments"),
                "minItems": 1,
            });
            if !parallel {
                list["maxItems"] = json!(1);
            }
            let list = laid_out(list);
            let marker = match marker_token {
                Some(id) => format!("<[{id}]> "),
                None => String::new(),
            };
            format!("start: {marker}calls\ncalls: %json {list}\n")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> FunctionDef {
        FunctionDef {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}),
        }
    }

    fn other() -> FunctionDef {
        FunctionDef {
            name: "say \"hi\"".into(),
            parameters: json!({"type": "object"}),
        }
    }

    /// The JSON after `%json ` on the line starting with `rule`.
    fn embedded(grammar: &str, rule: &str) -> Value {
        let line = grammar
            .lines()
            .find(|l| l.starts_with(rule))
            .unwrap_or_else(|| panic!("no {rule} in {grammar}"));
        let json = line.split_once("%json ").unwrap().1;
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn hermes_grammar_wraps_each_call_in_tags() {
        let g = tool_call_grammar(ToolFormat::Hermes, &[weather()], true, None);
        let mut lines = g.lines();
        assert_eq!(lines.next(), Some(r#"start: call ("\n" call)*"#));
        assert_eq!(
            lines.next(),
            Some(r#"call: "<tool_call>\n" body "\n</tool_call>""#)
        );
        let schema = embedded(&g, "body:");
        assert_eq!(
            schema["properties"]["name"],
            json!({"const": "get_weather"})
        );
        assert_eq!(schema["properties"]["arguments"], weather().parameters);
        assert_eq!(schema["required"], json!(["name", "arguments"]));
        assert_eq!(schema["additionalProperties"], json!(false));
        assert_eq!(schema["x-guidance"]["whitespace_flexible"], json!(false));
        assert_eq!(schema["x-guidance"]["key_separator"], ": ");

        let one = tool_call_grammar(ToolFormat::Hermes, &[weather()], false, None);
        assert!(one.starts_with("start: call\n"), "{one}");
    }

    #[test]
    fn several_functions_are_alternatives() {
        let g = tool_call_grammar(ToolFormat::Llama3Json, &[weather(), other()], true, None);
        assert!(g.starts_with("start: call (\"; \" call)*\n"), "{g}");
        let schema = embedded(&g, "call:");
        let names: Vec<_> = schema["anyOf"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["properties"]["name"]["const"].clone())
            .collect();
        assert_eq!(names, vec![json!("get_weather"), json!("say \"hi\"")]);
        assert_eq!(
            schema["anyOf"][0]["required"],
            json!(["name", "parameters"])
        );
    }

    #[test]
    fn mistral_grammar_is_a_list_after_the_marker_token() {
        let g = tool_call_grammar(ToolFormat::Mistral, &[weather()], false, Some(9));
        assert!(g.starts_with("start: <[9]> calls\n"), "{g}");
        let list = embedded(&g, "calls:");
        assert_eq!(list["type"], "array");
        assert_eq!(list["minItems"], 1);
        assert_eq!(list["maxItems"], 1);
        assert_eq!(list["items"]["properties"]["name"]["const"], "get_weather");
        let bare = tool_call_grammar(ToolFormat::Mistral, &[weather()], true, None);
        assert!(bare.starts_with("start: calls\n"), "{bare}");
        assert!(embedded(&bare, "calls:").get("maxItems").is_none());
    }

    #[test]
    fn what_the_grammars_admit_parses_as_calls() {
        // Outputs of the shape each grammar admits go through the parser.
        use crate::tools::{parse_all, Piece};
        for (format, text) in [
            (
                ToolFormat::Hermes,
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>",
            ),
            (
                ToolFormat::Llama3Json,
                "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
            ),
            (
                ToolFormat::Mistral,
                "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]",
            ),
        ] {
            let pieces = parse_all(format.parser().as_mut(), text);
            assert_eq!(pieces.len(), 2, "{format:?}: {pieces:?}");
            assert!(pieces.iter().all(|p| matches!(p, Piece::Call(c) if c.name == "get_weather")));
        }
    }
}
