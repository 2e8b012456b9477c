//! Text off the engine thread: the threaded engine decodes no text, each
//! stream decodes its own and finds its stop strings; its outputs must equal
//! `LlmEngine::step`'s (text decoded on the engine's thread) output for
//! output, for stop strings across token boundaries, `include_stop_str_in_output`,
//! `min_tokens`, stop tokens and logprobs. Also: a stop string found by the
//! stream ends the request in the engine (blocks back, counted as `stop`),
//! and a step's outputs reach the streams in one hand-over.
//!
//! The tiny Qwen3 model (dummy weights, vocabulary 512) with SmolLM2's
//! tokenizer, seeded sampling so the text varies.

mod common;

use common::tiny::MAX_MODEL_LEN;
use common::{cpu_runner, repo_root, scheduler_config};
use pagoda_core::SamplingParams;
use pagoda_engine::{
    EngineHandle, EngineRequest, FinishReason, HandleOptions, LlmEngine, RequestOutput,
};
use pagoda_kernels::cpu::{CpuBackend, WeightDtype};
use pagoda_model::loader::dummy::DummySource;
use pagoda_model::loader::hf_config::load_config_file;
use pagoda_model::tokenizer::Tokenizer;
use std::collections::HashMap;
use std::sync::Arc;

const NUM_BLOCKS: usize = 128;

fn engine() -> LlmEngine<CpuBackend> {
    let path = repo_root().join("tests/golden/tiny-qwen3/config.json");
    let cfg = load_config_file(&path).unwrap();
    let src = DummySource::new(&cfg).unwrap();
    let runner = cpu_runner(&cfg, &src, WeightDtype::F32, NUM_BLOCKS);
    let tok =
        Tokenizer::from_hf_file(repo_root().join("tests/golden/smollm2-tokenizer/tokenizer.json"))
            .unwrap();
    LlmEngine::new(
        runner,
        Some(Arc::new(tok)),
        scheduler_config(NUM_BLOCKS, MAX_MODEL_LEN),
    )
    .unwrap()
}

fn prompt(i: usize) -> Vec<u32> {
    (0..7 + 5 * i)
        .map(|j| (40 + (i * 97 + j * 31) % 400) as u32)
        .collect()
}

fn sampled(seed: u64, max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        ignore_eos: true,
        ..SamplingParams::greedy(max_tokens)
    }
}

fn request(i: usize, params: SamplingParams, logprobs: Option<usize>) -> EngineRequest {
    EngineRequest {
        prompt_token_ids: prompt(i),
        params,
        logprobs,
    }
}

/// Each request run alone on the engine's own thread (text decoded there).
fn offline(requests: &[EngineRequest]) -> Vec<Vec<RequestOutput>> {
    let mut e = engine();
    requests
        .iter()
        .map(|r| {
            let id = e.add_request(r.clone()).unwrap();
            let mut outs = Vec::new();
            while e.has_unfinished_requests() {
                outs.extend(e.step().unwrap().into_iter().filter(|o| o.request_id == id));
            }
            outs
        })
        .collect()
}

fn text(outs: &[RequestOutput]) -> String {
    outs.iter().map(|o| o.text_delta.as_str()).collect()
}

/// The same request under variations of its stop options, where the stop
/// string is taken across a token boundary of the request's own text.
fn cases() -> Vec<EngineRequest> {
    let base = request(1, sampled(5, 40), None);
    let plain = offline(std::slice::from_ref(&base)).remove(0);
    assert_eq!(plain.len(), 40);
    // A boundary after output k where both sides have at least two chars.
    let chars = |s: &str| s.chars().count();
    let k = (5..plain.len() - 1)
        .find(|&k| chars(&plain[k].text_delta) >= 2 && chars(&plain[k + 1].text_delta) >= 2)
        .expect("a token boundary with text on both sides");
    let left: String = {
        let c: Vec<char> = plain[k].text_delta.chars().collect();
        c[c.len() - 2..].iter().collect()
    };
    let right: String = plain[k + 1].text_delta.chars().take(2).collect();
    let stop = format!("{left}{right}");
    let full = text(&plain);
    let at = full.find(&stop).unwrap();
    // Where the stop string first completes, in outputs.
    let stop_output = (0..plain.len())
        .find(|&i| text(&plain[..=i]).len() >= at + stop.len())
        .unwrap();
    let with = |f: &dyn Fn(&mut SamplingParams), logprobs| {
        let mut r = base.clone();
        f(&mut r.params);
        r.logprobs = logprobs;
        r
    };
    vec![
        base.clone(),
        with(&|p| p.stop = vec![stop.clone()], None),
        with(
            &|p| {
                p.stop = vec!["never here".into(), stop.clone()];
                p.include_stop_str_in_output = true;
            },
            Some(3),
        ),
        // min_tokens past the first match: the stop string is looked for later.
        with(
            &|p| {
                p.stop = vec![stop.clone()];
                p.min_tokens = stop_output + 2;
            },
            None,
        ),
        // A stop token, its text dropped then kept.
        with(&|p| p.stop_token_ids = vec![plain[k].token_id], Some(2)),
        with(
            &|p| {
                p.stop_token_ids = vec![plain[k].token_id];
                p.include_stop_str_in_output = true;
            },
            None,
        ),
        // A stop string that never completes but whose prefix is held back.
        with(&|p| p.stop = vec![format!("{left}\u{1}")], None),
    ]
}

