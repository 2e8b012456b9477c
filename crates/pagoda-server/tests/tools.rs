//! Tool calling and reasoning on a real server with the default model and
//! tests/chat_templates/smollm2_hermes_tools.jinja (SmolLM2's template with
//! Hermes-style tools). A few-shot history makes the model write a
//! `<tool_call>` greedily, so the parse is checked on real output: the call
//! (name, arguments), `finish_reason`, and the stream's deltas against the
//! unstreamed message; `tool_choice: none` shows the raw text instead.
//! Reasoning parsers are checked against the same output unparsed.

mod common;

use common::*;
use pagoda_server::reasoning::ReasoningFormat;
use pagoda_server::tools::ToolFormat;
use serde_json::{json, Value};

const TEMPLATE: &str = "tests/chat_templates/smollm2_hermes_tools.jinja";

fn tools_server() -> Options {
    Options {
        chat_template: Some(TEMPLATE),
        config: |c| c.tool_call_parser = Some(ToolFormat::Hermes),
        ..Options::default()
    }
}

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Get the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}])
}

fn call(id: &str, city: &str) -> Value {
    json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
        "function": {"name": "get_weather", "arguments": format!("{{\"city\": \"{city}\"}}")}}]})
}

/// A history of weather questions answered by calls, ending with a question.
fn few_shot() -> Value {
    json!({
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            call("call_1", "Paris"),
            {"role": "user", "content": "What is the weather in London?"},
            call("call_2", "London"),
            {"role": "user", "content": "What is the weather in Rome?"},
            call("call_3", "Rome"),
            {"role": "user", "content": "What is the weather in Berlin?"},
        ],
        "tools": weather_tools(),
        "temperature": 0,
        "max_tokens": 40,
    })
}

