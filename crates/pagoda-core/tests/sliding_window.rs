//! Sliding-window block release, step by step: a long generation holds a
//! bounded number of blocks (one window plus a chunk, far less than its
//! context), a request longer than the whole cache runs, released blocks the
//! radix tree shares stay cached and a later prefix hit gets the window's
//! blocks back, and everything returns to the pool at the end.

use pagoda_core::kv_cache_manager::{first_read_position, max_blocks_in_window};
use pagoda_core::{
    CoreError, Request, RequestId, SamplingParams, Scheduler, SchedulerConfig, SchedulerOutput,
};

fn request(id: u64, prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request {
        id: RequestId(id),
        prompt_token_ids: prompt,
        sampling: SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(max_tokens)
        },
        eos_token_ids: vec![2],
    }
}

/// Runs steps until nothing is left, checking after each that every running
/// sequence holds at most `bound` blocks and every block its next step reads;
/// returns the most blocks the pool had in use.
fn drain(sched: &mut Scheduler, window: usize, bound: usize) -> usize {
    let bs = sched.config().block_size;
    let mut peak = 0;
    let mut steps = 0;
    while sched.has_unfinished_requests() {
        let out: SchedulerOutput = sched.schedule().unwrap();
        for s in &out.scheduled {
            let held = s.block_table.iter().filter(|b| !b.is_null()).count();
            assert!(held <= bound, "holds {held} > {bound} blocks");
            let first = first_read_position(s.context_len(), window);
            for (i, b) in s.block_table.iter().enumerate() {
                assert_eq!(b.is_null(), (i + 1) * bs <= first, "entry {i}");
            }
        }
        peak = peak.max(sched.stats().num_blocks_used);
        let sampled: Vec<_> = out
            .scheduled
            .iter()
            .filter(|s| s.needs_logits)
            .map(|s| (s.request_id, 7))
            .collect();
        sched.update_from_output(&out, &sampled).unwrap();
        sched.check_invariants().unwrap();
        steps += 1;
        assert!(steps < 10_000);
    }
    peak
}

fn config(num_blocks: usize, caching: bool) -> SchedulerConfig {
    SchedulerConfig {
        block_size: 4,
        num_blocks,
        max_num_batched_tokens: 32,
        max_num_seqs: 4,
        max_model_len: 4096,
        enable_prefix_caching: caching,
    }
}

#[test]
fn a_long_generation_holds_one_window_of_blocks() {
    let window = 16;
    let bound = max_blocks_in_window(window, 32, 4);
    assert_eq!(bound, (16 + 64 + 32 + 1usize).div_ceil(4));
    for caching in [false, true] {
        // 300 prompt + 700 output tokens = 250 blocks at full attention.
        let num_blocks = bound + 2;
        let mut sched =
            Scheduler::with_sliding_window(config(num_blocks, caching), Some(16)).unwrap();
        sched
            .add_request(request(0, (0..300).map(|i| 10 + i % 50).collect(), 700))
            .unwrap();
        let peak = drain(&mut sched, window, bound);
        assert!(peak <= num_blocks);
        sched.flush_prefix_cache().unwrap();
        let stats = sched.stats();
        assert_eq!(stats.num_blocks_free, stats.num_blocks_total, "no leak");
    }
    // Without the window the same request is refused.
    let mut full = Scheduler::new(config(bound + 2, false)).unwrap();
    assert!(matches!(
        full.add_request(request(0, vec![5; 300], 700)),
        Err(CoreError::ExceedsKvCache { .. })
    ));
}

#[test]
fn a_prefix_hit_after_release_gets_the_window_back() {
    let window = 16;
    let bound = max_blocks_in_window(window, 32, 4);
    let mut sched = Scheduler::with_sliding_window(config(400, true), Some(window)).unwrap();
    let prompt: Vec<u32> = (0..200).map(|i| 10 + i % 37).collect();
    sched.add_request(request(0, prompt.clone(), 4)).unwrap();
    drain(&mut sched, window, bound);
    // The tree kept the whole prompt (its blocks were cached as they filled,
    // before the window passed them).
    assert!(sched.stats().radix_cached_tokens >= 200);
    let mut longer = prompt.clone();
    longer.extend([3, 3, 3]);
    sched.add_request(request(1, longer, 4)).unwrap();
    let out = sched.schedule().unwrap();
    let s = &out.scheduled[0];
    assert!(s.num_cached_tokens >= 196, "hit {}", s.num_cached_tokens);
    let first = first_read_position(s.context_len(), window);
    for (i, b) in s.block_table.iter().enumerate() {
        assert_eq!(b.is_null(), (i + 1) * 4 <= first, "entry {i}");
        if !b.is_null() {
            assert!(sched.block_ref_count(*b) > 0);
        }
    }
    sched.check_invariants().unwrap();
    let sampled = vec![(s.request_id, 7)];
    sched.update_from_output(&out, &sampled).unwrap();
    drain(&mut sched, window, bound);
    sched.flush_prefix_cache().unwrap();
    let stats = sched.stats();
    assert_eq!(stats.num_blocks_free, stats.num_blocks_total);
}

#[test]
fn a_zero_window_is_refused() {
    assert!(Scheduler::with_sliding_window(config(8, false), Some(0)).is_err());
}
