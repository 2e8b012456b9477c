//! Opening a model path: decides the format and returns config, weights and
//! tokenizer together.
//!
//! - a file ending in `.gguf` (or starting with the GGUF magic): GGUF;
//! - a directory with `config.json`: Hugging Face (safetensors + tokenizer.json);
//! - `dummy_weights`: the config (from `--config` or the directory) with
//!   deterministic random weights; the tokenizer still comes from the model
//!   path when one is given.
//!
//! `tokenizer` (a Hugging Face `tokenizer.json`, or a directory holding one)
//! replaces the model's own tokenizer, which is then not built at all (so a
//! GGUF whose tokenizer pagoda cannot build still opens). It must not produce
//! ids beyond the model's vocabulary.

use crate::loader::dummy::DummySource;
use crate::loader::gguf::GgufSource;
use crate::loader::{hf_config, safetensors, TensorInfo, WeightSource};
use crate::tokenizer::Tokenizer;
use crate::{ModelConfig, ModelError, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What to open.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// A .gguf file or a Hugging Face directory.
    pub model: Option<PathBuf>,
    /// A config.json (for dummy weights).
    pub config: Option<PathBuf>,
    /// Generate weights instead of reading them.
    pub dummy_weights: bool,
    /// A Hugging Face tokenizer.json (or a directory with one) that replaces
    /// the model's own tokenizer.
    pub tokenizer: Option<PathBuf>,
}

/// Where the weights come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelFormat {
    Gguf,
    Safetensors,
    Dummy,
}

/// An opened model: everything needed to build and drive it.
pub struct ModelFiles {
    pub format: ModelFormat,
    pub path: Option<PathBuf>,
    pub config: ModelConfig,
    pub weights: Box<dyn WeightSource>,
    pub tokenizer: Option<Arc<Tokenizer>>,
}

/// Opens the model `opts` describes.
pub fn open_model(opts: &OpenOptions) -> Result<ModelFiles> {
    let Some(path) = &opts.tokenizer else {
        return open_files(opts, true);
    };
    if !path.exists() {
        return Err(ModelError::Io {
            path: path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such tokenizer file"),
        });
    }
    let tokenizer = Tokenizer::from_hf_file(path)?;
    let mut files = open_files(opts, false)?;
    if tokenizer.vocab_size() > files.config.vocab_size {
        return Err(ModelError::Tokenizer(format!(
            "{} has {} tokens but the model's vocabulary has {}",
            path.display(),
            tokenizer.vocab_size(),
            files.config.vocab_size
        )));
    }
    files.tokenizer = Some(Arc::new(tokenizer));
    Ok(files)
}

/// Opens config and weights, and the model's own tokenizer when `own_tokenizer`.
fn open_files(opts: &OpenOptions, own_tokenizer: bool) -> Result<ModelFiles> {
    let model = opts.model.as_deref();
    if let Some(p) = model {
        if !p.exists() {
            return Err(ModelError::Io {
                path: p.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no such file or directory",
                ),
            });
        }
    }
    if opts.dummy_weights {
        let config_path =
            match (&opts.config, model) {
                (Some(c), _) => c.clone(),
                (None, Some(dir)) if dir.is_dir() => dir.join("config.json"),
                _ => return Err(ModelError::Config(
                    "--dummy-weights needs --config FILE or a --model directory with config.json"
                        .into(),
                )),
            };
        let config = hf_config::load_config_file(&config_path)?;
        let tokenizer = match model {
            _ if !own_tokenizer => None,
            Some(p) if p.is_dir() && p.join("tokenizer.json").exists() => {
                Some(Arc::new(Tokenizer::from_hf_dir(p)?))
            }
            Some(p) if p.is_file() => Some(open_gguf(p, true)?.tokenizer.ok_or_else(|| {
                ModelError::Tokenizer(format!("{} has no tokenizer", p.display()))
            })?),
            _ => None,
        };
        let weights = DummySource::new(&config)?;
        return Ok(ModelFiles {
            format: ModelFormat::Dummy,
            path: model.map(Path::to_path_buf),
            config,
            weights: Box::new(weights),
            tokenizer,
        });
    }
    let Some(path) = model else {
        return Err(ModelError::Config(
            "no model given: use --model PATH".into(),
        ));
    };
    if path.is_dir() {
        if !path.join("config.json").is_file() {
            return Err(ModelError::Config(format!(
                "{} is a directory without config.json; give a .gguf file or a Hugging Face model directory",
                path.display()
            )));
        }
        let (config, weights) = safetensors::open_hf_dir(path)?;
        let tokenizer = if own_tokenizer && path.join("tokenizer.json").exists() {
            Some(Arc::new(Tokenizer::from_hf_dir(path)?))
        } else {
            None
        };
        Ok(ModelFiles {
            format: ModelFormat::Safetensors,
            path: Some(path.to_path_buf()),
            config,
            weights: Box::new(weights),
            tokenizer,
        })
    } else {
        open_gguf(path, own_tokenizer)
    }
}

