//! The engine's side of structured outputs: the compiler and mask workers
//! (made at the first constrained request, or built on a thread of their
//! own while the model loads where the forward pass runs on a device:
//! [`StructuredBuild`]), and a step's mask round trip:
//! the masks of rows that went on from the last step were started by its
//! advance (`pipe`) and are in flight; the other constrained rows' guides
//! start theirs; both are joined into a [`TokenMasks`] (rows in sampling
//! order, the pipelined buffer itself when it holds exactly the step's
//! rows) and every guide goes back; after sampling, the rows that go on
//! advance and start their next masks in one job, the engine waiting for
//! the advance only.

use super::pipe::{PipeJob, PipeResult};
use super::{Advanced, GrammarCompiler, Guide, MaskJob, MaskResult, MaskWorkers, StructuredError};
use crate::step_log::GuideTimes;
use pagoda_core::{RequestId, StructuredOutput};
use pagoda_kernels::TokenMasks;
use pagoda_model::tokenizer::Tokenizer;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// Mask worker threads when the forward pass runs on the host's cores
/// (see [`mask_threads_for`]).
pub fn mask_threads() -> Result<usize, StructuredError> {
    mask_threads_for(false)
}

/// Mask worker threads: masks of different rows are independent. With the
/// forward pass on a device (`device`) the host's cores are idle while it
/// runs, so every core but two (the engine thread and the server's) takes
/// a share of the step's rows, up to 16; with the forward pass on the
/// host's cores the workers share those cores with it: up to 4.
/// `PAGODA_MASK_THREADS=N` (1-256) sets the count instead; any other value
/// is an error.
pub fn mask_threads_for(device: bool) -> Result<usize, StructuredError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let env = std::env::var("PAGODA_MASK_THREADS").ok();
    threads_of(cores, device, env.as_deref()).map_err(env_error)
}

/// [`mask_threads_for`] on `cores` cores with `env` as the variable's
/// value.
fn threads_of(cores: usize, device: bool, env: Option<&str>) -> Result<usize, String> {
    if let Some(v) = env.map(str::trim).filter(|v| !v.is_empty()) {
        return match v.parse::<usize>() {
            Ok(n) if (1..=256).contains(&n) => Ok(n),
            _ => Err(format!(
                "PAGODA_MASK_THREADS={v:?} (expected a count of 1-256)"
            )),
        };
    }
    Ok(if device {
        cores.saturating_sub(2).clamp(1, 16)
    } else {
        cores.clamp(1, 4)
    })
}

pub(crate) struct StructuredEngine {
    compiler: GrammarCompiler,
    workers: MaskWorkers,
    eos: Arc<[u32]>,
    /// Mask buffers between steps (at most three: the pipelined masks, the
    /// fresh ones, the step's assembled ones).
    spare: Vec<Vec<u32>>,
    /// The last step's advance with the next masks, in flight.
    pipe: Option<PipeJob<RequestId>>,
    /// Where each request of `pipe` sits in it.
    pipe_index: HashMap<RequestId, u32>,
    /// Whether the advance starts the next masks ([`pipelined`]).
    pipelined: bool,
    /// Whether the advance's outcomes are taken at the next join instead
    /// of waited for ([`deferred`]; then always pipelined).
    deferred: bool,
    /// This step's host times so far (for the step log).
    times: GuideTimes,
}

/// Whether a step's advance starts the next step's masks in the same job
/// (with `PAGODA_MASK_PIPELINE=on`, `1` or `true`), or the advance is
/// waited for alone and each step starts all its masks itself (the default,
/// also `off`, `0`, `false` or `auto`: on an H100 the pipeline measured no
/// gain, see BENCHMARKS.md). Any other value is an error.
pub fn pipelined() -> Result<bool, StructuredError> {
    on_off("PAGODA_MASK_PIPELINE", false)
}

/// Whether a request whose grammar a step's token completes is ended at the
/// next step's mask join, the engine never waiting for the advance (the
/// default), or on that token, the engine waiting for the advance before
/// emitting the step's outputs (`PAGODA_GUIDE_DEFER=off`, `0` or `false`;
/// any value not an on/off name is an error). The outputs' tokens are the
/// same either way.
pub fn deferred() -> Result<bool, StructuredError> {
    on_off("PAGODA_GUIDE_DEFER", true)
}

