//! Device logit adjustments (`logit_bias`, allowed tokens, bans; see
//! `pagoda_kernels::logit_adjust`) against the host sampler, and the
//! engine's fast path with them:
//! - random bf16 logits rows (32k and 152k vocabularies), greedy and sampled
//!   rows (top-k, top-p, min-p) with biases, bans, allowed lists, all three
//!   or none, some with penalties and logprobs too. The host applies the
//!   same rules (`sampler::apply_logit_rules`) then penalties, rounds to
//!   bf16 (what the device samples from) and samples: the adjusted logits
//!   must agree bit for bit, and every token exactly;
//! - the engine on the tiny Qwen3 (dummy weights) with decode graphs:
//!   requests with a +100 bias, an allowed list, and min_tokens with a
//!   forced stop id keep to their rules while decode steps replay graphs
//!   with one host sync per step.
//!
//! The first comparison also runs without a GPU, fed the host's own
//! results: it must find nothing, so a failure on the GPU is the device's.
//!
//! Without a CUDA device or driver the GPU tests print a notice and pass.
#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::*;
use pagoda_core::{FinishReason, SamplingParams};
use pagoda_engine::logit_rules::LogitRules;
use pagoda_engine::sampler::{
    apply_logit_rules, apply_penalties, sample_with_logprobs, splitmix64, RequestRng,
};
use pagoda_engine::{EngineRequest, LlmEngine, RequestId, SchedulerConfig};
use pagoda_kernels::cuda::testing::sampling_step;
use pagoda_kernels::{Backend, DeviceSamples, SamplingOptions, SamplingRow};
use pagoda_model::loader::dummy::DummySource;
use pagoda_model::loader::hf_config::load_config_file;
use std::collections::HashMap;

const EOS: u32 = 2;

struct Case {
    params: SamplingParams,
    outputs: Vec<u32>,
    seed: u64,
    logprobs: Option<usize>,
}

/// Every filter setting crossed with every rule setting.
fn cases(vocab: usize, s: &mut u64) -> Vec<Case> {
    let filters: [(f32, usize, f32, f32); 4] = [
        (0.0, 0, 1.0, 0.0),
        (1.0, 0, 1.0, 0.0),
        (0.8, 40, 0.9, 0.0),
        (0.7, 0, 1.0, 0.05),
    ];
    let mut out = Vec::new();
    for &(t, k, p, m) in &filters {
        for rule in 0..6 {
            let mut tok = || (splitmix64(s) % vocab as u64) as u32;
            let outputs: Vec<u32> = (0..6).map(|_| tok()).collect();
            let mut params = SamplingParams {
                temperature: t,
                top_k: k,
                top_p: p,
                min_p: m,
                max_tokens: 64,
                ..Default::default()
            };
            match rule {
                0 => {}
                1 => params.logit_bias = (0..30).map(|j| (tok(), j as f32 * 3.0 - 45.0)).collect(),
                2 => params.allowed_token_ids = Some((0..50).map(|_| tok()).collect()),
                3 => {
                    // Bans (min_tokens not reached) on top of biases that
                    // would make the banned tokens win.
                    params.min_tokens = 10;
                    params.stop_token_ids = vec![outputs[0], tok()];
                    params.logit_bias = vec![(EOS, 50.0), (outputs[0], 50.0), (tok(), 20.0)];
                }
                4 => {
                    let allowed: Vec<u32> = (0..20).map(|_| tok()).collect();
                    params.logit_bias = vec![(allowed[3], 8.0), (tok(), 90.0)];
                    params.allowed_token_ids = Some(allowed);
                    params.repetition_penalty = 1.4;
                    params.presence_penalty = 0.5;
                }
                _ => {
                    params.logit_bias = vec![(outputs[2], 30.0)];
                    params.frequency_penalty = 1.0;
                }
            }
            out.push(Case {
                params,
                outputs,
                seed: splitmix64(s),
                logprobs: (rule % 2 == 1).then_some(5),
            });
        }
    }
    out
}

/// The host's logits after rules and penalties, each rounded to bf16 as
/// the device stores them after each kernel.
fn host_adjusted(c: &Case, row: &[f32], vocab: usize) -> Vec<f32> {
    let mut x = row.to_vec();
    if let Some(r) = LogitRules::new(&c.params, &[EOS], None, vocab).unwrap() {
        apply_logit_rules(&mut x, &r, &c.outputs, &mut Vec::new());
    }
    let mut x: Vec<f32> = x.iter().map(|&v| bf(v)).collect();
    apply_penalties(&mut x, &c.params, &[], &c.outputs);
    x.iter().map(|&v| bf(v)).collect()
}

