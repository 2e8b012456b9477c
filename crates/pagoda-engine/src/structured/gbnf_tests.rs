//! Tests of the GBNF translation: exact Lark output for each construct,
//! errors with their positions, and grammars of the kinds llama.cpp ships
//! as samples (tests/data/gbnf/) compiled by llguidance and matched against texts over a
//! byte vocabulary.

use super::*;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::ApproximateTokEnv;
use llguidance::{Matcher, ParserFactory};

fn lark(g: &str) -> String {
    gbnf_to_lark(g).unwrap_or_else(|e| panic!("{e}\n{g}"))
}

fn err(g: &str) -> GbnfError {
    gbnf_to_lark(g).expect_err(g)
}

/// Whether the grammar derives exactly `text`.
fn accepts(gbnf: &str, text: &str) -> bool {
    let env = ApproximateTokEnv::single_byte_env();
    let mut f = ParserFactory::new_simple(&env).unwrap();
    f.quiet();
    let parser = f
        .create_parser(TopLevelGrammar::from_lark(lark(gbnf)))
        .unwrap_or_else(|e| panic!("{e}\n{}", lark(gbnf)));
    let mut m = Matcher::new(Ok(parser));
    let toks = env.tokenize_bytes(text.as_bytes());
    if m.validate_tokens(&toks).unwrap() != toks.len() {
        return false;
    }
    m.consume_tokens(&toks).unwrap();
    m.is_accepting().unwrap()
}

#[test]
fn rules_alternatives_groups_and_operators() {
    assert_eq!(
        lark("root ::= greeting (\" \" name)* \"!\"?\ngreeting ::= \"hi\" | \"hello\"\nname ::= [a-z]+"),
        "start: r_greeting (\" \" r_name)* \"!\"?\nr_greeting: \"hi\" | \"hello\"\nr_name: /[\\x{61}-\\x{7A}]/+\n"
    );
    // The start rule comes first whatever the order; names are made lowercase Lark rules.
    assert_eq!(
        lark("Item-A ::= \"a\" # comment\nroot ::= Item-A\n"),
        "start: r_item-a\nr_item-a: \"a\"\n"
    );
    // A rule goes on after `::=`, `|` and inside groups; an empty
    // alternative is the empty string.
    assert_eq!(
        lark("root ::=\n  \"(\" (ws\n  \")\")\nws ::= |\n \" \" ws"),
        "start: \"(\" (r_ws \")\")\nr_ws: \"\" | \" \" r_ws\n"
    );
    assert_eq!(
        lark("root ::= \"a\"\n     | \"b\" # two\n\n  | \"c\"\nx ::= \"d\""),
        "start: \"a\" | \"b\" | \"c\"\nr_x: \"d\"\n"
    );
    let e = err("root ::= \"a\"\n  \"b\"");
    assert_eq!((e.line, e.column), (2, 3), "{e}");
}

#[test]
fn repetition_counts() {
    assert_eq!(
        lark("root ::= \"a\"{3} \"b\"{2,} \"c\"{1,4} \"d\"{0} \"e\"{0,2}"),
        "start: \"a\"{3} \"b\"{2,} \"c\"{1,4} \"e\"{0,2}\n"
    );
    // A second operator applies to the first's result.
    assert_eq!(lark("root ::= \"a\"{2}?"), "start: (\"a\"{2})?\n");
    assert!(accepts("root ::= [0-9]{2,3}", "123"));
    assert!(!accepts("root ::= [0-9]{2,3}", "1"));
    assert!(!accepts("root ::= [0-9]{2,3}", "1234"));
    assert!(accepts("root ::= \"x\"{3}", "xxx"));
    assert!(accepts("root ::= \"x\"{2,}", "xxxxx"));
    assert!(accepts("root ::= \"a\" \"b\"{0} \"c\"", "ac"));
}

