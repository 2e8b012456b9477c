//! The built-in Gemma chat template (for Gemma GGUF files that carry none)
//! against llama.cpp's built-in Gemma format (tests/golden/
//! gemma_chat_template.json, from llama-server's /apply-template): equal
//! after the BOS the template writes first; roles that do not alternate are
//! a clear error; and the real gemma-3-270m GGUF (when fetched, as
//! scripts/test.sh does) gets the template and `<end_of_turn>` as a second
//! end-of-sequence id.

use pagoda_model::tokenizer::{builtin, ChatMessage, ChatTemplate, Tokenizer};
use serde_json::Value;
use std::path::Path;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn gemma() -> ChatTemplate {
    let src = builtin::chat_template(Some("gemma3")).expect("a Gemma template");
    ChatTemplate::new(src, Some("<bos>".into()), Some("<eos>".into())).unwrap()
}

#[test]
fn builtin_gemma_template_renders_as_llama_cpp() {
    let text =
        std::fs::read_to_string(root().join("tests/golden/gemma_chat_template.json")).unwrap();
    let golden: Value = serde_json::from_str(&text).unwrap();
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 4);
    let t = gemma();
    for c in cases {
        let messages: Vec<ChatMessage> = serde_json::from_value(c["messages"].clone()).unwrap();
        let got = t
            .apply(&messages, c["add_generation_prompt"].as_bool().unwrap())
            .unwrap();
        let want = format!("<bos>{}", c["prompt"].as_str().unwrap());
        assert_eq!(got, want, "{}", c["messages"]);
    }
    for arch in ["gemma", "gemma2", "gemma3"] {
        assert!(builtin::chat_template(Some(arch)).is_some());
    }
    assert!(builtin::chat_template(Some("llama")).is_none());
    assert!(builtin::chat_template(None).is_none());
}

#[test]
fn roles_must_alternate() {
    let t = gemma();
    let two_users = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
    let e = t.apply(&two_users, true).unwrap_err().to_string();
    assert!(e.contains("alternate"), "{e}");
}

#[test]
fn gemma_gguf_gets_the_template_and_end_of_turn() {
    let path = std::env::var_os("PAGODA_GEMMA3_GGUF")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root().join("models/gemma-3-270m-q4_k_m.gguf"));
    if !path.is_file() {
        eprintln!("skipped: gemma-3-270m GGUF not found (scripts/fetch-gemma3.sh fetches it)");
        return;
    }
    let tok = Tokenizer::from_gguf_file(&path).unwrap();
    assert!(tok.chat_template().is_some());
    let end_of_turn = tok.encode("<end_of_turn>", false).unwrap();
    assert_eq!(end_of_turn.len(), 1);
    assert!(
        tok.eos_token_ids().contains(&end_of_turn[0]),
        "{:?}",
        tok.eos_token_ids()
    );
    assert!(tok.eos_token_ids().contains(&1), "<eos> stays an end");
    let prompt = tok
        .chat_template()
        .unwrap()
        .apply(&[ChatMessage::new("user", "Hi")], true)
        .unwrap();
    assert_eq!(
        prompt,
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    );
}
