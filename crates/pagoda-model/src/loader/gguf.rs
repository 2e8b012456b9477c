//! The GGUF weight source: a [`GgufFile`] answering by Hugging Face names.
//!
//! Owns three translations from llama.cpp's conventions to pagoda's:
//! - metadata -> [`ModelConfig`] ([`config_from_gguf`]): `{arch}.*` keys
//!   become Hugging Face config fields; a missing required key is a
//!   [`ModelError::Config`] naming it;
//! - tensor names: `blk.N.attn_q.weight` <-> `model.layers.N.self_attn.q_proj.weight`
//!   ([`hf_to_gguf_name`], [`gguf_to_hf_name`]);
//! - llama.cpp's converter reorders the rows of llama-architecture q_proj and
//!   k_proj so that each head's rotary pairs are adjacent (interleaved RoPE);
//!   [`unpermute_qk_rows`] restores Hugging Face's rotate-half order, so model
//!   files see one layout. Qwen2/Qwen3 and Gemma files are stored unpermuted;
//! - llama.cpp's converter stores Gemma 2/3's RMSNorm weights as `1 + w`
//!   (every `*norm.weight`); the source subtracts 1 (in f32, as transformers
//!   does when it loads such a file), so Gemma model files see Hugging Face's
//!   `w` from either source. Gemma's four per-layer norms have their own GGUF
//!   names ([`gemma_gguf_to_hf_name`]);
//! - mixture-of-experts files (qwen3moe, llama with experts): their
//!   config and stacked experts ([`super::gguf_moe`]).
//!
//! Costs: opening maps the file and parses its header; each `get` dequantizes
//! one tensor (quantized types to f32, F16/BF16 kept as stored) and, for
//! llama q/k, copies it once more to reorder rows. `get_stored` copies a
//! quantized tensor's blocks as they are (rows of whole blocks, reordered the
//! same way for llama q/k).

use crate::config::{Architecture, ModelConfig, RopeScaling};
use crate::loader::{TensorInfo, WeightSource};
use crate::{ModelError, Result};
use pagoda_gguf::{GgufFile, Metadata, MetadataArray, TensorValues};
use pagoda_kernels::{HostData, HostTensor, QuantData};
use std::collections::HashMap;
use std::path::Path;

/// Per-layer tensor names: (Hugging Face suffix, GGUF suffix), without `.weight`/`.bias`.
const LAYER_NAMES: &[(&str, &str)] = &[
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "ffn_norm"),
    ("mlp.gate", "ffn_gate_inp"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
    ("mlp.shared_expert.gate_proj", "ffn_gate_shexp"),
    ("mlp.shared_expert.up_proj", "ffn_up_shexp"),
    ("mlp.shared_expert.down_proj", "ffn_down_shexp"),
    ("mlp.shared_expert_gate", "ffn_gate_inp_shexp"),
];

/// Whole-model tensor names: (Hugging Face, GGUF).
const GLOBAL_NAMES: &[(&str, &str)] = &[
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
];

