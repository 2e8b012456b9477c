//! Device memory under serving traffic, on a GPU (skipped with a notice
//! where CUDA is absent).
//!
//! `soak`: an engine started as `pagoda serve` starts it (profiling steps,
//! frozen step arena, KV cache from what is left, decode graphs) runs 20,000
//! steps of random traffic: prompt lengths from 1 to max_model_len, half of
//! them behind shared prefixes (radix hits, copy-on-write), random output
//! lengths and sampling, random arrivals and aborts, and a KV cache small
//! enough to preempt. Asserts that no step fails, that every request ends
//! (finished or aborted by the test), and that after warm-up the device's
//! free memory, the arena and the GEMM plans do not change by a single
//! byte or plan. Prints the figures BENCHMARKS.md records.
//!
//! `a_step_too_large_for_the_arena_fails_alone`: an arena frozen after
//! small steps refuses a larger one with `OutOfMemory`, and the next step
//! runs as if nothing happened.
#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::{gpu, runner, BLOCK_SIZE};
use pagoda_core::{BlockId, RequestId, ScheduledSequence};
use pagoda_core::{SamplingParams, SchedulerConfig};
use pagoda_engine::context::build_forward_context;
use pagoda_engine::{EngineRequest, LlmEngine};
use pagoda_kernels::KernelError;
use pagoda_model::loader::dummy::DummySource;
use pagoda_model::loader::hf_config::load_config_file;
use pagoda_model::ModelConfig;
use std::collections::{HashMap, HashSet};

const MAX_MODEL_LEN: usize = 2048;
const STEPS: usize = 20_000;
const WARMUP_STEPS: usize = 500;

/// A small Qwen3 with head_dim 128 (the fast attention kernels) and a
/// vocabulary large enough for real sampling work.
fn config() -> ModelConfig {
    let json = serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "vocab_size": 8192,
        "max_position_embeddings": MAX_MODEL_LEN,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": false,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
    });
    let dir = std::env::temp_dir().join(format!("pagoda-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.json");
    std::fs::write(&path, json.to_string()).unwrap();
    load_config_file(&path).unwrap()
}

/// xorshift64*: the test's own reproducible randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

