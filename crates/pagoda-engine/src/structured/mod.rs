//! Structured outputs: a request's [`StructuredOutput`] constraint compiled
//! into an llguidance matcher over the model's vocabulary, which says, step
//! by step, which tokens may come next.
//!
//! - [`GrammarCompiler`]: built once per engine (lazily, at the first
//!   constrained request) from the tokenizer's per-token bytes; compiles a
//!   constraint into a [`Guide`] or an error naming what is wrong; a
//!   constraint is compiled once, its requests' guides are copies that
//!   share a lexer per family (see [`GrammarCompiler`]).
//! - [`Guide`]: one request's matcher. Its state depends only on the
//!   request's output tokens, so it survives preemption by recompute.
//! - [`check_grammar`]: a pure check of a constraint against a byte-level
//!   vocabulary, for callers that build grammars (tool calling) and want
//!   the error early, before any request reaches the engine.
//! - `masks`: the per-step mask computation on a worker pool, overlapped
//!   with the forward pass, and the guides' advance past sampled tokens;
//!   `pipe`: that advance and the next step's masks in one job, the caller
//!   waiting for the advance only.
//!
//! Choices of this module: JSON (JSON object, JSON schema) is generated in
//! its compact form (`{"a":1,"b":[2,3]}`, no free whitespace) unless the
//! schema carries its own `x-guidance` options, so that small models cannot
//! spend their token budget on whitespace; a regex must match the whole
//! output; a choice is one of its strings exactly; Lark grammars are
//! llguidance's dialect (with `%json { ... }` schemas and `/regex/`
//! terminals embedded); GBNF (llama.cpp's format) is translated into that
//! dialect first (`gbnf`), its syntax errors reported with their line and
//! column.

pub mod gbnf;
mod masks;
mod pipe;
pub(crate) mod step;

pub use masks::{
    thread_cpu_secs, Advanced, MaskJob, MaskResult, MaskStats, MaskWorkers, FAMILIES_PER_WORKER,
};
pub use pipe::{PipeJob, PipeResult};
pub use step::{mask_threads, mask_threads_for, StructuredBuild};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{self, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use pagoda_core::StructuredOutput;
use pagoda_model::tokenizer::Tokenizer;
use std::sync::{Arc, Mutex, OnceLock};

/// A constraint that cannot be compiled, with the reason.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid {kind}: {message}")]
pub struct StructuredError {
    /// What was given: "json_schema", "regex", "choice", "grammar".
    pub kind: &'static str,
    pub message: String,
}

/// The name users know a constraint by (the error's `kind`).
pub fn constraint_kind(c: &StructuredOutput) -> &'static str {
    match c {
        StructuredOutput::JsonObject => "json_object",
        StructuredOutput::JsonSchema(_) => "json_schema",
        StructuredOutput::Regex(_) => "regex",
        StructuredOutput::Choice(_) => "choice",
        StructuredOutput::Lark(_) | StructuredOutput::Gbnf(_) => "grammar",
    }
}

/// The llguidance grammar of a constraint (no vocabulary needed yet).
pub fn top_level_grammar(c: &StructuredOutput) -> Result<TopLevelGrammar, StructuredError> {
    let err = |message: String| StructuredError {
        kind: constraint_kind(c),
        message,
    };
    Ok(match c {
        StructuredOutput::JsonObject => {
            TopLevelGrammar::from_json_schema(compact_json(serde_json::json!({"type": "object"})))
        }
        StructuredOutput::JsonSchema(s) => {
            let schema: serde_json::Value = serde_json::from_str(s)
                .map_err(|e| err(format!("the schema is not valid JSON: {e}")))?;
            if !(schema.is_object() || schema.is_boolean()) {
                return Err(err("a JSON schema is an object or a boolean".into()));
            }
            TopLevelGrammar::from_json_schema(compact_json(schema))
        }
        StructuredOutput::Regex(r) => {
            if r.is_empty() {
                return Err(err("the regex is empty".into()));
            }
            TopLevelGrammar::from_regex(r)
        }
        StructuredOutput::Choice(options) => {
            if options.is_empty() {
                return Err(err("at least one choice is needed".into()));
            }
            if options.iter().any(|o| o.is_empty()) {
                return Err(err("a choice must not be empty".into()));
            }
            // Lark string literals take JSON's escapes.
            let alts: Vec<String> = options
                .iter()
                .map(|o| serde_json::to_string(o).unwrap_or_default())
                .collect();
            TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
        }
        StructuredOutput::Lark(g) => {
            if g.trim().is_empty() {
                return Err(err("the grammar is empty".into()));
            }
            TopLevelGrammar::from_lark(g.clone())
        }
        StructuredOutput::Gbnf(g) => {
            TopLevelGrammar::from_lark(gbnf::gbnf_to_lark(g).map_err(|e| err(e.to_string()))?)
        }
    })
}

/// Puts JSON in its compact form unless the schema says otherwise.
fn compact_json(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
    }
    schema
}

