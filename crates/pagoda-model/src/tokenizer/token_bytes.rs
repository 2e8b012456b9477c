//! The bytes each token id stands for, for constrained decoding: a grammar
//! matcher walks the vocabulary as byte strings.
//!
//! Guarantee: [`Tokenizer::token_bytes`] returns exactly `vocab_size`
//! entries; entry `id` is the bytes `decode` gives for `id` inside a text
//! (a byte-level symbol spells one byte, `<0xNN>` is byte NN, `▁` is a
//! space); a special (control) token is its text after one 0xFF byte, the
//! marker constrained decoding uses to tell it from text; ids the tokenizer
//! does not know are empty (no text can produce them). Pipelines whose
//! tokens do not spell bytes (neither byte-level nor byte fallback) are an
//! error, not a guess. Costs one pass over the vocabulary: call it once.

use super::{tok_err, Tokenizer};
use crate::Result;
use tokenizers::DecoderWrapper;

/// Marks a special token's bytes (llguidance's convention).
pub const SPECIAL_TOKEN_MARKER: u8 = 0xff;

impl Tokenizer {
    /// The bytes of every token id (see the module docs).
    pub fn token_bytes(&self) -> Result<Vec<Vec<u8>>> {
        let byte_level = self.inner.get_decoder().is_some_and(is_byte_level);
        if !byte_level && !self.byte_fallback {
            return Err(tok_err(
                "this tokenizer's tokens do not spell bytes (neither byte-level nor byte \
                 fallback), so its vocabulary cannot be matched against a grammar",
            ));
        }
        let unicode_to_byte = byte_level.then(unicode_to_byte_table);
        let added = self.inner.get_added_vocabulary();
        let mut out = Vec::with_capacity(self.vocab_size);
        for id in 0..self.vocab_size as u32 {
            let Some(tok) = self.inner.id_to_token(id) else {
                out.push(Vec::new());
                continue;
            };
            if added.simple_id_to_token(id).is_some() {
                let mut b = Vec::with_capacity(tok.len() + 1);
                if added.is_special_token(&tok) {
                    b.push(SPECIAL_TOKEN_MARKER);
                }
                b.extend_from_slice(tok.as_bytes());
                out.push(b);
                continue;
            }
            let bytes = match &unicode_to_byte {
                Some(table) => tok
                    .chars()
                    .map(|c| table.get(c as usize).copied().flatten())
                    .collect::<Option<Vec<u8>>>()
                    .ok_or_else(|| {
                        tok_err(format!(
                            "token {id} ({tok:?}) is not spelled in byte-level symbols"
                        ))
                    })?,
                None => byte_fallback_bytes(&tok),
            };
            out.push(bytes);
        }
        Ok(out)
    }
}

fn is_byte_level(d: &DecoderWrapper) -> bool {
    match d {
        DecoderWrapper::ByteLevel(_) => true,
        DecoderWrapper::Sequence(s) => s.get_decoders().iter().any(is_byte_level),
        _ => false,
    }
}

/// `<0xNN>` is byte NN; otherwise the piece's text with `▁` as a space.
fn byte_fallback_bytes(tok: &str) -> Vec<u8> {
    if let Some(hex) = tok.strip_prefix("<0x").and_then(|t| t.strip_suffix('>')) {
        if let (2, Ok(b)) = (hex.len(), u8::from_str_radix(hex, 16)) {
            return vec![b];
        }
    }
    tok.replace('\u{2581}', " ").into_bytes()
}

/// GPT-2's byte-level alphabet reversed: code point -> byte (printable
/// Latin-1 bytes stand for themselves, the others for U+0100 onwards).
fn unicode_to_byte_table() -> Vec<Option<u8>> {
    let mut table = vec![None; 0x144];
    let mut next = 0x100usize;
    for b in 0..=255u8 {
        let c = b as usize;
        let printable = matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
        if printable {
            table[c] = Some(b);
        } else {
            table[next] = Some(b);
            next += 1;
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_alphabet_covers_every_byte_once() {
        let t = unicode_to_byte_table();
        let mut seen: Vec<u8> = t.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..=255u8).collect::<Vec<_>>());
        assert_eq!(t['Ġ' as usize], Some(b' '));
        assert_eq!(t['Ċ' as usize], Some(b'\n'));
    }

    #[test]
    fn token_bytes_spell_what_decode_gives_on_the_default_model() {
        let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let Ok(tok) = Tokenizer::from_gguf_file(&p) else {
            eprintln!("default model missing: skipped");
            return;
        };
        let bytes = tok.token_bytes().unwrap();
        assert_eq!(bytes.len(), tok.vocab_size());
        for text in [
            "Hello, world! {\"a\": [1, 2.5e-3]}\n\tdone",
            "の日本語テキスト🙂 café",
            "  leading spaces and\r\nCRLF",
        ] {
            let ids = tok.encode(text, false).unwrap();
            let joined: Vec<u8> = ids
                .iter()
                .flat_map(|&i| bytes[i as usize].clone())
                .collect();
            assert_eq!(joined, text.as_bytes(), "{text:?}");
        }
        // Special tokens carry the marker.
        let im_end = tok.token_to_id("<|im_end|>").unwrap();
        assert_eq!(bytes[im_end as usize][0], SPECIAL_TOKEN_MARKER);
        assert_eq!(&bytes[im_end as usize][1..], b"<|im_end|>");
    }

    #[test]
    fn byte_fallback_pieces() {
        assert_eq!(byte_fallback_bytes("<0x0A>"), b"\n");
        assert_eq!(byte_fallback_bytes("▁the"), b" the");
        assert_eq!(byte_fallback_bytes("<0xZZ>"), b"<0xZZ>");
    }
}
