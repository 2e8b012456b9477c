//! Structured outputs on the CUDA backend, end to end on the default model
//! (SmolLM2-135M GGUF): an ASCII-digit regex (`\d` would also take other
//! scripts' digits, which random weights do pick), a choice, a JSON schema and a Lark grammar
//! with an embedded schema (compact: `%json` allows free whitespace
//! otherwise, which random weights take without end), greedy, batched, eager and through decode
//! graphs (the masks are applied after a graph's replay). Every output
//! must satisfy its constraint and end by the grammar's completion, as on
//! the CPU backend, which runs the same requests as the reference; outputs
//! that differ from the CPU's (bf16 against f16 logits may flip a near-tie)
//! are printed, not failed, since both are then valid.
//!
//! Without the default model (the GPU host has none) the same requests run
//! on a tiny Llama with dummy weights and SmolLM2's vocabulary and tokenizer
//! (tests/golden/smollm2-tokenizer): random logits under the same masks,
//! whose bounded constraints still end by completion within max_tokens.
//!
//! Without a CUDA device every test prints a notice and passes (fails where
//! PAGODA_REQUIRE_GPU=1).
#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::*;
use pagoda_core::{FinishReason, SamplingParams, SchedulerConfig, StructuredOutput};
use pagoda_engine::{GenerateOutput, GenerateRequest, LlmEngine};
use pagoda_kernels::cpu::{CpuBackend, CpuOptions, WeightDtype};
use pagoda_kernels::Backend;
use pagoda_model::open::{open_model, ModelFiles, OpenOptions};
use pagoda_model::tokenizer::ChatMessage;

const PERSON: &str = r#"{"type":"object","properties":{
  "name":{"type":"string","maxLength":16},
  "age":{"type":"integer","minimum":0,"maximum":120}},
  "required":["name","age"],"additionalProperties":false}"#;
const LARK: &str = r#"start: "call " args
args: %json { "x-guidance": { "whitespace_flexible": false }, "type": "object", "properties": { "city": { "type": "string", "maxLength": 12 } }, "required": ["city"], "additionalProperties": false }"#;

fn cases() -> Vec<(&'static str, StructuredOutput)> {
    vec![
        (
            "What is the phone number?",
            StructuredOutput::Regex(r"[0-9]{3}-[0-9]{4}".into()),
        ),
        (
            "Is the sky blue?",
            StructuredOutput::Choice(vec!["yes".into(), "no".into()]),
        ),
        (
            "Describe a person as JSON.",
            StructuredOutput::JsonSchema(PERSON.into()),
        ),
        (
            "Call the weather tool for Paris.",
            StructuredOutput::Lark(LARK.into()),
        ),
    ]
}

fn check(i: usize, o: &GenerateOutput) {
    assert_eq!(
        o.finish_reason,
        FinishReason::Stop,
        "case {i}: {:?}",
        o.text
    );
    let t = o.text.as_str();
    match i {
        0 => assert!(
            t.len() == 8
                && t.bytes()
                    .enumerate()
                    .all(|(k, c)| (k == 3) == (c == b'-') && (k == 3 || c.is_ascii_digit())),
            "{t:?}"
        ),
        1 => assert!(t == "yes" || t == "no", "{t:?}"),
        2 => {
            let v: serde_json::Value = serde_json::from_str(t).expect(t);
            assert!(v["age"].is_u64() && v["name"].is_string(), "{t:?}");
        }
        _ => {
            let v: serde_json::Value =
                serde_json::from_str(t.strip_prefix("call ").expect(t)).expect(t);
            assert!(v["city"].is_string(), "{t:?}");
        }
    }
}

fn run<B: Backend>(mut e: LlmEngine<B>, files: &ModelFiles) -> Vec<GenerateOutput> {
    let tok = files.tokenizer.as_ref().unwrap();
    let reqs = cases()
        .into_iter()
        .map(|(p, c)| {
            let text = tok
                .chat_template()
                .unwrap()
                .apply(&[ChatMessage::new("user", p)], true)
                .unwrap();
            GenerateRequest {
                prompt_token_ids: tok.encode(&text, false).unwrap(),
                params: SamplingParams {
                    structured: Some(c),
                    ..SamplingParams::greedy(60)
                },
            }
        })
        .collect();
    e.generate(reqs, &mut |_| {}).unwrap()
}

/// The default model, or (where it is missing) a tiny Llama with dummy
/// weights and SmolLM2's vocabulary and tokenizer.
fn model_files() -> ModelFiles {
    let path = repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if path.exists() {
        return open_model(&OpenOptions {
            model: Some(path),
            ..Default::default()
        })
        .unwrap();
    }
    eprintln!(
        "notice: {} missing: a tiny dummy-weight Llama with SmolLM2's tokenizer instead",
        path.display()
    );
    let root = repo_root().join("tests/golden");
    let mut config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("tiny-llama/config.json")).unwrap(),
    )
    .unwrap();
    config["vocab_size"] = 49152.into();
    config["bos_token_id"] = 1.into();
    config["eos_token_id"] = 2.into();
    config["max_position_embeddings"] = 1024.into();
    let dir = std::env::temp_dir().join(format!("pagoda-cuda-structured-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config_path = dir.join("config.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    open_model(&OpenOptions {
        config: Some(config_path),
        dummy_weights: true,
        tokenizer: Some(root.join("smollm2-tokenizer")),
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn constrained_generation_on_the_device_satisfies_every_constraint() {
    let Some(first) = gpu() else { return };
    let files = model_files();
    let sched = SchedulerConfig {
        block_size: BLOCK_SIZE,
        num_blocks: 128,
        max_num_batched_tokens: 2048,
        max_num_seqs: 8,
        max_model_len: 512,
        enable_prefix_caching: true,
    };
    let cpu = CpuBackend::new(CpuOptions {
        threads: 2,
        weight_dtype: WeightDtype::F16,
    })
    .unwrap();
    let r = runner(cpu, &files.config, files.weights.as_ref(), sched.num_blocks);
    let want = run(
        LlmEngine::new(r, files.tokenizer.clone(), sched.clone()).unwrap(),
        &files,
    );
    for (i, o) in want.iter().enumerate() {
        check(i, o);
    }
    let mut dev = Some(first);
    for graphs in [false, true] {
        let Some(g) = dev.take().or_else(gpu) else {
            return;
        };
        let mut r = runner(g, &files.config, files.weights.as_ref(), sched.num_blocks);
        if graphs {
            r.capture_decode_graphs(sched.max_num_seqs, sched.max_model_len)
                .unwrap();
        }
        let e = LlmEngine::new(r, files.tokenizer.clone(), sched.clone()).unwrap();
        let got = run(e, &files);
        for (i, (o, w)) in got.iter().zip(&want).enumerate() {
            check(i, o);
            if o.text != w.text {
                eprintln!(
                    "graphs {graphs}, case {i}: device {:?}, cpu {:?}",
                    o.text, w.text
                );
            }
        }
    }
}
