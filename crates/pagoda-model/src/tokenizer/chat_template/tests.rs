//! Unit tests of template setup and errors; renderings are compared with
//! transformers in `tests/tokenizer_golden.rs`.

use super::*;
use serde_json::json;

fn template(src: &str) -> ChatTemplate {
    ChatTemplate::new(src, Some("<s>".into()), Some("</s>".into())).unwrap()
}

#[test]
fn syntax_errors_surface_at_construction() {
    let err = ChatTemplate::new("{% for m in messages %}", None, None).unwrap_err();
    assert!(matches!(err, ModelError::ChatTemplate(_)), "{err}");
}

#[test]
fn raise_exception_becomes_a_chat_template_error() {
    let t = template("{{ raise_exception('roles must alternate') }}");
    let err = t
        .apply(&[ChatMessage::new("user", "hi")], false)
        .unwrap_err();
    match err {
        ModelError::ChatTemplate(msg) => assert!(msg.contains("roles must alternate"), "{msg}"),
        other => panic!("wrong error {other}"),
    }
}

#[test]
fn content_parts_are_flattened_and_non_text_parts_rejected() {
    let t = template("{% for m in messages %}[{{ m.content }}]{% endfor %}");
    let msg: ChatMessage = serde_json::from_value(json!({
        "role": "user",
        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    }))
    .unwrap();
    assert_eq!(t.apply(&[msg], false).unwrap(), "[a\nb]");
    let img: ChatMessage = serde_json::from_value(json!({
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": "x"}}]
    }))
    .unwrap();
    assert!(matches!(
        t.apply(&[img], false),
        Err(ModelError::ChatTemplate(_))
    ));
}

#[test]
fn special_tokens_extra_fields_and_kwargs_reach_the_template() {
    let t = template(
        "{{ bos_token }}{% for m in messages %}{{ m.name }}{% endfor %}{{ enable_thinking }}{{ eos_token }}",
    );
    let mut m = ChatMessage::new("user", "x");
    m.extra.insert("name".into(), json!("bob"));
    let mut options = ChatTemplateOptions::default();
    options.extra.insert("enable_thinking".into(), json!(false));
    assert_eq!(t.render(&[m], &options).unwrap(), "<s>bobFalse</s>");
}
