//! The engine's side of structured outputs: the compiler and mask workers
//! (made at the first constrained request), and a step's mask round trip:
//! take the constrained rows' guides, start their masks, join them into a
//! [`TokenMasks`] (rows in sampling order), give the guides back.

use super::{GrammarCompiler, Guide, MaskJob, MaskWorkers, StructuredError};
use pagoda_core::{RequestId, StructuredOutput};
use pagoda_kernels::TokenMasks;
use pagoda_model::tokenizer::Tokenizer;
use std::sync::Arc;

/// Mask worker threads: masks of different rows are independent.
pub fn mask_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get().clamp(1, 4))
        .unwrap_or(1)
}

pub(crate) struct StructuredEngine {
    compiler: GrammarCompiler,
    workers: MaskWorkers,
    eos: Arc<[u32]>,
    /// The mask buffer between steps.
    spare: Vec<u32>,
}

/// A step's masks in flight: keys are (request, sampling row).
pub(crate) struct PendingMasks(MaskJob<(RequestId, u32)>);

impl StructuredEngine {
    pub fn new(
        tokenizer: Option<&Arc<Tokenizer>>,
        vocab_size: usize,
        eos: &[u32],
    ) -> Result<Self, StructuredError> {
        let tokenizer = tokenizer.ok_or_else(|| StructuredError {
            kind: "structured output",
            message: "structured outputs need the model's tokenizer".into(),
        })?;
        let compiler = GrammarCompiler::new(tokenizer.clone(), vocab_size, eos)?;
        let workers = MaskWorkers::new(mask_threads()).map_err(|e| StructuredError {
            kind: "structured output",
            message: format!("no mask workers: {e}"),
        })?;
        Ok(StructuredEngine {
            compiler,
            workers,
            eos: eos.into(),
            spare: Vec::new(),
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

    /// Takes back the mask buffer of a step's [`TokenMasks`].
    pub fn recycle(&mut self, masks: TokenMasks) {
        self.spare = masks.bits;
    }
}
