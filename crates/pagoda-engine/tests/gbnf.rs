//! GBNF grammars (tests/data/gbnf/: JSON, arithmetic, a list, chess
//! moves) constraining the default model (CPU, greedy): every output
//! parses under its grammar, checked by small hand-written recognizers
//! independent of the translation (a text cut by max_tokens is checked up
//! to its last complete line); a bad grammar is refused with its position.

mod common;

use common::*;
use pagoda_core::{FinishReason, SamplingParams, StructuredOutput};
use pagoda_engine::{EngineError, EngineRequest, GenerateRequest, LlmEngine};
use pagoda_kernels::cpu::{CpuBackend, WeightDtype};
use pagoda_model::open::{open_model, OpenOptions};
use pagoda_model::tokenizer::{ChatMessage, Tokenizer};
use std::sync::Arc;

fn engine() -> (LlmEngine<CpuBackend>, Arc<Tokenizer>) {
    let files = open_model(&OpenOptions {
        model: Some(default_model()),
        ..Default::default()
    })
    .unwrap();
    let runner = cpu_runner(&files.config, files.weights.as_ref(), WeightDtype::F16, 256);
    let tok = files.tokenizer.unwrap();
    let e = LlmEngine::new(runner, Some(tok.clone()), scheduler_config(256, 2048)).unwrap();
    (e, tok)
}

fn prompt(tok: &Tokenizer, text: &str) -> Vec<u32> {
    let t = tok
        .chat_template()
        .unwrap()
        .apply(&[ChatMessage::new("user", text)], true)
        .unwrap();
    tok.encode(&t, false).unwrap()
}

/// The lines of `text` that are complete (all of them when `done`).
fn lines(text: &str, done: bool) -> Vec<&str> {
    let mut v: Vec<&str> = text.split('\n').collect();
    let last = v.pop().unwrap_or_default();
    assert!(!done || last.is_empty(), "{text:?} must end with a newline");
    v
}

/// `sum " = " number` (the arithmetic grammar's equation).
fn equation(l: &str) -> bool {
    let Some((lhs, rhs)) = l.rsplit_once(" = ") else {
        return false;
    };
    let mut p = lhs.as_bytes();
    sum(&mut p) && p.is_empty() && number(&mut rhs.as_bytes()) && {
        let mut r = rhs.as_bytes();
        number(&mut r) && r.is_empty()
    }
}

fn sum(p: &mut &[u8]) -> bool {
    chain(p, b"-+", product)
}

fn product(p: &mut &[u8]) -> bool {
    chain(p, b"*/", factor)
}

/// `item (" "? op " "? item)*`.
fn chain(p: &mut &[u8], ops: &[u8], item: fn(&mut &[u8]) -> bool) -> bool {
    if !item(p) {
        return false;
    }
    loop {
        let mut q = *p;
        q = q.strip_prefix(b" ").unwrap_or(q);
        let Some((&op, rest)) = q.split_first() else {
            return true;
        };
        if !ops.contains(&op) {
            return true;
        }
        q = rest.strip_prefix(b" ").unwrap_or(rest);
        if !item(&mut q) {
            return true; // not this rule's continuation
        }
        *p = q;
    }
}

fn factor(p: &mut &[u8]) -> bool {
    if let Some(rest) = p.strip_prefix(b"(") {
        let mut q = rest;
        if sum(&mut q) {
            if let Some(r) = q.strip_prefix(b")") {
                *p = r;
                return true;
            }
        }
        return false;
    }
    if p.first().is_some_and(u8::is_ascii_lowercase) {
        let n = p
            .iter()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || **c == b'_')
            .count();
        *p = &p[n..];
        return true;
    }
    number(p)
}

fn number(p: &mut &[u8]) -> bool {
    let q = p.strip_prefix(b"-").unwrap_or(p);
    let n = q.iter().take_while(|c| c.is_ascii_digit()).count();
    if n == 0 {
        return false;
    }
    *p = &q[n..];
    true
}

/// `[1-9][0-9]{0,2} ". " move " " move`.
fn chess_turn(l: &str) -> bool {
    let Some((num, moves)) = l.split_once(". ") else {
        return false;
    };
    let num_ok = (1..=3).contains(&num.len())
        && num.bytes().all(|c| c.is_ascii_digit())
        && !num.starts_with('0');
    let m: Vec<&str> = moves.split(' ').collect();
    num_ok && m.len() == 2 && m.iter().all(|s| chess_move(s))
}

