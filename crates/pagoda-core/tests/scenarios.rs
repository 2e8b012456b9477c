//! Step-by-step scenarios with every per-step value asserted: vLLM's chunked
//! prefill walkthrough, SGLang's prefix-sharing example, preemption, admission
//! refusals, abort, and pausing and resuming.

use pagoda_core::{
    BlockCopy, CoreError, FinishReason, Request, RequestId, SamplingParams, Scheduler,
    SchedulerConfig, SchedulerOutput,
};

fn request(id: u64, prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request {
        id: RequestId(id),
        prompt_token_ids: prompt,
        sampling: SamplingParams::greedy(max_tokens),
        eos_token_ids: vec![2],
    }
}

/// (request, query_len, context_len, seq_len, needs_logits) per scheduled sequence.
fn shape(out: &SchedulerOutput) -> Vec<(u64, usize, usize, usize, bool)> {
    out.scheduled
        .iter()
        .map(|s| {
            (
                s.request_id.0,
                s.query_len(),
                s.context_len(),
                s.seq_len(),
                s.needs_logits,
            )
        })
        .collect()
}

/// Samples token `t` for every sequence that needs logits.
fn sample_all(out: &SchedulerOutput, t: u32) -> Vec<(RequestId, u32)> {
    out.scheduled
        .iter()
        .filter(|s| s.needs_logits)
        .map(|s| (s.request_id, t))
        .collect()
}

#[test]
fn vllm_chunked_prefill_walkthrough() {
    let config = SchedulerConfig {
        max_num_batched_tokens: 512,
        ..SchedulerConfig::default()
    };
    let mut sched = Scheduler::new(config).unwrap();
    sched
        .add_request(request(0, (0..484).map(|i| 1000 + i).collect(), 100))
        .unwrap();
    sched
        .add_request(request(1, (0..484).map(|i| 5000 + i).collect(), 100))
        .unwrap();

    let s1 = sched.schedule().unwrap();
    assert_eq!(
        shape(&s1),
        vec![(0, 484, 0, 484, true), (1, 28, 0, 28, false)]
    );
    assert_eq!(
        (s1.num_prefills, s1.num_prefill_tokens, s1.num_decode_tokens),
        (2, 512, 0)
    );
    assert_eq!(s1.scheduled[0].block_table.len(), 484usize.div_ceil(16));
    assert_eq!(s1.scheduled[1].block_table.len(), 2);
    assert_eq!(s1.scheduled[1].token_ids, (5000..5028).collect::<Vec<_>>());
    let u1 = sched.update_from_output(&s1, &sample_all(&s1, 7)).unwrap();
    assert_eq!(u1.len(), 1);
    assert_eq!(
        (u1[0].request_id, u1[0].token_id, u1[0].finish_reason),
        (RequestId(0), 7, None)
    );

    let s2 = sched.schedule().unwrap();
    assert_eq!(
        shape(&s2),
        vec![(0, 1, 484, 485, true), (1, 456, 28, 484, true)]
    );
    assert_eq!(
        (s2.num_prefills, s2.num_prefill_tokens, s2.num_decode_tokens),
        (1, 456, 1)
    );
    assert_eq!(s2.scheduled[0].token_ids, vec![7]);
    sched.update_from_output(&s2, &sample_all(&s2, 8)).unwrap();

    let s3 = sched.schedule().unwrap();
    assert_eq!(
        shape(&s3),
        vec![(0, 1, 485, 486, true), (1, 1, 484, 485, true)]
    );
    assert_eq!(
        (s3.num_prefills, s3.num_prefill_tokens, s3.num_decode_tokens),
        (0, 0, 2)
    );
    assert!(s3.block_copies.is_empty() && s3.preempted.is_empty());
    sched.check_invariants().unwrap();
}

