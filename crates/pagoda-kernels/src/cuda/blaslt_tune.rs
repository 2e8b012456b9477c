//! Per-plan choice of the cuBLASLt algorithm: the fastest of several
//! heuristic candidates, timed on the device while the engine warms up.
//!
//! When [`LtGemm`] makes the plan of a new `(m, bucket(n), k, mode)`, it
//! asks cuBLASLt for up to [`MAX_CANDIDATES`] algorithms that fit the
//! workspace. With tuning on ([`GemmTuning`]), the plan takes, in order:
//! 1. the choice the disk cache ([`super::blaslt_cache`]) holds for the key,
//!    once `cublasLtMatmulAlgoCheck` accepts it for the plan;
//! 2. while tuning is open (from the backend's creation until its step
//!    memory freezes, i.e. the runner's profiling steps, which run a step at
//!    every row bucket) and the stream is not capturing a graph: the
//!    fastest candidate, each run once to warm up and then [`REPS`] times
//!    between CUDA events on the call's own operands, by median; the first
//!    heuristic result keeps its place unless another beats it by more
//!    than [`MARGIN`];
//! 3. otherwise cuBLASLt's first heuristic result (as with tuning off).
//!
//! Every mode is tuned alike: bf16 and FP8 operands, either FP8 scaling,
//! each output (the cache tells them apart by `Mode::tag`). The candidates
//! all compute the same product with f32 accumulation; they differ in
//! tiling, split-K and reduction order, so the outputs agree to rounding.
//! Timing runs write only the call's own output (outputs of beta 0: bf16,
//! or the f32 sums of unit-scaled FP8, overwritten, then the chosen
//! algorithm writes them again) or, when the product is added into `y`
//! (`acc_f32`), a scratch `D` of `y`'s size (a static allocation freed
//! right after), so the call's result is exactly the chosen algorithm's. A plan, once made, keeps its algorithm, so a
//! captured graph replays what was captured; after the freeze no plan is
//! timed (a row count first seen then gets the first heuristic result, as
//! do plans under capture) and the new choices are written to disk.

use super::blaslt::{DevPtr, LtGemm, Mode, Plan, WORKSPACE_BYTES};
use super::blaslt_cache::{self as cache, AlgoKey, AlgoWords, GemmTuning};
use super::device_err;
use crate::Result;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaStream, DevicePtr};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Heuristic candidates asked for per plan.
pub(super) const MAX_CANDIDATES: i32 = 16;
/// Timed runs per candidate (after one warm-up run).
const REPS: usize = 5;
/// How much faster (as a fraction) another candidate must be to replace
/// the first heuristic result.
const MARGIN: f32 = 0.02;

/// What tuning did so far (see [`crate::cuda::CudaBackend::gemm_tuning_stats`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GemmTuningStats {
    /// The mode in force.
    pub mode: GemmTuning,
    /// Plans timed on the device.
    pub tuned: usize,
    /// Of those, plans where another candidate beat the first heuristic one.
    pub improved: usize,
    /// Plans that took their algorithm from the disk cache.
    pub from_cache: usize,
    /// Plans made with the first heuristic result (tuning off, closed, a
    /// graph capture, or a single candidate).
    pub untuned: usize,
    /// Seconds spent timing.
    pub secs: f64,
    /// Sum over the timed plans of the first heuristic result's median
    /// time, and of the chosen one's (milliseconds).
    pub first_ms: f64,
    pub chosen_ms: f64,
    /// The disk cache file, and whether the last write of it succeeded.
    pub file: Option<PathBuf>,
    pub saved: bool,
}

impl GemmTuningStats {
    /// One line for the start-up log.
    pub fn summary(&self) -> String {
        if self.mode == GemmTuning::Off {
            return format!(
                "cuBLASLt's first heuristic choice for all {} plans (tuning off)",
                self.untuned
            );
        }
        let mut s = format!(
            "{} plans timed in {:.2} s ({} faster than cuBLASLt's first choice: \
             {:.3} ms -> {:.3} ms summed over one call each), {} from the cache, {} untimed",
            self.tuned,
            self.secs,
            self.improved,
            self.first_ms,
            self.chosen_ms,
            self.from_cache,
            self.untuned
        );
        match (&self.file, self.saved) {
            (Some(f), true) => s.push_str(&format!("; cache {}", f.display())),
            (Some(f), false) if self.tuned > 0 => {
                s.push_str(&format!("; cache {} not written", f.display()))
            }
            _ => {}
        }
        s
    }
}

/// The tuning state of an [`LtGemm`] (behind its own mutex, taken after
/// the plans' one).
pub(super) struct Tuner {
    pub mode: GemmTuning,
    /// Timing allowed (until [`LtGemm::finish_tuning`]).
    pub open: bool,
    header: String,
    file: Option<PathBuf>,
    /// The file's entries and the new choices (what a save writes).
    disk: HashMap<AlgoKey, AlgoWords>,
    dirty: bool,
    pub stats: GemmTuningStats,
}