/// An on/off environment knob ([`pagoda_kernels::knob::on_off`]).
fn on_off(name: &str, default: bool) -> Result<bool, StructuredError> {
    pagoda_kernels::knob::on_off(name, default).map_err(|e| env_error(e.to_string()))
}

/// A knob's bad value as the grammar engine's error.
fn env_error(message: String) -> StructuredError {
    StructuredError {
        kind: "structured output",
        message,
    }
}

/// The structured-output compiler and mask workers of a device engine,
/// being built on a thread of their own: started before the model loads
/// (the token trie and llguidance's slicer take 0.1-0.3 s of CPU), so that
/// the first constrained request finds them ready instead of waiting for
/// them. Given to the engine with [`crate::LlmEngine::set_structured_build`].
pub struct StructuredBuild {
    thread: Option<std::thread::JoinHandle<Result<StructuredEngine, StructuredError>>>,
    /// What it is built for: the logits row width and the stop ids.
    vocab_size: usize,
    eos: Vec<u32>,
}

impl StructuredBuild {
    /// Starts building for a model of `vocab_size` logits whose generation
    /// ends at `eos` (the engine's stop ids, [`crate::engine::stop_token_ids`]).
    pub fn start(tokenizer: Arc<Tokenizer>, vocab_size: usize, eos: Vec<u32>) -> Self {
        let ids = eos.clone();
        let build = move || StructuredEngine::new(Some(&tokenizer), vocab_size, &ids, true);
        // A thread that cannot be started: the first constrained request
        // builds it, as without this.
        StructuredBuild {
            thread: std::thread::Builder::new()
                .name("pagoda-grammar".into())
                .spawn(build)
                .ok(),
            vocab_size,
            eos,
        }
    }

    /// The built engine, or its error; `None` if there is no thread, it
    /// died, or it was built for another vocabulary or other stop ids than
    /// `vocab_size` and `eos` (the caller builds it anew).
    pub(crate) fn join(
        self,
        vocab_size: usize,
        eos: &[u32],
    ) -> Option<Result<StructuredEngine, StructuredError>> {
        let built = self.thread?.join().ok()?;
        (self.vocab_size == vocab_size && self.eos == eos).then_some(built)
    }
}

/// A step's masks in flight: the pipelined ones of the rows that went on
/// from the last step, and the fresh ones of the others (keys: request,
/// sampling row).
/// The pipelined job itself stays with the [`StructuredEngine`] until
/// [`StructuredEngine::finish`] joins it, so that a step that fails before
/// joining its masks loses none of the guides in flight (the next step
/// or advance joins them).
pub(crate) struct PendingMasks {
    /// `(sampling row, index in the pipelined job)`, rows ascending.
    from_pipe: Vec<(u32, u32)>,
    fresh: Option<MaskJob<(RequestId, u32)>>,
}

impl StructuredEngine {
    /// `device`: the forward pass runs on a device (see
    /// [`mask_threads_for`]).
    pub fn new(
        tokenizer: Option<&Arc<Tokenizer>>,
        vocab_size: usize,
        eos: &[u32],
        device: bool,
    ) -> Result<Self, StructuredError> {
        let tokenizer = tokenizer.ok_or_else(|| StructuredError {
            kind: "structured output",
            message: "structured outputs need the model's tokenizer".into(),
        })?;
        let threads = mask_threads_for(device)?;
        let compiler = GrammarCompiler::new(tokenizer.clone(), vocab_size, eos)?
            .with_families(threads * super::FAMILIES_PER_WORKER);
        let workers = MaskWorkers::new(threads).map_err(|e| StructuredError {
            kind: "structured output",
            message: format!("no mask workers: {e}"),
        })?;
        Ok(StructuredEngine {
            compiler,
            workers,
            eos: eos.into(),
            spare: Vec::new(),
            pipe: None,
            pipe_index: HashMap::new(),
            pipelined: pipelined()?,
            deferred: deferred()?,
            times: GuideTimes::default(),
        })
    }

    pub fn compile(&self, c: &StructuredOutput) -> Result<Guide, StructuredError> {
        self.compiler.compile(c)
    }

    pub fn workers(&self) -> &MaskWorkers {
        &self.workers
    }

