//! Property tests of the scheduler with small pools (so preemption and
//! eviction happen all the time), driven by random adds, steps, aborts,
//! finishes, pauses and resumes, with and without a sliding window (whose
//! passed blocks the scheduler releases). A fake model runner keeps a simulated KV cache whose slots record
//! which prefix they were computed for, so every reuse (shared blocks, block
//! copies, recompute) is checked against the test's own record of each
//! request's tokens. Paused requests must never be scheduled, hold no
//! blocks, and finish like the others once resumed. With KV cache groups
//! (a mix of full and windowed groups over one pool), every group's table is
//! checked the same way against its own window, each group's pages tagged
//! with their group (so a page of another group is caught), with and
//! without prefix caching. Free pages lose their simulated content before
//! every step, so a hit on a page that went back to the pool is caught.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use pagoda_core::kv_cache_manager::{first_read_position, max_blocks_in_window, KV_READ_TILE};
use pagoda_core::{
    BlockId, CoreError, FinishReason, Request, RequestId, SamplingParams, Scheduler,
    SchedulerConfig, SchedulerOutput,
};
use proptest::prelude::*;

const EOS: u32 = 99;

#[derive(Debug, Clone)]
enum Op {
    Add {
        prompt: Vec<u32>,
        max_tokens: usize,
        ignore_eos: bool,
    },
    Step {
        seed: u64,
        eos_percent: u64,
    },
    Abort(usize),
    Finish(usize),
    Pause(usize),
    Resume(usize),
}

fn op() -> impl Strategy<Value = Op> {
    op_with(4, 28, 16)
}

/// Ops whose prompts draw from `vocab` ids, up to `max_prompt` long.
fn op_with(vocab: u32, max_prompt: usize, max_out: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (prop::collection::vec(0u32..vocab, 1..max_prompt), 1usize..max_out, any::<bool>())
            .prop_map(|(prompt, max_tokens, ignore_eos)| Op::Add { prompt, max_tokens, ignore_eos }),
        6 => (any::<u64>(), 0u64..30).prop_map(|(seed, eos_percent)| Op::Step { seed, eos_percent }),
        1 => any::<usize>().prop_map(Op::Abort),
        1 => any::<usize>().prop_map(Op::Finish),
        2 => any::<usize>().prop_map(Op::Pause),
        2 => any::<usize>().prop_map(Op::Resume),
    ]
}

fn config() -> impl Strategy<Value = SchedulerConfig> {
    (
        1usize..9,
        2usize..24,
        1usize..64,
        1usize..6,
        8usize..64,
        any::<bool>(),
    )
        .prop_map(
            |(block_size, num_blocks, budget, max_num_seqs, max_model_len, caching)| {
                SchedulerConfig {
                    block_size,
                    num_blocks,
                    max_num_batched_tokens: budget,
                    max_num_seqs,
                    max_model_len,
                    enable_prefix_caching: caching,
                }
            },
        )
}

/// Longer sequences than the cache of a full-attention request could hold
/// (a window keeps only `KV_READ_TILE`-aligned windows of blocks).
fn windowed_config() -> impl Strategy<Value = (SchedulerConfig, usize)> {
    (
        1usize..9,
        1usize..64,
        1usize..5,
        80usize..240,
        any::<bool>(),
        1usize..40,
        0usize..24,
    )
        .prop_map(
            |(block_size, budget, max_num_seqs, max_model_len, caching, window, spare)| {
                let num_blocks =
                    max_blocks_in_window(window, budget, block_size) + spare * (1 + 8 / block_size);
                let cfg = SchedulerConfig {
                    block_size,
                    num_blocks,
                    max_num_batched_tokens: budget,
                    max_num_seqs,
                    max_model_len,
                    enable_prefix_caching: caching,
                };
                (cfg, window)
            },
        )
}

