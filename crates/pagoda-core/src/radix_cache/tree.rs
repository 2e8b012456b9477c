//! Node storage and structural edits of the radix tree: lookup, the
//! eviction-set bookkeeping, block lookup by index, split and leaf removal.
//!
//! Costs: `refresh`/`touch` O(log nodes); `split` O(key length + blocks);
//! `remove_leaf` O(blocks of the leaf + log nodes); `partial_source`
//! O(nodes starting inside one block).

use super::{Node, NodeId, RadixCache};
use crate::block_pool::{BlockId, BlockPool};
use crate::error::{CoreError, Result};
use std::collections::HashMap;

impl RadixCache {
    pub(super) fn get(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id.0 as usize).and_then(Option::as_ref)
    }

    pub(super) fn n(&self, id: NodeId) -> &Node {
        self.get(id)
            .expect("radix node ids held internally are live")
    }

    pub(super) fn n_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes[id.0 as usize]
            .as_mut()
            .expect("radix node ids held internally are live")
    }

    pub(super) fn is_evictable(&self, id: NodeId) -> bool {
        let n = self.n(id);
        id != NodeId::ROOT && n.children.is_empty() && (n.lock_ref == 0 || n.tail.is_some())
    }

    /// Re-derives `id`'s membership in the eviction set after a change.
    pub(super) fn refresh(&mut self, id: NodeId) {
        let key = (self.n(id).last_access, id);
        self.evictable.remove(&key);
        if self.is_evictable(id) {
            self.evictable.insert(key);
        }
    }

    pub(super) fn touch(&mut self, id: NodeId, now: u64) {
        self.evictable.remove(&(self.n(id).last_access, id));
        self.n_mut(id).last_access = now;
        self.refresh(id);
    }

    pub(super) fn add_node(&mut self, node: Node) -> NodeId {
        match self.free_slots.pop() {
            Some(slot) => {
                self.nodes[slot as usize] = Some(node);
                NodeId(slot)
            }
            None => {
                self.nodes.push(Some(node));
                NodeId(self.nodes.len() as u32 - 1)
            }
        }
    }

    /// Block of index `q` held by `node` (full block or tail), if any.
    pub(super) fn block_at(&self, node: &Node, q: usize) -> Option<BlockId> {
        let bs = self.block_size;
        let first = node.start / bs;
        if q >= first && q < node.end() / bs {
            return node.blocks.get(q - first).copied();
        }
        if q == node.end() / bs && !node.end().is_multiple_of(bs) {
            return node.tail;
        }
        None
    }

    /// A block holding slots `0 .. m % bs` of block `m / bs`, where `holder`
    /// contains position `m - 1`. O(nodes starting inside that block).
    pub(super) fn partial_source(&self, holder: NodeId, m: usize) -> Option<BlockId> {
        // Every node below `holder` that starts inside block q holds these
        // slots if it has a block for q; search that part of the subtree.
        let q = m / self.block_size;
        let mut stack = vec![holder];
        while let Some(id) = stack.pop() {
            let n = self.n(id);
            if let Some(b) = self.block_at(n, q) {
                return Some(b);
            }
            if n.end() / self.block_size == q {
                stack.extend(n.children.values());
            }
        }
        None
    }

    /// Splits `id` after its first `k` tokens (0 < k < key.len()). `id` keeps
    /// the lower part (so handles to it keep their `end`); returns the new upper node.
    pub(super) fn split(&mut self, id: NodeId, k: usize) -> NodeId {
        let bs = self.block_size;
        let n = self.n_mut(id);
        let split_at = n.start + k;
        let upper_full = split_at / bs - n.start / bs;
        let upper = Node {
            parent: n.parent,
            children: HashMap::from([(n.key[k], id)]),
            key: n.key[..k].to_vec(),
            start: n.start,
            blocks: n.blocks.drain(..upper_full).collect(),
            group_blocks: n
                .group_blocks
                .iter_mut()
                .map(|g| g.drain(..upper_full).collect())
                .collect(),
            tail: None,
            lock_ref: n.lock_ref,
            last_access: n.last_access,
        };
        n.key.drain(..k);
        n.start = split_at;
        let (parent, first) = (upper.parent, upper.key[0]);
        let up = self.add_node(upper);
        self.n_mut(id).parent = up;
        self.n_mut(parent).children.insert(first, up);
        up
    }

    pub(super) fn path_to_root(&self, id: NodeId) -> Result<Vec<NodeId>> {
        self.get(id).ok_or(CoreError::StaleRadixNode(id.0))?;
        let mut path = Vec::new();
        let mut cur = id;
        while cur != NodeId::ROOT {
            path.push(cur);
            cur = self.n(cur).parent;
        }
        Ok(path)
    }

    pub(super) fn remove_leaf(&mut self, pool: &mut BlockPool, id: NodeId) -> Result<usize> {
        let bs = self.block_size;
        let Some(node) = self.nodes[id.0 as usize].take() else {
            return Ok(0);
        };
        self.free_slots.push(id.0);
        self.removals += 1;
        self.num_tokens -= node.key.len();
        let parent = node.parent;
        self.n_mut(parent).children.remove(&node.key[0]);
        // A parent left as a leaf that ends mid-block keeps this block's slots
        // of its own tokens as its tail.
        let p = self.n(parent);
        let keep = (self.extra_groups == 0
            && parent != NodeId::ROOT
            && node.start % bs != 0
            && p.children.is_empty())
        .then(|| self.block_at(&node, node.start / bs))
        .flatten();
        let mut freed = 0;
        for &b in node.blocks.iter().chain(&node.tail) {
            if Some(b) != keep {
                freed += pool.decref(b)? as usize;
            }
        }
        for &b in node.group_blocks.iter().flatten().filter(|b| !b.is_null()) {
            freed += pool.decref(b)? as usize;
        }
        if keep.is_some() {
            self.n_mut(parent).tail = keep;
        }
        self.refresh(parent);
        Ok(freed)
    }
}
