//! Structured outputs over HTTP on the default model: `response_format`
//! (json_object, json_schema), vLLM's `structured_outputs` and `guided_*`
//! fields (grammars in Lark or GBNF), streamed and not, give output that
//! satisfies the constraint;
//! bad constraints and two constraints at once are a 400 naming the field.

mod common;

use common::*;
use serde_json::{json, Value};

fn chat(content: &str, key: &str, value: Value) -> Value {
    let mut b = json!({"model": MODEL_NAME, "max_tokens": 80, "temperature": 0,
        "messages": [{"role": "user", "content": content}]});
    b[key] = value;
    b
}

fn streamed_text(payloads: &[String]) -> String {
    chunks(payloads)
        .iter()
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constraints_shape_the_output_streamed_and_not() {
    let s = start(Options::default()).await;
    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000}},
        "required": ["city", "population"], "additionalProperties": false});
    let rf = json!({"type": "json_schema",
        "json_schema": {"name": "city", "schema": schema, "strict": true}});
    let body = chat("Name a big city as JSON.", "response_format", rf);
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let doc: Value = serde_json::from_str(text).unwrap();
    assert!(doc["city"].as_str().unwrap().chars().count() <= 12);
    assert!(doc["population"].is_u64());
    // Streamed: the same document in pieces.
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let payloads = s.stream("/v1/chat/completions", &sbody).await;
    assert_eq!(streamed_text(&payloads), text);

    // vLLM's forms on /v1/completions.
    for (key, value, check) in [
        ("guided_choice", json!(["red", "green"]), "choice"),
        ("guided_regex", json!("[0-9]{4}"), "regex"),
        (
            "structured_outputs",
            json!({"choice": ["red", "green"]}),
            "choice",
        ),
        (
            "structured_outputs",
            json!({"json": {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": false}}),
            "json",
        ),
        (
            "guided_grammar",
            json!("start: \"say \" (\"yes\" | \"no\")"),
            "grammar",
        ),
        ("response_format", json!({"type": "json_object"}), "object"),
        (
            "guided_grammar",
            json!("root ::= \"say \" answer\nanswer ::= \"yes\" | \"no\" # GBNF"),
            "grammar",
        ),
        (
            "structured_outputs",
            json!({"grammar": "root ::= [0-9]{4} \"-\" [0-9]{2}"}),
            "gbnf",
        ),
        // llama.cpp's server's top-level forms.
        ("grammar", json!("root ::= [0-9]{4} \"-\" [0-9]{2}"), "gbnf"),
        (
            "json_schema",
            json!({"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": false}),
            "json",
        ),
    ] {
        let mut b = greedy("The answer is", 40);
        b[key] = value.clone();
        let (status, v) = s.post("/v1/completions", &b).await;
        assert_eq!(status, 200, "{key}: {v}");
        let t = v["choices"][0]["text"].as_str().unwrap();
        match check {
            "choice" => assert!(t == "red" || t == "green", "{t:?}"),
            "regex" => assert!(
                t.len() == 4 && t.bytes().all(|c| c.is_ascii_digit()),
                "{t:?}"
            ),
            "json" => assert!(serde_json::from_str::<Value>(t).unwrap()["a"].is_boolean()),
            "grammar" => assert!(t == "say yes" || t == "say no", "{t:?}"),
            "gbnf" => assert!(
                t.len() == 7
                    && t.bytes().enumerate().all(|(i, c)| if i == 4 {
                        c == b'-'
                    } else {
                        c.is_ascii_digit()
                    }),
                "{t:?}"
            ),
            _ => assert!(t.starts_with('{'), "{t:?}"),
        }
        if check != "object" {
            assert_eq!(v["choices"][0]["finish_reason"], "stop", "{key}: {v}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_or_conflicting_constraints_are_a_400_naming_the_field() {
    let s = start(Options::default()).await;
    for (key, value, param) in [
        ("guided_json", json!("{not json"), "guided_json"),
        ("guided_regex", json!("(open"), "guided_regex"),
        (
            "guided_grammar",
            json!("root ::= \"a\" | b"),
            "guided_grammar",
        ),
        (
            "structured_outputs",
            json!({"grammar": "root ::= [z-a]"}),
            "structured_outputs.grammar",
        ),
        ("guided_grammar", json!("start: nowhere"), "guided_grammar"),
        ("guided_choice", json!([]), "guided_choice"),
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 3, "maximum": 1}}}),
            "response_format",
        ),
        (
            "structured_outputs",
            json!({"regex": "a", "choice": ["b"]}),
            "structured_outputs.choice",
        ),
    ] {
        for path in ["/v1/completions", "/v1/chat/completions"] {
            let mut b = if path == "/v1/completions" {
                greedy("Hi", 4)
            } else {
                chat("Hi", "max_tokens", json!(4))
            };
            b[key] = value.clone();
            let (status, v) = s.post(path, &b).await;
            assert_eq!(status, 400, "{path} {key}: {v}");
            assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
            assert_eq!(v["error"]["param"], param, "{v}");
        }
    }
    // A GBNF syntax error says where it is.
    let mut b = greedy("Hi", 4);
    b["guided_grammar"] = json!("root ::= \"a\" x\nx ::= (\"b\"");
    let (status, v) = s.post("/v1/completions", &b).await;
    assert_eq!(status, 400, "{v}");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.contains("GBNF line 2, column 11"), "{m}");
    let mut b = greedy("Hi", 4);
    b["guided_regex"] = json!("a+");
    b["response_format"] = json!({"type": "json_object"});
    let (status, v) = s.post("/v1/completions", &b).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "guided_regex", "{v}");
}
