//! Qwen3-MoE: Qwen3's attention (per-head q/k RMSNorm, explicit head_dim)
//! with mixture-of-experts MLPs on its sparse layers and dense ones on the
//! others (`mlp_only_layers`, `decoder_sparse_step`; see
//! [`crate::MoeConfig`] and [`super::moe`]).

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
        o_bias: cfg.attention_bias,
        qk_norm: true,
        window: None,
        fused: false,
    };
    LlamaFamily::new(b, cfg, src, variant, opts, progress)
}
