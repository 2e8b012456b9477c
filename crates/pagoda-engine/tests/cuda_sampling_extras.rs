//! Device penalties and logprobs (`Backend::sample_full` on CUDA) against
//! the host sampler (`pagoda_engine::sampler`, the reference semantics), and
//! the engine's fast path with them:
//! - random bf16 logits rows (32k and 152k vocabularies, exact ties
//!   included), a batch mixing greedy and sampled rows (top-k, top-p,
//!   min-p) with and without penalties and logprobs. Against the host
//!   sampler run on the host-penalized logits rounded to bf16 (what the
//!   device samples from), everything is exact: the penalized logits bit
//!   for bit (rows without penalties untouched), every token, the top-k ids
//!   and order, and logprobs within 1e-4. Against the host sampler on the
//!   unrounded logits (the CPU engine's semantics): greedy tokens equal
//!   outside near-ties, logprobs within the bf16 rounding of the penalized
//!   logits;
//! - the engine on the tiny Qwen3 (dummy weights) with decode graphs: a
//!   batch mixing logprobs and penalty requests replays graphs for its
//!   decode steps, syncs with the device once per sampling step, and gives
//!   the CPU engine's greedy tokens (outside near-ties) and logprobs.
//!
//! Both comparisons also run without a GPU, fed the host's own results (the
//! host sampler; the CPU engine on both sides): they must find nothing, so a
//! failure on the GPU is the device's.
//!
//! Without a CUDA device or driver the GPU tests print a notice and pass.
#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::*;
use pagoda_core::SamplingParams;
use pagoda_engine::sampler::{apply_penalties, sample_with_logprobs, splitmix64, RequestRng};
use pagoda_engine::{EngineRequest, LlmEngine, RequestId, SchedulerConfig};
use pagoda_kernels::cpu::{CpuBackend, CpuOptions, WeightDtype};
use pagoda_kernels::cuda::testing::sampling_step;
use pagoda_kernels::{Backend, DeviceSamples, RowLogprobs, SamplingOptions, SamplingRow};
use pagoda_model::loader::dummy::DummySource;
use pagoda_model::loader::hf_config::load_config_file;
use std::collections::HashMap;

/// One row of the batch.
struct Case {
    params: SamplingParams,
    prompt: Vec<u32>,
    outputs: Vec<u32>,
    logprobs: Option<usize>,
    seed: u64,
}

/// Every filter setting crossed with every option setting.
fn cases(vocab: usize, s: &mut u64) -> Vec<Case> {
    let filters: [(f32, usize, f32, f32); 6] = [
        (0.0, 0, 1.0, 0.0),
        (0.8, 0, 1.0, 0.0),
        (0.8, 40, 1.0, 0.0),
        (1.0, 0, 0.9, 0.0),
        (0.7, 0, 1.0, 0.05),
        (1.2, 100, 0.8, 0.02),
    ];
    // (repetition, frequency, presence, logprobs)
    let options: [(f32, f32, f32, Option<usize>); 7] = [
        (1.0, 0.0, 0.0, None),
        (1.0, 0.0, 0.0, Some(5)),
        (1.3, 0.4, 0.6, None),
        (1.3, 0.4, 0.6, Some(20)),
        (1.0, 0.0, 0.0, Some(0)),
        (0.8, 0.0, 0.0, Some(3)),
        (1.0, 0.5, -0.3, Some(7)),
    ];
    let mut out = Vec::new();
    for &(t, k, p, m) in &filters {
        for &(rep, freq, pres, lp) in &options {
            let prompt: Vec<u32> = (0..40)
                .map(|_| (splitmix64(s) % vocab as u64) as u32)
                .collect();
            // Outputs repeat a few tokens (some also in the prompt).
            let pool: Vec<u32> = (0..8)
                .map(|j| {
                    if j < 2 {
                        prompt[j * 7]
                    } else {
                        (splitmix64(s) % vocab as u64) as u32
                    }
                })
                .collect();
            let outputs: Vec<u32> = (0..25)
                .map(|_| pool[(splitmix64(s) % pool.len() as u64) as usize])
                .collect();
            out.push(Case {
                params: SamplingParams {
                    temperature: t,
                    top_k: k,
                    top_p: p,
                    min_p: m,
                    repetition_penalty: rep,
                    frequency_penalty: freq,
                    presence_penalty: pres,
                    ..SamplingParams::default()
                },
                prompt,
                outputs,
                logprobs: lp,
                seed: splitmix64(s),
            });
        }
    }
    out
}

