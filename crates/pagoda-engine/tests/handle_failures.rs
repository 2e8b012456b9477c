//! The threaded engine when a step fails: through a backend that fails or
//! panics on demand, a failed step ends its requests with an error item and
//! the engine goes on (checked against `LlmEngine::generate`), requests the
//! failed step did not run are served as if nothing happened; a panicking
//! step ends every stream and stops the engine thread cleanly.

mod common;

use common::faulty::Faults;
use common::tiny::*;
use pagoda_core::SamplingParams;
use pagoda_engine::{EngineError, EngineHandle, RequestStream, ShutdownMode, StreamItem};
use std::sync::atomic::Ordering;

/// Starts three long requests and waits until each has a token.
fn start_three_long(handle: &EngineHandle) -> Vec<RequestStream> {
    let mut streams: Vec<_> = prompts()[..3]
        .iter()
        .map(|p| {
            handle
                .blocking_submit(request(p.clone(), long(200)))
                .unwrap()
        })
        .collect();
    for s in &mut streams {
        assert!(s.blocking_next().unwrap().is_ok());
    }
    streams
}

/// Each stream's last item, once it ends.
fn last_items(streams: &mut [RequestStream]) -> Vec<Option<StreamItem>> {
    streams
        .iter_mut()
        .map(|s| {
            let mut last = None;
            while let Some(item) = s.blocking_next() {
                last = Some(item);
            }
            last
        })
        .collect()
}

/// Starts three long requests, waits until each has a token, then makes the
/// next forward pass fail (or panic); returns each stream's last item.
fn fail_a_step(handle: &EngineHandle, faults: &Faults, panic: bool) -> Vec<Option<StreamItem>> {
    let mut streams = start_three_long(handle);
    let counter = if panic {
        &faults.panic_steps
    } else {
        &faults.fail_steps
    };
    counter.store(1, Ordering::SeqCst);
    last_items(&mut streams)
}

#[test]
fn a_failed_step_fails_its_requests_and_the_engine_goes_on() {
    let (engine, faults) = faulty_engine(128);
    let handle = EngineHandle::spawn(engine).unwrap();
    for last in fail_a_step(&handle, &faults, false) {
        match last {
            Some(Err(EngineError::StepFailed(msg))) => assert!(msg.contains("injected failure")),
            other => panic!("stream ended with {other:?}"),
        }
    }
    let stats = handle.blocking_stats().unwrap();
    assert_eq!(stats.counters.num_failed_steps, 1);
    assert_eq!(stats.counters.num_failed, 3);
    let sched = stats.scheduler;
    assert_eq!(
        (sched.num_running, sched.num_waiting, sched.num_blocks_used),
        (0, 0, 0)
    );

    // Later requests are served, and right.
    let prompts = prompts();
    let max_tokens = [6usize, 9, 4, 12, 7];
    let want = offline(&prompts, &max_tokens);
    let mut streams: Vec<_> = prompts
        .iter()
        .zip(&max_tokens)
        .map(|(p, &m)| {
            let r = request(p.clone(), SamplingParams::greedy(m));
            handle.blocking_submit(r).unwrap()
        })
        .collect();
    let got: Vec<_> = streams.iter_mut().map(drain_blocking).collect();
    check_against_offline(&got, &prompts, &want);
    handle.blocking_shutdown(ShutdownMode::Drain).unwrap();
}

#[test]
fn a_failed_step_spares_the_requests_it_did_not_run() {
    // Three sequences per step: while three long requests run, a fourth
    // waits, so the step that fails is not its step.
    let (engine, faults) = faulty_engine_with(128, 3);
    let handle = EngineHandle::spawn(engine).unwrap();
    let prompts = prompts();
    let mut running = start_three_long(&handle);
    let mut waiting = handle
        .blocking_submit(request(prompts[3].clone(), SamplingParams::greedy(5)))
        .unwrap();
    faults.fail_steps.store(1, Ordering::SeqCst);
    for last in last_items(&mut running) {
        assert!(
            matches!(last, Some(Err(EngineError::StepFailed(_)))),
            "a request of the failed step ended with {last:?}"
        );
    }
    let got = vec![drain_blocking(&mut waiting)];
    check_against_offline(&got, &prompts[3..4], &offline(&prompts[3..4], &[5]));
    let stats = handle.blocking_stats().unwrap();
    assert_eq!(
        (stats.counters.num_failed_steps, stats.counters.num_failed),
        (1, 3)
    );
    handle.blocking_shutdown(ShutdownMode::Drain).unwrap();
}

#[test]
fn a_panicking_step_ends_every_stream_and_stops_the_engine() {
    let (engine, faults) = faulty_engine(128);
    let handle = EngineHandle::spawn(engine).unwrap();
    for last in fail_a_step(&handle, &faults, true) {
        match last {
            Some(Err(EngineError::StepFailed(msg))) => assert!(msg.contains("injected panic")),
            other => panic!("stream ended with {other:?}"),
        }
    }
    let refused = handle.blocking_submit(request(vec![5, 6, 7], long(3)));
    assert!(matches!(refused, Err(EngineError::Shutdown)));
    // The panic was caught on the engine thread, which then ended normally.
    handle.blocking_shutdown(ShutdownMode::Drain).unwrap();
}
