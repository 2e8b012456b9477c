//! Request fields beyond sampling: every not-yet-supported option is a 400
//! naming it unless its value leaves the output unchanged, unknown fields are
//! a 400 naming them, harmless ones are accepted; `developer` messages,
//! `add_generation_prompt` and `chat_template_kwargs` reach the template.

mod common;

use common::*;
use serde_json::{json, Value};

fn chat(messages: Value) -> Value {
    json!({"model": MODEL_NAME, "messages": messages, "max_tokens": 4, "temperature": 0})
}

fn with(mut body: Value, key: &str, value: Value) -> Value {
    body[key] = value;
    body
}

fn assert_refused(status: u16, v: &Value, param: &str) {
    assert_eq!(status, 400, "{param}: {v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert_eq!(v["error"]["param"], param, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains(param),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_that_would_change_the_output_are_refused_by_name() {
    let s = start(Options::default()).await;
    let base = chat(json!([{"role": "user", "content": "Hi"}]));
    let compl = greedy("Hello", 4);
    let chat_cases = [
        (
            "tools",
            json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]),
        ),
        ("tool_choice", json!("required")),
        ("chat_template", json!("{{ messages }}")),
        ("use_beam_search", json!(true)),
        ("priority", json!(2)),
        ("guided_decoding_backend", json!("xgrammar")),
        ("no_such_option", json!(1)),
    ];
    for (param, value) in chat_cases {
        let (status, v) = s
            .post("/v1/chat/completions", &with(base.clone(), param, value))
            .await;
        assert_refused(status, &v, param);
    }
    let compl_cases = [
        ("best_of", json!(3)),
        ("suffix", json!(" the end")),
        ("length_penalty", json!(0.5)),
        ("tools", json!([])),
        ("add_generation_prompt", json!(false)),
        ("no_such_option", json!(null)),
    ];
    for (param, value) in compl_cases {
        let (status, v) = s
            .post("/v1/completions", &with(compl.clone(), param, value))
            .await;
        assert_refused(status, &v, param);
    }
    // Streaming requests are refused the same way, before any stream starts.
    let body = with(
        with(base.clone(), "stream", json!(true)),
        "use_beam_search",
        json!(true),
    );
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_refused(status, &v, "use_beam_search");
    let body = with(
        base.clone(),
        "stream_options",
        json!({"continuous_usage_stats": true}),
    );
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_refused(status, &v, "stream_options.continuous_usage_stats");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neutral_values_and_harmless_fields_are_accepted_and_change_nothing() {
    let s = start(Options::default()).await;
    let base = chat(json!([{"role": "user", "content": "Name a color."}]));
    let (status, plain) = s.post("/v1/chat/completions", &base).await;
    assert_eq!(status, 200, "{plain}");
    let mut neutral = base.clone();
    for (k, v) in json!({
        "response_format": {"type": "text"}, "tools": [], "tool_choice": "none",
        "logit_bias": {}, "min_tokens": 0, "include_stop_str_in_output": false,
        "skip_special_tokens": true, "continue_final_message": false, "bad_words": [],
        "prompt_logprobs": null, "return_tokens_as_token_ids": false,
        "add_generation_prompt": true, "chat_template_kwargs": {},
        "user": "someone", "store": false, "metadata": {"k": "v"},
        "service_tier": "auto", "parallel_tool_calls": true, "priority": 0,
        "request_id": "r-1", "safety_identifier": "s", "prompt_cache_key": "k"
    })
    .as_object()
    .unwrap()
    {
        neutral[k] = v.clone();
    }
    let (status, v) = s.post("/v1/chat/completions", &neutral).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"], plain["choices"]);
    // The same prompt (the second request finds it in the prefix cache).
    assert_eq!(v["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"]);

    let compl = greedy("Hello", 4);
    let (_, want) = s.post("/v1/completions", &compl).await;
    let body = with(
        with(with(compl, "best_of", json!(1)), "suffix", json!("")),
        "echo",
        json!(false),
    );
    let (status, v) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"], want["choices"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn developer_role_generation_prompt_and_template_kwargs_reach_the_template() {
    let s = start(Options::default()).await;
    let as_role = |role: &str| {
        chat(json!([
            {"role": role, "content": "You are terse."},
            {"role": "user", "content": "Name a primary color."}
        ]))
    };
    // SmolLM2's template knows no developer role: it renders as system.
    let (status, sys) = s.post("/v1/chat/completions", &as_role("system")).await;
    assert_eq!(status, 200, "{sys}");
    let (status, dev) = s.post("/v1/chat/completions", &as_role("developer")).await;
    assert_eq!(status, 200, "{dev}");
    assert_eq!(dev["choices"], sys["choices"]);
    // The same prompt: all but its last token come from the prefix cache.
    let prompt = sys["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(dev["usage"]["prompt_tokens"], prompt);
    assert_eq!(
        dev["usage"]["prompt_tokens_details"]["cached_tokens"],
        prompt - 1
    );

    // Without the generation prompt the prompt is exactly the rendered
    // conversation, without the assistant header.
    use pagoda_model::tokenizer::ChatMessage;
    let template = s.tokenizer.chat_template().unwrap();
    let msgs = [
        ChatMessage::new("system", "You are terse."),
        ChatMessage::new("user", "Name a primary color."),
    ];
    let len = |add: bool| {
        let text = template.apply(&msgs, add).unwrap();
        s.tokenizer.encode(&text, false).unwrap().len()
    };
    assert!(len(false) < len(true));
    let body = with(as_role("system"), "add_generation_prompt", json!(false));
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], len(false));
    assert_eq!(sys["usage"]["prompt_tokens"], len(true));

    // Kwargs are template variables; the ones the server sets are refused.
    let body = with(
        as_role("system"),
        "chat_template_kwargs",
        json!({"enable_thinking": false}),
    );
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"], sys["choices"]);
    for key in ["messages", "add_generation_prompt", "tools"] {
        let body = with(as_role("system"), "chat_template_kwargs", json!({key: 1}));
        let (status, v) = s.post("/v1/chat/completions", &body).await;
        assert_refused(status, &v, "chat_template_kwargs");
    }
    let (status, v) = s.post("/v1/chat/completions", &as_role("function")).await;
    assert_refused(status, &v, "messages[0].role");
}
