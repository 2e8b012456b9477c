//! Per-row logit adjustments of a sampling step: sparse `(token, bias)`
//! entries added to the raw logits (a bias of -inf bans the token: OpenAI's
//! `logit_bias`, vLLM's `bad_words` and `min_tokens` bans) and an optional
//! list of the only tokens that may be sampled (`allowed_token_ids`).
//!
//! Semantics (the same on every backend; [`apply_row`] is the reference):
//! every token not in a row's allowed list (when it has one) becomes -inf,
//! then each entry's bias is added in f32 (-inf stays -inf). Both happen on
//! the raw logits, before penalties, temperature and filters. On the device
//! the sum is rounded to the logits' storage precision (bf16).
//!
//! Each row's entries have strictly ascending distinct tokens (so device
//! threads never touch one logit twice) and so does its allowed list (so a
//! membership test is a binary search); [`LogitAdjustments::validate`]
//! checks it, with every token below the vocabulary size. A row holds at
//! most [`MAX_LOGIT_ENTRIES`] of each, which bounds what a step uploads
//! (the runner's profiling steps upload that much for every row).

/// Most entries, and most allowed tokens, of one row.
pub const MAX_LOGIT_ENTRIES: usize = 2048;

/// One sampling row's ranges in [`LogitAdjustments`]' lists.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowAdjust {
    pub entries_start: u32,
    pub entries_len: u32,
    pub allowed_start: u32,
    /// 0: every token is allowed (an empty allowed list is never given).
    pub allowed_len: u32,
}

impl RowAdjust {
    pub fn is_none(&self) -> bool {
        self.entries_len == 0 && self.allowed_len == 0
    }
}

/// Adjustments of a step's sampling rows: empty (no row has any), or one
/// [`RowAdjust`] per leading sampling row (later rows have none).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogitAdjustments {
    pub rows: Vec<RowAdjust>,
    /// `(token, bias)`, rows' ranges given by their `entries_*`.
    pub entries: Vec<(u32, f32)>,
    /// Allowed tokens, rows' ranges given by their `allowed_*`.
    pub allowed: Vec<u32>,
}

impl LogitAdjustments {
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn clear(&mut self) {
        self.rows.clear();
        self.entries.clear();
        self.allowed.clear();
    }

    /// Appends a row with these entries and allowed list (`None`: all).
    pub fn push_row(&mut self, entries: &[(u32, f32)], allowed: Option<&[u32]>) {
        let allowed = allowed.unwrap_or(&[]);
        self.rows.push(RowAdjust {
            entries_start: self.entries.len() as u32,
            entries_len: entries.len() as u32,
            allowed_start: self.allowed.len() as u32,
            allowed_len: allowed.len() as u32,
        });
        self.entries.extend_from_slice(entries);
        self.allowed.extend_from_slice(allowed);
    }

    /// Whether any row has an allowed list.
    pub fn any_allowed(&self) -> bool {
        self.rows.iter().any(|r| r.allowed_len > 0)
    }

    /// Whether any row has entries.
    pub fn any_entries(&self) -> bool {
        self.rows.iter().any(|r| r.entries_len > 0)
    }

    /// A row's entries and allowed list (`None`: all allowed).
    pub fn row(&self, i: usize) -> (&[(u32, f32)], Option<&[u32]>) {
        let Some(r) = self.rows.get(i) else {
            return (&[], None);
        };
        let e = r.entries_start as usize..(r.entries_start + r.entries_len) as usize;
        let a = r.allowed_start as usize..(r.allowed_start + r.allowed_len) as usize;
        let entries = self.entries.get(e).unwrap_or(&[]);
        let allowed = self.allowed.get(a).filter(|a| !a.is_empty());
        (entries, allowed)
    }

