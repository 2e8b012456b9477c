//! Structured-output fields -> the one [`StructuredOutput`] constraint of a
//! request, compiled once here (against a byte vocabulary) so that a bad
//! schema, regex or grammar is a 400 naming the field it came in.
//!
//! Accepted forms:
//! - `response_format`: `{"type": "text"}` (no constraint),
//!   `{"type": "json_object"}`, `{"type": "json_schema", "json_schema":
//!   {"name", "schema", "strict", "description"}}`;
//! - `structured_outputs` (vLLM): exactly one of `json` (a schema, object or
//!   string), `regex`, `choice` (strings), `grammar`, `json_object: true`;
//! - `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`
//!   (vLLM's older top-level forms, same values);
//! - `grammar` and `json_schema` (llama.cpp's server's top-level forms: a
//!   GBNF grammar, a schema).
//!
//! Grammars are Lark (llguidance's dialect, `%json {...}` embeddable), or
//! GBNF (llama.cpp's format, told by its `::=`), which the engine
//! translates into Lark; a GBNF syntax error says its line and column.
//! More than one constraint in a request is a 400.

use crate::error::ApiError;
use crate::openai::StructuredFields;
use pagoda_core::StructuredOutput;
use pagoda_engine::structured::check_grammar;
use serde_json::Value;

/// The request's constraint, if any, checked to compile.
pub fn constraint(f: &StructuredFields) -> Result<Option<StructuredOutput>, ApiError> {
    let mut found: Option<(String, StructuredOutput)> = None;
    let mut add = |param: String, c: StructuredOutput| -> Result<(), ApiError> {
        if let Some((first, _)) = &found {
            return Err(ApiError::invalid_param(
                &param,
                format!(
                    "only one structured output constraint per request: both '{first}' and \
                     '{param}' are given"
                ),
            ));
        }
        found = Some((param, c));
        Ok(())
    };
    if let Some(rf) = f.response_format.as_ref().filter(|v| !v.is_null()) {
        if let Some(c) = response_format(rf)? {
            add("response_format".into(), c)?;
        }
    }
    if let Some(so) = f.structured_outputs.as_ref().filter(|v| !v.is_null()) {
        let obj = so.as_object().ok_or_else(|| {
            ApiError::invalid_param("structured_outputs", "structured_outputs must be an object")
        })?;
        for (k, v) in obj {
            if v.is_null() || *v == Value::Bool(false) {
                continue;
            }
            let param = format!("structured_outputs.{k}");
            let c = match k.as_str() {
                "json" => json_schema(&param, v)?,
                "regex" => StructuredOutput::Regex(string(&param, v)?),
                "choice" => StructuredOutput::Choice(strings(&param, v)?),
                "grammar" => grammar(&param, v)?,
                "json_object" if *v == Value::Bool(true) => StructuredOutput::JsonObject,
                _ => {
                    return Err(ApiError::invalid_param(
                        &param,
                        format!(
                            "'{param}' is not supported (json, regex, choice, grammar, \
                             json_object are), got {v}"
                        ),
                    )
                    .with_code("unsupported_parameter"))
                }
            };
            add(param, c)?;
        }
    }
    let guided = [
        ("guided_json", &f.guided_json),
        ("guided_regex", &f.guided_regex),
        ("guided_choice", &f.guided_choice),
        ("guided_grammar", &f.guided_grammar),
        ("grammar", &f.grammar),
        ("json_schema", &f.json_schema),
    ];
    for (name, v) in guided {
        let Some(v) = v.as_ref().filter(|v| !v.is_null()) else {
            continue;
        };
        let c = match name {
            "guided_json" | "json_schema" => json_schema(name, v)?,
            "guided_regex" => StructuredOutput::Regex(string(name, v)?),
            "guided_choice" => StructuredOutput::Choice(strings(name, v)?),
            _ => grammar(name, v)?,
        };
        add(name.into(), c)?;
    }
    let Some((param, c)) = found else {
        return Ok(None);
    };
    check_grammar(&c).map_err(|e| ApiError::invalid_param(&param, e.to_string()))?;
    Ok(Some(c))
}

fn response_format(rf: &Value) -> Result<Option<StructuredOutput>, ApiError> {
    let bad = |m: String| ApiError::invalid_param("response_format", m);
    let ty = rf
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("response_format needs a \"type\"".into()))?;
    match ty {
        "text" => Ok(None),
        "json_object" => Ok(Some(StructuredOutput::JsonObject)),
        "json_schema" => {
            let js = rf
                .get("json_schema")
                .filter(|v| v.is_object())
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        "response_format.json_schema",
                        "response_format of type json_schema needs a json_schema object",
                    )
                })?;
            let schema = js.get("schema").filter(|v| !v.is_null()).ok_or_else(|| {
                ApiError::invalid_param(
                    "response_format.json_schema.schema",
                    "response_format.json_schema needs a schema",
                )
            })?;
            Ok(Some(json_schema(
                "response_format.json_schema.schema",
                schema,
            )?))
        }
        other => Err(ApiError::invalid_param(
            "response_format.type",
            format!("response_format type must be text, json_object or json_schema, got {other:?}"),
        )),
    }
}

