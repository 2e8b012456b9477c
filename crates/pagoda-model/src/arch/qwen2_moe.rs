//! Qwen2-MoE (Qwen1.5-MoE): Qwen2's attention (q/k/v biases where the
//! config's `qkv_bias` says, none on o_proj, no q/k norm) with
//! mixture-of-experts MLPs on its sparse layers, each with a shared expert
//! gated per token (see [`crate::MoeConfig`] and [`super::moe`]), and dense
//! MLPs on the others.

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
    let variant = Variant {
        qkv_bias: cfg.attention_bias,
        o_bias: false,
        qk_norm: false,
        window: None,
        fused: false,
    };
    LlamaFamily::new(b, cfg, src, variant, opts, progress)
}
