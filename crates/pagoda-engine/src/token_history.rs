//! A request's token history in the form device penalties read: its
//! distinct prompt + output tokens as flat `(token, output count)` pairs
//! (`pagoda_kernels::SamplingOptions::history`), kept incrementally.
//!
//! Why incremental host pairs rather than a device-resident count table:
//! a table needs a vocabulary-wide row per penalized request on the device
//! (~0.6 MB each at a 152k vocabulary), slot management and an update inside
//! the step; the pairs cost nothing on the device between steps, and the
//! step's upload of them (8 bytes per distinct token, penalized requests
//! only) rides with the step's metadata. Per step the engine does O(new
//! tokens) bookkeeping here (one hash lookup each, amortized O(1)) and one
//! copy of the pairs of each penalized row; the prompt is scanned once.
//!
//! Invariant: after [`TokenHistory::sync`] with a request's outputs, the
//! pairs hold every distinct token of prompt + outputs exactly once, in
//! first-seen order, with the number of times it occurs in the outputs
//! (0 for prompt-only tokens): exactly what the host sampler's penalties
//! compute from the full token lists.

use std::collections::HashMap;

/// Distinct tokens of a request with their output counts (see module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenHistory {
    /// Flat `(token, output count)` pairs.
    pairs: Vec<u32>,
    /// Token -> index of its pair.
    index: HashMap<u32, usize>,
    /// The prompt the history started from (kept to rebuild it).
    prompt_len: usize,
    /// Output tokens counted so far.
    counted: usize,
}

impl TokenHistory {
    /// The history of `prompt`, no outputs yet.
    pub fn from_prompt(prompt: &[u32]) -> Self {
        let mut h = TokenHistory {
            prompt_len: prompt.len(),
            ..Default::default()
        };
        for &t in prompt {
            h.slot(t);
        }
        h
    }

    /// The pair index of `t`, added with count 0 if new.
    fn slot(&mut self, t: u32) -> usize {
        let next = self.pairs.len() / 2;
        let i = *self.index.entry(t).or_insert(next);
        if i == next {
            self.pairs.extend([t, 0]);
        }
        i
    }

    /// Counts the outputs not counted yet (`outputs` is the request's
    /// whole output so far). Outputs only grow; if they ever shrank, the
    /// history is rebuilt from `prompt` and all of them.
    pub fn sync(&mut self, prompt: &[u32], outputs: &[u32]) {
        if outputs.len() < self.counted || prompt.len() != self.prompt_len {
            *self = TokenHistory::from_prompt(prompt);
        }
        for &t in &outputs[self.counted..] {
            let i = self.slot(t);
            self.pairs[2 * i + 1] = self.pairs[2 * i + 1].saturating_add(1);
        }
        self.counted = outputs.len();
    }

    /// The flat `(token, output count)` pairs.
    pub fn pairs(&self) -> &[u32] {
        &self.pairs
    }

    /// Number of distinct tokens.
    pub fn len(&self) -> usize {
        self.pairs.len() / 2
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pairs recomputed from scratch, sorted by token.
    fn reference(prompt: &[u32], outputs: &[u32]) -> Vec<(u32, u32)> {
        let mut m: std::collections::BTreeMap<u32, u32> = Default::default();
        for &t in prompt {
            m.entry(t).or_insert(0);
        }
        for &t in outputs {
            *m.entry(t).or_insert(0) += 1;
        }
        m.into_iter().collect()
    }

    fn sorted(h: &TokenHistory) -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, u32)> = h.pairs().chunks_exact(2).map(|p| (p[0], p[1])).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn incremental_counts_match_a_recount_at_every_step() {
        let prompt = [5u32, 3, 5, 9, 3, 3];
        let mut h = TokenHistory::from_prompt(&prompt);
        assert_eq!(h.pairs(), &[5, 0, 3, 0, 9, 0]);
        let mut state = 7u64;
        let mut outputs = Vec::new();
        for _ in 0..200 {
            outputs.push((crate::sampler::splitmix64(&mut state) % 13) as u32);
            h.sync(&prompt, &outputs);
            assert_eq!(sorted(&h), reference(&prompt, &outputs));
        }
        // Distinct tokens only, first-seen order kept.
        assert_eq!([h.pairs()[0], h.pairs()[2], h.pairs()[4]], [5, 3, 9]);
        assert_eq!(h.len(), reference(&prompt, &outputs).len());
    }

    #[test]
    fn several_new_tokens_at_once_and_a_shrunk_output_rebuild() {
        let prompt = [1u32, 2];
        let mut h = TokenHistory::from_prompt(&prompt);
        h.sync(&prompt, &[2, 2, 7]);
        assert_eq!(h.pairs(), &[1, 0, 2, 2, 7, 1]);
        h.sync(&prompt, &[2, 2, 7]);
        assert_eq!(h.pairs(), &[1, 0, 2, 2, 7, 1]);
        h.sync(&prompt, &[4]);
        assert_eq!(sorted(&h), reference(&prompt, &[4]));
        let empty = TokenHistory::from_prompt(&[]);
        assert!(empty.is_empty());
    }
}