/// The GGUF name of the Hugging Face tensor `name`, if it has one.
pub fn hf_to_gguf_name(name: &str) -> Option<String> {
    if let Some(&(_, g)) = GLOBAL_NAMES.iter().find(|(h, _)| *h == name) {
        return Some(g.to_string());
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let (stem, kind) = rest.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let &(_, g) = LAYER_NAMES.iter().find(|(h, _)| *h == stem)?;
    Some(format!("blk.{layer}.{g}.{kind}"))
}

/// Gemma's per-layer norms: (Hugging Face suffix, GGUF suffix).
const GEMMA_LAYER_NAMES: &[(&str, &str)] = &[
    ("post_attention_layernorm", "post_attention_norm"),
    ("pre_feedforward_layernorm", "ffn_norm"),
    ("post_feedforward_layernorm", "post_ffw_norm"),
];

/// [`gguf_to_hf_name`] for Gemma 2/3 files, whose `ffn_norm` is the norm
/// before the MLP and which have norms after attention and MLP.
pub fn gemma_gguf_to_hf_name(name: &str) -> Option<String> {
    let gemma = || {
        let rest = name.strip_prefix("blk.")?;
        let (layer, rest) = rest.split_once('.')?;
        layer.parse::<usize>().ok()?;
        let stem = rest.strip_suffix(".weight")?;
        let &(h, _) = GEMMA_LAYER_NAMES.iter().find(|(_, g)| *g == stem)?;
        Some(format!("model.layers.{layer}.{h}.weight"))
    };
    gemma().or_else(|| gguf_to_hf_name(name))
}

/// [`gguf_to_hf_name`] for Phi-3 files: `attn_qkv` is the fused
/// `qkv_proj`, and `ffn_up` holds gate and up stacked (`gate_up_proj`).
pub fn phi3_gguf_to_hf_name(name: &str) -> Option<String> {
    let phi3 = || {
        let rest = name.strip_prefix("blk.")?;
        let (layer, rest) = rest.split_once('.')?;
        layer.parse::<usize>().ok()?;
        let hf = match rest {
            "attn_qkv.weight" => "self_attn.qkv_proj.weight",
            "ffn_up.weight" => "mlp.gate_up_proj.weight",
            _ => return None,
        };
        Some(format!("model.layers.{layer}.{hf}"))
    };
    phi3().or_else(|| gguf_to_hf_name(name))
}

/// The Hugging Face name of the GGUF tensor `name`, if it has one.
pub fn gguf_to_hf_name(name: &str) -> Option<String> {
    if let Some(&(h, _)) = GLOBAL_NAMES.iter().find(|(_, g)| *g == name) {
        return Some(h.to_string());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let (stem, kind) = rest.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let &(h, _) = LAYER_NAMES.iter().find(|(_, g)| *g == stem)?;
    Some(format!("model.layers.{layer}.{h}.{kind}"))
}

/// Undoes llama.cpp's q/k row permutation of a `[n_head * head_dim, cols]`
/// row-major matrix (a bias is `cols = 1`).
///
/// The converter views the rows of each head as `[2, head_dim / 2]` (the two
/// rotate-half halves) and transposes that to `[head_dim / 2, 2]`, so stored
/// row `2j + i` of a head is Hugging Face row `i * head_dim / 2 + j`.
/// Returns `None` when the rows do not split into `n_head` heads of even size.
pub fn unpermute_qk_rows<T: Copy>(data: &[T], cols: usize, n_head: usize) -> Option<Vec<T>> {
    if cols == 0 || n_head == 0 || !data.len().is_multiple_of(cols) {
        return None;
    }
    let rows = data.len() / cols;
    if !rows.is_multiple_of(n_head) || !(rows / n_head).is_multiple_of(2) {
        return None;
    }
    let half = rows / n_head / 2;
    let mut out = Vec::with_capacity(data.len());
    for h in 0..n_head {
        for i in 0..2 {
            for j in 0..half {
                let src = (h * 2 * half + 2 * j + i) * cols;
                out.extend_from_slice(&data[src..src + cols]);
            }
        }
    }
    Some(out)
}

/// `tokenizer.*` metadata of a GGUF file, as the tokenizer module needs it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufTokenizerMetadata {
    /// `tokenizer.ggml.model`: `gpt2`, `llama`, ...
    pub model: String,
    /// `tokenizer.ggml.pre`: which pre-tokenizer (`smollm`, `llama-bpe`, `qwen2` ...).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by token id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.merges`, highest priority first (empty when absent).
    pub merges: Vec<String>,
    /// `tokenizer.ggml.token_type`, indexed by token id (empty when absent).
    pub token_types: Vec<i32>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub add_bos_token: Option<bool>,
    pub add_eos_token: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
    /// `tokenizer.ggml.scores`, indexed by token id (empty when absent).
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.add_space_prefix`.
    pub add_space_prefix: Option<bool>,
    /// `general.architecture` (SentencePiece vocabularies differ by family).
    pub architecture: Option<String>,
    /// `tokenizer.ggml.precompiled_charsmap`: SentencePiece's normalization
    /// table (Unigram vocabularies; empty when absent).
    pub precompiled_charsmap: Vec<u8>,
    /// `tokenizer.ggml.remove_extra_whitespaces`.
    pub remove_extra_whitespaces: Option<bool>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unknown_token_id: Option<u32>,
}

/// The tokenizer metadata of a GGUF file, whatever its architecture (the
/// tokenizer alone can be built from a file whose model pagoda cannot run);
/// `tokenizer.ggml.model` and `.tokens` are required.
pub fn tokenizer_metadata(file: &GgufFile) -> Result<GgufTokenizerMetadata> {
    let md = file.metadata();
    let e = |e: pagoda_gguf::GgufError| ModelError::Tokenizer(e.to_string());
    let opt_str = |k: &str| -> Result<Option<String>> {
        Ok(md
            .optional(k, Metadata::get_str)
            .map_err(e)?
            .map(str::to_string))
    };
    Ok(GgufTokenizerMetadata {
        model: md.get_str("tokenizer.ggml.model").map_err(e)?.to_string(),
        pre: opt_str("tokenizer.ggml.pre")?,
        tokens: md
            .get_string_array("tokenizer.ggml.tokens")
            .map_err(e)?
            .to_vec(),
        merges: md
            .optional("tokenizer.ggml.merges", Metadata::get_string_array)
            .map_err(e)?
            .map(<[String]>::to_vec)
            .unwrap_or_default(),
        token_types: md
            .optional("tokenizer.ggml.token_type", Metadata::get_i32_array)
            .map_err(e)?
            .unwrap_or_default(),
        bos_token_id: md
            .optional("tokenizer.ggml.bos_token_id", Metadata::get_u32)
            .map_err(e)?,
        eos_token_id: md
            .optional("tokenizer.ggml.eos_token_id", Metadata::get_u32)
            .map_err(e)?,
        add_bos_token: md
            .optional("tokenizer.ggml.add_bos_token", Metadata::get_bool)
            .map_err(e)?,
        add_eos_token: md
            .optional("tokenizer.ggml.add_eos_token", Metadata::get_bool)
            .map_err(e)?,
        chat_template: opt_str("tokenizer.chat_template")?,
        scores: match md
            .optional("tokenizer.ggml.scores", Metadata::get_array)
            .map_err(e)?
        {
            None => Vec::new(),
            Some(MetadataArray::F32(v)) => v.clone(),
            Some(MetadataArray::I32(v)) => v.iter().map(|&x| x as f32).collect(),
            Some(_) => {
                return Err(ModelError::Tokenizer(
                    "tokenizer.ggml.scores is not an array of f32".into(),
                ))
            }
        },
        add_space_prefix: md
            .optional("tokenizer.ggml.add_space_prefix", Metadata::get_bool)
            .map_err(e)?,
        architecture: opt_str("general.architecture")?,
        precompiled_charsmap: match md
            .optional("tokenizer.ggml.precompiled_charsmap", Metadata::get_array)
            .map_err(e)?
        {
            None => Vec::new(),
            Some(MetadataArray::U8(v)) => v.clone(),
            Some(MetadataArray::I8(v)) => v.iter().map(|&x| x as u8).collect(),
            Some(_) => {
                return Err(ModelError::Tokenizer(
                    "tokenizer.ggml.precompiled_charsmap is not an array of bytes".into(),
                ))
            }
        },
        remove_extra_whitespaces: md
            .optional(
                "tokenizer.ggml.remove_extra_whitespaces",
                Metadata::get_bool,
            )
            .map_err(e)?,
        unknown_token_id: md
            .optional("tokenizer.ggml.unknown_token_id", Metadata::get_u32)
            .map_err(e)?,
    })
}

/// A GGUF file as a [`WeightSource`] keyed by Hugging Face names.
pub struct GgufSource {
    file: GgufFile,
    architecture: Architecture,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    /// Hugging Face name -> GGUF name, for every tensor with a mapping.
    names: HashMap<String, String>,
}

impl GgufSource {
    /// Opens `path` and reads its config.
    pub fn open(path: impl AsRef<Path>) -> Result<(ModelConfig, Self)> {
        Self::from_file(GgufFile::open(path)?)
    }

    /// Wraps an opened file and reads its config.
    pub fn from_file(file: GgufFile) -> Result<(ModelConfig, Self)> {
        let config = config_from_gguf(&file)?;
        let to_hf = if config.gemma.is_some() {
            gemma_gguf_to_hf_name
        } else if config.architecture == Architecture::Phi3 {
            phi3_gguf_to_hf_name
        } else {
            gguf_to_hf_name
        };
        let mut names: HashMap<String, String> = file
            .tensors()
            .iter()
            .filter_map(|t| to_hf(&t.name).map(|h| (h, t.name.clone())))
            .collect();
        names.extend(super::gguf_moe::expert_names(&file));
        let source = GgufSource {
            file,
            architecture: config.architecture,
            num_attention_heads: config.num_attention_heads,
            num_key_value_heads: config.num_key_value_heads,
            names,
        };
        Ok((config, source))
    }

    /// The underlying file (metadata, raw tensors).
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// Total number of tensor elements in the file.
    pub fn num_parameters(&self) -> u64 {
        self.file
            .tensors()
            .iter()
            .map(|t| t.n_elements() as u64)
            .sum()
    }

    /// The tokenizer metadata; `tokenizer.ggml.model` and `.tokens` are required.
    pub fn tokenizer_metadata(&self) -> Result<GgufTokenizerMetadata> {
        tokenizer_metadata(&self.file)
    }

    /// Rows of one head-group for the llama q/k permutation of `name`, if any.
    fn permutation_heads(&self, hf_name: &str) -> Option<usize> {
        if !matches!(
            self.architecture,
            Architecture::Llama | Architecture::Mixtral
        ) {
            return None;
        }
        if hf_name.contains(".self_attn.q_proj.") {
            Some(self.num_attention_heads)
        } else if hf_name.contains(".self_attn.k_proj.") {
            Some(self.num_key_value_heads)
        } else {
            None
        }
    }
}

impl WeightSource for GgufSource {
    fn tensor_infos(&self) -> Vec<TensorInfo> {
        self.file
            .tensors()
            .iter()
            .map(|t| TensorInfo {
                name: t.name.clone(),
                shape: t.shape(),
                dtype: t.ggml_type.name().to_ascii_lowercase(),
            })
            .collect()
    }

    fn get_stored(&self, name: &str) -> Result<HostTensor> {
        let gguf_name = self
            .names
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        if super::gguf_moe::is_gate_up(name) {
            return super::gguf_moe::gate_up(&self.file, gguf_name, true);
        }
        let info = self
            .file
            .tensor(gguf_name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let ty = info.ggml_type;
        let dense = matches!(
            ty,
            pagoda_gguf::GgmlType::F32 | pagoda_gguf::GgmlType::F16 | pagoda_gguf::GgmlType::BF16
        );
        if dense || !ty.can_dequantize() {
            return self.get(name);
        }
        let shape = info.shape();
        let mut bytes = self.file.tensor_bytes(info).to_vec();
        if let Some(n_head) = self.permutation_heads(name) {
            // Rows are whole blocks (the innermost dimension is a multiple
            // of the block size), so rows reorder as byte strings.
            let cols = shape.last().copied().unwrap_or(1);
            let row_bytes = cols / ty.block_size() * ty.type_size();
            bytes = unpermute_qk_rows(&bytes, row_bytes, n_head).ok_or_else(|| {
                ModelError::Config(format!(
                    "{name}: shape {shape:?} does not split into {n_head} heads of even size"
                ))
            })?;
        }
        Ok(HostTensor {
            shape,
            data: HostData::Quant(QuantData { ty, bytes }),
        })
    }

    fn get(&self, name: &str) -> Result<HostTensor> {
        let gguf_name = self
            .names
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        if super::gguf_moe::is_gate_up(name) {
            return super::gguf_moe::gate_up(&self.file, gguf_name, false);
        }
        let info = self
            .file
            .tensor(gguf_name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let shape = info.shape();
        let mut data = match self.file.tensor_values(gguf_name)? {
            TensorValues::F32(v) => HostData::F32(v),
            TensorValues::F16(v) => HostData::F16(v),
            TensorValues::BF16(v) => HostData::BF16(v),
        };
        let gemma = matches!(
            self.architecture,
            Architecture::Gemma2 | Architecture::Gemma3
        );
        if gemma && name.ends_with("norm.weight") {
            let mut w = HostTensor {
                shape: shape.clone(),
                data,
            }
            .into_f32_vec();
            w.iter_mut().for_each(|x| *x -= 1.0);
            data = HostData::F32(w);
        }
        if let Some(n_head) = self.permutation_heads(name) {
            let cols = if shape.len() >= 2 {
                shape[1..].iter().product()
            } else {
                1
            };
            let bad = || {
                ModelError::Config(format!(
                    "{name}: shape {shape:?} does not split into {n_head} heads of even size"
                ))
            };
            data = match data {
                HostData::F32(v) => {
                    HostData::F32(unpermute_qk_rows(&v, cols, n_head).ok_or_else(bad)?)
                }
                HostData::F16(v) => {
                    HostData::F16(unpermute_qk_rows(&v, cols, n_head).ok_or_else(bad)?)
                }
                HostData::BF16(v) => {
                    HostData::BF16(unpermute_qk_rows(&v, cols, n_head).ok_or_else(bad)?)
                }
                // `tensor_values` dequantizes; blocks come only from `get_stored`.
                HostData::Quant(_) => {
                    return Err(ModelError::Config(format!(
                        "{name}: unexpected quantized values"
                    )))
                }
            };
        }
        Ok(HostTensor { shape, data })
    }

    fn contains(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }
}

/// Builds the [`ModelConfig`] of a llama (Mixtral when it has experts),
/// qwen2, qwen3, qwen3moe, qwen2moe, gemma2 or gemma3 GGUF file.
pub fn config_from_gguf(file: &GgufFile) -> Result<ModelConfig> {
    let md = file.metadata();
    let cfg = |e: pagoda_gguf::GgufError| ModelError::Config(e.to_string());
    let arch_name = md.get_str("general.architecture").map_err(cfg)?;
    let num_experts = super::gguf_moe::expert_count(file, arch_name)?;
    let architecture = match arch_name {
        "llama" if num_experts > 0 => Architecture::Mixtral,
        "llama" => Architecture::Llama,
        "qwen2" => Architecture::Qwen2,
        "qwen3" => Architecture::Qwen3,
        "qwen3moe" => Architecture::Qwen3Moe,
        "qwen2moe" => Architecture::Qwen2Moe,
        "gemma2" => Architecture::Gemma2,
        "gemma3" => Architecture::Gemma3,
        "phi3" => Architecture::Phi3,
        other if super::gguf_moe::UNSUPPORTED_MOE_ARCHS.contains(&other) => {
            return Err(super::gguf_moe::unsupported_arch(other))
        }
        other => return Err(ModelError::UnknownArchitecture(other.to_string())),
    };
    if architecture.is_moe() != (num_experts > 0) {
        return Err(ModelError::Config(format!(
            "GGUF {arch_name} file with {num_experts} experts ({arch_name}.expert_count) is not supported"
        )));
    }
    let key = |k: &str| format!("{arch_name}.{k}");
    let usize_key = |k: &str| md.get_usize(&key(k)).map_err(cfg);
    let opt_usize = |k: &str| md.optional(&key(k), Metadata::get_usize).map_err(cfg);

    let hidden_size = usize_key("embedding_length")?;
    let num_attention_heads = usize_key("attention.head_count")?;
    let num_key_value_heads = opt_usize("attention.head_count_kv")?.unwrap_or(num_attention_heads);
    let head_dim = opt_usize("attention.key_length")?;
    let rope_theta = md
        .optional(&key("rope.freq_base"), Metadata::get_f64)
        .map_err(cfg)?
        .unwrap_or(10_000.0);
    let vocab_size = match file
        .tensor("token_embd.weight")
        .and_then(|t| t.shape().first().copied())
    {
        Some(rows) => rows,
        None => match md
            .optional("tokenizer.ggml.tokens", Metadata::get_string_array)
            .map_err(cfg)?
        {
            Some(tokens) => tokens.len(),
            None => usize_key("vocab_size")?,
        },
    };
    let bos_token_id = md
        .optional("tokenizer.ggml.bos_token_id", Metadata::get_u32)
        .map_err(cfg)?;
    let eos_token_id = md
        .optional("tokenizer.ggml.eos_token_id", Metadata::get_u32)
        .map_err(cfg)?;

    let dense_ffn = opt_usize("feed_forward_length")?;
    let num_hidden_layers = usize_key("block_count")?;
    let moe = if num_experts > 0 {
        Some(super::gguf_moe::moe_config(
            file,
            arch_name,
            num_experts,
            num_hidden_layers,
            dense_ffn,
        )?)
    } else {
        None
    };
    let intermediate_size = match (dense_ffn, &moe) {
        (Some(n), _) => n,
        (None, Some(m)) => m.moe_intermediate_size,
        (None, None) => usize_key("feed_forward_length")?,
    };
    let mut config = ModelConfig {
        architecture,
        hidden_size,
        intermediate_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        rotary_dim: None,
        vocab_size,
        max_position_embeddings: usize_key("context_length")?,
        rms_norm_eps: md
            .get_f32(&key("attention.layer_norm_rms_epsilon"))
            .map_err(cfg)? as f64,
        rope_theta,
        rope_scaling: None,
        tie_word_embeddings: file.tensor("output.weight").is_none(),
        // Qwen2-MoE's q/k/v biases are optional in its config (`qkv_bias`).
        attention_bias: architecture == Architecture::Qwen2
            || (architecture == Architecture::Qwen2Moe
                && file.tensor("blk.0.attn_q.bias").is_some()),
        bos_token_id,
        eos_token_ids: eos_token_id.into_iter().collect(),
        word_embed_proj_dim: None,
        do_layer_norm_before: true,
        torch_dtype: dominant_weight_type(file),
        // A window of 0 is none. llama.cpp's converter writes no window for
        // Mistral (arch `llama`) files and llama.cpp runs them with full
        // attention; so does pagoda, honouring the key where a file has one.
        sliding_window: opt_usize("attention.sliding_window")?.filter(|&w| w > 0),
        gemma: None,
        moe,
    };
    if matches!(architecture, Architecture::Gemma2 | Architecture::Gemma3) {
        config.gemma = Some(gemma_config(file, arch_name, &config)?);
        if config.sliding_window.is_none() {
            config
                .gemma
                .iter_mut()
                .for_each(|g| g.sliding_layers.fill(false));
        }
    }
    if let Some(rot) = opt_usize("rope.dimension_count")? {
        if architecture == Architecture::Phi3 && rot != config.head_dim() {
            // Phi-4-mini's partial rotary (checked by `validate`).
            config.rotary_dim = Some(rot);
        } else if rot != config.head_dim() {
            return Err(ModelError::Config(format!(
                "{}: rotary dimension {rot} differs from head_dim {} (partial rotary is not supported)",
                key("rope.dimension_count"),
                config.head_dim()
            )));
        }
    }
    config.rope_scaling = rope_scaling(file, arch_name, &config)?;
    config.validate().map_err(ModelError::Config)?;
    Ok(config)
}

/// Gemma's fields as llama.cpp derives them: every 6th layer global for
/// Gemma 3 (every 2nd for Gemma 2, whose layer 0 is local), a local RoPE base
/// of 10000 (`rope.freq_base_swa` where present), the query scale of
/// `head_dim` except for the 27B models (`hidden / heads`), and the
/// `{arch}.*_logit_softcapping` keys.
fn gemma_config(file: &GgufFile, arch: &str, config: &ModelConfig) -> Result<crate::GemmaConfig> {
    let md = file.metadata();
    let cfg = |e: pagoda_gguf::GgufError| ModelError::Config(e.to_string());
    let key = |k: &str| format!("{arch}.{k}");
    let gemma3 = config.architecture == Architecture::Gemma3;
    let n = config.num_hidden_layers;
    let pattern = md
        .optional(
            &key("attention.sliding_window_pattern"),
            Metadata::get_usize,
        )
        .map_err(cfg)?
        .unwrap_or(if gemma3 { 6 } else { 2 });
    if pattern == 0 {
        return Err(ModelError::Config(format!(
            "{}: must be positive",
            key("attention.sliding_window_pattern")
        )));
    }
    let sliding_layers = (0..n).map(|i| (i + 1) % pattern != 0).collect();
    let rope_local_base_freq = if gemma3 {
        md.optional(&key("rope.freq_base_swa"), Metadata::get_f64)
            .map_err(cfg)?
            .unwrap_or(10_000.0)
    } else {
        config.rope_theta
    };
    let is_27b = (gemma3 && n == 62) || (!gemma3 && n == 46);
    let query_pre_attn_scalar = if is_27b {
        (config.hidden_size / config.num_attention_heads) as f64
    } else {
        config.head_dim() as f64
    };
    let cap = |k: &str| -> Result<Option<f64>> {
        Ok(md
            .optional(&key(k), Metadata::get_f64)
            .map_err(cfg)?
            .filter(|&c| c > 0.0))
    };
    Ok(crate::GemmaConfig {
        sliding_layers,
        rope_local_base_freq,
        query_pre_attn_scalar,
        attn_logit_softcapping: cap("attn_logit_softcapping")?,
        final_logit_softcapping: cap("final_logit_softcapping")?,
    })
}

/// The most common storage type among matrices ("Q4_1"), for `torch_dtype`.
fn dominant_weight_type(file: &GgufFile) -> Option<String> {
    let mut counts: HashMap<&'static str, usize> = HashMap::new();
    for t in file.tensors().iter().filter(|t| t.ne.len() >= 2) {
        *counts.entry(t.ggml_type.name()).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|&(name, n)| (n, std::cmp::Reverse(name)))
        .map(|(name, _)| name.to_string())
}

/// Rotary scaling from `{arch}.rope.scaling.*`, or Llama 3's frequency
/// scaling, which llama.cpp stores as per-frequency divisors in the
/// `rope_freqs.weight` tensor instead of metadata.
fn rope_scaling(file: &GgufFile, arch: &str, config: &ModelConfig) -> Result<Option<RopeScaling>> {
    let md = file.metadata();
    let cfg = |e: pagoda_gguf::GgufError| ModelError::Config(e.to_string());
    let kind = md
        .optional(&format!("{arch}.rope.scaling.type"), Metadata::get_str)
        .map_err(cfg)?;
    let factor_key = format!("{arch}.rope.scaling.factor");
    if let Some(longrope) = longrope(file, arch, config)? {
        return Ok(Some(longrope));
    }
    match kind {
        Some("linear") => {
            let factor = md.get_f64(&factor_key).map_err(cfg)?;
            return Ok(Some(RopeScaling::Linear { factor }));
        }
        Some("none") | None => {}
        Some(other) => {
            return Err(ModelError::Config(format!(
                "{arch}.rope.scaling.type {other:?} is not supported (supported: none, linear)"
            )))
        }
    }
    if kind.is_none() {
        if let Some(factor) = md
            .optional(&format!("{arch}.rope.scale_linear"), Metadata::get_f64)
            .map_err(cfg)?
        {
            return Ok((factor != 1.0).then_some(RopeScaling::Linear { factor }));
        }
    }
    if file.tensor("rope_freqs.weight").is_none() {
        return Ok(None);
    }
    let freqs = file.dequantize("rope_freqs.weight")?;
    llama3_scaling_from_freqs(&freqs, config.head_dim(), config.rope_theta)
        .map(Some)
        .ok_or_else(|| {
            ModelError::Config(
                "rope_freqs.weight does not match Llama 3 rotary scaling (low_freq_factor 1, \
                 high_freq_factor 4, original context 8192)"
                    .into(),
            )
        })
}

/// Phi-3's LongRoPE as llama.cpp's converter stores it: the factors as the
/// tensors `rope_factors_short.weight` and `rope_factors_long.weight`, the
/// original context as `{arch}.rope.scaling.original_context_length`, the
/// attention factor as `{arch}.rope.scaling.attn_factor` (computed as
/// transformers does where absent). `None` without the factor tensors.
fn longrope(file: &GgufFile, arch: &str, config: &ModelConfig) -> Result<Option<RopeScaling>> {
    let (short, long) = ("rope_factors_short.weight", "rope_factors_long.weight");
    if file.tensor(short).is_none() && file.tensor(long).is_none() {
        return Ok(None);
    }
    let md = file.metadata();
    let cfg = |e: pagoda_gguf::GgufError| ModelError::Config(e.to_string());
    let factors = |name: &str| -> Result<Vec<f64>> {
        if file.tensor(name).is_none() {
            return Err(ModelError::Config(format!(
                "LongRoPE factors without {name} (both rope_factors_short and _long are needed)"
            )));
        }
        Ok(file.dequantize(name)?.into_iter().map(f64::from).collect())
    };
    let original = md
        .get_usize(&format!("{arch}.rope.scaling.original_context_length"))
        .map_err(cfg)?;
    let attention_factor = match md
        .optional(
            &format!("{arch}.rope.scaling.attn_factor"),
            Metadata::get_f64,
        )
        .map_err(cfg)?
    {
        Some(a) => a,
        None => {
            let scale = config.max_position_embeddings as f64 / original.max(1) as f64;
            if scale <= 1.0 {
                1.0
            } else {
                (1.0 + scale.ln() / (original as f64).ln()).sqrt()
            }
        }
    };
    Ok(Some(RopeScaling::LongRope {
        short_factor: factors(short)?,
        long_factor: factors(long)?,
        original_max_position_embeddings: original,
        attention_factor,
    }))
}

/// Recovers Llama 3 scaling parameters from llama.cpp's per-frequency
/// divisors: 1 for short wavelengths, `factor` for long ones, a smooth blend
/// between. Llama 3.1/3.2 all use low 1, high 4, original context 8192;
/// `factor` is the largest divisor. `None` if the divisors do not fit.
pub fn llama3_scaling_from_freqs(
    freqs: &[f32],
    head_dim: usize,
    theta: f64,
) -> Option<RopeScaling> {
    let (low, high, original) = (1.0f64, 4.0f64, 8192usize);
    if freqs.len() != head_dim / 2 || freqs.is_empty() {
        return None;
    }
    let factor = freqs.iter().fold(0f32, |m, &x| m.max(x)) as f64;
    let (low_wavelen, high_wavelen) = (original as f64 / low, original as f64 / high);
    for (i, &got) in freqs.iter().enumerate() {
        let inv_freq = 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64);
        let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
        let want = if wavelen < high_wavelen {
            1.0
        } else if wavelen > low_wavelen {
            factor
        } else {
            let smooth = (original as f64 / wavelen - low) / (high - low);
            1.0 / ((1.0 - smooth) / factor + smooth)
        };
        if (got as f64 - want).abs() > 1e-3 * want {
            return None;
        }
    }
    Some(RopeScaling::Llama3 {
        factor,
        low_freq_factor: low,
        high_freq_factor: high,
        original_max_position_embeddings: original,
    })
}
