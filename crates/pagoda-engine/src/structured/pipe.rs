//! A step's advance of the constrained rows past their sampled tokens and,
//! in the same job on the mask workers, the next step's masks of the rows
//! that go on. Two ways to use it: the engine ends a request whose grammar
//! is complete one step late (the default): it waits for nothing, the
//! advance and the masks run while it emits the step's outputs, plans the
//! next step and launches its forward pass, and the outcomes come with the
//! masks at [`PipeJob::join`]; or (the old order) it waits for the advance
//! outcomes ([`PipeJob::advanced`]) before emitting, the masks running on.
//!
//! A family's rows (which share a lexer, [`Guide::family`]) advance in
//! turn on one worker, the families on whichever worker is free; once
//! every row has advanced (the outcomes go to the caller then), the masks
//! are computed the same way. Under 16 rows the advance runs on the
//! calling thread (a hand-off to the pool costs more) and only the masks
//! go to the workers, unless the caller does not wait for the advance
//! (`defer`): then everything runs on the workers.
//!
//! Guarantees: the job takes the guides by value and hands every one back
//! on [`PipeJob::join`], in the order given, whether its row went on or
//! not; a row that goes on gets its next mask (a mask that could not be
//! computed allows only EOS and is reported in `errors`); a row that ended
//! (grammar complete or broken) gets a mask that allows only EOS (its row
//! of the next step, if any, is discarded by the engine), and its outcome
//! in `outcomes`.

use super::{Advanced, Guide};
use rayon::prelude::*;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Rows under which the advance runs on the calling thread.
const INLINE_ADVANCE_ROWS: usize = 16;

/// What a joined [`PipeJob`] hands back.
pub struct PipeResult<K> {
    /// The guides, in the order given, with their keys.
    pub guides: Vec<(K, Guide)>,
    /// `guides.len()` masks of `words` words each, in that order.
    pub bits: Vec<u32>,
    pub words: usize,
    /// Whether `bits` holds guide `i`'s next mask (only EOS for a row that
    /// ended).
    pub masked: Vec<bool>,
    /// Guide `i`'s advance outcome.
    pub outcomes: Vec<Advanced>,
    /// Keys whose mask failed (only EOS allowed), with the matcher's error.
    pub errors: Vec<(K, String)>,
    /// Wall time of the job on the workers.
    pub elapsed: Duration,
}

/// An advance and the next masks in flight.
pub struct PipeJob<K> {
    /// Advance outcomes `(row, outcome)`, in one batch.
    advanced: mpsc::Receiver<Vec<(u32, Advanced)>>,
    /// Rows whose outcome has not been received yet.
    waiting: usize,
    done: mpsc::Receiver<PipeResult<K>>,
}

impl<K> PipeJob<K> {
    /// Waits for the advance of every row and writes row `i`'s outcome into
    /// `out[i]`; `false` if a worker died (the guides are then lost).
    pub fn advanced(&mut self, out: &mut [Advanced]) -> bool {
        while self.waiting > 0 {
            let Ok(batch) = self.advanced.recv() else {
                return false;
            };
            self.waiting = self.waiting.saturating_sub(batch.len());
            for (i, a) in batch {
                if let Some(o) = out.get_mut(i as usize) {
                    *o = a;
                }
            }
        }
        true
    }

    /// Waits for the masks and takes the guides back. `None` only if a
    /// worker died (the guides are then lost: the caller must fail those
    /// requests).
    pub fn join(self) -> Option<PipeResult<K>> {
        self.done.recv().ok()
    }
}

/// One row's advance outcome.
fn advance(g: &mut Guide, token: u32) -> Advanced {
    match g.advance(token) {
        Ok(()) => Advanced::Continues(!g.is_finished()),
        Err(e) => Advanced::Broken(e),
    }
}

/// Advances each `(key, guide, token)` past its token and starts the masks
/// of those that go on, on `pool`; `bits` is reused as the masks' buffer,
/// `eos` is what a failed mask allows; `defer`: the caller does not wait
/// for the advance (it all runs on the workers).
pub(super) fn spawn<K: Copy + Send + 'static>(
    pool: &rayon::ThreadPool,
    rows: Vec<(K, Guide, u32)>,
    mut bits: Vec<u32>,
    words: usize,
    eos: Arc<[u32]>,
    defer: bool,
) -> PipeJob<K> {
    let n = rows.len();
    let (adv_tx, advanced) = mpsc::channel();
    let (done_tx, done) = mpsc::sync_channel(1);
    let mut guides = Vec::with_capacity(n);
    let mut tokens = Vec::with_capacity(n);
    let mut outcome: Vec<Option<Advanced>> = Vec::new();
    let inline = !defer && n < INLINE_ADVANCE_ROWS;
    if inline {
        let mut now = Vec::with_capacity(n);
        for (i, (k, mut g, t)) in rows.into_iter().enumerate() {
            let a = advance(&mut g, t);
            outcome.push(Some(a.clone()));
            now.push((i as u32, a));
            guides.push((k, g));
        }
        let _ = adv_tx.send(now);
    } else {
        for (k, g, t) in rows {
            guides.push((k, g));
            tokens.push(t);
        }
        outcome.resize(n, None);
    }
    pool.spawn(move || {
        let start = Instant::now();
        // Every word of every row is written below (a mask, or only EOS).
        bits.resize(n * words, 0);
        let mut masked = vec![false; n];
        let families = guides.iter().map(|(_, g)| g.family() + 1).max();
        let mut buckets: Vec<Vec<_>> = (0..families.unwrap_or(1)).map(|_| Vec::new()).collect();
        let rows = guides
            .iter_mut()
            .zip(bits.chunks_mut(words.max(1)))
            .zip(masked.iter_mut().zip(outcome.iter_mut()))
            .enumerate();
        for (i, ((kg, out), (m, a))) in rows {
            let t = tokens.get(i).copied().unwrap_or(0);
            buckets[kg.1.family()].push((i as u32, kg, t, out, m, a));
        }
        if !inline {
            // Every row's advance before any mask: a caller that waits
            // waits for these outcomes only.
            buckets.par_iter_mut().for_each(|b| {
                for (_, (_, g), t, _, _, a) in b.iter_mut() {
                    **a = Some(advance(g, *t));
                }
            });
            if !defer {
                let batch = buckets
                    .iter()
                    .flatten()
                    .filter_map(|(i, _, _, _, _, a)| (**a).clone().map(|a| (*i, a)))
                    .collect();
                let _ = adv_tx.send(batch);
            }
        }
        let errors: Vec<(K, String)> = buckets
            .into_par_iter()
            .flat_map_iter(|b| {
                b.into_iter().filter_map(|(_, (k, g), _, out, m, a)| {
                    *m = true;
                    if *a != Some(Advanced::Continues(true)) {
                        // Ended: its next row (if any) is discarded.
                        super::set_only(out, &eos);
                        return None;
                    }
                    g.fill_mask(out, &eos).err().map(|e| (*k, e))
                })
            })
            .collect();
        let outcomes = outcome
            .into_iter()
            .map(|a| a.unwrap_or(Advanced::Pending))
            .collect();
        let _ = done_tx.send(PipeResult {
            guides,
            bits,
            words,
            masked,
            outcomes,
            errors,
            elapsed: start.elapsed(),
        });
    });
    PipeJob {
        advanced,
        waiting: if defer { 0 } else { n },
        done,
    }
}
