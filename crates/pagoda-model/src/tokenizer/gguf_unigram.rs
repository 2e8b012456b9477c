//! GGUF SentencePiece Unigram (`tokenizer.ggml.model` = `t5`) -> a Hugging
//! Face `tokenizers` pipeline, built from the file's metadata alone.
//!
//! Normalization is the sentencepiece library's ([`super::spm_normalizer`],
//! run on the text before the pipeline, which has no normalizer): the file's
//! precompiled charsmap (NFKC-like table) by longest match when present,
//! then, unless `remove_extra_whitespaces` is false, leading and trailing
//! spaces dropped and space runs collapsed, then a `▁` prefix unless
//! `add_space_prefix` is false, then spaces -> `▁`. User-defined tokens are
//! left as written. The Unigram model picks the most probable
//! segmentation by the pieces' scores; text no piece covers becomes `<0xNN>`
//! byte tokens when the vocabulary has them, else the unknown token.
//!
//! Control tokens (type 3) are special added tokens, user-defined ones (type 4)
//! plain added tokens. EOS is appended and BOS not, unless the file says
//! otherwise (llama.cpp's defaults for this vocabulary type).

use super::spm_normalizer::SpmNormalizer;
use super::{tok_err, GgufTokenizerSpec, TokenizerParts};
use crate::Result;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::unigram::Unigram;
use tokenizers::normalizers::replace::Replace;
use tokenizers::{AddedToken, DecoderWrapper};

const TOKEN_TYPE_UNKNOWN: i32 = 2;
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;
const TOKEN_TYPE_BYTE: i32 = 6;
const SPACE_MARK: &str = "\u{2581}";

/// Builds the tokenizer parts of a SentencePiece Unigram vocabulary.
pub(crate) fn build(spec: &GgufTokenizerSpec) -> Result<TokenizerParts> {
    let n = spec.tokens.len();
    if n == 0 {
        return Err(tok_err("GGUF tokenizer has no tokens"));
    }
    if spec.scores.len() != n {
        return Err(tok_err(format!(
            "GGUF Unigram tokenizer has {n} tokens but {} scores (tokenizer.ggml.scores)",
            spec.scores.len()
        )));
    }
    if !spec.token_types.is_empty() && spec.token_types.len() != n {
        return Err(tok_err(format!(
            "GGUF tokenizer has {n} tokens but {} token types",
            spec.token_types.len()
        )));
    }
    let type_of = |id: usize| spec.token_types.get(id).copied().unwrap_or(1);
    let unk_id = spec
        .unknown_token_id
        .map(|id| id as usize)
        .or_else(|| (0..n).find(|&id| type_of(id) == TOKEN_TYPE_UNKNOWN));
    if let Some(id) = unk_id.filter(|&id| id >= n) {
        return Err(tok_err(format!(
            "GGUF unknown token id {id} is outside the vocabulary ({n})"
        )));
    }
    let byte_fallback = (0..n).any(|id| type_of(id) == TOKEN_TYPE_BYTE);
    let vocab: Vec<(String, f64)> = spec
        .tokens
        .iter()
        .zip(&spec.scores)
        .map(|(t, &s)| (t.clone(), f64::from(s)))
        .collect();
    let model = Unigram::from(vocab, unk_id, byte_fallback)
        .map_err(|e| tok_err(format!("cannot build Unigram from GGUF vocabulary: {e}")))?;

    let prefix_space = spec.add_space_prefix.unwrap_or(true);
    let user_defined = (0..n)
        .filter(|&id| type_of(id) == TOKEN_TYPE_USER_DEFINED)
        .map(|id| spec.tokens[id].clone())
        .collect();
    let normalizer = SpmNormalizer::with_user_defined(
        &spec.precompiled_charsmap,
        spec.remove_extra_whitespaces.unwrap_or(true),
        prefix_space,
        user_defined,
    )?;

    let mut inner = tokenizers::Tokenizer::new(model);
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE_MARK, " ")
            .map_err(|e| tok_err(format!("decoder: {e}")))?
            .into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if prefix_space {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    inner.with_decoder(Some(DecoderSequence::new(decoders)));

    let mut special = Vec::new();
    let mut plain = Vec::new();
    for (id, token) in spec.tokens.iter().enumerate() {
        match type_of(id) {
            TOKEN_TYPE_CONTROL => {
                special.push(AddedToken::from(token.clone(), true).normalized(false))
            }
            TOKEN_TYPE_USER_DEFINED => {
                plain.push(AddedToken::from(token.clone(), false).normalized(false))
            }
            _ => {}
        }
    }
    inner.add_special_tokens(&special);
    inner.add_tokens(&plain);

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
    Ok(TokenizerParts {
        inner,
        vocab_size: n,
        bos_token_id,
        eos_token_ids: eos_token_id.into_iter().collect(),
        add_bos_token: spec.add_bos_token.unwrap_or(false) && bos_token_id.is_some(),
        add_eos_token: spec.add_eos_token.unwrap_or(true) && eos_token_id.is_some(),
        chat_template_source: spec.chat_template.clone(),
        normalizer: Some(normalizer),
    })
}