impl Tuner {
    /// The state for `mode`, reading `file` (tuning on or refresh).
    pub fn new(mode: GemmTuning, gpu: &str, file: Option<PathBuf>) -> Self {
        // SAFETY: a plain query of the loaded library.
        let version = unsafe { sys::cublasLtGetVersion() };
        let header = cache::header(gpu, version, WORKSPACE_BYTES);
        let file = if mode == GemmTuning::Off { None } else { file };
        let disk = file
            .as_deref()
            .map(|f| cache::load(f, &header))
            .unwrap_or_default();
        Tuner {
            mode,
            open: true,
            header,
            stats: GemmTuningStats {
                mode,
                file: file.clone(),
                ..Default::default()
            },
            file,
            disk,
            dirty: false,
        }
    }

    /// Writes the new choices to the cache file (if any).
    pub fn save(&mut self) {
        if !self.dirty {
            return;
        }
        if let Some(f) = &self.file {
            self.stats.saved = cache::store(f, &cache::format(&self.header, &self.disk));
        }
        self.dirty = false;
    }
}

/// The default cache file for this GPU and the loaded cuBLASLt.
pub(super) fn default_cache_file(gpu: &str) -> Option<PathBuf> {
    // SAFETY: a plain query of the loaded library.
    cache::cache_file(gpu, unsafe { sys::cublasLtGetVersion() })
}

/// Up to `count` heuristic algorithms for the plan that fit the workspace,
/// best first (cuBLASLt's order); `Err` with the status where there is none.
pub(super) fn heuristics(
    handle: sys::cublasLtHandle_t,
    p: &Plan,
    pref: sys::cublasLtMatmulPreference_t,
    count: i32,
) -> std::result::Result<Vec<sys::cublasLtMatmulAlgo_t>, sys::cublasStatus_t> {
    let count = count.max(1);
    let mut results: Vec<sys::cublasLtMatmulHeuristicResult_t> = Vec::with_capacity(count as usize);
    let mut got = 0i32;
    // SAFETY: the plan's objects are live; `results` has room for `count`
    // entries, of which cuBLASLt initializes the first `got`.
    let status = unsafe {
        let s = sys::cublasLtMatmulAlgoGetHeuristic(
            handle,
            p.desc,
            p.a,
            p.b,
            p.c,
            p.c,
            pref,
            count,
            results.as_mut_ptr(),
            &mut got,
        );
        if s == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            results.set_len(got.clamp(0, count) as usize);
        }
        s
    };
    if status != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(status);
    }
    let algos: Vec<_> = results
        .iter()
        .filter(|r| {
            r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                && r.workspaceSize <= WORKSPACE_BYTES
        })
        .map(|r| r.algo)
        .collect();
    if algos.is_empty() {
        return Err(sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED);
    }
    Ok(algos)
}

/// Whether cuBLASLt accepts `algo` for the plan within the workspace.
fn accepts(handle: sys::cublasLtHandle_t, p: &Plan, algo: &sys::cublasLtMatmulAlgo_t) -> bool {
    let mut r = std::mem::MaybeUninit::<sys::cublasLtMatmulHeuristicResult_t>::uninit();
    // SAFETY: the plan's objects are live; `r` is written on success.
    unsafe {
        let s =
            sys::cublasLtMatmulAlgoCheck(handle, p.desc, p.a, p.b, p.c, p.c, algo, r.as_mut_ptr());
        s == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
            && r.assume_init().workspaceSize <= WORKSPACE_BYTES
    }
}

/// The median milliseconds of each of `count` candidates run by `run(i)`
/// (`None` where a run failed): one warm-up run, then [`REPS`] runs each
/// between two events, one host synchronization per candidate.
fn time_candidates(
    stream: &Arc<CudaStream>,
    count: usize,
    mut run: impl FnMut(usize) -> Result<()>,
) -> Result<Vec<Option<f32>>> {
    let flags = cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
    let ev = (0..=REPS)
        .map(|_| stream.context().new_event(Some(flags)))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| device_err("GEMM tuning events", e))?;
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        if run(i).is_err() {
            out.push(None);
            continue;
        }
        let mut ok = true;
        for e in &ev[..REPS] {
            e.record(stream).map_err(|e| device_err("event", e))?;
            ok &= run(i).is_ok();
        }
        ev[REPS]
            .record(stream)
            .map_err(|e| device_err("event", e))?;
        let mut ms = Vec::with_capacity(REPS);
        for pair in ev.windows(2) {
            ms.push(
                pair[0]
                    .elapsed_ms(&pair[1])
                    .map_err(|e| device_err("GEMM tuning", e))?,
            );
        }
        ms.sort_by(f32::total_cmp);
        out.push(ok.then(|| ms[REPS / 2]));
    }
    Ok(out)
}

