//! Tokenizer, chat template and incremental detokenizer.
//!
//! [`Tokenizer`] is the one tokenizer type the engine uses, whatever the model
//! came from: a GGUF file ([`Tokenizer::from_gguf`], built from the
//! `tokenizer.ggml.*` metadata) or a Hugging Face directory
//! ([`Tokenizer::from_hf_dir`], `tokenizer.json` + `tokenizer_config.json`).
//! Both wrap a Hugging Face `tokenizers` pipeline (pure Rust, fancy-regex), so
//! text is split, merged and decoded exactly as transformers does.
//!
//! - [`gguf`]: GGUF metadata -> byte-level BPE pipeline (pre-tokenizer regex
//!   chosen by `tokenizer.ggml.pre`, see `gguf_pre`), or SentencePiece BPE
//!   with byte fallback (`gguf_spm`), or SentencePiece Unigram
//!   (`gguf_unigram`).
//! - [`hf`]: Hugging Face directory loading (special tokens, chat template).
//! - [`chat_template`]: Jinja chat templates rendered with minijinja in the
//!   dialect transformers uses.
//! - [`detokenizer`]: streaming text deltas that never split a character.
//! - `token_bytes`: [`Tokenizer::token_bytes`], the bytes of every token id,
//!   for matching the vocabulary against a grammar (structured outputs).
//! - `bounds`: [`Tokenizer::max_bytes_per_token`], to refuse a text too long
//!   for a context before tokenizing it.
//!
//! Invariants: `encode` adds BOS (and EOS) only when asked for special tokens
//! and the model's config says so, and never twice; `decode` of an unknown id
//! drops it rather than failing. Costs: encode is linear in the text (BPE
//! merges are cached per word by `tokenizers`); decode is linear in the ids.

mod bounds;
pub mod builtin;
pub mod chat_template;
pub mod detokenizer;
pub mod gguf;
mod gguf_pre;
mod gguf_spm;
mod gguf_unigram;
pub mod hf;
mod spm_normalizer;
mod token_bytes;

pub use chat_template::{ChatMessage, ChatTemplate, ChatTemplateOptions, MessageContent};
pub use detokenizer::IncrementalDetokenizer;
pub use gguf::GgufTokenizerSpec;
pub use token_bytes::SPECIAL_TOKEN_MARKER;

use crate::{ModelError, Result};

/// A model's tokenizer: text <-> token ids, special tokens, chat template.
pub struct Tokenizer {
    /// The Hugging Face pipeline (normalizer, pre-tokenizer, model, decoder).
    inner: tokenizers::Tokenizer,
    /// Size of the model's vocabulary (embedding rows), at least every id the
    /// tokenizer can produce.
    vocab_size: usize,
    bos_token_id: Option<u32>,
    /// Every id that ends generation (EOS first); may be empty.
    eos_token_ids: Vec<u32>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// Prepend BOS when encoding with special tokens (unless already there).
    add_bos_token: bool,
    /// Append EOS when encoding with special tokens (unless already there).
    add_eos_token: bool,
    /// Whether the model maps unknown bytes to `<0xNN>` tokens; the
    /// detokenizer must then never settle text after such a token.
    byte_fallback: bool,
    chat_template: Option<ChatTemplate>,
    /// Normalization done before the pipeline (SentencePiece Unigram).
    normalizer: Option<spm_normalizer::SpmNormalizer>,
}

/// The parts every constructor fills in; [`Tokenizer::assemble`] checks them.
pub(crate) struct TokenizerParts {
    pub inner: tokenizers::Tokenizer,
    pub vocab_size: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub add_bos_token: bool,
    pub add_eos_token: bool,
    pub chat_template_source: Option<String>,
    /// Applied to the text before `inner` (whose own normalizer then is none).
    pub normalizer: Option<spm_normalizer::SpmNormalizer>,
}

impl Tokenizer {
    /// Builds the tokenizer of a GGUF model from its `tokenizer.*` metadata.
    pub fn from_gguf(spec: &GgufTokenizerSpec) -> Result<Self> {
        Self::assemble(gguf::build(spec)?)
    }

    /// Builds the tokenizer of a GGUF file from its metadata alone, whatever
    /// its architecture (the model itself is not read).
    pub fn from_gguf_file(path: impl AsRef<std::path::Path>) -> Result<Self> {
        let file = pagoda_gguf::GgufFile::open(path)?;
        Self::from_gguf(&crate::loader::gguf::tokenizer_metadata(&file)?)
    }

    /// Loads `tokenizer.json`, `tokenizer_config.json` (and, when present,
    /// `chat_template.jinja` and `generation_config.json`) from a Hugging Face
    /// model directory.
    pub fn from_hf_dir(dir: impl AsRef<std::path::Path>) -> Result<Self> {
        Self::assemble(hf::load(dir.as_ref())?)
    }

    /// Loads a Hugging Face `tokenizer.json` given by path (any file name);
    /// `tokenizer_config.json`, `chat_template.jinja` and the other optional
    /// files are read from the same directory when present. A directory is
    /// read as in [`Tokenizer::from_hf_dir`].
    pub fn from_hf_file(path: impl AsRef<std::path::Path>) -> Result<Self> {
        let path = path.as_ref();
        if path.is_dir() {
            return Self::from_hf_dir(path);
        }
        Self::assemble(hf::load_file(path)?)
    }

