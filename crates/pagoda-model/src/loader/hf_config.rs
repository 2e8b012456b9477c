//! Hugging Face `config.json` (+ `generation_config.json`) -> [`ModelConfig`].
//!
//! Owns the mapping from a checkpoint directory's JSON to pagoda's
//! architecture-neutral config, with the defaults of transformers' config
//! classes (`LlamaConfig`, `MistralConfig`, `Qwen2Config`, `Qwen3Config`,
//! `OPTConfig`, `Gemma2Config`, `Gemma3TextConfig`, `Phi3Config`, `Qwen3MoeConfig`,
//! `MixtralConfig`, `Qwen2MoeConfig`) wherever a field may be
//! absent. Those defaults are per class
//! and not always intuitive: an absent `num_key_value_heads` is
//! `num_attention_heads` for Llama and OPT but 8 for Mistral and 32 for
//! Qwen2/Qwen3; Qwen3's absent `head_dim` is 128; only OPT ties its word
//! embeddings by default.
//!
//! Invariants:
//! - the architecture comes from `architectures[0]`, or from `model_type`
//!   only when `architectures` is absent or empty;
//! - the five shape fields (`hidden_size`, `intermediate_size` / OPT's
//!   `ffn_dim`, `num_hidden_layers`, `num_attention_heads`, `vocab_size`) are
//!   required: a class default of 4096 hidden units is never what a real
//!   checkpoint meant (except Gemma 3, whose published configs leave
//!   `num_attention_heads` and `vocab_size` at the class defaults). A missing
//!   or mistyped field is a [`ModelError::Config`] naming the field and the
//!   file;
//! - Gemma 3's multimodal config (`model_type` `gemma3`) is read from its
//!   `text_config`; Gemma's local/global layers come from `layer_types` or
//!   the class's `sliding_window_pattern` (every 6th layer global for Gemma 3,
//!   every 2nd for Gemma 2), its two RoPE bases from `rope_theta` /
//!   `rope_local_base_freq` or transformers 5's per-layer-type
//!   `rope_parameters`;
//! - RoPE parameters are read from `rope_scaling` or transformers 5's
//!   `rope_parameters` (keys `rope_type` or `type`); `rope_theta` from the
//!   top level or from inside `rope_parameters`. Only `default`, `linear`,
//!   `llama3` and `longrope` (or its old name `su`; Phi-3's top-level
//!   `original_max_position_embeddings` and `partial_rotary_factor` with it)
//!   are accepted; anything else is an error, never silently ignored;
//! - features pagoda's model files do not implement (`mlp_bias`, a non-SiLU /
//!   non-ReLU activation, OPT without biases) are rejected here rather than
//!   failing later on a missing tensor; a sliding window in use is recorded
//!   in [`ModelConfig::sliding_window`] (building the model refuses a
//!   context longer than the window);
//! - mixture-of-experts fields ([`crate::MoeConfig`]) for Qwen3-MoE,
//!   Mixtral and Qwen2-MoE (with its shared expert); other MoE families are
//!   refused by name;
//! - end-of-sequence ids are `config.json`'s followed by
//!   `generation_config.json`'s, without duplicates.
//!
//! Costs: one small JSON parse per file.

use crate::{Architecture, ModelConfig, ModelError, Result, RopeScaling};
use serde_json::{Map, Value};
use std::path::Path;

/// The Hugging Face config class a checkpoint names; decides the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HfClass {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Opt,
    Gemma2,
    Gemma3,
    Phi3,
    Qwen3Moe,
    Mixtral,
    Qwen2Moe,
}

/// Mixture-of-experts families pagoda does not implement (`model_type`s and
/// architecture stems), refused by name rather than as unknown.
const UNSUPPORTED_MOE: &[&str] = &[
    "deepseek_v2",
    "deepseekv2",
    "deepseek_v3",
    "deepseekv3",
    "gpt_oss",
    "gptoss",
    "olmoe",
    "granitemoe",
    "granitemoehybrid",
    "granitemoeshared",
    "dbrx",
    "jamba",
    "phimoe",
    "jetmoe",
    "minimax",
    "llama4",
    "llama4fortextgeneration",
    "glm4_moe",
    "glm4moe",
    "ernie4_5_moe",
    "ernie4_5moe",
    "hunyuan_v1_moe",
    "hunyuanmoev1",
    "qwen3_next",
    "qwen3next",
    "arctic",
    "switch_transformers",
    "nllb_moe",
];

