//! Scheduler and KV-cache sizing knobs (vLLM's names).

use crate::error::{CoreError, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks in the cache (sized by the runner from a memory budget).
    pub num_blocks: usize,
    /// Token budget of one step (decodes count one each).
    pub max_num_batched_tokens: usize,
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Longest sequence (prompt + output) the model accepts.
    pub max_model_len: usize,
    /// Share prompt prefixes through the radix tree.
    pub enable_prefix_caching: bool,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            block_size: 16,
            num_blocks: 1024,
            max_num_batched_tokens: 2048,
            max_num_seqs: 256,
            max_model_len: 2048,
            enable_prefix_caching: true,
        }
    }
}

impl SchedulerConfig {
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("block_size", self.block_size),
            ("num_blocks", self.num_blocks),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("max_num_seqs", self.max_num_seqs),
            ("max_model_len", self.max_model_len),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(CoreError::InvalidConfig(format!(
                "{name} must be at least 1"
            )));
        }
        if self.num_blocks >= u32::MAX as usize {
            return Err(CoreError::InvalidConfig(
                "num_blocks must be below u32::MAX".into(),
            ));
        }
        Ok(())
    }

    /// Blocks needed to hold `num_tokens` tokens.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }
}
