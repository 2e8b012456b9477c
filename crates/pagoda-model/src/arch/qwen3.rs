//! Qwen3: the Llama body with RMSNorm over each head of q and k before RoPE,
//! and an explicit head_dim that need not equal hidden_size / heads.

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
