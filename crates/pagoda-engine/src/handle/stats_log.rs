//! The engine thread's periodic status line while it is busy, as vLLM prints:
//! requests running, waiting and paused, prompt and generation throughput over the
//! interval, KV cache usage and the prefix-cache hit rate over the interval.
//!
//! The window restarts when the engine goes from idle to busy, so an idle
//! spell never dilutes the throughput. Costs: one clock read per step; one
//! scheduler snapshot (O(running)) per line.

use super::EngineCounters;
use pagoda_core::SchedulerStats;
use std::time::{Duration, Instant};

/// What one status line says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StatusLine {
    pub running: usize,
    pub waiting: usize,
    pub paused: usize,
    pub prompt_tokens_per_s: f64,
    pub generation_tokens_per_s: f64,
    /// Percent of KV blocks in use.
    pub kv_usage_percent: f64,
    /// Percent of prompt tokens looked up in the interval found cached.
    pub prefix_hit_percent: f64,
}

/// Counters at the start of the current window.
pub(crate) struct StatsLog {
    interval: Option<Duration>,
    start: Instant,
    counters: EngineCounters,
    queried: u64,
    hits: u64,
}

impl StatsLog {
    pub fn new(interval: Option<Duration>) -> Self {
        StatsLog {
            interval: interval.filter(|d| !d.is_zero()),
            start: Instant::now(),
            counters: EngineCounters::default(),
            queried: 0,
            hits: 0,
        }
    }

    /// Starts a new window now (the engine just became busy).
    pub fn restart(&mut self, counters: &EngineCounters, sched: &SchedulerStats) {
        self.start = Instant::now();
        self.counters = *counters;
        self.queried = sched.counters.prefix_cache_queried_tokens;
        self.hits = sched.counters.prefix_cache_hit_tokens;
    }

    /// Whether a line is due.
    pub fn due(&self) -> bool {
        self.interval.is_some_and(|i| self.start.elapsed() >= i)
    }

    /// The line for the window ending now; starts the next window.
    pub fn take(&mut self, counters: &EngineCounters, sched: &SchedulerStats) -> StatusLine {
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        let line = status_line(
            secs,
            (&self.counters, self.queried, self.hits),
            counters,
            sched,
        );
        self.restart(counters, sched);
        line
    }
}

/// The status over `secs` seconds from `before` (counters, prefix-cache
/// queried and hit tokens) to `now`.
pub(crate) fn status_line(
    secs: f64,
    before: (&EngineCounters, u64, u64),
    now: &EngineCounters,
    sched: &SchedulerStats,
) -> StatusLine {
    let (prev, queried, hits) = before;
    let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
    let queried = sched
        .counters
        .prefix_cache_queried_tokens
        .saturating_sub(queried);
    let hits = sched.counters.prefix_cache_hit_tokens.saturating_sub(hits);
    let percent = |part: f64, whole: f64| {
        if whole > 0.0 {
            100.0 * part / whole
        } else {
            0.0
        }
    };
    StatusLine {
        running: sched.num_running,
        waiting: sched.num_waiting,
        paused: sched.num_paused,
        prompt_tokens_per_s: rate(now.prompt_tokens, prev.prompt_tokens),
        generation_tokens_per_s: rate(now.generation_tokens, prev.generation_tokens),
        kv_usage_percent: percent(sched.num_blocks_used as f64, sched.num_blocks_total as f64),
        prefix_hit_percent: percent(hits as f64, queried as f64),
    }
}

impl StatusLine {
    pub fn log(&self) {
        let round = |x: f64| (x * 10.0).round() / 10.0;
        tracing::info!(
            target: "pagoda_engine::stats",
            running = self.running,
            waiting = self.waiting,
            paused = self.paused,
            prompt_tokens_per_s = round(self.prompt_tokens_per_s),
            generation_tokens_per_s = round(self.generation_tokens_per_s),
            kv_usage_percent = round(self.kv_usage_percent),
            prefix_hit_percent = round(self.prefix_hit_percent),
            "engine"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_percentages_cover_the_window_only() {
        let before = EngineCounters {
            prompt_tokens: 1000,
            generation_tokens: 500,
            ..Default::default()
        };
        let now = EngineCounters {
            prompt_tokens: 3000,
            generation_tokens: 1500,
            ..Default::default()
        };
        let mut sched = SchedulerStats {
            num_running: 7,
            num_waiting: 2,
            num_paused: 3,
            num_blocks_total: 200,
            num_blocks_used: 50,
            ..Default::default()
        };
        sched.counters.prefix_cache_queried_tokens = 3000;
        sched.counters.prefix_cache_hit_tokens = 1100;
        // In the window: 2000 queried, 1000 hit.
        let line = status_line(10.0, (&before, 1000, 100), &now, &sched);
        assert_eq!(line.running, 7);
        assert_eq!(line.waiting, 2);
        assert_eq!(line.paused, 3);
        assert_eq!(line.prompt_tokens_per_s, 200.0);
        assert_eq!(line.generation_tokens_per_s, 100.0);
        assert_eq!(line.kv_usage_percent, 25.0);
        assert_eq!(line.prefix_hit_percent, 50.0);
        let empty = status_line(1.0, (&now, 3000, 1100), &now, &SchedulerStats::default());
        assert_eq!(empty.prefix_hit_percent, 0.0);
        assert_eq!(empty.kv_usage_percent, 0.0);
    }

    #[test]
    fn no_interval_means_never_due() {
        assert!(!StatsLog::new(None).due());
        assert!(!StatsLog::new(Some(Duration::ZERO)).due());
        assert!(StatsLog::new(Some(Duration::from_nanos(1))).due());
    }
}