#[test]
fn sglang_prefix_example_reuses_seven_tokens_by_copy_on_write() {
    let mut sched = Scheduler::new(SchedulerConfig::default()).unwrap();
    let first = vec![1, 29871, 29896, 29906, 29941, 29946, 29945];
    sched.add_request(request(0, first.clone(), 3)).unwrap();
    let mut steps = 0;
    while sched.has_unfinished_requests() {
        let out = sched.schedule().unwrap();
        assert!(out.block_copies.is_empty());
        sched
            .update_from_output(&out, &sample_all(&out, 100 + steps))
            .unwrap();
        steps += 1;
    }
    assert_eq!(steps, 3, "prefill + 2 decodes for max_tokens 3");
    // Prompt + the two generated tokens that were fed back are cached.
    assert_eq!(sched.stats().radix_cached_tokens, 9);
    // The first request's only block: the pool hands out block 0 first.
    assert_eq!(sched.stats().num_blocks_used, 1);
    let src = pagoda_core::BlockId(0);

    let second = vec![
        1, 29871, 29896, 29906, 29941, 29946, 29945, 29896, 29906, 29941, 29946, 29945,
    ];
    sched.add_request(request(1, second.clone(), 3)).unwrap();
    let out = sched.schedule().unwrap();
    assert_eq!(out.scheduled.len(), 1);
    let s = &out.scheduled[0];
    assert_eq!(
        (s.num_cached_tokens, s.context_len(), s.query_len()),
        (7, 7, 5)
    );
    assert_eq!(s.positions(), 7..12);
    assert_eq!(s.token_ids, second[7..].to_vec());
    assert_eq!(s.block_table.len(), 1);
    assert_ne!(s.block_table[0], src, "the shared block is never written");
    assert_eq!(
        out.block_copies,
        vec![BlockCopy {
            src,
            dst: s.block_table[0],
            num_tokens: 7
        }]
    );
    assert_eq!(
        (
            out.num_prefills,
            out.num_prefill_tokens,
            out.num_decode_tokens
        ),
        (1, 5, 0)
    );
    let upd = sched
        .update_from_output(&out, &[(RequestId(1), 2)])
        .unwrap();
    assert_eq!(upd[0].finish_reason, Some(FinishReason::Stop), "EOS");
    assert_eq!(upd[0].num_cached_tokens, 7);
    let stats = sched.stats();
    assert_eq!(stats.counters.prefix_cache_hit_tokens, 7);
    assert_eq!(stats.counters.prefix_cache_queried_tokens, 7 + 12);
    sched.check_invariants().unwrap();
    sched.flush_prefix_cache().unwrap();
    assert_eq!(
        sched.stats().num_blocks_free,
        sched.stats().num_blocks_total
    );
}

#[test]
fn fully_cached_prompt_still_computes_its_last_token() {
    let config = SchedulerConfig {
        block_size: 4,
        ..SchedulerConfig::default()
    };
    let mut sched = Scheduler::new(config).unwrap();
    let prompt: Vec<u32> = (10..18).collect();
    for id in 0..2 {
        sched.add_request(request(id, prompt.clone(), 1)).unwrap();
        let out = sched.schedule().unwrap();
        let s = &out.scheduled[0];
        let expect_cached = if id == 0 { 0 } else { 7 };
        assert_eq!(
            (s.context_len(), s.query_len()),
            (expect_cached, 8 - expect_cached)
        );
        // 7 cached tokens end mid-block 1: its first 3 slots are copied.
        assert_eq!(out.block_copies.len(), id as usize);
        if id == 1 {
            assert_eq!(out.block_copies[0].num_tokens, 3);
        }
        let upd = sched
            .update_from_output(&out, &sample_all(&out, 5))
            .unwrap();
        assert_eq!(upd[0].finish_reason, Some(FinishReason::Length));
    }
    sched.check_invariants().unwrap();
}

