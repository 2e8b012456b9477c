//! Gemma 3 (and Gemma 2, the same layer without q/k norms, with soft-capping).
//!
//! Read top-down like Hugging Face's modeling_gemma3.py:
//! embed * sqrt(hidden) -> N x (RMSNorm -> attention -> RMSNorm -> residual ->
//! RMSNorm -> gelu-tanh gated MLP -> RMSNorm -> residual) -> RMSNorm -> tied
//! LM head (-> final logit soft-capping, Gemma 2).
//!
//! What sets Gemma apart, all driven by [`crate::GemmaConfig`]:
//! - every RMSNorm scales by `1 + w` (Hugging Face's `w`, which every weight
//!   source answers with; the GGUF source undoes llama.cpp's stored `1 + w`);
//!   `1 + w` is formed in f32 at load time, as transformers does per call;
//! - local layers attend over the last `sliding_window` positions with RoPE
//!   base `rope_local_base_freq` (no frequency scaling); global layers attend
//!   over everything with `rope_theta` and `rope_scaling`;
//! - scores are scaled by `query_pre_attn_scalar ** -0.5`, then soft-capped
//!   where `attn_logit_softcapping` is set;
//! - the embedding scale `sqrt(hidden)` is rounded to the checkpoint's dtype
//!   (bf16/f16) as transformers multiplies in the embedding's dtype.
//!
//! Multimodal Gemma 3 checkpoints keep the language model under
//! `model.language_model.` (transformers 5) or `language_model.model.`; the
//! prefix is found from the embedding's name.

use super::weights::{load, load_linear, read, read_linear};
use super::{rope, BuildOptions, CausalLm};
use crate::loader::WeightSource;
use crate::{Architecture, GemmaConfig, KvLayout, ModelConfig, ModelError, Result};
use pagoda_kernels::{AttentionParams, Backend, HostTensor, RopeStyle};

struct Layer<B: Backend> {
    input_layernorm: B::Weight,
    q_proj: B::Weight,
    k_proj: B::Weight,
    v_proj: B::Weight,
    o_proj: B::Weight,
    /// Gemma 3 only.
    q_norm: Option<B::Weight>,
    k_norm: Option<B::Weight>,
    post_attention_layernorm: B::Weight,
    pre_feedforward_layernorm: B::Weight,
    /// gate_proj over up_proj.
    gate_up_proj: B::Weight,
    down_proj: B::Weight,
    post_feedforward_layernorm: B::Weight,
    /// Local (sliding-window) layer.
    sliding: bool,
}

/// A Gemma 2 or Gemma 3 model on backend `B`.
pub struct Gemma<B: Backend> {
    cfg: ModelConfig,
    embed_tokens: B::Weight,
    embed_scale: f32,
    layers: Vec<Layer<B>>,
    norm: B::Weight,
    /// `None` when tied to `embed_tokens`.
    lm_head: Option<B::Weight>,
    /// RoPE tables of the global and the local layers.
    cos_sin_global: B::Weight,
    cos_sin_local: B::Weight,
    /// Attention of the global and the local layers.
    attn_global: AttentionParams,
    attn_local: AttentionParams,
    final_softcap: Option<f32>,
    eps: f32,
    /// KV cache groups: local and global layers apart, so local layers
    /// keep one window of pages (see [`KvLayout`]).
    kv_layout: KvLayout,
}

/// The prefix of the language model's tensors.
fn prefix(src: &dyn WeightSource) -> &'static str {
    ["model.", "model.language_model.", "language_model.model."]
        .into_iter()
        .find(|p| src.contains(&format!("{p}embed_tokens.weight")))
        .unwrap_or("model.")
}

/// Reads a norm weight `w` and uploads `1 + w` (in f32).
fn load_norm<B: Backend>(b: &B, src: &dyn WeightSource, name: &str, n: usize) -> Result<B::Weight> {
    let mut w = read(src, name, &[n])?.into_f32_vec();
    w.iter_mut().for_each(|x| *x += 1.0);
    Ok(b.load_weight(HostTensor::f32(vec![n], w))?)
}

