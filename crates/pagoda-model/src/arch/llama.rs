//! The Llama family: Llama 2/3, SmolLM2, Mistral (with its sliding window on
//! every layer), and the shared body of Qwen2 (q/k/v biases), Qwen3
//! (per-head q/k RMSNorm), Phi-3 (fused weights), Qwen3-MoE and Mixtral
//! (mixture-of-experts MLPs, [`super::moe`]). With `attention_bias`, Llama
//! and Qwen3 add biases to q/k/v and o_proj.
//!
//! Read top-down like Hugging Face's modeling_llama.py:
//! embed -> N x (RMSNorm -> attention -> residual -> RMSNorm -> SwiGLU MLP
//! or experts -> residual) -> RMSNorm -> LM head. The architecture-specific
//! switches are fields of [`Variant`], chosen by the architecture's own file,
//! never by flags inside this one (the dense or sparse feed-forward block of
//! each layer follows the config's [`crate::MoeConfig`]).

use super::moe::FeedForward;
use super::weights::{load, load_linear, load_opt, read_linear};
use super::{rope, BuildOptions, CausalLm};
use crate::loader::WeightSource;
use crate::{ModelConfig, Result};
use pagoda_kernels::{AttentionParams, Backend, RopeStyle};

/// What distinguishes the members of the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// q/k/v projections carry biases (Qwen2; Llama and Qwen3 with
    /// `attention_bias`).
    pub qkv_bias: bool,
    /// o_proj carries a bias (Llama and Qwen3 with `attention_bias`; never
    /// Qwen2).
    pub o_bias: bool,
    /// RMSNorm over each head of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Sliding-window attention on every layer (Mistral v0.1's
    /// `sliding_window`); Qwen2/Qwen3 leave it `None` (their windows cover
    /// only some layers, and building refuses contexts past them).
    pub window: Option<usize>,
    /// Phi-3's fused weights: `self_attn.qkv_proj` (q, k, v rows) and
    /// `mlp.gate_up_proj` (gate, up rows) instead of the five projections.
    pub fused: bool,
}

/// Self-attention of one layer.
struct Attention<B: Backend> {
    q_proj: B::Weight,
    k_proj: B::Weight,
    v_proj: B::Weight,
    o_proj: B::Weight,
    q_bias: Option<B::Weight>,
    k_bias: Option<B::Weight>,
    v_bias: Option<B::Weight>,
    o_bias: Option<B::Weight>,
    q_norm: Option<B::Weight>,
    k_norm: Option<B::Weight>,
}

struct DecoderLayer<B: Backend> {
    input_layernorm: B::Weight,
    self_attn: Attention<B>,
    post_attention_layernorm: B::Weight,
    mlp: FeedForward<B>,
}

/// A Llama-family model on backend `B`.
pub struct LlamaFamily<B: Backend> {
    cfg: ModelConfig,
    embed_tokens: B::Weight,
    layers: Vec<DecoderLayer<B>>,
    norm: B::Weight,
    /// `None` when tied to `embed_tokens`.
    lm_head: Option<B::Weight>,
    cos_sin: B::Weight,
    attn: AttentionParams,
    eps: f32,
}

