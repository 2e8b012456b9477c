//! The offline batch call behind `pagoda generate` and `pagoda bench`: submit
//! every request, step the engine until all are done, return the outputs in
//! request order.

use crate::engine::{EngineRequest, LlmEngine};
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
            on_step(step.len());
            for o in step {
                let Some(&i) = index.get(&o.request_id) else {
                    continue;
                };
                let out = &mut outputs[i];
                out.token_ids.push(o.token_id);
                out.text.push_str(&o.text_delta);
                out.num_cached_tokens = o.num_cached_tokens;
                if let Some(reason) = o.finish_reason {
                    out.finish_reason = reason;
                    remaining -= 1;
                }
            }
        }
        Ok(outputs)
    }
}
