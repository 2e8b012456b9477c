//! The architecture-neutral model configuration.
//!
//! Every loader (Hugging Face `config.json`, GGUF metadata) produces a
//! [`ModelConfig`] with Hugging Face's field names and meanings; model files
//! read nothing else. Derived quantities (`head_dim`, KV width) are methods so
//! they cannot disagree with the fields.

use serde::{Deserialize, Serialize};

/// The architectures pagoda implements, one file each under `arch/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Llama 2/3, SmolLM2, Mistral-style (no biases, RMSNorm, SwiGLU, RoPE).
    Llama,
    /// Llama plus biases on q/k/v.
    Qwen2,
    /// Llama plus per-head RMSNorm on q and k.
    Qwen3,
    /// Learned positions (offset 2), LayerNorm, ReLU, biases everywhere.
    Opt,
    /// Gemma 2: (1 + w) RMSNorm before and after attention and MLP, scaled
    /// embeddings, gelu-tanh gated MLP, local (sliding) and global layers,
    /// attention and final logit soft-capping ([`GemmaConfig`]).
    Gemma2,
    /// Gemma 3: Gemma 2's layer plus q/k RMSNorm, a second RoPE base for the
    /// local layers, usually no soft-capping.
    Gemma3,
    /// Phi-3 / Phi-3.5 / Phi-4: the Llama layer with q/k/v fused into
    /// `qkv_proj` and gate/up into `gate_up_proj`, partial rotary
    /// ([`ModelConfig::rotary_dim`]), LongRoPE scaling, a sliding window on
    /// every layer where the config sets one.
    Phi3,
    /// Qwen3-MoE: Qwen3's attention; sparse layers route each token to
    /// `top_k` of `num_experts` SwiGLU experts ([`MoeConfig`]), the others
    /// (`mlp_only_layers`, `decoder_sparse_step`) keep a dense MLP.
    #[serde(rename = "qwen3_moe")]
    Qwen3Moe,
    /// Mixtral: Llama's attention, every layer's MLP a mixture of experts
    /// with renormalized top-k weights.
    Mixtral,
    /// Qwen2-MoE (Qwen1.5-MoE): Qwen2's attention (q/k/v biases); sparse
    /// layers add a shared expert, a dense SwiGLU MLP gated per token by
    /// `sigmoid(x . shared_expert_gate)`, to the routed experts.
    #[serde(rename = "qwen2_moe")]
    Qwen2Moe,
}

impl Architecture {
    /// Maps a Hugging Face `architectures[0]` / `model_type` or a GGUF
    /// `general.architecture` to an [`Architecture`].
    pub fn from_name(name: &str) -> Option<Self> {
        let n = name.to_ascii_lowercase();
        let n = n.trim_end_matches("forcausallm");
        match n {
            "llama" | "mistral" | "smollm" | "smollm2" => Some(Architecture::Llama),
            "qwen2" => Some(Architecture::Qwen2),
            "qwen3" => Some(Architecture::Qwen3),
            "opt" => Some(Architecture::Opt),
            "gemma2" => Some(Architecture::Gemma2),
            "gemma3" | "gemma3_text" => Some(Architecture::Gemma3),
            "phi3" => Some(Architecture::Phi3),
            "qwen3_moe" | "qwen3moe" => Some(Architecture::Qwen3Moe),
            "mixtral" => Some(Architecture::Mixtral),
            "qwen2_moe" | "qwen2moe" => Some(Architecture::Qwen2Moe),
            _ => None,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Opt => "opt",
            Architecture::Gemma2 => "gemma2",
            Architecture::Gemma3 => "gemma3",
            Architecture::Phi3 => "phi3",
            Architecture::Qwen3Moe => "qwen3_moe",
            Architecture::Mixtral => "mixtral",
            Architecture::Qwen2Moe => "qwen2_moe",
        }
    }

    /// Whether the architecture's model file applies
    /// [`ModelConfig::sliding_window`] itself (so any context length is exact).
    /// The Llama file applies it on every layer: a Llama-architecture window
    /// comes only from Mistral configs (every layer slides) or a GGUF
    /// `llama.attention.sliding_window` key; Phi-3's too. Qwen2/Qwen3 windows
    /// cover only the layers from `max_window_layers` on and stay refused past
    /// the window.
    pub fn implements_sliding_window(&self) -> bool {
        matches!(
            self,
            Architecture::Llama | Architecture::Phi3 | Architecture::Gemma2 | Architecture::Gemma3
        )
    }

