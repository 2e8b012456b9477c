//! Stop strings found off the engine thread, through the HTTP API: a stop
//! string made of the end of one token and the start of the next ends the
//! text at the same place, streamed and not, with and without
//! `include_stop_str_in_output`, with logprobs and `n` > 1, and the usage
//! counts the tokens up to the stop; the engine then holds none of the
//! requests.

mod common;

use common::*;
use serde_json::{json, Value};

/// A greedy completion that never stops on EOS, with logprobs.
fn body(max_tokens: usize) -> Value {
    json!({
        "model": MODEL_NAME,
        "prompt": "Once upon a time, in a small village by the sea,",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": true,
        "logprobs": 1,
    })
}

fn with(mut body: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Per choice index: streamed text, finish reason, logprob tokens.
fn streamed(payloads: &[String], n: usize) -> Vec<(String, Value, usize)> {
    let mut out = vec![(String::new(), Value::Null, 0); n];
    for c in chunks(payloads) {
        for ch in c["choices"].as_array().unwrap() {
            let o = &mut out[ch["index"].as_u64().unwrap() as usize];
            o.0.push_str(ch["text"].as_str().unwrap_or(""));
            if !ch["finish_reason"].is_null() {
                o.1 = ch["finish_reason"].clone();
            }
            if let Some(t) = ch["logprobs"]["tokens"].as_array() {
                o.2 += t.len();
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_across_tokens_end_the_text_the_same_streamed_or_not() {
    let s = start(Options::default()).await;
    let (status, plain) = s.post("/v1/completions", &body(40)).await;
    assert_eq!(status, 200, "{plain}");
    let text = plain["choices"][0]["text"].as_str().unwrap().to_string();
    let offsets: Vec<usize> = plain["choices"][0]["logprobs"]["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let start = offsets[0];
    let rel: Vec<usize> = offsets.iter().map(|o| o - start).collect();
    // A boundary (after token k) with two ASCII chars of text on each side.
    let k = (3..rel.len() - 2)
        .find(|&k| {
            let (a, b, c) = (rel[k], rel[k + 1], rel[k + 2]);
            b >= a + 2
                && c >= b + 2
                && text.is_char_boundary(b - 2)
                && text.is_char_boundary(b + 2)
                && text[b - 2..b + 2].is_ascii()
        })
        .expect("a token boundary with text on both sides");
    let boundary = rel[k + 1];
    let stop = text[boundary - 2..boundary + 2].to_string();
    let at = text.find(&stop).unwrap();
    // Tokens up to the one that completes the stop string.
    let tokens_to_stop = rel.iter().take_while(|&&o| o < at + stop.len()).count();
    assert!(tokens_to_stop < 40);

    for include in [false, true] {
        let end = if include { at + stop.len() } else { at };
        let req = with(
            body(40),
            json!({"stop": ["never appears", stop.clone()], "include_stop_str_in_output": include, "n": 2}),
        );
        let (status, v) = s.post("/v1/completions", &req).await;
        assert_eq!(status, 200, "{v}");
        for c in v["choices"].as_array().unwrap() {
            assert_eq!(c["text"], text[..end], "include {include}: {v}");
            assert_eq!(c["finish_reason"], "stop");
            let lp = c["logprobs"]["tokens"].as_array().unwrap().len();
            assert_eq!(lp, tokens_to_stop, "logprobs up to the stop: {v}");
        }
        assert_eq!(
            v["usage"]["completion_tokens"],
            2 * tokens_to_stop,
            "usage counts the tokens up to the stop: {v}"
        );
        let payloads = s
            .stream("/v1/completions", &with(req, json!({"stream": true})))
            .await;
        for (i, (t, finish, lp)) in streamed(&payloads, 2).into_iter().enumerate() {
            assert_eq!(t, text[..end], "streamed choice {i}, include {include}");
            assert_eq!(finish, "stop");
            assert_eq!(lp, tokens_to_stop, "streamed logprobs, choice {i}");
        }
    }
    let stats = s.handle.stats().await.unwrap();
    assert_eq!(stats.num_in_flight, 0, "{stats:?}");
    assert_eq!(stats.scheduler.num_running + stats.scheduler.num_waiting, 0);
    // The plain request ran to its length; the eight others stopped.
    assert_eq!(stats.counters.num_finished_stop, 8, "{stats:?}");
    assert_eq!(stats.counters.num_aborted, 0, "{stats:?}");
}
