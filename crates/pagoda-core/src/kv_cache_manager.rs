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
//! KV cache groups (vLLM's hybrid manager; Gemma 2/3's local and global
//! layers): the layers may be split into groups, each with its own window
//! (or none), over this one pool of pages (the runner lays a page out as one
//! block of every layer slot of a group; see `pagoda_model::KvLayout`). A
//! sequence has one block table per group, all of the same length: group 0's
//! is `block_table`, the others' are `group_tables`. Each windowed group
//! releases its passed blocks as above, on its own; a full-attention group
//! keeps every block. So a long context costs the full groups' KV plus one
//! window per local group.
//!
//! Prefix caching with groups (vLLM's hybrid manager's hit rule): a cached
//! block index holds one page per group (`RadixCache::with_groups`), and
//! reuse is block-granular (no mid-block hit, so no block copies). A
//! sequence inserts each block as it completes, before any window passes
//! it, so the tree normally holds every group's page; a local group's page
//! is a hole (`NULL`) only where the sequence had released it before the
//! insert (after the tree evicted part of its path). A hit of `k` blocks is
//! usable when every group can supply what the query at `p = k * bs` reads:
//! a full group all `k` pages, a windowed group those from
//! `first_read_position(p, window) / bs` on; the hit is the longest such
//! prefix of the tree's match. Pages the hit takes before a window are
//! released at once (the tree keeps its own reference). As with one
//! window, a sequence's first release (in any group) swaps its radix lock
//! for an unlocked cursor, so the cached local pages its windows passed
//! stay evictable (LRU, a leaf with all its groups' pages at a time) rather
//! than pinned: a long running context costs no more than without caching
//! once the tree gives way.
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
//!   `num_released_blocks` (a group's: its `num_released`), all before the
//!   block of `first_read_position` of its next query; the entries after
//!   them are real pages (a prefix hit's holes lie before its window and
//!   are passed at once);
//! - a prefix hit never hands out a page the tree does not hold, and holds
//!   a real page in every group for every block some query will read;
//! - the radix tree gives way first: allocation evicts the cache before it
//!   reports a shortage.
//!
//! Costs: `allocate_slots` O(new blocks + released blocks) plus eviction;
//! `cache_full_blocks` O(newly full blocks); `acquire_prefix` and `release`
//! O(sequence length).

