//! Whole-state consistency checks of the scheduler, for tests and debugging.
//!
//! O(blocks + radix nodes + tokens of all requests): never called per step.

use std::collections::HashMap;

use crate::block_pool::BlockId;
use crate::kv_cache_manager::first_read_position;
use crate::radix_cache::NodeId;
use crate::scheduler::Scheduler;
use crate::sequence::SequenceStatus;

impl Scheduler {
    /// Holders of a block (0 = free).
    pub fn block_ref_count(&self, id: BlockId) -> u32 {
        self.kv.pool.ref_count(id)
    }

    /// Checks that every block reference is accounted for (ref count = block
    /// tables, radix tree and pending copy sources; free exactly when 0), that
    /// a sliding window released only blocks its next step never reads (as
    /// leading `BlockId::NULL` entries), that each running request that
    /// released none holds one radix lock on its own prefix and no other
    /// locks exist, that waiting and paused requests hold no cache state, and
    /// that queues, the paused count and states agree.
    pub fn check_invariants(&self) -> Result<(), String> {
        let kv = &self.kv;
        kv.pool.check_invariants()?;
        let mut refs: HashMap<BlockId, u32> = match &kv.radix {
            Some(radix) => radix.check_invariants(&kv.pool)?,
            None => HashMap::new(),
        };
        for &b in &kv.pending_copy_srcs {
            *refs.entry(b).or_default() += 1;
        }
        let mut holds = HashMap::new();
        for seq in self.requests.values() {
            let id = seq.request_id;
            for (i, &b) in seq.block_table.iter().enumerate() {
                if b.is_null() != (i < seq.num_released_blocks) {
                    return Err(format!(
                        "request {id}: entry {i} is {b} but {} entries are released",
                        seq.num_released_blocks
                    ));
                }
                if !b.is_null() {
                    *refs.entry(b).or_default() += 1;
                }
            }
            // Every block the next step may read is held.
            let first_kept = match kv.window {
                Some(w) => first_read_position(seq.num_computed_tokens, w) / self.config.block_size,
                None => 0,
            };
            if seq.num_released_blocks > first_kept {
                return Err(format!(
                    "request {id}: {} blocks released but the window keeps blocks from {first_kept}",
                    seq.num_released_blocks
                ));
            }
            if seq.status == SequenceStatus::Running
                && seq.group_tables.len() + 1 != kv.num_groups()
            {
                return Err(format!("request {id}: not one block table per KV group"));
            }
            for (g, (t, w)) in seq.group_tables.iter().zip(&kv.group_windows).enumerate() {
                let g = g + 1;
                if t.blocks.len() != seq.block_table.len() {
                    return Err(format!(
                        "request {id}: group {g}'s table has another length"
                    ));
                }
                for (i, &b) in t.blocks.iter().enumerate() {
                    if b.is_null() != (i < t.num_released) {
                        return Err(format!(
                            "request {id}: group {g} entry {i} is {b} but {} are released",
                            t.num_released
                        ));
                    }
                    if !b.is_null() {
                        *refs.entry(b).or_default() += 1;
                    }
                }
                let first_kept = w.map_or(0, |w| {
                    first_read_position(seq.num_computed_tokens, w) / self.config.block_size
                });
                if t.num_released > first_kept {
                    return Err(format!(
                        "request {id}: group {g} released {} blocks but keeps from {first_kept}",
                        t.num_released
                    ));
                }
            }
            if seq.num_computed_tokens > seq.block_table.len() * self.config.block_size {
                return Err(format!("request {id}: computed tokens beyond its blocks"));
            }
            let released_any =
                seq.num_released_blocks > 0 || seq.group_tables.iter().any(|t| t.num_released > 0);
            if seq.radix_cursor.is_some() && (seq.radix_hold.is_some() || !released_any) {
                return Err(format!(
                    "request {id}: a radix cursor without released blocks"
                ));
            }
            if seq.status != SequenceStatus::Running
                && (!seq.block_table.is_empty()
                    || !seq.group_tables.is_empty()
                    || seq.radix_hold.is_some()
                    || seq.radix_cursor.is_some()
                    || seq.num_computed_tokens > 0)
            {
                return Err(format!("waiting or paused request {id} holds cache state"));
            }
            if let (Some(hold), Some(radix)) = (seq.radix_hold, &kv.radix) {
                if hold.node != NodeId::ROOT {
                    *holds.entry(hold.node).or_insert(0u32) += 1;
                }
                let tokens = radix
                    .node_tokens(hold.node)
                    .ok_or(format!("request {id}: hold on dead node"))?;
                if tokens[..] != seq.token_ids[..hold.num_tokens]
                    || hold.num_tokens > seq.num_computed_tokens
                {
                    return Err(format!(
                        "request {id}: radix hold is not its computed prefix"
                    ));
                }
            } else if seq.status == SequenceStatus::Running && kv.radix.is_some() && !released_any {
                return Err(format!("running request {id} without a radix hold"));
            }
        }
        if let Some(radix) = &kv.radix {
            if radix.own_locks() != holds {
                return Err(format!(
                    "radix locks {:?} != holds {holds:?}",
                    radix.own_locks()
                ));
            }
        }
        for i in 0..kv.pool.num_blocks() as u32 {
            let b = BlockId(i);
            let expected = refs.get(&b).copied().unwrap_or(0);
            if kv.pool.ref_count(b) != expected {
                return Err(format!(
                    "block {b}: ref count {} but {expected} holders",
                    kv.pool.ref_count(b)
                ));
            }
        }
        let running_ok = self.running.iter().all(|id| {
            self.requests
                .get(id)
                .is_some_and(|s| s.status == SequenceStatus::Running)
        });
        let waiting_ok = self.waiting.iter().all(|id| {
            self.requests
                .get(id)
                .is_some_and(|s| s.status == SequenceStatus::Waiting)
        });
        let num_paused = self
            .requests
            .values()
            .filter(|s| s.status == SequenceStatus::Paused)
            .count();
        if !running_ok
            || !waiting_ok
            || num_paused != self.num_paused
            || self.running.len() + self.waiting.len() + num_paused != self.requests.len()
        {
            return Err("running/waiting queues disagree with request states".into());
        }
        if self.running.len() > self.config.max_num_seqs {
            return Err("more running requests than max_num_seqs".into());
        }
        Ok(())
    }
}