/// Logits of one row: noise, some prompt tokens high or low, the output
/// tokens on top and a rival just below them (so penalties move the top),
/// rounded to bf16 (ties occur).
fn logits_row(c: &Case, vocab: usize, s: &mut u64) -> Vec<f32> {
    let mut x: Vec<f32> = (0..vocab)
        .map(|_| (unit(s) + unit(s) + unit(s) - 1.5) * 4.0)
        .collect();
    for (j, &t) in c.prompt.iter().enumerate() {
        if j % 3 == 0 {
            x[t as usize] = 5.0 + unit(s) * 3.0 - if j % 2 == 0 { 10.0 } else { 0.0 };
        }
    }
    // The outputs lead; a rival outside the history overtakes them once
    // they are penalized.
    for &t in &c.outputs {
        x[t as usize] = 7.5 + unit(s) * 1.5;
    }
    loop {
        let r = (splitmix64(s) % vocab as u64) as u32;
        if !c.prompt.contains(&r) && !c.outputs.contains(&r) {
            x[r as usize] = 7.0 + unit(s) * 0.4;
            break;
        }
    }
    x.iter().map(|&v| bf(v)).collect()
}

#[test]
fn device_penalties_and_logprobs_match_the_host_sampler() {
    let Some(g) = gpu() else { return };
    let mut s = 0x5eed_u64;
    let mut found = Found::default();
    for vocab in [32_000usize, 151_936] {
        let (cases, logits, sampling, opts) = batch(vocab, &mut s);
        let rows = cases.len();
        let t = g.tensor_from_host(rows, vocab, &logits).unwrap();
        let step = g.begin_step_with(&sampling_step(sampling), &opts).unwrap();
        let syncs = g.host_syncs();
        let got = g.sample_full(&t, &step).unwrap();
        assert_eq!(g.host_syncs() - syncs, 1, "one wait for the device");
        let after = g.tensor_to_host(&t).unwrap();
        assert_eq!(got.tokens.len(), rows);
        assert_eq!(got.logprobs.len(), rows, "one logprobs entry per row");
        check_rows(&cases, &logits, vocab, &got, &after, &mut found);
    }
    eprintln!(
        "device penalties + logprobs: {} logprob rows checked, {} near-ties excused against \
         the unrounded host",
        found.checked_lps, found.near_ties
    );
    assert!(
        found.checked_lps >= 40,
        "only {} logprob rows",
        found.checked_lps
    );
    assert!(
        found.failures.is_empty(),
        "{} failures:\n{}",
        found.failures.len(),
        found.failures.join("\n")
    );
}

/// The comparison itself, fed the host sampler's own results as the
/// "device" ones (no GPU needed): it must find nothing, so a failure on the
/// GPU is the device's.
#[test]
fn the_comparison_accepts_the_host_sampler_itself() {
    let mut s = 0x5eed_u64;
    let vocab = 32_000;
    let (cases, logits, _, _) = batch(vocab, &mut s);
    let mut got = DeviceSamples::default();
    let mut after = Vec::with_capacity(logits.len());
    for (i, c) in cases.iter().enumerate() {
        let mut pen = logits[i * vocab..(i + 1) * vocab].to_vec();
        apply_penalties(&mut pen, &c.params, &c.prompt, &c.outputs);
        let rounded: Vec<f32> = pen.iter().map(|&v| bf(v)).collect();
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
        got.logprobs.push(out.logprobs.map(|l| RowLogprobs {
            logprob: l.logprob,
            top: l.top,
        }));
        after.extend(rounded);
    }
    let mut found = Found::default();
    check_rows(&cases, &logits, vocab, &got, &after, &mut found);
    assert_eq!(found.checked_lps, 30, "logprob rows of one vocabulary");
    assert!(
        found.failures.is_empty(),
        "{} failures:\n{}",
        found.failures.len(),
        found.failures.join("\n")
    );
    // Penalties change something: some rows' tokens move.
    let moved = cases
        .iter()
        .enumerate()
        .filter(|(i, c)| {
            let row = &logits[i * vocab..(i + 1) * vocab];
            has_penalties(&c.params)
                && c.params.temperature < 1e-5
                && pagoda_engine::sampler::argmax(row) != got.tokens[*i]
        })
        .count();
    assert!(moved > 0, "no greedy row's token moved under penalties");
}

