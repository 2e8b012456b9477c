//! Chat requests with tools render as transformers renders them: the golden
//! cases of scripts/golden/chat_template_tools.py (OpenAI-form messages with
//! tool calls and results, tools, template kwargs) through the server's
//! message conversion and pagoda's template engine.

use pagoda_model::tokenizer::{ChatTemplate, ChatTemplateOptions};
use pagoda_server::openai::ChatMessageIn;
use pagoda_server::tools::request::template_messages;
use serde_json::Value;
use std::path::PathBuf;

#[test]
fn tool_conversations_render_like_transformers() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("tests/golden/chat_template_tools.json")).unwrap(),
    )
    .unwrap();
    let source = std::fs::read_to_string(root.join(golden["template"].as_str().unwrap())).unwrap();
    let template = ChatTemplate::new(&source, None, None).unwrap();
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 2);
    for case in cases {
        let messages: Vec<ChatMessageIn> =
            serde_json::from_value(case["messages"].clone()).unwrap();
        let messages = template_messages(&messages, false).unwrap();
        let options = ChatTemplateOptions {
            add_generation_prompt: true,
            tools: case["tools"].as_array().cloned(),
            extra: case["kwargs"].as_object().cloned().unwrap(),
        };
        let rendered = template.render(&messages, &options).unwrap();
        assert_eq!(
            rendered,
            case["rendered"].as_str().unwrap(),
            "{}",
            case["name"]
        );
    }
}