    /// Whether the architecture's MLPs are mixtures of experts (its
    /// config carries a [`MoeConfig`]).
    pub fn is_moe(&self) -> bool {
        matches!(
            self,
            Architecture::Qwen3Moe | Architecture::Mixtral | Architecture::Qwen2Moe
        )
    }
}

/// What a mixture-of-experts architecture adds (Hugging Face's names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeConfig {
    /// Experts per sparse layer (`num_experts`, Mixtral's `num_local_experts`).
    pub num_experts: usize,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub num_experts_per_tok: usize,
    /// Width of one expert's MLP (`moe_intermediate_size`; Mixtral's
    /// `intermediate_size`).
    pub moe_intermediate_size: usize,
    /// Whether the chosen experts' weights are divided by their sum
    /// (`norm_topk_prob`; always for Mixtral).
    pub norm_topk_prob: bool,
    /// Per layer: `true` for a sparse (mixture-of-experts) layer, `false` for
    /// a dense MLP of [`ModelConfig::intermediate_size`].
    pub sparse_layers: Vec<bool>,
    /// Width of the shared expert every sparse layer adds (Qwen2-MoE's
    /// `shared_expert_intermediate_size`); `None` where there is none.
    #[serde(default)]
    pub shared_expert_intermediate_size: Option<usize>,
}

/// What Gemma 2 and Gemma 3 add to the common fields (Hugging Face's names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GemmaConfig {
    /// Per layer: `true` for a local layer (attention over the last
    /// [`ModelConfig::sliding_window`] positions), `false` for a global one
    /// (`layer_types`, or the `sliding_window_pattern` default).
    pub sliding_layers: Vec<bool>,
    /// RoPE base of the local layers (Gemma 3's `rope_local_base_freq`;
    /// `rope_theta` for Gemma 2). Local layers never scale their frequencies;
    /// global layers use `rope_theta` and `rope_scaling`.
    pub rope_local_base_freq: f64,
    /// Attention scores are scaled by `query_pre_attn_scalar ** -0.5`.
    pub query_pre_attn_scalar: f64,
    /// Attention scores `s` become `cap * tanh(s / cap)` (Gemma 2: 50).
    pub attn_logit_softcapping: Option<f64>,
    /// Logits `l` become `cap * tanh(l / cap)` (Gemma 2: 30).
    pub final_logit_softcapping: Option<f64>,
}

/// Rotary-embedding frequency scaling (Hugging Face `rope_scaling`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RopeScaling {
    /// Llama 3.x: frequencies between the two wavelengths are interpolated.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
    /// Positions divided by `factor`.
    Linear { factor: f64 },
    /// Phi-3's LongRoPE (`longrope`, formerly `su`): frequency `i` divided by
    /// `short_factor[i]` or `long_factor[i]`, cos and sin multiplied by
    /// `attention_factor`. transformers picks the factors per forward pass
    /// (long once a sequence passes `original_max_position_embeddings`, which
    /// leaves the cached keys of the shorter prefix rotated with the short
    /// ones); pagoda picks them once per model, as vLLM and llama.cpp do:
    /// long when the served context (`max_model_len`, capped at
    /// `max_position_embeddings`) is longer than
    /// `original_max_position_embeddings`, short otherwise (see
    /// [`crate::arch::rope::cos_sin_table`]).
    LongRope {
        short_factor: Vec<f64>,
        long_factor: Vec<f64>,
        original_max_position_embeddings: usize,
        /// transformers' `attention_factor`: the config's, or
        /// `sqrt(1 + ln(s) / ln(original))` with `s = factor` or
        /// `max_position_embeddings / original` (1 where `s <= 1`).
        attention_factor: f64,
    },
}