/// The batch of one vocabulary size: its cases, logits rows, sampling
/// rows and options (history pairs for penalized rows, as the engine builds
/// them).
fn batch(vocab: usize, s: &mut u64) -> (Vec<Case>, Vec<f32>, Vec<SamplingRow>, SamplingOptions) {
    let cases = cases(vocab, s);
    let mut logits = Vec::with_capacity(cases.len() * vocab);
    for c in &cases {
        logits.extend(logits_row(c, vocab, s));
    }
    let mut opts = SamplingOptions::default();
    let mut sampling = Vec::new();
    for c in &cases {
        let history = (&c.prompt[..], &c.outputs[..]);
        push_sampling_row(
            &mut sampling,
            &mut opts,
            &c.params,
            c.seed,
            history,
            c.logprobs,
        );
    }
    (cases, logits, sampling, opts)
}

/// What a comparison found.
#[derive(Default)]
struct Found {
    failures: Vec<String>,
    near_ties: usize,
    checked_lps: usize,
}

/// Compares the device's results (`got`, and the logits it left, `after`)
/// with the host sampler, row by row (see the module docs).
fn check_rows(
    cases: &[Case],
    logits: &[f32],
    vocab: usize,
    got: &DeviceSamples,
    after: &[f32],
    found: &mut Found,
) {
    let failures = &mut found.failures;
    for (i, c) in cases.iter().enumerate() {
        let what = format!(
            "vocab {vocab} row {i} (T {} k {} p {} min_p {}, penalties {}/{}/{}, logprobs {:?})",
            c.params.temperature,
            c.params.top_k,
            c.params.top_p,
            c.params.min_p,
            c.params.repetition_penalty,
            c.params.frequency_penalty,
            c.params.presence_penalty,
            c.logprobs
        );
        let row = &logits[i * vocab..(i + 1) * vocab];
        // Reference 1: host penalties, rounded to bf16, then the host
        // sampler without penalties: exactly what the device computes.
        let mut pen = row.to_vec();
        apply_penalties(&mut pen, &c.params, &c.prompt, &c.outputs);
        let rounded: Vec<f32> = pen.iter().map(|&v| bf(v)).collect();
        let dev_row = &after[i * vocab..(i + 1) * vocab];
        if let Some(j) = (0..vocab).find(|&j| dev_row[j].to_bits() != rounded[j].to_bits()) {
            failures.push(format!(
                "{what}: penalized logit {j} is {} on the device, {} on the host (raw {})",
                dev_row[j], rounded[j], row[j]
            ));
            continue;
        }
        let plain = SamplingParams {
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            ..c.params.clone()
        };
        let mut scratch = rounded.clone();
        let want = sample_with_logprobs(
            &mut scratch,
            &plain,
            &[],
            &[],
            &mut RequestRng::new(c.seed),
            c.logprobs,
        );
        let got_token = got.tokens[i];
        let greedy = c.params.temperature < 1e-5;
        let t_eff = if greedy { 1.0 } else { c.params.temperature };
        // The host walks a top-p candidate list in an unspecified order
        // (its nucleus selection partitions), the device in rank order:
        // with top-p the same draw may name another kept token. Either
        // way the top logprobs and the token's logprob must agree.
        let same_walk = greedy || c.params.top_p >= 1.0;
        if got_token != want.token && same_walk {
            failures.push(format!(
                "{what}: device token {got_token}, host token {} (on the same bf16 logits)",
                want.token
            ));
            continue;
        }
        let got_lp = &got.logprobs[i];
        match (&want.logprobs, got_lp) {
            (None, None) => {}
            (Some(w), Some(d)) => {
                found.checked_lps += 1;
                let close = |a: f32, b: f32| (a == b) || (a - b).abs() <= 1e-4 + 1e-5 * b.abs();
                // The host's logprob of the device's token: the kept
                // set's total is the same, so it differs from the host
                // token's by the difference of their scaled logits.
                let want_lp = w.logprob
                    + (rounded[got_token as usize] / t_eff - rounded[want.token as usize] / t_eff);
                if !close(d.logprob, want_lp) {
                    failures.push(format!(
                            "{what}: token {got_token} logprob {} on the device, {want_lp} on the host \
                             (host token {} at {})",
                            d.logprob, want.token, w.logprob
                        ));
                }
                let ids = |v: &[(u32, f32)]| v.iter().map(|e| e.0).collect::<Vec<_>>();
                if ids(&d.top) != ids(&w.top)
                    || d.top.iter().zip(&w.top).any(|(a, b)| !close(a.1, b.1))
                {
                    failures.push(format!(
                        "{what}: top logprobs\n  device {:?}\n  host   {:?}",
                        d.top, w.top
                    ));
                }
            }
            (w, d) => failures.push(format!(
                "{what}: logprobs {} on the device, {} on the host",
                d.is_some(),
                w.is_some()
            )),
        }

        // Reference 2: the host sampler on the unrounded logits (the CPU
        // engine's semantics). Greedy rows only for tokens (a sampled
        // draw may cross a rounded boundary); logprobs within the bf16
        // rounding of the penalized logits.
        let mut scratch = row.to_vec();
        let exact = sample_with_logprobs(
            &mut scratch,
            &c.params,
            &c.prompt,
            &c.outputs,
            &mut RequestRng::new(c.seed),
            c.logprobs,
        );
        let scale = pen.iter().fold(0f32, |m, v| m.max(v.abs()));
        let tol = 2.0 * scale / 256.0 / t_eff + 1e-4;
        if greedy && exact.token != got_token {
            let (a, b) = (pen[exact.token as usize], pen[got_token as usize]);
            if (a - b).abs() <= tol * t_eff {
                found.near_ties += 1;
                eprintln!("near-tie excused: {what}: host {a} vs device {b}");
                continue;
            }
            failures.push(format!(
                    "{what}: greedy token {got_token} differs from the host's {} (penalized logits {b} vs {a})",
                    exact.token
                ));
            continue;
        }
        if let (Some(w), Some(d)) = (&exact.logprobs, got_lp) {
            if exact.token == got_token && (d.logprob - w.logprob).abs() > tol {
                failures.push(format!(
                    "{what}: token logprob {} vs unrounded host {} (tolerance {tol:.2e})",
                    d.logprob, w.logprob
                ));
            }
            for (j, (a, b)) in d.top.iter().zip(&w.top).enumerate() {
                if (a.1 - b.1).abs() > tol {
                    failures.push(format!(
                            "{what}: top logprob {j}: {a:?} vs unrounded host {b:?} (tolerance {tol:.2e})"
                        ));
                } else if a.0 != b.0 {
                    // Ranks may swap only between near-equal entries.
                    let neighbours = [j.checked_sub(1), Some(j + 1)];
                    let tie = neighbours
                        .iter()
                        .flatten()
                        .any(|&k| w.top.get(k).is_none_or(|e| (e.1 - b.1).abs() <= 2.0 * tol));
                    if tie {
                        found.near_ties += 1;
                    } else {
                        failures.push(format!(
                            "{what}: top id {j}: {} vs unrounded host {} (not a near-tie)",
                            a.0, b.0
                        ));
                    }
                }
            }
        }
    }
}

