//! vLLM's and OpenAI's output-changing request options through the HTTP
//! API, streamed and not: `logit_bias`, `allowed_token_ids`, `bad_words`,
//! `min_tokens`, `include_stop_str_in_output`, `skip_special_tokens`,
//! `spaces_between_special_tokens`, `return_tokens_as_token_ids` and chat's
//! `continue_final_message`; and a walk over every field of OpenAI's and
//! vLLM's request schemas (tests/data/request_fields.txt): each is honoured
//! (with a behavioural test that exists), refused with a 400 naming it, or
//! harmless (accepted, output unchanged).

mod common;

use common::*;
use serde_json::{json, Value};

fn chat(messages: Value, max_tokens: usize) -> Value {
    json!({"model": MODEL_NAME, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
}

fn with(mut body: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Token ids of a completion's legacy logprobs written as `token_id:N`.
fn ids_of(choice: &Value) -> Vec<u32> {
    choice["logprobs"]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let t = t.as_str().unwrap();
            t.strip_prefix("token_id:")
                .unwrap_or_else(|| panic!("{t}"))
                .parse()
                .unwrap()
        })
        .collect()
}

/// The text of a completion stream, and its last finish reason.
fn streamed_text(payloads: &[String]) -> (String, Value) {
    let mut text = String::new();
    let mut finish = Value::Null;
    for c in chunks(payloads) {
        for ch in c["choices"].as_array().unwrap() {
            text.push_str(
                ch["text"]
                    .as_str()
                    .or(ch["delta"]["content"].as_str())
                    .unwrap_or(""),
            );
            if !ch["finish_reason"].is_null() {
                finish = ch["finish_reason"].clone();
            }
        }
    }
    (text, finish)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_allowed_tokens_and_bad_words_steer_the_tokens() {
    let s = start(Options::default()).await;
    let target = s.tokenizer.encode(" banana", false).unwrap()[0];
    let ids_lp = json!({"logprobs": 1, "return_tokens_as_token_ids": true, "ignore_eos": true});
    for extra in [
        json!({"temperature": 0}),
        json!({"temperature": 1, "seed": 3}),
    ] {
        let body = with(
            with(greedy("The capital of France is", 6), ids_lp.clone()),
            with(extra, json!({"logit_bias": {target.to_string(): 100}})),
        );
        let (status, v) = s.post("/v1/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(ids_of(&v["choices"][0]), vec![target; 6], "{v}");
        // Top logprobs are named by id too.
        let top = v["choices"][0]["logprobs"]["top_logprobs"][0]
            .as_object()
            .unwrap();
        assert!(top.keys().all(|k| k.starts_with("token_id:")), "{v}");
    }
    let allowed: Vec<u32> = s.tokenizer.encode(" one two three", false).unwrap();
    let body = with(
        with(greedy("Count:", 8), ids_lp.clone()),
        json!({"temperature": 1, "seed": 5, "allowed_token_ids": allowed}),
    );
    let (status, v) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let got = ids_of(&v["choices"][0]);
    assert_eq!(got.len(), 8);
    assert!(got.iter().all(|t| allowed.contains(t)), "{got:?}");

    // bad_words: the greedy text's words never come back, streamed or not.
    let base = with(
        greedy("The capital of France is", 10),
        json!({"ignore_eos": true}),
    );
    let (_, plain) = s.post("/v1/completions", &base).await;
    let text = plain["choices"][0]["text"].as_str().unwrap().to_string();
    let words: Vec<&str> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() > 3)
        .collect();
    assert!(!words.is_empty(), "{plain}");
    let body = with(base.clone(), json!({"bad_words": words}));
    let (status, v) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let banned = v["choices"][0]["text"].as_str().unwrap().to_string();
    let streamed = s
        .stream("/v1/completions", &with(body, json!({"stream": true})))
        .await;
    assert_eq!(streamed_text(&streamed).0, banned);
    for w in &words {
        assert!(!banned.contains(w), "{w:?} in {banned:?}");
    }
    // Ids outside the vocabulary are refused by name.
    let vocab = s.tokenizer.vocab_size();
    for (param, extra) in [
        ("logit_bias", json!({"logit_bias": {vocab.to_string(): 5}})),
        ("allowed_token_ids", json!({"allowed_token_ids": [vocab]})),
    ] {
        let (status, v) = s.post("/v1/completions", &with(base.clone(), extra)).await;
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_tokens_and_special_tokens_in_the_text() {
    let s = start(Options::default()).await;
    let eos = s.tokenizer.eos_token_ids()[0];
    let eos_text = s.tokenizer.id_to_token(eos).unwrap();
    let force_eos = json!({"logit_bias": {eos.to_string(): 100}});
    // EOS at +100 is banned until min_tokens, then ends the request.
    let body = with(
        greedy("Hello", 20),
        with(force_eos.clone(), json!({"min_tokens": 4})),
    );
    let (status, v) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 5, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // Special tokens stay in the text when not skipped (spaces between
    // them or not: vLLM applies that option to slow tokenizers only).
    for (skip, spaces, want) in [
        (true, true, String::new()),
        (false, true, eos_text.repeat(3)),
        (false, false, eos_text.repeat(3)),
    ] {
        let body = with(
            greedy("Hello", 3),
            with(
                force_eos.clone(),
                json!({"ignore_eos": true, "skip_special_tokens": skip,
                       "spaces_between_special_tokens": spaces}),
            ),
        );
        let (status, v) = s.post("/v1/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["text"], want, "skip {skip}");
        let payloads = s
            .stream("/v1/completions", &with(body, json!({"stream": true})))
            .await;
        assert_eq!(streamed_text(&payloads).0, want, "streamed, skip {skip}");
    }
    // min_tokens above max_tokens is refused by name.
    let body = with(greedy("Hello", 3), json!({"min_tokens": 4}));
    let (status, v) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "min_tokens");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_stay_in_the_text_when_asked() {
    let s = start(Options::default()).await;
    let base = with(
        greedy("The capital of France is", 12),
        json!({"ignore_eos": true}),
    );
    let (_, plain) = s.post("/v1/completions", &base).await;
    let text = plain["choices"][0]["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() > 8, "{plain}");
    let stop: String = chars[4..7].iter().collect();
    let cut = text.find(&stop).unwrap();
    for (include, end) in [(false, cut), (true, cut + stop.len())] {
        let body = with(
            base.clone(),
            json!({"stop": [stop.clone()], "include_stop_str_in_output": include}),
        );
        let (status, v) = s.post("/v1/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["text"], text[..end], "include {include}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        let payloads = s
            .stream("/v1/completions", &with(body, json!({"stream": true})))
            .await;
        let (streamed, finish) = streamed_text(&payloads);
        assert_eq!(streamed, text[..end], "streamed, include {include}");
        assert_eq!(finish, "stop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_continues_the_final_message_and_names_tokens_by_id() {
    let s = start(Options::default()).await;
    let messages = json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is"}
    ]);
    let body = with(
        chat(messages.clone(), 6),
        json!({"continue_final_message": true,
        "add_generation_prompt": false, "ignore_eos": true}),
    );
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    // The same as completing the rendering cut after the last message.
    let prompt = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n\
                  What is the capital of France?<|im_end|>\n<|im_start|>assistant\n\
                  The capital of France is";
    let (status, want) = s
        .post(
            "/v1/completions",
            &with(greedy(prompt, 6), json!({"ignore_eos": true})),
        )
        .await;
    assert_eq!(status, 200, "{want}");
    assert_eq!(v["usage"]["prompt_tokens"], want["usage"]["prompt_tokens"]);
    assert_eq!(
        v["choices"][0]["message"]["content"],
        want["choices"][0]["text"]
    );
    // Without the option, the assistant turn is closed and a new one opened.
    let (_, closed) = s
        .post("/v1/chat/completions", &chat(messages.clone(), 6))
        .await;
    assert_ne!(
        closed["usage"]["prompt_tokens"],
        v["usage"]["prompt_tokens"]
    );
    // echo: the reply starts with the continued message, streamed or not.
    let echoed = with(body.clone(), json!({"echo": true}));
    let (status, e) = s.post("/v1/chat/completions", &echoed).await;
    assert_eq!(status, 200, "{e}");
    let reply = v["choices"][0]["message"]["content"].as_str().unwrap();
    let want_echo = format!("The capital of France is{reply}");
    assert_eq!(e["choices"][0]["message"]["content"], want_echo.as_str());
    let payloads = s
        .stream(
            "/v1/chat/completions",
            &with(echoed, json!({"stream": true})),
        )
        .await;
    assert_eq!(streamed_text(&payloads).0, want_echo);
    // Both at once is refused by name.
    let both = with(
        chat(messages, 6),
        json!({"continue_final_message": true, "add_generation_prompt": true}),
    );
    let (status, v) = s.post("/v1/chat/completions", &both).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "continue_final_message");

    // Chat logprobs as token ids, streamed and not.
    let body = with(
        chat(json!([{"role": "user", "content": "Hi"}]), 4),
        json!({"logprobs": true, "top_logprobs": 2, "return_tokens_as_token_ids": true}),
    );
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    for c in v["choices"][0]["logprobs"]["content"].as_array().unwrap() {
        assert!(c["token"].as_str().unwrap().starts_with("token_id:"), "{c}");
        for t in c["top_logprobs"].as_array().unwrap() {
            assert!(t["token"].as_str().unwrap().starts_with("token_id:"), "{t}");
        }
    }
    let payloads = s
        .stream("/v1/chat/completions", &with(body, json!({"stream": true})))
        .await;
    let named: Vec<String> = chunks(&payloads)
        .iter()
        .flat_map(|c| {
            c["choices"][0]["logprobs"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|c| c["token"].as_str().unwrap().to_string())
        .collect();
    assert!(!named.is_empty() && named.iter().all(|t| t.starts_with("token_id:")));
}

/// One line of tests/data/request_fields.txt.
struct FieldCase {
    endpoint: String,
    field: String,
    status: String,
    value: Value,
}

fn field_cases() -> Vec<FieldCase> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/request_fields.txt");
    let text = std::fs::read_to_string(path).unwrap();
    // The next word of `s`, and the rest.
    fn word(s: &str) -> (&str, &str) {
        let s = s.trim_start();
        let end = s.find(char::is_whitespace).unwrap_or(s.len());
        (&s[..end], &s[end..])
    }
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (endpoint, rest) = word(l);
            let (field, rest) = word(rest);
            let (status, rest) = word(rest);
            let value = serde_json::from_str(rest.trim()).unwrap_or_else(|e| panic!("{l:?}: {e}"));
            FieldCase {
                endpoint: endpoint.to_string(),
                field: field.to_string(),
                status: status.to_string(),
                value,
            }
        })
        .collect()
}

/// Whether `fn name` is defined in one of the repository's Rust sources.
fn test_exists(spec: &str) -> bool {
    let Some((file, name)) = spec.split_once("::") else {
        return false;
    };
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(file);
    std::fs::read_to_string(path).is_ok_and(|src| src.contains(&format!("fn {name}(")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_schema_field_is_honoured_refused_or_harmless() {
    let s = start(Options::default()).await;
    let cases = field_cases();
    assert!(cases.len() > 90, "{} fields", cases.len());
    let chat_base = chat(json!([{"role": "user", "content": "Name a color."}]), 4);
    let compl_base = greedy("Hello", 4);
    let (_, chat_plain) = s.post("/v1/chat/completions", &chat_base).await;
    let (_, compl_plain) = s.post("/v1/completions", &compl_base).await;
    let mut failures = Vec::new();
    for c in &cases {
        let (path, base, plain) = match c.endpoint.as_str() {
            "chat" => ("/v1/chat/completions", &chat_base, &chat_plain),
            "completions" => ("/v1/completions", &compl_base, &compl_plain),
            e => panic!("unknown endpoint {e}"),
        };
        let what = format!("{} {} ({})", c.endpoint, c.field, c.status);
        if c.value.get(&c.field).is_none() {
            failures.push(format!("{what}: the value does not set the field"));
            continue;
        }
        let (status, v) = s.post(path, &with(base.clone(), c.value.clone())).await;
        match c.status.split_once(':').unwrap_or((&c.status, "")) {
            ("honoured", test) => {
                if status != 200 {
                    failures.push(format!("{what}: {status} {v}"));
                }
                if !test_exists(test) {
                    failures.push(format!("{what}: no behavioural test {test}"));
                }
            }
            ("refused", _) => {
                if status != 400 || v["error"]["param"] != c.field.as_str() {
                    failures.push(format!("{what}: {status} {v}"));
                }
            }
            ("harmless", _) => {
                if status != 200 || v["choices"] != plain["choices"] {
                    failures.push(format!("{what}: {status} {v} (want {plain})"));
                }
            }
            (other, _) => failures.push(format!("{what}: unknown status {other}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
