//! SentencePiece's text normalizer, as the sentencepiece library runs it
//! (`normalizer.cc`): the model's precompiled charsmap applied by
//! longest match over the whole text, then the whitespace rules.
//!
//! The `tokenizers` crate's `Precompiled` normalizer looks the charsmap up
//! per grapheme cluster and replaces a whole cluster by the entry of its
//! shortest matching prefix, so a combining mark after a space or a
//! zero-width character comes out differently; this normalizer is used
//! instead, on the text before the Unigram pipeline sees it.
//!
//! Rules, in sentencepiece's order: at each position the longest charsmap key
//! that prefixes the rest of the text is replaced by its value (one character
//! kept as it is where none matches); with `remove_extra_whitespaces`, spaces
//! (after the replacement) at the start are dropped, runs become one space
//! and trailing ones are dropped; with `add_dummy_prefix`, `▁` is put in
//! front (of non-empty text); every space becomes `▁`.
//!
//! Invariants: never panics on any charsmap bytes or text (a malformed map is
//! an error at construction; out-of-range trie offsets read as no match).
//! Costs: linear in the text times the longest key (a few bytes).

use super::tok_err;
use crate::Result;

const SPACE_MARK: &str = "\u{2581}";

/// A precompiled charsmap with sentencepiece's whitespace handling.
#[derive(Debug, Clone)]
pub(crate) struct SpmNormalizer {
    /// Darts-clone double-array units (empty: no charsmap).
    units: Vec<u32>,
    /// NUL-terminated replacement strings, indexed by trie values.
    normalized: String,
    remove_extra_whitespaces: bool,
    add_dummy_prefix: bool,
    /// User-defined pieces: kept as written, never normalized (longest first).
    user_defined: Vec<String>,
}

impl SpmNormalizer {
    /// Parses a `precompiled_charsmap` (`[u32 trie bytes][trie units][strings]`,
    /// little-endian; empty for none), with user-defined pieces, which
    /// sentencepiece matches before the charsmap and leaves as they are.
    pub fn with_user_defined(
        charsmap: &[u8],
        remove_extra_whitespaces: bool,
        add_dummy_prefix: bool,
        mut user_defined: Vec<String>,
    ) -> Result<Self> {
        user_defined.retain(|u| !u.is_empty());
        user_defined.sort_by_key(|u| std::cmp::Reverse(u.len()));
        let bad = |what: &str| tok_err(format!("bad precompiled_charsmap: {what}"));
        let (units, normalized) = if charsmap.is_empty() {
            (Vec::new(), String::new())
        } else {
            let Some((head, rest)) = charsmap.split_first_chunk::<4>() else {
                return Err(bad("shorter than its header"));
            };
            let trie_bytes = u32::from_le_bytes(*head) as usize;
            if !trie_bytes.is_multiple_of(4) || trie_bytes > rest.len() || trie_bytes == 0 {
                return Err(bad("trie size does not fit the data"));
            }
            let (trie, strings) = rest.split_at(trie_bytes);
            let units = trie
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let normalized = String::from_utf8(strings.to_vec())
                .map_err(|_| bad("replacement strings are not UTF-8"))?;
            (units, normalized)
        };
        Ok(SpmNormalizer {
            units,
            normalized,
            remove_extra_whitespaces,
            add_dummy_prefix,
            user_defined,
        })
    }

    /// The replacement of the longest charsmap key prefixing `input`, and the
    /// key's length; `None` where no key matches.
    fn longest_match(&self, input: &[u8]) -> Option<(&str, usize)> {
        // Darts-clone unit fields.
        let offset = |u: u32| ((u >> 10) << ((u & (1 << 9)) >> 6)) as usize;
        let has_leaf = |u: u32| (u >> 8) & 1 == 1;
        let label = |u: u32| u & ((1 << 31) | 0xFF);
        let value = |u: u32| (u & ((1 << 31) - 1)) as usize;
        let mut pos = offset(*self.units.first()?);
        let mut best = None;
        for (i, &c) in input.iter().enumerate() {
            if c == 0 {
                break;
            }
            pos ^= c as usize;
            let unit = *self.units.get(pos)?;
            if label(unit) != c as u32 {
                break;
            }
            pos ^= offset(unit);
            if has_leaf(unit) {
                best = Some((i + 1, value(*self.units.get(pos)?)));
            }
        }
        let (len, start) = best?;
        let rest = self.normalized.get(start..)?;
        let end = rest.find('\0').unwrap_or(rest.len());
        Some((&rest[..end], len))
    }