/// Requests of the engine test: (prompt index, logprobs, penalties).
fn mixed_requests() -> Vec<(usize, Option<usize>, bool)> {
    vec![
        (0, None, false),
        (1, Some(5), false),
        (2, None, true),
        (3, Some(20), true),
        (4, Some(0), false),
        (5, None, false),
        (6, Some(3), true),
        (7, None, true),
    ]
}

/// 8 prompts of 3 to 70 tokens; the first four share a 20-token prefix.
fn prompts() -> Vec<Vec<u32>> {
    let shared: Vec<u32> = (0..20).map(|j| (7 + j * 53) % 500).collect();
    [9usize, 31, 20, 55, 3, 17, 70, 40]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let fresh = (0..n).map(|j| (3 + (i * 131 + j * 37) % 500) as u32);
            if i < 4 {
                shared.iter().copied().chain(fresh).collect()
            } else {
                fresh.collect()
            }
        })
        .collect()
}

const NEW_TOKENS: usize = 24;

/// Per request, each step's token and logprobs (when asked for).
type Trace = Vec<Vec<(u32, Option<pagoda_engine::sampler::TokenLogprobs>)>>;

/// Submits the mixed requests (`all_logprobs`: every request asks for 20,
/// for the CPU reference's near-tie gaps) and runs them to the end; returns
/// the trace and the number of steps that sampled.
fn run_mixed<B: Backend>(engine: &mut LlmEngine<B>, all_logprobs: bool) -> (Trace, u64) {
    let ps = prompts();
    let reqs = mixed_requests();
    let mut index: HashMap<RequestId, usize> = HashMap::new();
    for (k, &(p, lp, pen)) in reqs.iter().enumerate() {
        let mut params = SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(NEW_TOKENS)
        };
        if pen {
            params.repetition_penalty = 1.5;
            params.frequency_penalty = 0.5;
            params.presence_penalty = 0.5;
        }
        let id = engine
            .add_request(EngineRequest {
                prompt_token_ids: ps[p].clone(),
                params,
                logprobs: if all_logprobs { Some(20) } else { lp },
            })
            .unwrap();
        index.insert(id, k);
    }
    let mut out: Trace = vec![Vec::new(); reqs.len()];
    let mut sampling_steps = 0;
    while engine.has_unfinished_requests() {
        let step = engine.step().unwrap();
        sampling_steps += u64::from(!step.is_empty());
        for o in step {
            out[index[&o.request_id]].push((o.token_id, o.logprobs));
        }
    }
    (out, sampling_steps)
}

