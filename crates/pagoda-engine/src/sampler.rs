//! The sampler: one step's logits row + a request's [`SamplingParams`] -> the
//! next token (and, on request, its logprob and the top-N alternatives).
//!
//! Order of the transforms (vLLM's / OpenAI's semantics):
//! 0. a request's logit rules ([`apply_logit_rules`]: logit bias, allowed
//!    tokens, bad words, min_tokens bans; see [`crate::logit_rules`]) on
//!    the raw logits;
//! 1. penalties on the raw logits: repetition (tokens of prompt + output;
//!    positive logits divided by the penalty, negative ones multiplied), then
//!    frequency (times the count in the output) and presence (once if in the
//!    output), both subtracted;
//! 2. temperature below [`SAMPLING_EPS`] is greedy: argmax, ties to the lowest
//!    id, NaN never chosen;
//! 3. otherwise logits / temperature, softmax, then top-k, top-p (the
//!    smallest set of most likely tokens whose mass reaches p, at least one),
//!    min-p (drop tokens below `min_p * p_max`), and one draw from what is left,
//!    renormalized.
//!
//! Ranking ties are always broken by the lower token id, so the kept set is a
//! function of the logits alone. Logprobs are the log-softmax of the
//! distribution actually sampled from (penalized, temperature-scaled,
//! filtered, renormalized; temperature 1 and no filters for greedy); tokens
//! the filters removed have no logprob and never appear in the top-N list.
//!
//! Randomness: each request owns a [`RequestRng`] (xoshiro256** seeded by
//! SplitMix64) and every call to [`sample`] advances it by exactly one draw,
//! greedy or not. A request's k-th token therefore depends only on its seed,
//! its logits and k, never on which other requests share the batch or their
//! order; [`sample_batch`] may run rows in parallel for the same reason.
//!
//! Costs, for a vocabulary of V: greedy O(V) (one vectorized scan);
//! sampling O(V) for the softmax (a vectorized polynomial `exp`) and the
//! draw (block sums, then a walk through one block); top-k an O(V) scan with
//! a small sorted buffer (k <= 128) or an O(V) selection; top-p first tries
//! the top 64 tokens (enough for peaked distributions), else a quickselect
//! on probability mass, expected O(V); the vocabulary is never sorted.
//! Penalties cost O(n log n) in the prompt + output length n. The logits
//! row is used as scratch.

mod ops;

use crate::logit_rules::LogitRules;
pub use ops::argmax;
use ops::{nucleus, partition_top, sum_f64, to_weights, top_by_weight, top_of_pairs, SMALL_K};
use pagoda_core::SamplingParams;
use rayon::prelude::*;

/// Temperatures below this are greedy (vLLM's `_SAMPLING_EPS`).
pub const SAMPLING_EPS: f32 = 1e-5;
/// Candidates top-p tries before partitioning the whole vocabulary.
const TOP_P_FIRST_ROUND: usize = 64;
/// Tokens per block of the dense draw's block sums.
const DRAW_BLOCK: usize = 4096;

/// A request's own random stream: xoshiro256** seeded through SplitMix64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRng {
    s: [u64; 4],
}

/// One SplitMix64 step: advances `state` and returns the next output.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl RequestRng {
    /// The stream of `seed` (any value; the state is never all zero).
    pub fn new(seed: u64) -> Self {
        let mut st = seed;
        let mut s = [0u64; 4];
        for x in &mut s {
            *x = splitmix64(&mut st);
        }
        if s == [0; 4] {
            s[0] = 1;
        }
        RequestRng { s }
    }

    /// The stream of `seed`, or of a seed drawn from `seed_source` when the
    /// request brought none.
    pub fn for_request(seed: Option<u64>, seed_source: &mut RequestRng) -> Self {
        RequestRng::new(seed.unwrap_or_else(|| seed_source.next_u64()))
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Logprobs of one sampled token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// Log-probability of the chosen token.
    pub logprob: f32,
    /// The most likely tokens, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

/// What [`sample`] picked.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleOutput {
    pub token: u32,
    /// Present when logprobs were asked for.
    pub logprobs: Option<TokenLogprobs>,
}

/// One sequence of a batch: its parameters, history and random stream.
#[derive(Debug)]
pub struct SeqSampling<'a> {
    pub params: &'a SamplingParams,
    pub prompt_token_ids: &'a [u32],
    pub output_token_ids: &'a [u32],
    pub rng: &'a mut RequestRng,
    /// `None`: no logprobs; `Some(n)`: the chosen token's and the top n.
    pub num_logprobs: Option<usize>,
}

/// Picks the next token from `logits` (one row, vocab wide; used as scratch).
pub fn sample(
    logits: &mut [f32],
    params: &SamplingParams,
    prompt_token_ids: &[u32],
    output_token_ids: &[u32],
    rng: &mut RequestRng,
) -> SampleOutput {
    sample_with_logprobs(
        logits,
        params,
        prompt_token_ids,
        output_token_ids,
        rng,
        None,
    )
}

