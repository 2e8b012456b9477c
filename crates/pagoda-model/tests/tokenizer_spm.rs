//! SentencePiece BPE and Unigram tokenizers built from GGUF metadata, against
//! their references.
//!
//! - A Unigram model (`t5`): `tests/golden/unigram_tokenizer.json`, written by
//!   `scripts/golden/unigram_tokenizer.py`, holds what a GGUF would carry and
//!   the ids the sentencepiece library gives for 1,065 strings; the test
//!   writes the GGUF and reads the tokenizer back from it.
//! - A Llama-style model (dummy prefix, byte fallback, a user-defined token):
//!   `tests/golden/spm_llama_tokenizer.json`, written by
//!   `scripts/golden/spm_tokenizer.py`, holds the pieces, scores and token
//!   types a GGUF would carry and the ids the sentencepiece library gives.
//! - gemma-3-270m, from its GGUF, against Hugging Face transformers:
//!   `tests/golden/gemma3_tokenizer.json` is written by
//!   `scripts/golden/gemma_tokenizer.py` (a seeded fuzz corpus of 1,151 strings:
//!   unicode, whitespace runs, digits, code; the ids transformers' GGUF loader
//!   gives). The GGUF is not in the repository; the script says how to get it.
//!   It is looked for at `$PAGODA_GEMMA3_GGUF`, else
//!   `models/gemma-3-270m-q4_k_m.gguf`; when absent the test passes with a notice.

