//! Qwen2: the Llama body with biases on the q, k and v projections.

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
            qkv_bias: true,
            o_bias: false,
            qk_norm: false,
            window: None,
            fused: false,
        },
        opts,
        progress,
    )
}