#[test]
fn preemption_recomputes_the_newest_and_loses_nothing() {
    // 4 blocks of 4 tokens, caching off: two requests of 6-token prompts fit
    // (2 blocks each) until both need a third block.
    let config = SchedulerConfig {
        block_size: 4,
        num_blocks: 4,
        enable_prefix_caching: false,
        ..SchedulerConfig::default()
    };
    let mut sched = Scheduler::new(config).unwrap();
    sched.add_request(request(0, vec![3; 6], 6)).unwrap();
    sched.add_request(request(1, vec![4; 6], 6)).unwrap();
    let s1 = sched.schedule().unwrap();
    assert_eq!(shape(&s1), vec![(0, 6, 0, 6, true), (1, 6, 0, 6, true)]);
    sched.update_from_output(&s1, &sample_all(&s1, 9)).unwrap();
    let s2 = sched.schedule().unwrap(); // positions 6: still block 1
    assert_eq!(shape(&s2), vec![(0, 1, 6, 7, true), (1, 1, 6, 7, true)]);
    sched.update_from_output(&s2, &sample_all(&s2, 9)).unwrap();
    let s3 = sched.schedule().unwrap(); // position 7: still block 1
    sched.update_from_output(&s3, &sample_all(&s3, 9)).unwrap();
    // Position 8 needs a third block each: request 1 (newest) is preempted.
    let s4 = sched.schedule().unwrap();
    assert_eq!(s4.preempted, vec![RequestId(1)]);
    assert_eq!(shape(&s4), vec![(0, 1, 8, 9, true)]);
    assert_eq!(sched.stats().counters.num_preemptions, 1);
    assert_eq!(
        (sched.stats().num_running, sched.stats().num_waiting),
        (1, 1)
    );
    sched.check_invariants().unwrap();
    let mut finished = vec![];
    let mut recompute = None;
    for _ in 0..20 {
        let out = sched.schedule().unwrap();
        if let Some(s) = out
            .scheduled
            .iter()
            .find(|s| s.request_id == RequestId(1) && s.is_prefill)
        {
            recompute = Some((s.context_len(), s.query_len(), s.token_ids.clone()));
        }
        for u in sched
            .update_from_output(&out, &sample_all(&out, 9))
            .unwrap()
        {
            if u.finish_reason.is_some() {
                finished.push((u.request_id.0, u.num_output_tokens));
            }
        }
    }
    assert_eq!(finished, vec![(0, 6), (1, 6)]);
    // Request 1 comes back as one prefill of its prompt and 3 generated tokens.
    assert_eq!(recompute, Some((0, 9, vec![4, 4, 4, 4, 4, 4, 9, 9, 9])));
    assert_eq!(sched.stats().num_blocks_free, 4);
}

#[test]
fn paused_requests_give_their_blocks_back_and_resume_in_arrival_order() {
    // Blocks of 4, one running sequence at a time.
    let config = SchedulerConfig {
        block_size: 4,
        num_blocks: 16,
        max_num_seqs: 1,
        ..SchedulerConfig::default()
    };
    let mut sched = Scheduler::new(config).unwrap();
    sched.add_request(request(0, vec![3; 6], 4)).unwrap();
    sched.add_request(request(1, vec![4; 6], 4)).unwrap();
    sched.add_request(request(2, vec![5; 6], 4)).unwrap();
    let s1 = sched.schedule().unwrap();
    assert_eq!(shape(&s1), vec![(0, 6, 0, 6, true)]);
    sched.update_from_output(&s1, &sample_all(&s1, 9)).unwrap();
    assert_eq!(sched.stats().num_blocks_used, 2);

    // Running: preempted by recompute; its 6 computed tokens stay cached.
    sched.pause(RequestId(0)).unwrap();
    sched.pause(RequestId(0)).unwrap(); // a no-op
    let st = sched.stats();
    assert_eq!((st.num_running, st.num_waiting, st.num_paused), (0, 2, 1));
    assert_eq!(st.radix_cached_tokens, 6);
    assert_eq!(st.counters.num_pauses, 1);
    assert_eq!(st.counters.num_preemptions, 0, "not memory pressure");
    assert!(sched.has_schedulable_requests());
    sched.check_invariants().unwrap();
    let s2 = sched.schedule().unwrap();
    assert_eq!(shape(&s2), vec![(1, 6, 0, 6, true)]);
    sched.update_from_output(&s2, &sample_all(&s2, 9)).unwrap();

    // Waiting or running, a paused request leaves its queue; resumed, each
    // goes back in order of arrival, whatever the order of the resumes.
    sched.pause(RequestId(2)).unwrap();
    sched.pause(RequestId(1)).unwrap();
    assert!(!sched.has_schedulable_requests());
    let empty = sched.schedule().unwrap();
    assert!(empty.is_empty(), "paused requests are never scheduled");
    sched.update_from_output(&empty, &[]).unwrap();
    assert_eq!(sched.stats().num_paused, 3);
    sched.resume(RequestId(2)).unwrap();
    sched.resume(RequestId(1)).unwrap();
    sched.resume(RequestId(1)).unwrap(); // a no-op
    sched.resume(RequestId(0)).unwrap();
    assert_eq!(sched.stats().num_waiting, 3);
    sched.check_invariants().unwrap();

    // Admission in arrival order, each from its cached prefix.
    let mut order = Vec::new();
    let mut finished = Vec::new();
    while sched.has_unfinished_requests() {
        let out = sched.schedule().unwrap();
        for s in &out.scheduled {
            if order.last() != Some(&s.request_id.0) {
                order.push(s.request_id.0);
                if s.request_id != RequestId(2) {
                    // 6 cached, the sampled token computed.
                    assert_eq!((s.context_len(), s.query_len()), (6, 1));
                }
            }
        }
        for u in sched
            .update_from_output(&out, &sample_all(&out, 9))
            .unwrap()
        {
            if u.finish_reason.is_some() {
                finished.push((u.request_id.0, u.num_output_tokens));
            }
        }
        sched.check_invariants().unwrap();
    }
    assert_eq!(order, vec![0, 1, 2]);
    assert_eq!(finished, vec![(0, 4), (1, 4), (2, 4)]);
    assert_eq!(
        sched.pause(RequestId(0)),
        Err(CoreError::UnknownRequest(RequestId(0)))
    );
}

