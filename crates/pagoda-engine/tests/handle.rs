//! The threaded engine behind [`EngineHandle`], on the tiny Qwen3 golden model
//! with dummy weights: streamed greedy tokens against `LlmEngine::generate`
//! run offline, aborts by dropped streams and the blocks they free, admission
//! errors, the waiting-queue limit, and shutdown.

mod common;

use common::tiny::*;
use common::{scheduler_config, BLOCK_SIZE};
use pagoda_core::SamplingParams;
use pagoda_engine::{
    EngineError, EngineHandle, FinishReason, HandleOptions, RequestOutput, SchedulerConfig,
    ShutdownMode,
};

#[tokio::test(flavor = "current_thread")]
async fn concurrent_streams_equal_offline_generate() {
    let prompts = prompts();
    let max_tokens = [12usize, 7, 20, 3, 16];
    let want = offline(&prompts, &max_tokens);

    let handle = EngineHandle::spawn(engine(128)).unwrap();
    let mut streams = Vec::new();
    for (p, &m) in prompts.iter().zip(&max_tokens) {
        let s = handle
            .submit(request(p.clone(), SamplingParams::greedy(m)))
            .await
            .unwrap();
        streams.push(s);
    }
    let ids: Vec<_> = streams.iter().map(|s| s.request_id()).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), ids.len(), "distinct request ids");

    // Read the streams round-robin, as a server's tasks would.
    let mut got: Vec<Vec<RequestOutput>> = vec![Vec::new(); streams.len()];
    let mut open = streams.len();
    while open > 0 {
        for (s, outs) in streams.iter_mut().zip(&mut got) {
            if s.is_finished() {
                continue;
            }
            match s.next().await {
                Some(item) => {
                    let o = item.unwrap();
                    assert_eq!(o.request_id, s.request_id());
                    outs.push(o);
                }
                None => panic!("stream {} closed without a last output", s.request_id()),
            }
            if s.is_finished() {
                open -= 1;
            }
        }
    }
    check_against_offline(&got, &prompts, &want);

    let stats = handle.stats().await.unwrap();
    let c = stats.counters;
    let total: usize = got.iter().map(Vec::len).sum();
    assert_eq!(c.generation_tokens, total as u64);
    let prompt_total: usize = prompts.iter().map(Vec::len).sum();
    assert_eq!(c.prompt_tokens, prompt_total as u64);
    assert_eq!(c.num_requests_admitted, prompts.len() as u64);
    let by_reason = |r| want.iter().filter(|w| w.1 == r).count() as u64;
    assert_eq!(
        c.num_finished(FinishReason::Stop),
        by_reason(FinishReason::Stop)
    );
    assert_eq!(
        c.num_finished(FinishReason::Length),
        by_reason(FinishReason::Length)
    );
    assert!(c.num_steps >= *max_tokens.iter().max().unwrap() as u64);
    assert_eq!(
        (stats.scheduler.num_running, stats.scheduler.num_waiting),
        (0, 0)
    );
    assert_eq!(stats.num_in_flight, 0);
    handle.shutdown(ShutdownMode::Drain).await.unwrap();
}

