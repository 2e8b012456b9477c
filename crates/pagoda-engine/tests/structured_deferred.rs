//! Structured outputs ended one step late (the default): a request whose
//! grammar its token completes is ended at the next step's mask join, on
//! an output without a token, instead of the engine waiting for the
//! guides' advance before emitting (`PAGODA_GUIDE_DEFER=off`, the old
//! order). On the default model (CPU), fixed seeds: the outputs' tokens,
//! text and finish reasons are those of the old order, offline and
//! streamed, with schemas that complete early and late, under preemption,
//! with `max_tokens` or a stop string ending a request on the token that
//! completes its grammar (the old order's reason wins), under
//! `ignore_eos`; and a request aborted or paused between its grammar's
//! completion and its detection loses nothing and gets nothing more.

mod common;

use common::*;
use pagoda_core::{FinishReason, RequestId, SamplingParams, StructuredOutput};
use pagoda_engine::{EngineHandle, EngineRequest, HandleOptions, LlmEngine};
use pagoda_kernels::cpu::CpuBackend;
use pagoda_model::tokenizer::{ChatMessage, Tokenizer};
use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Order {
    /// The default: ended at the next join.
    Defer,
    /// `PAGODA_GUIDE_DEFER=off`: ended on the completing token.
    Wait,
}

/// The variable is read when an engine makes its structured side (at its
/// first constrained request): one engine at a time in this file.
static ENV: Mutex<()> = Mutex::new(());

fn with_order<T>(order: Order, f: impl FnOnce() -> T) -> T {
    let _guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
    std::env::remove_var("PAGODA_MASK_PIPELINE");
    match order {
        Order::Defer => std::env::remove_var("PAGODA_GUIDE_DEFER"),
        Order::Wait => std::env::set_var("PAGODA_GUIDE_DEFER", "off"),
    }
    let out = f();
    std::env::remove_var("PAGODA_GUIDE_DEFER");
    out
}

const PERSON: &str = r#"{"type":"object","properties":{
  "name":{"type":"string","maxLength":12},
  "age":{"type":"integer","minimum":0,"maximum":120},
  "tags":{"type":"array","items":{"enum":["a","b","c"]},"minItems":1,"maxItems":3}},
  "required":["name","age","tags"],"additionalProperties":false}"#;

const FLAG: &str = r#"{"type":"object","properties":{"ok":{"type":"boolean"}},
  "required":["ok"],"additionalProperties":false}"#;

/// Request `i`: five constraints in turn (two complete within a few
/// tokens), sampled on seeds, some greedy.
fn request(tok: &Tokenizer, i: usize, max_tokens: usize) -> EngineRequest {
    let text = tok
        .chat_template()
        .unwrap()
        .apply(
            &[ChatMessage::new(
                "user",
                format!("Describe item number {i} of my list as JSON."),
            )],
            true,
        )
        .unwrap();
    let structured = match i % 5 {
        0 | 3 => StructuredOutput::JsonSchema(PERSON.into()),
        1 => StructuredOutput::Choice(vec!["red".into(), "green".into(), "blue".into()]),
        2 => StructuredOutput::Regex("(yes|no), [a-z]{1,12}\\.".into()),
        _ => StructuredOutput::JsonSchema(FLAG.into()),
    };
    EngineRequest {
        prompt_token_ids: tok.encode(&text, false).unwrap(),
        params: SamplingParams {
            temperature: if i % 4 == 3 { 0.0 } else { 0.9 },
            seed: Some(100 + i as u64),
            max_tokens,
            structured: Some(structured),
            ..SamplingParams::default()
        },
        logprobs: None,
    }
}

/// What one request got.
#[derive(Debug, Clone, Default, PartialEq)]
struct Got {
    tokens: Vec<u32>,
    text: String,
    finish: Option<FinishReason>,
    /// Outputs without a token (at most one, the last).
    no_token: usize,
}

