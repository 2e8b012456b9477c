//! Structured outputs on the default model (CPU, greedy): JSON under a
//! schema parses and holds the schema's fields, regexes and choices are
//! honoured exactly, Lark grammars with embedded JSON schemas work, every
//! output ends by the grammar's completion (not by max_tokens), a batch
//! squeezed into few KV blocks (distinct prompts, so requests are preempted and recomputed)
//! still gives complete documents, and bad constraints are refused with
//! their kind named.

mod common;

use common::*;
use pagoda_core::{FinishReason, SamplingParams, StructuredOutput};
use pagoda_engine::{EngineError, EngineRequest, GenerateOutput, GenerateRequest, LlmEngine};
use pagoda_kernels::cpu::CpuBackend;
use pagoda_model::open::{open_model, OpenOptions};
use pagoda_model::tokenizer::{ChatMessage, Tokenizer};

fn prompt(tok: &Tokenizer, text: &str) -> Vec<u32> {
    let t = tok
        .chat_template()
        .unwrap()
        .apply(&[ChatMessage::new("user", text)], true)
        .unwrap();
    tok.encode(&t, false).unwrap()
}

fn run(
    e: &mut LlmEngine<CpuBackend>,
    tok: &Tokenizer,
    cases: &[(&str, StructuredOutput)],
    max_tokens: usize,
) -> Vec<GenerateOutput> {
    let reqs = cases
        .iter()
        .map(|(p, c)| GenerateRequest {
            prompt_token_ids: prompt(tok, p),
            params: SamplingParams {
                structured: Some(c.clone()),
                ..SamplingParams::greedy(max_tokens)
            },
        })
        .collect();
    e.generate(reqs, &mut |_| {}).unwrap()
}

const PERSON: &str = r#"{"type":"object","properties":{
  "name":{"type":"string","maxLength":16},
  "age":{"type":"integer","minimum":0,"maximum":120},
  "tags":{"type":"array","items":{"enum":["a","b","c"]},"minItems":1,"maxItems":3}},
  "required":["name","age","tags"],"additionalProperties":false}"#;

#[test]
fn json_schema_and_json_object_outputs_parse_and_are_complete() {
    let (mut e, tok) = default_engine(256);
    let out = run(
        &mut e,
        &tok,
        &[
            (
                "Describe a person as JSON.",
                StructuredOutput::JsonSchema(PERSON.into()),
            ),
            (
                "Give me a JSON object about cats.",
                StructuredOutput::JsonObject,
            ),
        ],
        120,
    );
    let v: serde_json::Value = serde_json::from_str(&out[0].text).unwrap_or_else(|err| {
        panic!("{err}: {:?}", out[0].text);
    });
    assert_eq!(
        out[0].finish_reason,
        FinishReason::Stop,
        "{:?}",
        out[0].text
    );
    assert!(v["name"].as_str().unwrap().chars().count() <= 16);
    let age = v["age"].as_i64().unwrap();
    assert!((0..=120).contains(&age));
    let tags = v["tags"].as_array().unwrap();
    assert!((1..=3).contains(&tags.len()));
    assert!(tags
        .iter()
        .all(|t| ["a", "b", "c"].contains(&t.as_str().unwrap())));
    assert_eq!(v.as_object().unwrap().len(), 3);
    // JSON mode: an object, however the model fills it (it may run out
    // of tokens, so only the opening is certain).
    assert!(out[1].text.starts_with('{'), "{:?}", out[1].text);
    if out[1].finish_reason == FinishReason::Stop {
        assert!(serde_json::from_str::<serde_json::Value>(&out[1].text)
            .unwrap()
            .is_object());
    }
}

#[test]
fn regex_choice_and_lark_are_honoured_exactly() {
    let (mut e, tok) = default_engine(256);
    let lark = r#"start: "call " args
args: %json { "type": "object", "properties": { "city": { "type": "string", "maxLength": 12 } }, "required": ["city"], "additionalProperties": false }"#;
    let out = run(
        &mut e,
        &tok,
        &[
            (
                "What is the phone number?",
                StructuredOutput::Regex(r"\d{3}-\d{4}".into()),
            ),
            (
                "Is the sky blue?",
                StructuredOutput::Choice(vec!["yes".into(), "no".into(), "it \"depends\"".into()]),
            ),
            (
                "Call the weather tool for Paris.",
                StructuredOutput::Lark(lark.into()),
            ),
        ],
        40,
    );
    let phone = &out[0].text;
    assert_eq!(out[0].finish_reason, FinishReason::Stop);
    let b = phone.as_bytes();
    assert!(
        b.len() == 8
            && b[3] == b'-'
            && b.iter()
                .enumerate()
                .all(|(i, c)| i == 3 || c.is_ascii_digit()),
        "{phone:?}"
    );
    assert!(
        ["yes", "no", "it \"depends\""].contains(&out[1].text.as_str()),
        "{:?}",
        out[1].text
    );
    assert_eq!(out[1].finish_reason, FinishReason::Stop);
    let call = out[2].text.strip_prefix("call ").expect(&out[2].text);
    let v: serde_json::Value = serde_json::from_str(call).unwrap();
    assert!(v["city"].as_str().unwrap().chars().count() <= 12);
    assert_eq!(out[2].finish_reason, FinishReason::Stop);
}

