//! The model runner: owns a backend, a model and its paged KV cache, and turns
//! one step's [`ForwardContext`] into logits.
//!
//! Invariant: the KV cache has one `B::KvCache` per layer, each of the same
//! [`KvCacheShape`]; block ids in a context index those caches.

use crate::{EngineError, Result};
use pagoda_kernels::{Backend, BlockCopyOp, ForwardContext, KvCacheShape};
use pagoda_model::arch::CausalLm;
use pagoda_model::ModelConfig;

/// A model ready to run steps on backend `B`.
pub struct ModelRunner<B: Backend> {
    backend: B,
    model: Box<dyn CausalLm<B>>,
    kv: Vec<B::KvCache>,
    kv_shape: KvCacheShape,
}

impl<B: Backend> ModelRunner<B> {
    /// Allocates `num_blocks` KV blocks of `block_size` tokens for every layer.
    pub fn new(
        backend: B,
        model: Box<dyn CausalLm<B>>,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Self> {
        let cfg = model.config();
        let kv_shape = KvCacheShape {
            num_blocks,
            block_size,
            num_kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim(),
        };
        let kv = (0..cfg.num_hidden_layers)
            .map(|_| backend.alloc_kv_cache(kv_shape))
            .collect::<pagoda_kernels::Result<Vec<_>>>()?;
        Ok(ModelRunner {
            backend,
            model,
            kv,
            kv_shape,
        })
    }

    /// Bytes one KV block takes across all layers of `cfg` on `backend`.
    pub fn kv_bytes_per_block(backend: &B, cfg: &ModelConfig, block_size: usize) -> usize {
        let one = KvCacheShape {
            num_blocks: 1,
            block_size,
            num_kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim(),
        };
        backend.kv_cache_bytes(one) * cfg.num_hidden_layers
    }

    pub fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn backend_name(&self) -> String {
        self.backend.name()
    }

    pub fn kv_shape(&self) -> KvCacheShape {
        self.kv_shape
    }

    /// Copies the leading slots of shared blocks into private ones, every layer.
    pub fn copy_blocks(&mut self, copies: &[BlockCopyOp]) -> Result<()> {
        for cache in &mut self.kv {
            self.backend.copy_blocks(cache, copies)?;
        }
        Ok(())
    }

    /// Runs one step; returns the logits of `ctx.logits_indices`, row-major
    /// `[logits_indices.len(), vocab]`.
    pub fn execute(&mut self, ctx: &ForwardContext) -> Result<Vec<f32>> {
        if ctx.block_size != self.kv_shape.block_size {
            return Err(EngineError::Internal(
                "step block size differs from the cache's".into(),
            ));
        }
        debug_assert_eq!(ctx.validate(), Ok(()));
        if ctx.logits_indices.is_empty() && ctx.num_tokens() == 0 {
            return Ok(Vec::new());
        }
        let step = self.backend.begin_step(ctx)?;
        let (backend, model, kv) = (&self.backend, &self.model, &mut self.kv);
        let logits = backend.scope(|| model.forward(backend, &step, kv))?;
        Ok(backend.tensor_to_host(&logits)?)
    }
}
