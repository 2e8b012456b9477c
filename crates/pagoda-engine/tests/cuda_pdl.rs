//! Programmatic dependent launch (PDL) changes no result: tiny golden
//! models (dummy weights) run the same work on two backends, one launching
//! with PDL and one without, and every number must agree bit for bit:
//! - eager steps (one prefill of every golden prompt, then teacher-forced
//!   decode steps): the logits of every step;
//! - decode steps replaying CUDA graphs (captured with the same setting):
//!   an engine run of greedy requests asking for 20 logprobs each, the
//!   tokens and logprobs of every step (graph replays sample on the
//!   device, so the logits show through the log-softmax's top 20 and the
//!   chosen token's value), and graphs must have replayed.
//!
//! Every kernel waits for the previous one's writes before it reads, so the
//! same kernels over the same inputs compute the same bits in either mode;
//! a kernel reading too early would show as a difference here.
//!
//! Without a CUDA device or driver the test prints a notice and passes; on
//! a GPU without PDL (before compute capability 9.0) both sides launch
//! without it and the test says so.
#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::*;
use pagoda_core::SamplingParams;
use pagoda_engine::sampler::TokenLogprobs;
use pagoda_engine::{EngineRequest, LlmEngine, RequestId, SchedulerConfig};
use pagoda_kernels::cuda::CudaBackend;
use std::collections::HashMap;

const FORCED_STEPS: usize = 6;
const NEW_TOKENS: usize = 12;

/// Per request, each step's token and logprobs.
type Trace = Vec<Vec<(u32, Option<TokenLogprobs>)>>;

/// What one backend computed for a model.
struct Run {
    /// Eager steps: `logits[seq][step]`.
    logits: Vec<Vec<Vec<f32>>>,
    /// The engine run on decode graphs.
    trace: Trace,
    replays: u64,
}

/// A fresh backend with PDL `on`, or `None` without a GPU. Also says
/// whether PDL is in effect.
fn backend(on: bool) -> Option<(CudaBackend, bool)> {
    let b = gpu()?;
    let effective = b.set_pdl(on);
    Some((b, effective))
}

fn run(arch: &str, dev: CudaBackend) -> Run {
    let g = tiny_golden(arch, FORCED_STEPS + NEW_TOKENS);
    // Teacher-forced eager steps on fixed tokens (both sides alike).
    let forced: Vec<Vec<u32>> = (0..g.prompts.len())
        .map(|i| {
            (0..FORCED_STEPS)
                .map(|j| (3 + i * 17 + j * 29) as u32 % g.cfg.vocab_size as u32)
                .collect()
        })
        .collect();
    let sched = SchedulerConfig {
        block_size: BLOCK_SIZE,
        num_blocks: g.blocks,
        max_num_batched_tokens: 2048,
        max_num_seqs: 8,
        max_model_len: 256,
        enable_prefix_caching: false,
    };
    let mut r = runner(dev, &g.cfg, &g.src, g.blocks);
    let logits = forced_trace(&mut r, &g.prompts, &forced);
    r.capture_decode_graphs(sched.max_num_seqs, sched.max_model_len)
        .unwrap();
    let mut engine = LlmEngine::new(r, None, sched).unwrap();
    let mut index: HashMap<RequestId, usize> = HashMap::new();
    for (k, p) in g.prompts.iter().enumerate() {
        let id = engine
            .add_request(EngineRequest {
                prompt_token_ids: p.clone(),
                params: SamplingParams {
                    ignore_eos: true,
                    ..SamplingParams::greedy(NEW_TOKENS)
                },
                logprobs: Some(20),
            })
            .unwrap();
        index.insert(id, k);
    }
    let mut trace: Trace = vec![Vec::new(); g.prompts.len()];
    while engine.has_unfinished_requests() {
        for o in engine.step().unwrap() {
            trace[index[&o.request_id]].push((o.token_id, o.logprobs));
        }
    }
    Run {
        logits,
        trace,
        replays: engine.runner().graph_replays(),
    }
}

