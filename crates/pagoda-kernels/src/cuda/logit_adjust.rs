//! Device logit adjustments ([`crate::logit_adjust`]): their packed form,
//! uploaded with the step's sampling options (in the step's metadata, or in
//! a graph replay's options upload), and the two launches that apply them
//! to the logits rows before penalties and the draw (`allow_only_bf16`,
//! then `logit_entries_bf16`; kernels in `kernels/logit_adjust.cu`).
//!
//! Packed: 4 ints per sampling row (entries start and length, allowed start
//! and length; rows past the given ones have none), then the entries as
//! (token, bias bits) pairs, then the allowed tokens, then one trailing int
//! so every span lies inside the buffer.
//!
//! Invariants: launches depend on (rows, vocab) and on whether any row has
//! entries / an allowed list, never on other values; they run outside
//! captured graphs. No device allocation: the packed ints ride in a buffer
//! from the step arena, bounded by [`crate::MAX_LOGIT_ENTRIES`] per row
//! (which the runner's profiling steps reach). Costs: one pass over each row's
//! entries; for allowed lists, O(V log A) per row that has one.

use super::storage::{CudaTensor, Span};
use super::CudaBackend;
use crate::{KernelError, LogitAdjustments, Result};
use cudarc::driver::{CudaView, LaunchConfig};

/// Ints per row header (the kernels' `LA_ROW_INTS`).
const ROW_INTS: usize = 4;
/// Threads per block (`LA_THREADS`).
const THREADS: u32 = 256;
/// Tokens each thread of `allow_only_bf16` covers, at most (sets the grid).
const TOKENS_PER_THREAD: usize = 8;

/// Where the packed adjustments are, and which launches they need.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct AdjustSpans {
    pub rows: Span,
    pub entries: Span,
    pub allowed: Span,
    pub any_entries: bool,
    pub any_allowed: bool,
}

impl AdjustSpans {
    /// Whether anything is to be launched.
    pub fn active(&self) -> bool {
        self.any_entries || self.any_allowed
    }
}

/// Appends `adj` (validated for `rows` sampling rows) to `packed`.
pub(crate) fn pack_adjust(
    adj: &LogitAdjustments,
    rows: usize,
    packed: &mut Vec<i32>,
) -> AdjustSpans {
    if adj.is_empty() {
        return AdjustSpans::default();
    }
    let header = Span {
        start: packed.len(),
        len: rows * ROW_INTS,
    };
    for i in 0..rows {
        let r = adj.rows.get(i).copied().unwrap_or_default();
        packed.extend([
            r.entries_start as i32,
            r.entries_len as i32,
            r.allowed_start as i32,
            r.allowed_len as i32,
        ]);
    }
    let entries = Span {
        start: packed.len(),
        len: 2 * adj.entries.len(),
    };
    for &(t, b) in &adj.entries {
        packed.extend([t.min(i32::MAX as u32) as i32, b.to_bits() as i32]);
    }
    let allowed = Span {
        start: packed.len(),
        len: adj.allowed.len(),
    };
    packed.extend(adj.allowed.iter().map(|&t| t.min(i32::MAX as u32) as i32));
    packed.push(0);
    AdjustSpans {
        rows: header,
        entries,
        allowed,
        any_entries: adj.any_entries(),
        any_allowed: adj.any_allowed(),
    }
}

fn shape_err(detail: String) -> KernelError {
    KernelError::Shape {
        op: "logit adjustments",
        detail,
    }
}

/// Applies the packed adjustments (views of `spans` in one device buffer,
/// given by `view`) to the leading `rows` rows of `logits` in place.
pub(crate) fn launch_adjust<'a>(
    b: &CudaBackend,
    logits: &CudaTensor,
    rows: usize,
    spans: &AdjustSpans,
    view: impl Fn(Span) -> CudaView<'a, i32>,
) -> Result<()> {
    let vocab = logits.cols;
    if !spans.active() || rows == 0 || vocab == 0 {
        return Ok(());
    }
    if logits.rows < rows {
        return Err(shape_err(format!(
            "{} logits rows for {rows} sampling rows",
            logits.rows
        )));
    }
    if spans.rows.len != rows * ROW_INTS {
        return Err(shape_err(format!(
            "{} header ints for {rows} rows",
            spans.rows.len
        )));
    }
    let grid_rows = u32::try_from(rows)
        .ok()
        .filter(|&r| r < i32::MAX as u32 / ROW_INTS as u32)
        .ok_or_else(|| shape_err(format!("{rows} rows")))?;
    let v = i32::try_from(vocab).map_err(|_| shape_err(format!("vocab {vocab}")))?;
    let header = view(spans.rows);
    if spans.any_allowed {
        let allowed = view(spans.allowed);
        let chunks = vocab
            .div_ceil(THREADS as usize * TOKENS_PER_THREAD)
            .clamp(1, 65535) as u32;
        let mut l = b.dev.launch("allow_only_bf16")?;
        l.arg(logits.bf16("allow_only")?)
            .arg(&header)
            .arg(&allowed)
            .arg(&v);
        let cfg = LaunchConfig {
            grid_dim: (grid_rows, chunks, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // In bounds: each row's allowed range lies inside `allowed` (validated
        // when packed); the kernel writes only this row's logits below `vocab`.
        l.run(cfg)?;
    }
    if spans.any_entries {
        let entries = view(spans.entries);
        let mut l = b.dev.launch("logit_entries_bf16")?;
        l.arg(logits.bf16("logit_entries")?)
            .arg(&header)
            .arg(&entries)
            .arg(&v);
        let cfg = LaunchConfig {
            grid_dim: (grid_rows, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // In bounds: each row's entry range lies inside `entries` (validated
        // when packed); tokens outside the vocabulary are skipped.
        l.run(cfg)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_pads_rows_and_lays_out_lists() {
        let mut a = LogitAdjustments::default();
        a.push_row(&[(5, 2.0)], None);
        a.push_row(&[], Some(&[1, 3]));
        let mut packed = vec![9];
        let s = pack_adjust(&a, 3, &mut packed);
        assert_eq!(s.rows, Span { start: 1, len: 12 });
        assert_eq!(s.entries, Span { start: 13, len: 2 });
        assert_eq!(s.allowed, Span { start: 15, len: 2 });
        assert!(s.any_entries && s.any_allowed);
        assert_eq!(&packed[1..13], &[0, 1, 0, 0, 1, 0, 0, 2, 0, 0, 0, 0]);
        assert_eq!(&packed[13..15], &[5, 2.0f32.to_bits() as i32]);
        assert_eq!(&packed[15..], &[1, 3, 0]);
        let none = pack_adjust(&LogitAdjustments::default(), 3, &mut packed);
        assert!(!none.active());
    }
}
