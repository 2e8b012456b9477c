//! Prompt logprobs through the engine (CPU) against transformers
//! (tests/golden/tiny-llama/prompt_logprobs.json, made by
//! scripts/golden/prompt_logprobs.py: the tiny Llama with pagoda's dummy
//! weights): each prompt token's logprob, rank and top-5 given its
//! prefix; the same values whole, in small prefill chunks, with few
//! logits rows per step, next to other requests, when a cached prefix
//! exists (which such a request does not use), and under preemption.

mod common;

use common::*;
use pagoda_core::{SamplingParams, SchedulerConfig};
use pagoda_engine::prompt_logprobs::PromptLogprob;
use pagoda_engine::{EngineError, EngineRequest, LlmEngine};
use pagoda_kernels::cpu::{CpuBackend, WeightDtype};
use pagoda_model::loader::dummy::DummySource;
use pagoda_model::loader::hf_config::load_config_file;
use std::collections::HashMap;

fn engine(tweak: impl FnOnce(&mut SchedulerConfig)) -> LlmEngine<CpuBackend> {
    let cfg = load_config_file(&repo_root().join("tests/golden/tiny-llama/config.json")).unwrap();
    let src = DummySource::new(&cfg).unwrap();
    let mut sc = scheduler_config(64, 256);
    tweak(&mut sc);
    let runner = cpu_runner(&cfg, &src, WeightDtype::F32, sc.num_blocks);
    LlmEngine::new(runner, None, sc).unwrap()
}

fn golden() -> Vec<(Vec<u32>, serde_json::Value)> {
    let g = read_json("tests/golden/tiny-llama/prompt_logprobs.json");
    g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (ids(&c["prompt_ids"]), c["entries"].clone()))
        .collect()
}

fn request(prompt: &[u32], n: Option<usize>, max_tokens: usize) -> EngineRequest {
    EngineRequest {
        prompt_token_ids: prompt.to_vec(),
        params: SamplingParams {
            prompt_logprobs: n,
            ..SamplingParams::greedy(max_tokens)
        },
        logprobs: None,
    }
}

/// A request's prompt logprobs, output tokens and cached prompt tokens.
type Ran = (Option<Vec<PromptLogprob>>, Vec<u32>, usize);

/// Runs the requests to the end; what each gave, in order.
fn run(e: &mut LlmEngine<CpuBackend>, reqs: Vec<EngineRequest>) -> Vec<Ran> {
    let ids: Vec<_> = reqs
        .into_iter()
        .map(|r| e.add_request(r).unwrap())
        .collect();
    let mut out: HashMap<_, Ran> = HashMap::new();
    while e.has_unfinished_requests() {
        for o in e.step().unwrap() {
            let r = out.entry(o.request_id).or_default();
            if let Some(p) = o.prompt_logprobs {
                assert!(r.0.is_none(), "prompt logprobs handed out twice");
                assert!(r.1.is_empty(), "prompt logprobs after the first output");
                r.0 = Some(p);
            }
            r.1.push(o.token_id);
            r.2 = o.num_cached_tokens;
        }
    }
    ids.iter().map(|id| out.remove(id).unwrap()).collect()
}

fn check_golden(got: &[PromptLogprob], want: &serde_json::Value, what: &str) {
    let want = want.as_array().unwrap();
    assert_eq!(got.len(), want.len(), "{what}: entries");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.token, w["token"].as_u64().unwrap() as u32, "{what} {k}");
        let lp = w["logprob"].as_f64().unwrap() as f32;
        assert!(
            (g.logprob - lp).abs() < 2e-4,
            "{what} {k}: {} vs {lp}",
            g.logprob
        );
        let rank = w["rank"].as_u64().unwrap() as i64;
        // Logits within 1e-5 of each other may order either way.
        assert!(
            (g.rank as i64 - rank).abs() <= 2,
            "{what} {k}: rank {} vs {rank}",
            g.rank
        );
        let top: Vec<u32> = g.top.iter().map(|t| t.0).collect();
        assert_eq!(top, ids(&w["top_ids"]), "{what} {k}: top ids");
        for (t, w) in g.top.iter().zip(floats(&w["top_logprobs"])) {
            assert!(
                (t.1 - w).abs() < 2e-4,
                "{what} {k}: top logprob {} vs {w}",
                t.1
            );
        }
    }
}

