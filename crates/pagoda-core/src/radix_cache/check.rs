//! Whole-tree consistency checks and introspection of the radix cache, for
//! tests: O(nodes + blocks) each, never called per step.

use std::collections::HashMap;

use super::{NodeId, RadixCache};
use crate::block_pool::{BlockId, BlockPool};

impl RadixCache {
    /// The tokens from the root to the end of `id`. O(depth); for tests.
    pub fn node_tokens(&self, id: NodeId) -> Option<Vec<u32>> {
        let mut parts = Vec::new();
        let mut cur = id;
        while cur != NodeId::ROOT {
            let n = self.get(cur)?;
            parts.push(&n.key[..]);
            cur = n.parent;
        }
        Some(parts.into_iter().rev().flatten().copied().collect())
    }

    /// Locks held on each node itself (`lock_ref` minus its children's), for
    /// nodes with any. O(nodes); for tests.
    pub fn own_locks(&self) -> HashMap<NodeId, u32> {
        let mut out = HashMap::new();
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            let Some(n) = n else { continue };
            let below: u32 = n.children.values().map(|&c| self.n(c).lock_ref).sum();
            if n.lock_ref > below {
                out.insert(NodeId(i as u32), n.lock_ref - below);
            }
        }
        out
    }

    /// Checks every structural invariant; returns how many references the
    /// tree holds on each block. O(nodes + blocks); for tests.
    pub fn check_invariants(
        &self,
        pool: &BlockPool,
    ) -> std::result::Result<HashMap<BlockId, u32>, String> {
        let bs = self.block_size;
        let mut refs: HashMap<BlockId, u32> = HashMap::new();
        let (mut seen, mut tokens) = (0usize, 0usize);
        let mut stack = vec![NodeId::ROOT];
        while let Some(id) = stack.pop() {
            let n = self.get(id).ok_or(format!("dead node {id:?} reachable"))?;
            seen += 1;
            tokens += n.key.len();
            if id != NodeId::ROOT && n.key.is_empty() {
                return Err(format!("{id:?}: empty key"));
            }
            if n.blocks.len() != n.end() / bs - n.start / bs {
                return Err(format!(
                    "{id:?}: {} blocks for [{}, {})",
                    n.blocks.len(),
                    n.start,
                    n.end()
                ));
            }
            if n.group_blocks.len() != self.extra_groups
                || n.group_blocks.iter().any(|g| g.len() != n.blocks.len())
            {
                return Err(format!("{id:?}: group pages do not match its blocks"));
            }
            if n.blocks.iter().any(|b| b.is_null()) {
                return Err(format!("{id:?}: a NULL block in group 0"));
            }
            if n.tail.is_some()
                && (self.extra_groups > 0
                    || !n.children.is_empty()
                    || n.end() % bs == 0
                    || id == NodeId::ROOT)
            {
                return Err(format!("{id:?}: tail on a node that must not have one"));
            }
            let mut child_locks = 0;
            for (&first, &c) in &n.children {
                let cn = self.get(c).ok_or(format!("{id:?}: dead child {c:?}"))?;
                if cn.parent != id || cn.start != n.end() || cn.key.first() != Some(&first) {
                    return Err(format!("{c:?}: inconsistent with parent {id:?}"));
                }
                child_locks += cn.lock_ref;
                stack.push(c);
            }
            if id != NodeId::ROOT && n.lock_ref < child_locks {
                return Err(format!(
                    "{id:?}: lock_ref {} < children's {child_locks}",
                    n.lock_ref
                ));
            }
            if self.evictable.contains(&(n.last_access, id)) != self.is_evictable(id) {
                return Err(format!("{id:?}: eviction set membership is stale"));
            }
            let pages = n.group_blocks.iter().flatten().filter(|b| !b.is_null());
            for &b in n.blocks.iter().chain(&n.tail).chain(pages) {
                *refs.entry(b).or_default() += 1;
            }
        }
        let live = self.nodes.iter().filter(|n| n.is_some()).count();
        if seen != live || self.evictable.len() > live || tokens != self.num_tokens {
            return Err(format!(
                "{seen} reachable of {live} live nodes; {tokens} tokens vs {}",
                self.num_tokens
            ));
        }
        if let Some((b, c)) = refs.iter().find(|(&b, &c)| pool.ref_count(b) < c) {
            return Err(format!(
                "block {b}: tree holds {c} refs, pool counts {}",
                pool.ref_count(*b)
            ));
        }
        Ok(refs)
    }
}
