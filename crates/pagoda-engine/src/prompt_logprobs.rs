//! Prompt logprobs (vLLM's `prompt_logprobs`): the log-probability of each
//! prompt token given the tokens before it, with its rank and the `n` most
//! likely alternatives.
//!
//! The logits at prompt position `p` give the distribution of the token at
//! `p + 1`, so a request's entries are for positions `1..prompt_len`; they
//! are collected chunk by chunk as the prompt is computed (the scheduler
//! cuts such a request's chunks to the step's logits rows, and gives it no
//! cached prefix, so every position is computed). [`rows_wanted`] says
//! which rows of a chunk are still to collect: positions already collected
//! (before a preemption by recompute) are not asked again.
//!
//! The values are an f32 log-softmax of the raw logits (no temperature,
//! penalties or masks), as vLLM reports them; computed on the host from the
//! step's logits rows, or on the device where the step samples there (the
//! rows follow the sampling rows; only the results come back). Cost:
//! O(vocab) per row, plus O(n log n) (O(n * vocab) on the device).

use pagoda_kernels::ForwardContext;
use std::ops::Range;

/// One prompt token's logprob.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprob {
    /// The prompt token.
    pub token: u32,
    pub logprob: f32,
    /// 1 + the number of tokens with a higher logit.
    pub rank: u32,
    /// The `n` most likely tokens, most likely first (ties: lower id first),
    /// with their logprobs.
    pub top: Vec<(u32, f32)>,
}

/// A request's prompt logprobs collected so far.
#[derive(Debug, Clone, Default)]
pub(crate) struct PromptLogprobsState {
    /// Alternatives asked per position.
    pub n: usize,
    /// Entry `k` is for prompt position `k + 1`.
    pub entries: Vec<PromptLogprob>,
}

/// The rows (offsets into the chunk) of a chunk starting at prompt position
/// `start` with `len` tokens whose logits prompt logprobs still need, given
/// `collected` entries: positions `collected..prompt_len - 1` of the chunk.
pub(crate) fn rows_wanted(
    start: usize,
    len: usize,
    prompt_len: usize,
    collected: usize,
) -> Range<usize> {
    let lo = start.max(collected);
    let hi = (start + len).min(prompt_len.saturating_sub(1));
    if lo >= hi {
        0..0
    } else {
        lo - start..hi - start
    }
}

/// Rewrites `ctx.logits_indices`: first each sequence's last-token row
/// where `samples[i]` (the sampling rows, in sequence order), then the rows
/// of `extra[i]` (offsets into sequence `i`'s chunk, ascending, before its
/// last token) of every sequence in order: the prompt-logprobs rows, which
/// the device scores after the sampling rows and the host reads in the
/// same order.
pub(crate) fn lay_out_rows(ctx: &mut ForwardContext, extra: &[Range<usize>], samples: &[bool]) {
    ctx.logits_indices.clear();
    for (i, &s) in samples.iter().enumerate() {
        let (a, b) = (ctx.cu_seqlens_q[i], ctx.cu_seqlens_q[i + 1]);
        if s && b > a {
            ctx.logits_indices.push(b - 1);
        }
    }
    for (i, rows) in extra.iter().enumerate() {
        let (a, b) = (ctx.cu_seqlens_q[i], ctx.cu_seqlens_q[i + 1]);
        ctx.logits_indices
            .extend(rows.clone().map(|r| a + r as u32).filter(|&r| r < b));
    }
}

/// The logprob of `token` under `logits` (log-softmax in f32, accumulated
/// in f64), its rank, and the `n` most likely tokens.
pub fn prompt_logprob(logits: &[f32], token: u32, n: usize) -> PromptLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .map(|&l| ((l - max) as f64).exp())
        .sum::<f64>();
    let lse = max + sum.ln() as f32;
    let lp = |l: f32| {
        if l.is_finite() {
            l - lse
        } else {
            f32::NEG_INFINITY
        }
    };
    let own = logits
        .get(token as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY);
    let rank = 1 + logits.iter().filter(|&&l| l > own).count() as u32;
    PromptLogprob {
        token,
        logprob: lp(own),
        rank,
        top: top_n(logits, n)
            .into_iter()
            .map(|(i, l)| (i, lp(l)))
            .collect(),
    }
}

/// The `n` largest logits with their ids, largest first, ties to lower ids.
fn top_n(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    if n == 0 {
        return Vec::new();
    }
    let better = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    for (i, &l) in logits.iter().enumerate() {
        let e = (i as u32, l);
        if top.len() == n && better(&e, &top[n - 1]).is_ge() {
            continue;
        }
        let at = top.partition_point(|x| better(x, &e).is_lt());
        top.insert(at, e);
        top.truncate(n);
    }
    top
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprob_rank_and_top_match_a_direct_computation() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, f32::NEG_INFINITY];
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let want = |l: f32| (l as f64 - z.ln()) as f32;
        let p = prompt_logprob(&logits, 2, 3);
        assert!((p.logprob - want(2.0)).abs() < 1e-6);
        assert_eq!(p.rank, 3);
        let ids: Vec<u32> = p.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 3, 2]);
        assert!((p.top[0].1 - want(3.0)).abs() < 1e-6);
        let p = prompt_logprob(&logits, 4, 0);
        assert_eq!(p.logprob, f32::NEG_INFINITY);
        assert_eq!(p.rank, 5);
        assert!(p.top.is_empty());
        let lps: f64 = (0..5)
            .map(|t| (prompt_logprob(&logits, t, 0).logprob as f64).exp())
            .sum();
        assert!((lps - 1.0).abs() < 1e-6);
    }

    #[test]
    fn rows_cover_each_prompt_position_once() {
        // A prompt of 10 in chunks of 4: rows for positions 0..9.
        assert_eq!(rows_wanted(0, 4, 10, 0), 0..4);
        assert_eq!(rows_wanted(4, 4, 10, 4), 0..4);
        assert_eq!(rows_wanted(8, 2, 10, 8), 0..1);
        // Recomputed after a preemption: collected positions are skipped.
        assert_eq!(rows_wanted(0, 6, 10, 5), 5..6);
        assert_eq!(rows_wanted(0, 4, 10, 9), 0..0);
        // A decode, or a one-token prompt: nothing.
        assert_eq!(rows_wanted(10, 1, 10, 9), 0..0);
        assert_eq!(rows_wanted(0, 1, 1, 0), 0..0);
    }

    #[test]
    fn sampled_rows_lead_and_prompt_rows_follow() {
        let mut ctx = ForwardContext {
            cu_seqlens_q: vec![0, 1, 5, 8],
            ..Default::default()
        };
        lay_out_rows(&mut ctx, &[0..0, 0..3, 1..3], &[true, true, false]);
        assert_eq!(ctx.logits_indices, [0, 4, 1, 2, 3, 6, 7]);
    }
}
