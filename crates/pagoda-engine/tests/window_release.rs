//! Sliding-window block release end to end, on the tiny Mistral v0.1 and
//! Phi-3 models (window 8 on every layer, dummy weights, CPU): long prompts,
//! batched, chunked prefill and prefix hits give the same greedy tokens and
//! logprobs (bit for bit) with the passed blocks released as with every
//! block kept; a long generation holds a bounded number of blocks; a request
//! longer than the whole cache runs when its window fits; preemption and
//! eviction in a cache of one or two windows give the same tokens.

mod common;

use common::trace::*;
use common::*;
use pagoda_core::kv_cache_manager::max_blocks_in_window;
use pagoda_core::SchedulerConfig;
use pagoda_engine::{EngineRequest, LlmEngine};
use pagoda_kernels::cpu::{CpuBackend, WeightDtype};
use pagoda_model::loader::dummy::DummySource;
use pagoda_model::loader::hf_config::load_config_file;

const MAX_MODEL_LEN: usize = 256;
/// Small, so prompts are chunked.
const BUDGET: usize = 40;

fn engine(arch: &str, num_blocks: usize, caching: bool, release: bool) -> LlmEngine<CpuBackend> {
    let path = repo_root().join(format!("tests/golden/tiny-{arch}/config.json"));
    let cfg = load_config_file(&path).unwrap();
    assert_eq!(cfg.uniform_sliding_window(), Some(8), "{arch}");
    let src = DummySource::new(&cfg).unwrap();
    let runner = cpu_runner(&cfg, &src, WeightDtype::F32, num_blocks);
    let config = SchedulerConfig {
        max_num_batched_tokens: BUDGET,
        max_num_seqs: 8,
        enable_prefix_caching: caching,
        ..scheduler_config(num_blocks, MAX_MODEL_LEN)
    };
    LlmEngine::with_window_release(runner, None, config, release).unwrap()
}

#[test]
fn released_blocks_change_no_token_or_logprob() {
    for arch in ["mistral", "phi3"] {
        // Two requests share a 120-token prefix; a later wave extends a
        // finished conversation (a prefix hit past the window).
        let shared = prompt(1, 120);
        let mut a = shared.clone();
        a.extend(prompt(2, 60));
        let mut b = shared.clone();
        b.extend(prompt(3, 30));
        let first = vec![
            (a.clone(), 50),
            (b, 70),
            (prompt(4, 200), 40),
            (prompt(5, 9), 120),
        ];
        let mut follow = a.clone();
        follow.extend(prompt(6, 20));
        let second = vec![(follow, 30), (prompt(7, 150), 60)];
        let waves = [first, second];
        for caching in [true, false] {
            let mut kept = engine(arch, 200, caching, false);
            let mut peak_kept = 0;
            let want = run_waves(&mut kept, &waves, &mut |u| peak_kept = peak_kept.max(u));
            let mut released = engine(arch, 200, caching, true);
            let mut peak = 0;
            let got = run_waves(&mut released, &waves, &mut |u| peak = peak.max(u));
            assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.0, w.0, "{arch} (caching {caching}) request {i}: tokens");
                assert_eq!(g.1, w.1, "{arch} (caching {caching}) request {i}: logprobs");
            }
            if !caching {
                assert!(
                    peak < peak_kept,
                    "{arch}: peak {peak} vs {peak_kept} blocks"
                );
            }
        }
    }
}

