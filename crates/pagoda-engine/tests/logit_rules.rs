//! Token rules and text options of a request, end to end on the default
//! model (CPU): `logit_bias`, `allowed_token_ids`, `bad_words`,
//! `min_tokens`, `include_stop_str_in_output` and `skip_special_tokens`
//! change what is generated as vLLM's do, greedy and sampled, and ids
//! outside the vocabulary are refused when the request is added.

mod common;

use common::*;
use pagoda_core::{FinishReason, SamplingParams};
use pagoda_engine::{EngineRequest, GenerateOutput, GenerateRequest, LlmEngine};
use pagoda_kernels::cpu::{CpuBackend, WeightDtype};
use pagoda_model::open::{open_model, ModelFiles, OpenOptions};
use pagoda_model::tokenizer::Tokenizer;

fn files() -> ModelFiles {
    open_model(&OpenOptions {
        model: Some(default_model()),
        ..Default::default()
    })
    .unwrap()
}

fn engine(files: &ModelFiles) -> LlmEngine<CpuBackend> {
    let config = scheduler_config(64, 512);
    let runner = cpu_runner(
        &files.config,
        files.weights.as_ref(),
        WeightDtype::F32,
        config.num_blocks,
    );
    LlmEngine::new(runner, files.tokenizer.clone(), config).unwrap()
}

fn tok(files: &ModelFiles) -> &Tokenizer {
    files.tokenizer.as_deref().unwrap()
}

fn run(files: &ModelFiles, prompt: &str, params: SamplingParams) -> GenerateOutput {
    let req = GenerateRequest {
        prompt_token_ids: tok(files).encode(prompt, true).unwrap(),
        params,
    };
    engine(files)
        .generate(vec![req], &mut |_| {})
        .unwrap()
        .remove(0)
}

fn sampled(max_tokens: usize, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    }
}

fn eos(files: &ModelFiles) -> u32 {
    tok(files).eos_token_ids()[0]
}

#[test]
fn a_bias_of_100_makes_one_token_the_whole_output() {
    let f = files();
    let target = tok(&f).encode(" banana", false).unwrap()[0];
    for params in [
        SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(8)
        },
        sampled(8, 1),
        sampled(8, 2),
    ] {
        let out = run(
            &f,
            "The capital of France is",
            SamplingParams {
                logit_bias: vec![(target, 100.0)],
                ..params
            },
        );
        assert_eq!(out.token_ids, vec![target; 8], "{out:?}");
    }
    // A bias of -100 on the greedy token moves greedy decoding off it.
    let plain = run(&f, "The capital of France is", SamplingParams::greedy(1));
    let first = plain.token_ids[0];
    let out = run(
        &f,
        "The capital of France is",
        SamplingParams {
            logit_bias: vec![(first, -100.0)],
            ..SamplingParams::greedy(1)
        },
    );
    assert_ne!(out.token_ids[0], first);
}

#[test]
fn min_tokens_keeps_eos_and_stop_ids_out_until_reached() {
    let f = files();
    let e = eos(&f);
    // EOS pushed to the top: banned for 5 tokens, then it ends the request.
    let out = run(
        &f,
        "Hello",
        SamplingParams {
            logit_bias: vec![(e, 100.0)],
            min_tokens: 5,
            ..SamplingParams::greedy(20)
        },
    );
    assert_eq!(out.token_ids.len(), 6, "{out:?}");
    assert!(!out.token_ids[..5].contains(&e));
    assert_eq!(out.token_ids[5], e);
    assert_eq!(out.finish_reason, FinishReason::Stop);
    // Stop ids too.
    let stop = tok(&f).encode(" banana", false).unwrap()[0];
    let out = run(
        &f,
        "Hello",
        SamplingParams {
            logit_bias: vec![(stop, 100.0)],
            stop_token_ids: vec![stop],
            min_tokens: 3,
            ..sampled(20, 3)
        },
    );
    assert_eq!(out.token_ids.len(), 4, "{out:?}");
    assert_eq!(out.token_ids[3], stop);
}

#[test]
fn min_tokens_delays_stop_strings() {
    let f = files();
    let prompt = "The capital of France is";
    let plain = run(
        &f,
        prompt,
        SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(12)
        },
    );
    // A stop string completed by the first token: it ends the request at
    // once without min_tokens, and is passed over with it.
    let first_text = tok(&f).decode(&plain.token_ids[..1], true).unwrap();
    let stop = first_text.trim().to_string();
    assert!(!stop.is_empty(), "{plain:?}");
    let stopped = run(
        &f,
        prompt,
        SamplingParams {
            stop: vec![stop.clone()],
            ignore_eos: true,
            ..SamplingParams::greedy(12)
        },
    );
    assert_eq!(stopped.token_ids.len(), 1);
    let held = run(
        &f,
        prompt,
        SamplingParams {
            stop: vec![stop.clone()],
            min_tokens: 3,
            ignore_eos: true,
            ..SamplingParams::greedy(12)
        },
    );
    assert!(held.token_ids.len() > 3, "{held:?}");
    assert_eq!(held.token_ids[..], plain.token_ids[..held.token_ids.len()]);
    assert!(held.text.starts_with(&first_text), "{held:?}");
}