/// Everything a model file needs to build itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    /// MLP width (`ffn_dim` for OPT).
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Explicit head dimension (Qwen3); `None` means `hidden_size / num_attention_heads`.
    pub head_dim: Option<usize>,
    /// Rotated dimensions of each head (the first ones), where fewer than
    /// `head_dim`: `int(head_dim * partial_rotary_factor)` (Phi-4-mini), a
    /// GGUF's `rope.dimension_count`. `None` rotates the whole head.
    #[serde(default)]
    pub rotary_dim: Option<usize>,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon (LayerNorm epsilon for OPT).
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub tie_word_embeddings: bool,
    /// Biases on q/k/v, and on o_proj except for Qwen2 (Qwen2 always sets
    /// this; OPT has biases everywhere regardless).
    pub attention_bias: bool,
    pub bos_token_id: Option<u32>,
    /// End-of-sequence ids (generation_config.json may list several).
    pub eos_token_ids: Vec<u32>,
    /// OPT: projection width of the embeddings when it differs from hidden_size.
    pub word_embed_proj_dim: Option<usize>,
    /// OPT: pre-norm (true for all OPT sizes except 350m).
    pub do_layer_norm_before: bool,
    /// Storage dtype named by the checkpoint ("bfloat16", "float16", "float32", or a GGUF quant mix).
    pub torch_dtype: Option<String>,
    /// The sliding-window attention span the checkpoint uses (tokens a query
    /// sees, itself included), `None` where attention is full. Architectures
    /// that do not apply it ([`Architecture::implements_sliding_window`]) run
    /// full attention, which equals the window's only for contexts of at most
    /// this many tokens: see [`ModelConfig::check_context_len`]. Gemma 2/3
    /// apply the window on their local layers, Llama (Mistral) on every layer.
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Gemma 2/3 only (`None` for the other architectures).
    #[serde(default)]
    pub gemma: Option<GemmaConfig>,
    /// Mixture-of-experts architectures only ([`Architecture::is_moe`]).
    #[serde(default)]
    pub moe: Option<MoeConfig>,
}

