//! Test helpers: a parser must give the same pieces however its input is split.

use super::{merge, parse_all, ParsedCall, Piece, TextParser};

pub fn content(s: &str) -> Piece {
    Piece::Content(s.to_string())
}

pub fn reasoning(s: &str) -> Piece {
    Piece::Reasoning(s.to_string())
}

pub fn call(name: &str, arguments: &str) -> Piece {
    Piece::Call(ParsedCall {
        name: name.to_string(),
        arguments: arguments.to_string(),
    })
}

/// Feeds `parts` one by one, then finishes; merged pieces.
pub fn feed(parser: &mut dyn TextParser, parts: &[&str]) -> Vec<Piece> {
    let mut out = Vec::new();
    for p in parts {
        parser.push(p, &mut out);
    }
    parser.finish(&mut out);
    merge(out)
}

/// Asserts that `text` parses to `expected` whole, split in two at every
/// character boundary, and fed one character at a time.
pub fn check_splits(new: &dyn Fn() -> Box<dyn TextParser>, text: &str, expected: &[Piece]) {
    assert_eq!(parse_all(new().as_mut(), text), expected, "whole: {text:?}");
    for i in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
        let got = feed(new().as_mut(), &[&text[..i], &text[i..]]);
        assert_eq!(got, expected, "split at {i}: {text:?}");
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let parts: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(
        feed(new().as_mut(), &parts),
        expected,
        "char by char: {text:?}"
    );
}