/// Runs `reqs` to their end on `e`, one step at a time; `hook(step, e,
/// ids, got)` runs before each step. Checks that nothing follows a
/// request's last output and that an output without a token is a last one.
fn drive(
    e: &mut LlmEngine<CpuBackend>,
    reqs: Vec<EngineRequest>,
    mut hook: impl FnMut(usize, &mut LlmEngine<CpuBackend>, &[RequestId], &[Got]),
) -> Vec<Got> {
    let mut got = vec![Got::default(); reqs.len()];
    let mut index = HashMap::new();
    let mut ids = Vec::new();
    for (i, r) in reqs.into_iter().enumerate() {
        let id = e.add_request(r).unwrap();
        index.insert(id, i);
        ids.push(id);
    }
    let mut step = 0;
    while e.has_unfinished_requests() {
        hook(step, e, &ids, &got);
        for o in e.step().unwrap() {
            let g = &mut got[index[&o.request_id]];
            assert_eq!(g.finish, None, "an output after the last one: {o:?}");
            if o.no_token {
                assert!(
                    o.finish_reason.is_some(),
                    "a tokenless output that does not end"
                );
                assert_eq!(o.num_output_tokens, g.tokens.len());
                g.no_token += 1;
            } else {
                g.tokens.push(o.token_id);
                assert_eq!(o.num_output_tokens, g.tokens.len());
            }
            g.text.push_str(&o.text_delta);
            g.finish = o.finish_reason;
        }
        step += 1;
        assert!(step < 3000, "the run does not end");
    }
    got
}

fn run(
    order: Order,
    blocks: usize,
    reqs: impl FnOnce(&Tokenizer) -> Vec<EngineRequest>,
) -> (Vec<Got>, u64) {
    with_order(order, || {
        let (mut e, tok) = default_engine(blocks);
        let out = drive(&mut e, reqs(&tok), |_, _, _, _| {});
        (out, e.stats().counters.num_preemptions)
    })
}

/// Same tokens, text and finish reasons; the deferred run has one
/// tokenless end exactly where its grammar ended the request.
fn assert_same(defer: &[Got], wait: &[Got]) {
    for (i, (d, w)) in defer.iter().zip(wait).enumerate() {
        assert_eq!(d.tokens, w.tokens, "request {i}");
        assert_eq!(d.text, w.text, "request {i}");
        assert_eq!(d.finish, w.finish, "request {i}");
        assert_eq!(w.no_token, 0, "request {i}");
        assert!(d.no_token <= 1, "request {i}");
    }
}

#[test]
fn deferred_ends_give_the_old_orders_outputs_under_preemption() {
    // 10 blocks of 16 for 10 requests of ~40 + up to 60 tokens: some are
    // preempted and recomputed; some end by max_tokens (the long ones).
    let reqs = |tok: &Tokenizer| (0..10).map(|i| request(tok, i, 60)).collect();
    let (wait, _) = run(Order::Wait, 10, reqs);
    let (defer, preemptions) = run(Order::Defer, 10, reqs);
    assert!(preemptions > 0, "no preemption");
    assert_same(&defer, &wait);
    let late = defer.iter().filter(|g| g.no_token == 1).count();
    assert!(late >= 5, "few requests ended by their grammar: {defer:?}");
    for g in &defer {
        if g.no_token == 1 {
            assert_eq!(g.finish, Some(FinishReason::Stop));
        }
    }
}

#[test]
fn max_tokens_or_a_stop_string_on_the_completing_token_wins_as_before() {
    let base = |tok: &Tokenizer| (0..5).map(|i| request(tok, i, 60)).collect::<Vec<_>>();
    let (plain, _) = run(Order::Wait, 256, base);
    for g in &plain {
        assert_eq!(g.finish, Some(FinishReason::Stop), "{g:?}");
    }
    // max_tokens ends each request on its grammar's last token: length.
    let lens: Vec<usize> = plain.iter().map(|g| g.tokens.len()).collect();
    let capped = |tok: &Tokenizer| {
        let mut r = base(tok);
        for (r, &n) in r.iter_mut().zip(&lens) {
            r.params.max_tokens = n;
        }
        r
    };
    let (wait, _) = run(Order::Wait, 256, capped);
    let (defer, _) = run(Order::Defer, 256, capped);
    assert_same(&defer, &wait);
    for g in &defer {
        assert_eq!(g.finish, Some(FinishReason::Length));
        assert_eq!(g.no_token, 0);
    }
    // A stop string that the last token completes.
    let last: Vec<String> = plain
        .iter()
        .map(|g| g.text.chars().last().unwrap().to_string())
        .collect();
    let stopped = |tok: &Tokenizer| {
        let mut r = base(tok);
        for (r, s) in r.iter_mut().zip(&last) {
            r.params.stop = vec![s.clone()];
        }
        r
    };
    let (wait, _) = run(Order::Wait, 256, stopped);
    let (defer, _) = run(Order::Defer, 256, stopped);
    assert_same(&defer, &wait);
    for (g, p) in defer.iter().zip(&plain) {
        assert_eq!(g.finish, Some(FinishReason::Stop));
        assert!(g.tokens.len() <= p.tokens.len());
    }
}