#[test]
fn penalties_and_logprobs_stay_on_graphs_with_one_sync_per_step_and_match_the_cpu_engine() {
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

    // Reference: the CPU engine (bf16 weights, host sampler).
    let cpu = CpuBackend::new(CpuOptions {
        threads: 2,
        weight_dtype: WeightDtype::BF16,
    })
    .unwrap();
    let mut host = LlmEngine::new(
        runner(cpu, &cfg, &src, sched.num_blocks),
        None,
        sched.clone(),
    )
    .unwrap();
    let (want, _) = run_mixed(&mut host, true);
    drop(host);

    let mut r = runner(dev, &cfg, &src, sched.num_blocks);
    r.capture_decode_graphs(sched.max_num_seqs, sched.max_model_len)
        .unwrap();
    let mut engine = LlmEngine::new(r, None, sched).unwrap();
    let syncs = engine.runner().backend().host_syncs();
    let replays = engine.runner().graph_replays();
    let (got, sampling_steps) = run_mixed(&mut engine, false);
    let waits = engine.runner().backend().host_syncs() - syncs;
    let replayed = engine.runner().graph_replays() - replays;
    eprintln!("mixed batch: {sampling_steps} sampling steps, {waits} host syncs, {replayed} graph replays");
    assert_eq!(waits, sampling_steps, "one host sync per sampling step");
    // One prefill step, then every step is a decode of all 8 requests.
    assert!(
        replayed + 1 >= sampling_steps,
        "decode steps with penalties/logprobs must replay graphs: {replayed} replays in \
         {sampling_steps} steps"
    );

    let (failures, excused, compared) = compare_mixed(&got, &want);
    assert!(compared >= 4, "logprobs compared at {compared} steps only");
    eprintln!(
        "mixed batch against the CPU engine: logprobs compared at {compared} steps, {excused} \
         near-ties excused"
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Compares a mixed run (`got`) with the reference run that asked every
/// request for 20 logprobs (`want`): tokens up to the first difference
/// (excused at near-ties), logprobs at every step compared. Returns the
/// failures, the excused near-ties and the steps whose logprobs compared.
fn compare_mixed(got: &Trace, want: &Trace) -> (Vec<String>, usize, usize) {
    let reqs = mixed_requests();
    let mut failures = Vec::new();
    let (mut excused, mut compared) = (0, 0);
    for (k, &(p, lp, pen)) in reqs.iter().enumerate() {
        assert_eq!(got[k].len(), NEW_TOKENS, "request {k}: token count");
        for (s, ((gt, glp), (wt, wlp))) in got[k].iter().zip(&want[k]).enumerate() {
            let what =
                format!("request {k} (prompt {p}, logprobs {lp:?}, penalties {pen}) step {s}");
            let w = wlp.as_ref().expect("the reference asked for logprobs");
            let gap = w.top[0].1 - w.top.get(1).map_or(f32::NEG_INFINITY, |t| t.1);
            let tol = |b: f32| 0.05 + 0.02 * b.abs();
            // Logprobs first: both engines saw the same tokens up to here.
            match (lp, glp) {
                (None, None) => {}
                (Some(n), Some(g)) => {
                    compared += 1;
                    if gt == wt && (g.logprob - w.logprob).abs() > tol(w.logprob) {
                        failures.push(format!(
                            "{what}: token logprob {} on CUDA, {} on the CPU",
                            g.logprob, w.logprob
                        ));
                    }
                    if g.top.len() != n.min(w.top.len()) {
                        failures.push(format!(
                            "{what}: {} top logprobs on CUDA for {n} asked",
                            g.top.len()
                        ));
                    }
                    for (j, (a, b)) in g.top.iter().zip(&w.top).enumerate() {
                        // Values agree rank by rank; ids may swap only
                        // between near-equal entries.
                        let near = [j.checked_sub(1), Some(j + 1)]
                            .iter()
                            .flatten()
                            .any(|&i| w.top.get(i).is_none_or(|e| (e.1 - b.1).abs() <= 0.05));
                        if (a.1 - b.1).abs() > tol(b.1) || (a.0 != b.0 && !near) {
                            failures
                                .push(format!("{what}: top {j}: {a:?} on CUDA, {b:?} on the CPU"));
                        }
                    }
                }
                (want_lp, g) => failures.push(format!(
                    "{what}: logprobs asked {want_lp:?}, CUDA returned {}",
                    g.is_some()
                )),
            }
            if gt != wt {
                if gap <= 0.05 {
                    excused += 1;
                    eprintln!("near-tie excused: {what}: top-2 logprob gap {gap:.3e}");
                } else {
                    failures.push(format!(
                        "{what}: token {gt} on CUDA, {wt} on the CPU (top-2 gap {gap:.3e})"
                    ));
                }
                // Past a difference the sequences legitimately part.
                break;
            }
        }
    }
    (failures, excused, compared)
}

/// The comparison fed the CPU engine on both sides (no GPU needed): it
/// must find nothing, so a failure on the GPU is the device's.
#[test]
fn the_mixed_comparison_accepts_the_cpu_engine_itself() {
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
    let engine = || {
        let cpu = CpuBackend::new(CpuOptions {
            threads: 2,
            weight_dtype: WeightDtype::BF16,
        })
        .unwrap();
        LlmEngine::new(
            runner(cpu, &cfg, &src, sched.num_blocks),
            None,
            sched.clone(),
        )
        .unwrap()
    };
    let (want, _) = run_mixed(&mut engine(), true);
    let (got, _) = run_mixed(&mut engine(), false);
    let (failures, excused, compared) = compare_mixed(&got, &want);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(excused, 0);
    // Every step of the 4 requests asking for logprobs.
    assert_eq!(compared, 4 * NEW_TOKENS);
}