#[test]
fn blocking_api_from_many_threads_equals_offline_generate() {
    let prompts = prompts();
    let max_tokens = [9usize, 14, 5, 11, 8];
    let want = offline(&prompts, &max_tokens);
    let handle = EngineHandle::spawn(engine(128)).unwrap();
    let got: Vec<Vec<RequestOutput>> = std::thread::scope(|scope| {
        let threads: Vec<_> = prompts
            .iter()
            .zip(&max_tokens)
            .map(|(p, &m)| {
                let handle = handle.clone();
                scope.spawn(move || {
                    let params = SamplingParams::greedy(m);
                    let mut s = handle.blocking_submit(request(p.clone(), params)).unwrap();
                    drain_blocking(&mut s)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    check_against_offline(&got, &prompts, &want);
    handle.blocking_shutdown(ShutdownMode::Drain).unwrap();
}

/// Drops a stream after a few outputs; the request must leave the scheduler
/// and its blocks must go back, except those the prefix cache keeps.
fn drop_mid_stream(enable_prefix_caching: bool) {
    let config = SchedulerConfig {
        enable_prefix_caching,
        ..scheduler_config(64, MAX_MODEL_LEN)
    };
    let handle = EngineHandle::spawn(engine_with(config)).unwrap();
    let prompt = prompts()[2].clone();
    let mut s = handle
        .blocking_submit(request(prompt.clone(), long(200)))
        .unwrap();
    for _ in 0..3 {
        let o = s.blocking_next().unwrap().unwrap();
        assert!(o.finish_reason.is_none());
    }
    drop(s);

    // The abort is queued before the stats request, so it is served first.
    let stats = handle.blocking_stats().unwrap();
    let sched = stats.scheduler;
    assert_eq!((sched.num_running, sched.num_waiting), (0, 0));
    assert_eq!(stats.num_in_flight, 0);
    assert_eq!(stats.counters.num_aborted, 1);
    assert_eq!(sched.counters.num_aborted, 1);
    if enable_prefix_caching {
        // One sequence's path: the tree holds ceil(tokens / block) blocks.
        assert!(sched.radix_cached_tokens >= prompt.len() + 2);
        assert_eq!(
            sched.num_blocks_used,
            sched.radix_cached_tokens.div_ceil(BLOCK_SIZE)
        );
    } else {
        assert_eq!(sched.num_blocks_used, 0);
    }
    assert_eq!(
        sched.num_blocks_free,
        sched.num_blocks_total - sched.num_blocks_used
    );

    // The engine goes on serving.
    let mut s = handle.blocking_submit(request(prompt, long(4))).unwrap();
    assert_eq!(drain_blocking(&mut s).len(), 4);
    handle.blocking_shutdown(ShutdownMode::Drain).unwrap();
}

#[test]
fn dropping_a_stream_aborts_and_frees_its_blocks() {
    drop_mid_stream(false);
}

#[test]
fn dropping_a_stream_leaves_only_the_prefix_cache_blocks() {
    drop_mid_stream(true);
}

#[test]
fn explicit_abort_closes_the_stream() {
    let handle = EngineHandle::spawn(engine(64)).unwrap();
    let mut s = handle
        .blocking_submit(request(prompts()[0].clone(), long(200)))
        .unwrap();
    assert!(s.blocking_next().unwrap().is_ok());
    handle.abort(s.request_id());
    let mut rest = 0;
    while let Some(item) = s.blocking_next() {
        assert!(
            item.unwrap().finish_reason.is_none(),
            "aborted before its end"
        );
        rest += 1;
    }
    assert!(rest < 199);
    let stats = handle.blocking_stats().unwrap();
    assert_eq!(stats.scheduler.num_running, 0);
    assert_eq!(stats.counters.num_aborted, 1);
    handle.blocking_shutdown(ShutdownMode::Drain).unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn admission_errors_come_back_from_submit() {
    // 8 blocks of 16: 128 tokens of KV at most.
    let config = scheduler_config(8, MAX_MODEL_LEN);
    let handle = EngineHandle::spawn(engine_with(config)).unwrap();
    let ok_prompt: Vec<u32> = (10..20).collect();
    let cases = [
        (
            "empty prompt",
            request(Vec::new(), SamplingParams::greedy(4)),
        ),
        (
            "prompt longer than max_model_len",
            request(vec![7; MAX_MODEL_LEN + 1], SamplingParams::greedy(4)),
        ),
        (
            "token outside the vocabulary",
            request(vec![3, 512, 4], SamplingParams::greedy(4)),
        ),
        (
            "negative temperature",
            request(
                ok_prompt.clone(),
                SamplingParams {
                    temperature: -1.0,
                    ..SamplingParams::greedy(4)
                },
            ),
        ),
        (
            "max_tokens 0",
            request(ok_prompt.clone(), SamplingParams::greedy(0)),
        ),
        (
            "more KV than the whole cache",
            request(vec![7; 100], SamplingParams::greedy(100)),
        ),
    ];
    for (what, r) in cases.iter().cloned() {
        match handle.submit(r).await {
            Err(EngineError::InvalidRequest(msg)) => {
                assert!(!msg.is_empty(), "{what}");
                // Refusals reach API clients: no internal request id.
                assert!(!msg.contains("request 0"), "{what}: {msg}");
            }
            Err(e) => panic!("{what}: unexpected error {e}"),
            Ok(_) => panic!("{what}: admitted"),
        }
    }
    let stats = handle.stats().await.unwrap();
    assert_eq!(stats.counters.num_requests_rejected, cases.len() as u64);
    assert_eq!(stats.counters.num_requests_admitted, 0);
    assert_eq!(stats.scheduler.num_waiting, 0);

    let mut s = handle.submit(request(ok_prompt, long(5))).await.unwrap();
    assert_eq!(drain(&mut s).await.len(), 5);
    handle.shutdown(ShutdownMode::Drain).await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_full_waiting_queue_answers_overloaded() {
    // One running sequence at a time, at most one waiting.
    let config = SchedulerConfig {
        max_num_seqs: 1,
        ..scheduler_config(64, MAX_MODEL_LEN)
    };
    let options = HandleOptions {
        max_waiting: Some(1),
        ..HandleOptions::default()
    };
    let handle = EngineHandle::spawn_with(engine_with(config), options).unwrap();
    let prompt: Vec<u32> = (30..38).collect();
    let max_tokens = MAX_MODEL_LEN - prompt.len();
    let mut first = handle
        .submit(request(prompt.clone(), long(max_tokens)))
        .await
        .unwrap();
    // Running now, so the queue is empty and the next one is taken.
    assert!(first.next().await.unwrap().is_ok());
    let mut kept = vec![first];
    kept.push(
        handle
            .submit(request(prompt.clone(), long(max_tokens)))
            .await
            .unwrap(),
    );
    // Each request runs for hundreds of steps; the next submit finds the
    // second one still waiting (retried in case a whole request went by).
    let mut overloaded = None;
    for _ in 0..20 {
        match handle
            .submit(request(prompt.clone(), long(max_tokens)))
            .await
        {
            Ok(s) => kept.push(s),
            Err(e) => {
                overloaded = Some(e);
                break;
            }
        }
    }
    match overloaded {
        Some(EngineError::Overloaded {
            num_waiting,
            max_waiting,
        }) => assert_eq!((num_waiting, max_waiting), (1, 1)),
        other => panic!("expected Overloaded, got {other:?}"),
    }
    let stats = handle.stats().await.unwrap();
    assert_eq!(stats.counters.num_requests_rejected, 1);
    assert!(stats.scheduler.num_waiting <= 1);
    drop(kept);
    handle.shutdown(ShutdownMode::Drain).await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn drain_shutdown_finishes_requests_then_refuses() {
    let handle = EngineHandle::spawn(engine(128)).unwrap();
    let other = handle.clone();
    let mut streams = Vec::new();
    for p in prompts() {
        streams.push(handle.submit(request(p, long(10))).await.unwrap());
    }
    handle.shutdown(ShutdownMode::Drain).await.unwrap();
    for s in &mut streams {
        let outs = drain(s).await;
        assert_eq!(outs.len(), 10);
        assert_eq!(outs[9].finish_reason, Some(FinishReason::Length));
    }
    assert!(other.is_closed());
    let refused = other.submit(request(vec![5, 6, 7], long(3))).await;
    assert!(matches!(refused, Err(EngineError::Shutdown)));
    assert!(matches!(other.stats().await, Err(EngineError::Shutdown)));
    // A second shutdown of a stopped engine is a no-op.
    other.shutdown(ShutdownMode::Abort).await.unwrap();
}

#[test]
fn abort_shutdown_ends_every_stream() {
    let handle = EngineHandle::spawn(engine(128)).unwrap();
    let mut streams: Vec<_> = prompts()
        .into_iter()
        .map(|p| handle.blocking_submit(request(p, long(200))).unwrap())
        .collect();
    assert!(streams[0].blocking_next().unwrap().is_ok());
    let other = handle.clone();
    handle.blocking_shutdown(ShutdownMode::Abort).unwrap();
    let mut num_shut = 0;
    for s in &mut streams {
        let mut last = None;
        while let Some(item) = s.blocking_next() {
            last = Some(item);
        }
        match last {
            Some(Err(EngineError::Shutdown)) => num_shut += 1,
            // Only if the whole request ran before the shutdown was served.
            Some(Ok(o)) => assert_eq!(o.finish_reason, Some(FinishReason::Length)),
            other => panic!("stream ended with {other:?}"),
        }
        assert!(s.is_finished());
    }
    assert!(num_shut > 0);
    assert!(matches!(
        other.blocking_submit(request(vec![1, 2], long(2))),
        Err(EngineError::Shutdown)
    ));
}