/// Builds a plain Llama model.
pub fn build<B: Backend>(
    b: &B,
    cfg: &ModelConfig,
    src: &dyn WeightSource,
    opts: BuildOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<LlamaFamily<B>> {
    LlamaFamily::new(
        b,
        cfg,
        src,
        Variant {
            qkv_bias: cfg.attention_bias,
            o_bias: cfg.attention_bias,
            qk_norm: false,
            window: cfg.sliding_window,
            fused: false,
        },
        opts,
        progress,
    )
}

impl<B: Backend> LlamaFamily<B> {
    /// Loads every weight of the model, checking shapes against `cfg`.
    pub fn new(
        b: &B,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
        variant: Variant,
        opts: BuildOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let (h, hd, v) = (cfg.hidden_size, cfg.head_dim(), cfg.vocab_size);
        let (q_dim, kv_dim) = (cfg.q_dim(), cfg.kv_dim());
        let total = cfg.num_hidden_layers + 2;
        let embed_tokens = load(b, src, "model.embed_tokens.weight", &[v, h])?;
        progress(1, total);

        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            // A bias the variant does not require is still loaded where the
            // source has it (GGUF files do not say whether they carry biases).
            let bias = |name: &str, n: usize, required: bool| -> Result<Option<B::Weight>> {
                if required {
                    load(b, src, &format!("{p}.self_attn.{name}.bias"), &[n]).map(Some)
                } else {
                    load_opt(b, src, &format!("{p}.self_attn.{name}.bias"), &[n])
                }
            };
            let head_norm = |name: &str| -> Result<Option<B::Weight>> {
                if variant.qk_norm {
                    load(b, src, &format!("{p}.self_attn.{name}.weight"), &[hd]).map(Some)
                } else {
                    Ok(None)
                }
            };
            let (q_proj, k_proj, v_proj) = if variant.fused {
                let name = format!("{p}.self_attn.qkv_proj.weight");
                let qkv = read_linear(src, &name, &[q_dim + 2 * kv_dim, h])?;
                let parts = qkv.split_rows(&[q_dim, kv_dim, kv_dim]);
                let Some([q, k, v]) = parts.and_then(|p| <[_; 3]>::try_from(p).ok()) else {
                    return Err(crate::ModelError::Config(format!(
                        "{name}: cannot split into q, k and v rows"
                    )));
                };
                (q.upload(b)?, k.upload(b)?, v.upload(b)?)
            } else {
                let w = |name: &str, rows: usize| {
                    load_linear(b, src, &format!("{p}.self_attn.{name}.weight"), &[rows, h])
                };
                (
                    w("q_proj", q_dim)?,
                    w("k_proj", kv_dim)?,
                    w("v_proj", kv_dim)?,
                )
            };
            let self_attn = Attention {
                q_proj,
                k_proj,
                v_proj,
                o_proj: load_linear(b, src, &format!("{p}.self_attn.o_proj.weight"), &[h, q_dim])?,
                q_bias: bias("q_proj", q_dim, variant.qkv_bias)?,
                k_bias: bias("k_proj", kv_dim, variant.qkv_bias)?,
                v_bias: bias("v_proj", kv_dim, variant.qkv_bias)?,
                o_bias: bias("o_proj", h, variant.o_bias)?,
                q_norm: head_norm("q_norm")?,
                k_norm: head_norm("k_norm")?,
            };
            let mlp = FeedForward::load(b, cfg, src, i, &p, variant.fused)?;
            layers.push(DecoderLayer {
                input_layernorm: load(b, src, &format!("{p}.input_layernorm.weight"), &[h])?,
                self_attn,
                post_attention_layernorm: load(
                    b,
                    src,
                    &format!("{p}.post_attention_layernorm.weight"),
                    &[h],
                )?,
                mlp,
            });
            progress(i + 2, total);
        }

        let norm = load(b, src, "model.norm.weight", &[h])?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            load_opt(b, src, "lm_head.weight", &[v, h])?
        };
        let max_pos = opts.max_model_len.min(cfg.max_position_embeddings).max(1);
        let cos_sin = b.load_table(rope::cos_sin_table(cfg, cfg.rotary_dim(), max_pos))?;
        progress(total, total);
        Ok(LlamaFamily {
            cfg: cfg.clone(),
            embed_tokens,
            layers,
            norm,
            lm_head,
            cos_sin,
            attn: AttentionParams {
                num_heads: cfg.num_attention_heads,
                num_kv_heads: cfg.num_key_value_heads,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                window: variant.window,
                softcap: None,
                kv_group: 0,
            },
            eps: cfg.rms_norm_eps as f32,
        })
    }

    /// Self-attention of `h` (the residual stream's normalized rows), up
    /// to (not including) o_proj, which the caller adds into the residual
    /// stream.
    fn attention(
        &self,
        b: &B,
        a: &Attention<B>,
        h: &B::Tensor,
        step: &B::Step,
        kv: &mut B::KvCache,
    ) -> Result<B::Tensor> {
        let hd = self.attn.head_dim;
        // 1. Project (one backend op).
        let [mut q, mut k, v] = b.linear3(
            h,
            [&a.q_proj, &a.k_proj, &a.v_proj],
            [a.q_bias.as_ref(), a.k_bias.as_ref(), a.v_bias.as_ref()],
        )?;
        // 2. Qwen3 normalizes each head of q and k; 3. rotate by position
        // (one backend op for 2-4).
        let norms = match (&a.q_norm, &a.k_norm) {
            (Some(qn), Some(kn)) => Some((qn, kn)),
            _ => None,
        };
        // 4. Store this step's K/V (the same op), then attend over the
        // whole cached sequence.
        b.qk_norm_rope_store_kv(
            &mut q,
            &mut k,
            &v,
            norms,
            self.eps,
            step,
            &self.cos_sin,
            hd,
            RopeStyle::Neox,
            kv,
        )?;
        Ok(b.attention(&q, kv, step, &self.attn)?)
    }
}

impl<B: Backend> CausalLm<B> for LlamaFamily<B> {
    fn forward(&self, b: &B, step: &B::Step, kv: &mut [B::KvCache]) -> Result<B::Tensor> {
        // `x` is the residual stream (f32 on every backend), `h` its rows
        // normalized for the block that reads them next: each block's
        // output projection adds into `x`, then the next block's norm runs.
        //
        // A decode step's launches per layer on CUDA, where the CUDA-core
        // GEMV runs the products (gemv.rs: 1 row, or 2-4 rows of small
        // weights): q/k/v (1), qk_norm_rope_store_kv (1: head norms, rope
        // and the KV store), attention (1: split-K decode, merged by its
        // last block at small batches), o_proj (1), rms_norm (1), gate/up
        // with the SiLU (1), down (1), the next rms_norm (1): 8. Unfused
        // (PAGODA_DECODE_FUSION=off), or where cuBLASLt or the tensor-core
        // GEMV runs the products: q/k/v (1, or 3 on cuBLASLt),
        // qk_norm_rope, store_kv, attention (1-2), o_proj, rms_norm,
        // gate_up, silu_mul, down, rms_norm: 10-13. Per step: embedding,
        // the first layer's input rms_norm, gather_logits_rows, the LM head
        // (then sampling, outside the graph).
        let mut x = b.embedding(step, &self.embed_tokens)?;
        let Some(first) = self.layers.first() else {
            return Err(crate::ModelError::Config("model has no layers".into()));
        };
        let mut h = b.rms_norm(&x, &first.input_layernorm, self.eps)?;
        for (i, (layer, cache)) in self.layers.iter().zip(kv.iter_mut()).enumerate() {
            let a = &layer.self_attn;
            let attn = self.attention(b, a, &h, step, cache)?;
            b.add_linear(&mut x, &attn, &a.o_proj, a.o_bias.as_ref())?;
            let hm = b.rms_norm(&x, &layer.post_attention_layernorm, self.eps)?;
            // The next layer's input norm, or the final norm.
            let next = self
                .layers
                .get(i + 1)
                .map_or(&self.norm, |l| &l.input_layernorm);
            h = layer.mlp.add_then_norm(b, &mut x, &hm, next, self.eps)?;
        }
        let last = b.gather_logits_rows(&h, step)?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        Ok(b.linear(&last, head, None)?)
    }

    fn config(&self) -> &ModelConfig {
        &self.cfg
    }
}
