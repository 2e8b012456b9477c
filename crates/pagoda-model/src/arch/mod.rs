//! Architectures, one file each, all written against [`pagoda_kernels::Backend`].
//!
//! A model is built once from a [`ModelConfig`] and a [`WeightSource`], then
//! [`CausalLm::forward`] runs one step: the step's tokens in, the logits of the
//! rows named by the step's `logits_indices` out. Models hold weights only; the
//! runner owns the KV cache (one `B::KvCache` per layer) and lends it per call.

mod gemma3;
mod llama;
mod mixtral;
mod moe;
mod opt;
mod phi3;
mod qwen2;
mod qwen2_moe;
mod qwen3;
mod qwen3_moe;
pub mod rope;
mod weights;

use crate::loader::WeightSource;
use crate::{Architecture, KvLayout, ModelConfig, Result};
use pagoda_kernels::Backend;

pub use gemma3::Gemma;
pub use llama::LlamaFamily;
pub use opt::Opt;

/// A decoder-only language model on backend `B`.
pub trait CausalLm<B: Backend>: Send + Sync {
    /// Runs one forward pass over the step's tokens, storing their K/V in `kv`
    /// (the [`Self::kv_layout`]'s slot caches: one per layer unless the
    /// layout groups layers), and returns `[logits_indices.len(), vocab]` logits.
    fn forward(&self, backend: &B, step: &B::Step, kv: &mut [B::KvCache]) -> Result<B::Tensor>;
    /// The configuration the model was built from.
    fn config(&self) -> &ModelConfig;
    /// Where each layer's K/V lives ([`KvLayout::for_config`]: one group,
    /// layer `l` in cache `l`, unless the layers mix windows).
    fn kv_layout(&self) -> KvLayout {
        KvLayout::for_config(self.config(), true)
    }
}

/// Options that shape a model at build time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildOptions {
    /// Longest sequence the model will be asked to run (sizes the rotary table).
    pub max_model_len: usize,
}

/// Builds the model `cfg.architecture` names. `progress(done, total)` is called
/// as weights are loaded (total = layers + 2). A `max_model_len` past the
/// config's sliding window is refused for architectures that do not apply the
/// window ([`ModelConfig::check_context_len`]).
pub fn build<B: Backend>(
    backend: &B,
    cfg: &ModelConfig,
    weights: &dyn WeightSource,
    opts: BuildOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Box<dyn CausalLm<B>>> {
    cfg.validate().map_err(crate::ModelError::Config)?;
    cfg.check_context_len(opts.max_model_len)
        .map_err(crate::ModelError::Config)?;
    Ok(match cfg.architecture {
        Architecture::Llama => Box::new(llama::build(backend, cfg, weights, opts, progress)?),
        Architecture::Qwen2 => Box::new(qwen2::build(backend, cfg, weights, opts, progress)?),
        Architecture::Qwen3 => Box::new(qwen3::build(backend, cfg, weights, opts, progress)?),
        Architecture::Opt => Box::new(opt::build(backend, cfg, weights, opts, progress)?),
        Architecture::Phi3 => Box::new(phi3::build(backend, cfg, weights, opts, progress)?),
        Architecture::Gemma2 | Architecture::Gemma3 => {
            Box::new(gemma3::build(backend, cfg, weights, opts, progress)?)
        }
        Architecture::Qwen3Moe => {
            Box::new(qwen3_moe::build(backend, cfg, weights, opts, progress)?)
        }
        Architecture::Mixtral => Box::new(mixtral::build(backend, cfg, weights, opts, progress)?),
        Architecture::Qwen2Moe => {
            Box::new(qwen2_moe::build(backend, cfg, weights, opts, progress)?)
        }
    })
}