#[test]
fn streams_decode_the_same_text_as_the_engine_thread() {
    let cases = cases();
    let want = offline(&cases);
    assert!(
        want[1].len() < 40 && want[1].last().unwrap().finish_reason == Some(FinishReason::Stop),
        "the stop string ends the request early"
    );
    assert!(want[2].len() == want[1].len() && text(&want[2]).len() > text(&want[1]).len());

    // One at a time: the same engine state as offline (no batch effects; no
    // pauses, which would recompute the prompt and count a cached prefix).
    let options = HandleOptions {
        pause_backlog: None,
        ..HandleOptions::default()
    };
    let handle = EngineHandle::spawn_with(engine(), options).unwrap();
    let mut generated = 0;
    let mut stopped = 0;
    for (i, (r, want)) in cases.iter().zip(&want).enumerate() {
        let mut stream = handle.blocking_submit(r.clone()).unwrap();
        let mut got = Vec::new();
        while let Some(item) = stream.blocking_next() {
            got.push(item.unwrap());
        }
        // The engine's request ids differ; the rest is the same.
        for o in &mut got {
            o.request_id = want[0].request_id;
        }
        assert_eq!(&got, want, "case {i}");
        generated += got.len() as u64;
        stopped += u64::from(got.last().unwrap().finish_reason == Some(FinishReason::Stop));
    }
    // Requests the streams ended are gone from the engine, counted as stops
    // with their tokens up to the stop.
    let stats = handle.blocking_stats().unwrap();
    assert_eq!(stats.num_in_flight, 0);
    assert_eq!(stats.scheduler.num_running + stats.scheduler.num_waiting, 0);
    assert_eq!(stats.counters.num_finished_stop, stopped, "{stats:?}");
    assert_eq!(stats.counters.num_aborted, 0);
    assert_eq!(stats.counters.generation_tokens, generated);
}

#[tokio::test(flavor = "current_thread")]
async fn concurrent_streams_get_one_hand_over_per_step() {
    // Many concurrent requests, some ending on stop strings found by their
    // streams, against each run alone.
    let mut reqs: Vec<EngineRequest> = (0..12)
        .map(|i| request(i, sampled(100 + i as u64, 24), (i % 3 == 0).then_some(2)))
        .collect();
    let plain = offline(&reqs);
    for (i, r) in reqs.iter_mut().enumerate().filter(|(i, _)| i % 2 == 1) {
        // A stop string spanning outputs 9 and 10 of the plain text, if any.
        let t9 = &plain[i][9].text_delta;
        let t10 = &plain[i][10].text_delta;
        if let (Some(a), Some(b)) = (t9.chars().last(), t10.chars().next()) {
            r.params.stop = vec![format!("{a}{b}")];
        }
    }
    let want = offline(&reqs);

    let handle = EngineHandle::spawn(engine()).unwrap();
    let mut tasks = Vec::new();
    for r in reqs.iter().cloned() {
        let mut stream = handle.submit(r).await.unwrap();
        tasks.push(tokio::spawn(async move {
            let mut outs = Vec::new();
            while let Some(item) = stream.next().await {
                outs.push(item.unwrap());
            }
            outs
        }));
    }
    let mut by_id = HashMap::new();
    for (i, t) in tasks.into_iter().enumerate() {
        let got = t.await.unwrap();
        let tokens: Vec<u32> = got.iter().map(|o| o.token_id).collect();
        let want_tokens: Vec<u32> = want[i].iter().map(|o| o.token_id).collect();
        assert_eq!(tokens, want_tokens, "request {i}");
        assert_eq!(text(&got), text(&want[i]), "request {i}");
        assert_eq!(
            got.last().unwrap().finish_reason,
            want[i].last().unwrap().finish_reason
        );
        by_id.insert(i, got);
    }
    let stats = handle.stats().await.unwrap();
    let c = stats.counters;
    assert!(
        c.num_handovers <= c.num_steps,
        "at most one hand-over per step: {c:?}"
    );
    assert!(c.num_handovers > 0);
    // Fewer hand-overs than outputs: outputs of one step travel together.
    let outputs: usize = by_id.values().map(Vec::len).sum();
    assert!((c.num_handovers as usize) < outputs, "{c:?}");
    assert_eq!(stats.num_in_flight, 0);
}
