//! GBNF (llama.cpp's grammar format) translated into llguidance's Lark
//! dialect, which the grammar compiler reads.
//!
//! Accepted GBNF: rules `name ::= body` (names of letters, digits, `-` and
//! `_`; a rule's body ends at a newline outside parentheses, and may go
//! on to the next line after `::=` or `|`, or on a line starting with
//! `|`), alternatives `|`
//! (an alternative may be empty), sequences, groups `( )`, the postfix
//! operators `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, string literals
//! `"..."`, character classes `[a-z0-9_]` and negated ones `[^"\\]`, `.`
//! (any character, newline included), comments from `#` to the end of the
//! line; escapes `\n \t \r \\ \" \[ \] \- \^ \xHH \uHHHH \UHHHHHHHH` in
//! literals and classes. `root` is the start rule.
//!
//! The mapping: `root` becomes `start`; every other rule `r_<name>`
//! (lowercase, unique); literals become JSON-escaped Lark strings;
//! classes and `.` become one-character regexes whose characters are all
//! written as `\x{..}`; repetitions keep their counts (`{0}` and `{0,0}`
//! match the empty string).
//!
//! Guarantees: the translation is pure and never panics; a syntax error,
//! an undefined or twice-defined rule, a missing `root` or an invalid code
//! point is a [`GbnfError`] saying where (line and column, 1-based).

use std::collections::HashMap;
use std::fmt::Write as _;

/// Largest repetition count accepted in `{m,n}`.
const MAX_REPEAT: u32 = 10_000;

/// A GBNF grammar that cannot be translated, and where.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("GBNF line {line}, column {column}: {message}")]
pub struct GbnfError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Translates a GBNF grammar into llguidance's Lark dialect.
pub fn gbnf_to_lark(src: &str) -> Result<String, GbnfError> {
    let mut p = Parser { src, pos: 0 };
    let mut rules: Vec<(String, usize, Alt)> = Vec::new();
    p.skip_space();
    while !p.at_end() {
        let at = p.pos;
        let name = p
            .name()
            .ok_or_else(|| p.err_at(at, "expected a rule name"))?;
        p.skip_space();
        if !p.eat("::=") {
            return Err(p.err_at(at, &format!("expected `::=` after the rule name `{name}`")));
        }
        let body = p.alternates(0)?;
        if rules.iter().any(|(n, _, _)| *n == name) {
            return Err(p.err_at(at, &format!("rule `{name}` is defined twice")));
        }
        rules.push((name, at, body));
        p.skip_space();
    }
    if !rules.iter().any(|(n, _, _)| n == "root") {
        return Err(p.err_at(src.len(), "the grammar has no `root` rule"));
    }
    let names = lark_names(rules.iter().map(|(n, _, _)| n.as_str()));
    let mut out = String::new();
    // The start rule first, then the others in their order.
    let order = rules
        .iter()
        .filter(|r| r.0 == "root")
        .chain(rules.iter().filter(|r| r.0 != "root"));
    for (name, _, body) in order {
        let _ = write!(out, "{}: ", names[name.as_str()]);
        emit_alt(body, &names, &mut out)
            .map_err(|(at, n)| p.err_at(at, &format!("rule `{n}` is used but never defined")))?;
        out.push('\n');
    }
    Ok(out)
}

/// Lark names for the GBNF rule names: `start` for `root`, else `r_`
/// and the name in lowercase, with a number where two would collide.
fn lark_names<'a>(gbnf: impl Iterator<Item = &'a str>) -> HashMap<&'a str, String> {
    let mut names = HashMap::new();
    let mut used = std::collections::HashSet::new();
    for n in gbnf {
        let lark = if n == "root" {
            "start".to_string()
        } else {
            let base: String = n
                .chars()
                .map(|c| match c.to_ascii_lowercase() {
                    c @ ('a'..='z' | '0'..='9' | '-') => c,
                    _ => '_',
                })
                .collect();
            let mut cand = format!("r_{base}");
            let mut i = 2;
            while used.contains(&cand) {
                cand = format!("r_{base}_{i}");
                i += 1;
            }
            cand
        };
        used.insert(lark.clone());
        names.insert(n, lark);
    }
    names
}

type Alt = Vec<Vec<Term>>;

#[derive(Debug)]
struct Term {
    atom: Atom,
    /// `(min, max)`; `max` `None` is unbounded; `(1, Some(1))` is plain.
    repeat: (u32, Option<u32>),
}

#[derive(Debug)]
enum Atom {
    Literal(String),
    /// Ranges of code points (inclusive), negated when the flag is set.
    Class(bool, Vec<(char, char)>),
    Any,
    /// A rule reference, with its byte offset for errors.
    Rule(String, usize),
    Group(Alt),
}

