//! The KV block pool: fixed-size pages of the KV cache and their ref counts.
//!
//! A block holds the K/V of `block_size` consecutive tokens of one sequence
//! (slot = `block_id * block_size + offset`). Several holders may share a
//! block (requests with a common prefix, the radix tree); each holds one
//! reference.
//!
//! Invariants:
//! - a block is on the free list exactly when its ref count is 0;
//! - ref counts never underflow: releasing an unallocated block is an error
//!   value, the count stays 0.
//!
//! Costs: `allocate`, `incref`, `decref` are O(1) (a LIFO free list);
//! `check_invariants` is O(num_blocks) and meant for tests.

use std::fmt;

use crate::error::{CoreError, Result};

/// Index of a KV block in the cache tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

impl BlockId {
    /// The entry of a block table whose block a sliding window released: its
    /// positions are never read (see `kv_cache_manager`). Never allocated.
    pub const NULL: BlockId = BlockId(u32::MAX);

    pub fn is_null(self) -> bool {
        self == BlockId::NULL
    }

    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Ref-counted pool of `num_blocks` KV blocks of `block_size` tokens each.
#[derive(Debug, Clone)]
pub struct BlockPool {
    /// Tokens per block.
    block_size: usize,
    /// Holders of each block; 0 means free.
    ref_counts: Vec<u32>,
    /// Free blocks, popped from the back.
    free_list: Vec<BlockId>,
}

impl BlockPool {
    /// A pool with every block free. `num_blocks` must fit in a `u32`.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        // `BlockId::NULL` (u32::MAX) is never a real block.
        let num_blocks = num_blocks.min(u32::MAX as usize - 1);
        BlockPool {
            block_size,
            ref_counts: vec![0; num_blocks],
            // Reversed so that block 0 is handed out first (easier to read in tests).
            free_list: (0..num_blocks as u32).rev().map(BlockId).collect(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    pub fn num_free(&self) -> usize {
        self.free_list.len()
    }

    pub fn num_used(&self) -> usize {
        self.num_blocks() - self.num_free()
    }

    /// Takes a free block with ref count 1, or `None` when the pool is empty.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let id = self.free_list.pop()?;
        self.ref_counts[id.index()] = 1;
        Some(id)
    }

    /// Adds a holder to an allocated block.
    pub fn incref(&mut self, id: BlockId) -> Result<()> {
        match self.ref_counts.get_mut(id.index()) {
            Some(rc) if *rc > 0 => {
                *rc += 1;
                Ok(())
            }
            _ => Err(CoreError::BlockNotAllocated(id)),
        }
    }

    /// Drops a holder; returns `true` when the block went back to the free list.
    pub fn decref(&mut self, id: BlockId) -> Result<bool> {
        match self.ref_counts.get_mut(id.index()) {
            Some(rc) if *rc > 0 => {
                *rc -= 1;
                if *rc == 0 {
                    self.free_list.push(id);
                    return Ok(true);
                }
                Ok(false)
            }
            _ => Err(CoreError::BlockNotAllocated(id)),
        }
    }

    /// Holders of `id` (0 for a free or out-of-range block).
    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.ref_counts.get(id.index()).copied().unwrap_or(0)
    }

    /// Checks that the free list holds exactly the blocks with ref count 0,
    /// each once. O(num_blocks).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let mut on_free_list = vec![false; self.num_blocks()];
        for &id in &self.free_list {
            let seen = on_free_list
                .get_mut(id.index())
                .ok_or_else(|| format!("free list holds out-of-range block {id}"))?;
            if *seen {
                return Err(format!("block {id} is on the free list twice"));
            }
            *seen = true;
        }
        for (i, (&rc, &free)) in self.ref_counts.iter().zip(&on_free_list).enumerate() {
            if (rc == 0) != free {
                return Err(format!(
                    "block #{i}: ref count {rc} but on free list = {free}"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_until_empty_then_none() {
        let mut pool = BlockPool::new(3, 16);
        let got: Vec<_> = (0..3).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(got, vec![BlockId(0), BlockId(1), BlockId(2)]);
        assert_eq!(pool.allocate(), None);
        assert_eq!(pool.num_free(), 0);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn shared_block_is_freed_by_its_last_holder() {
        let mut pool = BlockPool::new(2, 4);
        let b = pool.allocate().unwrap();
        pool.incref(b).unwrap();
        assert_eq!(pool.ref_count(b), 2);
        assert_eq!(pool.decref(b), Ok(false));
        assert_eq!(pool.num_free(), 1);
        assert_eq!(pool.decref(b), Ok(true));
        assert_eq!(pool.num_free(), 2);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn misuse_is_an_error_not_an_underflow() {
        let mut pool = BlockPool::new(2, 4);
        assert_eq!(
            pool.decref(BlockId(1)),
            Err(CoreError::BlockNotAllocated(BlockId(1)))
        );
        assert_eq!(
            pool.incref(BlockId(0)),
            Err(CoreError::BlockNotAllocated(BlockId(0)))
        );
        assert!(pool.decref(BlockId(7)).is_err());
        assert_eq!(pool.ref_count(BlockId(1)), 0);
        assert_eq!(pool.num_free(), 2);
        pool.check_invariants().unwrap();
    }
}
