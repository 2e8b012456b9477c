//! The text of one request's output: incremental detokenization and stop
//! strings, applied to its outputs in order.
//!
//! [`OutputText::apply`] turns an output that carries only its token (and
//! whether the scheduler ended the request on it as a stop token) into the
//! output with its `text_delta`, ending it on a stop string where one
//! completes. It is the one implementation of the rules, used on the engine
//! thread by [`crate::LlmEngine::step`] (offline callers) and on the reader's
//! side by each [`crate::RequestStream`] (the threaded engine, which then only
//! ends a request in the engine when its stream reports a stop string), so
//! both give the same outputs.
//!
//! An output without a token (`no_token`, a request ended one step after
//! its last token) only flushes what is held back.
//!
//! Rules: a stop token's text (EOS, `stop_token_ids`) is kept only with
//! `include_stop_str_in_output`; stop strings are matched across token
//! boundaries once more than `min_tokens` tokens were generated, and the text
//! is cut before the stop string (after it with `include_stop_str_in_output`);
//! text handed out never splits a UTF-8 character and never holds (a prefix
//! of) a stop string that may still complete. Costs O(delta + longest stop
//! string) per token.

use crate::engine::RequestOutput;
use crate::stop::{find_stop, StopOptions};
use crate::Result;
use pagoda_core::{FinishReason, SamplingParams};
use pagoda_model::tokenizer::{IncrementalDetokenizer, Tokenizer};
use std::sync::Arc;

/// A request's text state. See the module documentation.
pub struct OutputText {
    detok: IncrementalDetokenizer<Arc<Tokenizer>>,
    stop: Vec<String>,
    opts: StopOptions,
    /// All text decoded so far (cut at a stop string when one is found).
    text: String,
    /// Bytes of `text` already handed out.
    emitted: usize,
}

impl std::fmt::Debug for OutputText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputText")
            .field("text_len", &self.text.len())
            .field("emitted", &self.emitted)
            .finish()
    }
}

impl OutputText {
    /// The text state of a request with this prompt and these parameters.
    pub fn new(tokenizer: Arc<Tokenizer>, params: &SamplingParams, prompt: &[u32]) -> Result<Self> {
        Ok(OutputText {
            detok: IncrementalDetokenizer::with_prompt(
                tokenizer,
                params.skip_special_tokens,
                prompt,
            )?,
            stop: params.stop.clone(),
            opts: StopOptions {
                min_tokens: params.min_tokens,
                include_stop_str: params.include_stop_str_in_output,
            },
            text: String::new(),
            emitted: 0,
        })
    }

    /// Whether the request has stop strings (its end may be decided here).
    pub fn has_stop_strings(&self) -> bool {
        !self.stop.is_empty()
    }

    /// Fills in `out.text_delta` from `out.token_id`. `true`: a stop string
    /// ended the request here (`out.finish_reason` is now `Stop`; the caller
    /// ends the request in the engine unless the engine had ended it).
    pub fn apply(&mut self, out: &mut RequestOutput) -> Result<bool> {
        let mut stopped = false;
        if out.no_token {
            // The end of a request after its last token (see
            // `RequestOutput::no_token`): what the decoder held, and the
            // text held back for a stop string that can no longer complete.
            if out.finish_reason.is_some() {
                let tail = self.detok.finish()?;
                self.text.push_str(&tail);
                let found = self
                    .opts
                    .checks_stop_strings(out.num_output_tokens)
                    .then(|| find_stop(&self.text, tail.len(), &self.stop))
                    .flatten();
                if let Some(m) = found {
                    self.text.truncate(self.opts.cut_at(m));
                    stopped = true;
                }
            }
        } else if !out.stop_token || self.opts.include_stop_str {
            let delta = self.detok.step(out.token_id)?;
            self.text.push_str(&delta);
            if out.finish_reason.is_some() {
                self.text.push_str(&self.detok.finish()?);
            }
            let found = self
                .opts
                .checks_stop_strings(out.num_output_tokens)
                .then(|| find_stop(&self.text, delta.len(), &self.stop))
                .flatten();
            if let (Some(m), false) = (found, out.stop_token) {
                self.text.truncate(self.opts.cut_at(m));
                stopped = true;
                out.finish_reason = Some(FinishReason::Stop);
            }
        }
        let visible = match out.finish_reason {
            Some(_) => self.text.len(),
            None => self.text.len() - self.opts.held_back(&self.text, &self.stop),
        };
        out.text_delta = self.text[self.emitted.min(visible)..visible].to_string();
        self.emitted = self.emitted.max(visible);
        Ok(stopped)
    }
}