impl HfClass {
    /// `LlamaForCausalLM` or `llama` (case-insensitive).
    fn from_name(name: &str) -> Option<HfClass> {
        let lower = name.to_ascii_lowercase();
        match lower.strip_suffix("forcausallm").unwrap_or(&lower) {
            "llama" => Some(HfClass::Llama),
            "mistral" => Some(HfClass::Mistral),
            "qwen2" => Some(HfClass::Qwen2),
            "qwen3" => Some(HfClass::Qwen3),
            "opt" => Some(HfClass::Opt),
            "gemma2" => Some(HfClass::Gemma2),
            "gemma3" | "gemma3_text" | "gemma3forconditionalgeneration" => Some(HfClass::Gemma3),
            "phi3" => Some(HfClass::Phi3),
            "qwen3_moe" | "qwen3moe" => Some(HfClass::Qwen3Moe),
            "mixtral" => Some(HfClass::Mixtral),
            "qwen2_moe" | "qwen2moe" => Some(HfClass::Qwen2Moe),
            _ => None,
        }
    }

    fn architecture(self) -> Architecture {
        match self {
            HfClass::Llama | HfClass::Mistral => Architecture::Llama,
            HfClass::Qwen2 => Architecture::Qwen2,
            HfClass::Qwen3 => Architecture::Qwen3,
            HfClass::Opt => Architecture::Opt,
            HfClass::Gemma2 => Architecture::Gemma2,
            HfClass::Gemma3 => Architecture::Gemma3,
            HfClass::Phi3 => Architecture::Phi3,
            HfClass::Qwen3Moe => Architecture::Qwen3Moe,
            HfClass::Mixtral => Architecture::Mixtral,
            HfClass::Qwen2Moe => Architecture::Qwen2Moe,
        }
    }

    fn is_gemma(self) -> bool {
        matches!(self, HfClass::Gemma2 | HfClass::Gemma3)
    }

    /// transformers' class defaults for the optional fields.
    fn defaults(self) -> Defaults {
        let llama = Defaults {
            max_position_embeddings: 2048,
            tie_word_embeddings: false,
            num_key_value_heads: None,
            head_dim: None,
            bos_token_id: Some(1),
            eos_token_id: Some(2),
        };
        match self {
            HfClass::Llama => llama,
            HfClass::Phi3 => Defaults {
                max_position_embeddings: 4096,
                eos_token_id: Some(32000),
                ..llama
            },
            HfClass::Mistral | HfClass::Mixtral => Defaults {
                max_position_embeddings: 4096 * 32,
                num_key_value_heads: Some(8),
                ..llama
            },
            HfClass::Qwen3Moe => Defaults {
                max_position_embeddings: 32768,
                num_key_value_heads: Some(4),
                head_dim: None,
                bos_token_id: None,
                eos_token_id: None,
                ..llama
            },
            HfClass::Qwen2Moe => Defaults {
                max_position_embeddings: 32768,
                num_key_value_heads: Some(16),
                head_dim: None,
                bos_token_id: None,
                eos_token_id: None,
                ..llama
            },
            HfClass::Qwen2 | HfClass::Qwen3 => Defaults {
                max_position_embeddings: 32768,
                num_key_value_heads: Some(32),
                head_dim: (self == HfClass::Qwen3).then_some(128),
                bos_token_id: None,
                eos_token_id: None,
                ..llama
            },
            HfClass::Opt => Defaults {
                max_position_embeddings: 2048,
                tie_word_embeddings: true,
                num_key_value_heads: None,
                head_dim: None,
                bos_token_id: Some(2),
                eos_token_id: Some(2),
            },
            HfClass::Gemma2 | HfClass::Gemma3 => Defaults {
                max_position_embeddings: if self == HfClass::Gemma2 {
                    8192
                } else {
                    131_072
                },
                tie_word_embeddings: true,
                num_key_value_heads: Some(4),
                head_dim: Some(256),
                bos_token_id: Some(2),
                eos_token_id: Some(1),
            },
        }
    }
}

/// Defaults of one config class.
#[derive(Debug, Clone, Copy)]
struct Defaults {
    max_position_embeddings: usize,
    tie_word_embeddings: bool,
    /// `None`: equal to `num_attention_heads`.
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<u32>,
}

/// Default RMSNorm epsilon of the Llama-family classes.
const RMS_NORM_EPS: f64 = 1e-6;
/// `Phi3Config`'s RMSNorm epsilon.
const PHI3_RMS_NORM_EPS: f64 = 1e-5;
/// `Phi3Config`'s `original_max_position_embeddings`.
const PHI3_ORIGINAL_MAX_POSITIONS: usize = 4096;
/// OPT's LayerNorm epsilon (torch's default; not a config field).
const OPT_LAYER_NORM_EPS: f64 = 1e-5;
/// `MistralConfig`'s `sliding_window` when the key is absent (Mistral v0.1's).
const MISTRAL_SLIDING_WINDOW: usize = 4096;
/// transformers' `default_theta`.
const ROPE_THETA: f64 = 10_000.0;

/// Typed access to one JSON object, with errors naming the field and the file.
#[derive(Clone, Copy)]
struct Fields<'a> {
    obj: &'a Map<String, Value>,
    file: &'a str,
}

