//! The engine's side of structured outputs: the compiler and mask workers
//! (made at the first constrained request, or built on a thread of their
//! own from the engine's start where the forward pass runs on a device:
//! [`StructuredBuild`]), and a step's mask round trip:
//! take the constrained rows' guides, start their masks, join them into a
//! [`TokenMasks`] (rows in sampling order), give the guides back.

use super::{GrammarCompiler, Guide, MaskJob, MaskWorkers, StructuredError};
use crate::step_log::GuideTimes;
use pagoda_core::{RequestId, StructuredOutput};
use pagoda_kernels::TokenMasks;
use pagoda_model::tokenizer::Tokenizer;
use std::sync::Arc;
use std::time::Instant;

/// Mask worker threads when the forward pass runs on the host's cores
/// (see [`mask_threads_for`]).
pub fn mask_threads() -> usize {
    mask_threads_for(false)
}

/// Mask worker threads: masks of different rows are independent. With the
/// forward pass on a device (`device`) the host's cores are idle while it
/// runs, so every core but two (the engine thread and the server's) takes
/// a share of the step's rows, up to 16; with the forward pass on the
/// host's cores the workers share those cores with it: up to 4.
/// `PAGODA_MASK_THREADS=N` (1-256) sets the count instead.
pub fn mask_threads_for(device: bool) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let env = std::env::var("PAGODA_MASK_THREADS").ok();
    let (n, bad) = threads_of(cores, device, env.as_deref());
    if bad {
        tracing::warn!(value = ?env, "PAGODA_MASK_THREADS is not a count of 1-256: ignored");
    }
    n
}

/// [`mask_threads_for`] on `cores` cores with `env` as the variable's
/// value: the count, and whether `env` was set but not a count.
fn threads_of(cores: usize, device: bool, env: Option<&str>) -> (usize, bool) {
    if let Some(v) = env {
        match v.trim().parse::<usize>() {
            Ok(n) if (1..=256).contains(&n) => return (n, false),
            _ => {}
        }
    }
    let n = if device {
        cores.saturating_sub(2).clamp(1, 16)
    } else {
        cores.clamp(1, 4)
    };
    (n, env.is_some())
}

pub(crate) struct StructuredEngine {
    compiler: GrammarCompiler,
    workers: MaskWorkers,
    eos: Arc<[u32]>,
    /// The mask buffer between steps.
    spare: Vec<u32>,
    /// This step's host times so far (for the step log).
    times: GuideTimes,
}

/// A [`StructuredEngine`] (for a device backend) being built on a thread
/// of its own, so that the first constrained request finds it ready.
pub(crate) struct StructuredBuild(
    Option<std::thread::JoinHandle<Result<StructuredEngine, StructuredError>>>,
);

impl StructuredBuild {
    pub fn start(tokenizer: Arc<Tokenizer>, vocab_size: usize, eos: Vec<u32>) -> Self {
        let build = move || StructuredEngine::new(Some(&tokenizer), vocab_size, &eos, true);
        // A thread that cannot be started: the first constrained request
        // builds it, as without this.
        StructuredBuild(
            std::thread::Builder::new()
                .name("pagoda-grammar".into())
                .spawn(build)
                .ok(),
        )
    }

    /// The built engine, or its error; `None` if there is no thread or it
    /// died (the caller builds it anew).
    pub fn join(self) -> Option<Result<StructuredEngine, StructuredError>> {
        self.0?.join().ok()
    }
}

/// A step's masks in flight: keys are (request, sampling row).
pub(crate) struct PendingMasks(MaskJob<(RequestId, u32)>);

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
        let threads = mask_threads_for(device);
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
            times: GuideTimes::default(),
        })
    }

    pub fn compile(&self, c: &StructuredOutput) -> Result<Guide, StructuredError> {
        self.compiler.compile(c)
    }

    pub fn workers(&self) -> &MaskWorkers {
        &self.workers
    }

    /// Starts the masks of `rows` ((request, sampling row, guide), in
    /// sampling-row order); `None` when there are none.
    pub fn start(&mut self, rows: Vec<((RequestId, u32), Guide)>) -> Option<PendingMasks> {
        let words = rows.first()?.1.mask_words();
        let bits = std::mem::take(&mut self.spare);
        Some(PendingMasks(self.workers.spawn(
            rows,
            bits,
            words,
            self.eos.clone(),
        )))
    }

    /// Joins a step's masks and gives every guide back through
    /// `put_back`; rows whose mask failed (only EOS allowed) are logged.
    pub fn finish(
        &mut self,
        pending: PendingMasks,
        mut put_back: impl FnMut(RequestId, Guide),
    ) -> Result<TokenMasks, String> {
        let r = pending
            .0
            .join()
            .ok_or_else(|| "a token mask worker died".to_string())?;
        self.workers.record(r.elapsed);
        for ((id, _), e) in &r.errors {
            tracing::warn!(request = id.0, error = %e, "structured output: no valid next token");
        }
        let masks = TokenMasks {
            words: r.words,
            rows: r.guides.iter().map(|((_, row), _)| *row).collect(),
            bits: r.bits,
        };
        for ((id, _), g) in r.guides {
            put_back(id, g);
        }
        Ok(masks)
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
        self.spare = masks.bits;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_threads_take_the_cores_a_device_leaves_free() {
        // Beside a CPU forward pass: up to 4.
        assert_eq!(threads_of(2, false, None), (2, false));
        assert_eq!(threads_of(16, false, None), (4, false));
        // Beside a device's: all cores but two, 1-16.
        assert_eq!(threads_of(1, true, None), (1, false));
        assert_eq!(threads_of(2, true, None), (1, false));
        assert_eq!(threads_of(16, true, None), (14, false));
        assert_eq!(threads_of(64, true, None), (16, false));
        // The variable wins when it is a count; else it is reported.
        assert_eq!(threads_of(16, true, Some("4")), (4, false));
        assert_eq!(threads_of(16, true, Some(" 8 ")), (8, false));
        assert_eq!(threads_of(16, true, Some("0")), (14, true));
        assert_eq!(threads_of(16, false, Some("many")), (4, true));
    }

    #[test]
    fn a_compiler_built_on_its_own_thread_compiles() {
        let tok = || {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/golden/smollm2-tokenizer/tokenizer.json");
            Arc::new(Tokenizer::from_hf_file(path).unwrap())
        };
        let built = StructuredBuild::start(tok(), 49152, vec![2])
            .join()
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
        let e = StructuredBuild::start(tok(), 49152, vec![]).join();
        assert!(matches!(e, Some(Err(_))), "no EOS id must be an error");
    }
}
