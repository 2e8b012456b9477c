//! The SmolLM2 tokenizer against Hugging Face transformers.
//!
//! `tests/golden/smollm2_tokenizer.json` and `tests/golden/smollm2-tokenizer/`
//! are written by `scripts/golden/tokenizer.py` (transformers loading the
//! tokenizer from the GGUF file). Both of our constructors, from the GGUF
//! metadata and from the saved Hugging Face directory, must reproduce its
//! encodings, decodes and chat template renderings exactly.

use pagoda_model::loader::gguf::GgufSource;
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

fn gguf_spec() -> GgufTokenizerSpec {
    let path = repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let (_, source) = GgufSource::open(path).unwrap();
    source.tokenizer_metadata().unwrap()
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

#[test]
fn pre_tokenizer_splits_match_python_regex() {
    use pagoda_model::tokenizer::gguf::PreTokenizerKind;
    use tokenizers::decoders::byte_level::ByteLevel;
    use tokenizers::{Decoder, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
    let kinds = [
        ("gpt2", PreTokenizerKind::Gpt2),
        (
            "gpt2_individual_digits",
            PreTokenizerKind::Gpt2IndividualDigits,
        ),
        ("llama3", PreTokenizerKind::Llama3),
        ("qwen2", PreTokenizerKind::Qwen2),
    ];
    let byte_level = ByteLevel::default();
    for (name, kind) in kinds {
        let pre = kind.pre_tokenizer().unwrap();
        for case in golden()["pre_tokenizer_splits"][name].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let mut s = PreTokenizedString::from(text);
            pre.pre_tokenize(&mut s).unwrap();
            // Pieces come out in byte-level form; map them back to text.
            let pieces: Vec<String> = s
                .get_splits(OffsetReferential::Original, OffsetType::Byte)
                .into_iter()
                .map(|(piece, _, _)| byte_level.decode(vec![piece.to_string()]).unwrap())
                .collect();
            let expected: Vec<String> = serde_json::from_value(case["pieces"].clone()).unwrap();
            assert_eq!(pieces, expected, "{name}: {text:?}");
        }
    }
}

#[test]
fn tokenizer_and_template_can_be_shared_across_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Tokenizer>();
    shared::<ChatTemplate>();
}

#[test]
fn tokenizer_option_replaces_the_model_tokenizer() {
    use pagoda_model::open::{open_model, OpenOptions};
    let model = repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    // tokenizer.json alone, under another name: no tokenizer_config.json, so
    // no chat template comes with it (the GGUF's own tokenizer has one).
    let dir = std::env::temp_dir().join(format!("pagoda-tok-override-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("my-tokenizer.json");
    std::fs::copy(
        repo_root().join("tests/golden/smollm2-tokenizer/tokenizer.json"),
        &file,
    )
    .unwrap();
    let open = |tokenizer: Option<PathBuf>| {
        open_model(&OpenOptions {
            model: Some(model.clone()),
            tokenizer,
            ..Default::default()
        })
    };
    let own = open(None).unwrap().tokenizer.unwrap();
    let replaced = open(Some(file.clone())).unwrap().tokenizer.unwrap();
    assert!(own.chat_template().is_some());
    assert!(
        replaced.chat_template().is_none(),
        "the override was not used"
    );
    for case in golden()["encodings"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            replaced.encode(text, false).unwrap(),
            ids(&case["ids"]),
            "{text:?}"
        );
    }
    // A directory works too, with its config and template.
    let from_dir = open(Some(repo_root().join("tests/golden/smollm2-tokenizer")))
        .unwrap()
        .tokenizer
        .unwrap();
    assert!(from_dir.chat_template().is_some());
    // A missing file is an error naming it.
    let err = open(Some(dir.join("absent.json")))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("absent.json"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