#[test]
fn impossible_requests_are_refused_at_admission() {
    let config = SchedulerConfig {
        block_size: 4,
        num_blocks: 4,
        max_model_len: 32,
        ..Default::default()
    };
    let mut sched = Scheduler::new(config).unwrap();
    assert_eq!(
        sched.add_request(request(1, vec![1; 33], 1)),
        Err(CoreError::PromptTooLong {
            id: RequestId(1),
            prompt_len: 33,
            max_model_len: 32
        })
    );
    // 10 + 8 tokens, the last never computed: 17 K/V = 5 blocks > 4.
    assert_eq!(
        sched.add_request(request(2, vec![1; 10], 8)),
        Err(CoreError::ExceedsKvCache {
            id: RequestId(2),
            needed: 5,
            num_blocks: 4
        })
    );
    sched.add_request(request(3, vec![1; 10], 7)).unwrap();
    assert_eq!(
        sched.add_request(request(3, vec![1], 1)),
        Err(CoreError::DuplicateRequest(RequestId(3)))
    );
    assert_eq!(
        sched.add_request(request(4, vec![], 1)),
        Err(CoreError::EmptyPrompt(RequestId(4)))
    );
    assert!(matches!(
        sched.add_request(request(5, vec![1], 0)),
        Err(CoreError::InvalidSampling(_))
    ));
    assert!(Scheduler::new(SchedulerConfig {
        block_size: 0,
        ..Default::default()
    })
    .is_err());
}

#[test]
fn abort_returns_blocks_at_any_time() {
    let config = SchedulerConfig {
        block_size: 4,
        num_blocks: 8,
        max_num_batched_tokens: 8,
        ..Default::default()
    };
    let mut sched = Scheduler::new(config).unwrap();
    sched.add_request(request(0, (0..12).collect(), 4)).unwrap();
    sched.add_request(request(1, (0..12).collect(), 4)).unwrap();
    let out = sched.schedule().unwrap(); // request 0's first chunk of 8
    assert_eq!(shape(&out), vec![(0, 8, 0, 8, false)]);
    sched.abort(RequestId(1)).unwrap(); // waiting
    sched.abort(RequestId(0)).unwrap(); // running, mid-step
    assert_eq!(
        sched.abort(RequestId(0)),
        Err(CoreError::UnknownRequest(RequestId(0)))
    );
    assert!(sched.update_from_output(&out, &[]).unwrap().is_empty());
    assert!(!sched.has_unfinished_requests());
    sched.check_invariants().unwrap();
    assert_eq!(sched.stats().counters.num_aborted, 2);
    sched.flush_prefix_cache().unwrap();
    assert_eq!(sched.stats().num_blocks_free, 8);
}