/// Checks that a constraint compiles, against a vocabulary of single bytes:
/// syntax errors, unknown rules, unsatisfiable schemas and bad regexes are
/// found without a model. Pure (a small vocabulary is built once).
pub fn check_grammar(c: &StructuredOutput) -> Result<(), StructuredError> {
    static FACTORY: OnceLock<Result<ParserFactory, String>> = OnceLock::new();
    let factory = FACTORY
        .get_or_init(|| {
            let mut f = ParserFactory::new_simple(&toktrie::ApproximateTokEnv::single_byte_env())
                .map_err(|e| e.to_string())?;
            f.quiet();
            Ok(f)
        })
        .as_ref()
        .map_err(|e| StructuredError {
            kind: constraint_kind(c),
            message: format!("no grammar compiler: {e}"),
        })?;
    compile_with(factory, c).map(|_| ())
}

fn compile_with(factory: &ParserFactory, c: &StructuredOutput) -> Result<Matcher, StructuredError> {
    let grammar = top_level_grammar(c)?;
    let parser = factory
        .create_parser(grammar)
        .map_err(|e| StructuredError {
            kind: constraint_kind(c),
            message: first_line(&e.to_string()),
        })?;
    let m = Matcher::new(Ok(parser));
    if let Some(e) = m.get_error() {
        return Err(StructuredError {
            kind: constraint_kind(c),
            message: first_line(&e),
        });
    }
    Ok(m)
}

/// llguidance's errors may append the whole grammar: keep the cause.
fn first_line(s: &str) -> String {
    let s = s.lines().next().unwrap_or(s).trim();
    let mut out: String = s.chars().take(500).collect();
    if out.len() < s.len() {
        out.push_str("...");
    }
    out
}

/// The vocabulary as llguidance sees it, tokenizing with the model's own
/// tokenizer.
struct PagodaTokEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for PagodaTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        match std::str::from_utf8(s) {
            Ok(text) => match self.tokenizer.encode(text, false) {
                Ok(ids) if ids.iter().all(|&t| (t as usize) < self.trie.vocab_size()) => ids,
                _ => self.trie.greedy_tokenize(s),
            },
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// Compiled constraints kept for reuse (the most recently used last).
const MAX_TEMPLATES: usize = 32;

/// A compiled constraint: one fresh matcher per lexer family.
struct Template {
    constraint: StructuredOutput,
    families: Vec<Matcher>,
    /// The family of the next request (round robin).
    next: usize,
}

/// Compiles constraints for one model's vocabulary.
///
/// A constraint is compiled once; its requests start from copies. The
/// copies of one family share one lexer (llguidance's lazily built DFA and
/// its caches), so the lexer states that one request builds serve the
/// others instead of every request building them again (the slow masks of
/// bounded strings, `maxLength` and the like, come from that building).
/// A shared lexer is used by one thread at a time: the mask workers run a
/// family's rows on one worker ([`Guide::family`]).
pub struct GrammarCompiler {
    factory: ParserFactory,
    vocab_size: usize,
    /// Lexer families per constraint (at least one).
    families: usize,
    templates: Mutex<Vec<Template>>,
}

impl GrammarCompiler {
    /// Builds the token trie of the first `vocab_size` ids (the logits row
    /// width); `eos` are the ids that end generation (at least one).
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        vocab_size: usize,
        eos: &[u32],
    ) -> Result<Self, StructuredError> {
        let err = |message: String| StructuredError {
            kind: "structured output",
            message,
        };
        let &first_eos = eos
            .first()
            .ok_or_else(|| err("the model has no end-of-sequence token".into()))?;
        if let Some(bad) = eos.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(err(format!(
                "end-of-sequence token id {bad} is outside the model's vocabulary of {vocab_size} ids"
            )));
        }
        let mut words = tokenizer
            .token_bytes()
            .map_err(|e| err(format!("structured outputs unavailable: {e}")))?;
        words.resize(vocab_size, Vec::new());
        let info = TokRxInfo::new(vocab_size as u32, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        let env: TokEnv = Arc::new(PagodaTokEnv { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| err(e.to_string()))?;
        factory.quiet();
        Ok(GrammarCompiler {
            factory,
            vocab_size,
            families: step::mask_threads()? * masks::FAMILIES_PER_WORKER,
            templates: Mutex::new(Vec::new()),
        })
    }

    /// Sets the number of lexer families per constraint (a few per mask
    /// worker, [`FAMILIES_PER_WORKER`]; at least one).
    pub fn with_families(mut self, families: usize) -> Self {
        self.families = families.max(1);
        self
    }

    /// Compiles `c` into a fresh guide, or says what is wrong with it.
    /// A constraint compiled before is copied from its kept matchers.
    pub fn compile(&self, c: &StructuredOutput) -> Result<Guide, StructuredError> {
        let mut templates = self.templates.lock().unwrap_or_else(|p| p.into_inner());
        match templates.iter().position(|t| &t.constraint == c) {
            Some(i) => {
                let t = templates.remove(i);
                templates.push(t);
            }
            None => {
                let m = compile_with(&self.factory, c)?;
                if templates.len() >= MAX_TEMPLATES {
                    templates.remove(0);
                }
                // Each family its own lexer (a deep copy).
                let families = (0..self.families).map(|_| m.deep_clone()).collect();
                templates.push(Template {
                    constraint: c.clone(),
                    families,
                    next: 0,
                });
            }
        }
        let Some(t) = templates.last_mut() else {
            return Err(StructuredError {
                kind: constraint_kind(c),
                message: "no compiled grammar".into(),
            });
        };
        let family = t.next % t.families.len().max(1);
        t.next = t.next.wrapping_add(1);
        let matcher = match t.families.get(family) {
            // A shallow copy: the family's lexer is shared.
            Some(m) => m.clone(),
            None => compile_with(&self.factory, c)?,
        };
        Ok(Guide {
            matcher,
            words: self.vocab_size.div_ceil(32),
            family,
        })
    }
}

/// One request's matcher.
pub struct Guide {
    matcher: Matcher,
    /// u32 words of one mask.
    words: usize,
    /// Its lexer family: guides of one constraint and one family share a
    /// lexer, so they must be advanced or masked on one thread at a time.
    family: usize,
}

impl Guide {
    /// The lexer family (see [`GrammarCompiler`]).
    pub fn family(&self) -> usize {
        self.family
    }

