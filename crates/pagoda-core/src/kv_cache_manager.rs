//! The KV blocks of sequences: prefix-cache hits, allocation, caching, release,
//! and the release of blocks a sliding window has passed.
//!
//! Owns the [`BlockPool`] and (with prefix caching on) the [`RadixCache`], and
//! is the only code that moves block references between them and sequences.
//!
//! Sliding window (every attention layer with the same window `w`, vLLM's
//! sliding-window manager): a step whose earliest query is at position `p`
//! reads no key before `p + 1 - w`. The attention kernels read keys in
//! aligned tiles of up to [`KV_READ_TILE`] positions (the CUDA prefill
//! kernel's key tile, masked per row), so a sequence keeps every block from
//! the one holding [`first_read_position`] on and releases the blocks wholly
//! before it (their table entries become [`BlockId::NULL`]) each time it is
//! given slots. A released block that the radix tree also holds stays cached
//! there: releasing only drops the sequence's reference. The first release
//! also gives up the sequence's radix lock (a lock pins the whole path, which
//! would keep every passed block), so its cached prefix becomes evictable.
//! It goes on caching its full blocks as they complete (before the window
//! passes them) from an unlocked cursor, valid while the tree has removed no
//! node since; after a removal it inserts from the root, and stops caching
//! where the tree no longer holds a released block. A later prefix hit gets
//! every block of the path and releases the passed ones at once.
//!
//! Invariants:
//! - every block's ref count = references from block tables + from the radix
//!   tree + pending copy sources (a copy source stays referenced until the
//!   step that copies it has run, so eviction cannot recycle it first);
//! - a running sequence with prefix caching that has released no block holds
//!   exactly one radix lock, on `radix_hold.node`, whose tokens are its first
//!   `radix_hold.num_tokens`; one that has released blocks holds none (at
//!   most an unlocked `radix_cursor`);
//! - a sequence's released entries are exactly its first
//!   `num_released_blocks`, all before the block of `first_read_position` of
//!   its next query;
//! - the radix tree gives way first: allocation evicts the cache before it
//!   reports a shortage.
//!
//! Costs: `allocate_slots` O(new blocks + released blocks) plus eviction;
//! `cache_full_blocks` O(newly full blocks); `acquire_prefix` and `release`
//! O(sequence length).

use crate::block_pool::{BlockId, BlockPool};
use crate::error::Result;
use crate::radix_cache::{NodeId, RadixCache};
use crate::sequence::{RadixCursor, RadixHold, Sequence};

/// Where an unlocked cursor's insert starts: its node while no node was
/// removed since it was set (so the id still names it), else the root (an
/// insert from there stops where the tree lost released blocks).
fn cursor_start(radix: &RadixCache, cursor: RadixCursor) -> NodeId {
    if cursor.removals == radix.removals() {
        cursor.node
    } else {
        NodeId::ROOT
    }
}

/// Alignment of the key tiles the attention kernels read (see the module docs).
pub const KV_READ_TILE: usize = 64;

/// The first key position a step whose earliest query is at `p` may read
/// under a sliding window of `window` tokens: `p + 1 - window`, rounded down
/// to a multiple of [`KV_READ_TILE`].
pub fn first_read_position(p: usize, window: usize) -> usize {
    (p + 1).saturating_sub(window) / KV_READ_TILE * KV_READ_TILE
}

/// The most blocks a sequence holds under a sliding window of `window`
/// tokens when it is given slots for at most `max_chunk` new tokens:
/// positions `first_read_position(p) ..= p + max_chunk - 1`, at most
/// `window + KV_READ_TILE - 1 + max_chunk - 1` of them, over one more block
/// where they start mid-block.
pub fn max_blocks_in_window(window: usize, max_chunk: usize, block_size: usize) -> usize {
    (window + KV_READ_TILE + max_chunk + block_size - 3).div_ceil(block_size)
}

#[derive(Debug, Clone)]
pub struct KvCacheManager {
    pub(crate) pool: BlockPool,
    /// The sliding window of every attention layer, where blocks it passes
    /// are released.
    pub(crate) window: Option<usize>,
    pub(crate) radix: Option<RadixCache>,
    /// Copy sources referenced until their step has run.
    pub(crate) pending_copy_srcs: Vec<BlockId>,
}

