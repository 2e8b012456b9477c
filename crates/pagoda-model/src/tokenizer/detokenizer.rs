//! Streaming detokenization: token ids in, text deltas out.
//!
//! The vLLM scheme of two offsets into the ids: `read_offset` marks the ids
//! whose text has been emitted, and `prefix_offset` (an earlier settled
//! point) starts the window that is decoded. Each step decodes
//! `window[prefix..]` and emits what extends past `decode(window[prefix..read])`
//! (kept as `prefix_text`). Decoding from an earlier point instead of from
//! `read_offset` keeps decoders that look at the previous token (leading-space
//! stripping in SentencePiece, byte-level merges) correct.
//!
//! Invariants:
//! - A delta never holds part of a character: while the window's text ends in
//!   U+FFFD (an incomplete UTF-8 sequence from byte-level or byte-fallback
//!   tokens), or its last token is a `<0xNN>` byte-fallback token (or one
//!   that decodes to nothing, such as a skipped special token), nothing is
//!   emitted and the ids stay pending until a later token completes them.
//! - The concatenation of every delta plus [`IncrementalDetokenizer::finish`]
//!   equals `decode(all ids)` for byte-level and byte-fallback tokenizers:
//!   settled points only fall after complete characters, where decoding is
//!   concatenative.
//!
//! Cost: O(1) amortized per token. Only the window (last emitted chunk plus
//! pending ids, a handful of tokens) is decoded, and ids before it are dropped.
//! A run of ids that never forms valid UTF-8 keeps growing the window until
//! a valid character or `finish`.

use super::Tokenizer;
use crate::Result;
use std::ops::Deref;

/// Turns a stream of token ids into text deltas.
///
/// `T` is how the tokenizer is held: `&Tokenizer` for a scoped stream,
/// `Arc<Tokenizer>` for one that lives inside a long-running engine.
pub struct IncrementalDetokenizer<T: Deref<Target = Tokenizer>> {
    tokenizer: T,
    skip_special_tokens: bool,
    /// Ids from `prefix_offset` on; earlier ids are no longer needed.
    window: Vec<u32>,
    /// `read_offset - prefix_offset`: ids of the window already emitted.
    read: usize,
    /// `decode(window[..read])`.
    prefix_text: String,
    /// Ids seen so far.
    num_tokens: usize,
}

impl<T: Deref<Target = Tokenizer>> IncrementalDetokenizer<T> {
    pub fn new(tokenizer: T, skip_special_tokens: bool) -> Self {
        Self {
            tokenizer,
            skip_special_tokens,
            window: Vec::new(),
            read: 0,
            prefix_text: String::new(),
            num_tokens: 0,
        }
    }

    /// Starts after `prompt_ids` without emitting their text, so the first
    /// generated token decodes in context (vLLM uses the last few prompt ids).
    pub fn with_prompt(
        tokenizer: T,
        skip_special_tokens: bool,
        prompt_ids: &[u32],
    ) -> Result<Self> {
        // Enough context for any decoder that looks back, while staying small.
        const CONTEXT: usize = 5;
        let mut this = Self::new(tokenizer, skip_special_tokens);
        let start = prompt_ids.len().saturating_sub(CONTEXT);
        this.window = prompt_ids[start..].to_vec();
        this.read = this.window.len();
        this.prefix_text = this.decode_window(this.read)?;
        Ok(this)
    }

    /// Number of ids fed through [`Self::step`].
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// Ids currently kept for decoding (the last emitted chunk plus pending
    /// ids); stays small whatever the stream length.
    pub fn window_len(&self) -> usize {
        self.window.len()
    }

    /// Feeds one id; returns the new text (empty while it is pending).
    pub fn step(&mut self, id: u32) -> Result<String> {
        self.window.push(id);
        self.num_tokens += 1;
        // A token that decodes to nothing (a skipped special token, an
        // unknown id) changes no text: deciding now could wrongly settle a
        // byte-fallback group that the following bytes extend.
        let silent = self.tokenizer.id_to_token(id).is_none()
            || (self.skip_special_tokens && self.tokenizer.is_special(id));
        if silent || (self.tokenizer.byte_fallback() && is_byte_fallback_token(&self.tokenizer, id))
        {
            return Ok(String::new());
        }
        let text = self.decode_window(self.window.len())?;
        if text.ends_with('\u{FFFD}')
            || text.len() <= self.prefix_text.len()
            || !text.starts_with(&self.prefix_text)
        {
            return Ok(String::new());
        }
        let delta = text[self.prefix_text.len()..].to_string();
        // The ids just emitted become the next window's prefix.
        self.window.drain(..self.read);
        self.read = self.window.len();
        self.prefix_text = self.decode_window(self.read)?;
        Ok(delta)
    }

    /// Flushes pending text at the end of the stream (an incomplete character
    /// comes out as U+FFFD, as `decode` writes it).
    pub fn finish(&mut self) -> Result<String> {
        let text = self.decode_window(self.window.len())?;
        let delta = match text.strip_prefix(self.prefix_text.as_str()) {
            Some(rest) => rest.to_string(),
            None => String::new(),
        };
        self.window.drain(..self.read);
        self.read = self.window.len();
        self.prefix_text = self.decode_window(self.read)?;
        Ok(delta)
    }

    fn decode_window(&self, end: usize) -> Result<String> {
        self.tokenizer
            .decode(&self.window[..end], self.skip_special_tokens)
    }
}

/// Whether `id` is a `<0xNN>` token (a single byte in byte-fallback models).
fn is_byte_fallback_token(tokenizer: &Tokenizer, id: u32) -> bool {
    tokenizer.id_to_token(id).is_some_and(|t| {
        let b = t.as_bytes();
        b.len() == 6
            && t.starts_with("<0x")
            && b[5] == b'>'
            && b[3..5].iter().all(u8::is_ascii_hexdigit)
    })
}