#[test]
fn soak() {
    let Some(dev) = gpu() else { return };
    let cfg = config();
    let sched = SchedulerConfig {
        block_size: BLOCK_SIZE,
        // 3 full-length sequences: long prompts preempt each other.
        num_blocks: 3 * MAX_MODEL_LEN / BLOCK_SIZE,
        max_num_batched_tokens: 1024,
        max_num_seqs: 48,
        max_model_len: MAX_MODEL_LEN,
        enable_prefix_caching: true,
    };
    let src = DummySource::new(&cfg).unwrap();
    let mut r = runner(dev, &cfg, &src, 1);
    let arena = r
        .reserve_step_memory(
            sched.max_num_batched_tokens,
            sched.max_num_seqs,
            sched.max_model_len,
        )
        .unwrap()
        .expect("CUDA reserves step memory");
    r.resize_kv_cache(sched.num_blocks).unwrap();
    let graphs = r
        .capture_decode_graphs(sched.max_num_seqs, sched.max_model_len)
        .unwrap();
    let mut engine = LlmEngine::new(r, None, sched.clone()).unwrap();

    let mut rng = Rng(0x5eed_0f50_a4a4);
    let prefixes: Vec<Vec<u32>> = (0..8)
        .map(|_| {
            let n = rng.range(8, 700);
            (0..n).map(|_| rng.range(3, 8191) as u32).collect()
        })
        .collect();
    // Request id -> max_tokens; aborted ids.
    let mut live: HashMap<pagoda_core::RequestId, usize> = HashMap::new();
    let mut aborted = 0usize;
    let (mut submitted, mut finished) = (0usize, 0usize);
    let mut shapes = HashSet::new();
    let mut baseline = None;
    let (mut preemptions_before, mut tokens_out) = (0u64, 0usize);
    for step in 0..STEPS {
        if step == WARMUP_STEPS {
            let b = engine.runner().backend();
            baseline = Some((
                b.mem_get_info().unwrap().0,
                b.pool_reserved_bytes(),
                b.gemm_plans(),
            ));
            preemptions_before = engine.stats().counters.num_preemptions;
        }
        // Arrivals: a Poisson-like trickle, bounded queue.
        while live.len() < 96 && rng.chance(0.35) {
            let len = rng.range(1, MAX_MODEL_LEN - 1);
            let mut prompt: Vec<u32> = if rng.chance(0.5) {
                prefixes[rng.range(0, prefixes.len() - 1)].clone()
            } else {
                Vec::new()
            };
            prompt.truncate(len);
            while prompt.len() < len {
                prompt.push(rng.range(3, 8191) as u32);
            }
            let max_tokens = rng.range(1, (MAX_MODEL_LEN - len).min(96));
            let params = SamplingParams {
                temperature: [0.0, 0.6, 1.0][rng.range(0, 2)],
                top_k: [0, 20, 200][rng.range(0, 2)],
                top_p: [1.0, 0.9][rng.range(0, 1)],
                ignore_eos: true,
                seed: Some(rng.next()),
                ..SamplingParams::greedy(max_tokens)
            };
            let id = engine
                .add_request(EngineRequest {
                    prompt_token_ids: prompt,
                    params,
                    logprobs: None,
                })
                .unwrap();
            live.insert(id, max_tokens);
            submitted += 1;
        }
        // Aborts: now and then a random request in flight.
        if !live.is_empty() && rng.chance(0.02) {
            let ids: Vec<_> = live.keys().copied().collect();
            let id = ids[rng.range(0, ids.len() - 1)];
            engine.abort(id).unwrap();
            live.remove(&id);
            aborted += 1;
        }
        if !engine.has_unfinished_requests() {
            continue;
        }
        let out = engine
            .step()
            .unwrap_or_else(|e| panic!("step {step} failed: {e}"));
        shapes.insert(engine.last_step_shape());
        for o in out {
            tokens_out += 1;
            if let Some(reason) = o.finish_reason {
                let want = live.remove(&o.request_id).expect("a live request");
                assert_eq!(
                    o.num_output_tokens, want,
                    "request ended with {reason:?} before max_tokens (ignore_eos)"
                );
                finished += 1;
            }
        }
    }
    // Drain what is left.
    while engine.has_unfinished_requests() {
        for o in engine.step().unwrap() {
            if o.finish_reason.is_some() {
                live.remove(&o.request_id);
                finished += 1;
            }
        }
    }
    assert!(live.is_empty(), "{} requests never finished", live.len());
    assert_eq!(submitted, finished + aborted);

    let b = engine.runner().backend();
    let (free0, arena0, plans0) = baseline.expect("warm-up ended");
    let (free1, arena1, plans1) = (
        b.mem_get_info().unwrap().0,
        b.pool_reserved_bytes(),
        b.gemm_plans(),
    );
    let preemptions = engine.stats().counters.num_preemptions - preemptions_before;
    let stats = engine.stats();
    eprintln!(
        "soak: {STEPS} steps, {} distinct step shapes (tokens, seqs), {submitted} requests \
         ({finished} finished, {aborted} aborted), {tokens_out} tokens out, {preemptions} \
         preemptions after warm-up, prefix hit rate {:.2}, {graphs} decode graphs; arena {} \
         bytes (peak offset {}), {plans1} GEMM plans; device free memory after warm-up {free0} \
         bytes, at the end {free1} bytes",
        shapes.len(),
        stats.prefix_cache_hit_rate(),
        arena,
        b.pool_arena_need(),
    );
    assert!(
        preemptions > 0,
        "the soak never preempted: shrink the cache"
    );
    assert!(stats.prefix_cache_hit_rate() > 0.0, "no prefix hits");
    assert_eq!(arena1, arena0, "the step arena changed size");
    assert_eq!(plans1, plans0, "GEMM plans were made after warm-up");
    assert_eq!(free1, free0, "device memory in use grew after warm-up");
}

#[test]
fn a_step_too_large_for_the_arena_fails_alone() {
    let Some(dev) = gpu() else { return };
    let cfg = config();
    let src = DummySource::new(&cfg).unwrap();
    let mut r = runner(dev, &cfg, &src, 1);
    // Warm up for 16-token steps only.
    r.reserve_step_memory(16, 4, 256).unwrap();
    r.resize_kv_cache(128).unwrap();
    let table: Vec<BlockId> = (0..128).map(BlockId).collect();
    let step = |r: &mut pagoda_engine::ModelRunner<_>, n: usize| {
        let tokens: Vec<u32> = (0..n as u32).map(|i| 3 + i % 4000).collect();
        let table = table[..n.div_ceil(BLOCK_SIZE)].to_vec();
        let seqs = [ScheduledSequence::new(RequestId(0), tokens, 0, table, true)];
        let ctx = build_forward_context(&seqs, BLOCK_SIZE);
        r.execute(&ctx).map(|o| o.into_logits().unwrap())
    };
    let small = step(&mut r, 12).unwrap();
    match step(&mut r, 2000) {
        Err(pagoda_engine::EngineError::Model(pagoda_model::ModelError::Kernel(
            KernelError::OutOfMemory(msg),
        ))) => eprintln!("refused as expected: {msg}"),
        other => panic!("a step beyond the arena gave {:?}", other.map(|l| l.len())),
    }
    assert_eq!(
        step(&mut r, 12).unwrap(),
        small,
        "the next step is unharmed"
    );
}
