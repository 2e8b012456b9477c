//! The offline batch call behind `pagoda generate` and `pagoda bench`: submit
//! every request, step the engine until all are done, return the outputs in
//! request order. [`LlmEngine::generate_streaming`] also hands each step's
//! outputs (text deltas included) to the caller as they are produced.

use crate::engine::{EngineRequest, LlmEngine, RequestOutput};
use crate::Result;
use pagoda_core::{FinishReason, RequestId, SamplingParams};
use pagoda_kernels::Backend;
use std::collections::HashMap;

/// One generation request.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt_token_ids: Vec<u32>,
    pub params: SamplingParams,
}

/// The result of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOutput {
    pub prompt_token_ids: Vec<u32>,
    pub token_ids: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    /// Prompt tokens whose KV came from the prefix cache.
    pub num_cached_tokens: usize,
}

impl<B: Backend> LlmEngine<B> {
    /// Runs every request to completion, batched by the scheduler. Either all
    /// requests are admitted or none is (the first refusal is returned).
    /// `on_step(tokens)` is called after each step with the tokens it produced.
    pub fn generate(
        &mut self,
        requests: Vec<GenerateRequest>,
        on_step: &mut dyn FnMut(usize),
    ) -> Result<Vec<GenerateOutput>> {
        self.generate_streaming(requests, on_step, &mut |_, _| {})
    }

    /// [`Self::generate`], also calling `on_output(i, output)` for every
    /// output of request `i` (its index in `requests`) as its step ends,
    /// before `on_step`.
    pub fn generate_streaming(
        &mut self,
        requests: Vec<GenerateRequest>,
        on_step: &mut dyn FnMut(usize),
        on_output: &mut dyn FnMut(usize, &RequestOutput),
    ) -> Result<Vec<GenerateOutput>> {
        let mut index: HashMap<RequestId, usize> = HashMap::with_capacity(requests.len());
        let mut outputs = Vec::with_capacity(requests.len());
        for (i, r) in requests.into_iter().enumerate() {
            let added = self.add_request(EngineRequest {
                prompt_token_ids: r.prompt_token_ids.clone(),
                params: r.params,
                logprobs: None,
            });
            match added {
                Ok(id) => {
                    index.insert(id, i);
                }
                Err(e) => {
                    for &id in index.keys() {
                        self.abort(id)?;
                    }
                    return Err(e);
                }
            }
            outputs.push(GenerateOutput {
                prompt_token_ids: r.prompt_token_ids,
                token_ids: Vec::new(),
                text: String::new(),
                finish_reason: FinishReason::Abort,
                num_cached_tokens: 0,
            });
        }
        let mut remaining = index.len();
        while remaining > 0 {
            let step = self.step()?;
            for o in step.iter() {
                let Some(&i) = index.get(&o.request_id) else {
                    continue;
                };
                on_output(i, o);
                let out = &mut outputs[i];
                if !o.no_token {
                    out.token_ids.push(o.token_id);
                }
                out.text.push_str(&o.text_delta);
                out.num_cached_tokens = o.num_cached_tokens;
                if let Some(reason) = o.finish_reason {
                    out.finish_reason = reason;
                    remaining -= 1;
                }
            }
            on_step(step.len());
        }
        Ok(outputs)
    }
}