/// `sqrt(hidden)` rounded to the checkpoint's dtype, as transformers'
/// `embed_scale.to(weight.dtype)`.
fn embed_scale(cfg: &ModelConfig) -> f32 {
    let s = (cfg.hidden_size as f64).sqrt() as f32;
    match cfg.torch_dtype.as_deref() {
        Some("bfloat16") => half::bf16::from_f32(s).to_f32(),
        Some("float16") => half::f16::from_f32(s).to_f32(),
        _ => s,
    }
}

/// Builds a Gemma 2 or Gemma 3 model.
pub fn build<B: Backend>(
    b: &B,
    cfg: &ModelConfig,
    src: &dyn WeightSource,
    opts: BuildOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Gemma<B>> {
    let g: &GemmaConfig = cfg.gemma.as_ref().ok_or_else(|| {
        ModelError::Config(format!(
            "{} config without its Gemma fields",
            cfg.architecture.as_str()
        ))
    })?;
    let (h, hd, v) = (cfg.hidden_size, cfg.head_dim(), cfg.vocab_size);
    let (q_dim, kv_dim, inter) = (cfg.q_dim(), cfg.kv_dim(), cfg.intermediate_size);
    let qk_norm = cfg.architecture == Architecture::Gemma3;
    let total = cfg.num_hidden_layers + 2;
    let pre = prefix(src);
    let embed_tokens = load(b, src, &format!("{pre}embed_tokens.weight"), &[v, h])?;
    progress(1, total);

    let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
    for (i, &sliding) in g.sliding_layers.iter().enumerate() {
        let p = format!("{pre}layers.{i}");
        let w =
            |name: &str, shape: &[usize]| load_linear(b, src, &format!("{p}.{name}.weight"), shape);
        let norm = |name: &str, n: usize| load_norm(b, src, &format!("{p}.{name}.weight"), n);
        let gate = read_linear(src, &format!("{p}.mlp.gate_proj.weight"), &[inter, h])?;
        let up = read_linear(src, &format!("{p}.mlp.up_proj.weight"), &[inter, h])?;
        layers.push(Layer {
            input_layernorm: norm("input_layernorm", h)?,
            q_proj: w("self_attn.q_proj", &[q_dim, h])?,
            k_proj: w("self_attn.k_proj", &[kv_dim, h])?,
            v_proj: w("self_attn.v_proj", &[kv_dim, h])?,
            o_proj: w("self_attn.o_proj", &[h, q_dim])?,
            q_norm: qk_norm.then(|| norm("self_attn.q_norm", hd)).transpose()?,
            k_norm: qk_norm.then(|| norm("self_attn.k_norm", hd)).transpose()?,
            post_attention_layernorm: norm("post_attention_layernorm", h)?,
            pre_feedforward_layernorm: norm("pre_feedforward_layernorm", h)?,
            gate_up_proj: gate
                .concat_rows(up, &format!("{p}.mlp.gate_proj/up_proj"))?
                .upload(b)?,
            down_proj: w("mlp.down_proj", &[h, inter])?,
            post_feedforward_layernorm: norm("post_feedforward_layernorm", h)?,
            sliding,
        });
        progress(i + 2, total);
    }

    let norm = load_norm(b, src, &format!("{pre}norm.weight"), h)?;
    let lm_head = if cfg.tie_word_embeddings {
        None
    } else {
        super::weights::load_opt(b, src, "lm_head.weight", &[v, h])?
    };
    let max_pos = opts.max_model_len.min(cfg.max_position_embeddings).max(1);
    let cos_sin_global = b.load_table(rope::cos_sin_table(cfg, hd, max_pos))?;
    let local_cfg = ModelConfig {
        rope_theta: g.rope_local_base_freq,
        rope_scaling: None,
        ..cfg.clone()
    };
    let cos_sin_local = b.load_table(rope::cos_sin_table(&local_cfg, hd, max_pos))?;
    let attn_global = AttentionParams {
        scale: g.query_pre_attn_scalar.powf(-0.5) as f32,
        softcap: g.attn_logit_softcapping.map(|c| c as f32),
        ..AttentionParams::causal(cfg.num_attention_heads, cfg.num_key_value_heads, hd)
    };
    let attn_local = AttentionParams {
        window: cfg.sliding_window,
        ..attn_global
    };
    if g.sliding_layers.iter().any(|&s| s) && cfg.sliding_window.is_none() {
        return Err(ModelError::Config(
            "local layers without a sliding window".into(),
        ));
    }
    progress(total, total);
    Ok(Gemma {
        cfg: cfg.clone(),
        embed_tokens,
        embed_scale: embed_scale(cfg),
        layers,
        norm,
        lm_head,
        cos_sin_global,
        cos_sin_local,
        attn_global,
        attn_local,
        final_softcap: g.final_logit_softcapping.map(|c| c as f32),
        eps: cfg.rms_norm_eps as f32,
        kv_layout: KvLayout::for_config(cfg, true),
    })
}

impl<B: Backend> Gemma<B> {
    /// Self-attention up to and including o_proj.
    fn attention(
        &self,
        b: &B,
        l: &Layer<B>,
        x: &B::Tensor,
        step: &B::Step,
        kv: &mut B::KvCache,
        kv_group: usize,
    ) -> Result<B::Tensor> {
        let (base, cos_sin) = if l.sliding {
            (&self.attn_local, &self.cos_sin_local)
        } else {
            (&self.attn_global, &self.cos_sin_global)
        };
        let params = &AttentionParams { kv_group, ..*base };
        let hd = params.head_dim;
        let mut q = b.linear(x, &l.q_proj, None)?;
        let mut k = b.linear(x, &l.k_proj, None)?;
        let v = b.linear(x, &l.v_proj, None)?;
        if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
            b.head_rms_norm(&mut q, qn, hd, self.eps)?;
            b.head_rms_norm(&mut k, kn, hd, self.eps)?;
        }
        b.rope(&mut q, step, cos_sin, hd, RopeStyle::Neox)?;
        b.rope(&mut k, step, cos_sin, hd, RopeStyle::Neox)?;
        b.store_kv_in_group(&k, &v, kv, step, kv_group)?;
        let a = b.attention(&q, kv, step, params)?;
        Ok(b.linear(&a, &l.o_proj, None)?)
    }
}