    pub(crate) fn assemble(parts: TokenizerParts) -> Result<Self> {
        let TokenizerParts {
            inner,
            vocab_size,
            bos_token_id,
            mut eos_token_ids,
            add_bos_token,
            add_eos_token,
            chat_template_source,
            normalizer,
        } = parts;
        let vocab_size = vocab_size.max(inner.get_vocab_size(true));
        if let Some(id) = bos_token_id.filter(|&id| id as usize >= vocab_size) {
            return Err(tok_err(format!(
                "BOS id {id} is outside the vocabulary ({vocab_size})"
            )));
        }
        eos_token_ids.retain(|&id| (id as usize) < vocab_size);
        let mut seen = std::collections::HashSet::new();
        eos_token_ids.retain(|id| seen.insert(*id));
        if add_bos_token && bos_token_id.is_none() {
            return Err(tok_err("the config asks to add BOS but names no BOS token"));
        }
        let bos_token = bos_token_id.and_then(|id| inner.id_to_token(id));
        let eos_token = eos_token_ids.first().and_then(|&id| inner.id_to_token(id));
        let byte_fallback = match inner.get_model() {
            tokenizers::ModelWrapper::BPE(bpe) => bpe.byte_fallback,
            tokenizers::ModelWrapper::Unigram(u) => u.byte_fallback(),
            _ => false,
        };
        let chat_template = chat_template_source
            .map(|src| ChatTemplate::new(&src, bos_token.clone(), eos_token.clone()))
            .transpose()?;
        Ok(Self {
            inner,
            vocab_size,
            bos_token_id,
            eos_token_ids,
            bos_token,
            eos_token,
            add_bos_token,
            add_eos_token,
            byte_fallback,
            chat_template,
            normalizer,
        })
    }

    /// Token ids of `text`. Special tokens written in the text (`<|im_start|>`)
    /// are matched whole. With `add_special_tokens`, BOS/EOS are added as the
    /// model's config says (and as the `tokenizer.json` post-processor does).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let normalized;
        let text = match &self.normalizer {
            Some(n) => {
                normalized = n.normalize(text);
                normalized.as_str()
            }
            None => text,
        };
        let encoding = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| tok_err(format!("encode failed: {e}")))?;
        let mut ids = encoding.get_ids().to_vec();
        if add_special_tokens {
            if let (true, Some(bos)) = (self.add_bos_token, self.bos_token_id) {
                if ids.first() != Some(&bos) {
                    ids.insert(0, bos);
                }
            }
            if let (true, Some(&eos)) = (self.add_eos_token, self.eos_token_ids.first()) {
                if ids.last() != Some(&eos) {
                    ids.push(eos);
                }
            }
        }
        Ok(ids)
    }

    /// Text of `ids`. With `skip_special_tokens`, control tokens (BOS, EOS,
    /// `<|im_end|>` ...) are left out. Ids outside the vocabulary are dropped.
    /// Bytes that do not form valid UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| tok_err(format!("decode failed: {e}")))
    }

    /// The text one token stands for on its own (U+FFFD where it holds only
    /// part of a character); None for an id outside the vocabulary.
    pub fn token_to_piece(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)?;
        self.inner.decode(&[id], false).ok()
    }

    /// What kind of tokenizer model this is: `byte-level BPE`, `SentencePiece
    /// BPE` (byte fallback), `SentencePiece Unigram`, `WordPiece`, `WordLevel`.
    pub fn model_kind(&self) -> &'static str {
        match self.inner.get_model() {
            tokenizers::ModelWrapper::BPE(bpe) if bpe.byte_fallback => "SentencePiece BPE",
            tokenizers::ModelWrapper::BPE(_) => "byte-level BPE",
            tokenizers::ModelWrapper::Unigram(_) => "SentencePiece Unigram",
            tokenizers::ModelWrapper::WordPiece(_) => "WordPiece",
            tokenizers::ModelWrapper::WordLevel(_) => "WordLevel",
        }
    }

    /// The vocabulary entry of `id` as stored (byte-level form, e.g. `Ġthe`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of vocabulary entry `token` (stored form), if any.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Number of token ids (the model's vocabulary size).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    /// Ids that end generation, EOS first.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Whether `encode(.., true)` prepends BOS.
    pub fn add_bos_token(&self) -> bool {
        self.add_bos_token
    }

    /// Whether `id` is a special (control) token, skipped by
    /// `decode(.., skip_special_tokens = true)`.
    pub fn is_special(&self, id: u32) -> bool {
        self.inner
            .get_added_vocabulary()
            .simple_id_to_token(id)
            .is_some_and(|t| self.inner.get_added_vocabulary().is_special_token(&t))
    }

    /// The model's chat template, if it has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Replaces the chat template (e.g. one given on the command line).
    pub fn set_chat_template(&mut self, source: &str) -> Result<()> {
        self.chat_template = Some(ChatTemplate::new(
            source,
            self.bos_token.clone(),
            self.eos_token.clone(),
        )?);
        Ok(())
    }

    /// A fresh streaming detokenizer over this tokenizer.
    pub fn detokenizer(&self, skip_special_tokens: bool) -> IncrementalDetokenizer<&Tokenizer> {
        IncrementalDetokenizer::new(self, skip_special_tokens)
    }

    pub(crate) fn byte_fallback(&self) -> bool {
        self.byte_fallback
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos_token", &self.bos_token)
            .field("eos_token_ids", &self.eos_token_ids)
            .field("add_bos_token", &self.add_bos_token)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

pub(crate) fn tok_err(msg: impl Into<String>) -> ModelError {
    ModelError::Tokenizer(msg.into())
}
