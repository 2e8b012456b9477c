//! Token-and-logprob traces of engine runs, for tests that compare two
//! engines bit for bit (window release, KV cache groups).

use pagoda_core::{RequestId, SamplingParams};
use pagoda_engine::{EngineRequest, LlmEngine};
use pagoda_kernels::cpu::CpuBackend;
use std::collections::HashMap;

/// Greedy sampling of exactly `max_tokens` tokens.
pub fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(max_tokens)
    }
}

/// Per request (in order of submission): its tokens and their logprobs
/// (chosen and top 3, as bits).
pub type Trace = Vec<(Vec<u32>, Vec<Vec<u32>>)>;

/// Submits `waves` one after the other, each once the previous has
/// finished, greedy with 3 logprobs; checks every step's held blocks
/// against `check_used`.
pub fn run_waves(
    engine: &mut LlmEngine<CpuBackend>,
    waves: &[Vec<(Vec<u32>, usize)>],
    check_used: &mut dyn FnMut(usize),
) -> Trace {
    let mut order: Vec<RequestId> = Vec::new();
    let mut got: HashMap<RequestId, (Vec<u32>, Vec<Vec<u32>>)> = HashMap::new();
    for wave in waves {
        for (prompt, max_tokens) in wave {
            let id = engine
                .add_request(EngineRequest {
                    prompt_token_ids: prompt.clone(),
                    params: greedy(*max_tokens),
                    logprobs: Some(3),
                })
                .unwrap();
            order.push(id);
        }
        while engine.has_unfinished_requests() {
            for out in engine.step().unwrap() {
                let lp = out.logprobs.unwrap();
                let mut bits = vec![lp.logprob.to_bits()];
                for (t, l) in lp.top {
                    bits.extend([t, l.to_bits()]);
                }
                let e = got.entry(out.request_id).or_default();
                e.0.push(out.token_id);
                e.1.push(bits);
            }
            check_used(engine.stats().num_blocks_used);
        }
    }
    order.iter().map(|id| got.remove(id).unwrap()).collect()
}

/// Runs `waves` as [`run_waves`] does and returns, with the trace, the
/// prompt tokens each wave took from the prefix cache.
pub fn run_waves_cached(
    engine: &mut LlmEngine<CpuBackend>,
    waves: &[Vec<(Vec<u32>, usize)>],
) -> (Trace, Vec<usize>) {
    let mut trace = Trace::new();
    let mut cached = Vec::new();
    for wave in waves {
        let before = engine.stats().counters.prefix_cache_hit_tokens;
        trace.extend(run_waves(engine, std::slice::from_ref(wave), &mut |_| {}));
        cached.push((engine.stats().counters.prefix_cache_hit_tokens - before) as usize);
    }
    (trace, cached)
}

/// A deterministic prompt of `len` ids in 3..503.
pub fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) % 500 + 3)
        .collect()
}

/// `got` has `want`'s tokens and top ids, and its logprobs within 1e-4
/// (other batch compositions round the CPU GEMMs differently).
pub fn assert_close_traces(got: &Trace, want: &Trace, what: &str) {
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.0, w.0, "{what}: tokens");
        for (a, b) in g.1.iter().zip(&w.1) {
            for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
                if i % 2 == 1 {
                    assert_eq!(x, y, "{what}: top ids");
                } else {
                    let (x, y) = (f32::from_bits(x), f32::from_bits(y));
                    assert!((x - y).abs() < 1e-4, "{what}: {x} vs {y}");
                }
            }
        }
    }
}
