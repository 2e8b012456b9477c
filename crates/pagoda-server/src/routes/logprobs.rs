//! Engine logprobs -> OpenAI's two shapes: the legacy completion object
//! (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`) and the chat
//! API's `content` list (`token`, `logprob`, `bytes`, `top_logprobs`).
//!
//! A token's text is its decoded piece, or `token_id:N` where the request
//! asks (`return_tokens_as_token_ids`, vLLM's form; offsets and bytes still
//! follow the decoded text); its bytes are the piece's UTF-8, or, for a token
//! holding part of a character (decoded as U+FFFD), the raw bytes from the
//! vocabulary entry (byte-level `Ġ`-style or `<0xNN>` form).

use crate::openai::{
    ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, PromptLogprobs, PromptTokenLogprob,
    TopLogprob,
};
use pagoda_engine::prompt_logprobs::PromptLogprob;
use pagoda_engine::sampler::TokenLogprobs;
use pagoda_model::tokenizer::Tokenizer;
use std::collections::BTreeMap;

/// The text of one token on its own.
pub fn token_text(tokenizer: &Tokenizer, id: u32) -> String {
    tokenizer.token_to_piece(id).unwrap_or_default()
}

/// The name of a token in logprobs: its text, or `token_id:N` (`as_id`).
pub fn token_name(tokenizer: &Tokenizer, id: u32, as_id: bool) -> String {
    if as_id {
        format!("token_id:{id}")
    } else {
        token_text(tokenizer, id)
    }
}

/// The bytes one token stands for.
pub fn token_bytes(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    let piece = token_text(tokenizer, id);
    if !piece.contains('\u{FFFD}') {
        return piece.into_bytes();
    }
    let Some(entry) = tokenizer.id_to_token(id) else {
        return piece.into_bytes();
    };
    if let Some(hex) = entry.strip_prefix("<0x").and_then(|s| s.strip_suffix('>')) {
        if let Ok(b) = u8::from_str_radix(hex, 16) {
            return vec![b];
        }
    }
    entry
        .chars()
        .map(byte_level_to_byte)
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| piece.into_bytes())
}

/// The byte a GPT-2 byte-level character stands for: printable Latin-1
/// bytes map to themselves, the other 68 bytes to U+0100.. in byte order.
fn byte_level_to_byte(c: char) -> Option<u8> {
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let cp = c as u32;
    if printable(cp) {
        return Some(cp as u8);
    }
    let k = cp.checked_sub(0x100)?;
    (0u32..256)
        .filter(|&b| !printable(b))
        .nth(k as usize)
        .map(|b| b as u8)
}

/// vLLM's `prompt_logprobs` of a prompt from the engine's entries (one per
/// prompt token after the first): `null` for the first token, then each
/// token with its rank and the alternatives not already listed.
pub fn prompt_logprobs(
    tokenizer: &Tokenizer,
    entries: &[PromptLogprob],
    as_ids: bool,
) -> PromptLogprobs {
    // JSON has no -inf: vLLM writes -9999.0.
    let clamp = |l: f32| if l == f32::NEG_INFINITY { -9999.0 } else { l };
    let one = |id: u32, logprob: f32, rank: u32| {
        (
            id,
            PromptTokenLogprob {
                logprob: clamp(logprob),
                rank,
                decoded_token: token_name(tokenizer, id, as_ids),
            },
        )
    };
    let mut out = vec![None];
    for e in entries {
        let mut m = vec![one(e.token, e.logprob, e.rank)];
        for (i, &(id, lp)) in e.top.iter().enumerate() {
            if id != e.token {
                m.push(one(id, lp, i as u32 + 1));
            }
        }
        out.push(Some(m));
    }
    PromptLogprobs(out)
}

/// The legacy completion logprobs of `tokens`, whose text starts at byte
/// `offset` of the choice's text.
pub fn completion_logprobs(
    tokenizer: &Tokenizer,
    tokens: &[(u32, TokenLogprobs)],
    mut offset: usize,
    as_ids: bool,
) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for (id, lp) in tokens {
        let text = token_text(tokenizer, *id);
        out.text_offset.push(offset);
        offset += text.len();
        out.tokens.push(token_name(tokenizer, *id, as_ids));
        out.token_logprobs.push(lp.logprob);
        let mut top = BTreeMap::new();
        for &(t, l) in &lp.top {
            top.entry(token_name(tokenizer, t, as_ids)).or_insert(l);
        }
        out.top_logprobs.push(top);
    }
    out
}

/// The chat logprobs of `tokens`.
pub fn chat_logprobs(
    tokenizer: &Tokenizer,
    tokens: &[(u32, TokenLogprobs)],
    as_ids: bool,
) -> ChatLogprobs {
    let content = tokens
        .iter()
        .map(|(id, lp)| ChatTokenLogprob {
            token: token_name(tokenizer, *id, as_ids),
            logprob: lp.logprob,
            bytes: token_bytes(tokenizer, *id),
            top_logprobs: lp
                .top
                .iter()
                .map(|&(t, l)| TopLogprob {
                    token: token_name(tokenizer, t, as_ids),
                    logprob: l,
                    bytes: token_bytes(tokenizer, t),
                })
                .collect(),
        })
        .collect();
    ChatLogprobs { content }
}

#[cfg(test)]
mod tests {
    use super::byte_level_to_byte;

    #[test]
    fn byte_level_alphabet_inverts() {
        assert_eq!(byte_level_to_byte('a'), Some(b'a'));
        assert_eq!(byte_level_to_byte('Ġ'), Some(b' '));
        assert_eq!(byte_level_to_byte('Ċ'), Some(b'\n'));
        assert_eq!(byte_level_to_byte('\u{100}'), Some(0));
        assert_eq!(byte_level_to_byte('é'), Some(0xE9));
        assert_eq!(byte_level_to_byte('▁'), None);
    }
}
