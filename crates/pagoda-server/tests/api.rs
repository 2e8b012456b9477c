//! The API against a real server on the default model: every endpoint,
//! streaming against non-streaming, logprobs, `n` with seeds, stop strings,
//! echo, concurrency, and prefix-cache reuse reported in `usage`.
//! References are independent of the HTTP layer: the engine handle driven
//! directly, the tokenizer, and the same requests sent one at a time.

mod common;

use common::*;
use pagoda_core::SamplingParams;
use pagoda_engine::EngineRequest;
use serde_json::{json, Value};

/// Greedy text of `prompt` through the engine handle, bypassing HTTP.
async fn engine_text(s: &TestServer, prompt: &str, max_tokens: usize) -> (String, usize) {
    let ids = s.tokenizer.encode(prompt, true).unwrap();
    let mut stream = s
        .handle
        .submit(EngineRequest {
            prompt_token_ids: ids,
            params: SamplingParams::greedy(max_tokens),
            logprobs: None,
        })
        .await
        .unwrap();
    let mut text = String::new();
    let mut n = 0;
    while let Some(item) = stream.next().await {
        let out = item.unwrap();
        text.push_str(&out.text_delta);
        n = out.num_output_tokens;
    }
    (text, n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_tokenize_detokenize_metrics() {
    let s = start(Options::default()).await;
    let (status, body) = s.get("/health").await;
    assert_eq!((status, body.as_str()), (200, ""));

    let (status, body) = s.get("/v1/models").await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL_NAME);
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(v["data"][0]["max_model_len"], 2048);

    let text = "The quick brown fox jumps over the lazy dog.";
    let want = s.tokenizer.encode(text, true).unwrap();
    let (status, v) = s.post("/tokenize", &json!({"prompt": text})).await;
    assert_eq!(status, 200, "{v}");
    let got: Vec<u32> = serde_json::from_value(v["tokens"].clone()).unwrap();
    assert_eq!(got, want);
    assert_eq!(v["count"], want.len());
    assert_eq!(v["max_model_len"], 2048);

    let messages = json!([{"role": "user", "content": "Hi there"}]);
    let (status, v) = s.post("/tokenize", &json!({"messages": messages})).await;
    assert_eq!(status, 200, "{v}");
    let chat_ids: Vec<u32> = serde_json::from_value(v["tokens"].clone()).unwrap();
    let rendered = s.tokenizer.decode(&chat_ids, false).unwrap();
    assert!(
        rendered.contains("<|im_start|>user\nHi there<|im_end|>"),
        "{rendered}"
    );
    assert!(rendered.ends_with("<|im_start|>assistant\n"), "{rendered}");

    let (status, v) = s.post("/detokenize", &json!({"tokens": want})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["prompt"], s.tokenizer.decode(&want, false).unwrap());

    s.post("/v1/completions", &greedy("Hello", 4)).await;
    let (status, text) = s.get("/metrics").await;
    assert_eq!(status, 200);
    assert!(parse_metric(&text, "pagoda_generation_tokens_total") >= 1.0);
    assert!(parse_metric(&text, "pagoda_prompt_tokens_total") >= 1.0);
    assert!(parse_metric(&text, "pagoda_kv_cache_blocks_total") == 1024.0);
    assert!(parse_metric(&text, "pagoda_time_to_first_token_seconds_count") >= 1.0);
    assert!(parse_metric(&text, "pagoda_e2e_request_latency_seconds_count") >= 1.0);
    assert!(
        text.contains("pagoda_requests_total{status=\"200\"}"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_match_the_engine_and_streams_concatenate() {
    let s = start(Options::default()).await;
    let prompt = "The capital of France is";
    let (want, want_tokens) = engine_text(&s, prompt, 24).await;

    let (status, v) = s.post("/v1/completions", &greedy(prompt, 24)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], MODEL_NAME);
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["choices"][0]["text"], want.as_str());
    assert_eq!(v["choices"][0]["index"], 0);
    let prompt_len = s.tokenizer.encode(prompt, true).unwrap().len();
    assert_eq!(v["usage"]["prompt_tokens"], prompt_len);
    assert_eq!(v["usage"]["completion_tokens"], want_tokens);
    assert_eq!(v["usage"]["total_tokens"], prompt_len + want_tokens);
    assert!(v["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());
    let reason = if want_tokens == 24 { "length" } else { "stop" };
    assert_eq!(v["choices"][0]["finish_reason"], reason);

    // The same prompt as token ids, and in a list with another prompt.
    let ids = s.tokenizer.encode(prompt, true).unwrap();
    let body = json!({"prompt": ids, "max_tokens": 24, "temperature": 0});
    let (_, v) = s.post("/v1/completions", &body).await;
    assert_eq!(v["choices"][0]["text"], want.as_str());
    let other = "Water is made of";
    let (want_other, _) = engine_text(&s, other, 12).await;
    let body = json!({"prompt": [prompt, other], "max_tokens": 12, "temperature": 0});
    let (_, v) = s.post("/v1/completions", &body).await;
    let (want12, _) = engine_text(&s, prompt, 12).await;
    assert_eq!(v["choices"][0]["text"], want12.as_str());
    assert_eq!(v["choices"][1]["text"], want_other.as_str());
    assert_eq!(v["choices"][1]["index"], 1);
    let other_ids = s.tokenizer.encode(other, true).unwrap();
    let body = json!({"prompt": [ids, other_ids], "max_tokens": 12, "temperature": 0});
    let (_, v) = s.post("/v1/completions", &body).await;
    assert_eq!(v["choices"][1]["text"], want_other.as_str());

    // Streaming: chunks concatenate to the same text; usage at the end.
    let mut body = greedy(prompt, 24);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let chunks = chunks(&s.stream("/v1/completions", &body).await);
    let text: String = chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap().iter())
        .map(|c| c["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, want);
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"].as_array().unwrap().len(), 0);
    assert_eq!(last["usage"]["completion_tokens"], want_tokens);
    assert_eq!(last["usage"]["prompt_tokens"], prompt_len);
    let finishing = &chunks[chunks.len() - 2]["choices"][0];
    assert_eq!(finishing["finish_reason"], reason);

    // Echo puts the prompt in front.
    let mut body = greedy(prompt, 8);
    body["echo"] = json!(true);
    let (_, v) = s.post("/v1/completions", &body).await;
    let (want8, _) = engine_text(&s, prompt, 8).await;
    assert_eq!(v["choices"][0]["text"], format!("{prompt}{want8}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_renders_the_template_and_streams_role_then_content() {
    let s = start(Options::default()).await;
    let messages = json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Name a primary color."}]}
    ]);
    let body = json!({"model": MODEL_NAME, "messages": messages, "max_completion_tokens": 20,
                      "temperature": 0, "user": "someone"});
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();

    // Reference: the same template rendering through /tokenize ids, run greedily.
    let template = s.tokenizer.chat_template().unwrap();
    let text = template
        .apply(
            &[
                pagoda_model::tokenizer::ChatMessage::new("system", "You are terse."),
                pagoda_model::tokenizer::ChatMessage::new("user", "Name a primary color."),
            ],
            true,
        )
        .unwrap();
    let ids = s.tokenizer.encode(&text, false).unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], ids.len());
    let body_ids = json!({"prompt": ids, "max_tokens": 20, "temperature": 0});
    let (_, c) = s.post("/v1/completions", &body_ids).await;
    assert_eq!(c["choices"][0]["text"].as_str().unwrap(), content);

    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let chunks = chunks(&s.stream("/v1/chat/completions", &stream_body).await);
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, content);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        v["choices"][0]["finish_reason"]
    );
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_have_openai_shapes_and_agree_with_greedy_choice() {
    let s = start(Options::default()).await;
    let mut body = greedy("Once upon a time", 10);
    body["logprobs"] = json!(3);
    body["ignore_eos"] = json!(true);
    let (status, v) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 10);
    assert_eq!(v["usage"]["completion_tokens"], 10);
    let text = v["choices"][0]["text"].as_str().unwrap();
    let joined: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, text);
    let offsets: Vec<usize> = serde_json::from_value(lp["text_offset"].clone()).unwrap();
    assert_eq!(offsets[0], 0);
    for i in 0..10 {
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(chosen <= 0.0);
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 3);
        // Greedy: the chosen token is the most likely one.
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!((best - chosen).abs() < 1e-5, "{best} vs {chosen}");
        assert_eq!(top[tokens[i].as_str().unwrap()].as_f64().unwrap(), chosen);
        if i > 0 {
            assert_eq!(
                offsets[i],
                offsets[i - 1] + tokens[i - 1].as_str().unwrap().len()
            );
        }
    }

    let body = json!({"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 6,
                      "temperature": 0, "logprobs": true, "top_logprobs": 2, "ignore_eos": true});
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 6);
    for c in content {
        let bytes: Vec<u8> = serde_json::from_value(c["bytes"].clone()).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            c["token"].as_str().unwrap()
        );
        let top = c["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(top[0]["token"], c["token"]);
        assert!(top[0]["logprob"].as_f64().unwrap() >= top[1]["logprob"].as_f64().unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_use_consecutive_seeds_and_stop_strings_cut_the_text() {
    let s = start(Options::default()).await;
    let prompt = "List three fruits:";
    let sampled = |seed: u64, n: usize| {
        json!({"prompt": prompt, "max_tokens": 12, "temperature": 1.0, "top_p": 0.9,
               "seed": seed, "n": n, "ignore_eos": true})
    };
    let (status, v) = s.post("/v1/completions", &sampled(11, 3)).await;
    assert_eq!(status, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        let (_, single) = s.post("/v1/completions", &sampled(11 + i as u64, 1)).await;
        assert_eq!(c["text"], single["choices"][0]["text"], "choice {i}");
    }
    assert_eq!(v["usage"]["completion_tokens"], 36);
    assert_eq!(
        v["usage"]["prompt_tokens"],
        s.tokenizer.encode(prompt, true).unwrap().len()
    );

    // A stop string taken from the middle of the greedy text.
    let (_, g) = s.post("/v1/completions", &greedy(prompt, 30)).await;
    let full = g["choices"][0]["text"].as_str().unwrap().to_string();
    let cut = full.char_indices().nth(full.chars().count() / 2).unwrap().0;
    let stop: String = full[cut..].chars().take(3).collect();
    let at = full.find(&stop).unwrap();
    let mut body = greedy(prompt, 30);
    body["stop"] = json!(["never-appears", stop]);
    let (_, v) = s.post("/v1/completions", &body).await;
    assert_eq!(v["choices"][0]["text"], &full[..at]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    body["stream"] = json!(true);
    let chunks = chunks(&s.stream("/v1/completions", &body).await);
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, &full[..at]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_equal_the_same_requests_one_at_a_time() {
    let s = start(Options::default()).await;
    let subjects = [
        "the sea",
        "a mountain",
        "bread",
        "winter",
        "a violin",
        "the moon",
        "rivers",
        "a library",
        "coffee",
        "trains",
        "a garden",
        "the desert",
        "clocks",
        "rain",
        "a lighthouse",
        "honey",
    ];
    let bodies: Vec<Value> = subjects
        .iter()
        .map(|x| {
            json!({"prompt": format!("Write one sentence about {x}."), "max_tokens": 16,
                   "temperature": 0, "stream": true})
        })
        .collect();
    let mut sequential = Vec::new();
    for b in &bodies {
        let mut body = b.clone();
        body["stream"] = json!(false);
        let (_, v) = s.post("/v1/completions", &body).await;
        sequential.push(v["choices"][0]["text"].as_str().unwrap().to_string());
    }
    // 64 concurrent streams: each of the 16 requests four times over.
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let client = s.client.clone();
            let url = s.url("/v1/completions");
            let body = bodies[i % bodies.len()].clone();
            tokio::spawn(async move {
                let r = client.post(url).json(&body).send().await.unwrap();
                sse_payloads(&r.text().await.unwrap())
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let chunks = chunks(&t.await.unwrap());
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["text"].as_str())
            .collect();
        assert_eq!(text, sequential[i % sequential.len()], "stream {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_longer_conversation_reuses_the_cached_prefix() {
    let s = start(Options::default()).await;
    let mut messages = vec![
        json!({"role": "system", "content": "You are a helpful assistant."}),
        json!({"role": "user", "content": "What is the tallest mountain on Earth?"}),
    ];
    let body = json!({"messages": messages, "max_tokens": 24, "temperature": 0});
    let (status, first) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{first}");
    let first_prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    let reply = first["choices"][0]["message"]["content"].as_str().unwrap();
    messages.push(json!({"role": "assistant", "content": reply}));
    messages.push(json!({"role": "user", "content": "And the second tallest?"}));
    let body = json!({"messages": messages, "max_tokens": 8, "temperature": 0});
    let (status, second) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{second}");
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= first_prompt,
        "cached {cached} < first prompt {first_prompt}: {second}"
    );
    assert!(cached < second["usage"]["prompt_tokens"].as_u64().unwrap());
    assert!(s.metric("pagoda_prefix_cache_hits_total").await >= first_prompt as f64);
}
