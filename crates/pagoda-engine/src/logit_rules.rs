//! A request's token rules, compiled once at admission: `logit_bias`,
//! `allowed_token_ids`, `bad_words` and `min_tokens` (vLLM's semantics), and
//! for each step the sparse `(token, bias or -inf)` entries they give.
//!
//! - `logit_bias`: the bias is added to the raw logit of its token;
//! - `allowed_token_ids`: every other token is -inf;
//! - `bad_words`: each word is tokenized without and with a leading space
//!   (the spaced form kept only when its first token differs and its length
//!   does not, as vLLM does); when the output so far ends with all but the
//!   last token of a form, that last token is banned (a one-token form is
//!   always banned);
//! - `min_tokens`: while fewer tokens were generated, the end-of-sequence ids
//!   and `stop_token_ids` are banned (even with `ignore_eos`, as vLLM).
//!
//! The entries of a step are sorted by token and distinct (a ban wins over a
//! bias), which is what [`pagoda_kernels::logit_adjust`] applies, on the host
//! ([`pagoda_kernels::logit_adjust::apply_row`]) or on the device. Costs per
//! step of a request with rules: O(bias + bad word tokens + bans) plus a sort
//! of the entries; nothing for requests without.

use pagoda_core::SamplingParams;
use pagoda_kernels::MAX_LOGIT_ENTRIES;
use pagoda_model::tokenizer::Tokenizer;

/// The compiled rules of one request (see the module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogitRules {
    /// Sorted by token, distinct.
    bias: Vec<(u32, f32)>,
    /// Sorted, distinct; `None`: every token.
    allowed: Option<Vec<u32>>,
    /// Token forms of the bad words.
    bad_words: Vec<Vec<u32>>,
    min_tokens: usize,
    /// End-of-sequence and stop ids, banned before `min_tokens`.
    early_bans: Vec<u32>,
}

impl LogitRules {
    /// Compiles `params`' rules for a model of `vocab` tokens; `None` when
    /// it has none. Refuses ids outside the vocabulary, bad words without a
    /// tokenizer and rule sets larger than a row can hold.
    pub fn new(
        params: &SamplingParams,
        eos_token_ids: &[u32],
        tokenizer: Option<&Tokenizer>,
        vocab: usize,
    ) -> Result<Option<Self>, String> {
        let no_rules = params.logit_bias.is_empty()
            && params.allowed_token_ids.is_none()
            && params.bad_words.is_empty()
            && params.min_tokens == 0;
        if no_rules {
            return Ok(None);
        }
        let check = |name: &str, t: u32| {
            if (t as usize) < vocab {
                Ok(())
            } else {
                Err(format!(
                    "{name}: token id {t} is outside the vocabulary (size {vocab})"
                ))
            }
        };
        let mut bias: Vec<(u32, f32)> = Vec::with_capacity(params.logit_bias.len());
        for &(t, b) in &params.logit_bias {
            check("logit_bias", t)?;
            bias.push((t, b));
        }
        // A token given twice keeps its last bias (a JSON object's rule).
        bias.reverse();
        bias.sort_by_key(|e| e.0);
        bias.dedup_by_key(|e| e.0);
        let allowed = match &params.allowed_token_ids {
            None => None,
            Some(ids) => {
                for &t in ids {
                    check("allowed_token_ids", t)?;
                }
                let mut ids = ids.clone();
                ids.sort_unstable();
                ids.dedup();
                Some(ids)
            }
        };
        let mut bad_words = Vec::new();
        if !params.bad_words.is_empty() {
            let tok = tokenizer.ok_or("bad_words: this model has no tokenizer")?;
            for w in &params.bad_words {
                bad_words.extend(word_forms(tok, w).map_err(|e| format!("bad_words: {e}"))?);
            }
            for &t in bad_words.iter().flatten() {
                check("bad_words", t)?;
            }
        }
        let mut early_bans = Vec::new();
        if params.min_tokens > 0 {
            early_bans.extend(eos_token_ids.iter().chain(&params.stop_token_ids));
            early_bans.retain(|&t| (t as usize) < vocab);
            early_bans.sort_unstable();
            early_bans.dedup();
        }
        let most_entries = bias.len() + bad_words.len() + early_bans.len();
        if most_entries > MAX_LOGIT_ENTRIES {
            return Err(format!(
                "logit_bias: with bad_words and min_tokens, up to {most_entries} tokens \
                 would be biased or banned per step; at most {MAX_LOGIT_ENTRIES}"
            ));
        }
        if allowed
            .as_ref()
            .is_some_and(|a| a.len() > MAX_LOGIT_ENTRIES)
        {
            return Err(format!(
                "allowed_token_ids: at most {MAX_LOGIT_ENTRIES} distinct tokens"
            ));
        }
        Ok(Some(LogitRules {
            bias,
            allowed,
            bad_words,
            min_tokens: params.min_tokens,
            early_bans,
        }))
    }

