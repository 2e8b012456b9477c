//! How much text one token can stand for, so that a caller can refuse a text
//! too long for a context of N tokens without tokenizing it.
//!
//! Guarantee: when [`Tokenizer::max_bytes_per_token`] returns `Some(k)`, every
//! text of `b` bytes encodes to at least `ceil(b / k)` tokens. It returns
//! `None` for pipelines where that cannot be promised cheaply: a normalizer
//! (SentencePiece Unigram's own one included) that may delete text (anything but NFC, which shrinks text at most 3-fold:
//! three Hangul jamo of 3 bytes compose to one syllable of 3 bytes), a
//! pre-tokenizer that drops text (whitespace or removed delimiters), or a
//! model that does not spell every byte (neither byte-level nor byte
//! fallback: an unknown run of text may become one `<unk>`).

use super::Tokenizer;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

/// Bytes one unknown character may take (an upper bound on any `<unk>`
/// standing for one character).
const MAX_CHAR_BYTES: usize = 4;

impl Tokenizer {
    /// An upper bound on the bytes of input text one token of
    /// [`Tokenizer::encode`] stands for, or `None` when the pipeline gives no
    /// such bound (see the module docs). Costs one pass over the vocabulary:
    /// call it once.
    pub fn max_bytes_per_token(&self) -> Option<usize> {
        // SentencePiece's normalization (run before the pipeline) drops
        // whitespace runs and characters its charsmap deletes.
        if self.normalizer.is_some() {
            return None;
        }
        let shrink = match self.inner.get_normalizer() {
            None => 1,
            Some(NormalizerWrapper::NFC(_)) => 3,
            Some(_) => return None,
        };
        let pre = self.inner.get_pre_tokenizer();
        if !pre.is_none_or(keeps_text) {
            return None;
        }
        if !(self.byte_fallback || pre.is_some_and(is_byte_level)) {
            return None;
        }
        // A vocabulary string is at least as long as the text it stands for:
        // byte-level symbols spell each byte as one char of 1 or 2 bytes,
        // `<0xNN>` and `▁` are longer than the byte they stand for.
        let longest = (0..self.vocab_size as u32)
            .filter_map(|id| self.inner.id_to_token(id))
            .map(|t| t.len())
            .max()
            .unwrap_or(0)
            .max(MAX_CHAR_BYTES);
        Some(longest * shrink)
    }
}

/// Whether a pre-tokenizer keeps every byte of its input.
fn keeps_text(p: &PreTokenizerWrapper) -> bool {
    match p {
        PreTokenizerWrapper::ByteLevel(_)
        | PreTokenizerWrapper::Metaspace(_)
        | PreTokenizerWrapper::Digits(_)
        | PreTokenizerWrapper::UnicodeScripts(_)
        | PreTokenizerWrapper::FixedLength(_) => true,
        PreTokenizerWrapper::Split(s) => s.behavior != SplitDelimiterBehavior::Removed,
        PreTokenizerWrapper::Sequence(s) => s.as_ref().iter().all(keeps_text),
        _ => false,
    }
}

fn is_byte_level(p: &PreTokenizerWrapper) -> bool {
    match p {
        PreTokenizerWrapper::ByteLevel(_) => true,
        PreTokenizerWrapper::Sequence(s) => s.as_ref().iter().any(is_byte_level),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use crate::tokenizer::Tokenizer;

    fn default_model() -> Option<std::sync::Arc<Tokenizer>> {
        let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let files = crate::open::open_model(&crate::open::OpenOptions {
            model: Some(p),
            config: None,
            dummy_weights: false,
            tokenizer: None,
        })
        .ok()?;
        files.tokenizer
    }

    #[test]
    fn no_text_encodes_to_fewer_tokens_than_the_bound_allows() {
        let Some(tok) = default_model() else {
            eprintln!("default model missing: skipped");
            return;
        };
        let k = tok
            .max_bytes_per_token()
            .expect("byte-level BPE has a bound");
        assert!((4..=512).contains(&k), "{k}");
        let texts = [
            "hello world ".repeat(50),
            " ".repeat(1000),
            "aaaaaaaaaaaaaaaa".repeat(40),
            "<|im_start|><|im_end|>".repeat(30),
            "の日本語テキスト🙂".repeat(40),
            "\n\n\n\t\t  ".repeat(100),
        ];
        for t in texts {
            let n = tok.encode(&t, false).unwrap().len();
            assert!(n * k >= t.len(), "{n} tokens x {k} < {} bytes", t.len());
        }
    }
}