impl KvCacheManager {
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        enable_prefix_caching: bool,
        window: Option<usize>,
    ) -> Self {
        KvCacheManager {
            pool: BlockPool::new(num_blocks, block_size),
            window,
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

    /// Releases the blocks the sliding window has passed for the sequence's
    /// next query (at `num_computed_tokens`); see the module docs. O(blocks
    /// released).
    pub fn release_passed_blocks(&mut self, seq: &mut Sequence) -> Result<()> {
        let Some(window) = self.window else {
            return Ok(());
        };
        let first = first_read_position(seq.num_computed_tokens, window);
        let upto = (first / self.bs()).min(seq.block_table.len());
        if upto <= seq.num_released_blocks {
            return Ok(());
        }
        if let Some(hold) = seq.radix_hold.take() {
            if let Some(radix) = self.radix.as_mut() {
                radix.dec_lock_ref(hold.node)?;
                seq.radix_cursor = Some(RadixCursor {
                    node: hold.node,
                    num_tokens: hold.num_tokens,
                    removals: radix.removals(),
                });
            }
        }
        for b in &mut seq.block_table[seq.num_released_blocks..upto] {
            let id = std::mem::replace(b, BlockId::NULL);
            self.pool.decref(id)?;
        }
        seq.num_released_blocks = upto;
        Ok(())
    }

    /// Grows the block table to cover `num_tokens` tokens, evicting cached
    /// prefixes if the pool runs short, after releasing the blocks a sliding
    /// window has passed. All or nothing: `false` allocates none (the
    /// release stands: those blocks are never read again).
    pub fn allocate_slots(&mut self, seq: &mut Sequence, num_tokens: usize) -> Result<bool> {
        self.release_passed_blocks(seq)?;
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
    /// and moves its lock (or, once a window released blocks, its unlocked
    /// cursor) to their end; where the tree already held the same prefix,
    /// switches to the tree's blocks and frees its own copies.
    pub fn cache_full_blocks(&mut self, seq: &mut Sequence) -> Result<()> {
        let bs = self.bs();
        let Some(radix) = self.radix.as_mut() else {
            return Ok(());
        };
        let full = seq.num_computed_tokens / bs * bs;
        let shared = if let Some(hold) = seq.radix_hold {
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
            out.shared_blocks
        } else if let Some(cursor) = seq.radix_cursor {
            if full <= cursor.num_tokens {
                return Ok(());
            }
            let from = cursor_start(radix, cursor);
            let out = radix.insert(
                &mut self.pool,
                from,
                &seq.token_ids[..full],
                &seq.block_table,
            )?;
            // Where the tree lost released blocks the insert stopped short:
            // the sequence caches nothing more.
            seq.radix_cursor = (radix.node_end(out.node) == Some(full)).then(|| RadixCursor {
                node: out.node,
                num_tokens: full,
                removals: radix.removals(),
            });
            out.shared_blocks
        } else {
            return Ok(());
        };
        for (i, tree_block) in shared {
            if seq.block_table[i].is_null() {
                continue;
            }
            self.pool.incref(tree_block)?;
            let own = std::mem::replace(&mut seq.block_table[i], tree_block);
            self.pool.decref(own)?;
        }
        Ok(())
    }

    /// Returns every block the sequence holds: its computed prefix goes to
    /// the radix tree (with caching on; after a window released blocks, as
    /// far as the tree still holds them), the rest back to the pool.
    pub fn release(&mut self, seq: &mut Sequence) -> Result<()> {
        if let Some(radix) = self.radix.as_mut() {
            let computed = &seq.token_ids[..seq.num_computed_tokens];
            if let Some(hold) = seq.radix_hold.take() {
                radix.insert(&mut self.pool, hold.node, computed, &seq.block_table)?;
                radix.dec_lock_ref(hold.node)?;
            } else if let Some(cursor) = seq.radix_cursor {
                let from = cursor_start(radix, cursor);
                radix.insert(&mut self.pool, from, computed, &seq.block_table)?;
            }
        }
        seq.radix_cursor = None;
        for b in seq.block_table.drain(..) {
            if !b.is_null() {
                self.pool.decref(b)?;
            }
        }
        seq.num_released_blocks = 0;
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