    /// Words of one packed mask.
    pub fn mask_words(&self) -> usize {
        self.words
    }

    /// Writes the allowed next tokens into `out` (`mask_words` words, bit
    /// `t % 32` of word `t / 32` set for an allowed token `t`): only the
    /// EOS tokens once the grammar is complete. On a matcher error, only
    /// EOS is allowed (the request stops) and the error is returned.
    pub fn fill_mask(&mut self, out: &mut [u32], eos: &[u32]) -> Result<(), String> {
        match self.matcher.compute_mask_or_eos() {
            Ok(v) => {
                let src = v.as_slice();
                let n = src.len().min(out.len());
                out[..n].copy_from_slice(&src[..n]);
                out[n..].fill(0);
                if out.iter().all(|&w| w == 0) {
                    set_only(out, eos);
                }
                Ok(())
            }
            Err(e) => {
                set_only(out, eos);
                Err(first_line(&e.to_string()))
            }
        }
    }

    /// Advances past a sampled token.
    pub fn advance(&mut self, token: u32) -> Result<(), String> {
        self.matcher
            .consume_token(token)
            .map_err(|e| first_line(&e.to_string()))
    }

    /// Whether the grammar is complete (nothing but EOS may follow).
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

fn set_only(out: &mut [u32], tokens: &[u32]) {
    out.fill(0);
    for &t in tokens {
        if let Some(w) = out.get_mut(t as usize / 32) {
            *w |= 1 << (t % 32);
        }
    }
}

/// Sets every logit whose bit in `mask` is clear to -inf.
pub fn apply_mask(logits: &mut [f32], mask: &[u32]) {
    for (i, l) in logits.iter_mut().enumerate() {
        let allowed = mask.get(i / 32).is_some_and(|w| w >> (i % 32) & 1 == 1);
        if !allowed {
            *l = f32::NEG_INFINITY;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_grammar_names_what_is_wrong() {
        assert!(check_grammar(&StructuredOutput::JsonObject).is_ok());
        let e = check_grammar(&StructuredOutput::JsonSchema("{not json".into())).unwrap_err();
        assert_eq!(e.kind, "json_schema");
        let e = check_grammar(&StructuredOutput::Regex("a(".into())).unwrap_err();
        assert_eq!(e.kind, "regex");
        let e = check_grammar(&StructuredOutput::Lark("start: foo".into())).unwrap_err();
        assert_eq!(e.kind, "grammar");
        let e = check_grammar(&StructuredOutput::Choice(vec![])).unwrap_err();
        assert_eq!(e.kind, "choice");
        check_grammar(&StructuredOutput::Gbnf("root ::= \"a\"".into())).unwrap();
        let e = check_grammar(&StructuredOutput::Gbnf("root ::= \"a".into())).unwrap_err();
        assert_eq!(e.kind, "grammar");
        assert!(e.message.contains("line 1, column 10"), "{e}");
        let lark = r#"start: "call " obj
obj: %json { "type": "object", "properties": { "x": { "type": "integer" } }, "required": ["x"] }"#;
        check_grammar(&StructuredOutput::Lark(lark.into())).unwrap();
        check_grammar(&StructuredOutput::Choice(vec![
            "a \"q\"".into(),
            "b\\n".into(),
        ]))
        .unwrap();
    }

    #[test]
    fn masks_clear_disallowed_logits() {
        let mut l = vec![1.0f32; 40];
        let mut m = vec![0u32; 2];
        set_only(&mut m, &[3, 33]);
        apply_mask(&mut l, &m);
        for (i, v) in l.iter().enumerate() {
            assert_eq!(v.is_finite(), i == 3 || i == 33, "{i}");
        }
    }
}