#[test]
fn running_requests_share_full_blocks_as_they_complete() {
    let config = SchedulerConfig {
        block_size: 4,
        num_blocks: 16,
        ..SchedulerConfig::default()
    };
    let mut sched = Scheduler::new(config).unwrap();
    let a: Vec<u32> = (1..=10).collect();
    sched.add_request(request(0, a.clone(), 5)).unwrap();
    let s1 = sched.schedule().unwrap();
    sched.update_from_output(&s1, &sample_all(&s1, 50)).unwrap();
    // Request 0 is still running; its two full blocks are already cached.
    assert_eq!(sched.stats().radix_cached_tokens, 8);
    let mut b = a[..9].to_vec();
    b.extend([77, 78]);
    sched.add_request(request(1, b, 5)).unwrap();
    let s2 = sched.schedule().unwrap();
    assert_eq!(shape(&s2), vec![(0, 1, 10, 11, true), (1, 3, 8, 11, true)]);
    assert_eq!(
        s2.scheduled[1].block_table[..2],
        s2.scheduled[0].block_table[..2]
    );
    assert!(
        s2.block_copies.is_empty(),
        "a block-aligned prefix needs no copy"
    );
    // Allocated slots minus cached tokens: 0 has 3 blocks for 10 tokens, 1 has 3 for 8.
    assert_eq!(sched.stats().internal_fragmentation_slots, 2 + 4);
    sched.check_invariants().unwrap();
}

#[test]
fn identical_prompts_admitted_together_end_up_sharing_blocks() {
    let config = SchedulerConfig {
        block_size: 4,
        num_blocks: 16,
        ..SchedulerConfig::default()
    };
    let mut sched = Scheduler::new(config).unwrap();
    let prompt: Vec<u32> = (1..=8).collect();
    sched.add_request(request(0, prompt.clone(), 3)).unwrap();
    sched.add_request(request(1, prompt, 3)).unwrap();
    let s1 = sched.schedule().unwrap();
    assert_eq!(shape(&s1), vec![(0, 8, 0, 8, true), (1, 8, 0, 8, true)]);
    assert_eq!(sched.stats().num_blocks_used, 4);
    sched.update_from_output(&s1, &sample_all(&s1, 50)).unwrap();
    // Request 1 switched to request 0's cached blocks and freed its copies.
    let table = |id| sched.sequence(RequestId(id)).unwrap().block_table.clone();
    assert_eq!(table(0), table(1));
    assert_eq!(sched.stats().num_blocks_used, 2);
    let s2 = sched.schedule().unwrap();
    assert_eq!(shape(&s2), vec![(0, 1, 8, 9, true), (1, 1, 8, 9, true)]);
    assert_ne!(
        s2.scheduled[0].block_table[2],
        s2.scheduled[1].block_table[2]
    );
    sched.check_invariants().unwrap();
}

#[test]
fn mixed_prefill_budget_bounds_prompt_tokens_only_in_steps_with_decodes() {
    let config = SchedulerConfig {
        max_num_batched_tokens: 512,
        ..SchedulerConfig::default()
    };
    let mut sched = Scheduler::new(config).unwrap();
    sched.set_mixed_prefill_budget(Some(100));
    sched
        .add_request(request(0, (0..300).map(|i| 1000 + i).collect(), 100))
        .unwrap();
    // No decode yet: the whole budget goes to the prompt.
    let s1 = sched.schedule().unwrap();
    assert_eq!(shape(&s1), vec![(0, 300, 0, 300, true)]);
    sched.update_from_output(&s1, &sample_all(&s1, 7)).unwrap();

    sched
        .add_request(request(1, (0..250).map(|i| 5000 + i).collect(), 100))
        .unwrap();
    // Request 0 decodes: request 1's prompt comes 100 tokens a step.
    for (step, done) in [(2, 0), (3, 100), (4, 200)] {
        let s = sched.schedule().unwrap();
        let chunk = (250 - done).min(100);
        assert_eq!(
            shape(&s),
            vec![
                (0, 1, 298 + step, 299 + step, true),
                (1, chunk, done, done + chunk, done + chunk == 250)
            ],
            "step {step}"
        );
        assert_eq!((s.num_prefill_tokens, s.num_decode_tokens), (chunk, 1));
        sched.update_from_output(&s, &sample_all(&s, 8)).unwrap();
    }
    let s5 = sched.schedule().unwrap();
    assert_eq!((s5.num_prefill_tokens, s5.num_decode_tokens), (0, 2));
    sched.update_from_output(&s5, &sample_all(&s5, 9)).unwrap();

    // Back to no cap: the rest of the budget again.
    sched.set_mixed_prefill_budget(None);
    sched
        .add_request(request(2, (0..400).map(|i| 9000 + i).collect(), 100))
        .unwrap();
    let s6 = sched.schedule().unwrap();
    assert_eq!(
        (s6.num_prefill_tokens, s6.num_decode_tokens),
        (400, 2),
        "{:?}",
        shape(&s6)
    );
    sched.check_invariants().unwrap();
}