fn emit_alt(
    alt: &Alt,
    names: &HashMap<&str, String>,
    out: &mut String,
) -> Result<(), (usize, String)> {
    for (i, seq) in alt.iter().enumerate() {
        if i > 0 {
            out.push_str(" | ");
        }
        let mut wrote = false;
        for t in seq {
            if t.repeat.1 == Some(0) {
                continue; // `x{0}` matches the empty string
            }
            if wrote {
                out.push(' ');
            }
            wrote = true;
            emit_atom(&t.atom, names, out)?;
            match t.repeat {
                (1, Some(1)) => {}
                (0, Some(1)) => out.push('?'),
                (0, None) => out.push('*'),
                (1, None) => out.push('+'),
                (m, None) => {
                    let _ = write!(out, "{{{m},}}");
                }
                (m, Some(n)) if m == n => {
                    let _ = write!(out, "{{{m}}}");
                }
                (m, Some(n)) => {
                    let _ = write!(out, "{{{m},{n}}}");
                }
            }
        }
        if !wrote {
            out.push_str("\"\"");
        }
    }
    Ok(())
}

fn emit_atom(
    a: &Atom,
    names: &HashMap<&str, String>,
    out: &mut String,
) -> Result<(), (usize, String)> {
    match a {
        Atom::Literal(s) => {
            // Lark strings take JSON's escapes.
            out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into()));
        }
        Atom::Class(neg, ranges) => {
            out.push_str(if *neg { "/[^" } else { "/[" });
            for &(lo, hi) in ranges {
                let _ = write!(out, "\\x{{{:X}}}", lo as u32);
                if hi != lo {
                    let _ = write!(out, "-\\x{{{:X}}}", hi as u32);
                }
            }
            out.push_str("]/");
        }
        Atom::Any => out.push_str("/(?s:.)/"),
        Atom::Rule(n, at) => match names.get(n.as_str()) {
            Some(l) => out.push_str(l),
            None => return Err((*at, n.clone())),
        },
        Atom::Group(alt) => {
            out.push('(');
            emit_alt(alt, names, out)?;
            out.push(')');
        }
    }
    Ok(())
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn at_end(&self) -> bool {
        self.pos >= self.src.len()
    }

    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn eat(&mut self, s: &str) -> bool {
        if self.src[self.pos..].starts_with(s) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    fn err(&self, message: &str) -> GbnfError {
        self.err_at(self.pos, message)
    }

    fn err_at(&self, at: usize, message: &str) -> GbnfError {
        let before = &self.src[..at.min(self.src.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        GbnfError {
            line,
            column,
            message: message.to_string(),
        }
    }

    /// Skips whitespace (newlines included) and `#` comments.
    fn skip_space(&mut self) {
        self.skip(true);
    }

    /// Skips whitespace and comments, stopping at a newline unless
    /// `newlines` (a rule's body ends at a newline outside groups, as in
    /// llama.cpp).
    fn skip(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            if c == '#' {
                while self.peek().is_some_and(|c| c != '\n') {
                    self.bump();
                }
            } else if c == '\n' && !newlines {
                break;
            } else if c.is_whitespace() {
                self.pos += c.len_utf8();
            } else {
                break;
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            self.pos += 1;
        }
        (self.pos > start).then(|| self.src[start..self.pos].to_string())
    }

    /// Whether a new rule (`name ::=`) starts here.
    fn at_rule_start(&self) -> bool {
        let mut q = Parser {
            src: self.src,
            pos: self.pos,
        };
        q.name().is_some() && {
            q.skip_space();
            q.src[q.pos..].starts_with("::=")
        }
    }

    fn alternates(&mut self, depth: usize) -> Result<Alt, GbnfError> {
        if depth > 64 {
            return Err(self.err("groups nested too deeply"));
        }
        self.skip_space();
        let mut alt = vec![self.sequence(depth)?];
        loop {
            self.skip(depth > 0);
            // A line starting with `|` goes on with the rule's alternatives.
            let mut next = Parser {
                src: self.src,
                pos: self.pos,
            };
            next.skip_space();
            if next.peek() == Some('|') {
                self.pos = next.pos;
            }
            if !self.eat("|") {
                return Ok(alt);
            }
            self.skip_space();
            alt.push(self.sequence(depth)?);
        }
    }

    fn sequence(&mut self, depth: usize) -> Result<Vec<Term>, GbnfError> {
        let mut seq = Vec::new();
        loop {
            self.skip(depth > 0);
            let at = self.pos;
            let atom = match self.peek() {
                None | Some('|' | ')' | '\n') => return Ok(seq),
                Some(_) if self.at_rule_start() => return Ok(seq),
                Some('"') => {
                    self.pos += 1;
                    Atom::Literal(self.literal()?)
                }
                Some('[') => {
                    self.pos += 1;
                    self.class()?
                }
                Some('.') => {
                    self.pos += 1;
                    Atom::Any
                }
                Some('(') => {
                    self.pos += 1;
                    let inner = self.alternates(depth + 1)?;
                    self.skip_space();
                    if !self.eat(")") {
                        return Err(self.err("expected `)`"));
                    }
                    Atom::Group(inner)
                }
                Some(c) if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                    let n = self.name().unwrap_or_default();
                    Atom::Rule(n, at)
                }
                Some(c) => return Err(self.err(&format!("unexpected `{c}`"))),
            };
            let mut term = Term {
                atom,
                repeat: (1, Some(1)),
            };
            // Postfix operators; a second one applies to the first's result.
            loop {
                self.skip(depth > 0);
                let op = self.peek();
                if matches!(op, Some('*' | '+' | '?' | '{')) {
                    self.pos += 1;
                }
                let r = match op {
                    Some('*') => (0, None),
                    Some('+') => (1, None),
                    Some('?') => (0, Some(1)),
                    Some('{') => self.braces()?,
                    _ => break,
                };
                if term.repeat != (1, Some(1)) {
                    term = Term {
                        atom: Atom::Group(vec![vec![term]]),
                        repeat: r,
                    };
                } else {
                    term.repeat = r;
                }
            }
            seq.push(term);
        }
    }

    /// After `{`: `m}`, `m,}` or `m,n}`; leaves `pos` just past the `}`.
    fn braces(&mut self) -> Result<(u32, Option<u32>), GbnfError> {
        let at = self.pos;
        self.skip_space();
        let m = self.number()?;
        self.skip_space();
        let n = if self.eat(",") {
            self.skip_space();
            if self.peek() == Some('}') {
                None
            } else {
                Some(self.number()?)
            }
        } else {
            Some(m)
        };
        self.skip_space();
        if !self.eat("}") {
            return Err(self.err("expected `}` to close the repetition"));
        }
        if n.is_some_and(|n| n < m) {
            return Err(self.err_at(at, "repetition maximum below its minimum"));
        }
        Ok((m, n))
    }

    fn number(&mut self) -> Result<u32, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let digits = &self.src[start..self.pos];
        if digits.is_empty() {
            return Err(self.err("expected a number"));
        }
        match digits.parse::<u32>() {
            Ok(n) if n <= MAX_REPEAT => Ok(n),
            _ => Err(self.err_at(start, &format!("repetition count above {MAX_REPEAT}"))),
        }
    }

    /// After `"`: the literal's text up to the closing quote.
    fn literal(&mut self) -> Result<String, GbnfError> {
        let open = self.pos - 1;
        let mut s = String::new();
        loop {
            match self.peek() {
                None => return Err(self.err_at(open, "unterminated string literal")),
                Some('"') => {
                    self.pos += 1;
                    return Ok(s);
                }
                Some(_) => s.push(self.char_in(false)?),
            }
        }
    }

    /// After `[`: the class up to `]`.
    fn class(&mut self) -> Result<Atom, GbnfError> {
        let neg = self.eat("^");
        let mut ranges = Vec::new();
        loop {
            let at = self.pos;
            match self.peek() {
                None => return Err(self.err("unterminated character class")),
                Some(']') => {
                    self.pos += 1;
                    if ranges.is_empty() {
                        return Err(self.err_at(at, "empty character class"));
                    }
                    return Ok(Atom::Class(neg, ranges));
                }
                Some(_) => {
                    let lo = self.char_in(true)?;
                    let mut hi = lo;
                    let dash = self.src[self.pos..].starts_with('-')
                        && !self.src[self.pos..].starts_with("-]");
                    if dash {
                        self.pos += 1;
                        hi = self.char_in(true)?;
                        if hi < lo {
                            return Err(self.err_at(at, "character range out of order"));
                        }
                    }
                    ranges.push((lo, hi));
                }
            }
        }
    }

    /// One character of a literal or class, escapes decoded.
    fn char_in(&mut self, in_class: bool) -> Result<char, GbnfError> {
        let at = self.pos;
        let c = self
            .bump()
            .ok_or_else(|| self.err("unexpected end of grammar"))?;
        if c != '\\' {
            if in_class && c == '\n' {
                return Err(self.err_at(at, "unterminated character class"));
            }
            return Ok(c);
        }
        let e = self
            .bump()
            .ok_or_else(|| self.err("unexpected end of grammar"))?;
        let digits = match e {
            'n' => return Ok('\n'),
            't' => return Ok('\t'),
            'r' => return Ok('\r'),
            '\\' | '"' | '[' | ']' | '-' | '^' | '/' | '\'' => return Ok(e),
            'x' => 2,
            'u' => 4,
            'U' => 8,
            _ => return Err(self.err_at(at, &format!("unknown escape `\\{e}`"))),
        };
        let start = self.pos;
        for _ in 0..digits {
            if !self.peek().is_some_and(|c| c.is_ascii_hexdigit()) {
                return Err(self.err_at(at, &format!("`\\{e}` takes {digits} hex digits")));
            }
            self.pos += 1;
        }
        u32::from_str_radix(&self.src[start..self.pos], 16)
            .ok()
            .and_then(char::from_u32)
            .ok_or_else(|| self.err_at(at, "escape is not a Unicode code point"))
    }
}

#[cfg(test)]
#[path = "gbnf_tests.rs"]
mod tests;
