//! Mixtral: Llama's attention (no biases, no q/k norm) with a mixture of
//! experts in every layer, top-k weights renormalized (see [`super::moe`]).

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
        qkv_bias: false,
        o_bias: false,
        qk_norm: false,
        window: None,
        fused: false,
    };
    LlamaFamily::new(b, cfg, src, variant, opts, progress)
}
