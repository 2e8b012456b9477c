//! End-to-end properties of the engine on the default model, greedy: a
//! request's tokens do not depend on what else is in the batch, on the
//! prefix cache, on the chunked-prefill budget, or on preemption.

mod common;

use common::*;
use pagoda_core::SamplingParams;
use pagoda_engine::{GenerateOutput, GenerateRequest, LlmEngine, SchedulerConfig};
use pagoda_kernels::cpu::{CpuBackend, WeightDtype};
use pagoda_model::open::{open_model, ModelFiles, OpenOptions};

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "List three colours:",
    "Once upon a time, in a small village by the mountains, there lived an old clockmaker who",
    "Q: What is 12 times 12?\nA:",
    "The quick brown fox",
    "In 1969, the first humans",
];
const NEW_TOKENS: usize = 12;

fn files() -> ModelFiles {
    open_model(&OpenOptions {
        model: Some(default_model()),
        ..Default::default()
    })
    .unwrap()
}

fn engine(files: &ModelFiles, config: SchedulerConfig) -> LlmEngine<CpuBackend> {
    let runner = cpu_runner(
        &files.config,
        files.weights.as_ref(),
        WeightDtype::F32,
        config.num_blocks,
    );
    let tok = files.tokenizer.clone();
    LlmEngine::new(runner, tok, config).unwrap()
}

fn requests(files: &ModelFiles, prompts: &[&str]) -> Vec<GenerateRequest> {
    let tok = files.tokenizer.as_ref().unwrap();
    prompts
        .iter()
        .map(|p| GenerateRequest {
            prompt_token_ids: tok.encode(p, true).unwrap(),
            params: SamplingParams {
                ignore_eos: true,
                ..SamplingParams::greedy(NEW_TOKENS)
            },
        })
        .collect()
}

fn config(num_blocks: usize, budget: usize, prefix_caching: bool) -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: budget,
        enable_prefix_caching: prefix_caching,
        ..scheduler_config(num_blocks, 512)
    }
}

fn tokens(outputs: &[GenerateOutput]) -> Vec<Vec<u32>> {
    outputs.iter().map(|o| o.token_ids.clone()).collect()
}

/// Each prompt generated alone, with no cache and a large budget.
fn alone(files: &ModelFiles) -> Vec<Vec<u32>> {
    PROMPTS
        .iter()
        .map(|p| {
            let mut e = engine(files, config(64, 2048, false));
            tokens(&e.generate(requests(files, &[p]), &mut |_| {}).unwrap()).remove(0)
        })
        .collect()
}

#[test]
fn batched_chunked_cached_and_preempted_runs_all_match_prompts_run_alone() {
    let files = files();
    let want = alone(&files);

    // One batch, cache off and on, at several chunked-prefill budgets.
    for (budget, caching) in [
        (512, false),
        (512, true),
        (64, true),
        (16, true),
        (16, false),
    ] {
        let mut e = engine(&files, config(256, budget, caching));
        let got = tokens(&e.generate(requests(&files, &PROMPTS), &mut |_| {}).unwrap());
        assert_eq!(
            got, want,
            "batch of 8, budget {budget}, prefix caching {caching}"
        );
    }

    // A cache so small that sequences must be preempted and recomputed.
    for caching in [false, true] {
        let mut e = engine(&files, config(6, 64, caching));
        let got = tokens(&e.generate(requests(&files, &PROMPTS), &mut |_| {}).unwrap());
        let stats = e.stats();
        assert!(
            stats.counters.num_preemptions > 0,
            "expected preemptions with 6 blocks"
        );
        assert_eq!(got, want, "tiny cache, prefix caching {caching}");
        assert_eq!(stats.num_running + stats.num_waiting, 0);
    }
}

#[test]
fn a_request_extending_a_finished_prompt_computes_only_the_new_tokens() {
    // SGLang's walkthrough: "12345" then "1234512345" (as token ids).
    let files = files();
    let first: Vec<u32> = vec![1, 29871, 29896, 29906, 29941, 29946, 29945];
    let second: Vec<u32> = [&first[..], &[29896, 29906, 29941, 29946, 29945]].concat();
    let req = |ids: &Vec<u32>| GenerateRequest {
        prompt_token_ids: ids.clone(),
        params: SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(4)
        },
    };
    let mut cached = engine(&files, config(64, 2048, true));
    cached.generate(vec![req(&first)], &mut |_| {}).unwrap();
    let out = cached
        .generate(vec![req(&second)], &mut |_| {})
        .unwrap()
        .remove(0);
    assert_eq!(out.num_cached_tokens, 7);

    let mut uncached = engine(&files, config(64, 2048, false));
    uncached.generate(vec![req(&first)], &mut |_| {}).unwrap();
    let plain = uncached
        .generate(vec![req(&second)], &mut |_| {})
        .unwrap()
        .remove(0);
    assert_eq!(plain.num_cached_tokens, 0);
    assert_eq!(out.token_ids, plain.token_ids);
    assert_eq!(out.text, plain.text);
}

#[test]
fn seeded_sampling_is_independent_of_the_batch() {
    let files = files();
    let sampled = |seed: u64| SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        top_k: 50,
        seed: Some(seed),
        ignore_eos: true,
        ..SamplingParams::greedy(NEW_TOKENS)
    };
    let mut reqs = requests(&files, &PROMPTS);
    for (i, r) in reqs.iter_mut().enumerate() {
        r.params = sampled(i as u64 + 7);
    }
    let mut e = engine(&files, config(256, 64, true));
    let batched = tokens(&e.generate(reqs.clone(), &mut |_| {}).unwrap());
    for (i, r) in reqs.into_iter().enumerate().step_by(3) {
        let mut e = engine(&files, config(64, 2048, false));
        let alone = tokens(&e.generate(vec![r], &mut |_| {}).unwrap()).remove(0);
        assert_eq!(alone, batched[i], "prompt {i}");
    }
}

#[test]
fn stop_strings_end_the_text_before_the_stop() {
    let files = files();
    let mut e = engine(&files, config(64, 2048, true));
    let mut r = requests(&files, &["The capital of France is"]).remove(0);
    r.params.max_tokens = 20;
    r.params.stop = vec!["answer".into()];
    let o = e.generate(vec![r], &mut |_| {}).unwrap().remove(0);
    // Reference text: " Paris.\n\nThe answer is: ..." (tests/golden/smollm2_q4_1.json).
    assert_eq!(o.text, " Paris.\n\nThe ");
    assert_eq!(o.finish_reason, pagoda_engine::FinishReason::Stop);
    let stats = e.stats();
    assert_eq!(stats.num_running, 0);
}