impl<'a> Fields<'a> {
    fn new(value: &'a Value, file: &'a str) -> Result<Self> {
        match value.as_object() {
            Some(obj) => Ok(Fields { obj, file }),
            None => Err(ModelError::Config(format!(
                "{file}: expected a JSON object at the top level"
            ))),
        }
    }

    /// The value of `key`; `null` reads as absent.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn bad(&self, key: &str, expected: &str, got: &Value) -> ModelError {
        ModelError::Config(format!(
            "{}: field {key:?} must be {expected}, got {got}",
            self.file
        ))
    }

    fn usize_opt(&self, key: &str) -> Result<Option<usize>> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| self.bad(key, "a non-negative integer", v))
            })
            .transpose()
    }

    fn usize_req(&self, key: &str) -> Result<usize> {
        self.usize_opt(key)?.ok_or_else(|| {
            ModelError::Config(format!("{}: missing required field {key:?}", self.file))
        })
    }

    fn u32_opt(&self, key: &str) -> Result<Option<u32>> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| self.bad(key, "a token id", v))
            })
            .transpose()
    }

    fn f64_opt(&self, key: &str) -> Result<Option<f64>> {
        self.get(key)
            .map(|v| v.as_f64().ok_or_else(|| self.bad(key, "a number", v)))
            .transpose()
    }

    fn f64_req(&self, key: &str) -> Result<f64> {
        self.f64_opt(key)?.ok_or_else(|| {
            ModelError::Config(format!("{}: missing required field {key:?}", self.file))
        })
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.bad(key, "true or false", v)),
        }
    }

    fn str_opt(&self, key: &str) -> Result<Option<&'a str>> {
        self.get(key)
            .map(|v| v.as_str().ok_or_else(|| self.bad(key, "a string", v)))
            .transpose()
    }

    /// A token id or a list of them; `Ok(None)` when the key is absent
    /// (an explicit `null` is an empty list).
    fn token_ids(&self, key: &str) -> Result<Option<Vec<u32>>> {
        let Some(v) = self.obj.get(key) else {
            return Ok(None);
        };
        let as_id = |x: &Value| x.as_u64().and_then(|n| u32::try_from(n).ok());
        let ids = match v {
            Value::Null => Some(Vec::new()),
            Value::Array(items) => items.iter().map(as_id).collect(),
            other => as_id(other).map(|id| vec![id]),
        };
        ids.map(Some)
            .ok_or_else(|| self.bad(key, "a token id or a list of token ids", v))
    }

    /// A required list of numbers (LongRoPE's factors).
    fn f64_list(&self, key: &str) -> Result<Vec<f64>> {
        let v = self.get(key).ok_or_else(|| {
            ModelError::Config(format!("{}: missing required field {key:?}", self.file))
        })?;
        v.as_array()
            .and_then(|items| items.iter().map(Value::as_f64).collect())
            .ok_or_else(|| self.bad(key, "a list of numbers", v))
    }

    /// A nested object (`rope_scaling`), as [`Fields`] of the same file.
    fn object(&self, key: &str) -> Result<Option<Fields<'a>>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_object() {
                Some(obj) => Ok(Some(Fields {
                    obj,
                    file: self.file,
                })),
                None => Err(self.bad(key, "an object", v)),
            },
        }
    }
}

/// Reads `dir/config.json` and, when present, `dir/generation_config.json`.
pub fn load_hf_config(dir: &Path) -> Result<ModelConfig> {
    load_config_file(&dir.join("config.json"))
}

/// Reads a `config.json` at any path, and the `generation_config.json` next
/// to it when there is one.
pub fn load_config_file(config_path: &Path) -> Result<ModelConfig> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })
    };
    let config = read(config_path)?;
    let gen_path = config_path
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join("generation_config.json");
    let generation = if gen_path.is_file() {
        Some(read(&gen_path)?)
    } else {
        None
    };
    parse_with_names(
        &config,
        &config_path.display().to_string(),
        generation
            .as_deref()
            .map(|g| (g, gen_path.display().to_string())),
    )
}

/// Parses the text of `config.json` and optionally of `generation_config.json`.
pub fn parse_hf_config(
    config_json: &str,
    generation_config_json: Option<&str>,
) -> Result<ModelConfig> {
    parse_with_names(
        config_json,
        "config.json",
        generation_config_json.map(|g| (g, "generation_config.json".to_string())),
    )
}

fn parse_json(text: &str, file: &str) -> Result<Value> {
    serde_json::from_str(text)
        .map_err(|e| ModelError::Config(format!("{file}: not valid JSON: {e}")))
}

