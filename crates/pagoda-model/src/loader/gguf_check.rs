//! What a GGUF file needs that pagoda lacks, read from its header alone.
//!
//! [`missing_support`] looks at the architecture, the tensor types and the
//! tokenizer metadata of an opened [`GgufFile`] (header and metadata only; no
//! tensor data is read) and lists every unsupported thing at once, so a user
//! learns all of them before any weight is loaded. An empty list means the
//! file's model, weights and tokenizer can all be built.

use crate::tokenizer::Tokenizer;
use pagoda_gguf::GgufFile;
use std::collections::BTreeMap;
use std::path::Path;

/// GGUF `general.architecture` values pagoda runs.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &[
    "llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3",
];

/// [`missing_support`] of the GGUF file at `path` (an error where the file
/// cannot be opened as GGUF at all).
pub fn missing_support_at(path: &Path) -> crate::Result<Vec<String>> {
    Ok(missing_support(&GgufFile::open(path)?))
}

/// Whether `missing` (from [`missing_support`]) names the architecture,
/// i.e. the model cannot even be configured.
pub fn lacks_architecture(missing: &[String]) -> bool {
    missing
        .iter()
        .any(|m| m.starts_with("unknown architecture") || m.starts_with("architecture:"))
}

/// One line per missing piece of support (empty when the file is runnable).
pub fn missing_support(file: &GgufFile) -> Vec<String> {
    let mut missing = Vec::new();
    match file.metadata().get_str("general.architecture") {
        Ok(arch) if SUPPORTED_ARCHITECTURES.contains(&arch) => {}
        Ok(arch) if super::gguf_moe::UNSUPPORTED_MOE_ARCHS.contains(&arch) => {
            missing.push(format!(
                "unknown architecture {arch:?}: a mixture-of-experts family pagoda does not \
             implement (supported: {})",
                SUPPORTED_ARCHITECTURES.join(", ")
            ))
        }
        Ok(arch) => missing.push(format!(
            "unknown architecture {arch:?} (supported: {})",
            SUPPORTED_ARCHITECTURES.join(", ")
        )),
        Err(e) => missing.push(format!("architecture: {e}")),
    }
    let mut types: BTreeMap<&'static str, usize> = BTreeMap::new();
    for t in file.tensors() {
        if !t.ggml_type.can_dequantize() {
            *types.entry(t.ggml_type.name()).or_default() += 1;
        }
    }
    for (name, n) in types {
        missing.push(format!("tensor type {name} ({n} tensors)"));
    }
    let tokenizer =
        super::gguf::tokenizer_metadata(file).and_then(|spec| Tokenizer::from_gguf(&spec));
    if let Err(e) = tokenizer {
        missing.push(format!("tokenizer: {e}"));
    }
    missing
}
