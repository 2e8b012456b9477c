//! Radix prefix cache (SGLang's RadixAttention) over token ids, holding KV blocks.
//!
//! Each node owns a run of tokens `key` at positions `[start, end)` of every
//! sequence that passes through it, and the KV blocks of that run:
//! - `blocks`: the *full* blocks completed inside the node, i.e. block indices
//!   `start / bs .. end / bs`; a full block holds valid K/V for all its slots
//!   (the earlier slots belong to ancestors' tokens of the same path);
//! - `tail`: for a leaf that ends mid-block, the block holding its last
//!   `end % bs` tokens (slots `0 .. end % bs` valid). An inner node needs no
//!   tail: any child's first block holds the same slots.
//!
//! Reuse is token-granular: [`RadixCache::match_prefix`] returns the shared
//! full blocks plus, when the match ends mid-block, the block to copy the first
//! `len % bs` slots from (copy-on-write by the caller).
//!
//! KV cache groups ([`RadixCache::with_groups`]): a block index then stands
//! for one page per group; `blocks` holds group 0's pages and `group_blocks`
//! the other groups', index for index. Group 0's pages are always real; a
//! page of another group may be [`BlockId::NULL`] where the inserting
//! sequence's window had already released it (the caller decides which
//! prefixes such holes leave usable). With groups the cache is
//! block-granular: matches and inserts are cut down to whole blocks, so no
//! node has a tail and no match needs a copy.
//!
//! Invariants (checked by [`RadixCache::check_invariants`]):
//! - the tree holds one pool reference for every block in `blocks` and `tail`
//!   and every real page in `group_blocks`;
//! - `blocks.len() == end / bs - start / bs`, and so is each group's length; a tail only on a leaf with `end % bs != 0`;
//! - `lock_ref` of a node counts the locks on it and on its descendants
//!   (as SGLang's), so a locked node and its ancestors are never evicted;
//! - `evictable` holds exactly the non-root leaves that are unlocked (evict the
//!   node) or locked with a tail (drop only the tail), ordered LRU first.
//!
//! Costs: `match_prefix` and `insert` are O(tokens walked + nodes walked ·
//! log nodes); `relock` is O(nodes between the two nodes); `inc_lock_ref` /
//! `dec_lock_ref` O(depth); `evict` O(log nodes) per node evicted.

use std::collections::{BTreeSet, HashMap};

mod check;
mod tree;

use crate::block_pool::{BlockId, BlockPool};
use crate::error::{CoreError, Result};

/// Handle of a radix tree node; stays valid (and keeps its `end`) until the
/// node is evicted, which cannot happen while it is locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(u32);

impl NodeId {
    /// The root: the empty prefix; never evicted, never holds blocks.
    pub const ROOT: NodeId = NodeId(0);
}

#[derive(Debug, Clone)]
pub(crate) struct Node {
    parent: NodeId,
    /// Children by the first token of their key.
    children: HashMap<u32, NodeId>,
    key: Vec<u32>,
    /// Position of `key[0]` in the sequence.
    start: usize,
    blocks: Vec<BlockId>,
    /// Groups 1..'s pages of the same block indices (`NULL`: released).
    group_blocks: Vec<Vec<BlockId>>,
    tail: Option<BlockId>,
    lock_ref: u32,
    last_access: u64,
}

impl Node {
    fn end(&self) -> usize {
        self.start + self.key.len()
    }
}

/// Result of [`RadixCache::match_prefix`].
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixMatch {
    /// Node ending exactly at `num_tokens` (lock it to keep the prefix).
    pub node: NodeId,
    /// Tokens whose K/V can be reused.
    pub num_tokens: usize,
    /// Full blocks of the prefix, `num_tokens / block_size` of them.
    pub blocks: Vec<BlockId>,
    /// When `num_tokens % block_size != 0`: a block whose first
    /// `num_tokens % block_size` slots hold the rest of the prefix.
    pub partial_block: Option<BlockId>,
    /// Groups 1..'s pages of `blocks`' indices (entries may be
    /// [`BlockId::NULL`]); empty without groups.
    pub group_blocks: Vec<Vec<BlockId>>,
}