/// The index of the candidate to keep: the fastest, unless it beats the
/// first (cuBLASLt's own choice) by no more than [`MARGIN`].
pub(super) fn pick(ms: &[Option<f32>]) -> Option<usize> {
    let best = ms
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.map(|t| (i, t)))
        .min_by(|a, b| a.1.total_cmp(&b.1))?;
    match ms.first().copied().flatten() {
        Some(first) if best.1 >= first * (1.0 - MARGIN) => Some(0),
        _ => Some(best.0),
    }
}

impl LtGemm {
    /// The plan of `key = (m, bucket, k, mode)` for a first call of `n`
    /// rows on the operands `(wp, xp, yp)` (outer-vector FP8 `scales` set
    /// on it): its algorithm is chosen as the module docs say; `yp` is left
    /// overwritten (outputs of beta 0) or untouched (`acc_f32`).
    pub(super) fn new_plan(
        &self,
        key: (u64, u64, u64, Mode),
        n: u64,
        (wp, xp, yp): (DevPtr, DevPtr, DevPtr),
        scales: Option<&super::blaslt::Fp8Scales<'_>>,
    ) -> Result<Plan> {
        let (m, nb, k, mode) = key;
        let mut t = self.tuner.lock().unwrap_or_else(|p| p.into_inner());
        if t.mode == GemmTuning::Off {
            t.stats.untuned += 1;
            return self.plan(m, nb, k, mode, 1).map(|(p, _)| p);
        }
        let (mut p, cands) = self.plan(m, nb, k, mode, MAX_CANDIDATES)?;
        let akey = (m, nb, k, mode.tag());
        if t.mode == GemmTuning::On {
            if let Some(words) = t.disk.get(&akey) {
                let algo = sys::cublasLtMatmulAlgo_t { data: *words };
                if accepts(self.handle, &p, &algo) {
                    p.algo = algo;
                    t.stats.from_cache += 1;
                    return Ok(p);
                }
            }
        }
        let capturing = self
            .stream
            .capture_status()
            .map(|s| s != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
            .unwrap_or(true);
        if !t.open || cands.len() < 2 || capturing {
            t.stats.untuned += 1;
            return Ok(p);
        }
        let start = std::time::Instant::now();
        p.set_cols(n)?;
        if let Some(sc) = scales {
            self.set_scales(&p, sc)?;
        }
        // Added into y: time into a scratch D (C = y is only read).
        let scratch = if mode.acc_f32 {
            match self.pool.take_static::<f32>((m * n) as usize) {
                Ok(b) => Some(b),
                Err(_) => {
                    t.stats.untuned += 1;
                    return Ok(p);
                }
            }
        } else {
            None
        };
        let dp = match &scratch {
            Some(s) => s.device_ptr(&self.stream).0,
            None => yp,
        };
        let ms = time_candidates(&self.stream, cands.len(), |i| {
            self.matmul_with(&p, &cands[i], (wp, xp), yp, dp, mode.acc_f32)
        })?;
        drop(scratch);
        let Some(best) = pick(&ms) else {
            t.stats.untuned += 1;
            return Ok(p);
        };
        p.algo = cands[best];
        t.disk.insert(akey, p.algo.data);
        t.dirty = true;
        let chosen = ms[best].unwrap_or(0.0) as f64;
        t.stats.tuned += 1;
        t.stats.improved += usize::from(best != 0);
        t.stats.first_ms += ms[0].map_or(chosen, f64::from);
        t.stats.chosen_ms += chosen;
        t.stats.secs += start.elapsed().as_secs_f64();
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_candidate_stays_unless_clearly_beaten() {
        assert_eq!(pick(&[]), None);
        assert_eq!(pick(&[None, None]), None);
        assert_eq!(pick(&[Some(1.0), Some(0.99)]), Some(0));
        assert_eq!(pick(&[Some(1.0), Some(0.9), Some(0.95)]), Some(1));
        assert_eq!(pick(&[Some(1.0), Some(1.2), Some(0.5)]), Some(2));
        // A first candidate that failed to run is replaced by any other.
        assert_eq!(pick(&[None, Some(2.0), Some(3.0)]), Some(1));
    }

    #[test]
    fn the_summary_names_what_happened() {
        let s = GemmTuningStats {
            mode: GemmTuning::On,
            tuned: 12,
            improved: 5,
            from_cache: 3,
            untuned: 1,
            secs: 1.5,
            first_ms: 2.0,
            chosen_ms: 1.5,
            file: Some(PathBuf::from("/c/x.txt")),
            saved: true,
        }
        .summary();
        assert!(s.starts_with("12 plans timed in 1.50 s (5 faster"), "{s}");
        assert!(s.contains("2.000 ms -> 1.500 ms"), "{s}");
        assert!(
            s.contains("3 from the cache, 1 untimed; cache /c/x.txt"),
            "{s}"
        );
        let off = GemmTuningStats {
            untuned: 7,
            mode: GemmTuning::Off,
            ..Default::default()
        };
        assert!(off.summary().contains("all 7 plans (tuning off)"));
    }
}