fn parse_with_names(
    config_json: &str,
    config_file: &str,
    generation: Option<(&str, String)>,
) -> Result<ModelConfig> {
    let value = parse_json(config_json, config_file)?;
    super::quant_config::check(&value, config_file)?;
    let top = Fields::new(&value, config_file)?;
    let class = detect_class(&top)?;
    // Gemma 3's multimodal checkpoints keep the language model's fields in
    // `text_config`.
    let f = match top.object("text_config")? {
        Some(text) if class == HfClass::Gemma3 => text,
        _ => top,
    };
    let mut cfg = build(&f, class)?;
    if f.get("eos_token_id").is_none() && top.get("eos_token_id").is_some() {
        cfg.eos_token_ids = top.token_ids("eos_token_id")?.unwrap_or_default();
    }

    if let Some((text, file)) = generation {
        let gen_value = parse_json(text, &file)?;
        let g = Fields::new(&gen_value, &file)?;
        for id in g.token_ids("eos_token_id")?.unwrap_or_default() {
            if !cfg.eos_token_ids.contains(&id) {
                cfg.eos_token_ids.push(id);
            }
        }
        if cfg.bos_token_id.is_none() {
            cfg.bos_token_id = g.u32_opt("bos_token_id")?;
        }
    }
    cfg.validate()
        .map_err(|e| ModelError::Config(format!("{config_file}: {e}")))?;
    Ok(cfg)
}

fn detect_class(f: &Fields) -> Result<HfClass> {
    let first_arch = match f.get("architectures") {
        None => None,
        Some(Value::Array(items)) => match items.first() {
            None => None,
            Some(Value::String(s)) => Some(s.as_str()),
            Some(other) => return Err(f.bad("architectures", "a list of strings", other)),
        },
        Some(other) => return Err(f.bad("architectures", "a list of strings", other)),
    };
    let name = match first_arch {
        Some(name) => name,
        None => f.str_opt("model_type")?.ok_or_else(|| {
            ModelError::Config(format!(
                "{}: neither \"architectures\" nor \"model_type\" is set",
                f.file
            ))
        })?,
    };
    if let Some(class) = HfClass::from_name(name) {
        return Ok(class);
    }
    let lower = name.to_ascii_lowercase();
    let stem = lower.strip_suffix("forcausallm").unwrap_or(&lower);
    if UNSUPPORTED_MOE.contains(&stem) {
        return Err(ModelError::Config(format!(
            "{}: {name} is a mixture-of-experts family pagoda does not implement \
             (mixture-of-experts models supported: qwen3_moe, mixtral, qwen2_moe)",
            f.file
        )));
    }
    Err(ModelError::UnknownArchitecture(name.to_string()))
}

fn build(f: &Fields, class: HfClass) -> Result<ModelConfig> {
    let d = class.defaults();
    let is_opt = class == HfClass::Opt;
    let hidden_size = f.usize_req("hidden_size")?;
    let intermediate_size = f.usize_req(if is_opt {
        "ffn_dim"
    } else {
        "intermediate_size"
    })?;
    let num_hidden_layers = f.usize_req("num_hidden_layers")?;
    let num_attention_heads = match f.usize_opt("num_attention_heads")? {
        Some(n) => n,
        None if class == HfClass::Gemma3 => 8,
        None => f.usize_req("num_attention_heads")?,
    };
    // Gemma 3's published configs rely on this and the heads' class default.
    let vocab_size = match f.usize_opt("vocab_size")? {
        Some(v) => v,
        None if class == HfClass::Gemma3 => 262_208,
        None => f.usize_req("vocab_size")?,
    };
    let max_position_embeddings = f
        .usize_opt("max_position_embeddings")?
        .unwrap_or(d.max_position_embeddings);

    check_supported(f, class)?;

    let (num_key_value_heads, head_dim) = if is_opt {
        (num_attention_heads, None)
    } else {
        let kv = f.usize_opt("num_key_value_heads")?;
        (
            kv.or(d.num_key_value_heads).unwrap_or(num_attention_heads),
            f.usize_opt("head_dim")?.or(d.head_dim),
        )
    };
    let mut gemma = None;
    let (rope_theta, rope_scaling) = if is_opt {
        (ROPE_THETA, None)
    } else if class.is_gemma() {
        let (theta, scaling, local) = gemma_rope(f, class, max_position_embeddings)?;
        gemma = Some(gemma_fields(f, class, num_hidden_layers, local)?);
        (theta, scaling)
    } else {
        // Phi3Config's own `original_max_position_embeddings` (always set, 4096
        // by default) overrides the one inside the rope parameters.
        let original = match class {
            HfClass::Phi3 => Some(
                f.usize_opt("original_max_position_embeddings")?
                    .unwrap_or(PHI3_ORIGINAL_MAX_POSITIONS),
            ),
            _ => None,
        };
        let default_theta = if class == HfClass::Mixtral {
            1e6
        } else {
            ROPE_THETA
        };
        rope(f, max_position_embeddings, original, default_theta)?
    };
    let rotary_dim = match class {
        HfClass::Phi3 => partial_rotary_dim(f, head_dim, hidden_size, num_attention_heads)?,
        _ => None,
    };
    let attention_bias = match class {
        // Qwen2's q/k/v biases are unconditional (no config field);
        // Qwen2-MoE's follow `qkv_bias` (o_proj never has one).
        HfClass::Qwen2 => true,
        HfClass::Qwen2Moe => f.bool_or("qkv_bias", true)?,
        HfClass::Llama | HfClass::Qwen3 | HfClass::Qwen3Moe => {
            f.bool_or("attention_bias", false)?
        }
        HfClass::Mistral
        | HfClass::Mixtral
        | HfClass::Opt
        | HfClass::Gemma2
        | HfClass::Gemma3
        | HfClass::Phi3 => false,
    };
    let eos_token_ids = match f.token_ids("eos_token_id")? {
        Some(ids) => ids,
        None => d.eos_token_id.into_iter().collect(),
    };
    let bos_token_id = match f.obj.get("bos_token_id") {
        None => d.bos_token_id,
        Some(_) => f.u32_opt("bos_token_id")?,
    };
    let torch_dtype = match f.str_opt("dtype")? {
        Some(s) => Some(s),
        None => f.str_opt("torch_dtype")?,
    };

    Ok(ModelConfig {
        architecture: class.architecture(),
        hidden_size,
        intermediate_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        rotary_dim,
        vocab_size,
        max_position_embeddings,
        rms_norm_eps: if is_opt {
            OPT_LAYER_NORM_EPS
        } else {
            let default = if class == HfClass::Phi3 {
                PHI3_RMS_NORM_EPS
            } else if class == HfClass::Mixtral {
                1e-5
            } else {
                RMS_NORM_EPS
            };
            f.f64_opt("rms_norm_eps")?.unwrap_or(default)
        },
        rope_theta,
        rope_scaling,
        tie_word_embeddings: f.bool_or("tie_word_embeddings", d.tie_word_embeddings)?,
        attention_bias,
        bos_token_id,
        eos_token_ids,
        word_embed_proj_dim: if is_opt {
            f.usize_opt("word_embed_proj_dim")?
        } else {
            None
        },
        do_layer_norm_before: if is_opt {
            f.bool_or("do_layer_norm_before", true)?
        } else {
            true
        },
        torch_dtype: torch_dtype.map(str::to_string),
        sliding_window: sliding_window(f, class, gemma.as_ref())?,
        gemma,
        moe: moe_fields(f, class, num_hidden_layers, intermediate_size)?,
    })
}