use crate::block_pool::{BlockId, BlockPool};
use crate::error::{CoreError, Result};
use crate::radix_cache::{NodeId, RadixCache};
use crate::sequence::{GroupTable, RadixCursor, RadixHold, Sequence};

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
    /// The sliding window of group 0 (with one group: of every attention
    /// layer), where blocks it passes are released.
    pub(crate) window: Option<usize>,
    /// The windows of groups 1.. (`None`: a full-attention group).
    pub(crate) group_windows: Vec<Option<usize>>,
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
            group_windows: Vec::new(),
            radix: enable_prefix_caching.then(|| RadixCache::new(block_size)),
            pending_copy_srcs: Vec::new(),
        }
    }

    /// A manager over KV cache groups with windows `windows` (one entry per
    /// group, at least one). One group is [`Self::new`]; with more, prefix
    /// caching is block-granular (see the module docs).
    pub fn with_groups(
        num_blocks: usize,
        block_size: usize,
        enable_prefix_caching: bool,
        windows: &[Option<usize>],
    ) -> Result<Self> {
        let Some((&first, rest)) = windows.split_first() else {
            return Err(CoreError::InvalidConfig("no KV cache group".into()));
        };
        let mut m = Self::new(num_blocks, block_size, enable_prefix_caching, first);
        m.group_windows = rest.to_vec();
        if enable_prefix_caching {
            m.radix = Some(RadixCache::with_groups(block_size, windows.len()));
        }
        Ok(m)
    }

    /// The longest usable prefix, in blocks, of a match of `k` blocks whose
    /// pages are `tables` (group 0 first; see the module docs): every
    /// group has real pages from the block its window's first read at
    /// `p = k * bs` falls in up to `k`. O(blocks) per group.
    fn usable_hit_blocks(&self, mut k: usize, tables: &[&[BlockId]]) -> usize {
        let bs = self.bs();
        loop {
            let mut ok = true;
            for (w, table) in self.windows().zip(tables) {
                let first = w.map_or(0, |w| first_read_position(k * bs, w) / bs);
                if let Some(hole) = table[first.min(k)..k].iter().rposition(|b| b.is_null()) {
                    k = first + hole;
                    ok = false;
                }
            }
            if ok {
                return k;
            }
        }
    }

    /// KV cache groups (at least 1).
    pub fn num_groups(&self) -> usize {
        1 + self.group_windows.len()
    }

    /// Every group's window, group 0 first.
    pub fn windows(&self) -> impl Iterator<Item = Option<usize>> + '_ {
        std::iter::once(self.window).chain(self.group_windows.iter().copied())
    }

    /// The most pages a sequence holds over all groups when its context
    /// reaches `num_tokens` tokens and it is given slots for at most
    /// `max_chunk` new tokens at a time.
    pub fn max_blocks_held(&self, num_tokens: usize, max_chunk: usize) -> usize {
        let bs = self.bs();
        let all = num_tokens.div_ceil(bs);
        self.windows()
            .map(|w| match w {
                Some(w) => all.min(max_blocks_in_window(w, max_chunk, bs)),
                None => all,
            })
            .sum()
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
        if !m.group_blocks.is_empty() {
            let tables: Vec<&[BlockId]> = std::iter::once(&m.blocks[..])
                .chain(m.group_blocks.iter().map(|g| &g[..]))
                .collect();
            let k = self.usable_hit_blocks(m.blocks.len(), &tables);
            if k < m.blocks.len() {
                let radix = self.radix.as_mut().expect("checked above");
                m = radix.match_prefix(&seq.token_ids[..k * bs]);
            }
        }
        let radix = self.radix.as_mut().expect("checked above");
        radix.inc_lock_ref(m.node)?;
        for &b in m.blocks.iter().chain(m.group_blocks.iter().flatten()) {
            if !b.is_null() {
                self.pool.incref(b)?;
            }
        }
        if !m.group_blocks.is_empty() {
            seq.group_tables = m
                .group_blocks
                .drain(..)
                .map(|blocks| GroupTable {
                    blocks,
                    num_released: 0,
                })
                .collect();
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
        let bs = self.bs();
        let mut released_any = false;
        for (g, table) in self.group_windows.iter().zip(&mut seq.group_tables) {
            let Some(window) = *g else { continue };
            let first = first_read_position(seq.num_computed_tokens, window);
            let upto = (first / bs).min(table.blocks.len());
            for b in table.blocks.iter_mut().take(upto).skip(table.num_released) {
                let id = std::mem::replace(b, BlockId::NULL);
                if !id.is_null() {
                    self.pool.decref(id)?;
                }
                released_any = true;
            }
            table.num_released = table.num_released.max(upto);
        }
        let upto = match self.window {
            Some(window) => {
                let first = first_read_position(seq.num_computed_tokens, window);
                (first / bs).min(seq.block_table.len())
            }
            None => 0,
        };
        released_any |= upto > seq.num_released_blocks;
        if !released_any {
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
        if upto > seq.num_released_blocks {
            for b in &mut seq.block_table[seq.num_released_blocks..upto] {
                let id = std::mem::replace(b, BlockId::NULL);
                self.pool.decref(id)?;
            }
            seq.num_released_blocks = upto;
        }
        Ok(())
    }

    /// Grows the block table to cover `num_tokens` tokens, evicting cached
    /// prefixes if the pool runs short, after releasing the blocks a sliding
    /// window has passed. All or nothing: `false` allocates none (the
    /// release stands: those blocks are never read again).
    pub fn allocate_slots(&mut self, seq: &mut Sequence, num_tokens: usize) -> Result<bool> {
        self.release_passed_blocks(seq)?;
        let groups = self.num_groups();
        if seq.group_tables.len() + 1 != groups {
            seq.group_tables
                .resize_with(groups - 1, GroupTable::default);
        }
        let per_group = num_tokens
            .div_ceil(self.bs())
            .saturating_sub(seq.block_table.len());
        let need = per_group * groups;
        if self.pool.num_free() < need {
            if let Some(radix) = self.radix.as_mut() {
                radix.evict(&mut self.pool, need)?;
            }
            if self.pool.num_free() < need {
                return Ok(false);
            }
        }
        seq.block_table
            .extend(std::iter::from_fn(|| self.pool.allocate()).take(per_group));
        for table in &mut seq.group_tables {
            table
                .blocks
                .extend(std::iter::from_fn(|| self.pool.allocate()).take(per_group));
        }
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
        let groups: Vec<&[BlockId]> = seq.group_tables.iter().map(|t| &t.blocks[..]).collect();
        let out = if let Some(hold) = seq.radix_hold {
            if full <= hold.num_tokens {
                return Ok(());
            }
            let out = radix.insert_groups(
                &mut self.pool,
                hold.node,
                &seq.token_ids[..full],
                &seq.block_table,
                &groups,
            )?;
            radix.relock(hold.node, out.node)?;
            seq.radix_hold = Some(RadixHold {
                node: out.node,
                num_tokens: full,
            });
            out
        } else if let Some(cursor) = seq.radix_cursor {
            if full <= cursor.num_tokens {
                return Ok(());
            }
            let from = cursor_start(radix, cursor);
            let out = radix.insert_groups(
                &mut self.pool,
                from,
                &seq.token_ids[..full],
                &seq.block_table,
                &groups,
            )?;
            // Where the tree lost released blocks the insert stopped short:
            // the sequence caches nothing more.
            seq.radix_cursor = (radix.node_end(out.node) == Some(full)).then(|| RadixCursor {
                node: out.node,
                num_tokens: full,
                removals: radix.removals(),
            });
            out
        } else {
            return Ok(());
        };
        for (i, tree_block) in out.shared_blocks {
            if seq.block_table[i].is_null() {
                continue;
            }
            self.pool.incref(tree_block)?;
            let own = std::mem::replace(&mut seq.block_table[i], tree_block);
            self.pool.decref(own)?;
        }
        for (g, i, tree_page) in out.shared_group_blocks {
            let page = &mut seq.group_tables[g].blocks[i];
            if page.is_null() {
                continue;
            }
            self.pool.incref(tree_page)?;
            let own = std::mem::replace(page, tree_page);
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
            let groups: Vec<&[BlockId]> = seq.group_tables.iter().map(|t| &t.blocks[..]).collect();
            if let Some(hold) = seq.radix_hold.take() {
                radix.insert_groups(
                    &mut self.pool,
                    hold.node,
                    computed,
                    &seq.block_table,
                    &groups,
                )?;
                radix.dec_lock_ref(hold.node)?;
            } else if let Some(cursor) = seq.radix_cursor {
                let from = cursor_start(radix, cursor);
                radix.insert_groups(&mut self.pool, from, computed, &seq.block_table, &groups)?;
            }
        }
        seq.radix_cursor = None;
        for b in seq.block_table.drain(..) {
            if !b.is_null() {
                self.pool.decref(b)?;
            }
        }
        for table in seq.group_tables.drain(..) {
            for b in table.blocks {
                if !b.is_null() {
                    self.pool.decref(b)?;
                }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;
    use crate::sequence::{Request, RequestId};

    fn seq(tokens: Vec<u32>) -> Sequence {
        Sequence::new(Request {
            id: RequestId(0),
            prompt_token_ids: tokens,
            sampling: SamplingParams::greedy(4),
            eos_token_ids: vec![],
        })
    }

    /// Caches 160 tokens in groups [full, window 16] with the local
    /// group's pages of `holes` released; returns the hit a request
    /// extending them gets, after checking its tables and every page's return.
    fn hit_with_holes(windows: &[Option<usize>], holes: std::ops::Range<usize>) -> usize {
        let bs = 4;
        let mut m = KvCacheManager::with_groups(200, bs, true, windows).unwrap();
        let tokens: Vec<u32> = (0..160).collect();
        let n = tokens.len() / bs;
        let full: Vec<BlockId> = (0..n).map(|_| m.pool.allocate().unwrap()).collect();
        let local: Vec<BlockId> = (0..n)
            .map(|i| match holes.contains(&i) {
                true => BlockId::NULL,
                false => m.pool.allocate().unwrap(),
            })
            .collect();
        let radix = m.radix.as_mut().unwrap();
        radix
            .insert_groups(&mut m.pool, NodeId::ROOT, &tokens, &full, &[&local])
            .unwrap();
        for b in full.iter().chain(&local).filter(|b| !b.is_null()) {
            m.pool.decref(*b).unwrap();
        }
        let mut s = seq(tokens.iter().copied().chain([7, 7]).collect());
        m.acquire_prefix(&mut s, false).unwrap();
        let p = s.num_computed_tokens;
        assert_eq!(s.block_table, full[..p / bs]);
        let first = windows[1].map_or(0, |w| first_read_position(p, w) / bs);
        assert!(s.group_tables[0].blocks[first..]
            .iter()
            .all(|b| !b.is_null()));
        let total = s.num_tokens();
        assert!(m.allocate_slots(&mut s, total).unwrap());
        let t = &s.group_tables[0];
        assert!(t.blocks[..t.num_released].iter().all(|b| b.is_null()));
        assert!(t.blocks[t.num_released..].iter().all(|b| !b.is_null()));
        m.release(&mut s).unwrap();
        m.radix.as_mut().unwrap().flush(&mut m.pool).unwrap();
        assert_eq!(m.pool.num_free(), 200);
        p
    }

    /// A hit is the longest prefix every group can serve: a windowed group
    /// needs only the pages its window's first read (64-aligned) reaches;
    /// a full group every page.
    #[test]
    fn a_hit_stops_where_a_group_would_read_a_released_page() {
        let (local, full) = ([None, Some(16)], [None, None]);
        // Released pages 0..16 (positions 0..64): the query at 160 reads
        // from 128 on, so the windowed group serves all of it.
        assert_eq!(hit_with_holes(&local, 0..16), 160);
        assert_eq!(hit_with_holes(&full, 0..16), 0);
        // Pages 34..36 (positions 136..144) missing: the query at 136
        // reads from 64, the one at 140 from 64 too (through the hole).
        assert_eq!(hit_with_holes(&local, 34..36), 136);
        assert_eq!(hit_with_holes(&local, 0..0), 160);
    }
}