fn batch(vocab: usize, s: &mut u64) -> (Vec<Case>, Vec<f32>, Vec<SamplingRow>, SamplingOptions) {
    let cases = cases(vocab, s);
    let mut logits = Vec::new();
    for _ in &cases {
        logits.extend((0..vocab).map(|_| bf((unit(s) + unit(s) + unit(s) - 1.5) * 4.0)));
    }
    let mut opts = SamplingOptions::default();
    let mut sampling = Vec::new();
    let mut entries = Vec::new();
    for c in &cases {
        let p = &c.params;
        let history = (&[][..], &c.outputs[..]);
        push_sampling_row(&mut sampling, &mut opts, p, c.seed, history, c.logprobs);
        match LogitRules::new(p, &[EOS], None, vocab).unwrap() {
            Some(r) => {
                r.entries(&c.outputs, &mut entries);
                opts.adjust.push_row(&entries, r.allowed());
            }
            None => opts.adjust.push_row(&[], None),
        }
    }
    (cases, logits, sampling, opts)
}

/// Compares device results (`got`, and the logits it left, `after`) with
/// the host: adjusted logits bit for bit, tokens exactly, logprobs close.
fn check_rows(
    cases: &[Case],
    logits: &[f32],
    vocab: usize,
    got: &DeviceSamples,
    after: &[f32],
) -> Vec<String> {
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let what = format!("vocab {vocab} row {i}");
        let row = &logits[i * vocab..(i + 1) * vocab];
        let rounded = host_adjusted(c, row, vocab);
        let dev = &after[i * vocab..(i + 1) * vocab];
        if let Some(j) = (0..vocab).find(|&j| dev[j].to_bits() != rounded[j].to_bits()) {
            failures.push(format!(
                "{what}: adjusted logit {j} is {} on the device, {} on the host",
                dev[j], rounded[j]
            ));
            continue;
        }
        let plain = SamplingParams {
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            ..c.params.clone()
        };
        let want = sample_with_logprobs(
            &mut rounded.clone(),
            &plain,
            &[],
            &[],
            &mut RequestRng::new(c.seed),
            c.logprobs,
        );
        // Greedy rows must agree exactly. A sampled draw may land on the
        // other side of a cumulative-probability boundary (the device sums
        // the probabilities in another order), as the sampling tests accept;
        // the draw must still be a token the rules allow (checked below).
        if got.tokens[i] != want.token {
            if c.params.is_greedy() {
                failures.push(format!(
                    "{what}: greedy token {} on the device, {} on the host",
                    got.tokens[i], want.token
                ));
            } else {
                eprintln!(
                    "{what}: sampled token {} on the device, {} on the host (boundary draw)",
                    got.tokens[i], want.token
                );
            }
        }
        if rounded[got.tokens[i] as usize] == f32::NEG_INFINITY {
            failures.push(format!(
                "{what}: a banned token {} was drawn",
                got.tokens[i]
            ));
        }
        if let (Some(w), Some(Some(d))) = (&want.logprobs, got.logprobs.get(i)) {
            if (w.logprob - d.logprob).abs() > 1e-4 {
                failures.push(format!("{what}: logprob {} vs {}", d.logprob, w.logprob));
            }
        }
    }
    failures
}

