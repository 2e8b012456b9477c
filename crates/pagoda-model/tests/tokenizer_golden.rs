//! The SmolLM2 tokenizer against Hugging Face transformers.
//!
//! `tests/golden/smollm2_tokenizer.json` and `tests/golden/smollm2-tokenizer/`
//! are written by `scripts/golden/tokenizer.py` (transformers loading the
//! tokenizer from the GGUF file). Both of our constructors, from the GGUF
//! metadata and from the saved Hugging Face directory, must reproduce its
//! encodings, decodes and chat template renderings exactly.

mod gguf_meta {
    //! Just enough of a GGUF header reader to pull `tokenizer.*` metadata
    //! (the model crate's own loader is exercised elsewhere).
    use std::io::{BufReader, Read};

    #[derive(Debug, Clone)]
    pub enum Meta {
        Int(i64),
        Bool(bool),
        Str(String),
        Strs(Vec<String>),
        Ints(Vec<i64>),
        Other,
    }

    fn u32_(r: &mut impl Read) -> u32 {
        let mut b = [0u8; 4];
        r.read_exact(&mut b).unwrap();
        u32::from_le_bytes(b)
    }
    fn u64_(r: &mut impl Read) -> u64 {
        let mut b = [0u8; 8];
        r.read_exact(&mut b).unwrap();
        u64::from_le_bytes(b)
    }
    fn string(r: &mut impl Read) -> String {
        let n = u64_(r) as usize;
        let mut b = vec![0u8; n];
        r.read_exact(&mut b).unwrap();
        String::from_utf8(b).unwrap()
    }
    fn scalar(r: &mut impl Read, ty: u32) -> Meta {
        let mut fixed = |n: usize| {
            let mut b = [0u8; 8];
            r.read_exact(&mut b[..n]).unwrap();
            b
        };
        match ty {
            0 => Meta::Int(fixed(1)[0] as i64),
            1 => Meta::Int(fixed(1)[0] as i8 as i64),
            2 => Meta::Int(u16::from_le_bytes(fixed(2)[..2].try_into().unwrap()) as i64),
            3 => Meta::Int(i16::from_le_bytes(fixed(2)[..2].try_into().unwrap()) as i64),
            4 => Meta::Int(u32::from_le_bytes(fixed(4)[..4].try_into().unwrap()) as i64),
            5 => Meta::Int(i32::from_le_bytes(fixed(4)[..4].try_into().unwrap()) as i64),
            6 => {
                fixed(4);
                Meta::Other
            }
            7 => Meta::Bool(fixed(1)[0] != 0),
            10 | 11 => Meta::Int(i64::from_le_bytes(fixed(8))),
            12 => {
                fixed(8);
                Meta::Other
            }
            _ => panic!("unexpected GGUF scalar type {ty}"),
        }
    }

    /// Every metadata key/value of a GGUF file (v2/v3).
    pub fn read(path: &std::path::Path) -> Vec<(String, Meta)> {
        let mut r = BufReader::new(std::fs::File::open(path).unwrap());
        assert_eq!(u32_(&mut r), u32::from_le_bytes(*b"GGUF"));
        assert!(u32_(&mut r) >= 2);
        let _tensors = u64_(&mut r);
        let kvs = u64_(&mut r);
        (0..kvs)
            .map(|_| {
                let key = string(&mut r);
                let value = match u32_(&mut r) {
                    8 => Meta::Str(string(&mut r)),
                    9 => {
                        let ty = u32_(&mut r);
                        let n = u64_(&mut r) as usize;
                        if ty == 8 {
                            Meta::Strs((0..n).map(|_| string(&mut r)).collect())
                        } else {
                            let items: Vec<_> = (0..n).map(|_| scalar(&mut r, ty)).collect();
                            Meta::Ints(
                                items
                                    .into_iter()
                                    .map(|m| if let Meta::Int(i) = m { i } else { 0 })
                                    .collect(),
                            )
                        }
                    }
                    ty => scalar(&mut r, ty),
                };
                (key, value)
            })
            .collect()
    }
}

use gguf_meta::Meta;
use pagoda_model::tokenizer::{
    ChatMessage, ChatTemplate, ChatTemplateOptions, GgufTokenizerSpec, Tokenizer,
};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::OnceLock;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn golden() -> &'static Value {
    static G: OnceLock<Value> = OnceLock::new();
    G.get_or_init(|| {
        let path = repo_root().join("tests/golden/smollm2_tokenizer.json");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    })
}

