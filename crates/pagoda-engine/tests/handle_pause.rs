//! Streams nobody reads, on the threaded engine (tiny Qwen3 golden model,
//! dummy weights): the request is paused once `pause_backlog` outputs wait
//! unread (no more tokens computed, no steps run while nothing else is
//! there, its KV blocks given back), reading resumes it, and its output is
//! still the offline greedy output; a drain shutdown resumes it to its end.

mod common;

use common::tiny::*;
use common::{scheduler_config, BLOCK_SIZE};
use pagoda_engine::{
    EngineHandle, EngineStats, FinishReason, GenerateRequest, HandleOptions, RequestOutput,
    RequestStream, SchedulerConfig, ShutdownMode,
};
use std::time::{Duration, Instant};

/// Unread outputs that pause a request in these tests.
const PAUSE_AT: usize = 8;

fn spawn(enable_prefix_caching: bool) -> EngineHandle {
    let config = SchedulerConfig {
        enable_prefix_caching,
        ..scheduler_config(64, MAX_MODEL_LEN)
    };
    let options = HandleOptions {
        pause_backlog: Some(PAUSE_AT),
        ..HandleOptions::default()
    };
    EngineHandle::spawn_with(engine_with(config), options).unwrap()
}

/// The greedy tokens of `prompt`, never stopping on EOS, run offline.
fn offline_long(prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let req = GenerateRequest {
        prompt_token_ids: prompt.to_vec(),
        params: long(max_tokens),
    };
    let mut out = engine(128).generate(vec![req], &mut |_| {}).unwrap();
    out.remove(0).token_ids
}