impl ModelConfig {
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Rotated dimensions per head ([`ModelConfig::rotary_dim`], else `head_dim`).
    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim.unwrap_or_else(|| self.head_dim())
    }

    /// Width of the q projection output.
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim()
    }

    /// Width of the k (and v) projection output.
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim()
    }

    /// The sliding window when every attention layer applies the same one
    /// (Mistral, Phi-3 with a window; Gemma with only local layers): then no
    /// key before a query's window is ever read, so the KV cache may drop it.
    /// `None` for full attention, mixed local/global layers, or an
    /// architecture that does not apply its window.
    pub fn uniform_sliding_window(&self) -> Option<usize> {
        let window = self.sliding_window?;
        match self.architecture {
            Architecture::Llama | Architecture::Phi3 => Some(window),
            Architecture::Gemma2 | Architecture::Gemma3 => self
                .gemma
                .as_ref()
                .filter(|g| g.sliding_layers.iter().all(|&s| s))
                .map(|_| window),
            _ => None,
        }
    }

    /// The window each attention layer applies (`None`: full attention):
    /// every layer's [`Self::uniform_sliding_window`], or per layer for
    /// Gemma's mix of local and global layers. What the KV cache groups are
    /// cut from ([`crate::KvLayout`]).
    pub fn layer_windows(&self) -> Vec<Option<usize>> {
        let n = self.num_hidden_layers;
        if let Some(w) = self.uniform_sliding_window() {
            return vec![Some(w); n];
        }
        match (self.architecture, &self.gemma, self.sliding_window) {
            (Architecture::Gemma2 | Architecture::Gemma3, Some(g), Some(w))
                if g.sliding_layers.len() == n =>
            {
                g.sliding_layers.iter().map(|&s| s.then_some(w)).collect()
            }
            _ => vec![None; n],
        }
    }

    /// Checks the relations model files rely on; loaders call it before returning.
    pub fn validate(&self) -> Result<(), String> {
        let nonzero = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (name, v) in nonzero {
            if v == 0 {
                return Err(format!("{name} must be positive"));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.head_dim.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err("hidden_size must be a multiple of num_attention_heads".into());
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err("head_dim must be even".into());
        }
        let rd = self.rotary_dim();
        if rd == 0 || !rd.is_multiple_of(2) || rd > self.head_dim() {
            return Err(format!(
                "rotary dimension {rd} must be even, positive and at most head_dim {}",
                self.head_dim()
            ));
        }
        if let Some(RopeScaling::LongRope {
            short_factor,
            long_factor,
            original_max_position_embeddings,
            attention_factor,
        }) = &self.rope_scaling
        {
            for (name, f) in [("short_factor", short_factor), ("long_factor", long_factor)] {
                if f.len() != rd / 2 {
                    return Err(format!(
                        "rope {name} has {} entries for a rotary dimension of {rd} (needs {})",
                        f.len(),
                        rd / 2
                    ));
                }
                if f.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
                    return Err(format!("rope {name} entries must be positive"));
                }
            }
            if *original_max_position_embeddings == 0 {
                return Err("original_max_position_embeddings must be positive".into());
            }
            if !(attention_factor.is_finite() && *attention_factor > 0.0) {
                return Err("rope attention_factor must be positive".into());
            }
        }
        let gemma_arch = matches!(
            self.architecture,
            Architecture::Gemma2 | Architecture::Gemma3
        );
        match &self.gemma {
            Some(g) if gemma_arch => {
                if g.sliding_layers.len() != self.num_hidden_layers {
                    return Err(format!(
                        "layer_types has {} entries for {} layers",
                        g.sliding_layers.len(),
                        self.num_hidden_layers
                    ));
                }
                if g.sliding_layers.iter().any(|&s| s) && self.sliding_window.is_none() {
                    return Err("local layers without a sliding_window".into());
                }
                if !(g.query_pre_attn_scalar.is_finite() && g.query_pre_attn_scalar > 0.0) {
                    return Err("query_pre_attn_scalar must be positive".into());
                }
                for (name, cap) in [
                    ("attn_logit_softcapping", g.attn_logit_softcapping),
                    ("final_logit_softcapping", g.final_logit_softcapping),
                ] {
                    if cap.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
                        return Err(format!("{name} must be positive"));
                    }
                }
            }
            None if gemma_arch => {
                return Err(format!(
                    "{} needs its Gemma fields (layer types, query scale)",
                    self.architecture.as_str()
                ))
            }
            Some(_) => return Err("Gemma fields on a non-Gemma architecture".into()),
            None => {}
        }
        match &self.moe {
            Some(m) if self.architecture.is_moe() => {
                if m.num_experts == 0 || m.moe_intermediate_size == 0 {
                    return Err("num_experts and moe_intermediate_size must be positive".into());
                }
                if m.num_experts_per_tok == 0 || m.num_experts_per_tok > m.num_experts {
                    return Err(format!(
                        "num_experts_per_tok ({}) must be in 1..={} (num_experts)",
                        m.num_experts_per_tok, m.num_experts
                    ));
                }
                if m.shared_expert_intermediate_size == Some(0) {
                    return Err("shared_expert_intermediate_size must be positive".into());
                }
                if m.sparse_layers.len() != self.num_hidden_layers {
                    return Err(format!(
                        "{} sparse-layer flags for {} layers",
                        m.sparse_layers.len(),
                        self.num_hidden_layers
                    ));
                }
            }
            None if self.architecture.is_moe() => {
                return Err(format!(
                    "{} needs its mixture-of-experts fields",
                    self.architecture.as_str()
                ))
            }
            Some(_) => return Err("mixture-of-experts fields on a dense architecture".into()),
            None => {}
        }
        Ok(())
    }

    /// Checks that serving contexts of up to `max_model_len` tokens computes
    /// what the checkpoint means: with a sliding window in use, full attention
    /// is exact only while no context is longer than the window (sliding
    /// windows are implemented only by the architectures that say so in
    /// [`Architecture::implements_sliding_window`]). The error names the window.
    pub fn check_context_len(&self, max_model_len: usize) -> Result<(), String> {
        if self.architecture.implements_sliding_window() {
            return Ok(());
        }
        match self.sliding_window {
            Some(window) if max_model_len > window => Err(format!(
                "the model uses sliding-window attention (window {window} tokens), which is \
                 not implemented; a context length of {max_model_len} would be served with \
                 full attention and give wrong outputs past {window} tokens; a context length \
                 of at most {window} is exact"
            )),
            _ => Ok(()),
        }
    }
}