/// Qwen3-MoE's, Qwen2-MoE's and Mixtral's expert fields, with their
/// classes' defaults; `None` for dense classes. Qwen3-MoE's (and
/// Qwen2-MoE's) sparse layers are those not in
/// `mlp_only_layers` whose number plus one is a multiple of
/// `decoder_sparse_step` (transformers' rule); every Mixtral layer is
/// sparse, its experts `intermediate_size` wide, their weights renormalized.
fn moe_fields(
    f: &Fields,
    class: HfClass,
    num_layers: usize,
    intermediate_size: usize,
) -> Result<Option<crate::MoeConfig>> {
    let moe = match class {
        HfClass::Qwen3Moe | HfClass::Qwen2Moe => {
            let qwen2 = class == HfClass::Qwen2Moe;
            let step = f.usize_opt("decoder_sparse_step")?.unwrap_or(1);
            if step == 0 {
                return Err(f.bad("decoder_sparse_step", "positive", &Value::from(0)));
            }
            let mlp_only: Vec<usize> = match f.get("mlp_only_layers") {
                None => Vec::new(),
                Some(v) => v
                    .as_array()
                    .and_then(|a| {
                        a.iter()
                            .map(|x| x.as_u64().and_then(|n| usize::try_from(n).ok()))
                            .collect()
                    })
                    .ok_or_else(|| f.bad("mlp_only_layers", "a list of layer numbers", v))?,
            };
            // transformers 5 writes the attribute-mapped `num_local_experts`.
            // Class defaults: Qwen3MoeConfig's (128, top 8, 768), then
            // Qwen2MoeConfig's (60, top 4, 1408, shared 5632).
            let (d_exp, d_top, d_inter) = if qwen2 { (60, 4, 1408) } else { (128, 8, 768) };
            let num_experts = match f.usize_opt("num_experts")? {
                Some(n) => n,
                None => f.usize_opt("num_local_experts")?.unwrap_or(d_exp),
            };
            if num_experts == 0 {
                return Err(ModelError::Config(format!(
                    "{}: {} with num_experts = 0 is not supported",
                    f.file,
                    if qwen2 { "qwen2_moe" } else { "qwen3_moe" }
                )));
            }
            let shared_expert_intermediate_size = if qwen2 {
                Some(
                    f.usize_opt("shared_expert_intermediate_size")?
                        .unwrap_or(5632),
                )
            } else {
                None
            };
            crate::MoeConfig {
                num_experts,
                num_experts_per_tok: f.usize_opt("num_experts_per_tok")?.unwrap_or(d_top),
                moe_intermediate_size: f.usize_opt("moe_intermediate_size")?.unwrap_or(d_inter),
                norm_topk_prob: f.bool_or("norm_topk_prob", false)?,
                sparse_layers: (0..num_layers)
                    .map(|i| !mlp_only.contains(&i) && (i + 1) % step == 0)
                    .collect(),
                shared_expert_intermediate_size,
            }
        }
        HfClass::Mixtral => crate::MoeConfig {
            num_experts: f.usize_opt("num_local_experts")?.unwrap_or(8),
            num_experts_per_tok: f.usize_opt("num_experts_per_tok")?.unwrap_or(2),
            moe_intermediate_size: intermediate_size,
            norm_topk_prob: true,
            sparse_layers: vec![true; num_layers],
            shared_expert_intermediate_size: None,
        },
        _ => return Ok(None),
    };
    Ok(Some(moe))
}