    /// Pushes onto `ended` the rows of a joined job whose advance ended
    /// them (grammar complete or broken), when those are deferred.
    fn report_ended(&self, p: &PipeResult<RequestId>, ended: &mut Vec<(RequestId, Advanced)>) {
        if !self.deferred {
            return;
        }
        for ((id, _), a) in p.guides.iter().zip(&p.outcomes) {
            if matches!(a, Advanced::Continues(false) | Advanced::Broken(_)) {
                ended.push((*id, a.clone()));
            }
        }
    }

    fn buffer(&mut self) -> Vec<u32> {
        self.spare.pop().unwrap_or_default()
    }

    fn give_back(&mut self, bits: Vec<u32>) {
        if self.spare.len() < 3 {
            self.spare.push(bits);
        }
    }

    /// Starts a step's masks: `rows` are its sampling rows ((request,
    /// row), rows ascending); a row whose guide is in flight from the last
    /// step's advance takes the mask computed there, the others' guides
    /// (taken with `take`) start a fresh mask now. `None` when nothing is
    /// in flight and no row is constrained.
    pub fn start(
        &mut self,
        rows: impl Iterator<Item = (RequestId, u32)>,
        mut take: impl FnMut(RequestId) -> Option<Guide>,
    ) -> Option<PendingMasks> {
        let mut from_pipe = Vec::new();
        let mut fresh = Vec::new();
        for (id, row) in rows {
            if let Some(&j) = self.pipe_index.get(&id) {
                from_pipe.push((row, j));
            } else if let Some(g) = take(id) {
                fresh.push(((id, row), g));
            }
        }
        let fresh = match fresh.first() {
            Some((_, g)) => {
                let words = g.mask_words();
                let bits = self.buffer();
                Some(self.workers.spawn(fresh, bits, words, self.eos.clone()))
            }
            None => None,
        };
        if self.pipe.is_none() && fresh.is_none() {
            return None;
        }
        Some(PendingMasks { from_pipe, fresh })
    }

    /// Joins a step's masks and gives every guide back through
    /// `put_back` (those in flight whose row is not in the step too); rows
    /// whose mask failed (only EOS allowed) are logged. The masks come in
    /// sampling-row order. Requests whose last advance ended their grammar
    /// (deferred) are pushed onto `ended` with the outcome, whether their
    /// row is in this step or not.
    pub fn finish(
        &mut self,
        pending: PendingMasks,
        mut put_back: impl FnMut(RequestId, Guide),
        ended: &mut Vec<(RequestId, Advanced)>,
    ) -> Result<TokenMasks, String> {
        let PendingMasks { from_pipe, fresh } = pending;
        self.pipe_index.clear();
        let pipe = self.pipe.take();
        // Both joined before anything can fail, so that every guide that
        // came back goes back.
        let pipe = pipe.map(|p| p.join());
        let fresh = fresh.map(|f| f.join());
        if matches!(pipe, Some(None)) || matches!(fresh, Some(None)) {
            for (id, g) in pipe.into_iter().flatten().flat_map(|p| p.guides) {
                put_back(id, g);
            }
            for ((id, _), g) in fresh.into_iter().flatten().flat_map(|f| f.guides) {
                put_back(id, g);
            }
            return Err("a token mask worker died".into());
        }
        let mut pipe = pipe.flatten();
        let fresh = fresh.flatten();
        let mut elapsed = std::time::Duration::ZERO;
        if let Some(p) = pipe.as_mut() {
            self.report_ended(p, ended);
            elapsed = elapsed.max(p.elapsed);
            for (id, e) in &p.errors {
                tracing::warn!(request = id.0, error = %e, "structured output: no valid next token");
            }
            // A row in the step without its next mask (not expected: a
            // row that did not go on has ended) has it computed here.
            for &(_, j) in &from_pipe {
                let j = j as usize;
                if p.masked.get(j) == Some(&false) {
                    let w = p.words;
                    if let (Some((id, g)), Some(out)) =
                        (p.guides.get_mut(j), p.bits.get_mut(j * w..(j + 1) * w))
                    {
                        if let Err(e) = g.fill_mask(out, &self.eos) {
                            tracing::warn!(request = id.0, error = %e,
                                "structured output: no valid next token");
                        }
                        p.masked[j] = true;
                    }
                }
            }
        }
        if let Some(f) = fresh.as_ref() {
            elapsed = elapsed.max(f.elapsed);
            for ((id, _), e) in &f.errors {
                tracing::warn!(request = id.0, error = %e, "structured output: no valid next token");
            }
        }
        if pipe.is_some() || fresh.is_some() {
            self.workers.record(elapsed);
        }
        let masks = self.assemble(pipe.as_mut(), &from_pipe, fresh.as_ref());
        if let Some(p) = pipe {
            for (id, g) in p.guides {
                put_back(id, g);
            }
            if !p.bits.is_empty() {
                self.give_back(p.bits);
            }
        }
        if let Some(f) = fresh {
            for ((id, _), g) in f.guides {
                put_back(id, g);
            }
            if !f.bits.is_empty() {
                self.give_back(f.bits);
            }
        }
        Ok(masks)
    }

