//! GGUF SentencePiece BPE (`tokenizer.ggml.model` = `llama`) -> a Hugging
//! Face `tokenizers` pipeline, built from the file's metadata alone.
//!
//! The file holds pieces (`▁the`, `<0x0A>`), a score per piece and token
//! types, but no merges. As transformers' GGUF converter does, merges are
//! derived from the vocabulary: every split of a piece into two pieces that
//! are both in the vocabulary is a merge, ranked by the piece's score (best
//! first; Gemma files rank by position instead, because their scores do not
//! follow the merge order), then by the longer left part, then the longer
//! right part. The BPE model falls back to `<0xNN>` byte tokens for text no
//! piece covers, and the decoder turns `▁` back into spaces, bytes into text.
//!
//! Spaces: Gemma (and any file with `add_space_prefix` false) replaces every
//! space with `▁` and adds no prefix; Gemma files store their whitespace-run
//! tokens as real spaces, which are respelled with `▁` first. Other files
//! (Llama 2, Mistral, TinyLlama) get a `▁` prepended to the text (before
//! spaces become `▁`, so `"  hi"` is `▁▁▁hi` as sentencepiece and llama.cpp
//! have it), and the decoder strips one leading space again.
//!
//! Control tokens (type 3) are special added tokens; user-defined ones (type 4)
//! plain added tokens, both matched whole before any splitting. BOS is added
//! unless the file says otherwise, as llama.cpp and transformers do.

use super::{tok_err, GgufTokenizerSpec, TokenizerParts};
use crate::Result;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::prepend::Prepend;
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::Sequence as NormalizerSequence;
use tokenizers::{AddedToken, DecoderWrapper};

const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;
const SPACE_MARK: &str = "\u{2581}";

/// Builds the tokenizer parts of a SentencePiece BPE vocabulary.
pub(crate) fn build(spec: &GgufTokenizerSpec) -> Result<TokenizerParts> {
    let n = spec.tokens.len();
    if n == 0 {
        return Err(tok_err("GGUF tokenizer has no tokens"));
    }
    if !spec.token_types.is_empty() && spec.token_types.len() != n {
        return Err(tok_err(format!(
            "GGUF tokenizer has {n} tokens but {} token types",
            spec.token_types.len()
        )));
    }
    let gemma = spec
        .architecture
        .as_deref()
        .is_some_and(|a| a.starts_with("gemma"));
    if !gemma && spec.scores.len() != n {
        return Err(tok_err(format!(
            "GGUF SentencePiece tokenizer has {n} tokens but {} scores (tokenizer.ggml.scores)",
            spec.scores.len()
        )));
    }
    let prefix_space = !gemma && spec.add_space_prefix.unwrap_or(true);

    // Gemma stores whitespace-run pieces as spaces; its text carries `▁`.
    let tokens: Vec<String> = spec
        .tokens
        .iter()
        .map(|t| {
            if gemma && t.contains(' ') && t.trim().is_empty() {
                SPACE_MARK.repeat(t.chars().count())
            } else {
                t.clone()
            }
        })
        .collect();
    // A piece listed twice keeps its last id, as a Python dict built in order does.
    let mut vocab = Vocab::with_capacity(n);
    for (id, token) in tokens.iter().enumerate() {
        vocab.insert(token.clone(), id as u32);
    }
    let rank_score = |id: usize| -> f64 {
        if gemma {
            -(id as f64)
        } else {
            f64::from(spec.scores[id])
        }
    };
    let merges = derive_merges(&tokens, &vocab, rank_score);

    let mut builder = BPE::builder()
        .vocab_and_merges(vocab.clone(), merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if vocab.contains_key("<unk>") {
        builder = builder.unk_token("<unk>".to_string());
    }
    let bpe = builder
        .build()
        .map_err(|e| tok_err(format!("cannot build BPE from GGUF vocabulary: {e}")))?;

    let mut inner = tokenizers::Tokenizer::new(bpe);
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE_MARK, " ")
            .map_err(|e| tok_err(format!("decoder: {e}")))?
            .into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    let spaces = Replace::new(" ", SPACE_MARK).map_err(|e| tok_err(format!("normalizer: {e}")))?;
    if prefix_space {
        // SentencePiece's dummy prefix: one `▁` before the text, whatever it
        // starts with (as sentencepiece and llama.cpp do).
        inner.with_normalizer(Some(NormalizerSequence::new(vec![
            Prepend::new(SPACE_MARK.to_string()).into(),
            spaces.into(),
        ])));
        decoders.push(Strip::new(' ', 1, 0).into());
    } else {
        inner.with_normalizer(Some(spaces));
    }
    inner.with_decoder(Some(DecoderSequence::new(decoders)));

    let mut special = Vec::new();
    let mut plain = Vec::new();
    for (id, (&t, token)) in spec.token_types.iter().zip(&spec.tokens).enumerate() {
        if t == TOKEN_TYPE_CONTROL {
            special.push(AddedToken::from(token.clone(), true).normalized(false));
        } else if t == TOKEN_TYPE_USER_DEFINED && vocab.get(token) == Some(&(id as u32)) {
            // Respelled whitespace runs are ordinary pieces, not added tokens.
            plain.push(AddedToken::from(token.clone(), false).normalized(false));
        }
    }
    inner.add_special_tokens(&special);
    inner.add_tokens(&plain);

    // SentencePiece vocabularies add BOS unless the file says otherwise.
    super::gguf::parts(inner, spec, true)
}

/// Every split of a piece into two vocabulary pieces, best first: by the
/// piece's `score` (higher first), then longer left part, then longer right
/// part (lengths in characters); ties keep vocabulary order, and splits of one
/// piece are ordered by their parts' ids.
fn derive_merges(
    tokens: &[String],
    vocab: &Vocab,
    score: impl Fn(usize) -> f64,
) -> Vec<(String, String)> {
    struct Merge {
        left: usize,
        right: usize,
        score: f64,
        left_chars: usize,
        right_chars: usize,
    }
    let mut merges = Vec::new();
    for (id, token) in tokens.iter().enumerate() {
        // A duplicate piece counts once, with its last id (see `build`).
        if vocab.get(token) != Some(&(id as u32)) {
            continue;
        }
        let first = merges.len();
        let total_chars = token.chars().count();
        for (chars, (split, _)) in token.char_indices().enumerate().skip(1) {
            let (l, r) = token.split_at(split);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                merges.push(Merge {
                    left: li as usize,
                    right: ri as usize,
                    score: score(id),
                    left_chars: chars,
                    right_chars: total_chars - chars,
                });
            }
        }
        merges[first..].sort_by_key(|m| (m.left, m.right));
    }
    merges.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(b.left_chars.cmp(&a.left_chars))
            .then(b.right_chars.cmp(&a.right_chars))
    });
    merges
        .into_iter()
        .map(|m| (tokens[m.left].clone(), tokens[m.right].clone()))
        .collect()
}