/// Rejects config values whose model pagoda's architecture files cannot build.
fn check_supported(f: &Fields, class: HfClass) -> Result<()> {
    let unsupported = |what: String| {
        Err(ModelError::Config(format!(
            "{}: {what} is not supported",
            f.file
        )))
    };
    if class == HfClass::Opt {
        let act = f.str_opt("activation_function")?.unwrap_or("relu");
        if act != "relu" {
            return unsupported(format!("activation_function {act:?} (OPT needs \"relu\")"));
        }
        if !f.bool_or("enable_bias", true)? {
            return unsupported("OPT with enable_bias = false".into());
        }
        if !f.bool_or("layer_norm_elementwise_affine", true)? {
            return unsupported("OPT with layer_norm_elementwise_affine = false".into());
        }
        return Ok(());
    }
    if class.is_gemma() {
        let act = match f.str_opt("hidden_activation")? {
            Some(a) => a,
            None => f.str_opt("hidden_act")?.unwrap_or("gelu_pytorch_tanh"),
        };
        if act != "gelu_pytorch_tanh" {
            return unsupported(format!(
                "hidden_activation {act:?} (Gemma needs \"gelu_pytorch_tanh\")"
            ));
        }
        if f.bool_or("attention_bias", false)? {
            return unsupported("Gemma with attention_bias = true".into());
        }
        if f.bool_or("use_bidirectional_attention", false)? {
            return unsupported("use_bidirectional_attention = true".into());
        }
        return Ok(());
    }
    let act = f.str_opt("hidden_act")?.unwrap_or("silu");
    if act != "silu" {
        return unsupported(format!("hidden_act {act:?} (only \"silu\")"));
    }
    if f.bool_or("mlp_bias", false)? {
        return unsupported("mlp_bias = true".into());
    }
    Ok(())
}

/// The sliding window the config puts to use, if any: Mistral's
/// `sliding_window` (null is none, absent is `MistralConfig`'s 4096; every
/// layer slides: transformers' `MistralForCausalLM` ignores `layer_types`,
/// vLLM follows them, so a Mistral list mixing full and sliding layers is
/// refused); Qwen2's and Qwen3's only with `use_sliding_window: true`, and
/// then on the layers from `max_window_layers` on (none where that is past
/// the last layer). A `layer_types` list, where present, says which layers
/// slide. A window of 0 is none.
fn sliding_window(
    f: &Fields,
    class: HfClass,
    gemma: Option<&crate::GemmaConfig>,
) -> Result<Option<usize>> {
    if let Some(g) = gemma {
        // transformers' class default is 4096; recorded only where a layer slides.
        let window = f.usize_opt("sliding_window")?.unwrap_or(4096);
        return Ok(g.sliding_layers.iter().any(|&s| s).then_some(window));
    }
    let window = match class {
        // Phi3Config's default is none (Phi-3-mini-4k sets 2047).
        HfClass::Phi3 => f.usize_opt("sliding_window")?,
        HfClass::Mistral => match f.obj.get("sliding_window") {
            None => Some(MISTRAL_SLIDING_WINDOW),
            Some(_) => f.usize_opt("sliding_window")?,
        },
        // MixtralConfig's default is none.
        HfClass::Mixtral => f.usize_opt("sliding_window")?,
        HfClass::Qwen2Moe if f.bool_or("use_sliding_window", false)? => {
            // Qwen2MoeConfig slides on every other layer below
            // `max_window_layers`, a pattern the model file does not have.
            return Err(ModelError::Config(format!(
                "{}: qwen2_moe with use_sliding_window = true is not supported",
                f.file
            )));
        }
        HfClass::Qwen2 | HfClass::Qwen3 | HfClass::Qwen3Moe
            if f.bool_or("use_sliding_window", false)? =>
        {
            f.usize_opt("sliding_window")?
        }
        _ => None,
    };
    let Some(window) = window.filter(|&w| w > 0) else {
        return Ok(None);
    };
    if let Some(types) = f.get("layer_types") {
        let types = types
            .as_array()
            .ok_or_else(|| f.bad("layer_types", "an array", types))?;
        let slides = types
            .iter()
            .filter(|t| t.as_str() == Some("sliding_attention"))
            .count();
        if class == HfClass::Mistral && slides > 0 && slides < types.len() {
            return Err(ModelError::Config(format!(
                "{}: layer_types mixing full and sliding attention on a mistral config is not \
                 supported (transformers' MistralForCausalLM slides on every layer, vLLM only \
                 on the listed ones)",
                f.file
            )));
        }
        return Ok((slides > 0).then_some(window));
    }
    if matches!(class, HfClass::Qwen2 | HfClass::Qwen3 | HfClass::Qwen3Moe) {
        if let Some(first) = f.usize_opt("max_window_layers")? {
            if first >= f.usize_opt("num_hidden_layers")?.unwrap_or(0) {
                return Ok(None);
            }
        }
    }
    Ok(Some(window))
}