    /// The only tokens that may be sampled (sorted), if restricted.
    pub fn allowed(&self) -> Option<&[u32]> {
        self.allowed.as_deref()
    }

    /// Writes into `out` (cleared) the step's entries for an output of
    /// `output` so far: sorted by token, distinct, bans as -inf.
    pub fn entries(&self, output: &[u32], out: &mut Vec<(u32, f32)>) {
        out.clear();
        out.extend_from_slice(&self.bias);
        let ban = f32::NEG_INFINITY;
        let before = out.len();
        if output.len() < self.min_tokens {
            out.extend(self.early_bans.iter().map(|&t| (t, ban)));
        }
        for form in &self.bad_words {
            if let Some((&last, prefix)) = form.split_last() {
                if output.ends_with(prefix) {
                    out.push((last, ban));
                }
            }
        }
        if out.len() > before {
            // Stable: for one token a bias comes before its bans.
            out.sort_by_key(|e| e.0);
            out.dedup_by(|later, first| {
                let same = later.0 == first.0;
                if same {
                    first.1 = ban;
                }
                same
            });
        }
    }
}

/// vLLM's token forms of a bad word: `word.trim_start()` tokenized without
/// special tokens, then with a leading space, the latter kept only when its
/// first token differs and its length is the same.
fn word_forms(tok: &Tokenizer, word: &str) -> Result<Vec<Vec<u32>>, String> {
    let bare = word.trim_start();
    let plain = tok.encode(bare, false).map_err(|e| e.to_string())?;
    let spaced = tok
        .encode(&format!(" {bare}"), false)
        .map_err(|e| e.to_string())?;
    let mut forms = Vec::with_capacity(2);
    let keep_spaced =
        plain.first().is_some_and(|&p| spaced.first() != Some(&p)) && spaced.len() == plain.len();
    if !plain.is_empty() {
        forms.push(plain);
    }
    if keep_spaced {
        forms.push(spaced);
    }
    Ok(forms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(p: SamplingParams, eos: &[u32]) -> LogitRules {
        LogitRules::new(&p, eos, None, 100).unwrap().unwrap()
    }

    #[test]
    fn no_rules_is_none_and_ids_are_checked() {
        let p = SamplingParams::default();
        assert_eq!(LogitRules::new(&p, &[2], None, 10), Ok(None));
        let p = SamplingParams {
            logit_bias: vec![(10, 1.0)],
            ..Default::default()
        };
        assert!(LogitRules::new(&p, &[2], None, 10).is_err());
        let p = SamplingParams {
            allowed_token_ids: Some(vec![3, 12]),
            ..Default::default()
        };
        assert!(LogitRules::new(&p, &[2], None, 10).is_err());
        let p = SamplingParams {
            bad_words: vec!["x".into()],
            ..Default::default()
        };
        assert!(LogitRules::new(&p, &[2], None, 10).is_err(), "no tokenizer");
    }

    #[test]
    fn entries_merge_bias_and_bans_in_token_order() {
        let r = rules(
            SamplingParams {
                logit_bias: vec![(7, 1.0), (2, 3.0), (7, 5.0)],
                min_tokens: 2,
                stop_token_ids: vec![9],
                ..Default::default()
            },
            &[2],
        );
        let mut e = Vec::new();
        r.entries(&[4], &mut e);
        let inf = f32::NEG_INFINITY;
        assert_eq!(e, vec![(2, inf), (7, 5.0), (9, inf)]);
        r.entries(&[4, 4], &mut e);
        assert_eq!(e, vec![(2, 3.0), (7, 5.0)], "min_tokens reached");
    }

    #[test]
    fn bad_word_forms_ban_their_last_token_after_the_prefix() {
        let r = LogitRules {
            bad_words: vec![vec![5], vec![6, 7, 8]],
            ..Default::default()
        };
        let mut e = Vec::new();
        let inf = f32::NEG_INFINITY;
        r.entries(&[], &mut e);
        assert_eq!(e, vec![(5, inf)]);
        r.entries(&[1, 6, 7], &mut e);
        assert_eq!(e, vec![(5, inf), (8, inf)]);
        r.entries(&[6, 1, 7], &mut e);
        assert_eq!(e, vec![(5, inf)]);
    }
}
