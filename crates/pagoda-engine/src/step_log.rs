//! An optional per-step timing log, for tuning the scheduler's step shapes
//! against what they cost on a device (`PAGODA_STEP_LOG=FILE`).
//!
//! One line per step: the step's decode rows, prompt tokens, and the wall
//! time of its three stages in microseconds (prepare: plan and forward
//! context; forward: the forward pass and sampling, up to the step's one
//! device sync; emit: scheduler update and outputs), and, where requests
//! are under structured outputs, the host work of their guides inside those
//! stages (mask_start: taking the guides and starting their masks; mask_wait:
//! joining the masks, guides back; advance: the guides' advance past the
//! sampled tokens), tab-separated under a header line. Off (no file, no clock reads) unless the variable is set.
//! Writes are buffered and flushed when the engine is dropped; a write error
//! turns the log off with one warning and never fails a step.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::time::Instant;

/// Microseconds of a step's structured-output host work (all 0 without
/// constrained rows), kept by the structured-output side.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct GuideTimes {
    pub start_us: u64,
    pub wait_us: u64,
    pub advance_us: u64,
}

/// The log's file, when `PAGODA_STEP_LOG` names one.
pub(crate) struct StepLog {
    out: BufWriter<File>,
}

/// The stage boundaries of one step, taken as it runs.
pub(crate) struct StepClock {
    start: Instant,
    marks: [u64; 2],
    n: usize,
}

impl StepClock {
    pub(crate) fn start() -> Self {
        StepClock {
            start: Instant::now(),
            marks: [0; 2],
            n: 0,
        }
    }

    /// Ends the current stage (at most two marks; the third stage ends at
    /// [`StepLog::record`]).
    pub(crate) fn mark(&mut self) {
        if self.n < 2 {
            self.marks[self.n] = self.start.elapsed().as_micros() as u64;
            self.n += 1;
        }
    }
}

impl StepLog {
    /// Opens the file `PAGODA_STEP_LOG` names (`None` when unset or when it
    /// cannot be created, with a warning).
    pub(crate) fn from_env() -> Option<Self> {
        let path = std::env::var_os("PAGODA_STEP_LOG")?;
        match File::create(&path) {
            Ok(f) => {
                let mut out = BufWriter::new(f);
                let _ = writeln!(
                    out,
                    "decode_rows\tprompt_tokens\tprepare_us\tforward_us\temit_us\t\
                     mask_start_us\tmask_wait_us\tadvance_us"
                );
                Some(StepLog { out })
            }
            Err(e) => {
                tracing::warn!("PAGODA_STEP_LOG: cannot create {path:?}: {e}; no step log");
                None
            }
        }
    }

    /// Writes one step's line; `false` when the write failed (the caller
    /// drops the log).
    pub(crate) fn record(
        &mut self,
        decode_rows: usize,
        prompt_tokens: usize,
        clock: &StepClock,
        guides: GuideTimes,
    ) -> bool {
        let end = clock.start.elapsed().as_micros() as u64;
        let [a, b] = clock.marks;
        let ok = writeln!(
            self.out,
            "{decode_rows}\t{prompt_tokens}\t{a}\t{}\t{}\t{}\t{}\t{}",
            b.saturating_sub(a),
            end.saturating_sub(b),
            guides.start_us,
            guides.wait_us,
            guides.advance_us
        )
        .is_ok();
        if !ok {
            tracing::warn!("PAGODA_STEP_LOG: write failed; step log off");
        }
        ok
    }
}

impl Drop for StepLog {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
}