impl<B: Backend> CausalLm<B> for Gemma<B> {
    fn forward(&self, b: &B, step: &B::Step, kv: &mut [B::KvCache]) -> Result<B::Tensor> {
        // `x` is the residual stream; each block's output is normalized
        // before it is added in.
        let mut x = b.embedding(step, &self.embed_tokens)?;
        b.scale(&mut x, self.embed_scale)?;
        let layout = &self.kv_layout;
        if kv.len() != layout.num_slots {
            return Err(ModelError::Config(format!(
                "{} KV caches for a layout of {} slots",
                kv.len(),
                layout.num_slots
            )));
        }
        for (i, l) in self.layers.iter().enumerate() {
            let h = b.rms_norm(&x, &l.input_layernorm, self.eps)?;
            let cache = &mut kv[layout.slot[i]];
            let a = self.attention(b, l, &h, step, cache, layout.group[i])?;
            b.add(
                &mut x,
                &b.rms_norm(&a, &l.post_attention_layernorm, self.eps)?,
            )?;
            let h = b.rms_norm(&x, &l.pre_feedforward_layernorm, self.eps)?;
            let gate_up = b.linear(&h, &l.gate_up_proj, None)?;
            let m = b.linear(&b.gelu_tanh_mul(&gate_up)?, &l.down_proj, None)?;
            b.add(
                &mut x,
                &b.rms_norm(&m, &l.post_feedforward_layernorm, self.eps)?,
            )?;
        }
        let h = b.rms_norm(&x, &self.norm, self.eps)?;
        let last = b.gather_logits_rows(&h, step)?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        let mut logits = b.linear(&last, head, None)?;
        if let Some(cap) = self.final_softcap {
            b.softcap(&mut logits, cap)?;
        }
        Ok(logits)
    }

    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn kv_layout(&self) -> KvLayout {
        self.kv_layout.clone()
    }
}