/// Gemma's `(global rope_theta, global rope_scaling, local base)`: from
/// transformers 5's `rope_parameters` keyed by layer type, or from
/// `rope_theta` / `rope_scaling` / `rope_local_base_freq` (Gemma 3's defaults
/// 1e6 and 1e4; Gemma 2 has one base, default 1e4, for every layer).
fn gemma_rope(
    f: &Fields,
    class: HfClass,
    max_position_embeddings: usize,
) -> Result<(f64, Option<RopeScaling>, f64)> {
    let by_type = f
        .object("rope_parameters")?
        .filter(|p| p.get("full_attention").is_some() || p.get("sliding_attention").is_some());
    if let Some(p) = by_type {
        let global = match p.object("full_attention")? {
            Some(g) => g,
            None => {
                return Err(ModelError::Config(format!(
                    "{}: rope_parameters has no \"full_attention\" entry",
                    f.file
                )))
            }
        };
        let (theta, scaling) = rope_entry(&global, 1e6, max_position_embeddings)?;
        let local = match p.object("sliding_attention")? {
            None => theta,
            Some(l) => match rope_entry(&l, 1e4, max_position_embeddings)? {
                (t, None) => t,
                (_, Some(_)) => {
                    return Err(ModelError::Config(format!(
                        "{}: scaled RoPE on sliding layers is not supported",
                        f.file
                    )))
                }
            },
        };
        return Ok((theta, scaling, local));
    }
    let default_theta = if class == HfClass::Gemma3 {
        1e6
    } else {
        ROPE_THETA
    };
    let (theta, scaling) = match f.object("rope_scaling")? {
        Some(s) => {
            let (_, scaling) = rope_entry(&s, default_theta, max_position_embeddings)?;
            (f.f64_opt("rope_theta")?.unwrap_or(default_theta), scaling)
        }
        None => match f.object("rope_parameters")? {
            Some(p) => rope_entry(&p, default_theta, max_position_embeddings)?,
            None => (f.f64_opt("rope_theta")?.unwrap_or(default_theta), None),
        },
    };
    let local = if class == HfClass::Gemma3 {
        f.f64_opt("rope_local_base_freq")?.unwrap_or(1e4)
    } else {
        theta
    };
    Ok((theta, scaling, local))
}

/// One RoPE parameter object (`rope_type`/`type`, `rope_theta`, `factor`).
fn rope_entry(
    s: &Fields,
    default_theta: f64,
    max_position_embeddings: usize,
) -> Result<(f64, Option<RopeScaling>)> {
    let theta = s.f64_opt("rope_theta")?.unwrap_or(default_theta);
    Ok((theta, rope_scaling(s, max_position_embeddings, None)?))
}

/// The scaling a RoPE parameter object names (`rope_type` or `type`).
/// `original` (Phi-3's top-level `original_max_position_embeddings`)
/// overrides the object's own for LongRoPE, as transformers does.
fn rope_scaling(
    s: &Fields,
    max_position_embeddings: usize,
    original: Option<usize>,
) -> Result<Option<RopeScaling>> {
    let kind = match s.str_opt("rope_type")? {
        Some(k) => k,
        None => s.str_opt("type")?.unwrap_or("default"),
    };
    Ok(match kind {
        "default" => None,
        "linear" => Some(RopeScaling::Linear {
            factor: s.f64_req("factor")?,
        }),
        "llama3" => Some(RopeScaling::Llama3 {
            factor: s.f64_req("factor")?,
            low_freq_factor: s.f64_req("low_freq_factor")?,
            high_freq_factor: s.f64_req("high_freq_factor")?,
            original_max_position_embeddings: s
                .usize_opt("original_max_position_embeddings")?
                .unwrap_or(max_position_embeddings),
        }),
        // Phi-3's LongRoPE; "su" is its earlier name (transformers renames it).
        "longrope" | "su" => {
            let original = match original {
                Some(o) => o,
                None => s
                    .usize_opt("original_max_position_embeddings")?
                    .unwrap_or(max_position_embeddings),
            };
            if original == 0 {
                return Err(s.bad("original_max_position_embeddings", "positive", &0.into()));
            }
            // transformers' _compute_longrope_parameters.
            let factor = match s.f64_opt("factor")? {
                Some(f) => f,
                None => max_position_embeddings as f64 / original as f64,
            };
            let attention_factor = match s.f64_opt("attention_factor")? {
                Some(a) => a,
                None if factor <= 1.0 => 1.0,
                None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
            };
            Some(RopeScaling::LongRope {
                short_factor: s.f64_list("short_factor")?,
                long_factor: s.f64_list("long_factor")?,
                original_max_position_embeddings: original,
                attention_factor,
            })
        }
        other => {
            return Err(ModelError::Config(format!(
                "{}: unsupported rope scaling type {other:?} (supported: default, linear, \
                 llama3, longrope)",
                s.file
            )))
        }
    })
}

