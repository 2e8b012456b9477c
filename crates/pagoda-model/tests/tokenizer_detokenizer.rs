//! Streaming detokenization against whole-sequence decoding.
//!
//! The reference is `Tokenizer::decode` of all ids at once (the Hugging Face
//! `tokenizers` decoder). For random id sequences the streamed deltas must
//! concatenate to it, only ever extend a prefix of it, and never contain a
//! replacement character the full decode does not have at that place.
//! Two tokenizers: SmolLM2's byte-level BPE (saved Hugging Face form under
//! tests/golden) and a small SentencePiece-style byte-fallback BPE built here.

use pagoda_model::tokenizer::{IncrementalDetokenizer, Tokenizer};
use proptest::prelude::*;
use serde_json::json;
use std::path::PathBuf;
use std::sync::OnceLock;

fn smollm2() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let dir =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/smollm2-tokenizer");
        Tokenizer::from_hf_dir(dir).unwrap()
    })
}

/// A Llama-2-style tokenizer: `▁` for spaces, `<0xNN>` byte fallback, the
/// decoder strips the leading space.
fn byte_fallback() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let mut vocab = serde_json::Map::new();
        for t in ["<unk>", "<s>", "</s>"] {
            vocab.insert(t.into(), json!(vocab.len()));
        }
        for b in 0..=255u32 {
            vocab.insert(format!("<0x{b:02X}>"), json!(vocab.len()));
        }
        let pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "é", "▁h", "▁he", "ll", "▁hell", "▁hello", "▁w", "▁wor", "▁worl", "▁world", "or"];
        for p in pieces {
            if !vocab.contains_key(p) {
                vocab.insert(p.into(), json!(vocab.len()));
            }
        }
        let merges = ["▁ h", "▁h e", "l l", "▁he ll", "▁hell o", "▁ w", "o r", "▁w or", "▁wor l", "▁worl d"];
        let tokenizer_json = json!({
            "version": "1.0",
            "added_tokens": [
                {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
            ],
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
            ]},
            "pre_tokenizer": null,
            "post_processor": null,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}
            ]},
            "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                      "vocab": vocab, "merges": merges}
        });
        let dir = std::env::temp_dir().join(format!("pagoda-bytefallback-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), tokenizer_json.to_string()).unwrap();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            json!({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": true}).to_string(),
        )
        .unwrap();
        let tok = Tokenizer::from_hf_dir(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        tok
    })
}

/// Streams `ids` and checks every invariant against `decode(ids)`.
fn check_stream(tok: &Tokenizer, ids: &[u32], skip_special_tokens: bool) -> Vec<String> {
    let full = tok.decode(ids, skip_special_tokens).unwrap();
    let mut detok = IncrementalDetokenizer::new(tok, skip_special_tokens);
    let mut streamed = String::new();
    let mut deltas = Vec::new();
    for &id in ids {
        let delta = detok.step(id).unwrap();
        streamed.push_str(&delta);
        assert!(
            full.starts_with(&streamed),
            "streamed text {streamed:?} is not a prefix of {full:?} (ids {ids:?})"
        );
        deltas.push(delta);
    }
    let rest = detok.finish().unwrap();
    streamed.push_str(&rest);
    deltas.push(rest);
    assert_eq!(streamed, full, "ids {ids:?}");
    deltas
}

#[test]
fn multi_byte_characters_wait_until_complete() {
    let tok = smollm2();
    for text in [
        "Emoji: 😀🎉👍🏽 👨‍👩‍👧 ❤️",
        "CJK: 你好，世界。日本語のテキスト。한국어 텍스트",
        "Ångström",
    ] {
        let ids = tok.encode(text, false).unwrap();
        let deltas = check_stream(tok, &ids, false);
        assert!(deltas.iter().all(|d| !d.contains('\u{FFFD}')), "{deltas:?}");
        // A token that ends inside a character yields nothing until a later
        // token completes it.
        for (i, &id) in ids.iter().enumerate() {
            let so_far = tok.decode(&ids[..=i], false).unwrap();
            if so_far.ends_with(char::REPLACEMENT_CHARACTER) {
                assert_eq!(deltas[i], "", "token {id} at {i} of {text:?}");
            }
        }
        assert!(
            deltas.iter().any(|d| d.is_empty()),
            "{text:?} has no partial-character tokens"
        );
    }
}