/// A schema given as a JSON value or as its text.
fn json_schema(param: &str, v: &Value) -> Result<StructuredOutput, ApiError> {
    match v {
        Value::String(s) => Ok(StructuredOutput::JsonSchema(s.clone())),
        Value::Object(_) | Value::Bool(_) => Ok(StructuredOutput::JsonSchema(v.to_string())),
        _ => Err(ApiError::invalid_param(
            param,
            format!("{param} must be a JSON schema (an object), got {v}"),
        )),
    }
}

fn grammar(param: &str, v: &Value) -> Result<StructuredOutput, ApiError> {
    let g = string(param, v)?;
    Ok(if g.contains("::=") {
        StructuredOutput::Gbnf(g)
    } else {
        StructuredOutput::Lark(g)
    })
}

fn string(param: &str, v: &Value) -> Result<String, ApiError> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| ApiError::invalid_param(param, format!("{param} must be a string, got {v}")))
}

fn strings(param: &str, v: &Value) -> Result<Vec<String>, ApiError> {
    v.as_array()
        .and_then(|a| a.iter().map(|x| x.as_str().map(str::to_string)).collect())
        .ok_or_else(|| {
            ApiError::invalid_param(param, format!("{param} must be a list of strings, got {v}"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(body: Value) -> Result<Option<StructuredOutput>, Option<String>> {
        let f: StructuredFields = serde_json::from_value(body).unwrap();
        constraint(&f).map_err(|e| e.param)
    }

    #[test]
    fn every_form_reads_into_one_constraint() {
        assert_eq!(read(json!({})), Ok(None));
        assert_eq!(read(json!({"response_format": {"type": "text"}})), Ok(None));
        assert_eq!(
            read(json!({"response_format": {"type": "json_object"}})),
            Ok(Some(StructuredOutput::JsonObject))
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let want = Ok(Some(StructuredOutput::JsonSchema(schema.to_string())));
        assert_eq!(
            read(json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "schema": schema, "strict": true}}})),
            want
        );
        assert_eq!(read(json!({"guided_json": schema})), want);
        assert_eq!(read(json!({"structured_outputs": {"json": schema}})), want);
        assert_eq!(read(json!({"guided_json": schema.to_string()})), want);
        assert_eq!(
            read(json!({"structured_outputs": {"regex": "[ab]+"}})),
            Ok(Some(StructuredOutput::Regex("[ab]+".into())))
        );
        assert_eq!(
            read(json!({"guided_choice": ["x", "y"]})),
            Ok(Some(StructuredOutput::Choice(vec!["x".into(), "y".into()])))
        );
        assert_eq!(
            read(json!({"guided_grammar": "start: \"a\""})),
            Ok(Some(StructuredOutput::Lark("start: \"a\"".into())))
        );
    }

    #[test]
    fn refusals_name_the_field() {
        let e = |b: Value| read(b).unwrap_err().unwrap_or_default();
        assert_eq!(
            e(json!({"guided_regex": "a", "guided_choice": ["b"]})),
            "guided_choice"
        );
        assert_eq!(
            e(json!({"response_format": {"type": "json_object"}, "guided_regex": "a"})),
            "guided_regex"
        );
        assert!(
            e(json!({"structured_outputs": {"regex": "a", "choice": ["b"]}}))
                .starts_with("structured_outputs.")
        );
        assert_eq!(e(json!({"guided_regex": "(a"})), "guided_regex");
        assert_eq!(e(json!({"guided_json": "{nope"})), "guided_json");
        assert_eq!(
            e(json!({"guided_grammar": "root ::= \"a"})),
            "guided_grammar"
        );
        assert!(read(json!({"guided_grammar": "root ::= \"a\" [0-9]{2}"})).is_ok());
        assert_eq!(
            read(json!({"grammar": "root ::= \"a\""})),
            Ok(Some(StructuredOutput::Gbnf("root ::= \"a\"".into())))
        );
        assert_eq!(e(json!({"grammar": "root ::= \"a"})), "grammar");
        assert_eq!(
            e(json!({"grammar": "root ::= \"a\"", "json_schema": {"type": "object"}})),
            "json_schema"
        );
        assert_eq!(e(json!({"guided_choice": "a"})), "guided_choice");
        assert_eq!(
            e(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})),
            "response_format.json_schema.schema"
        );
        assert_eq!(
            e(json!({"response_format": {"type": "yaml"}})),
            "response_format.type"
        );
        assert_eq!(
            e(json!({"structured_outputs": {"structural_tag": "x"}})),
            "structured_outputs.structural_tag"
        );
    }
}