/// One window on every layer is one KV cache group: the prefix cache stays
/// token-granular. A chat's second turn takes the first turn's 160 shared
/// tokens (past the window; they end where the uncached run's prompt
/// chunks of 40 end, so both runs compute every position in the same
/// chunks) and gives the same tokens and logprobs bit for bit; so does a
/// hit ending mid-block (a block copy), within rounding (its chunks differ).
#[test]
fn a_shared_prefix_past_the_window_is_a_cache_hit_and_changes_nothing() {
    for arch in ["mistral", "phi3"] {
        for (shared_len, exact) in [(160, true), (165, false)] {
            let shared = prompt(30, shared_len);
            let turn = |seed: u32, n: usize| -> Vec<u32> {
                shared.iter().copied().chain(prompt(seed, n)).collect()
            };
            let waves = vec![vec![(turn(31, 10), 20)], vec![(turn(32, 25), 30)]];
            let mut plain = engine(arch, 200, false, true);
            let (want, none) = run_waves_cached(&mut plain, &waves);
            assert_eq!(none, vec![0, 0]);
            for release in [true, false] {
                let mut cached = engine(arch, 200, true, release);
                let (got, hits) = run_waves_cached(&mut cached, &waves);
                assert_eq!(hits, vec![0, shared_len], "{arch}: token-granular");
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let what = format!("{arch} {shared_len} (release {release}) request {i}");
                    assert_eq!(g.0, w.0, "{what}: tokens");
                    if exact {
                        assert_eq!(g.1, w.1, "{what}: logprobs");
                        continue;
                    }
                    for (a, b) in g.1.iter().zip(&w.1) {
                        for (j, (&x, &y)) in a.iter().zip(b).enumerate() {
                            if j % 2 == 1 {
                                assert_eq!(x, y, "{what}: top ids");
                            } else {
                                let (x, y) = (f32::from_bits(x), f32::from_bits(y));
                                assert!((x - y).abs() < 1e-4, "{what}: {x} vs {y}");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_long_generation_holds_a_bounded_number_of_blocks() {
    let bound = max_blocks_in_window(8, BUDGET, BLOCK_SIZE);
    // The whole context would take 16 blocks; the window needs `bound` (8).
    assert!(bound < MAX_MODEL_LEN / BLOCK_SIZE);
    let waves = [vec![(prompt(9, 30), MAX_MODEL_LEN - 30)]];
    let mut full = engine("mistral", 64, false, false);
    let want = run_waves(&mut full, &waves, &mut |_| {});
    assert_eq!(want[0].0.len(), MAX_MODEL_LEN - 30);
    // Without caching, what the pool has in use is what the request holds.
    let mut released = engine("mistral", 64, false, true);
    let got = run_waves(&mut released, &waves, &mut |used| {
        assert!(used <= bound, "{used} > {bound}")
    });
    assert_eq!(got, want);
    // With caching, in a cache that holds one window but not the context:
    // the tree gives the passed blocks back as the request needs them.
    let mut small = engine("mistral", bound, true, true);
    let got = run_waves(&mut small, &waves, &mut |used| assert!(used <= bound));
    assert_eq!(got, want);
    // Keeping every block, the same cache refuses the request.
    let mut refused = engine("mistral", bound, true, false);
    assert!(refused
        .add_request(EngineRequest {
            prompt_token_ids: prompt(9, 30),
            params: greedy(MAX_MODEL_LEN - 30),
            logprobs: None,
        })
        .is_err());
}

#[test]
fn preemption_and_eviction_in_a_small_cache_change_nothing() {
    let bound = max_blocks_in_window(8, BUDGET, BLOCK_SIZE);
    let shared = prompt(11, 100);
    let mut wave = Vec::new();
    for i in 0..5u32 {
        let mut p = shared.clone();
        p.extend(prompt(20 + i, 10 + 25 * i as usize));
        wave.push((p, 60 + 10 * i as usize));
    }
    let waves = [wave];
    let mut kept = engine("mistral", 200, true, false);
    let want = run_waves(&mut kept, &waves, &mut |_| {});
    // Room for one to two requests' windows: the others wait or are preempted.
    let mut preemptions = 0;
    for num_blocks in [bound, bound + 2, bound + 5, 2 * bound + 1] {
        let mut small = engine("mistral", num_blocks, true, true);
        let got = run_waves(&mut small, &waves, &mut |used| assert!(used <= num_blocks));
        // Other batch compositions round the CPU GEMMs differently: the
        // same tokens, logprobs within rounding.
        assert_close_traces(&got, &want, &format!("{num_blocks} blocks"));
        preemptions += small.stats().counters.num_preemptions;
    }
    assert!(preemptions > 0, "no preemption happened");
}
