//! The KV blocks of sequences: prefix-cache hits, allocation, caching, release.
//!
//! Owns the [`BlockPool`] and (with prefix caching on) the [`RadixCache`], and
//! is the only code that moves block references between them and sequences.
//!
//! Invariants:
//! - every block's ref count = references from block tables + from the radix
//!   tree + pending copy sources (a copy source stays referenced until the
//!   step that copies it has run, so eviction cannot recycle it first);
//! - a running sequence with prefix caching holds exactly one radix lock, on
//!   `radix_hold.node`, whose tokens are its first `radix_hold.num_tokens`;
//! - the radix tree gives way first: allocation evicts the cache before it
//!   reports a shortage.
//!
//! Costs: `allocate_slots` O(new blocks) plus eviction; `cache_full_blocks`
//! O(newly full blocks); `acquire_prefix` and `release` O(sequence length).

use crate::block_pool::{BlockId, BlockPool};
use crate::error::Result;
use crate::radix_cache::RadixCache;
use crate::sequence::{RadixHold, Sequence};

#[derive(Debug, Clone)]
pub struct KvCacheManager {
    pub(crate) pool: BlockPool,
    pub(crate) radix: Option<RadixCache>,
    /// Copy sources referenced until their step has run.
    pub(crate) pending_copy_srcs: Vec<BlockId>,
}

impl KvCacheManager {
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_caching: bool) -> Self {
        KvCacheManager {
            pool: BlockPool::new(num_blocks, block_size),
            radix: enable_prefix_caching.then(|| RadixCache::new(block_size)),
            pending_copy_srcs: Vec::new(),
        }
    }

    fn bs(&self) -> usize {
        self.pool.block_size()
    }

    /// Starts a waiting sequence from its longest cached prefix (never the
    /// whole sequence: its last token is always computed). Takes references on
    /// the shared full blocks and a lock on the prefix. When the prefix ends
    /// mid-block (only if `allow_partial`), returns the block to copy the first
    /// `num_computed_tokens % block_size` slots from.
    pub fn acquire_prefix(
        &mut self,
        seq: &mut Sequence,
        allow_partial: bool,
    ) -> Result<Option<BlockId>> {
        let bs = self.bs();
        let Some(radix) = self.radix.as_mut() else {
            return Ok(None);
        };
        // Prompt logprobs need every prompt position computed.
        let limit = if seq.sampling.prompt_logprobs.is_some() && seq.num_output_tokens() == 0 {
            0
        } else {
            seq.num_tokens().saturating_sub(1)
        };
        let mut m = radix.match_prefix(&seq.token_ids[..limit]);
        if !allow_partial && m.num_tokens % bs != 0 {
            m = radix.match_prefix(&seq.token_ids[..m.num_tokens - m.num_tokens % bs]);
        }
        radix.inc_lock_ref(m.node)?;
        for &b in &m.blocks {
            self.pool.incref(b)?;
        }
        if let Some(src) = m.partial_block {
            self.pool.incref(src)?;
            self.pending_copy_srcs.push(src);
        }
        seq.block_table = m.blocks;
        seq.num_computed_tokens = m.num_tokens;
        seq.num_cached_tokens = m.num_tokens;
        seq.radix_hold = Some(RadixHold {
            node: m.node,
            num_tokens: m.num_tokens,
        });
        Ok(m.partial_block)
    }

    /// Grows the block table to cover `num_tokens` tokens, evicting cached
    /// prefixes if the pool runs short. All or nothing: `false` allocates none.
    pub fn allocate_slots(&mut self, seq: &mut Sequence, num_tokens: usize) -> Result<bool> {
        let need = num_tokens
            .div_ceil(self.bs())
            .saturating_sub(seq.block_table.len());
        if self.pool.num_free() < need {
            if let Some(radix) = self.radix.as_mut() {
                radix.evict(&mut self.pool, need)?;
            }
            if self.pool.num_free() < need {
                return Ok(false);
            }
        }
        seq.block_table
            .extend(std::iter::from_fn(|| self.pool.allocate()).take(need));
        Ok(true)
    }

    /// Inserts the sequence's newly completed full blocks into the radix tree
    /// and moves its lock to their end; where the tree already held the same
    /// prefix, switches to the tree's blocks and frees its own copies.
    pub fn cache_full_blocks(&mut self, seq: &mut Sequence) -> Result<()> {
        let bs = self.bs();
        let (Some(radix), Some(hold)) = (self.radix.as_mut(), seq.radix_hold) else {
            return Ok(());
        };
        let full = seq.num_computed_tokens / bs * bs;
        if full <= hold.num_tokens {
            return Ok(());
        }
        let out = radix.insert(
            &mut self.pool,
            hold.node,
            &seq.token_ids[..full],
            &seq.block_table,
        )?;
        radix.relock(hold.node, out.node)?;
        seq.radix_hold = Some(RadixHold {
            node: out.node,
            num_tokens: full,
        });
        for (i, shared) in out.shared_blocks {
            self.pool.incref(shared)?;
            let own = std::mem::replace(&mut seq.block_table[i], shared);
            self.pool.decref(own)?;
        }
        Ok(())
    }

    /// Returns every block the sequence holds: its computed prefix goes to
    /// the radix tree (with caching on), the rest back to the pool.
    pub fn release(&mut self, seq: &mut Sequence) -> Result<()> {
        if let (Some(radix), Some(hold)) = (self.radix.as_mut(), seq.radix_hold.take()) {
            let computed = &seq.token_ids[..seq.num_computed_tokens];
            radix.insert(&mut self.pool, hold.node, computed, &seq.block_table)?;
            radix.dec_lock_ref(hold.node)?;
        }
        for b in seq.block_table.drain(..) {
            self.pool.decref(b)?;
        }
        seq.num_computed_tokens = 0;
        Ok(())
    }

    /// Undoes [`Self::acquire_prefix`] and [`Self::allocate_slots`] for a
    /// sequence that is not scheduled after all: drops its blocks, its lock and
    /// the reference on its unused copy source `src`.
    pub fn cancel_admission(&mut self, seq: &mut Sequence, src: Option<BlockId>) -> Result<()> {
        self.release(seq)?;
        seq.num_cached_tokens = 0;
        if let Some(src) = src {
            if let Some(i) = self.pending_copy_srcs.iter().rposition(|&b| b == src) {
                self.pending_copy_srcs.swap_remove(i);
                self.pool.decref(src)?;
            }
        }
        Ok(())
    }

    /// Drops the references on copy sources once their step has run.
    pub fn end_step(&mut self) -> Result<()> {
        for b in self.pending_copy_srcs.drain(..) {
            self.pool.decref(b)?;
        }
        Ok(())
    }
}