/// Phi-3's rotated dimensions per head: `int(head_dim * partial_rotary_factor)`
/// (the factor inside the rope parameters first, as transformers), `None`
/// where that is the whole head.
fn partial_rotary_dim(
    f: &Fields,
    head_dim: Option<usize>,
    hidden_size: usize,
    num_attention_heads: usize,
) -> Result<Option<usize>> {
    let mut factor = None;
    for key in ["rope_parameters", "rope_scaling"] {
        if let Some(p) = f.object(key)? {
            factor = factor.or(p.f64_opt("partial_rotary_factor")?);
        }
    }
    let factor = match factor {
        Some(x) => x,
        None => f.f64_opt("partial_rotary_factor")?.unwrap_or(1.0),
    };
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(f.bad("partial_rotary_factor", "in (0, 1]", &factor.into()));
    }
    let Some(head_dim) = head_dim.or(hidden_size.checked_div(num_attention_heads)) else {
        return Ok(None);
    };
    let rotary = (head_dim as f64 * factor) as usize;
    Ok((rotary != head_dim).then_some(rotary))
}

/// Gemma's per-layer types, query scale and soft-capping.
fn gemma_fields(
    f: &Fields,
    class: HfClass,
    num_layers: usize,
    rope_local_base_freq: f64,
) -> Result<crate::GemmaConfig> {
    let sliding_layers = match f.get("layer_types") {
        Some(types) => {
            let list = types
                .as_array()
                .ok_or_else(|| f.bad("layer_types", "an array", types))?;
            list.iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(f.bad(
                        "layer_types",
                        "a list of \"sliding_attention\" / \"full_attention\"",
                        t,
                    )),
                })
                .collect::<Result<Vec<bool>>>()?
        }
        None => {
            let default = if class == HfClass::Gemma3 { 6 } else { 2 };
            let pattern = match f.usize_opt("sliding_window_pattern")? {
                Some(p) => p,
                None => f.usize_opt("_sliding_window_pattern")?.unwrap_or(default),
            };
            if pattern == 0 {
                return Err(f.bad("sliding_window_pattern", "positive", &Value::from(0)));
            }
            (0..num_layers).map(|i| (i + 1) % pattern != 0).collect()
        }
    };
    let (attn_cap, final_cap) = if class == HfClass::Gemma2 {
        (Some(50.0), Some(30.0))
    } else {
        (None, None)
    };
    let cap = |key: &str, default: Option<f64>| -> Result<Option<f64>> {
        // An explicit null turns capping off.
        match f.obj.get(key) {
            None => Ok(default),
            Some(Value::Null) => Ok(None),
            Some(_) => f.f64_opt(key),
        }
    };
    Ok(crate::GemmaConfig {
        sliding_layers,
        rope_local_base_freq,
        query_pre_attn_scalar: f.f64_opt("query_pre_attn_scalar")?.unwrap_or(256.0),
        attn_logit_softcapping: cap("attn_logit_softcapping", attn_cap)?,
        final_logit_softcapping: cap("final_logit_softcapping", final_cap)?,
    })
}

/// `(rope_theta, rope_scaling)` from `rope_scaling` / `rope_parameters`.
fn rope(
    f: &Fields,
    max_position_embeddings: usize,
    original: Option<usize>,
    default_theta: f64,
) -> Result<(f64, Option<RopeScaling>)> {
    let params = f.object("rope_parameters")?;
    let scaling = match f.object("rope_scaling")? {
        Some(s) => Some(s),
        None => params,
    };
    let theta = match params
        .map(|p| p.f64_opt("rope_theta"))
        .transpose()?
        .flatten()
    {
        Some(t) => t,
        None => f.f64_opt("rope_theta")?.unwrap_or(default_theta),
    };
    let Some(s) = scaling else {
        return Ok((theta, None));
    };
    Ok((theta, rope_scaling(&s, max_position_embeddings, original)?))
}

#[cfg(test)]
#[path = "hf_config_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "hf_config_moe_tests.rs"]
mod moe_tests;
