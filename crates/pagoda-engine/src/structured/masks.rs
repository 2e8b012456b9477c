//! The per-step token masks of constrained rows, computed on a small worker
//! pool while the forward pass runs, and joined before sampling; and the
//! advance of the rows' guides past their sampled tokens, on the same pool.
//!
//! Rows are split by lexer family ([`Guide::family`] modulo the workers):
//! a family's rows share one lexer and run in turn on one worker, so the
//! shared lexer is never contended.
//!
//! Guarantees: a job takes the guides of the step's constrained rows by
//! value and hands every one back on [`MaskJob::join`] (with its mask, in
//! the order given), so no request loses its matcher state whatever the
//! forward pass does; a mask that could not be computed allows only EOS
//! and is reported. Costs: one packed mask of `ceil(vocab / 32)` words per
//! constrained row, in host memory (the host sampler hands the buffer back
//! for the next step; the CUDA backend copies it into one device buffer it
//! keeps, so the device never allocates per step).

use super::Guide;
use rayon::prelude::*;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most per-step timings kept (the oldest are dropped past it).
const MAX_SAMPLES: usize = 1 << 20;

/// Per-step mask computation times.
#[derive(Debug, Clone, Default)]
pub struct MaskStats {
    /// Seconds each step with constrained rows spent computing its masks.
    pub step_secs: Vec<f64>,
}

impl MaskStats {
    /// `(median, p99)` of the per-step mask times in seconds, if any.
    pub fn median_p99(&self) -> Option<(f64, f64)> {
        if self.step_secs.is_empty() {
            return None;
        }
        let mut v = self.step_secs.clone();
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Some((at(0.5), at(0.99)))
    }
}

/// What a job hands back.
pub struct MaskResult<K> {
    /// The guides, in the order given, with their keys.
    pub guides: Vec<(K, Guide)>,
    /// `guides.len()` packed masks of `words` words each.
    pub bits: Vec<u32>,
    pub words: usize,
    /// Keys whose mask failed, with the matcher's error.
    pub errors: Vec<(K, String)>,
    /// Wall time of the computation.
    pub elapsed: Duration,
    /// Seconds each row's mask took, in the order of `guides`.
    pub row_secs: Vec<f32>,
}

/// A guide after [`MaskWorkers::advance`].
#[derive(Debug, Clone, PartialEq)]
pub enum Advanced {
    /// Not advanced yet.
    Pending,
    /// Advanced; `false` once the grammar is complete (only EOS may follow).
    Continues(bool),
    /// The token breaks the grammar.
    Broken(String),
}

/// A mask computation in flight.
pub struct MaskJob<K> {
    rx: mpsc::Receiver<MaskResult<K>>,
}

impl<K> MaskJob<K> {
    /// Waits for the masks. `None` only if a worker died (the guides are
    /// then lost: the caller must fail those requests).
    pub fn join(self) -> Option<MaskResult<K>> {
        self.rx.recv().ok()
    }
}

/// The worker pool and the timings of the steps it served.
pub struct MaskWorkers {
    pool: rayon::ThreadPool,
    stats: MaskStats,
}

impl MaskWorkers {
    /// A pool of `threads` workers (at least one).
    pub fn new(threads: usize) -> std::io::Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("pagoda-mask-{i}"))
            .build()
            .map_err(std::io::Error::other)?;
        Ok(MaskWorkers {
            pool,
            stats: MaskStats::default(),
        })
    }

    pub fn stats(&self) -> &MaskStats {
        &self.stats
    }

    /// Records a joined job's time.
    pub fn record(&mut self, elapsed: Duration) {
        if self.stats.step_secs.len() >= MAX_SAMPLES {
            self.stats.step_secs.drain(..MAX_SAMPLES / 2);
        }
        self.stats.step_secs.push(elapsed.as_secs_f64());
    }

    /// Advances every `(guide, token)` past its token on the workers (in
    /// place, waiting for all); the outcome lands in the third field.
    pub fn advance(&self, rows: &mut [(Guide, u32, Advanced)]) {
        let one = |(g, t, out): &mut (Guide, u32, Advanced)| {
            *out = match g.advance(*t) {
                Ok(()) => Advanced::Continues(!g.is_finished()),
                Err(e) => Advanced::Broken(e),
            }
        };
        // Small batches are not worth a hand-off to the pool.
        if rows.len() < 16 {
            rows.iter_mut().for_each(one);
            return;
        }
        let n = self.pool.current_num_threads();
        let mut buckets: Vec<Vec<&mut (Guide, u32, Advanced)>> =
            (0..n).map(|_| Vec::new()).collect();
        for r in rows.iter_mut() {
            buckets[r.0.family() % n].push(r);
        }
        self.pool.install(|| {
            buckets
                .into_par_iter()
                .for_each(|b| b.into_iter().for_each(one))
        });
    }

    /// Starts computing the masks of `guides` (all of `words` words),
    /// reusing `bits` as the output buffer; `eos` is what a failed or
    /// finished row allows.
    pub fn spawn<K: Copy + Send + 'static>(
        &self,
        mut guides: Vec<(K, Guide)>,
        mut bits: Vec<u32>,
        words: usize,
        eos: Arc<[u32]>,
    ) -> MaskJob<K> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.pool.spawn(move || {
            let start = Instant::now();
            bits.clear();
            bits.resize(guides.len() * words, 0);
            let mut row_secs = vec![0f32; guides.len()];
            // A family's rows (which share a lexer) on one worker, in turn.
            let n = rayon::current_num_threads().max(1);
            let mut buckets: Vec<Vec<_>> = (0..n).map(|_| Vec::new()).collect();
            let rows = guides
                .iter_mut()
                .zip(bits.chunks_mut(words.max(1)))
                .zip(row_secs.iter_mut());
            for row in rows {
                buckets[row.0 .0 .1.family() % n].push(row);
            }
            let errors: Vec<(K, String)> = buckets
                .into_par_iter()
                .flat_map_iter(|b| {
                    b.into_iter().filter_map(|(((k, g), out), secs)| {
                        let t = Instant::now();
                        let r = g.fill_mask(out, &eos).err().map(|e| (*k, e));
                        *secs = t.elapsed().as_secs_f32();
                        r
                    })
                })
                .collect();
            let _ = tx.send(MaskResult {
                guides,
                bits,
                words,
                errors,
                elapsed: start.elapsed(),
                row_secs,
            });
        });
        MaskJob { rx }
    }
}