    /// The step's masks, rows ascending, from the pipelined and fresh ones:
    /// the pipelined buffer itself when it holds exactly the step's rows in
    /// order (the common decode step), else a copy of each row's mask.
    fn assemble(
        &mut self,
        pipe: Option<&mut PipeResult<RequestId>>,
        from_pipe: &[(u32, u32)],
        fresh: Option<&MaskResult<(RequestId, u32)>>,
    ) -> TokenMasks {
        let fresh_rows = fresh.map_or(0, |f| f.guides.len());
        if let Some(p) = pipe {
            let whole = fresh_rows == 0
                && from_pipe.len() == p.guides.len()
                && from_pipe
                    .iter()
                    .enumerate()
                    .all(|(i, &(_, j))| j as usize == i);
            if whole {
                return TokenMasks {
                    words: p.words,
                    rows: from_pipe.iter().map(|&(r, _)| r).collect(),
                    bits: std::mem::take(&mut p.bits),
                };
            }
            let words = p.words;
            let mut masks = TokenMasks {
                words,
                rows: Vec::with_capacity(from_pipe.len() + fresh_rows),
                bits: self.buffer(),
            };
            masks.bits.clear();
            let fresh_iter = fresh.into_iter().flat_map(|f| {
                f.guides
                    .iter()
                    .zip(f.bits.chunks_exact(f.words.max(1)))
                    .map(|(((_, r), _), b)| (*r, b))
            });
            let pipe_iter = from_pipe.iter().filter_map(|&(r, j)| {
                let j = j as usize;
                p.bits.get(j * words..(j + 1) * words).map(|b| (r, b))
            });
            let mut all: Vec<(u32, &[u32])> = pipe_iter.chain(fresh_iter).collect();
            all.sort_unstable_by_key(|&(r, _)| r);
            for (r, b) in all {
                masks.rows.push(r);
                masks.bits.extend_from_slice(b);
            }
            return masks;
        }
        match fresh {
            Some(f) => {
                let mut bits = self.buffer();
                bits.clear();
                bits.extend_from_slice(&f.bits);
                TokenMasks {
                    words: f.words,
                    rows: f.guides.iter().map(|((_, r), _)| *r).collect(),
                    bits,
                }
            }
            None => TokenMasks::default(),
        }
    }

    /// Advances `rows` ((request, guide, sampled token), each going on) past
    /// their tokens, writing row `i`'s outcome into `out[i]`, and starts the
    /// masks of those that go on for the next step (joined by its
    /// [`Self::finish`]). Deferred, nothing is waited for and `out` stays
    /// [`Advanced::Pending`]: the outcomes come at that join. A step whose
    /// masks are still in flight (not expected: every step joins its own)
    /// has them joined first, through `put_back`, its ended rows pushed
    /// onto `ended`. Err: a worker died, and the guides with it.
    pub fn advance(
        &mut self,
        rows: Vec<(RequestId, Guide, u32)>,
        out: &mut [Advanced],
        mut put_back: impl FnMut(RequestId, Guide),
        ended: &mut Vec<(RequestId, Advanced)>,
    ) -> Result<(), String> {
        if let Some(p) = self.pipe.take() {
            self.pipe_index.clear();
            let r = p.join().ok_or("a token mask worker died")?;
            self.report_ended(&r, ended);
            for (id, g) in r.guides {
                put_back(id, g);
            }
            self.give_back(r.bits);
        }
        let Some(words) = rows.first().map(|(_, g, _)| g.mask_words()) else {
            return Ok(());
        };
        if !self.pipelined && !self.deferred {
            let (ids, mut work): (Vec<_>, Vec<_>) = rows
                .into_iter()
                .map(|(id, g, t)| (id, (g, t, Advanced::Pending)))
                .unzip();
            self.workers.advance(&mut work);
            for ((id, (g, _, a)), o) in ids.into_iter().zip(work).zip(out.iter_mut()) {
                *o = a;
                put_back(id, g);
            }
            return Ok(());
        }
        self.pipe_index.clear();
        for (i, (id, _, _)) in rows.iter().enumerate() {
            self.pipe_index.insert(*id, i as u32);
        }
        let bits = self.buffer();
        let defer = self.deferred;
        let mut job = self
            .workers
            .pipe(rows, bits, words, self.eos.clone(), defer);
        let ok = defer || job.advanced(out);
        self.pipe = Some(job);
        if ok {
            Ok(())
        } else {
            Err("a token mask worker died".into())
        }
    }