#[test]
fn prompt_logprobs_match_transformers_whole_and_chunked() {
    let cases = golden();
    let whole = {
        let mut e = engine(|_| {});
        let reqs = cases.iter().map(|(p, _)| request(p, Some(5), 2)).collect();
        run(&mut e, reqs)
    };
    for ((_, want), (got, _, cached)) in cases.iter().zip(&whole) {
        check_golden(got.as_ref().unwrap(), want, "whole");
        assert_eq!(*cached, 0);
    }
    // Chunks of 7 tokens, and at most 3 logits rows a step (so also chunks
    // of 3), with a request without prompt logprobs alongside.
    for (label, tweak) in [
        (
            "budget 7",
            Box::new(|c: &mut SchedulerConfig| c.max_num_batched_tokens = 7)
                as Box<dyn Fn(&mut SchedulerConfig)>,
        ),
        (
            "3 rows",
            Box::new(|c: &mut SchedulerConfig| c.max_num_seqs = 3),
        ),
    ] {
        let mut e = engine(tweak);
        let mut reqs: Vec<_> = cases.iter().map(|(p, _)| request(p, Some(5), 2)).collect();
        reqs.push(request(&cases[0].0[..9], None, 4));
        let got = run(&mut e, reqs);
        for (k, (_, want)) in cases.iter().enumerate() {
            check_golden(got[k].0.as_ref().unwrap(), want, label);
            assert_eq!(got[k].1, whole[k].1, "{label}: output tokens");
            // The same arithmetic in chunks: the same values.
            let (a, b) = (got[k].0.as_ref().unwrap(), whole[k].0.as_ref().unwrap());
            for (x, y) in a.iter().zip(b) {
                assert!((x.logprob - y.logprob).abs() < 1e-5, "{label}");
            }
        }
        assert!(got[2].0.is_none());
    }
}

#[test]
fn a_cached_prefix_is_not_used_but_still_filled() {
    let cases = golden();
    let prompt = &cases[1].0;
    let mut e = engine(|_| {});
    // Fill the prefix cache with the prompt.
    let first = run(&mut e, vec![request(prompt, None, 1)]);
    assert_eq!(first[0].2, 0);
    let got = run(&mut e, vec![request(prompt, Some(5), 1)]);
    assert_eq!(
        got[0].2, 0,
        "a prompt-logprobs request took a cached prefix"
    );
    check_golden(got[0].0.as_ref().unwrap(), &cases[1].1, "after caching");
    // A later request without the field hits the cache.
    let again = run(&mut e, vec![request(prompt, None, 1)]);
    assert!(again[0].2 > 0, "no prefix cache hit");
}

#[test]
fn preempted_requests_report_each_position_once() {
    let cases = golden();
    // Distinct prompts (identical ones would share their full blocks).
    let prompts: Vec<Vec<u32>> = (0..3u32)
        .map(|i| {
            let mut p = cases[1].0.clone();
            p[0] = 10 + i;
            p
        })
        .collect();
    let reqs = || -> Vec<EngineRequest> {
        prompts
            .iter()
            .map(|p| {
                let mut r = request(p, Some(2), 40);
                r.params.ignore_eos = true;
                r
            })
            .collect()
    };
    let alone: Vec<_> = prompts
        .iter()
        .zip(reqs())
        .map(|(_, r)| run(&mut engine(|_| {}), vec![r]).remove(0))
        .collect();
    // 9 blocks of 16 tokens for requests of 70 + 40 tokens in chunks of
    // 40: a later prompt does not fit next to the first request, which
    // preempts it mid-prompt as it grows; it is recomputed.
    let mut e = engine(|c| {
        c.num_blocks = 9;
        c.max_num_batched_tokens = 40;
    });
    let got = run(&mut e, reqs());
    assert!(e.stats().counters.num_preemptions > 0, "no preemption");
    for (g, a) in got.iter().zip(&alone) {
        let (g, a) = (g.0.as_ref().unwrap(), a.0.as_ref().unwrap());
        assert_eq!(g.len(), cases[1].0.len() - 1);
        for (x, y) in g.iter().zip(a) {
            assert!((x.logprob - y.logprob).abs() < 1e-5);
            assert_eq!(x.top.len(), 2);
            assert_eq!(
                x.top.iter().map(|t| t.0).collect::<Vec<_>>(),
                y.top.iter().map(|t| t.0).collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn zero_alternatives_one_token_prompts_and_limits() {
    let mut e = engine(|_| {});
    let got = run(
        &mut e,
        vec![request(&[5, 6, 7], Some(0), 1), request(&[9], Some(3), 1)],
    );
    let p = got[0].0.as_ref().unwrap();
    assert_eq!(p.len(), 2);
    assert!(p
        .iter()
        .all(|x| x.top.is_empty() && x.logprob < 0.0 && x.rank >= 1));
    assert_eq!(p[0].token, 6);
    assert_eq!(got[1].0.as_deref(), Some(&[][..]));
    match e.add_request(request(&[1, 2], Some(21), 1)) {
        Err(EngineError::InvalidRequest(m)) => assert!(m.contains("at most 20"), "{m}"),
        other => panic!("{other:?}"),
    }
}
