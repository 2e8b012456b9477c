//! The per-step token masks of constrained rows, computed on a small worker
//! pool while the forward pass runs, and joined before sampling; and the
//! advance of the rows' guides past their sampled tokens, on the same pool
//! (the engine's, with the next step's masks in the same job: `pipe.rs`).
//!
//! Rows are split by lexer family ([`Guide::family`]): a family's rows
//! share one lexer and run in turn on one worker, so the shared lexer is
//! never contended; the families are taken by whichever worker is free
//! (rayon's work stealing). [`FAMILIES_PER_WORKER`] families per worker:
//! more would spread the rows of a costly lexer state (a bounded string's,
//! ~0.5 ms a row against ~10 us for most) more evenly, but every family
//! builds its lexer's states anew, which costs more than the balance
//! gains (`examples/mask_bench.rs` measures both).
//!
//! Guarantees: a job takes the guides of the step's constrained rows by
//! value and hands every one back on [`MaskJob::join`] (with its mask, in
//! the order given), so no request loses its matcher state whatever the
//! forward pass does; a mask that could not be computed allows only EOS
//! and is reported. Costs: one packed mask of `ceil(vocab / 32)` words per
//! constrained row, in host memory (the host sampler hands the buffer back
//! for the next step; the CUDA backend copies it into one device buffer it
//! keeps, so the device never allocates per step).

use super::pipe::PipeJob;
use super::Guide;
use rayon::prelude::*;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Lexer families per mask worker (see the module's header).
pub const FAMILIES_PER_WORKER: usize = 1;

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
    /// CPU seconds of each row's mask on its worker thread (unlike
    /// `row_secs`, not counting time the thread was not running: the cost
    /// of the row on a busy host).
    pub row_cpu_secs: Vec<f32>,
}

/// CPU seconds the calling thread has run (0 where the platform has no
/// per-thread clock).
pub fn thread_cpu_secs() -> f64 {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec the call writes.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            return ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
        }
    }
    0.0
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

    /// The number of workers.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
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
        self.advance_timed(rows, &mut []);
    }

    /// [`Self::advance`] that also writes each row's advance time in CPU
    /// seconds of its worker thread ([`thread_cpu_secs`]) into `secs`
    /// (rows past its length are not timed).
    pub fn advance_timed(&self, rows: &mut [(Guide, u32, Advanced)], secs: &mut [f32]) {
        let one = |((g, t, out), secs): (&mut (Guide, u32, Advanced), Option<&mut f32>)| {
            let start = secs.is_some().then(thread_cpu_secs);
            *out = match g.advance(*t) {
                Ok(()) => Advanced::Continues(!g.is_finished()),
                Err(e) => Advanced::Broken(e),
            };
            if let (Some(s), Some(start)) = (secs, start) {
                *s = (thread_cpu_secs() - start) as f32;
            }
        };
        let timed = secs
            .iter_mut()
            .map(Some)
            .chain(std::iter::repeat_with(|| None));
        // Small batches are not worth a hand-off to the pool.
        if rows.len() < 16 {
            rows.iter_mut().zip(timed).for_each(one);
            return;
        }
        let n = rows.iter().map(|r| r.0.family() + 1).max().unwrap_or(1);
        let mut buckets: Vec<Vec<_>> = (0..n).map(|_| Vec::new()).collect();
        for r in rows.iter_mut().zip(timed) {
            buckets[r.0 .0.family()].push(r);
        }
        self.pool.install(|| {
            buckets
                .into_par_iter()
                .for_each(|b| b.into_iter().for_each(one))
        });
    }

    /// Advances each `(key, guide, token)` past its token and starts the
    /// next masks of those that go on, in one job (see `pipe.rs`); `bits`
    /// is reused as the masks' buffer; `defer`: the caller takes the
    /// outcomes at the join, not before (the advance too runs on the
    /// workers).
    pub fn pipe<K: Copy + Send + 'static>(
        &self,
        rows: Vec<(K, Guide, u32)>,
        bits: Vec<u32>,
        words: usize,
        eos: Arc<[u32]>,
        defer: bool,
    ) -> PipeJob<K> {
        super::pipe::spawn(&self.pool, rows, bits, words, eos, defer)
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
            // Every word of every row is written below (a mask or only
            // EOS): no need to clear the reused buffer.
            bits.resize(guides.len() * words, 0);
            let mut row_secs = vec![0f32; guides.len()];
            let mut row_cpu_secs = vec![0f32; guides.len()];
            // A family's rows (which share a lexer) on one worker, in turn;
            // the families go to whichever worker is free.
            let n = guides
                .iter()
                .map(|(_, g)| g.family() + 1)
                .max()
                .unwrap_or(1);
            let mut buckets: Vec<Vec<_>> = (0..n).map(|_| Vec::new()).collect();
            let rows = guides
                .iter_mut()
                .zip(bits.chunks_mut(words.max(1)))
                .zip(row_secs.iter_mut().zip(row_cpu_secs.iter_mut()));
            for row in rows {
                buckets[row.0 .0 .1.family()].push(row);
            }
            let errors: Vec<(K, String)> = buckets
                .into_par_iter()
                .flat_map_iter(|b| {
                    b.into_iter().filter_map(|(((k, g), out), (secs, cpu))| {
                        let (t, c) = (Instant::now(), thread_cpu_secs());
                        let r = g.fill_mask(out, &eos).err().map(|e| (*k, e));
                        *secs = t.elapsed().as_secs_f32();
                        *cpu = (thread_cpu_secs() - c) as f32;
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
                row_cpu_secs,
            });
        });
        MaskJob { rx }
    }
}