/// Samples every row of `logits` (`seqs.len()` rows of `vocab_size`), rows
/// in parallel; each row's result depends only on that row and its sequence.
pub fn sample_batch(
    logits: &mut [f32],
    vocab_size: usize,
    seqs: &mut [SeqSampling<'_>],
) -> Vec<SampleOutput> {
    debug_assert_eq!(logits.len(), vocab_size * seqs.len());
    logits
        .par_chunks_exact_mut(vocab_size.max(1))
        .zip(seqs.par_iter_mut())
        .map(|(row, s)| {
            sample_with_logprobs(
                row,
                s.params,
                s.prompt_token_ids,
                s.output_token_ids,
                s.rng,
                s.num_logprobs,
            )
        })
        .collect()
}

/// [`sample`], also returning logprobs when `num_logprobs` is `Some(n)`.
pub fn sample_with_logprobs(
    logits: &mut [f32],
    params: &SamplingParams,
    prompt_token_ids: &[u32],
    output_token_ids: &[u32],
    rng: &mut RequestRng,
    num_logprobs: Option<usize>,
) -> SampleOutput {
    // Exactly one draw per token, so the stream's position is the step index.
    let u = rng.next_f64();
    apply_penalties(logits, params, prompt_token_ids, output_token_ids);
    if logits.is_empty() {
        return SampleOutput {
            token: 0,
            logprobs: num_logprobs.map(|_| TokenLogprobs {
                logprob: f32::NEG_INFINITY,
                top: Vec::new(),
            }),
        };
    }
    let temperature = params.temperature;
    // NaN temperatures (rejected by validation) fall to greedy too.
    if temperature.is_nan() || temperature < SAMPLING_EPS {
        let token = argmax(logits);
        let logprobs = num_logprobs.map(|n| {
            let support = Support::Dense(to_weights(logits, 1.0));
            support.logprobs(logits, token, n)
        });
        return SampleOutput { token, logprobs };
    }

    // Weights w_i = exp((l_i - max) / T) in place: the largest is exactly 1.
    let mut support = Support::Dense(to_weights(logits, temperature));
    let vocab = logits.len();
    if params.top_k > 0 && params.top_k < vocab {
        support = Support::Sparse(if params.top_k <= SMALL_K {
            top_by_weight(logits, params.top_k)
        } else {
            let mut all: Vec<(u32, f32)> = logits
                .iter()
                .enumerate()
                .map(|(i, &x)| (i as u32, x))
                .collect();
            partition_top(&mut all, params.top_k);
            all.truncate(params.top_k);
            all
        });
    }
    if params.top_p < 1.0 {
        support = support.top_p(logits, params.top_p as f64);
    }
    if params.min_p > 0.0 {
        // p_i >= min_p * p_max  <=>  w_i >= min_p (w_max = 1; clamped so the
        // most likely token always survives).
        support.min_p(logits, params.min_p.min(1.0));
    }
    let token = support.draw(logits, u);
    let logprobs = num_logprobs.map(|n| support.logprobs(logits, token, n));
    SampleOutput { token, logprobs }
}

/// A request's logit rules for an output of `output_token_ids` so far, in
/// place (`entries` is scratch): the first transform, before penalties.
pub fn apply_logit_rules(
    logits: &mut [f32],
    rules: &LogitRules,
    output_token_ids: &[u32],
    entries: &mut Vec<(u32, f32)>,
) {
    rules.entries(output_token_ids, entries);
    pagoda_kernels::logit_adjust::apply_row(logits, entries, rules.allowed());
}

/// Repetition, frequency and presence penalties, in place.
pub fn apply_penalties(
    logits: &mut [f32],
    params: &SamplingParams,
    prompt_token_ids: &[u32],
    output_token_ids: &[u32],
) {
    let vocab = logits.len();
    let rep = params.repetition_penalty;
    if rep != 1.0 && rep > 0.0 {
        let mut seen: Vec<u32> = prompt_token_ids
            .iter()
            .chain(output_token_ids)
            .copied()
            .collect();
        seen.sort_unstable();
        seen.dedup();
        for t in seen {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = if *l > 0.0 { *l / rep } else { *l * rep };
            }
        }
    }
    let (freq, presence) = (params.frequency_penalty, params.presence_penalty);
    if freq != 0.0 || presence != 0.0 {
        let mut out = output_token_ids.to_vec();
        out.sort_unstable();
        for run in out.chunk_by(|a, b| a == b) {
            let t = run[0] as usize;
            if t < vocab {
                // Two subtractions, in vLLM's order (bit-for-bit the same).
                logits[t] -= freq * run.len() as f32;
                logits[t] -= presence;
            }
        }
    }
}

/// The tokens still allowed, with the sum of their weights.
enum Support {
    /// Every token; the weights are the row itself (0 = removed). Holds the total.
    Dense(f64),
    /// The listed tokens only, in no particular order.
    Sparse(Vec<(u32, f32)>),
}