fn open_gguf(path: &Path, own_tokenizer: bool) -> Result<ModelFiles> {
    let (config, source) = GgufSource::open(path)?;
    if !own_tokenizer {
        return Ok(ModelFiles {
            format: ModelFormat::Gguf,
            path: Some(path.to_path_buf()),
            config,
            weights: Box::new(source),
            tokenizer: None,
        });
    }
    let spec = source.tokenizer_metadata()?;
    let tokenizer = Some(Arc::new(Tokenizer::from_gguf(&spec)?));
    Ok(ModelFiles {
        format: ModelFormat::Gguf,
        path: Some(path.to_path_buf()),
        config,
        weights: Box::new(source),
        tokenizer,
    })
}

/// What `pagoda info` prints.
#[derive(Debug, Clone, Serialize)]
pub struct ModelSummary {
    pub format: ModelFormat,
    pub path: Option<PathBuf>,
    pub config: ModelConfig,
    pub num_parameters: usize,
    /// Tensor count per storage type.
    pub dtypes: BTreeMap<String, usize>,
    pub chat_template: bool,
    pub tokenizer_vocab_size: Option<usize>,
    /// The tokenizer's model ([`Tokenizer::model_kind`]).
    pub tokenizer_model: Option<&'static str>,
    pub tensors: Vec<TensorInfo>,
}

impl ModelFiles {
    pub fn summary(&self) -> ModelSummary {
        let tensors = self.weights.tensor_infos();
        let mut dtypes = BTreeMap::new();
        for t in &tensors {
            *dtypes.entry(t.dtype.clone()).or_insert(0) += 1;
        }
        ModelSummary {
            format: self.format,
            path: self.path.clone(),
            config: self.config.clone(),
            num_parameters: tensors
                .iter()
                .map(|t| t.shape.iter().product::<usize>())
                .sum(),
            dtypes,
            chat_template: self
                .tokenizer
                .as_ref()
                .is_some_and(|t| t.chat_template().is_some()),
            tokenizer_vocab_size: self.tokenizer.as_ref().map(|t| t.vocab_size()),
            tokenizer_model: self.tokenizer.as_ref().map(|t| t.model_kind()),
            tensors,
        }
    }
}

impl fmt::Display for ModelSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        if let Some(p) = &self.path {
            writeln!(f, "path:                 {}", p.display())?;
        }
        writeln!(f, "format:               {:?}", self.format)?;
        writeln!(f, "architecture:         {}", c.architecture.as_str())?;
        writeln!(
            f,
            "parameters:           {} ({:.1}M)",
            self.num_parameters,
            self.num_parameters as f64 / 1e6
        )?;
        writeln!(f, "hidden size:          {}", c.hidden_size)?;
        writeln!(f, "intermediate size:    {}", c.intermediate_size)?;
        writeln!(f, "layers:               {}", c.num_hidden_layers)?;
        if let Some(m) = &c.moe {
            let sparse = m.sparse_layers.iter().filter(|&&s| s).count();
            writeln!(
                f,
                "experts:              {} (top {}, width {}, {}renormalized; {sparse} sparse layers)",
                m.num_experts,
                m.num_experts_per_tok,
                m.moe_intermediate_size,
                if m.norm_topk_prob { "" } else { "not " }
            )?;
        }
        writeln!(
            f,
            "attention heads:      {} (kv heads {}, head dim {})",
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim()
        )?;
        writeln!(f, "vocab size:           {}", c.vocab_size)?;
        writeln!(f, "context length:       {}", c.max_position_embeddings)?;
        writeln!(f, "rope theta:           {}", c.rope_theta)?;
        match &c.rope_scaling {
            Some(crate::RopeScaling::LongRope {
                short_factor,
                original_max_position_embeddings: original,
                attention_factor,
                ..
            }) => writeln!(
                f,
                "rope scaling:         longrope ({} short/long factors, original context \
                 {original}: long factors when --max-model-len is over it; attention factor \
                 {attention_factor:.6})",
                short_factor.len()
            )?,
            Some(s) => writeln!(f, "rope scaling:         {s:?}")?,
            None => {}
        }
        if c.rotary_dim() != c.head_dim() {
            writeln!(
                f,
                "rotary dims:          {} of {}",
                c.rotary_dim(),
                c.head_dim()
            )?;
        }
        if let Some(w) = c.sliding_window {
            writeln!(f, "sliding window:       {w}")?;
        }
        writeln!(f, "norm eps:             {}", c.rms_norm_eps)?;
        writeln!(f, "tied embeddings:      {}", c.tie_word_embeddings)?;
        let dtypes: Vec<String> = self
            .dtypes
            .iter()
            .map(|(k, v)| format!("{k} x{v}"))
            .collect();
        writeln!(f, "tensor types:         {}", dtypes.join(", "))?;
        if let Some(v) = self.tokenizer_vocab_size {
            writeln!(f, "tokenizer vocab:      {v}")?;
        }
        if let Some(m) = self.tokenizer_model {
            writeln!(f, "tokenizer model:      {m}")?;
        }
        writeln!(
            f,
            "chat template:        {}",
            if self.chat_template { "yes" } else { "no" }
        )?;
        writeln!(
            f,
            "bos / eos:            {:?} / {:?}",
            c.bos_token_id, c.eos_token_ids
        )
    }
}