/// Result of [`RadixCache::insert`].
#[derive(Debug, Clone, PartialEq)]
pub struct InsertOutcome {
    /// Node ending exactly at the inserted length.
    pub node: NodeId,
    /// `(block index, block)` where the tree already held a full block for that
    /// index that differs from the caller's: the caller may switch to it and
    /// free its own copy.
    pub shared_blocks: Vec<(usize, BlockId)>,
    /// The same for groups 1..: `(group - 1, block index, page)` where the
    /// tree holds a real page that differs from the caller's.
    pub shared_group_blocks: Vec<(usize, usize, BlockId)>,
}

/// The radix tree. Block references go through a [`BlockPool`] passed in.
#[derive(Debug, Clone)]
pub struct RadixCache {
    block_size: usize,
    /// KV cache groups past group 0 (0: one group, token-granular reuse).
    extra_groups: usize,
    nodes: Vec<Option<Node>>,
    free_slots: Vec<u32>,
    evictable: BTreeSet<(u64, NodeId)>,
    clock: u64,
    num_tokens: usize,
    /// Nodes removed so far: a node id seen when this was `n` still names
    /// the same node while it is `n`.
    removals: u64,
}

fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl RadixCache {
    pub fn new(block_size: usize) -> Self {
        Self::with_groups(block_size, 1)
    }

    /// A cache whose block indices stand for one page in each of
    /// `num_groups` KV cache groups (see the module docs); 1 is [`Self::new`].
    pub fn with_groups(block_size: usize, num_groups: usize) -> Self {
        let extra_groups = num_groups.saturating_sub(1);
        let root = Node {
            parent: NodeId::ROOT,
            children: HashMap::new(),
            key: Vec::new(),
            start: 0,
            blocks: Vec::new(),
            group_blocks: vec![Vec::new(); extra_groups],
            tail: None,
            lock_ref: 0,
            last_access: 0,
        };
        RadixCache {
            block_size: block_size.max(1),
            extra_groups,
            nodes: vec![Some(root)],
            free_slots: Vec::new(),
            evictable: BTreeSet::new(),
            clock: 0,
            num_tokens: 0,
            removals: 0,
        }
    }

    /// KV cache groups each block index holds a page of (at least 1).
    pub fn num_groups(&self) -> usize {
        1 + self.extra_groups
    }

    /// Tokens stored in the tree (each path token once).
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// Nodes removed (evicted) so far; while unchanged, every node id seen
    /// before still names the same node.
    pub fn removals(&self) -> u64 {
        self.removals
    }

    pub fn is_live(&self, id: NodeId) -> bool {
        matches!(self.nodes.get(id.0 as usize), Some(Some(_)))
    }

    /// Position just past the node's last token, or `None` for a dead node.
    pub fn node_end(&self, id: NodeId) -> Option<usize> {
        self.get(id).map(Node::end)
    }

    pub fn lock_ref(&self, id: NodeId) -> Option<u32> {
        self.get(id).map(|n| n.lock_ref)
    }

    /// Longest cached prefix of `tokens` whose K/V is available. Splits the
    /// node where the match ends so that the returned node ends exactly there.
    /// Takes no references: lock the node (and incref what you keep) at once.
    pub fn match_prefix(&mut self, tokens: &[u32]) -> PrefixMatch {
        self.clock += 1;
        let bs = self.block_size;
        // 1. Walk down as far as tokens agree.
        let (mut cur, mut m, mut last) = (NodeId::ROOT, 0, None);
        while m < tokens.len() {
            let Some(&child) = self.n(cur).children.get(&tokens[m]) else {
                break;
            };
            let c = self.n(child);
            let k = common_prefix_len(&c.key, &tokens[m..]);
            let full = k == c.key.len();
            m += k;
            last = Some(child);
            if !full {
                break;
            }
            cur = child;
        }
        // 2. A match ending mid-block needs a source for that block's slots.
        let mut partial_block = None;
        if self.extra_groups > 0 {
            m -= m % bs;
        } else if let (Some(holder), true) = (last, m % bs != 0) {
            partial_block = self.partial_source(holder, m);
            if partial_block.is_none() {
                m -= m % bs;
            }
        }
        // 3. Find (or split off) the node ending at m; collect its path.
        let mut node = NodeId::ROOT;
        let mut cur = NodeId::ROOT;
        while self.n(cur).end() < m {
            let child = self.n(cur).children[&tokens[self.n(cur).end()]];
            let c = self.n(child);
            node = if c.end() > m {
                self.split(child, m - c.start)
            } else {
                child
            };
            cur = node;
        }
        let mut path = Vec::new();
        let mut up = node;
        while up != NodeId::ROOT {
            path.push(up);
            up = self.n(up).parent;
        }
        let mut blocks = Vec::with_capacity(m / bs);
        let mut group_blocks = vec![Vec::with_capacity(m / bs); self.extra_groups];
        for &id in path.iter().rev() {
            let n = self.n(id);
            blocks.extend_from_slice(&n.blocks);
            for (out, pages) in group_blocks.iter_mut().zip(&n.group_blocks) {
                out.extend_from_slice(pages);
            }
            self.touch(id, self.clock);
        }
        PrefixMatch {
            node,
            num_tokens: m,
            blocks,
            partial_block,
            group_blocks,
        }
    }

    /// Stores `tokens` (a whole sequence prefix) whose K/V is in `blocks`
    /// (the sequence's block table), walking down from `from`, a node on that
    /// sequence's path (the root, or a node it holds locked). Tokens beyond
    /// the blocks are ignored. The tree takes references on the blocks it keeps.
    /// Entries that are [`BlockId::NULL`] (released by a sliding window) are
    /// never taken: where the tree does not hold those positions already, the
    /// insert stops before them (the returned node ends there).
    pub fn insert(
        &mut self,
        pool: &mut BlockPool,
        from: NodeId,
        tokens: &[u32],
        blocks: &[BlockId],
    ) -> Result<InsertOutcome> {
        self.insert_groups(pool, from, tokens, blocks, &[])
    }

    /// [`Self::insert`] with the pages of groups 1.. (`group_blocks[g - 1]`,
    /// as long as `blocks`; one slice per extra group). With groups only
    /// whole blocks are stored; a group's `NULL` pages are stored as holes
    /// (group 0's still stop the insert).
    pub fn insert_groups(
        &mut self,
        pool: &mut BlockPool,
        from: NodeId,
        tokens: &[u32],
        blocks: &[BlockId],
        group_blocks: &[&[BlockId]],
    ) -> Result<InsertOutcome> {
        let bs = self.block_size;
        let from_end = self
            .get(from)
            .ok_or(CoreError::StaleRadixNode(from.0))?
            .end();
        if group_blocks.len() != self.extra_groups
            || group_blocks.iter().any(|g| g.len() < blocks.len())
        {
            return Err(CoreError::InvalidConfig(format!(
                "radix insert with {} extra KV group tables for a cache of {}",
                group_blocks.len(),
                self.extra_groups
            )));
        }
        let mut end = tokens.len().min(blocks.len() * bs);
        if self.extra_groups > 0 {
            end -= end % bs;
        }
        if end <= from_end {
            return Ok(InsertOutcome {
                node: from,
                shared_blocks: Vec::new(),
                shared_group_blocks: Vec::new(),
            });
        }
        let used = end.div_ceil(bs);
        if let Some(&b) = blocks[..used]
            .iter()
            .chain(group_blocks.iter().flat_map(|g| &g[..used]))
            .find(|&&b| !b.is_null() && pool.ref_count(b) == 0)
        {
            return Err(CoreError::BlockNotAllocated(b));
        }
        self.clock += 1;
        let (mut cur, mut pos) = (from, from_end);
        let mut shared_blocks = Vec::new();
        let mut shared_group_blocks = Vec::new();
        self.touch(cur, self.clock);
        while pos < end {
            let Some(&child) = self.n(cur).children.get(&tokens[pos]) else {
                // Blocks a sliding window released cannot be cached: the
                // insert stops where the tree no longer has them.
                if blocks[pos / bs..end.div_ceil(bs)]
                    .iter()
                    .any(|b| b.is_null())
                {
                    break;
                }
                let tail = (!end.is_multiple_of(bs)).then(|| blocks[end / bs]);
                let full = blocks[pos / bs..end / bs].to_vec();
                let pages: Vec<Vec<BlockId>> = group_blocks
                    .iter()
                    .map(|g| g[pos / bs..end / bs].to_vec())
                    .collect();
                for &b in full.iter().chain(&tail) {
                    pool.incref(b)?;
                }
                for &b in pages.iter().flatten().filter(|b| !b.is_null()) {
                    pool.incref(b)?;
                }
                if let Some(old_tail) = self.n_mut(cur).tail.take() {
                    pool.decref(old_tail)?;
                }
                let leaf = self.add_node(Node {
                    parent: cur,
                    children: HashMap::new(),
                    key: tokens[pos..end].to_vec(),
                    start: pos,
                    blocks: full,
                    group_blocks: pages,
                    tail,
                    lock_ref: 0,
                    last_access: self.clock,
                });
                self.n_mut(cur).children.insert(tokens[pos], leaf);
                self.num_tokens += end - pos;
                self.refresh(cur);
                self.refresh(leaf);
                cur = leaf;
                break;
            };
            let c = self.n(child);
            let k = common_prefix_len(&c.key, &tokens[pos..end]);
            let next = if k < c.key.len() {
                self.split(child, k)
            } else {
                child
            };
            let n = self.n(next);
            let first = n.start / bs;
            for (i, &b) in n.blocks.iter().enumerate() {
                if blocks[first + i] != b {
                    shared_blocks.push((first + i, b));
                }
            }
            for (g, pages) in n.group_blocks.iter().enumerate() {
                for (i, &b) in pages.iter().enumerate() {
                    if !b.is_null() && group_blocks[g][first + i] != b {
                        shared_group_blocks.push((g, first + i, b));
                    }
                }
            }
            self.touch(next, self.clock);
            cur = next;
            pos += k;
        }
        // A leaf that lost its tail under memory pressure gets it back.
        let n = self.n(cur);
        if cur != NodeId::ROOT
            && n.end() == end
            && !end.is_multiple_of(bs)
            && n.children.is_empty()
            && n.tail.is_none()
        {
            pool.incref(blocks[end / bs])?;
            self.n_mut(cur).tail = Some(blocks[end / bs]);
            self.refresh(cur);
        }
        Ok(InsertOutcome {
            node: cur,
            shared_blocks,
            shared_group_blocks,
        })
    }

    /// Locks `id` and its ancestors against eviction. O(depth).
    pub fn inc_lock_ref(&mut self, id: NodeId) -> Result<()> {
        for n in self.path_to_root(id)? {
            self.n_mut(n).lock_ref += 1;
            self.refresh(n);
        }
        Ok(())
    }

    /// Releases a lock taken with [`Self::inc_lock_ref`]. O(depth).
    pub fn dec_lock_ref(&mut self, id: NodeId) -> Result<()> {
        let path = self.path_to_root(id)?;
        if let Some(&n) = path.iter().find(|&&n| self.n(n).lock_ref == 0) {
            return Err(CoreError::RadixNodeNotLocked(n.0));
        }
        for n in path {
            self.n_mut(n).lock_ref -= 1;
            self.refresh(n);
        }
        Ok(())
    }

    /// Moves a lock from `old` to its descendant `new` (same effect as
    /// `inc_lock_ref(new); dec_lock_ref(old)`), in O(nodes between them).
    pub fn relock(&mut self, old: NodeId, new: NodeId) -> Result<()> {
        let old_locked = self
            .get(old)
            .is_some_and(|n| n.lock_ref > 0 || old == NodeId::ROOT);
        if !old_locked {
            return Err(CoreError::RadixNodeNotLocked(old.0));
        }
        let mut between = Vec::new();
        let mut cur = new;
        while cur != old {
            if cur == NodeId::ROOT {
                return Err(CoreError::StaleRadixNode(new.0));
            }
            between.push(cur);
            cur = self
                .get(cur)
                .ok_or(CoreError::StaleRadixNode(cur.0))?
                .parent;
        }
        for n in between {
            self.n_mut(n).lock_ref += 1;
            self.refresh(n);
        }
        Ok(())
    }

    /// Frees blocks, least recently used first, until the pool has
    /// `target_free` free blocks or nothing is evictable: removes unlocked
    /// leaves, and drops the tail of locked leaves. Returns blocks freed.
    pub fn evict(&mut self, pool: &mut BlockPool, target_free: usize) -> Result<usize> {
        let mut freed = 0;
        while pool.num_free() < target_free {
            let Some((_, id)) = self.evictable.pop_first() else {
                break;
            };
            if self.n(id).lock_ref > 0 {
                if let Some(b) = self.n_mut(id).tail.take() {
                    freed += pool.decref(b)? as usize;
                }
                continue;
            }
            freed += self.remove_leaf(pool, id)?;
        }
        Ok(freed)
    }

    /// Evicts everything that is not locked. Returns blocks freed.
    pub fn flush(&mut self, pool: &mut BlockPool) -> Result<usize> {
        self.evict(pool, usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Computes `tokens` into fresh blocks, caches them, drops the request's refs.
    fn cache_seq(tree: &mut RadixCache, pool: &mut BlockPool, tokens: &[u32]) -> Vec<BlockId> {
        let bs = pool.block_size();
        let blocks: Vec<_> = (0..tokens.len().div_ceil(bs))
            .map(|_| pool.allocate().unwrap())
            .collect();
        tree.insert(pool, NodeId::ROOT, tokens, &blocks).unwrap();
        for &b in &blocks {
            pool.decref(b).unwrap();
        }
        blocks
    }

    #[test]
    fn match_ending_mid_block_names_the_block_to_copy() {
        let (mut tree, mut pool) = (RadixCache::new(16), BlockPool::new(8, 16));
        let first = [1, 29871, 29896, 29906, 29941, 29946, 29945, 13, 14];
        let b = cache_seq(&mut tree, &mut pool, &first);
        let m = tree.match_prefix(&[1, 29871, 29896, 29906, 29941, 29946, 29945, 29896, 29906]);
        assert_eq!(
            (m.num_tokens, m.blocks.clone(), m.partial_block),
            (7, vec![], Some(b[0]))
        );
        assert_eq!(tree.node_tokens(m.node).unwrap(), first[..7].to_vec());
        assert_eq!(tree.num_tokens(), first.len(), "a split adds no tokens");
        tree.check_invariants(&pool).unwrap();
    }

    #[test]
    fn full_blocks_are_shared_and_divergent_inserts_report_nothing_shared() {
        let (mut tree, mut pool) = (RadixCache::new(4), BlockPool::new(16, 4));
        let a = cache_seq(&mut tree, &mut pool, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        let m = tree.match_prefix(&[1, 2, 3, 4, 5, 6, 7, 8, 0, 0]);
        assert_eq!(
            (m.num_tokens, m.blocks, m.partial_block),
            (8, a[..2].to_vec(), None)
        );
        // The same prefix computed again into other blocks: the tree keeps its own.
        let other: Vec<_> = (0..3).map(|_| pool.allocate().unwrap()).collect();
        let out = tree
            .insert(
                &mut pool,
                NodeId::ROOT,
                &[1, 2, 3, 4, 5, 6, 7, 8, 9],
                &other,
            )
            .unwrap();
        assert_eq!(out.shared_blocks, vec![(0, a[0]), (1, a[1])]);
        assert_eq!(tree.node_end(out.node), Some(9));
        tree.check_invariants(&pool).unwrap();
    }

    #[test]
    fn locked_nodes_survive_eviction_and_lru_goes_first() {
        let (mut tree, mut pool) = (RadixCache::new(4), BlockPool::new(6, 4));
        cache_seq(&mut tree, &mut pool, &[1, 1, 1, 1, 1, 1, 1, 1]);
        cache_seq(&mut tree, &mut pool, &[2, 2, 2, 2]);
        cache_seq(&mut tree, &mut pool, &[3, 3, 3, 3]);
        assert_eq!(pool.num_free(), 2);
        let locked = tree.match_prefix(&[1, 1, 1, 1, 1, 1, 1, 1]).node;
        tree.inc_lock_ref(locked).unwrap();
        tree.match_prefix(&[2, 2, 2, 2]); // touch: [3..] is now least recently used
        assert_eq!(tree.evict(&mut pool, 3).unwrap(), 1);
        assert_eq!(tree.match_prefix(&[3, 3, 3, 3]).num_tokens, 0);
        assert_eq!(tree.match_prefix(&[2, 2, 2, 2]).num_tokens, 4);
        assert_eq!(tree.flush(&mut pool).unwrap(), 1);
        assert_eq!(
            tree.match_prefix(&[1; 8]).num_tokens,
            8,
            "locked prefix kept"
        );
        tree.dec_lock_ref(locked).unwrap();
        assert!(
            tree.dec_lock_ref(locked).is_err(),
            "lock_ref never underflows"
        );
        tree.flush(&mut pool).unwrap();
        assert_eq!((pool.num_free(), tree.num_tokens()), (6, 0));
        tree.check_invariants(&pool).unwrap();
    }

    #[test]
    fn evicting_a_child_hands_its_block_to_a_parent_ending_mid_block() {
        let (mut tree, mut pool) = (RadixCache::new(4), BlockPool::new(8, 4));
        cache_seq(&mut tree, &mut pool, &[1, 2, 3, 4, 5]);
        let b = cache_seq(&mut tree, &mut pool, &[1, 2, 9, 9, 9]);
        // Splits [9, 9, 9] into [9] -> [9, 9]; [3, 4, 5] is now least recent.
        assert_eq!(tree.match_prefix(&[1, 2, 9]).num_tokens, 3);
        let target = pool.num_free() + 1;
        assert_eq!(tree.evict(&mut pool, target).unwrap(), 2);
        // [1, 2] is inner; its partial block is found below [9] (an inner node too).
        let m = tree.match_prefix(&[1, 2, 3]);
        assert_eq!((m.num_tokens, m.partial_block), (2, Some(b[0])));
        // Evicting [9, 9] leaves [9] a leaf ending mid-block: it keeps block b0.
        let target = pool.num_free() + 1;
        assert_eq!(tree.evict(&mut pool, target).unwrap(), 1);
        let m = tree.match_prefix(&[1, 2, 9, 9]);
        assert_eq!((m.num_tokens, m.partial_block), (3, Some(b[0])));
        tree.check_invariants(&pool).unwrap();
        tree.flush(&mut pool).unwrap();
        assert_eq!(pool.num_free(), 8);
    }

    #[test]
    fn relock_moves_a_lock_down_the_path() {
        let (mut tree, mut pool) = (RadixCache::new(2), BlockPool::new(8, 2));
        cache_seq(&mut tree, &mut pool, &[1, 2, 3, 4, 5, 6]);
        let upper = tree.match_prefix(&[1, 2]).node;
        let lower = tree.match_prefix(&[1, 2, 3, 4]).node;
        tree.inc_lock_ref(upper).unwrap();
        tree.relock(upper, lower).unwrap();
        assert_eq!(
            (tree.lock_ref(upper), tree.lock_ref(lower)),
            (Some(1), Some(1))
        );
        assert!(tree.relock(lower, upper).is_err(), "not a descendant");
        tree.dec_lock_ref(lower).unwrap();
        assert_eq!(tree.lock_ref(upper), Some(0));
        tree.check_invariants(&pool).unwrap();
    }
}