use pagoda_model::tokenizer::{GgufTokenizerSpec, Tokenizer};
use serde_json::Value;
use std::path::PathBuf;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn gguf_path() -> Option<PathBuf> {
    let path = std::env::var_os("PAGODA_GEMMA3_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("models/gemma-3-270m-q4_k_m.gguf"));
    path.is_file().then_some(path)
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn gemma3_gguf_tokenizer_matches_transformers_on_the_fuzz_corpus() {
    let Some(path) = gguf_path() else {
        eprintln!(
            "skipped: gemma-3-270m GGUF not found (set PAGODA_GEMMA3_GGUF; \
             scripts/golden/gemma_tokenizer.py says how to get it)"
        );
        return;
    };
    let golden: Value = serde_json::from_slice(
        &std::fs::read(repo_root().join("tests/golden/gemma3_tokenizer.json")).unwrap(),
    )
    .unwrap();
    // The architecture (gemma3) need not be supported: only metadata is read.
    let tok = Tokenizer::from_gguf_file(&path).unwrap();
    let bos = golden["bos_token_id"].as_u64().unwrap() as u32;
    assert_eq!(tok.bos_token_id(), Some(bos));
    assert_eq!(
        tok.eos_token_ids().first().copied(),
        golden["eos_token_id"].as_u64().map(|x| x as u32)
    );
    assert_eq!(
        tok.vocab_size(),
        golden["vocab_size"].as_u64().unwrap() as usize
    );
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 1000);
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let expected = ids(&case["ids"]);
        let got = tok.encode(text, false).unwrap();
        if got != expected {
            failures.push(format!("encode {text:?}: got {got:?}, want {expected:?}"));
            continue;
        }
        // BOS is prepended, but never twice (transformers would double a
        // `<bos>` written in the text; pagoda's encode does not).
        let mut with_bos = vec![bos];
        with_bos.extend(
            expected
                .iter()
                .skip(usize::from(expected.first() == Some(&bos))),
        );
        assert_eq!(tok.encode(text, true).unwrap(), with_bos, "{text:?}");
        let decoded = case.get("decoded").and_then(Value::as_str).unwrap_or(text);
        let got = tok.decode(&expected, false).unwrap();
        if got != decoded {
            failures.push(format!("decode {text:?}: got {got:?}, want {decoded:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures[..failures.len().min(20)].join("\n")
    );
}

#[test]
fn llama_style_sentencepiece_matches_the_sentencepiece_library() {
    let golden: Value = serde_json::from_slice(
        &std::fs::read(repo_root().join("tests/golden/spm_llama_tokenizer.json")).unwrap(),
    )
    .unwrap();
    let spec = GgufTokenizerSpec {
        model: "llama".into(),
        tokens: serde_json::from_value(golden["tokens"].clone()).unwrap(),
        scores: serde_json::from_value(golden["scores"].clone()).unwrap(),
        token_types: serde_json::from_value(golden["token_types"].clone()).unwrap(),
        bos_token_id: golden["bos_token_id"].as_u64().map(|x| x as u32),
        eos_token_id: golden["eos_token_id"].as_u64().map(|x| x as u32),
        architecture: Some("llama".into()),
        ..Default::default()
    };
    let tok = Tokenizer::from_gguf(&spec).unwrap();
    assert!(
        tok.add_bos_token(),
        "SentencePiece files add BOS unless they say not to"
    );
    assert_cases(&tok, &golden);
    // Without scores the merge order is unknown: an error, not a guess.
    let no_scores = GgufTokenizerSpec {
        scores: Vec::new(),
        ..spec
    };
    let err = Tokenizer::from_gguf(&no_scores).unwrap_err().to_string();
    assert!(err.contains("scores"), "{err}");
}

/// The Unigram model of `tests/golden/unigram_tokenizer.json` written as
/// llama.cpp's converter lays out a `t5` vocabulary (tokens, scores, token
/// types, the precompiled charsmap as a u8 array, the whitespace flags), and
/// read back from the file's metadata.
fn unigram_gguf(golden: &Value) -> Tokenizer {
    use pagoda_gguf::{GgufWriter, MetadataArray, MetadataValue};
    let strings = |k: &str| -> Vec<String> { serde_json::from_value(golden[k].clone()).unwrap() };
    let id = |k: &str| MetadataValue::U32(golden[k].as_u64().unwrap() as u32);
    let flag = |k: &str| MetadataValue::Bool(golden[k].as_bool().unwrap());
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", MetadataValue::String("t5".into()))
        .add_metadata("tokenizer.ggml.model", MetadataValue::String("t5".into()))
        .add_metadata(
            "tokenizer.ggml.tokens",
            MetadataValue::Array(MetadataArray::String(strings("tokens"))),
        )
        .add_metadata(
            "tokenizer.ggml.scores",
            MetadataValue::Array(MetadataArray::F32(
                serde_json::from_value(golden["scores"].clone()).unwrap(),
            )),
        )
        .add_metadata(
            "tokenizer.ggml.token_type",
            MetadataValue::Array(MetadataArray::I32(
                serde_json::from_value(golden["token_types"].clone()).unwrap(),
            )),
        )
        .add_metadata(
            "tokenizer.ggml.precompiled_charsmap",
            MetadataValue::Array(MetadataArray::U8(base64_decode(
                golden["precompiled_charsmap"].as_str().unwrap(),
            ))),
        )
        .add_metadata("tokenizer.ggml.add_space_prefix", flag("add_space_prefix"))
        .add_metadata(
            "tokenizer.ggml.remove_extra_whitespaces",
            flag("remove_extra_whitespaces"),
        )
        .add_metadata("tokenizer.ggml.unknown_token_id", id("unknown_token_id"))
        .add_metadata("tokenizer.ggml.bos_token_id", id("bos_token_id"))
        .add_metadata("tokenizer.ggml.eos_token_id", id("eos_token_id"));
    let path = std::env::temp_dir().join(format!("pagoda-unigram-{}.gguf", std::process::id()));
    w.write(&path).unwrap();
    let tok = Tokenizer::from_gguf_file(&path).unwrap();
    std::fs::remove_file(&path).ok();
    tok
}

/// A SentencePiece Unigram model (nmt_nfkc charsmap, extra-whitespace
/// removal, dummy prefix, byte fallback) trained by
/// `scripts/golden/unigram_tokenizer.py`, from a GGUF, against the
/// sentencepiece library on a fuzz corpus of 1,065 strings (unicode,
/// combining marks next to spaces and zero-width characters, whitespace
/// runs, digits, code): every id and every decoded text.
#[test]
fn unigram_matches_the_sentencepiece_library() {
    let golden: Value = serde_json::from_slice(
        &std::fs::read(repo_root().join("tests/golden/unigram_tokenizer.json")).unwrap(),
    )
    .unwrap();
    let tok = unigram_gguf(&golden);
    assert_eq!(tok.model_kind(), "SentencePiece Unigram");
    // Its normalization deletes text (whitespace runs), so no length bound.
    assert_eq!(tok.max_bytes_per_token(), None);
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 1000, "{} cases", cases.len());
    // EOS is appended with special tokens (llama.cpp's default for t5), BOS not.
    let eos = golden["eos_token_id"].as_u64().unwrap() as u32;
    let with_special = tok.encode("Hello", true).unwrap();
    assert_eq!(with_special.last(), Some(&eos));
    assert_eq!(
        &with_special[..with_special.len() - 1],
        tok.encode("Hello", false).unwrap()
    );
    let spec = GgufTokenizerSpec {
        model: "t5".into(),
        tokens: serde_json::from_value(golden["tokens"].clone()).unwrap(),
        scores: vec![0.0],
        ..Default::default()
    };
    let err = Tokenizer::from_gguf(&spec).err().unwrap().to_string();
    assert!(err.contains("scores"), "{err}");

    assert_cases(&tok, &golden);
}

/// Every golden case encodes to its ids and decodes back to its text (or to
/// its "decoded" form where the tokenizer normalizes); lists the first 20
/// differences.
fn assert_cases(tok: &Tokenizer, golden: &Value) {
    let mut failures = Vec::new();
    let cases = golden["cases"].as_array().unwrap();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let expected = ids(&case["ids"]);
        let got = tok.encode(text, false).unwrap();
        if got != expected {
            failures.push(format!("encode {text:?}: got {got:?}, want {expected:?}"));
            continue;
        }
        let decoded = case.get("decoded").and_then(Value::as_str).unwrap_or(text);
        let got = tok.decode(&expected, false).unwrap();
        if got != decoded {
            failures.push(format!("decode {text:?}: got {got:?}, want {decoded:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures[..failures.len().min(20)].join("\n")
    );
}

/// Standard base64 (with `=` padding), enough for the golden file.
fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes().filter(|&c| c != b'=') {
        let v = ALPHABET.iter().position(|&a| a == c).unwrap() as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}