#[test]
fn literal_and_class_escapes() {
    assert_eq!(
        lark(r#"root ::= "a\n\t\"\\\x41\u00e9\U0001F600""#),
        "start: \"a\\n\\t\\\"\\\\Aé😀\"\n"
    );
    assert_eq!(
        lark(r#"root ::= [^"\\\x00-\x1F] [\]\-] ."#),
        "start: /[^\\x{22}\\x{5C}\\x{0}-\\x{1F}]/ /[\\x{5D}\\x{2D}]/ /(?s:.)/\n"
    );
    assert!(accepts(r#"root ::= "é" [\u00e0-\u00ff] [^a]"#, "éü\n"));
    assert!(!accepts(r#"root ::= [^a]"#, "a"));
    assert!(accepts("root ::= . .", "a\n"));
    assert!(accepts(r#"root ::= "\x2F" [/]"#, "//"));
}

#[test]
fn errors_say_where() {
    let e = err("root ::= \"a\"\nfoo \"b\"");
    assert_eq!((e.line, e.column), (2, 1), "{e}");
    assert!(e.message.contains("::="), "{e}");
    let e = err("root ::= \"abc");
    assert!(e.message.contains("unterminated"), "{e}");
    let e = err("root ::= a\nb ::= \"x\"");
    assert_eq!((e.line, e.column), (1, 10), "{e}");
    assert!(e.message.contains("`a`"), "{e}");
    let e = err("a ::= \"x\"");
    assert!(e.message.contains("root"), "{e}");
    let e = err("root ::= \"\\q\"");
    assert_eq!((e.line, e.column), (1, 11), "{e}");
    let e = err("root ::= \"a\"\nroot ::= \"b\"");
    assert!(e.message.contains("twice"), "{e}");
    let e = err("root ::= [z-a]");
    assert!(e.message.contains("order"), "{e}");
    let e = err("root ::= \"a\"{3,1}");
    assert!(e.message.contains("minimum"), "{e}");
    let e = err("root ::= (\"a\"");
    assert!(e.message.contains(")"), "{e}");
    let e = err("root ::= \"\\uD800\"");
    assert!(e.message.contains("code point"), "{e}");
    let e = err("root ::= []");
    assert!(e.message.contains("empty"), "{e}");
    let e = err("root ::= \"a\" @");
    assert_eq!((e.line, e.column), (1, 14), "{e}");
    // Never a panic on truncated input.
    for g in [
        "root ::= \"\\",
        "root ::= [\\",
        "root ::= \"a\"{",
        "root ::= [a-",
        "root ::",
    ] {
        assert!(gbnf_to_lark(g).is_err(), "{g}");
    }
}

/// JSON values in an object (llama.cpp ships a json.gbnf of this kind).
const JSON: &str = include_str!("../../tests/data/gbnf/json.gbnf");

/// Equations of arithmetic expressions.
const ARITHMETIC: &str = include_str!("../../tests/data/gbnf/arithmetic.gbnf");

/// A list of dashed lines.
const LIST: &str = include_str!("../../tests/data/gbnf/list.gbnf");

/// Chess moves in algebraic notation.
const CHESS: &str = include_str!("../../tests/data/gbnf/chess.gbnf");

#[test]
fn sample_grammars_compile_and_match() {
    for (g, yes, no) in [
        (
            JSON,
            vec![
                "{}",
                "{\"a\": 1, \"b\": [true, null, \"x\\n\"], \"c\": {\"d\": -2.5}}",
            ],
            vec!["{", "{\"a\" 1}", "[1]", "{\"a\": 01x}"],
        ),
        (
            ARITHMETIC,
            vec!["1+2 = 3\n", "(a * b) - 4 = -2\nx_1/2 = 7\n"],
            vec!["1+ = 3\n", "1+2\n", "1+2=3\n"],
        ),
        (LIST, vec!["- a\n- bc d\n"], vec!["- \n", "* a\n"]),
        (
            CHESS,
            vec![
                "1. e4 e5\n2. Nf3 Nc6\n",
                "1. e4 d5\n2. exd5 Qxd5\n10. O-O-O+ a1=Q#\n",
            ],
            vec!["1. e4 e5\n", "1. e9 e5\n2. a3 a4\n"],
        ),
    ] {
        for t in yes {
            assert!(accepts(g, t), "{t:?} should match\n{}", lark(g));
        }
        for t in no {
            assert!(!accepts(g, t), "{t:?} should not match\n{}", lark(g));
        }
    }
}