#[test]
fn constrained_requests_survive_preemption() {
    // 8 requests of ~40 prompt tokens + up to 100 output tokens in 24
    // blocks of 16: they cannot all run at once, so some are preempted and
    // recomputed; each must still give a complete, valid document.
    let (mut e, tok) = default_engine(24);
    let prompts: Vec<String> = (0..8)
        .map(|i| format!("Describe person number {i} of my team as JSON."))
        .collect();
    let cases: Vec<(&str, StructuredOutput)> = prompts
        .iter()
        .map(|p| (p.as_str(), StructuredOutput::JsonSchema(PERSON.into())))
        .collect();
    let out = run(&mut e, &tok, &cases, 100);
    assert!(
        e.stats().counters.num_preemptions > 0,
        "no preemption happened"
    );
    for o in &out {
        assert_eq!(o.finish_reason, FinishReason::Stop, "{:?}", o.text);
        let v: serde_json::Value = serde_json::from_str(&o.text).unwrap();
        assert!(v["age"].is_i64());
    }
    let (median, p99) = e.mask_stats().unwrap().median_p99().unwrap();
    assert!(median > 0.0 && p99 >= median);
}

#[test]
fn bad_constraints_are_refused_naming_what_is_wrong() {
    let (mut e, tok) = default_engine(32);
    let bad = [
        (
            StructuredOutput::JsonSchema("{\"type\": ".into()),
            "json_schema",
        ),
        (
            StructuredOutput::JsonSchema(r#"{"type":"integer","minimum":5,"maximum":1}"#.into()),
            "json_schema",
        ),
        (StructuredOutput::Regex("(unclosed".into()), "regex"),
        (StructuredOutput::Choice(vec![]), "choice"),
        (
            StructuredOutput::Lark("start: missing_rule".into()),
            "grammar",
        ),
        (StructuredOutput::Gbnf("root ::= (\"x\"".into()), "grammar"),
    ];
    for (c, kind) in bad {
        let r = e.add_request(EngineRequest {
            prompt_token_ids: prompt(&tok, "hi"),
            params: SamplingParams {
                structured: Some(c.clone()),
                ..SamplingParams::greedy(4)
            },
            logprobs: None,
        });
        match r {
            Err(EngineError::InvalidRequest(m)) => {
                assert!(m.contains(&format!("invalid {kind}")), "{c:?}: {m}")
            }
            other => panic!("{c:?}: {other:?}"),
        }
    }
    assert!(!e.has_unfinished_requests());
}

#[test]
fn an_end_of_sequence_id_outside_the_vocabulary_is_an_error() {
    let files = open_model(&OpenOptions {
        model: Some(default_model()),
        ..Default::default()
    })
    .unwrap();
    let tok = files.tokenizer.unwrap();
    let e = pagoda_engine::structured::GrammarCompiler::new(tok.clone(), 49152, &[151645])
        .err()
        .expect("an out-of-range end-of-sequence id must be refused");
    assert!(e.message.contains("151645"), "{}", e.message);
    assert!(pagoda_engine::structured::GrammarCompiler::new(tok, 49152, &[2]).is_ok());
}

#[test]
fn a_compiler_built_while_the_model_loaded_gives_the_same_outputs() {
    use pagoda_engine::engine::stop_token_ids;
    use pagoda_engine::structured::StructuredBuild;
    let cases = [
        (
            "Describe a person as JSON.",
            StructuredOutput::JsonSchema(PERSON.into()),
        ),
        (
            "What is the phone number?",
            StructuredOutput::Regex(r"\d{3}-\d{4}".into()),
        ),
    ];
    let (mut e, tok) = default_engine(256);
    let want: Vec<String> = run(&mut e, &tok, &cases, 60)
        .into_iter()
        .map(|o| o.text)
        .collect();
    let (vocab, eos) = {
        let c = e.runner().config();
        (c.vocab_size, stop_token_ids(&c.eos_token_ids, Some(&tok)))
    };
    // Built for this model, or for another vocabulary (dropped, and the
    // engine builds its own at the first constrained request).
    for (v, ids) in [(vocab, eos.clone()), (vocab + 1, eos.clone())] {
        let (mut e, t) = default_engine(256);
        e.set_structured_build(StructuredBuild::start(tok.clone(), v, ids));
        let got: Vec<String> = run(&mut e, &t, &cases, 60)
            .into_iter()
            .map(|o| o.text)
            .collect();
        assert_eq!(got, want, "built for {v} ids");
    }
}