fn kv_of(prefix: &[u32]) -> u64 {
    prefix.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| {
        (h ^ (t as u64 + 1)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The simulated K/V of `prefix`'s last position in KV cache group `g`.
fn group_kv_of(g: usize, prefix: &[u32]) -> u64 {
    kv_of(prefix) ^ (g as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The test's own record of a live request.
struct Live {
    tokens: Vec<u32>,
    prompt_len: usize,
    max_tokens: usize,
    ignore_eos: bool,
}

struct Harness {
    cfg: SchedulerConfig,
    /// Every KV cache group's window, group 0 first.
    windows: Vec<Option<usize>>,
    sched: Scheduler,
    live: BTreeMap<RequestId, Live>,
    /// Live requests paused now.
    paused: BTreeSet<RequestId>,
    kv: Vec<Option<u64>>,
    next_id: u64,
    rng: u64,
}

impl Harness {
    fn rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn add(&mut self, prompt: Vec<u32>, max_tokens: usize, ignore_eos: bool) {
        let id = RequestId(self.next_id);
        self.next_id += 1;
        let req = Request {
            id,
            prompt_token_ids: prompt.clone(),
            sampling: SamplingParams {
                max_tokens,
                ignore_eos,
                ..SamplingParams::greedy(max_tokens)
            },
            eos_token_ids: vec![EOS],
        };
        let final_len =
            (prompt.len() + max_tokens).min(self.cfg.max_model_len.max(prompt.len() + 1));
        let all = (final_len - 1).div_ceil(self.cfg.block_size);
        let needed: usize = self
            .windows
            .iter()
            .map(|w| match w {
                // Positions from an aligned window start to the end of a chunk.
                Some(w) => {
                    let span = w + KV_READ_TILE - 1 + self.cfg.max_num_batched_tokens - 1;
                    all.min((span + self.cfg.block_size - 1).div_ceil(self.cfg.block_size))
                }
                None => all,
            })
            .sum();
        match self.sched.add_request(req) {
            Ok(()) => {
                assert!(prompt.len() <= self.cfg.max_model_len && needed <= self.cfg.num_blocks);
                let live = Live {
                    prompt_len: prompt.len(),
                    tokens: prompt,
                    max_tokens,
                    ignore_eos,
                };
                self.live.insert(id, live);
            }
            Err(CoreError::PromptTooLong { .. }) => assert!(prompt.len() > self.cfg.max_model_len),
            Err(CoreError::ExceedsKvCache { needed: n, .. }) => {
                assert!(prompt.len() <= self.cfg.max_model_len);
                assert_eq!(n, needed);
                assert!(needed > self.cfg.num_blocks);
            }
            Err(e) => panic!("unexpected refusal {e}"),
        }
    }

    /// Checks the plan, runs it on the simulated KV cache, samples, updates.
    fn step(&mut self, eos_percent: u64) -> SchedulerOutput {
        let bs = self.cfg.block_size;
        // A free page's content is gone (the next holder overwrites it).
        for b in 0..self.cfg.num_blocks {
            if self.sched.block_ref_count(BlockId(b as u32)) == 0 {
                self.kv[b * bs..(b + 1) * bs].fill(None);
            }
        }
        let out = self.sched.schedule().unwrap();
        assert!(
            out.num_scheduled_tokens() <= self.cfg.max_num_batched_tokens,
            "token budget"
        );
        assert!(out.scheduled.len() <= self.cfg.max_num_seqs, "max_num_seqs");
        assert_eq!(
            out.scheduled.iter().map(|s| s.query_len()).sum::<usize>(),
            out.num_scheduled_tokens()
        );
        let mut ids: Vec<_> = out.scheduled.iter().map(|s| s.request_id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(
            ids.len(),
            out.scheduled.len(),
            "a request at most once per step"
        );
        for c in &out.block_copies {
            assert!(c.src != c.dst && c.num_tokens > 0 && c.num_tokens < bs);
            assert!(out
                .scheduled
                .iter()
                .any(|s| s.block_table.get(s.context_len() / bs) == Some(&c.dst)));
            for off in 0..c.num_tokens {
                self.kv[c.dst.index() * bs + off] = self.kv[c.src.index() * bs + off];
            }
        }
        let slot = |table: &[BlockId], p: usize| table[p / bs].index() * bs + p % bs;
        for s in &out.scheduled {
            assert!(
                !self.paused.contains(&s.request_id),
                "a paused request is never scheduled"
            );
            let live = &self.live[&s.request_id];
            assert!(s.query_len() > 0 && s.block_table.len() * bs >= s.seq_len());
            assert_eq!(
                s.token_ids[..],
                live.tokens[s.context_len()..s.seq_len()],
                "tokens to compute"
            );
            assert_eq!(s.needs_logits, s.seq_len() == live.tokens.len());
            assert_eq!(
                s.group_tables.len() + 1,
                self.windows.len(),
                "one table per group"
            );
            let tables = std::iter::once(&s.block_table).chain(&s.group_tables);
            for (g, (table, &window)) in tables.zip(&self.windows).enumerate() {
                assert_eq!(table.len(), s.block_table.len(), "tables of one length");
                // Every position the attention kernels read is present and
                // right; only blocks wholly before it are released.
                let first = window.map_or(0, |w| first_read_position(s.context_len(), w));
                for (i, b) in table.iter().enumerate() {
                    let needed = (i + 1) * bs > first;
                    assert!(
                        needed != b.is_null(),
                        "block {i} of {table:?} (first read {first})"
                    );
                    if needed {
                        assert!(
                            self.sched.block_ref_count(*b) > 0,
                            "a held block is allocated"
                        );
                    }
                }
                if let Some(w) = window {
                    let held = table.iter().filter(|b| !b.is_null()).count();
                    assert!(
                        held <= max_blocks_in_window(w, self.cfg.max_num_batched_tokens, bs),
                        "holds {held} blocks under window {w}"
                    );
                }
                for p in first..s.context_len() {
                    assert_eq!(
                        self.kv[slot(table, p)],
                        Some(group_kv_of(g, &live.tokens[..=p])),
                        "cached K/V at {p} in group {g}"
                    );
                }
                for p in s.positions() {
                    let b = table[p / bs];
                    assert_eq!(
                        self.sched.block_ref_count(b),
                        1,
                        "writes only into unshared blocks"
                    );
                    self.kv[slot(table, p)] = Some(group_kv_of(g, &live.tokens[..=p]));
                }
            }
        }
        let mut sampled = Vec::new();
        for s in out.scheduled.iter().filter(|s| s.needs_logits) {
            let t = if self.rand() % 100 < eos_percent {
                EOS
            } else {
                (self.rand() % 4) as u32
            };
            sampled.push((s.request_id, t));
        }
        let updates = self.sched.update_from_output(&out, &sampled).unwrap();
        assert_eq!(updates.len(), sampled.len());
        for (u, &(id, t)) in updates.iter().zip(&sampled) {
            assert_eq!((u.request_id, u.token_id), (id, t));
            let live = self.live.get_mut(&id).unwrap();
            live.tokens.push(t);
            let n_out = live.tokens.len() - live.prompt_len;
            let expected = if t == EOS && !live.ignore_eos {
                Some(FinishReason::Stop)
            } else if n_out >= live.max_tokens || live.tokens.len() >= self.cfg.max_model_len {
                Some(FinishReason::Length)
            } else {
                None
            };
            assert_eq!(u.finish_reason, expected, "stop checks");
            if expected.is_some() {
                self.live.remove(&id);
            }
        }
        out
    }

    fn nth_live(&self, i: usize) -> Option<RequestId> {
        (!self.live.is_empty()).then(|| *self.live.keys().nth(i % self.live.len()).unwrap())
    }

    /// Pauses live request `id` (again, if paused: a no-op).
    fn pause(&mut self, id: RequestId) {
        let used = self.sched.stats().num_blocks_used;
        let seq = self.sched.sequence(id).unwrap();
        let held = std::iter::once(&seq.block_table)
            .chain(seq.group_tables.iter().map(|t| &t.blocks))
            .flatten()
            .filter(|b| !b.is_null())
            .count();
        self.sched.pause(id).unwrap();
        self.paused.insert(id);
        assert!(self.sched.is_paused(id));
        let seq = self.sched.sequence(id).unwrap();
        assert!(seq.block_table.is_empty() && seq.num_computed_tokens == 0);
        assert_eq!(
            seq.token_ids, self.live[&id].tokens,
            "a paused request keeps its tokens"
        );
        // Its blocks went back, or to the radix cache where caching is on.
        if !self.cfg.enable_prefix_caching {
            assert_eq!(self.sched.stats().num_blocks_used, used - held);
        }
    }

    fn resume(&mut self, id: RequestId) {
        self.sched.resume(id).unwrap();
        self.paused.remove(&id);
        assert!(!self.sched.is_paused(id));
    }

    fn check(&self) {
        self.sched.check_invariants().unwrap();
        let stats = self.sched.stats();
        assert_eq!(stats.num_paused, self.paused.len());
        assert_eq!(
            stats.num_running + stats.num_waiting + stats.num_paused,
            self.live.len()
        );
        assert_eq!(
            self.sched.has_schedulable_requests(),
            self.live.len() > self.paused.len()
        );
        assert!(stats.num_running <= self.cfg.max_num_seqs);
        assert_eq!(
            stats.num_blocks_used + stats.num_blocks_free,
            self.cfg.num_blocks
        );
    }
}

/// Runs `ops`, checking everything after each, then drains the queue and
/// checks that no block leaked.
fn run_ops(cfg: SchedulerConfig, windows: &[Option<usize>], seed: u64, ops: Vec<Op>) {
    let mut h = Harness {
        sched: Scheduler::with_kv_groups(cfg.clone(), windows).unwrap(),
        windows: windows.to_vec(),
        kv: vec![None; cfg.num_blocks * cfg.block_size],
        cfg,
        live: BTreeMap::new(),
        paused: BTreeSet::new(),
        next_id: 0,
        rng: seed | 1,
    };
    for op in ops {
        match op {
            Op::Add {
                prompt,
                max_tokens,
                ignore_eos,
            } => h.add(prompt, max_tokens, ignore_eos),
            Op::Step { seed, eos_percent } => {
                h.rng ^= seed | 1;
                h.step(eos_percent);
            }
            Op::Abort(i) => {
                if let Some(id) = h.nth_live(i) {
                    h.sched.abort(id).unwrap();
                    h.live.remove(&id);
                    h.paused.remove(&id);
                }
                assert_eq!(
                    h.sched.abort(RequestId(u64::MAX)),
                    Err(CoreError::UnknownRequest(RequestId(u64::MAX)))
                );
            }
            Op::Finish(i) => {
                if let Some(id) = h.nth_live(i) {
                    h.sched.finish(id, FinishReason::Stop).unwrap();
                    h.live.remove(&id);
                    h.paused.remove(&id);
                }
            }
            Op::Pause(i) => {
                if let Some(id) = h.nth_live(i) {
                    h.pause(id);
                }
                assert_eq!(
                    h.sched.pause(RequestId(u64::MAX)),
                    Err(CoreError::UnknownRequest(RequestId(u64::MAX)))
                );
            }
            Op::Resume(i) => {
                // A live request, paused or not (resuming a running or
                // waiting one does nothing).
                if let Some(id) = h.nth_live(i) {
                    h.resume(id);
                }
            }
        }
        h.check();
    }
    // No new arrivals: everything not paused finishes within a bounded
    // number of steps while the paused ones wait; then, resumed one by
    // one, they finish too. Each step with something to schedule does
    // some work.
    let bound = 10
        * h.live
            .values()
            .map(|l| l.max_tokens + l.tokens.len())
            .sum::<usize>()
        + 10;
    let mut steps = 0;
    let mut work: HashMap<RequestId, usize> = HashMap::new();
    while !h.live.is_empty() {
        if h.live.len() == h.paused.len() {
            let id = *h.paused.iter().next().unwrap();
            h.resume(id);
            h.check();
        }
        let out = h.step(0);
        assert!(
            !out.is_empty(),
            "a step with schedulable requests schedules something"
        );
        for s in &out.scheduled {
            *work.entry(s.request_id).or_default() += s.query_len();
        }
        h.check();
        steps += 1;
        assert!(steps <= bound, "did not drain in {} steps", bound);
    }
    assert!(!h.sched.has_unfinished_requests());
    h.sched.flush_prefix_cache().unwrap();
    let stats = h.sched.stats();
    assert_eq!(
        stats.num_blocks_free, stats.num_blocks_total,
        "no block leaks"
    );
    assert_eq!(stats.radix_cached_tokens, 0);
    h.check();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn scheduler_keeps_its_invariants_and_drains(cfg in config(), seed in any::<u64>(),
                                                 ops in prop::collection::vec(op(), 1..120)) {
        run_ops(cfg, &[None], seed, ops);
    }

    /// With a sliding window: long prompts and outputs (past the window and
    /// the aligned read tile), prefix hits over a small vocabulary.
    #[test]
    fn windowed_scheduler_releases_only_unread_blocks(
        (cfg, window) in windowed_config(),
        seed in any::<u64>(),
        ops in prop::collection::vec(op_with(2, 200, 120), 1..80),
    ) {
        run_ops(cfg, &[Some(window)], seed, ops);
    }

    /// KV cache groups over one pool: a full group and one to three
    /// windowed groups (Gemma's global and local layers), with and without
    /// prefix caching (hits over a small vocabulary, eviction under a
    /// small pool).
    #[test]
    fn grouped_scheduler_releases_only_unread_blocks_per_group(
        (cfg, window) in windowed_config(),
        groups in prop::collection::vec(prop::option::of(1usize..40), 1..4),
        seed in any::<u64>(),
        ops in prop::collection::vec(op_with(2, 200, 120), 1..80),
    ) {
        let mut windows = vec![None, Some(window)];
        windows.extend(groups);
        let cfg = SchedulerConfig {
            num_blocks: cfg.num_blocks * windows.len(),
            ..cfg
        };
        run_ops(cfg, &windows, seed, ops);
    }
}

/// A long generation under a full group and two windowed groups holds all
/// of its blocks in the full group and one window of them in each windowed
/// group; every page returns at the end.
#[test]
fn grouped_long_generation_holds_full_plus_one_window_per_local_group() {
    let (bs, window, budget) = (4, 16, 32);
    let cfg = SchedulerConfig {
        block_size: bs,
        num_blocks: 1000,
        max_num_batched_tokens: budget,
        max_num_seqs: 4,
        max_model_len: 4096,
        enable_prefix_caching: false,
    };
    let mut sched =
        Scheduler::with_kv_groups(cfg.clone(), &[None, Some(window), Some(window)]).unwrap();
    assert_eq!(sched.num_kv_groups(), 3);
    sched
        .add_request(Request {
            id: RequestId(0),
            prompt_token_ids: (0..300).map(|i| 10 + i % 50).collect(),
            sampling: SamplingParams {
                ignore_eos: true,
                ..SamplingParams::greedy(700)
            },
            eos_token_ids: vec![EOS],
        })
        .unwrap();
    let bound = max_blocks_in_window(window, budget, bs);
    let mut peak = 0;
    while sched.has_unfinished_requests() {
        let out = sched.schedule().unwrap();
        let s = &out.scheduled[0];
        assert_eq!(s.block_table.iter().filter(|b| b.is_null()).count(), 0);
        for t in &s.group_tables {
            assert!(t.iter().filter(|b| !b.is_null()).count() <= bound);
        }
        let used = sched.stats().num_blocks_used;
        assert!(used <= s.block_table.len() + 2 * bound, "{used} pages");
        peak = peak.max(used);
        let sampled: Vec<_> = out
            .scheduled
            .iter()
            .filter(|s| s.needs_logits)
            .map(|s| (s.request_id, 7))
            .collect();
        sched.update_from_output(&out, &sampled).unwrap();
        sched.check_invariants().unwrap();
    }
    // 1000 tokens: 250 blocks in the full group; far fewer than 3 x 250.
    assert!(peak <= 250 + 2 * bound, "peak {peak}");
    assert!(peak >= 250);
    assert_eq!(sched.stats().num_blocks_free, 1000);
}

/// Several groups take prefix caching; a zero window anywhere, or no
/// group, is refused.
#[test]
fn grouped_scheduler_takes_prefix_caching_and_refuses_empty_windows() {
    let cfg = SchedulerConfig {
        block_size: 4,
        num_blocks: 100,
        max_num_batched_tokens: 32,
        max_num_seqs: 4,
        max_model_len: 512,
        enable_prefix_caching: true,
    };
    assert!(Scheduler::with_kv_groups(cfg.clone(), &[None, Some(8)]).is_ok());
    assert!(Scheduler::with_kv_groups(cfg.clone(), &[None]).is_ok());
    assert!(Scheduler::with_kv_groups(cfg.clone(), &[None, Some(0)]).is_err());
    assert!(Scheduler::with_kv_groups(cfg, &[]).is_err());
}

/// A second request sharing a long prefix (past every window) with a
/// finished one starts from it: block-granular, every group's table
/// present from its window's first read on, and the hit ends where the
/// prompts part (cut to a block).
#[test]
fn grouped_prefix_hit_past_the_window() {
    let (bs, window) = (4, 16);
    let cfg = SchedulerConfig {
        block_size: bs,
        num_blocks: 400,
        max_num_batched_tokens: 64,
        max_num_seqs: 4,
        max_model_len: 1024,
        enable_prefix_caching: true,
    };
    let windows = [None, Some(window), Some(2 * window)];
    let mut sched = Scheduler::with_kv_groups(cfg, &windows).unwrap();
    let shared: Vec<u32> = (0..203).map(|i| 10 + i % 37).collect();
    let run = |sched: &mut Scheduler, id: u64, prompt: Vec<u32>| -> usize {
        sched
            .add_request(Request {
                id: RequestId(id),
                prompt_token_ids: prompt,
                sampling: SamplingParams {
                    ignore_eos: true,
                    ..SamplingParams::greedy(5)
                },
                eos_token_ids: vec![EOS],
            })
            .unwrap();
        let mut cached = None;
        while sched.has_unfinished_requests() {
            let out = sched.schedule().unwrap();
            assert!(out.block_copies.is_empty(), "no copies with groups");
            for s in &out.scheduled {
                cached.get_or_insert(s.context_len());
                let tables = std::iter::once(&s.block_table).chain(&s.group_tables);
                for (t, w) in tables.zip(windows) {
                    let first = w.map_or(0, |w| first_read_position(s.context_len(), w));
                    for (i, b) in t.iter().enumerate() {
                        assert_eq!(b.is_null(), (i + 1) * bs <= first, "block {i}");
                    }
                }
            }
            let sampled: Vec<_> = out
                .scheduled
                .iter()
                .filter(|s| s.needs_logits)
                .map(|s| (s.request_id, 7))
                .collect();
            sched.update_from_output(&out, &sampled).unwrap();
            sched.check_invariants().unwrap();
        }
        cached.unwrap()
    };
    assert_eq!(run(&mut sched, 0, shared.clone()), 0);
    let mut second = shared.clone();
    second.extend([1, 2, 3]);
    assert_eq!(run(&mut sched, 1, second), 200, "block-granular hit");
    sched.flush_prefix_cache().unwrap();
    assert_eq!(sched.stats().num_blocks_free, 400);
}
