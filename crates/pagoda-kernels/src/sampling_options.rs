//! Per-row options of device sampling beyond [`crate::SamplingRow`]:
//! repetition / frequency / presence penalties and logprobs, the logit
//! adjustments of [`crate::logit_adjust`] (applied before the penalties),
//! allowed-token masks of constrained rows ([`TokenMasks`], applied first),
//! and what a device sampling step returns ([`DeviceSamples`]).
//!
//! Semantics are the engine's host sampler's (pagoda-engine's `sampler`):
//! - penalties act on the raw logits row before anything else: repetition
//!   on every distinct token of prompt + output (positive logits divided by
//!   the penalty, others multiplied; skipped unless the penalty is > 0 and
//!   != 1), then `logit -= frequency * count` and `logit -= presence` for
//!   every token the output holds (`count` times), in that order, in f32;
//!   on the device the penalized logit is then rounded to the logits'
//!   storage precision (bf16), the one place the two may differ;
//! - logprobs are the log-softmax of the distribution actually sampled from
//!   (penalized, temperature-scaled, top-k / top-p / min-p filtered and
//!   renormalized; temperature 1 and no filters for greedy rows): the
//!   sampled token's, and the `n <= MAX_LOGPROBS` most likely kept tokens
//!   (probability descending, ties to the lower id; tokens of probability 0
//!   never listed).
//!
//! Prompt logprobs (vLLM's `prompt_logprobs`) ride along as extra logits
//! rows after the sampling rows ([`SamplingOptions::prompt_rows`]): for each,
//! the raw log-softmax (no penalties, temperature or filters) of a given
//! token, its rank (1 + the number of higher logits) and the `n` most likely
//! tokens, returned in [`DeviceSamples::prompt`].
//!
//! A row's history is given as distinct `(token, output count)` pairs: a
//! prompt-only token has count 0. The caller keeps them incrementally (one
//! new token per step), so building a step's options is a copy.

/// Most top logprobs a row may ask for (OpenAI's limit).
pub const MAX_LOGPROBS: usize = 20;

/// One sampling row's penalties and logprobs request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowOptions {
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    /// First pair of this row's history in [`SamplingOptions::history`].
    pub history_start: u32,
    /// Pairs of this row's history (its distinct prompt + output tokens).
    pub history_len: u32,
    /// `None`: no logprobs; `Some(n)`: the sampled token's and the top `n`.
    pub logprobs: Option<u32>,
}

impl RowOptions {
    /// No penalties, no logprobs.
    pub const NONE: RowOptions = RowOptions {
        repetition_penalty: 1.0,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        history_start: 0,
        history_len: 0,
        logprobs: None,
    };

    /// Whether any penalty changes the logits (the host sampler's test).
    pub fn has_penalties(&self) -> bool {
        (self.repetition_penalty != 1.0 && self.repetition_penalty > 0.0)
            || self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0
    }
}

/// A prompt-logprobs row: the logits row after the step's sampling rows
/// whose distribution `token` is scored under, with `n` alternatives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptRow {
    pub token: u32,
    pub n: u32,
}

/// What a prompt-logprobs row gave (see [`PromptRow`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptRowLogprobs {
    /// The row's token's logprob (-inf outside the vocabulary).
    pub logprob: f32,
    /// 1 + the number of tokens with a higher logit.
    pub rank: u32,
    /// The `n` most likely tokens with their logprobs, most likely first
    /// (ties to the lower id).
    pub top: Vec<(u32, f32)>,
}

/// Options of a step's sampling rows: empty (no row has any), or one
/// [`RowOptions`] per leading entry of [`crate::ForwardContext::sampling`]
/// (rows past the end, such as a graph's padding rows, have none).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingOptions {
    pub rows: Vec<RowOptions>,
    /// Distinct `(token, output count)` pairs, flattened, rows' ranges
    /// given by their `history_start` / `history_len`.
    pub history: Vec<u32>,
    /// Logit bias, bans and allowed lists (their own rows; may be given
    /// with `rows` empty).
    pub adjust: crate::LogitAdjustments,
    /// One per logits row after the sampling rows, in order (may be given
    /// with `rows` empty).
    pub prompt_rows: Vec<PromptRow>,
}