    /// The next piece of `input` after the charsmap: (replacement, bytes consumed).
    fn prefix<'a>(&'a self, input: &'a str) -> (&'a str, usize) {
        if let Some(u) = self
            .user_defined
            .iter()
            .find(|u| input.starts_with(u.as_str()))
        {
            return (&input[..u.len()], u.len());
        }
        if let Some((rep, len)) = self.longest_match(input.as_bytes()) {
            if input.is_char_boundary(len) {
                return (rep, len);
            }
        }
        let len = input.chars().next().map_or(input.len(), char::len_utf8);
        (&input[..len], len)
    }

    /// `text` normalized as sentencepiece does, spaces escaped as `▁`.
    pub fn normalize(&self, text: &str) -> String {
        let mut input = text;
        if self.remove_extra_whitespaces {
            loop {
                let (piece, len) = self.prefix(input);
                if input.is_empty() || piece != " " {
                    break;
                }
                input = &input[len..];
            }
        }
        let mut out = String::with_capacity(text.len() + 8);
        if input.is_empty() {
            return out;
        }
        if self.add_dummy_prefix {
            out.push_str(SPACE_MARK);
        }
        let mut prev_space = self.remove_extra_whitespaces;
        while !input.is_empty() {
            let (mut piece, len) = self.prefix(input);
            if prev_space && self.remove_extra_whitespaces {
                piece = piece.trim_start_matches(' ');
            }
            if !piece.is_empty() {
                for c in piece.chars() {
                    if c == ' ' {
                        out.push_str(SPACE_MARK);
                    } else {
                        out.push(c);
                    }
                }
                prev_space = piece.ends_with(' ');
            }
            input = &input[len..];
            if !self.remove_extra_whitespaces {
                prev_space = false;
            }
        }
        if self.remove_extra_whitespaces {
            while let Some(rest) = out.strip_suffix(SPACE_MARK) {
                out.truncate(rest.len());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whitespace_rules_without_a_charsmap() {
        let n = SpmNormalizer::with_user_defined(&[], true, true, vec![]).unwrap();
        assert_eq!(n.normalize("  a  b c  "), "▁a▁b▁c");
        assert_eq!(n.normalize("   "), "");
        assert_eq!(n.normalize(""), "");
        let keep = SpmNormalizer::with_user_defined(&[], false, false, vec![]).unwrap();
        assert_eq!(keep.normalize(" a  b "), "▁a▁▁b▁");
        let user = SpmNormalizer::with_user_defined(&[], true, true, vec!["<x y>".into()]).unwrap();
        // Kept whole (not collapsed or charsmapped), but spaces escaped, as in
        // sentencepiece.
        assert_eq!(user.normalize("a<x y>"), "▁a<x▁y>");
    }

    #[test]
    fn malformed_charsmaps_are_errors() {
        for bad in [
            &[1u8, 0][..],
            &[8, 0, 0, 0, 1, 2, 3][..],
            &[3, 0, 0, 0, 1, 2, 3][..],
        ] {
            assert!(
                SpmNormalizer::with_user_defined(bad, true, true, vec![]).is_err(),
                "{bad:?}"
            );
        }
        // A trie whose offsets point nowhere matches nothing.
        let n = SpmNormalizer::with_user_defined(
            &[4, 0, 0, 0, 0xff, 0xff, 0xff, 0xff],
            true,
            true,
            vec![],
        )
        .unwrap();
        assert_eq!(n.normalize("ab"), "▁ab");
    }
}