pub fn gguf_spec() -> GgufTokenizerSpec {
    let path = repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut spec = GgufTokenizerSpec::default();
    for (key, value) in gguf_meta::read(&path) {
        match (key.as_str(), value) {
            ("tokenizer.ggml.model", Meta::Str(s)) => spec.model = s,
            ("tokenizer.ggml.pre", Meta::Str(s)) => spec.pre = Some(s),
            ("tokenizer.ggml.tokens", Meta::Strs(v)) => spec.tokens = v,
            ("tokenizer.ggml.merges", Meta::Strs(v)) => spec.merges = v,
            ("tokenizer.ggml.token_type", Meta::Ints(v)) => {
                spec.token_types = v.into_iter().map(|x| x as i32).collect()
            }
            ("tokenizer.ggml.bos_token_id", Meta::Int(i)) => spec.bos_token_id = Some(i as u32),
            ("tokenizer.ggml.eos_token_id", Meta::Int(i)) => spec.eos_token_id = Some(i as u32),
            ("tokenizer.ggml.add_bos_token", Meta::Bool(b)) => spec.add_bos_token = Some(b),
            ("tokenizer.ggml.add_eos_token", Meta::Bool(b)) => spec.add_eos_token = Some(b),
            ("tokenizer.chat_template", Meta::Str(s)) => spec.chat_template = Some(s),
            _ => {}
        }
    }
    spec
}

fn from_gguf() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_gguf(&gguf_spec()).unwrap())
}

fn from_hf_dir() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        Tokenizer::from_hf_dir(repo_root().join("tests/golden/smollm2-tokenizer")).unwrap()
    })
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn check_encodings(tok: &Tokenizer, source: &str) {
    for case in golden()["encodings"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let expected = ids(&case["ids"]);
        assert_eq!(
            tok.encode(text, false).unwrap(),
            expected,
            "{source}: encode {text:?}"
        );
        assert_eq!(
            tok.encode(text, true).unwrap(),
            ids(&case["ids_with_special"]),
            "{source}: encode with special tokens {text:?}"
        );
        assert_eq!(
            tok.decode(&expected, false).unwrap(),
            case["decoded"],
            "{source}: decode {text:?}"
        );
        assert_eq!(
            tok.decode(&expected, true).unwrap(),
            case["decoded_skip_special"],
            "{source}: decode skipping special tokens {text:?}"
        );
    }
}

fn check_special_tokens(tok: &Tokenizer) {
    let g = golden();
    assert_eq!(tok.vocab_size() as u64, g["vocab_size"].as_u64().unwrap());
    assert_eq!(tok.bos_token(), g["bos_token"].as_str());
    assert_eq!(tok.eos_token(), g["eos_token"].as_str());
    assert_eq!(
        tok.bos_token_id().map(u64::from),
        g["bos_token_id"].as_u64()
    );
    assert_eq!(
        tok.eos_token_ids().first().map(|&x| x as u64),
        g["eos_token_id"].as_u64()
    );
}

fn check_chats(tok: &Tokenizer) {
    let template = tok.chat_template().expect("SmolLM2 has a chat template");
    assert_eq!(
        template.source(),
        golden()["chat_template"].as_str().unwrap()
    );
    for case in golden()["chats"].as_array().unwrap() {
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        assert_eq!(
            template.apply(&messages, agp).unwrap(),
            case["text"].as_str().unwrap(),
            "chat {} add_generation_prompt={agp}",
            case["name"]
        );
    }
}

#[test]
fn the_capital_of_france() {
    let ids = from_gguf()
        .encode("The capital of France is", true)
        .unwrap();
    assert_eq!(ids, [504, 3575, 282, 4649, 314]);
}

#[test]
fn gguf_tokenizer_matches_transformers() {
    check_special_tokens(from_gguf());
    check_encodings(from_gguf(), "gguf");
    check_chats(from_gguf());
}

#[test]
fn hf_dir_tokenizer_matches_transformers() {
    check_special_tokens(from_hf_dir());
    check_encodings(from_hf_dir(), "hf dir");
    check_chats(from_hf_dir());
}

#[test]
fn special_tokens_are_flagged_and_pieces_decode() {
    let tok = from_gguf();
    assert!(tok.is_special(1) && tok.is_special(2));
    assert!(!tok.is_special(504));
    assert_eq!(tok.token_to_piece(504).as_deref(), Some("The"));
    assert_eq!(tok.token_to_piece(3575).as_deref(), Some(" capital"));
    assert_eq!(tok.token_to_piece(u32::MAX), None);
}

#[test]
fn custom_templates_render_like_transformers() {
    let g = &golden()["custom_templates"];
    let messages: Vec<ChatMessage> = serde_json::from_value(g["messages"].clone()).unwrap();
    let options = ChatTemplateOptions {
        add_generation_prompt: true,
        tools: Some(g["tools"].as_array().unwrap().clone()),
        ..Default::default()
    };
    let (bos, eos) = (from_gguf().bos_token(), from_gguf().eos_token());
    for case in g["cases"].as_array().unwrap() {
        let t = ChatTemplate::new(
            case["template"].as_str().unwrap(),
            bos.map(str::to_string),
            eos.map(str::to_string),
        )
        .unwrap();
        assert_eq!(
            t.render(&messages, &options).unwrap(),
            case["text"].as_str().unwrap(),
            "template {}",
            case["name"]
        );
    }
}