/// Polls the stats until `done` holds (at most a minute).
fn wait_for(handle: &EngineHandle, done: impl Fn(&EngineStats) -> bool) -> EngineStats {
    let start = Instant::now();
    loop {
        let stats = handle.blocking_stats().unwrap();
        if done(&stats) {
            return stats;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{stats:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn tokens(outs: &[RequestOutput]) -> Vec<u32> {
    outs.iter().map(|o| o.token_id).collect()
}

/// Submits an unread request and waits until it is paused; checks that it
/// then costs nothing: no tokens, no steps, no running or waiting request.
fn paused_request(handle: &EngineHandle, prompt: &[u32], max_tokens: usize) -> RequestStream {
    let s = handle
        .blocking_submit(request(prompt.to_vec(), long(max_tokens)))
        .unwrap();
    let stats = wait_for(handle, |s| s.num_paused == 1);
    let sched = stats.scheduler;
    assert_eq!(sched.num_paused, 1);
    assert_eq!((sched.num_running, sched.num_waiting), (0, 0));
    assert_eq!(sched.counters.num_pauses, 1);
    // Paused as the output that made the backlog reach the mark was sent.
    assert_eq!(stats.counters.generation_tokens, PAUSE_AT as u64);
    std::thread::sleep(Duration::from_millis(300));
    let later = handle.blocking_stats().unwrap();
    assert_eq!(
        later.counters.generation_tokens, stats.counters.generation_tokens,
        "no tokens computed while paused"
    );
    assert_eq!(
        later.counters.num_steps, stats.counters.num_steps,
        "an engine with only paused requests runs no steps"
    );
    s
}

/// Reads `stream` to its end and checks it against the offline tokens.
fn read_to_end(stream: &mut RequestStream, want: &[u32]) {
    let outs = drain_blocking(stream);
    assert_eq!(tokens(&outs), want, "streamed tokens");
    assert_eq!(
        outs.last().unwrap().finish_reason,
        Some(FinishReason::Length)
    );
    for (k, o) in outs.iter().enumerate() {
        assert_eq!(o.num_output_tokens, k + 1);
    }
}

#[test]
fn an_unread_stream_is_paused_frees_its_blocks_and_resumes_when_read() {
    let prompt = prompts()[2].clone();
    let max_tokens = 60;
    let want = offline_long(&prompt, max_tokens);
    let handle = spawn(false);
    let mut s = paused_request(&handle, &prompt, max_tokens);
    let sched = handle.blocking_stats().unwrap().scheduler;
    assert_eq!(
        sched.num_blocks_used, 0,
        "every block given back: {sched:?}"
    );
    assert_eq!(sched.counters.num_preemptions, 0, "not memory pressure");

    // Another request runs meanwhile, to its end.
    let other = prompts()[0].clone();
    let mut o = handle
        .blocking_submit(request(other.clone(), long(20)))
        .unwrap();
    read_to_end(&mut o, &offline_long(&other, 20));

    // Reading resumes it (recomputed from scratch); the output is as if it
    // had never paused.
    read_to_end(&mut s, &want);
    let stats = handle.blocking_stats().unwrap();
    assert_eq!(stats.num_paused, 0);
    assert_eq!(stats.scheduler.num_paused, 0);
    assert_eq!(stats.scheduler.num_blocks_used, 0);
    assert_eq!(stats.counters.generation_tokens, (max_tokens + 20) as u64);
    handle.blocking_shutdown(ShutdownMode::Drain).unwrap();
}

#[test]
fn a_paused_request_keeps_its_prefix_cached_and_reuses_it() {
    let prompt = prompts()[4].clone();
    let max_tokens = 50;
    let want = offline_long(&prompt, max_tokens);
    let handle = spawn(true);
    let mut s = paused_request(&handle, &prompt, max_tokens);
    let sched = handle.blocking_stats().unwrap().scheduler;
    // Only the radix cache holds blocks: the computed prompt and outputs.
    assert!(sched.radix_cached_tokens >= prompt.len() + PAUSE_AT - 1);
    assert_eq!(
        sched.num_blocks_used,
        sched.radix_cached_tokens.div_ceil(BLOCK_SIZE),
        "{sched:?}"
    );
    let hit_before = sched.counters.prefix_cache_hit_tokens;
    read_to_end(&mut s, &want);
    let sched = handle.blocking_stats().unwrap().scheduler;
    assert!(
        sched.counters.prefix_cache_hit_tokens >= hit_before + (prompt.len() + PAUSE_AT - 1) as u64,
        "resumed from its cached prefix: {sched:?}"
    );
    handle.blocking_shutdown(ShutdownMode::Drain).unwrap();
}

#[test]
fn a_slow_reader_is_paused_and_resumed_many_times_and_loses_nothing() {
    let prompt = prompts()[1].clone();
    let max_tokens = 100;
    let want = offline_long(&prompt, max_tokens);
    let handle = spawn(true);
    let mut s = handle
        .blocking_submit(request(prompt, long(max_tokens)))
        .unwrap();
    let mut outs = Vec::new();
    while let Some(item) = s.blocking_next() {
        outs.push(item.unwrap());
        if outs.len() % PAUSE_AT == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
        let stats = handle.blocking_stats().unwrap();
        // Never more than the mark unread (and the one in hand).
        assert!(
            stats.counters.generation_tokens <= (outs.len() + PAUSE_AT) as u64,
            "{} read, {stats:?}",
            outs.len()
        );
    }
    assert_eq!(tokens(&outs), want);
    let stats = handle.blocking_stats().unwrap();
    assert!(stats.scheduler.counters.num_pauses >= 2, "{stats:?}");
    assert_eq!(stats.num_paused, 0);
    handle.blocking_shutdown(ShutdownMode::Drain).unwrap();
}

#[test]
fn dropping_a_paused_stream_aborts_it() {
    let handle = spawn(false);
    let s = paused_request(&handle, &prompts()[3], 80);
    drop(s);
    let stats = wait_for(&handle, |s| s.num_in_flight == 0);
    assert_eq!(stats.num_paused, 0);
    assert_eq!(stats.counters.num_aborted, 1);
    let sched = stats.scheduler;
    assert_eq!(
        (sched.num_running, sched.num_waiting, sched.num_paused),
        (0, 0, 0)
    );
    assert_eq!(sched.num_blocks_used, 0);
    handle.blocking_shutdown(ShutdownMode::Drain).unwrap();
}

#[test]
fn a_drain_shutdown_runs_paused_requests_to_their_end() {
    let prompt = prompts()[0].clone();
    let max_tokens = 40;
    let want = offline_long(&prompt, max_tokens);
    let handle = spawn(true);
    let mut s = paused_request(&handle, &prompt, max_tokens);
    handle.blocking_shutdown(ShutdownMode::Drain).unwrap();
    read_to_end(&mut s, &want);
}

#[test]
fn no_pause_backlog_never_pauses() {
    let options = HandleOptions {
        pause_backlog: None,
        ..HandleOptions::default()
    };
    let handle = EngineHandle::spawn_with(engine(64), options).unwrap();
    let mut s = handle
        .blocking_submit(request(prompts()[0].clone(), long(50)))
        .unwrap();
    let stats = wait_for(&handle, |s| s.num_in_flight == 0);
    assert_eq!(stats.scheduler.counters.num_pauses, 0);
    assert_eq!(stats.counters.generation_tokens, 50);
    assert_eq!(drain_blocking(&mut s).len(), 50);
    handle.blocking_shutdown(ShutdownMode::Drain).unwrap();
}
