//! GGUF tokenizer metadata -> a Hugging Face `tokenizers` pipeline.
//!
//! Supported `tokenizer.ggml.model` values:
//! - `gpt2`: byte-level BPE. The vocabulary is `tokenizer.ggml.tokens` (in
//!   byte-level form, `Ġthe`), ranks are the order of `tokenizer.ggml.merges`
//!   (`"Ġ t"`), and the pre-tokenizer regex is chosen by `tokenizer.ggml.pre`
//!   (see [`PreTokenizerKind`]).
//! - `llama` (SentencePiece) and others: rejected with a clear error for now;
//!   they need the `tokenizer.ggml.scores` array, which this spec omits.
//!
//! Token types (`tokenizer.ggml.token_type`): 1 normal, 2 unknown, 3 control,
//! 4 user-defined, 5 unused, 6 byte. Control and user-defined tokens become
//! added tokens, matched whole in the input text before any splitting; control
//! tokens are special (left out by `skip_special_tokens`).
//!
//! Cost: one pass over the vocabulary and merges (~0.1 s for 150k entries).

use super::{tok_err, TokenizerParts};
use crate::Result;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

/// The `tokenizer.*` metadata of a GGUF file (read by the GGUF loader).
pub type GgufTokenizerSpec = crate::loader::gguf::GgufTokenizerMetadata;

/// `tokenizer.ggml.token_type` values.
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// GPT-2's split: contractions, letters, numbers, other symbols, spaces (a
/// space run keeps its last space for the following word).
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama 3's split: case-insensitive contractions, a letter run with one
/// leading non-letter, digits in groups of up to three, symbols with trailing
/// newlines, newline runs, spaces.
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's split: as Llama 3's, but every digit on its own.
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer families `tokenizer.ggml.pre` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// GPT-2's regex (`default`, `gpt2`, `gpt-2`, `mpt`, `olmo`).
    Gpt2,
    /// Every digit split off first, then GPT-2's regex (`smollm`,
    /// `starcoder`, `refact`, `command-r`, `codeshell`).
    Gpt2IndividualDigits,
    /// Llama 3's regex (`llama-bpe`, `llama3`, `llama-v3`, `smaug-bpe`).
    Llama3,
    /// Qwen2's regex with NFC normalization (`qwen2`, `deepseek-r1-qwen`,
    /// `stablelm2`).
    Qwen2,
}

