//! gemma-3-270m (Q4_K_M GGUF) against Hugging Face transformers loading the
//! same file (tests/golden/gemma3_270m.json, written by
//! scripts/golden/gemma3_270m.py): tokenization, 20 greedy tokens per prompt
//! (one prompt longer than the 512-token sliding window) with the top-5
//! logits of every step, alone and batched with chunked prefill. (The GGUF
//! carries no chat template; one prompt is in Gemma's chat turn format.)
//!
//! The GGUF is not in the repository: it is looked for at
//! `$PAGODA_GEMMA3_GGUF`, else `models/gemma-3-270m-q4_k_m.gguf`; when absent
//! the tests pass with a notice.

mod common;

use common::*;
use pagoda_core::SamplingParams;
use pagoda_engine::{GenerateRequest, LlmEngine, SchedulerConfig};
use pagoda_kernels::cpu::WeightDtype;
use pagoda_model::open::{open_model, ModelFiles, OpenOptions};
use pagoda_model::Architecture;
use std::path::PathBuf;

fn gguf_path() -> Option<PathBuf> {
    let path = std::env::var_os("PAGODA_GEMMA3_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("models/gemma-3-270m-q4_k_m.gguf"));
    path.is_file().then_some(path)
}

fn open() -> Option<ModelFiles> {
    let Some(path) = gguf_path() else {
        eprintln!(
            "skipped: gemma-3-270m GGUF not found (set PAGODA_GEMMA3_GGUF; \
             scripts/golden/gemma_tokenizer.py says how to get it)"
        );
        return None;
    };
    let files = open_model(&OpenOptions {
        model: Some(path),
        ..Default::default()
    })
    .unwrap();
    let cfg = &files.config;
    assert_eq!(cfg.architecture, Architecture::Gemma3);
    assert_eq!(cfg.sliding_window, Some(512));
    let g = cfg.gemma.as_ref().unwrap();
    let global: Vec<usize> = (0..cfg.num_hidden_layers)
        .filter(|&i| !g.sliding_layers[i])
        .collect();
    assert_eq!(global, vec![5, 11, 17]);
    assert_eq!(g.rope_local_base_freq, 10_000.0);
    assert_eq!(g.query_pre_attn_scalar, 256.0);
    Some(files)
}

/// The model's KV cache groups (its three global layers apart from the
/// local ones).
fn groups(files: &ModelFiles) -> usize {
    let n = pagoda_model::KvLayout::for_config(&files.config, true).num_groups();
    assert!(n > 1);
    n
}

#[test]
fn greedy_tokens_and_top5_logits_match_transformers() {
    let Some(files) = open() else { return };
    let golden = read_json("tests/golden/gemma3_270m.json");
    let tokenizer = files.tokenizer.as_ref().unwrap();
    let longest = golden["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| ids(&p["prompt_ids"]).len() + 20)
        .max()
        .unwrap();
    assert!(longest > 512, "one prompt runs past the window");
    let mut runner = cpu_runner(
        &files.config,
        files.weights.as_ref(),
        WeightDtype::F32,
        // One table per KV cache group (local layers apart from global).
        longest.div_ceil(BLOCK_SIZE) * groups(&files),
    );
    for p in golden["prompts"].as_array().unwrap() {
        let text = p["prompt"].as_str().unwrap();
        let prompt = ids(&p["prompt_ids"]);
        assert_eq!(
            tokenizer.encode(text, true).unwrap(),
            prompt,
            "tokens of {text:?}"
        );
        let want = ids(&p["output_ids"]);
        let (got, logits) = greedy_trace(&mut runner, &prompt, want.len());
        assert_eq!(
            got,
            want,
            "greedy tokens after {} prompt tokens",
            prompt.len()
        );
        assert_eq!(
            tokenizer.decode(&got, false).unwrap(),
            p["output_text"].as_str().unwrap()
        );
        for (s, step) in p["steps"].as_array().unwrap().iter().enumerate() {
            let top = ids(&step["top_ids"]);
            let got_top: Vec<f32> = top.iter().map(|&i| logits[s][i as usize]).collect();
            let err = rel_err(&got_top, &floats(&step["top_logits"]));
            assert!(
                err < 2e-3,
                "prompt of {}, step {s}: top-5 logits off by {err}",
                prompt.len()
            );
        }
    }
}

#[test]
fn batched_generation_with_chunked_prefill_gives_the_reference_tokens() {
    let Some(files) = open() else { return };
    let golden = read_json("tests/golden/gemma3_270m.json");
    let prompts = golden["prompts"].as_array().unwrap();
    let num_blocks = prompts
        .iter()
        .map(|p| (ids(&p["prompt_ids"]).len() + 20).div_ceil(BLOCK_SIZE))
        .sum::<usize>()
        * groups(&files);
    let runner = cpu_runner(
        &files.config,
        files.weights.as_ref(),
        WeightDtype::F32,
        num_blocks,
    );
    // Steps of at most 200 tokens: the long prompt is prefilled in chunks,
    // later chunks attending to a cached prefix through the window.
    let sched = SchedulerConfig {
        max_num_batched_tokens: 200,
        ..scheduler_config(num_blocks, 2048)
    };
    let mut engine = LlmEngine::new(runner, None, sched).unwrap();
    let requests = prompts
        .iter()
        .map(|p| GenerateRequest {
            prompt_token_ids: ids(&p["prompt_ids"]),
            params: SamplingParams {
                ignore_eos: true,
                ..SamplingParams::greedy(20)
            },
        })
        .collect();
    let outputs = engine.generate(requests, &mut |_| {}).unwrap();
    for (p, o) in prompts.iter().zip(&outputs) {
        assert_eq!(
            o.token_ids,
            ids(&p["output_ids"]),
            "batched greedy tokens after {} prompt tokens",
            ids(&p["prompt_ids"]).len()
        );
    }
}
