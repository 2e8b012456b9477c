//! Scheduler statistics, computed on demand.
//!
//! Gauges (running, waiting, paused, blocks, cached tokens, fragmentation) are read
//! from the current state in O(running); counters (prefix-cache hits,
//! preemptions, pauses) accumulate in [`StatCounters`] at O(1) per event.

/// Counters since the scheduler was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatCounters {
    /// Tokens looked up in the prefix cache at admissions (prompt tokens, plus
    /// generated ones for a preempted request coming back).
    pub prefix_cache_queried_tokens: u64,
    /// Of those, tokens found in the cache.
    pub prefix_cache_hit_tokens: u64,
    pub num_preemptions: u64,
    /// Requests paused by their client (see `Scheduler::pause`).
    pub num_pauses: u64,
    pub num_finished: u64,
    pub num_aborted: u64,
}

/// A snapshot of the scheduler.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SchedulerStats {
    pub num_running: usize,
    /// Requests in the waiting queue (paused ones not included).
    pub num_waiting: usize,
    /// Requests paused by their client: neither running nor queued.
    pub num_paused: usize,
    pub num_blocks_total: usize,
    pub num_blocks_used: usize,
    pub num_blocks_free: usize,
    /// Tokens held by the radix tree (0 with prefix caching off).
    pub radix_cached_tokens: usize,
    /// Unused slots in the running sequences' blocks (allocated slots minus
    /// tokens in the cache).
    pub internal_fragmentation_slots: usize,
    pub counters: StatCounters,
}

impl SchedulerStats {
    /// Fraction of looked-up tokens found in the prefix cache (0 if none).
    pub fn prefix_cache_hit_rate(&self) -> f64 {
        let c = &self.counters;
        if c.prefix_cache_queried_tokens == 0 {
            return 0.0;
        }
        c.prefix_cache_hit_tokens as f64 / c.prefix_cache_queried_tokens as f64
    }

    /// Fraction of used blocks' slots that hold no token.
    pub fn fragmentation(&self, block_size: usize) -> f64 {
        let slots = self.num_blocks_used * block_size;
        if slots == 0 {
            return 0.0;
        }
        self.internal_fragmentation_slots as f64 / slots as f64
    }
}
