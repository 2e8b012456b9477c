//! What a GGUF file of a known family leaves out of its tokenizer metadata
//! and the family's own tokenizer config would give: a chat template for
//! files that carry none, and the end-of-turn token its generation config
//! lists as a second end-of-sequence id.
//!
//! Only Gemma (gemma, gemma2, gemma3) so far: its GGUF conversions often lack
//! `tokenizer.chat_template`, and its chat turns end with `<end_of_turn>`
//! (Hugging Face's generation config: eos ids `<eos>` and `<end_of_turn>`).
//! The template's output is checked against llama.cpp's built-in Gemma
//! format (tests/golden/gemma_chat_template.json).

/// The built-in chat template of `architecture`, if pagoda has one.
pub fn chat_template(architecture: Option<&str>) -> Option<&'static str> {
    is_gemma(architecture).then_some(include_str!("templates/gemma.jinja"))
}

/// Extra end-of-sequence tokens (by text) of `architecture`.
pub fn end_of_turn_tokens(architecture: Option<&str>) -> &'static [&'static str] {
    if is_gemma(architecture) {
        &["<end_of_turn>"]
    } else {
        &[]
    }
}

fn is_gemma(architecture: Option<&str>) -> bool {
    matches!(
        architecture,
        Some("gemma" | "gemma2" | "gemma3" | "gemma3_text")
    )
}
