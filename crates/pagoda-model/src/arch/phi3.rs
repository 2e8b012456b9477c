//! Phi-3 / Phi-3.5 / Phi-4 (`Phi3ForCausalLM`): the Llama body with q/k/v
//! stored as one `qkv_proj` matrix (q rows, then k, then v) and gate/up as
//! one `gate_up_proj` (gate rows first, as the Llama body stacks them).
//!
//! Partial rotary (Phi-4-mini's `partial_rotary_factor`) and LongRoPE come
//! with the rotary table ([`super::rope`]); a `sliding_window` applies on
//! every layer, as transformers' Phi3Attention does.

use super::llama::{LlamaFamily, Variant};
use super::BuildOptions;
use crate::loader::WeightSource;
use crate::{ModelConfig, Result};
use pagoda_kernels::Backend;

pub fn build<B: Backend>(
    b: &B,
    cfg: &ModelConfig,
    src: &dyn WeightSource,
    opts: BuildOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<LlamaFamily<B>> {
    LlamaFamily::new(
        b,
        cfg,
        src,
        Variant {
            qkv_bias: false,
            o_bias: false,
            qk_norm: false,
            window: cfg.sliding_window,
            fused: true,
        },
        opts,
        progress,
    )
}