    /// Checks the adjustments against `rows` sampling rows of `vocab` logits.
    pub fn validate(&self, rows: usize, vocab: usize) -> Result<(), String> {
        if self.rows.len() > rows {
            return Err(format!(
                "{} logit adjustment rows for {rows} sampling rows",
                self.rows.len()
            ));
        }
        if i32::try_from(2 * self.entries.len() + self.allowed.len()).is_err() {
            return Err("the logit adjustments do not fit in 32 bits".into());
        }
        for (i, r) in self.rows.iter().enumerate() {
            let e_end = r.entries_start as usize + r.entries_len as usize;
            let a_end = r.allowed_start as usize + r.allowed_len as usize;
            if e_end > self.entries.len() || a_end > self.allowed.len() {
                return Err(format!("row {i}: ranges outside the lists"));
            }
            if r.entries_len as usize > MAX_LOGIT_ENTRIES
                || r.allowed_len as usize > MAX_LOGIT_ENTRIES
            {
                return Err(format!("row {i}: more than {MAX_LOGIT_ENTRIES} entries"));
            }
            let (entries, allowed) = self.row(i);
            let ids = entries.iter().map(|e| e.0);
            strictly_ascending_below(ids, vocab).map_err(|e| format!("row {i} entries: {e}"))?;
            if entries.iter().any(|e| e.1.is_nan() || e.1 == f32::INFINITY) {
                return Err(format!("row {i}: a bias is NaN or +inf"));
            }
            let ids = allowed.unwrap_or(&[]).iter().copied();
            strictly_ascending_below(ids, vocab).map_err(|e| format!("row {i} allowed: {e}"))?;
        }
        Ok(())
    }
}

fn strictly_ascending_below(ids: impl Iterator<Item = u32>, vocab: usize) -> Result<(), String> {
    let mut prev: Option<u32> = None;
    for t in ids {
        if t as usize >= vocab {
            return Err(format!("token {t} outside the vocabulary ({vocab})"));
        }
        if prev.is_some_and(|p| p >= t) {
            return Err("tokens not strictly ascending".into());
        }
        prev = Some(t);
    }
    Ok(())
}

/// The reference: applies one row's adjustments to its f32 logits in place.
pub fn apply_row(logits: &mut [f32], entries: &[(u32, f32)], allowed: Option<&[u32]>) {
    if let Some(allowed) = allowed {
        let mut next = allowed.iter().peekable();
        for (t, l) in logits.iter_mut().enumerate() {
            while next.next_if(|&&a| (a as usize) < t).is_some() {}
            if next.next_if(|&&a| a as usize == t).is_none() {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    for &(t, b) in entries {
        if let Some(l) = logits.get_mut(t as usize) {
            *l += b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_masks_then_adds() {
        let mut l = vec![1.0, 2.0, 3.0, 4.0, 5.0];
        apply_row(
            &mut l,
            &[(1, 10.0), (2, f32::NEG_INFINITY), (3, -1.0)],
            Some(&[0, 2, 3]),
        );
        let inf = f32::NEG_INFINITY;
        assert_eq!(l, vec![1.0, inf, inf, 3.0, inf]);
        let mut l = vec![1.0, 2.0];
        apply_row(&mut l, &[(0, 0.5)], None);
        assert_eq!(l, vec![1.5, 2.0]);
    }

    #[test]
    fn validation_wants_sorted_distinct_tokens_in_range() {
        let mut a = LogitAdjustments::default();
        a.push_row(&[(1, 1.0), (4, f32::NEG_INFINITY)], Some(&[2, 3]));
        a.push_row(&[], None);
        assert_eq!(a.validate(2, 5), Ok(()));
        assert!(a.validate(1, 5).is_err());
        assert!(a.validate(2, 4).is_err());
        assert_eq!(a.row(0).1, Some(&[2u32, 3][..]));
        assert_eq!(a.row(1), (&[][..], None));
        assert!(a.any_allowed() && a.any_entries());
        let mut b = LogitAdjustments::default();
        b.push_row(&[(2, 1.0), (2, 1.0)], None);
        assert!(b.validate(1, 5).is_err());
        let mut b = LogitAdjustments::default();
        b.push_row(&[], Some(&[3, 1]));
        assert!(b.validate(1, 5).is_err());
        let mut b = LogitAdjustments::default();
        b.push_row(&[(1, f32::NAN)], None);
        assert!(b.validate(1, 5).is_err());
    }
}