/// The first difference between two runs, bit for bit, if any.
fn first_difference(on: &Run, off: &Run) -> Option<String> {
    for (s, (a, b)) in on.logits.iter().zip(&off.logits).enumerate() {
        for (t, (x, y)) in a.iter().zip(b).enumerate() {
            if let Some(i) = (0..x.len()).find(|&i| x[i].to_bits() != y[i].to_bits()) {
                return Some(format!(
                    "eager logits, sequence {s}, step {t}, logit {i}: {} with PDL, {} without",
                    x[i], y[i]
                ));
            }
        }
    }
    let bits = |l: &Option<TokenLogprobs>| {
        l.as_ref().map(|l| {
            let top: Vec<(u32, u32)> = l.top.iter().map(|&(id, v)| (id, v.to_bits())).collect();
            (l.logprob.to_bits(), top)
        })
    };
    for (r, (a, b)) in on.trace.iter().zip(&off.trace).enumerate() {
        for (t, (x, y)) in a.iter().zip(b).enumerate() {
            if x.0 != y.0 || bits(&x.1) != bits(&y.1) {
                return Some(format!(
                    "graph decode, request {r}, step {t}: {x:?} with PDL, {y:?} without"
                ));
            }
        }
    }
    None
}

#[test]
fn pdl_on_and_off_give_the_same_bits_eager_and_on_graphs() {
    for arch in ["qwen3", "gemma3", "qwen3-moe"] {
        let Some((dev, on)) = backend(true) else {
            return;
        };
        if !on {
            eprintln!("notice: this GPU or driver has no PDL; both sides launch without it");
        }
        let with = run(arch, dev);
        let Some((dev, off)) = backend(false) else {
            return;
        };
        assert!(!off, "set_pdl(false) must turn PDL off");
        let without = run(arch, dev);

        assert_eq!(with.logits.len(), without.logits.len());
        assert!(with.logits.iter().all(|s| s.len() == FORCED_STEPS + 1));
        for (a, b) in with.trace.iter().zip(&without.trace) {
            assert_eq!(a.len(), NEW_TOKENS, "{arch}: tokens per request");
            assert_eq!(b.len(), NEW_TOKENS, "{arch}: tokens per request");
            assert!(a
                .iter()
                .all(|(_, l)| l.as_ref().is_some_and(|l| l.top.len() == 20)));
        }
        // One prefill step, then decode steps of every request on graphs.
        for (side, r) in [("with PDL", &with), ("without PDL", &without)] {
            assert!(
                r.replays + 1 >= NEW_TOKENS as u64,
                "{arch} {side}: {} graph replays for {NEW_TOKENS} tokens",
                r.replays
            );
        }
        if let Some(d) = first_difference(&with, &without) {
            panic!("{arch}: PDL changed a result: {d}");
        }
        eprintln!(
            "{arch}: PDL {} and off agree bit for bit ({} eager steps, {} graph replays)",
            if on { "on" } else { "unavailable" },
            FORCED_STEPS + 1,
            with.replays
        );
    }
}

/// The comparison itself, without a GPU: equal runs pass, a one-bit
/// difference in a logit or a logprob is found.
#[test]
fn the_comparison_finds_a_one_bit_difference() {
    let lp = |v: f32| {
        Some(TokenLogprobs {
            logprob: v,
            top: vec![(3, v), (1, v - 1.0)],
        })
    };
    let base = || Run {
        logits: vec![vec![vec![0.5, -1.25, 3.0]; 2]; 2],
        trace: vec![vec![(3, lp(-0.5)), (4, lp(-0.75))]; 2],
        replays: 1,
    };
    assert_eq!(first_difference(&base(), &base()), None);
    let mut a = base();
    a.logits[1][1][2] = f32::from_bits(3.0f32.to_bits() + 1);
    let d = first_difference(&a, &base()).expect("logit difference");
    assert!(d.contains("sequence 1, step 1, logit 2"), "{d}");
    let mut a = base();
    a.trace[1][0].1 = lp(f32::from_bits((-0.5f32).to_bits() + 1));
    let d = first_difference(&a, &base()).expect("logprob difference");
    assert!(d.contains("request 1, step 0"), "{d}");
    let mut a = base();
    a.logits[0][0][0] = -0.0;
    let mut b = base();
    b.logits[0][0][0] = 0.0;
    assert!(
        first_difference(&a, &b).is_some(),
        "signed zeros differ in bits"
    );
}