    /// Adds `since`'s elapsed time to one of this step's times.
    pub fn add_time(&mut self, since: Instant, field: fn(&mut GuideTimes) -> &mut u64) {
        *field(&mut self.times) += since.elapsed().as_micros() as u64;
    }

    /// This step's times, reset for the next.
    pub fn take_times(&mut self) -> GuideTimes {
        std::mem::take(&mut self.times)
    }

    /// Takes back the mask buffer of a step's [`TokenMasks`].
    pub fn recycle(&mut self, masks: TokenMasks) {
        if !masks.bits.is_empty() {
            self.give_back(masks.bits);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_threads_take_the_cores_a_device_leaves_free() {
        // Beside a CPU forward pass: up to 4.
        assert_eq!(threads_of(2, false, None), Ok(2));
        assert_eq!(threads_of(16, false, None), Ok(4));
        // Beside a device's: all cores but two, 1-16.
        assert_eq!(threads_of(1, true, None), Ok(1));
        assert_eq!(threads_of(2, true, None), Ok(1));
        assert_eq!(threads_of(16, true, None), Ok(14));
        assert_eq!(threads_of(64, true, None), Ok(16));
        // The variable wins when it is a count; else it is an error.
        assert_eq!(threads_of(16, true, Some("4")), Ok(4));
        assert_eq!(threads_of(16, true, Some(" 8 ")), Ok(8));
        assert_eq!(threads_of(16, true, Some(" ")), Ok(14));
        assert!(threads_of(16, true, Some("0")).is_err());
        assert!(threads_of(16, false, Some("many")).is_err());
    }

    #[test]
    fn one_schema_spreads_over_every_mask_worker() {
        // One lexer family per worker, so that the requests of a single
        // schema are not all masked on one worker.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/golden/smollm2-tokenizer/tokenizer.json");
        let tok = Arc::new(Tokenizer::from_hf_file(path).unwrap());
        for device in [false, true] {
            let s = StructuredEngine::new(Some(&tok), 49152, &[2], device).unwrap();
            let threads = mask_threads_for(device).unwrap();
            assert_eq!(s.workers.threads(), threads);
            assert_eq!(
                s.compiler.families,
                threads * super::super::FAMILIES_PER_WORKER
            );
        }
    }

    #[test]
    fn a_compiler_built_on_its_own_thread_compiles() {
        let tok = || {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/golden/smollm2-tokenizer/tokenizer.json");
            Arc::new(Tokenizer::from_hf_file(path).unwrap())
        };
        let built = StructuredBuild::start(tok(), 49152, vec![2])
            .join(49152, &[2])
            .expect("the build thread ran")
            .unwrap();
        let mut g = built
            .compile(&StructuredOutput::Regex("ab|cd".into()))
            .unwrap();
        let mut mask = vec![0u32; g.mask_words()];
        g.fill_mask(&mut mask, &[2]).unwrap();
        // Something is allowed, not EOS yet.
        assert_eq!(mask[0] >> 2 & 1, 0);
        assert!(mask.iter().any(|&w| w != 0));
        // Its errors come back as they would built in place.
        let e = StructuredBuild::start(tok(), 49152, vec![]).join(49152, &[]);
        assert!(matches!(e, Some(Err(_))), "no EOS id must be an error");
        // One built for another vocabulary or other stop ids is not taken.
        assert!(StructuredBuild::start(tok(), 49152, vec![2])
            .join(49153, &[2])
            .is_none());
        assert!(StructuredBuild::start(tok(), 49152, vec![2])
            .join(49152, &[2, 0])
            .is_none());
    }
}