impl Support {
    fn total(&self, w: &[f32]) -> f64 {
        match self {
            Support::Dense(total) => *total,
            Support::Sparse(c) => {
                debug_assert!(c.iter().all(|e| w.get(e.0 as usize) == Some(&e.1)));
                c.iter().map(|e| e.1 as f64).sum()
            }
        }
    }

    /// Keeps the smallest rank-order prefix whose mass reaches `p`.
    fn top_p(self, w: &[f32], p: f64) -> Support {
        let (mut c, target) = match self {
            Support::Sparse(c) => {
                let total: f64 = c.iter().map(|e| e.1 as f64).sum();
                (c, p * total)
            }
            Support::Dense(total) => {
                // Peaked distributions: the nucleus is among the top few.
                let mut c = top_by_weight(w, TOP_P_FIRST_ROUND);
                let keep = nucleus(&mut c, p * total);
                if keep < c.len() || c.len() == w.len() {
                    c.truncate(keep.max(1));
                    return Support::Sparse(c);
                }
                // Tokens below tau = (1 - p) * total / 2V weigh less than
                // (1 - p) * total together: they rank last and lie outside
                // the nucleus, so they never enter the selection.
                let tau = (0.5 * (1.0 - p) * total / w.len() as f64) as f32;
                let c = w
                    .iter()
                    .enumerate()
                    .filter(|e| *e.1 >= tau)
                    .map(|(i, &x)| (i as u32, x))
                    .collect();
                (c, p * total)
            }
        };
        let keep = nucleus(&mut c, target).max(1);
        c.truncate(keep);
        Support::Sparse(c)
    }

    /// Drops tokens whose weight is below `min_w` (at most 1: the top stays).
    fn min_p(&mut self, w: &mut [f32], min_w: f32) {
        match self {
            Support::Sparse(c) => c.retain(|e| e.1 >= min_w),
            Support::Dense(total) => {
                for x in w.iter_mut() {
                    *x = if *x < min_w { 0.0 } else { *x };
                }
                *total = sum_f64(w);
            }
        }
    }

    /// The token at mass `u * total` (u uniform in [0, 1)).
    fn draw(&self, w: &[f32], u: f64) -> u32 {
        let walk = |items: &mut dyn Iterator<Item = (u32, f32)>, target: f64| {
            let mut cum = 0.0f64;
            let mut last = None;
            for (id, x) in items {
                if x > 0.0 {
                    cum += x as f64;
                    last = Some(id);
                    if cum > target {
                        return Some(id);
                    }
                }
            }
            // Rounding left `target` at the very end: the last positive one.
            last
        };
        let found = match self {
            Support::Sparse(c) => walk(&mut c.iter().copied(), u * self.total(w)),
            Support::Dense(_) => {
                // Block sums first, so the scalar walk covers one block.
                let sums: Vec<f64> = w.chunks(DRAW_BLOCK).map(sum_f64).collect();
                let mut target = u * sums.iter().sum::<f64>();
                // The block holding `target`, else (rounding) the last with mass.
                let mut chosen = None;
                for (b, &s) in sums.iter().enumerate() {
                    if s > 0.0 {
                        chosen = Some((b, target));
                        if target < s {
                            break;
                        }
                    }
                    target -= s;
                }
                chosen.and_then(|(b, target)| {
                    let start = b * DRAW_BLOCK;
                    let block = &w[start..(start + DRAW_BLOCK).min(w.len())];
                    let mut it = block
                        .iter()
                        .enumerate()
                        .map(|(i, &x)| ((start + i) as u32, x));
                    walk(&mut it, target)
                })
            }
        };
        // Nothing has weight (no finite logit): the greedy choice.
        found.unwrap_or_else(|| match self {
            Support::Sparse(c) => c.first().map_or(0, |e| e.0),
            Support::Dense(_) => argmax(w),
        })
    }

    /// Logprob of `token` and the `n` most likely kept tokens.
    fn logprobs(&self, w: &[f32], token: u32, n: usize) -> TokenLogprobs {
        let log_total = self.total(w).ln();
        let lp = |x: f32| {
            if x > 0.0 {
                ((x as f64).ln() - log_total) as f32
            } else {
                f32::NEG_INFINITY
            }
        };
        let (token_w, top) = match self {
            Support::Sparse(c) => {
                let tw = c.iter().find(|e| e.0 == token).map_or(0.0, |e| e.1);
                (tw, top_of_pairs(c.clone(), n))
            }
            Support::Dense(_) => {
                let tw = w.get(token as usize).copied().unwrap_or(0.0);
                (tw, top_by_weight(w, n))
            }
        };
        TokenLogprobs {
            logprob: lp(token_w),
            top: top
                .into_iter()
                .filter(|e| e.1 > 0.0)
                .map(|(id, x)| (id, lp(x)))
                .collect(),
        }
    }
}

#[cfg(test)]
#[path = "sampler_tests.rs"]
mod tests;