fn chess_move(s: &str) -> bool {
    let s = s.strip_suffix(['+', '#']).unwrap_or(s);
    if s == "O-O" || s == "O-O-O" {
        return true;
    }
    let b = s.as_bytes();
    let file = |c: u8| (b'a'..=b'h').contains(&c);
    let rank = |c: u8| (b'1'..=b'8').contains(&c);
    let square = |t: &[u8]| t.len() == 2 && file(t[0]) && rank(t[1]);
    if let Some((&p, rest)) = b.split_first().filter(|(p, _)| b"KQRBN".contains(p)) {
        let _ = p;
        // file? rank? "x"? square
        let n = rest.len();
        if n < 2 || !square(&rest[n - 2..]) {
            return false;
        }
        let mut mid = &rest[..n - 2];
        mid = mid.strip_suffix(b"x").unwrap_or(mid);
        return match mid {
            [] => true,
            [a] => file(*a) || rank(*a),
            [a, r] => file(*a) && rank(*r),
            _ => false,
        };
    }
    let (body, promo) = match b {
        [head @ .., b'=', q] if b"QRBN".contains(q) => (head, true),
        _ => (b, false),
    };
    let _ = promo;
    match body {
        [s0, s1] => square(&[*s0, *s1]),
        [f, b'x', s0, s1] => file(*f) && square(&[*s0, *s1]),
        _ => false,
    }
}

#[test]
fn gbnf_grammars_constrain_the_default_model() {
    let (mut e, tok) = engine();
    let grammar = |name: &str| {
        let path = format!("{}/tests/data/gbnf/{name}.gbnf", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(path).unwrap()
    };
    let cases = [
        ("json", "Describe a cat as a JSON object."),
        ("arithmetic", "Write three sums with their results."),
        ("list", "List three fruits."),
        ("chess", "Write the first moves of a chess game."),
    ];
    let reqs = cases
        .iter()
        .map(|(g, p)| GenerateRequest {
            prompt_token_ids: prompt(&tok, p),
            params: SamplingParams {
                structured: Some(StructuredOutput::Gbnf(grammar(g))),
                ..SamplingParams::greedy(64)
            },
        })
        .collect();
    let out = e.generate(reqs, &mut |_| {}).unwrap();
    for ((name, _), o) in cases.iter().zip(&out) {
        let t = &o.text;
        let done = o.finish_reason == FinishReason::Stop;
        eprintln!("{name}: {t:?} ({:?})", o.finish_reason);
        match *name {
            "json" => {
                assert!(t.starts_with('{'), "{t:?}");
                if done {
                    let v: serde_json::Value = serde_json::from_str(t).expect(t);
                    assert!(v.is_object());
                }
            }
            "arithmetic" => {
                let ls = lines(t, done);
                assert!(ls.iter().all(|l| equation(l)), "{t:?}");
            }
            "list" => {
                assert!(t.starts_with("- "), "{t:?}");
                let ls = lines(t, done);
                assert!(
                    ls.iter().all(|l| l.len() > 2 && l.starts_with("- ")),
                    "{t:?}"
                );
            }
            _ => {
                let ls = lines(t, done);
                assert!(!ls.is_empty(), "{t:?}");
                assert!(!done || ls.len() >= 2, "{t:?}");
                assert!(ls.iter().all(|l| chess_turn(l)), "{t:?}");
            }
        }
    }
}

#[test]
fn recognizers_agree_with_the_grammars_on_examples() {
    assert!(equation("(a * b) - 4 = -2") && equation("1+2 = 3"));
    assert!(!equation("1+ = 3") && !equation("1+2=3"));
    assert!(chess_turn("1. e4 e5") && chess_turn("12. Nbxd2 O-O-O+"));
    assert!(chess_turn("3. exd5 a1=Q#") && chess_turn("4. R1a3 Qh4"));
    assert!(!chess_turn("1. e9 e5") && !chess_turn("0. e4 e5") && !chess_turn("1. e4"));
}

#[test]
fn a_bad_gbnf_grammar_is_refused_with_its_position() {
    let (mut e, tok) = engine();
    let r = e.add_request(EngineRequest {
        prompt_token_ids: prompt(&tok, "hi"),
        params: SamplingParams {
            structured: Some(StructuredOutput::Gbnf("root ::= item\nitem ::= [a-".into())),
            ..SamplingParams::greedy(4)
        },
        logprobs: None,
    });
    match r {
        Err(EngineError::InvalidRequest(m)) => {
            assert!(m.contains("invalid grammar") && m.contains("line 2"), "{m}")
        }
        other => panic!("{other:?}"),
    }
}