/// A streamed chat's accumulated content, reasoning, tool calls (id, name,
/// arguments) and finish reason.
fn accumulate(payloads: &[String]) -> (String, String, Vec<(String, String, String)>, String) {
    let (mut content, mut reasoning, mut calls, mut finish) = (
        String::new(),
        String::new(),
        Vec::<(String, String, String)>::new(),
        String::new(),
    );
    for c in chunks(payloads) {
        let choice = &c["choices"][0];
        let delta = &choice["delta"];
        content.push_str(delta["content"].as_str().unwrap_or(""));
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        for tc in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = tc["index"].as_u64().unwrap() as usize;
            if index == calls.len() {
                // The first delta of a call: id, type and name.
                assert_eq!(tc["type"], "function", "{tc}");
                calls.push((
                    tc["id"].as_str().unwrap().to_string(),
                    tc["function"]["name"].as_str().unwrap().to_string(),
                    String::new(),
                ));
            } else {
                assert!(
                    tc.get("id").is_none() && tc["function"].get("name").is_none(),
                    "{tc}"
                );
            }
            calls[index]
                .2
                .push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (content, reasoning, calls, finish)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_parsed_and_streamed_as_openai_does() {
    let s = start(tools_server()).await;
    let body = few_shot();
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let message = &choice["message"];
    assert!(message["content"].is_null(), "{message}");
    let calls = message["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{message}");
    assert_eq!(calls[0]["type"], "function");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Berlin"}));

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let payloads = s.stream("/v1/chat/completions", &streamed).await;
    let (content, reasoning, calls, finish) = accumulate(&payloads);
    assert_eq!(
        (content.as_str(), reasoning.as_str()),
        ("", ""),
        "{payloads:?}"
    );
    assert_eq!(finish, "tool_calls");
    assert_eq!(calls.len(), 1);
    assert!(calls[0].0.starts_with("call_"));
    assert_eq!(calls[0].1, "get_weather");
    assert_eq!(
        calls[0].2,
        message["tool_calls"][0]["function"]["arguments"]
    );

    // tool_choice none: no parsing, the same prompt (tools still reach the
    // template), the raw text as content.
    let mut none = body.clone();
    none["tool_choice"] = json!("none");
    let (status, raw) = s.post("/v1/chat/completions", &none).await;
    assert_eq!(status, 200, "{raw}");
    assert_eq!(raw["usage"]["prompt_tokens"], v["usage"]["prompt_tokens"]);
    let text = raw["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        text.starts_with("<tool_call>") && text.contains("Berlin"),
        "{text}"
    );
    assert_eq!(raw["choices"][0]["finish_reason"], "stop");
    assert!(raw["choices"][0]["message"].get("tool_calls").is_none());
    let mut none_streamed = none.clone();
    none_streamed["stream"] = json!(true);
    let (content, _, calls, finish) =
        accumulate(&s.stream("/v1/chat/completions", &none_streamed).await);
    assert_eq!(
        (content.as_str(), calls.len(), finish.as_str()),
        (text, 0, "stop")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_histories_render_and_bad_requests_name_the_field() {
    let s = start(tools_server()).await;
    // A second turn: the call and its result in the history.
    let body = json!({
        "messages": [
            {"role": "developer", "content": "Answer briefly."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            call("call_1", "Paris"),
            {"role": "tool", "tool_call_id": "call_1", "content": "22 C and sunny"},
        ],
        "tools": weather_tools(),
        "tool_choice": "auto",
        "max_tokens": 8,
    });
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["choices"][0]["message"]["role"] == "assistant");

    let bad = |patch: Value| {
        let mut b = few_shot();
        for (k, v) in patch.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    for (body, param) in [
        (
            bad(json!({"tools": null, "tool_choice": "required"})),
            "tool_choice",
        ),
        (
            bad(json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}})),
            "tool_choice",
        ),
        (
            bad(json!({"tools": [{"type": "function", "function": {}}]})),
            "tools[0].function.name",
        ),
        (
            bad(
                json!({"messages": [{"role": "assistant", "tool_calls": [{"type": "function",
                "function": {"name": "f", "arguments": "{oops"}}]}]}),
            ),
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            bad(json!({"messages": [{"role": "robot", "content": "x"}]})),
            "messages[0].role",
        ),
    ] {
        let (status, v) = s.post("/v1/chat/completions", &body).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_parser_tools_need_tool_choice_none() {
    // The model's own template does not show a tool-call format.
    let s = start(Options::default()).await;
    let mut body = json!({"messages": [{"role": "user", "content": "Hi"}],
        "tools": weather_tools(), "max_tokens": 4});
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "tools");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--tool-call-parser"));
    body["tool_choice"] = json!("none");
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_parsers_split_the_same_output() {
    let body = json!({"messages": [{"role": "user", "content": "What is 2+2?"}],
        "temperature": 0, "max_tokens": 24});
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let plain = start(Options::default()).await;
    let (_, v) = plain.post("/v1/chat/completions", &body).await;
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!text.is_empty() && !text.contains("</think>"), "{text}");
    drop(plain);

    // DeepSeek-R1: the output starts inside the thinking, never closed here.
    let r1 = start(Options {
        config: |c| c.reasoning_parser = Some(ReasoningFormat::DeepSeekR1),
        ..Options::default()
    })
    .await;
    let (status, v) = r1.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], text.as_str(), "{m}");
    assert!(m["content"].is_null(), "{m}");
    let (content, reasoning, _, _) =
        accumulate(&r1.stream("/v1/chat/completions", &streamed).await);
    assert_eq!((content.as_str(), reasoning.as_str()), ("", text.as_str()));
    drop(r1);

    // Qwen3: no <think> at the start, so all content.
    let qwen3 = start(Options {
        config: |c| c.reasoning_parser = Some(ReasoningFormat::Qwen3),
        ..Options::default()
    })
    .await;
    let (_, v) = qwen3.post("/v1/chat/completions", &body).await;
    let m = &v["choices"][0]["message"];
    assert_eq!(m["content"], text.as_str(), "{m}");
    assert!(m.get("reasoning_content").is_none(), "{m}");
    let (content, reasoning, _, _) =
        accumulate(&qwen3.stream("/v1/chat/completions", &streamed).await);
    assert_eq!((content.as_str(), reasoning.as_str()), (text.as_str(), ""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_template_kwargs_reach_the_template() {
    let s = start(tools_server()).await;
    let body = |kwargs: Value| {
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
               "chat_template_kwargs": kwargs})
    };
    let (_, on) = s.post("/v1/chat/completions", &body(json!({}))).await;
    let (_, off) = s
        .post(
            "/v1/chat/completions",
            &body(json!({"enable_thinking": false})),
        )
        .await;
    // The template closes an empty thinking block in the prompt.
    let extra = s
        .tokenizer
        .encode("<think>\n\n</think>\n\n", false)
        .unwrap()
        .len();
    let tokens = |v: &Value| v["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert_eq!(tokens(&off), tokens(&on) + extra, "{on} {off}");
}
