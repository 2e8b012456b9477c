//! OPT (Meta's Open Pre-trained Transformer), as Hugging Face's modeling_opt.py:
//! learned absolute positions stored with an offset of 2, LayerNorm, ReLU MLP,
//! biases on every linear layer, pre-norm (post-norm when
//! `do_layer_norm_before` is false, as in opt-350m), LM head tied to the
//! token embeddings.

use super::weights::load;
use super::{BuildOptions, CausalLm};
use crate::loader::WeightSource;
use crate::{ModelConfig, ModelError, Result};
use pagoda_kernels::{AttentionParams, Backend};

/// Row of the position table holding position 0.
const POSITION_OFFSET: usize = 2;

struct Linear<B: Backend> {
    weight: B::Weight,
    bias: B::Weight,
}

struct LayerNorm<B: Backend> {
    weight: B::Weight,
    bias: B::Weight,
}

struct DecoderLayer<B: Backend> {
    q_proj: Linear<B>,
    k_proj: Linear<B>,
    v_proj: Linear<B>,
    out_proj: Linear<B>,
    self_attn_layer_norm: LayerNorm<B>,
    fc1: Linear<B>,
    fc2: Linear<B>,
    final_layer_norm: LayerNorm<B>,
}

/// An OPT model on backend `B`.
pub struct Opt<B: Backend> {
    cfg: ModelConfig,
    embed_tokens: B::Weight,
    embed_positions: B::Weight,
    layers: Vec<DecoderLayer<B>>,
    /// Present for pre-norm models.
    final_layer_norm: Option<LayerNorm<B>>,
    attn: AttentionParams,
    eps: f32,
}

fn linear<B: Backend>(
    b: &B,
    src: &dyn WeightSource,
    prefix: &str,
    out: usize,
    inp: usize,
) -> Result<Linear<B>> {
    Ok(Linear {
        weight: super::weights::load_linear(b, src, &format!("{prefix}.weight"), &[out, inp])?,
        bias: load(b, src, &format!("{prefix}.bias"), &[out])?,
    })
}

fn layer_norm<B: Backend>(
    b: &B,
    src: &dyn WeightSource,
    prefix: &str,
    n: usize,
) -> Result<LayerNorm<B>> {
    Ok(LayerNorm {
        weight: load(b, src, &format!("{prefix}.weight"), &[n])?,
        bias: load(b, src, &format!("{prefix}.bias"), &[n])?,
    })
}

