//! vLLM's `prompt_logprobs` over HTTP on the default model: the shape
//! (a list, `null` first, then token id -> `{logprob, rank,
//! decoded_token}` objects) on completion choices and at the top of chat
//! responses; a prompt made of transformers' own greedy continuation
//! (tests/golden/smollm2_q4_1.json) gives rank 1 to each continued token
//! with transformers' top tokens around it; the same values in chunks of
//! 4 rows, and after the prompt was cached (the request uses no cached
//! prefix); streaming and counts over 20 are a 400.

mod common;

use common::*;
use serde_json::{json, Value};

fn golden() -> Value {
    let path = format!(
        "{}/../../tests/golden/smollm2_q4_1.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// `(token, logprob, rank)` of each entry after the first, checking the shape.
fn entries(list: &Value, prompt: &[u64], n: usize) -> Vec<(Value, f64, u64)> {
    let list = list.as_array().expect("prompt_logprobs is a list");
    assert_eq!(list.len(), prompt.len());
    assert!(list[0].is_null());
    list[1..]
        .iter()
        .zip(&prompt[1..])
        .map(|(e, &tok)| {
            let m = e.as_object().unwrap();
            let own = &m[&tok.to_string()];
            let rank = own["rank"].as_u64().unwrap();
            assert!(
                m.len() == n + 1 || (m.len() == n && rank <= n as u64),
                "{e}"
            );
            for v in m.values() {
                assert!(v["logprob"].as_f64().unwrap() <= 0.0);
                assert!(v["decoded_token"].is_string());
            }
            (e.clone(), own["logprob"].as_f64().unwrap(), rank)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_logprobs_on_completions_follow_transformers() {
    let s = start(Options::default()).await;
    let g = golden();
    let main = &g["main"];
    let prompt = ids(&main["prompt_ids"]);
    let out = ids(&main["output_ids"]);
    // The prompt and transformers' first 6 greedy tokens.
    let mut full = prompt.clone();
    full.extend(&out[..6]);
    let body = json!({"model": MODEL_NAME, "prompt": full, "max_tokens": 1,
        "temperature": 0, "prompt_logprobs": 5});
    let (status, v) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let got = entries(&v["choices"][0]["prompt_logprobs"], &full, 5);
    for (k, step) in main["steps"].as_array().unwrap()[..6].iter().enumerate() {
        let (e, _, rank) = &got[prompt.len() - 1 + k];
        assert_eq!(*rank, 1, "greedy token {k}: {e}");
        // transformers' top 3 are among the listed alternatives.
        for id in &ids(&step["top_ids"])[..3] {
            assert!(
                e.get(id.to_string()).is_some(),
                "step {k}: {id} missing in {e}"
            );
        }
    }
    assert_eq!(v["usage"]["prompt_tokens"], full.len());

    // Cached first (a plain request), then asked again: no cached prefix
    // is used, and the values stay.
    let plain = json!({"model": MODEL_NAME, "prompt": full, "max_tokens": 1, "temperature": 0});
    let (_, v2) = s.post("/v1/completions", &plain).await;
    assert!(
        v2["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    let (_, v3) = s.post("/v1/completions", &body).await;
    assert_eq!(v3["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let again = entries(&v3["choices"][0]["prompt_logprobs"], &full, 5);
    for (a, b) in got.iter().zip(&again) {
        assert!((a.1 - b.1).abs() < 1e-4, "{} vs {}", a.1, b.1);
    }

    // Streaming, and more than 20 alternatives, are refused.
    let mut b = body.clone();
    b["stream"] = json!(true);
    let (status, v) = s.post("/v1/completions", &b).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "prompt_logprobs");
    let mut b = body.clone();
    b["prompt_logprobs"] = json!(21);
    let (status, v) = s.post("/v1/completions", &b).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "prompt_logprobs");

    // In chunks of at most 4 logits rows: the same values.
    let small = start(Options {
        max_num_seqs: 4,
        ..Default::default()
    })
    .await;
    let (status, v4) = small.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{v4}");
    let chunked = entries(&v4["choices"][0]["prompt_logprobs"], &full, 5);
    for (a, b) in got.iter().zip(&chunked) {
        assert!((a.1 - b.1).abs() < 1e-3, "{} vs {}", a.1, b.1);
        assert_eq!(a.2, b.2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_puts_prompt_logprobs_at_the_top_and_zero_lists_only_the_token() {
    let s = start(Options::default()).await;
    let body = json!({"model": MODEL_NAME, "max_tokens": 2, "temperature": 0, "n": 2,
        "messages": [{"role": "user", "content": "Hi there"}], "prompt_logprobs": 0});
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let list = v["prompt_logprobs"]
        .as_array()
        .expect("top-level prompt_logprobs");
    assert_eq!(
        list.len() as u64,
        v["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert!(list[0].is_null());
    for e in &list[1..] {
        assert_eq!(e.as_object().unwrap().len(), 1, "{e}");
    }
    assert!(v["choices"][0].get("prompt_logprobs").is_none());
    // Without the field, none.
    let mut b = body.clone();
    b.as_object_mut().unwrap().remove("prompt_logprobs");
    let (_, v) = s.post("/v1/chat/completions", &b).await;
    assert!(v.get("prompt_logprobs").is_none(), "{v}");
}