impl PreTokenizerKind {
    /// The family of a `tokenizer.ggml.pre` value; None when unknown.
    pub fn from_gguf_pre(pre: Option<&str>) -> Option<Self> {
        Some(match pre.unwrap_or("default") {
            "default" | "gpt2" | "gpt-2" | "mpt" | "olmo" => Self::Gpt2,
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" => {
                Self::Gpt2IndividualDigits
            }
            "llama-bpe" | "llama3" | "llama-v3" | "smaug-bpe" => Self::Llama3,
            "qwen2" | "deepseek-r1-qwen" | "stablelm2" => Self::Qwen2,
            _ => return None,
        })
    }

    /// The pre-tokenizer pipeline: regex split, then bytes -> byte-level chars.
    pub fn pre_tokenizer(self) -> Result<PreTokenizerWrapper> {
        let byte_level = |use_regex| ByteLevel::new(false, true, use_regex).into();
        let split = |pattern: &str| -> Result<PreTokenizerWrapper> {
            Split::new(
                SplitPattern::Regex(pattern.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map(Into::into)
            .map_err(|e| tok_err(format!("bad pre-tokenizer regex: {e}")))
        };
        Ok(match self {
            Self::Gpt2 => Sequence::new(vec![split(GPT2_PATTERN)?, byte_level(false)]).into(),
            Self::Gpt2IndividualDigits => Sequence::new(vec![
                Digits::new(true).into(),
                split(GPT2_PATTERN)?,
                byte_level(false),
            ])
            .into(),
            Self::Llama3 => Sequence::new(vec![split(LLAMA3_PATTERN)?, byte_level(false)]).into(),
            Self::Qwen2 => Sequence::new(vec![split(QWEN2_PATTERN)?, byte_level(false)]).into(),
        })
    }
}

/// Builds the tokenizer parts for a GGUF model.
pub(crate) fn build(spec: &GgufTokenizerSpec) -> Result<TokenizerParts> {
    match spec.model.as_str() {
        "gpt2" => build_byte_level_bpe(spec),
        "llama" => Err(tok_err(
            "GGUF tokenizer model \"llama\" (SentencePiece) is not supported yet; \
             load the model's Hugging Face tokenizer.json instead",
        )),
        other => Err(tok_err(format!(
            "unsupported GGUF tokenizer model {other:?} (supported: gpt2)"
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
    let kind = PreTokenizerKind::from_gguf_pre(spec.pre.as_deref()).unwrap_or_else(|| {
        tracing::warn!(pre = ?spec.pre, "unknown tokenizer.ggml.pre; using GPT-2's pre-tokenizer");
        PreTokenizerKind::Gpt2
    });

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
        .build()
        .map_err(|e| tok_err(format!("cannot build BPE from GGUF vocabulary: {e}")))?;

    let mut inner = tokenizers::Tokenizer::new(bpe);
    if kind == PreTokenizerKind::Qwen2 {
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
    Ok(TokenizerParts {
        inner,
        vocab_size: n,
        bos_token_id,
        eos_token_ids: eos_token_id.into_iter().collect(),
        add_bos_token: spec.add_bos_token.unwrap_or(false) && bos_token_id.is_some(),
        add_eos_token: spec.add_eos_token.unwrap_or(false) && eos_token_id.is_some(),
        chat_template_source: spec.chat_template.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn split(kind: PreTokenizerKind, text: &str) -> Vec<String> {
        let pre = kind.pre_tokenizer().unwrap();
        let mut s = PreTokenizedString::from(text);
        pre.pre_tokenize(&mut s).unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(piece, _, _)| piece.to_string())
            .collect()
    }

    #[test]
    fn every_pre_name_maps_to_a_compiling_pipeline() {
        for pre in ["default", "gpt2", "smollm", "llama-bpe", "qwen2"] {
            let kind = PreTokenizerKind::from_gguf_pre(Some(pre)).unwrap();
            assert!(kind.pre_tokenizer().is_ok(), "{pre}");
        }
        assert_eq!(PreTokenizerKind::from_gguf_pre(Some("nope")), None);
    }

    // Expected splits follow the published definitions of each split rule.
    #[test]
    fn digit_grouping_differs_by_family() {
        assert_eq!(split(PreTokenizerKind::Gpt2, "a 12345"), ["a", "Ġ12345"]);
        assert_eq!(
            split(PreTokenizerKind::Gpt2IndividualDigits, "a 123"),
            ["a", "Ġ", "1", "2", "3"]
        );
        assert_eq!(
            split(PreTokenizerKind::Llama3, "a 12345"),
            ["a", "Ġ", "123", "45"]
        );
        assert_eq!(
            split(PreTokenizerKind::Qwen2, "a 123"),
            ["a", "Ġ", "1", "2", "3"]
        );
    }

    #[test]
    fn llama3_keeps_one_leading_symbol_and_newlines_together() {
        assert_eq!(
            split(PreTokenizerKind::Llama3, "I'M here.\n\n  x"),
            ["I", "'M", "Ġhere", ".ĊĊ", "Ġ", "Ġx"]
        );
    }

    #[test]
    fn unsupported_models_say_so() {
        let spec = GgufTokenizerSpec {
            model: "llama".into(),
            tokens: vec!["a".into()],
            ..Default::default()
        };
        let err = build(&spec).err().unwrap().to_string();
        assert!(err.contains("not supported"), "{err}");
    }
}