#[test]
fn device_logit_adjustments_match_the_host_sampler() {
    let Some(g) = gpu() else { return };
    let mut s = 0xb1a5_u64;
    let mut failures = Vec::new();
    for vocab in [32_000usize, 151_936] {
        let (cases, logits, sampling, opts) = batch(vocab, &mut s);
        let rows = cases.len();
        let t = g.tensor_from_host(rows, vocab, &logits).unwrap();
        let step = g.begin_step_with(&sampling_step(sampling), &opts).unwrap();
        let syncs = g.host_syncs();
        let got = g.sample_full(&t, &step).unwrap();
        assert_eq!(g.host_syncs() - syncs, 1, "one wait for the device");
        let after = g.tensor_to_host(&t).unwrap();
        failures.extend(check_rows(&cases, &logits, vocab, &got, &after));
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_comparison_accepts_the_host_itself() {
    let mut s = 0xb1a5_u64;
    let vocab = 32_000;
    let (cases, logits, _, _) = batch(vocab, &mut s);
    let mut got = DeviceSamples::default();
    let mut after = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let rounded = host_adjusted(c, &logits[i * vocab..(i + 1) * vocab], vocab);
        let plain = SamplingParams {
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            ..c.params.clone()
        };
        let out = sample_with_logprobs(
            &mut rounded.clone(),
            &plain,
            &[],
            &[],
            &mut RequestRng::new(c.seed),
            c.logprobs,
        );
        got.tokens.push(out.token);
        got.logprobs
            .push(out.logprobs.map(|l| pagoda_kernels::RowLogprobs {
                logprob: l.logprob,
                top: l.top,
            }));
        after.extend(rounded);
    }
    let failures = check_rows(&cases, &logits, vocab, &got, &after);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The rules matter: some greedy rows move off their raw argmax.
    let moved = cases
        .iter()
        .enumerate()
        .filter(|(i, c)| {
            c.params.temperature == 0.0
                && pagoda_engine::sampler::argmax(&logits[i * vocab..(i + 1) * vocab])
                    != got.tokens[*i]
        })
        .count();
    assert!(moved >= 3, "only {moved} greedy rows moved");
}

#[test]
fn rules_stay_on_graphs_with_one_sync_per_step() {
    let Some(dev) = gpu() else { return };
    let sched = SchedulerConfig {
        block_size: BLOCK_SIZE,
        num_blocks: 256,
        max_num_batched_tokens: 2048,
        max_num_seqs: 16,
        max_model_len: 256,
        enable_prefix_caching: false,
    };
    let path = repo_root().join("tests/golden/tiny-qwen3/config.json");
    let cfg = load_config_file(&path).unwrap();
    let src = DummySource::new(&cfg).unwrap();
    let mut r = runner(dev, &cfg, &src, sched.num_blocks);
    r.capture_decode_graphs(sched.max_num_seqs, sched.max_model_len)
        .unwrap();
    let mut engine = LlmEngine::new(r, None, sched).unwrap();
    let new_tokens = 12;
    let greedy = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(new_tokens)
    };
    let sampled = SamplingParams {
        temperature: 1.0,
        seed: Some(7),
        ..greedy.clone()
    };
    let allowed = vec![5u32, 17, 80, 301];
    let requests = [
        greedy.clone(),
        SamplingParams {
            logit_bias: vec![(42, 100.0)],
            ..greedy.clone()
        },
        SamplingParams {
            logit_bias: vec![(43, 100.0)],
            ..sampled.clone()
        },
        SamplingParams {
            allowed_token_ids: Some(allowed.clone()),
            ..sampled.clone()
        },
        SamplingParams {
            logit_bias: vec![(99, 100.0)],
            stop_token_ids: vec![99],
            min_tokens: 5,
            ignore_eos: false,
            ..greedy.clone()
        },
    ];
    let mut index: HashMap<RequestId, usize> = HashMap::new();
    for (k, params) in requests.iter().enumerate() {
        let prompt: Vec<u32> = (0..(5 + 7 * k as u32))
            .map(|j| (3 + j * 37) % 500)
            .collect();
        let id = engine
            .add_request(EngineRequest {
                prompt_token_ids: prompt,
                params: params.clone(),
                logprobs: None,
            })
            .unwrap();
        index.insert(id, k);
    }
    let syncs = engine.runner().backend().host_syncs();
    let replays = engine.runner().graph_replays();
    let mut out: Vec<(Vec<u32>, Option<FinishReason>)> = vec![(Vec::new(), None); requests.len()];
    let mut steps = 0u64;
    while engine.has_unfinished_requests() {
        let step = engine.step().unwrap();
        steps += u64::from(!step.is_empty());
        for o in step {
            let e = &mut out[index[&o.request_id]];
            e.0.push(o.token_id);
            e.1 = o.finish_reason;
        }
    }
    let waits = engine.runner().backend().host_syncs() - syncs;
    let replayed = engine.runner().graph_replays() - replays;
    assert_eq!(waits, steps, "one host sync per sampling step");
    assert!(
        replayed >= 4,
        "decode steps with logit rules must replay graphs: {replayed} in {steps} steps"
    );
    assert_eq!(out[1].0, vec![42; new_tokens], "+100 greedy");
    assert_eq!(out[2].0, vec![43; new_tokens], "+100 sampled");
    assert!(out[3].0.iter().all(|t| allowed.contains(t)), "{:?}", out[3]);
    assert_eq!(out[3].0.len(), new_tokens);
    // The stop id is banned for 5 tokens, then (at +100) ends the request.
    assert_eq!(out[4].0.len(), 6, "{:?}", out[4]);
    assert!(!out[4].0[..5].contains(&99), "{:?}", out[4]);
    assert_eq!(out[4].0[5], 99);
    assert_eq!(out[4].1, Some(FinishReason::Stop));
    assert_eq!(out[0].0.len(), new_tokens);
}
