//! GGUF tokenizer metadata -> a Hugging Face `tokenizers` pipeline.
//!
//! Supported `tokenizer.ggml.model` values:
//! - `gpt2`: byte-level BPE. The vocabulary is `tokenizer.ggml.tokens` (in
//!   byte-level form, `Ġthe`), ranks are the order of `tokenizer.ggml.merges`
//!   (`"Ġ t"`), and the pre-tokenizer regex is chosen by `tokenizer.ggml.pre`
//!   (see [`GgufPreTokenizer`]: every value llama.cpp knows is mapped or
//!   refused by name; an unknown one is an error).
//! - `llama`: SentencePiece BPE with byte fallback, see [`super::gguf_spm`].
//! - `t5`: SentencePiece Unigram, see [`super::gguf_unigram`].
//! - others (`bert`, `rwkv`, ...): rejected with a clear error.
//!
//! Token types (`tokenizer.ggml.token_type`): 1 normal, 2 unknown, 3 control,
//! 4 user-defined, 5 unused, 6 byte. Control and user-defined tokens become
//! added tokens, matched whole in the input text before any splitting; control
//! tokens are special (left out by `skip_special_tokens`).
//!
//! Cost: one pass over the vocabulary and merges (~0.1 s for 150k entries).

pub use super::gguf_pre::{GgufPreTokenizer, PreTokenizerKind, LLAMA_CPP_PRE_NAMES};
use super::{tok_err, TokenizerParts};
use crate::Result;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::AddedToken;

/// The `tokenizer.*` metadata of a GGUF file (read by the GGUF loader).
pub type GgufTokenizerSpec = crate::loader::gguf::GgufTokenizerMetadata;

/// `tokenizer.ggml.token_type` values.
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// Builds the tokenizer parts for a GGUF model.
pub(crate) fn build(spec: &GgufTokenizerSpec) -> Result<TokenizerParts> {
    match spec.model.as_str() {
        "gpt2" => build_byte_level_bpe(spec),
        "llama" => super::gguf_spm::build(spec),
        "t5" => super::gguf_unigram::build(spec),
        other => Err(tok_err(format!(
            "unsupported GGUF tokenizer model {other:?} (supported: gpt2, llama, t5); \
             give the model's tokenizer.json with --tokenizer"
        ))),
    }
}

fn build_byte_level_bpe(spec: &GgufTokenizerSpec) -> Result<TokenizerParts> {
    if spec.tokens.is_empty() {
        return Err(tok_err("GGUF tokenizer has no tokens"));
    }
    if !spec.token_types.is_empty() && spec.token_types.len() != spec.tokens.len() {
        return Err(tok_err(format!(
            "GGUF tokenizer has {} tokens but {} token types",
            spec.tokens.len(),
            spec.token_types.len()
        )));
    }
    if spec.pre.is_none() {
        tracing::warn!("GGUF has no tokenizer.ggml.pre; using llama.cpp's default pre-tokenizer");
    }
    let pre = GgufPreTokenizer::from_gguf_pre(spec.pre.as_deref())?;
    let kind = pre.kind;

    // A token string listed twice keeps its first id (later ids decode to nothing).
    let mut vocab = Vocab::with_capacity(spec.tokens.len());
    for (id, token) in spec.tokens.iter().enumerate() {
        vocab.entry(token.clone()).or_insert(id as u32);
    }
    let merges = spec
        .merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| tok_err(format!("GGUF merge {m:?} is not \"left right\"")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(pre.ignore_merges)
        .build()
        .map_err(|e| tok_err(format!("cannot build BPE from GGUF vocabulary: {e}")))?;

    let mut inner = tokenizers::Tokenizer::new(bpe);
    if kind.nfc() {
        inner.with_normalizer(Some(NFC));
    }
    inner.with_pre_tokenizer(Some(kind.pre_tokenizer()?));
    inner.with_decoder(Some(ByteLevelDecoder::new(false, true, true)));

    let added: Vec<AddedToken> = spec
        .token_types
        .iter()
        .zip(&spec.tokens)
        .filter(|(&t, _)| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
        .map(|(&t, token)| {
            AddedToken::from(token.clone(), t == TOKEN_TYPE_CONTROL).normalized(false)
        })
        .collect();
    // Control tokens are added as special; user-defined ones as plain added tokens.
    let (special, plain): (Vec<_>, Vec<_>) = added.into_iter().partition(|t| t.special);
    inner.add_special_tokens(&special);
    inner.add_tokens(&plain);

    parts(inner, spec, pre.add_bos_by_default)
}

/// The finished tokenizer with the GGUF's special tokens, each checked to
/// lie in the vocabulary; BOS is added by default where the file says
/// nothing and `add_bos_by_default` (the vocabulary type's convention).
pub(super) fn parts(
    inner: tokenizers::Tokenizer,
    spec: &GgufTokenizerSpec,
    add_bos_by_default: bool,
) -> Result<TokenizerParts> {
    let n = spec.tokens.len();
    let check = |what: &str, id: Option<u32>| -> Result<Option<u32>> {
        match id {
            Some(id) if id as usize >= n => Err(tok_err(format!(
                "GGUF {what} token id {id} is outside the vocabulary ({n})"
            ))),
            _ => Ok(id),
        }
    };
    let bos_token_id = check("BOS", spec.bos_token_id)?;
    let eos_token_id = check("EOS", spec.eos_token_id)?;
    let arch = spec.architecture.as_deref();
    // The family's end-of-turn tokens end generation too (control tokens
    // of the vocabulary only).
    let mut eos_token_ids: Vec<u32> = eos_token_id.into_iter().collect();
    for text in super::builtin::end_of_turn_tokens(arch) {
        let id = spec.tokens.iter().position(|t| t == text);
        let control = |i: usize| spec.token_types.get(i) == Some(&TOKEN_TYPE_CONTROL);
        if let Some(i) = id.filter(|&i| control(i)) {
            eos_token_ids.push(i as u32);
        }
    }
    Ok(TokenizerParts {
        inner,
        vocab_size: n,
        bos_token_id,
        eos_token_ids,
        add_bos_token: spec.add_bos_token.unwrap_or(add_bos_by_default) && bos_token_id.is_some(),
        add_eos_token: spec.add_eos_token.unwrap_or(false) && eos_token_id.is_some(),
        chat_template_source: spec
            .chat_template
            .clone()
            .or_else(|| super::builtin::chat_template(arch).map(str::to_string)),
        normalizer: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_models_say_so() {
        let spec = GgufTokenizerSpec {
            model: "bert".into(),
            tokens: vec!["a".into()],
            ..Default::default()
        };
        let err = build(&spec).err().unwrap().to_string();
        assert!(
            err.contains("unsupported") && err.contains("\"bert\""),
            "{err}"
        );
    }
}