#[test]
fn a_complete_grammar_ends_the_request_under_ignore_eos() {
    let reqs = |tok: &Tokenizer| {
        (0..5)
            .map(|i| {
                let mut r = request(tok, i, 60);
                r.params.ignore_eos = true;
                r
            })
            .collect::<Vec<_>>()
    };
    let (wait, _) = run(Order::Wait, 256, reqs);
    let (defer, _) = run(Order::Defer, 256, reqs);
    assert_same(&defer, &wait);
    // Each ends with its document, nothing after: the choice is exactly
    // one of its strings, the regex's text ends with its period.
    for (i, g) in defer.iter().enumerate() {
        assert_eq!(g.finish, Some(FinishReason::Stop), "request {i}");
        assert_eq!(g.no_token, 1, "request {i}");
        match i % 5 {
            1 => assert!(["red", "green", "blue"].contains(&g.text.as_str()), "{g:?}"),
            2 => assert!(g.text.ends_with('.'), "{g:?}"),
            _ => {
                serde_json::from_str::<serde_json::Value>(&g.text).unwrap();
            }
        }
    }
}

#[test]
fn aborts_and_pauses_between_completion_and_detection_lose_nothing() {
    let reqs = |tok: &Tokenizer| (0..6).map(|i| request(tok, i, 60)).collect::<Vec<_>>();
    let (wait, _) = run(Order::Wait, 256, reqs);
    let (want, _) = run(Order::Defer, 256, reqs);
    assert_same(&want, &wait);
    // Requests 1 (a choice) and 4 (a short schema) complete early: abort
    // 1 and pause 4 right after the step that emitted their last token,
    // before the step that detects it; resume 4 two steps later.
    let (aborted, paused) = (1, 4);
    for i in [aborted, paused] {
        assert_eq!(
            want[i].no_token, 1,
            "request {i} did not end by its grammar"
        );
    }
    let mut acted = [None::<usize>; 2];
    let got = with_order(Order::Defer, || {
        let (mut e, tok) = default_engine(256);
        drive(&mut e, reqs(&tok), |step, e, ids, got| {
            for (k, &i) in [aborted, paused].iter().enumerate() {
                let done = got[i].tokens.len() == want[i].tokens.len();
                if done && got[i].finish.is_none() && acted[k].is_none() {
                    acted[k] = Some(step);
                    if k == 0 {
                        e.abort(ids[i]).unwrap();
                    } else {
                        e.pause(ids[i]).unwrap();
                    }
                }
            }
            if acted[1].is_some_and(|s| step == s + 2) {
                e.resume(ids[paused]).unwrap();
            }
        })
    });
    assert!(acted.iter().all(Option::is_some), "{acted:?}");
    // The aborted request got nothing more.
    assert_eq!(got[aborted].tokens, want[aborted].tokens);
    assert_eq!(got[aborted].finish, None);
    assert_eq!(got[aborted].no_token, 0);
    // The paused one ends as it would have, the others are untouched.
    for i in (0..6).filter(|&i| i != aborted) {
        assert_eq!(got[i], want[i], "request {i}");
    }
}

#[test]
fn streams_give_the_old_orders_outputs() {
    let reqs = |tok: &Tokenizer| (0..6).map(|i| request(tok, i, 60)).collect::<Vec<_>>();
    let stream = |order: Order| {
        with_order(order, || {
            let (e, tok) = default_engine(256);
            let options = HandleOptions {
                pause_backlog: None,
                ..HandleOptions::default()
            };
            let handle = EngineHandle::spawn_with(e, options).unwrap();
            // One at a time: no batch effects between the two orders.
            let mut out = Vec::new();
            for r in reqs(&tok) {
                let mut s = handle.blocking_submit(r).unwrap();
                let mut g = Got::default();
                while let Some(item) = s.blocking_next() {
                    let o = item.unwrap();
                    assert_eq!(g.finish, None);
                    if o.no_token {
                        g.no_token += 1;
                    } else {
                        g.tokens.push(o.token_id);
                    }
                    g.text.push_str(&o.text_delta);
                    g.finish = o.finish_reason;
                }
                out.push(g);
            }
            let stats = handle.blocking_stats().unwrap();
            let tokens: usize = out.iter().map(|g| g.tokens.len()).sum();
            assert_eq!(stats.counters.generation_tokens, tokens as u64);
            out
        })
    };
    let wait = stream(Order::Wait);
    let defer = stream(Order::Defer);
    assert_same(&defer, &wait);
    assert!(defer.iter().any(|g| g.no_token == 1));
}