#[test]
fn special_tokens_are_skipped_or_kept() {
    let tok = smollm2();
    let ids = tok
        .encode("<|im_start|>user\nHi 😀<|im_end|>", false)
        .unwrap();
    assert_eq!(check_stream(tok, &ids, true).concat(), "user\nHi 😀");
    assert_eq!(
        check_stream(tok, &ids, false).concat(),
        "<|im_start|>user\nHi 😀<|im_end|>"
    );
}

#[test]
fn byte_fallback_groups_and_leading_space() {
    let tok = byte_fallback();
    let ids = tok.encode("hello wörld é😀", false).unwrap();
    let text = check_stream(tok, &ids, false).concat();
    assert_eq!(text, "hello wörld é😀");
    // BOS comes from add_bos_token and is skipped on the way out.
    let with_bos = tok.encode("hello", true).unwrap();
    assert_eq!(with_bos[0], 1);
    assert_eq!(check_stream(tok, &with_bos, true).concat(), "hello");
}

#[test]
fn starting_after_a_prompt_emits_only_new_text() {
    let tok = smollm2();
    let prompt = tok.encode("The capital of France is", false).unwrap();
    let answer = tok.encode(" Paris 🗼.", false).unwrap();
    let mut detok = IncrementalDetokenizer::with_prompt(tok, true, &prompt).unwrap();
    let mut out = String::new();
    for &id in &answer {
        out.push_str(&detok.step(id).unwrap());
    }
    out.push_str(&detok.finish().unwrap());
    assert_eq!(out, " Paris 🗼.");
}

#[test]
fn long_streams_decode_only_a_small_window() {
    let tok = smollm2();
    let ids = tok
        .encode(
            &"Streaming 你好 😀 text, token by token.\n".repeat(300),
            false,
        )
        .unwrap();
    let mut detok = IncrementalDetokenizer::new(tok, false);
    let mut max_window = 0;
    for &id in &ids {
        detok.step(id).unwrap();
        max_window = max_window.max(detok.window_len());
    }
    assert!(ids.len() > 3000);
    // The longest character here spans 4 byte-level tokens.
    assert!(max_window <= 8, "window grew to {max_window}");
}

/// Ids biased towards tokens that hold part of a character.
fn ids_strategy(tok: &'static Tokenizer) -> impl Strategy<Value = Vec<u32>> {
    let vocab = tok.vocab_size() as u32;
    let partial: Vec<u32> = (0..vocab)
        .filter(|&id| {
            tok.token_to_piece(id)
                .is_some_and(|p| p.contains('\u{FFFD}'))
        })
        .collect();
    let partial = std::sync::Arc::new(partial);
    let one = prop_oneof![
        (0..vocab).boxed(),
        (0..partial.len().max(1))
            .prop_map(move |i| partial.get(i).copied().unwrap_or(0))
            .boxed(),
    ];
    prop::collection::vec(one, 0..48)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_byte_level_sequences_stream_like_decode(ids in ids_strategy(smollm2()), skip in any::<bool>()) {
        check_stream(smollm2(), &ids, skip);
    }

    #[test]
    fn random_byte_fallback_sequences_stream_like_decode(ids in ids_strategy(byte_fallback()), skip in any::<bool>()) {
        check_stream(byte_fallback(), &ids, skip);
    }

    /// Ids of valid text never stream a replacement character.
    #[test]
    fn valid_text_streams_without_replacement_chars(text in "[a-zé 你好😀🏽\n]{0,24}") {
        let tok = smollm2();
        let ids = tok.encode(&text, false).unwrap();
        let deltas = check_stream(tok, &ids, false);
        let clean = deltas.iter().all(|d| !d.contains(char::REPLACEMENT_CHARACTER));
        prop_assert!(clean);
        prop_assert_eq!(deltas.concat(), text);
    }
}