#[test]
fn stop_strings_can_stay_in_the_text() {
    let f = files();
    let prompt = "The capital of France is";
    let plain = run(
        &f,
        prompt,
        SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(12)
        },
    );
    // A stop string from the middle of the greedy text.
    let chars: Vec<char> = plain.text.chars().collect();
    assert!(chars.len() > 8, "{plain:?}");
    let stop: String = chars[4..7].iter().collect();
    let cut = plain.text.find(&stop).unwrap();
    for (include, end) in [(false, cut), (true, cut + stop.len())] {
        let out = run(
            &f,
            prompt,
            SamplingParams {
                stop: vec![stop.clone()],
                include_stop_str_in_output: include,
                ignore_eos: true,
                ..SamplingParams::greedy(12)
            },
        );
        assert_eq!(out.text, plain.text[..end], "include {include}");
        assert_eq!(out.finish_reason, FinishReason::Stop);
    }
}

#[test]
fn special_tokens_are_in_the_text_only_when_not_skipped() {
    let f = files();
    let e = eos(&f);
    let eos_text = tok(&f).id_to_token(e).unwrap();
    for skip in [true, false] {
        let out = run(
            &f,
            "Hello",
            SamplingParams {
                logit_bias: vec![(e, 100.0)],
                skip_special_tokens: skip,
                ignore_eos: true,
                ..SamplingParams::greedy(3)
            },
        );
        assert_eq!(out.token_ids, vec![e; 3]);
        let want = if skip {
            String::new()
        } else {
            eos_text.repeat(3)
        };
        assert_eq!(out.text, want, "skip {skip}");
    }
    // The EOS that ends a request is in the text only with
    // include_stop_str_in_output (and skip_special_tokens false).
    for include in [false, true] {
        let out = run(
            &f,
            "Hello",
            SamplingParams {
                logit_bias: vec![(e, 100.0)],
                skip_special_tokens: false,
                include_stop_str_in_output: include,
                ..SamplingParams::greedy(3)
            },
        );
        assert_eq!(out.token_ids, vec![e]);
        let want = if include {
            eos_text.clone()
        } else {
            String::new()
        };
        assert_eq!(out.text, want, "include {include}");
    }
}

#[test]
fn bad_words_never_appear() {
    let f = files();
    let prompt = "The capital of France is";
    let plain = run(
        &f,
        prompt,
        SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(12)
        },
    );
    // Every word of the greedy text banned: none may come back.
    let words: Vec<String> = plain
        .text
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric()).to_string())
        .filter(|w| w.len() > 2)
        .collect();
    assert!(!words.is_empty(), "{plain:?}");
    for params in [
        SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(12)
        },
        sampled(12, 4),
    ] {
        let out = run(
            &f,
            prompt,
            SamplingParams {
                bad_words: words.clone(),
                ..params
            },
        );
        for w in &words {
            for form in [w.clone(), format!(" {w}")] {
                let ids = tok(&f).encode(&form, false).unwrap();
                assert!(
                    !out.token_ids.windows(ids.len()).any(|x| x == ids),
                    "{form:?} ({ids:?}) in {out:?}"
                );
            }
        }
    }
}

#[test]
fn only_allowed_tokens_are_sampled() {
    let f = files();
    let allowed: Vec<u32> = tok(&f).encode(" one two three four", false).unwrap();
    for params in [
        SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(10)
        },
        sampled(10, 5),
        sampled(10, 6),
    ] {
        let out = run(
            &f,
            "Count:",
            SamplingParams {
                allowed_token_ids: Some(allowed.clone()),
                ..params
            },
        );
        assert_eq!(out.token_ids.len(), 10);
        assert!(
            out.token_ids.iter().all(|t| allowed.contains(t)),
            "{out:?} not in {allowed:?}"
        );
    }
}

#[test]
fn ids_outside_the_vocabulary_are_refused() {
    let f = files();
    let vocab = f.config.vocab_size as u32;
    let mut e = engine(&f);
    for params in [
        SamplingParams {
            logit_bias: vec![(vocab, 1.0)],
            ..Default::default()
        },
        SamplingParams {
            allowed_token_ids: Some(vec![1, vocab + 5]),
            ..Default::default()
        },
    ] {
        let err = e
            .add_request(EngineRequest {
                prompt_token_ids: vec![1, 2],
                params,
                logprobs: None,
            })
            .unwrap_err();
        assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    }
}