pub fn build<B: Backend>(
    b: &B,
    cfg: &ModelConfig,
    src: &dyn WeightSource,
    _opts: BuildOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Opt<B>> {
    let h = cfg.hidden_size;
    if cfg.word_embed_proj_dim.is_some_and(|d| d != h) {
        return Err(ModelError::Config(
            "OPT with word_embed_proj_dim != hidden_size (opt-350m's projections) is not supported"
                .into(),
        ));
    }
    let total = cfg.num_hidden_layers + 2;
    let p = "model.decoder";
    let embed_tokens = load(
        b,
        src,
        &format!("{p}.embed_tokens.weight"),
        &[cfg.vocab_size, h],
    )?;
    let embed_positions = load(
        b,
        src,
        &format!("{p}.embed_positions.weight"),
        &[cfg.max_position_embeddings + POSITION_OFFSET, h],
    )?;
    progress(1, total);
    let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
    for i in 0..cfg.num_hidden_layers {
        let l = format!("{p}.layers.{i}");
        let ffn = cfg.intermediate_size;
        layers.push(DecoderLayer {
            q_proj: linear(b, src, &format!("{l}.self_attn.q_proj"), h, h)?,
            k_proj: linear(b, src, &format!("{l}.self_attn.k_proj"), h, h)?,
            v_proj: linear(b, src, &format!("{l}.self_attn.v_proj"), h, h)?,
            out_proj: linear(b, src, &format!("{l}.self_attn.out_proj"), h, h)?,
            self_attn_layer_norm: layer_norm(b, src, &format!("{l}.self_attn_layer_norm"), h)?,
            fc1: linear(b, src, &format!("{l}.fc1"), ffn, h)?,
            fc2: linear(b, src, &format!("{l}.fc2"), h, ffn)?,
            final_layer_norm: layer_norm(b, src, &format!("{l}.final_layer_norm"), h)?,
        });
        progress(i + 2, total);
    }
    let final_layer_norm = if cfg.do_layer_norm_before {
        Some(layer_norm(b, src, &format!("{p}.final_layer_norm"), h)?)
    } else {
        None
    };
    progress(total, total);
    let hd = cfg.head_dim();
    Ok(Opt {
        cfg: cfg.clone(),
        embed_tokens,
        embed_positions,
        layers,
        final_layer_norm,
        attn: AttentionParams {
            num_heads: cfg.num_attention_heads,
            num_kv_heads: cfg.num_attention_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            window: None,
            softcap: None,
            kv_group: 0,
        },
        eps: cfg.rms_norm_eps as f32,
    })
}

impl<B: Backend> Opt<B> {
    fn apply(&self, b: &B, lin: &Linear<B>, x: &B::Tensor) -> Result<B::Tensor> {
        Ok(b.linear(x, &lin.weight, Some(&lin.bias))?)
    }

    fn norm(&self, b: &B, ln: &LayerNorm<B>, x: &B::Tensor) -> Result<B::Tensor> {
        Ok(b.layer_norm(x, &ln.weight, &ln.bias, self.eps)?)
    }
}

impl<B: Backend> CausalLm<B> for Opt<B> {
    fn forward(&self, b: &B, step: &B::Step, kv: &mut [B::KvCache]) -> Result<B::Tensor> {
        let pre_norm = self.cfg.do_layer_norm_before;
        // 1. Token embeddings plus learned positions (table row = position + 2).
        let mut x = b.embedding(step, &self.embed_tokens)?;
        b.add_position_embedding(&mut x, step, &self.embed_positions, POSITION_OFFSET)?;
        for (layer, cache) in self.layers.iter().zip(kv.iter_mut()) {
            // 2. Self-attention block (LayerNorm before it, or after the residual add).
            let normed = match pre_norm {
                true => Some(self.norm(b, &layer.self_attn_layer_norm, &x)?),
                false => None,
            };
            let h = normed.as_ref().unwrap_or(&x);
            let q = self.apply(b, &layer.q_proj, h)?;
            let k = self.apply(b, &layer.k_proj, h)?;
            let v = self.apply(b, &layer.v_proj, h)?;
            b.store_kv(&k, &v, cache, step)?;
            let o = b.attention(&q, cache, step, &self.attn)?;
            b.add_linear(
                &mut x,
                &o,
                &layer.out_proj.weight,
                Some(&layer.out_proj.bias),
            )?;
            if !pre_norm {
                x = self.norm(b, &layer.self_attn_layer_norm, &x)?;
            }
            // 3. ReLU MLP block, same norm placement.
            let normed = match pre_norm {
                true => Some(self.norm(b, &layer.final_layer_norm, &x)?),
                false => None,
            };
            let mut f = self.apply(b, &layer.fc1, normed.as_ref().unwrap_or(&x))?;
            b.relu(&mut f)?;
            b.add_linear(&mut x, &f, &layer.fc2.weight, Some(&layer.fc2.bias))?;
            if !pre_norm {
                x = self.norm(b, &layer.final_layer_norm, &x)?;
            }
        }
        // 4. Final norm on the rows that need logits, then the tied LM head.
        let mut last = b.gather_logits_rows(&x, step)?;
        if let Some(ln) = &self.final_layer_norm {
            last = self.norm(b, ln, &last)?;
        }
        Ok(b.linear(&last, &self.embed_tokens, None)?)
    }

    fn config(&self) -> &ModelConfig {
        &self.cfg
    }
}