impl SamplingOptions {
    /// No row asks for anything.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.adjust.is_empty() && self.prompt_rows.is_empty()
    }

    pub fn clear(&mut self) {
        self.rows.clear();
        self.history.clear();
        self.adjust.clear();
        self.prompt_rows.clear();
    }

    /// Whether any row has penalties.
    pub fn any_penalties(&self) -> bool {
        self.rows.iter().any(RowOptions::has_penalties)
    }

    /// Rows asking for logprobs.
    pub fn num_logprob_rows(&self) -> usize {
        self.rows.iter().filter(|r| r.logprobs.is_some()).count()
    }

    /// Checks the options against a step of `rows` sampling rows.
    pub fn validate(&self, rows: usize) -> Result<(), String> {
        // Token ranges against the vocabulary: the kernels skip what is
        // outside it; the engine refuses such requests before.
        self.adjust.validate(rows, usize::MAX)?;
        if let Some(p) = self
            .prompt_rows
            .iter()
            .find(|p| p.n as usize > MAX_LOGPROBS)
        {
            return Err(format!(
                "a prompt row asks for {} top logprobs (at most {MAX_LOGPROBS})",
                p.n
            ));
        }
        if self.rows.is_empty() {
            return Ok(());
        }
        if self.rows.len() > rows {
            return Err(format!(
                "{} sampling option rows for {rows} sampling rows",
                self.rows.len()
            ));
        }
        if !self.history.len().is_multiple_of(2) {
            return Err("the history holds (token, count) pairs".into());
        }
        let pairs = self.history.len() / 2;
        for (i, r) in self.rows.iter().enumerate() {
            let end = r.history_start as usize + r.history_len as usize;
            if end > pairs {
                return Err(format!(
                    "row {i}: history pairs {}..{end} of {pairs}",
                    r.history_start
                ));
            }
            if let Some(n) = r.logprobs {
                if n as usize > MAX_LOGPROBS {
                    return Err(format!(
                        "row {i}: {n} top logprobs (at most {MAX_LOGPROBS})"
                    ));
                }
            }
        }
        if i32::try_from(self.history.len()).is_err() {
            return Err("the history does not fit in 32 bits".into());
        }
        Ok(())
    }
}

/// Allowed-token bitmasks of a step's constrained sampling rows
/// (structured outputs): a disallowed token's logit becomes -inf before
/// penalties and sampling, as if the token were not in the vocabulary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenMasks {
    /// u32 words per mask: `ceil(vocab / 32)`.
    pub words: usize,
    /// The sampling row of each mask, ascending.
    pub rows: Vec<u32>,
    /// `rows.len() * words` words; bit `t % 32` of word `t / 32` of a mask
    /// is set when token `t` is allowed.
    pub bits: Vec<u32>,
}

impl TokenMasks {
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Checks the masks against a step of `rows` sampling rows of `vocab`
    /// logits.
    pub fn validate(&self, rows: usize, vocab: usize) -> Result<(), String> {
        if self.is_empty() {
            return Ok(());
        }
        if self.words != vocab.div_ceil(32) {
            return Err(format!(
                "{} mask words for a vocabulary of {vocab}",
                self.words
            ));
        }
        if self.bits.len() != self.rows.len() * self.words {
            return Err(format!(
                "{} mask words for {} masks of {}",
                self.bits.len(),
                self.rows.len(),
                self.words
            ));
        }
        if self.rows.windows(2).any(|w| w[0] >= w[1]) {
            return Err("mask rows must ascend".into());
        }
        if self.rows.last().is_some_and(|&r| r as usize >= rows) {
            return Err(format!("a mask for a row past the step's {rows}"));
        }
        Ok(())
    }
}

/// Logprobs of one sampled token (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct RowLogprobs {
    /// Log-probability of the sampled token (-inf if it had none).
    pub logprob: f32,
    /// The most likely kept tokens with their logprobs, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// What device sampling returned for a step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceSamples {
    /// One token per sampling row.
    pub tokens: Vec<u32>,
    /// One entry per sampling row when any row asked for logprobs (`None`
    /// for rows that did not), else empty.
    pub logprobs: Vec<Option<RowLogprobs>>,
    /// One per [`SamplingOptions::prompt_rows`] entry, in order.
    pub prompt: Vec<PromptRowLogprobs>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_catches_bad_ranges_and_counts() {
        let mut o = SamplingOptions::default();
        assert_eq!(o.validate(3), Ok(()));
        o.rows = vec![RowOptions::NONE; 2];
        assert!(o.validate(1).is_err());
        assert_eq!(o.validate(3), Ok(()));
        o.rows[1].history_len = 1;
        assert!(o.validate(2).is_err());
        o.history = vec![5, 0];
        assert_eq!(o.validate(2), Ok(()));
        o.history.push(1);
        assert!(o.validate(2).is_err());
        o.history.pop();
        o.rows[0].logprobs = Some(21);
        assert!(o.validate(2).is_err());
        o.rows[0].logprobs = Some(20);
        assert_eq!(o.validate(2), Ok(()));
        assert_eq!(o.num_logprob_rows(), 1);
        assert!(!o.any_penalties());
        o.rows[1].presence_penalty = 0.5;
        assert!(o.any_penalties());
    }

    #[test]
    fn token_masks_validate_their_shape() {
        let mut m = TokenMasks::default();
        assert_eq!(m.validate(0, 100), Ok(()));
        m.words = 4;
        m.rows = vec![0, 2];
        m.bits = vec![0; 8];
        assert_eq!(m.validate(3, 100), Ok(()));
        assert!(m.validate(2, 100).is_err(), "row past the step");
        assert!(m.validate(3, 200).is_err(), "words for another vocabulary");
        m.rows = vec![2, 0];
        assert!(m.validate(3, 100).is_err(), "rows must ascend");
        m.rows = vec![0, 2];
        m.bits.pop();
        assert!(m.validate(3, 100).is_err(), "short bits");
    }

    #[test]
    fn repetition_penalty_of_one_or_less_than_zero_is_off() {
        let mut r = RowOptions::NONE;
        assert!(!r.has_penalties());
        r.repetition_penalty = -1.0;
        assert!(!r.has_penalties());
        r.repetition_penalty = 1.2;
        assert!(r.has_penalties());
    }
}
