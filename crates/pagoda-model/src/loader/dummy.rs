//! Deterministic dummy weights: every tensor of an architecture, with its
//! real Hugging Face name and shape, filled from a counter-based generator.
//!
//! Used to run and benchmark a model without a checkpoint, and by the golden
//! tests: `scripts/golden/models.py` fills Hugging Face transformers models
//! with the same values, so pagoda and transformers can be compared on tiny
//! random models whose weights are never committed.
//!
//! The value spec (shared, bit for bit, with the Python side):
//! - `seed` = FNV-1a 64-bit hash of the tensor name's UTF-8 bytes.
//! - element `i` (row-major): SplitMix64 finalizer of
//!   `seed + (i + 1) * 0x9E3779B97F4A7C15` (wrapping), its top 24 bits as
//!   `u` in `[0, 1)`, and `r = 2u - 1` (exact in f32).
//! - tensors of rank >= 2 (`cols` = last dimension): `r * sqrt(3 / cols)`,
//!   the scale computed in f64 and rounded to f32 (unit variance of `x W^T`
//!   for unit-variance `x`).
//! - 1-D tensors whose name contains `norm` and ends with `.weight`:
//!   `1 + 0.1 r`; every other 1-D tensor (biases): `0.1 r`. Both in f32.
//!
//! Mixture-of-experts layers have transformers 5's stacked expert tensors
//! (`mlp.experts.gate_up_proj` `[E, 2 * inter, hidden]`,
//! `mlp.experts.down_proj` `[E, hidden, inter]`), scaled by their last
//! dimension like any matrix, and the router `mlp.gate.weight`.
//!
//! Invariants: values depend only on (name, element index, shape's last
//! dimension), never on the order tensors are requested in or the thread
//! count. Costs: nothing is stored; each `get` generates the tensor, O(numel),
//! in parallel over rayon chunks (Qwen3-0.6B's 600M values take about two
//! seconds on two cores).

use super::WeightSource;
use crate::{Architecture, ModelConfig, ModelError, Result};
use pagoda_kernels::HostTensor;
use rayon::prelude::*;
use std::collections::HashMap;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
/// Elements generated per rayon task.
const CHUNK: usize = 1 << 16;

/// FNV-1a 64-bit hash of `bytes`: the per-tensor seed.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(FNV_OFFSET, |h, &b| (h ^ b as u64).wrapping_mul(FNV_PRIME))
}

/// The uniform value `r` in `[-1, 1)` of element `i` of the tensor seeded `seed`.
#[inline]
pub fn uniform(seed: u64, i: u64) -> f32 {
    let mut z = seed.wrapping_add(i.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let u = (z >> 40) as f32 / 16_777_216.0;
    2.0 * u - 1.0
}

/// How the uniform `r` becomes a value, chosen from a tensor's name and shape.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fill {
    /// `r * scale` (matrices).
    Scaled(f32),
    /// `1 + 0.1 r` (norm weights).
    AroundOne,
    /// `0.1 r` (biases and other vectors).
    Small,
}

impl Fill {
    fn for_tensor(name: &str, shape: &[usize]) -> Fill {
        match shape {
            [] | [_] => {
                if name.contains("norm") && name.ends_with(".weight") {
                    Fill::AroundOne
                } else {
                    Fill::Small
                }
            }
            [.., cols] => Fill::Scaled((3.0 / (*cols).max(1) as f64).sqrt() as f32),
        }
    }

    #[inline]
    fn apply(self, r: f32) -> f32 {
        match self {
            Fill::Scaled(a) => r * a,
            Fill::AroundOne => 1.0 + 0.1 * r,
            Fill::Small => 0.1 * r,
        }
    }
}

/// The dummy values of tensor `name` with shape `shape`, row-major.
pub fn dummy_values(name: &str, shape: &[usize]) -> Vec<f32> {
    let seed = fnv1a64(name.as_bytes());
    let fill = Fill::for_tensor(name, shape);
    let numel: usize = shape.iter().product();
    let mut out = vec![0.0f32; numel];
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(c, chunk)| {
            let base = (c * CHUNK) as u64;
            // One loop per fill, so the branch stays out of the hot loop.
            match fill {
                Fill::Scaled(a) => fill_chunk(chunk, seed, base, |r| r * a),
                Fill::AroundOne => fill_chunk(chunk, seed, base, |r| Fill::AroundOne.apply(r)),
                Fill::Small => fill_chunk(chunk, seed, base, |r| Fill::Small.apply(r)),
            }
        });
    out
}

#[inline]
fn fill_chunk(chunk: &mut [f32], seed: u64, base: u64, f: impl Fn(f32) -> f32) {
    for (j, v) in chunk.iter_mut().enumerate() {
        *v = f(uniform(seed, base + j as u64));
    }
}

/// Every tensor of `cfg`'s architecture with its Hugging Face name and shape,
/// in checkpoint order (embeddings, layers in order, final norm, LM head).
pub fn tensor_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    match cfg.architecture {
        Architecture::Opt => opt_shapes(cfg),
        Architecture::Llama
        | Architecture::Qwen2
        | Architecture::Qwen3
        | Architecture::Qwen3Moe
        | Architecture::Mixtral
        | Architecture::Qwen2Moe => llama_shapes(cfg),
        Architecture::Gemma2 | Architecture::Gemma3 => gemma_shapes(cfg),
        Architecture::Phi3 => phi3_shapes(cfg),
    }
}

/// Phi-3: fused qkv_proj and gate_up_proj, no biases.
fn phi3_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, v, inter) = (cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size);
    let (q_dim, kv_dim) = (cfg.q_dim(), cfg.kv_dim());
    let mut t = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let mut push = |suffix: &str, shape: Vec<usize>| t.push((format!("{p}.{suffix}"), shape));
        push("input_layernorm.weight", vec![h]);
        push("self_attn.qkv_proj.weight", vec![q_dim + 2 * kv_dim, h]);
        push("self_attn.o_proj.weight", vec![h, q_dim]);
        push("post_attention_layernorm.weight", vec![h]);
        push("mlp.gate_up_proj.weight", vec![2 * inter, h]);
        push("mlp.down_proj.weight", vec![h, inter]);
    }
    t.push(("model.norm.weight".to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        t.push(("lm_head.weight".to_string(), vec![v, h]));
    }
    t
}

/// Gemma 2/3: four norms per layer, q/k norms for Gemma 3, no biases.
fn gemma_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, v, inter) = (cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size);
    let (q_dim, kv_dim, head_dim) = (cfg.q_dim(), cfg.kv_dim(), cfg.head_dim());
    let mut t = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let mut push = |suffix: &str, shape: Vec<usize>| t.push((format!("{p}.{suffix}"), shape));
        push("input_layernorm.weight", vec![h]);
        push("self_attn.q_proj.weight", vec![q_dim, h]);
        push("self_attn.k_proj.weight", vec![kv_dim, h]);
        push("self_attn.v_proj.weight", vec![kv_dim, h]);
        push("self_attn.o_proj.weight", vec![h, q_dim]);
        if cfg.architecture == Architecture::Gemma3 {
            push("self_attn.q_norm.weight", vec![head_dim]);
            push("self_attn.k_norm.weight", vec![head_dim]);
        }
        push("post_attention_layernorm.weight", vec![h]);
        push("pre_feedforward_layernorm.weight", vec![h]);
        push("mlp.gate_proj.weight", vec![inter, h]);
        push("mlp.up_proj.weight", vec![inter, h]);
        push("mlp.down_proj.weight", vec![h, inter]);
        push("post_feedforward_layernorm.weight", vec![h]);
    }
    t.push(("model.norm.weight".to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        t.push(("lm_head.weight".to_string(), vec![v, h]));
    }
    t
}

fn llama_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, v, inter) = (cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size);
    let (q_dim, kv_dim, head_dim) = (cfg.q_dim(), cfg.kv_dim(), cfg.head_dim());
    // Hugging Face: Qwen2 always has q/k/v biases and none on o_proj; Llama and
    // Qwen3 put `attention_bias` on all four projections.
    let (qkv_bias, o_bias) = match cfg.architecture {
        Architecture::Qwen2 => (true, false),
        Architecture::Qwen2Moe => (cfg.attention_bias, false),
        _ => (cfg.attention_bias, cfg.attention_bias),
    };
    let qk_norm = matches!(
        cfg.architecture,
        Architecture::Qwen3 | Architecture::Qwen3Moe
    );

    let mut t = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let mut push = |suffix: &str, shape: Vec<usize>| t.push((format!("{p}.{suffix}"), shape));
        push("input_layernorm.weight", vec![h]);
        for (proj, rows) in [("q_proj", q_dim), ("k_proj", kv_dim), ("v_proj", kv_dim)] {
            push(&format!("self_attn.{proj}.weight"), vec![rows, h]);
            if qkv_bias {
                push(&format!("self_attn.{proj}.bias"), vec![rows]);
            }
        }
        push("self_attn.o_proj.weight", vec![h, q_dim]);
        if o_bias {
            push("self_attn.o_proj.bias", vec![h]);
        }
        if qk_norm {
            push("self_attn.q_norm.weight", vec![head_dim]);
            push("self_attn.k_norm.weight", vec![head_dim]);
        }
        push("post_attention_layernorm.weight", vec![h]);
        let sparse = cfg
            .moe
            .as_ref()
            .filter(|m| m.sparse_layers.get(l).copied().unwrap_or(false));
        if let Some(m) = sparse {
            // transformers 5's stacked experts (its in-memory names).
            let (e, mi) = (m.num_experts, m.moe_intermediate_size);
            push("mlp.gate.weight", vec![e, h]);
            push("mlp.experts.gate_up_proj", vec![e, 2 * mi, h]);
            push("mlp.experts.down_proj", vec![e, h, mi]);
            if let Some(si) = m.shared_expert_intermediate_size {
                push("mlp.shared_expert.gate_proj.weight", vec![si, h]);
                push("mlp.shared_expert.up_proj.weight", vec![si, h]);
                push("mlp.shared_expert.down_proj.weight", vec![h, si]);
                push("mlp.shared_expert_gate.weight", vec![1, h]);
            }
        } else {
            push("mlp.gate_proj.weight", vec![inter, h]);
            push("mlp.up_proj.weight", vec![inter, h]);
            push("mlp.down_proj.weight", vec![h, inter]);
        }
    }
    t.push(("model.norm.weight".to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        t.push(("lm_head.weight".to_string(), vec![v, h]));
    }
    t
}

fn opt_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, v, ffn) = (cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size);
    let proj = cfg.word_embed_proj_dim.unwrap_or(h);
    let d = "model.decoder";
    let mut t = vec![
        (format!("{d}.embed_tokens.weight"), vec![v, proj]),
        // OPT's learned positions are offset by 2 (rows 0 and 1 are unused).
        (
            format!("{d}.embed_positions.weight"),
            vec![cfg.max_position_embeddings + 2, h],
        ),
    ];
    if proj != h {
        t.push((format!("{d}.project_in.weight"), vec![h, proj]));
    }
    // Every OPT linear and layer norm has a weight and a bias.
    let with_bias = |t: &mut Vec<(String, Vec<usize>)>, name: String, shape: Vec<usize>| {
        let rows = shape[0];
        t.push((format!("{name}.weight"), shape));
        t.push((format!("{name}.bias"), vec![rows]));
    };
    for l in 0..cfg.num_hidden_layers {
        let p = format!("{d}.layers.{l}");
        for name in ["k_proj", "v_proj", "q_proj", "out_proj"] {
            with_bias(&mut t, format!("{p}.self_attn.{name}"), vec![h, h]);
        }
        with_bias(&mut t, format!("{p}.self_attn_layer_norm"), vec![h]);
        with_bias(&mut t, format!("{p}.fc1"), vec![ffn, h]);
        with_bias(&mut t, format!("{p}.fc2"), vec![h, ffn]);
        with_bias(&mut t, format!("{p}.final_layer_norm"), vec![h]);
    }
    // Hugging Face builds the final layer norm only for pre-norm models.
    if cfg.do_layer_norm_before {
        with_bias(&mut t, format!("{d}.final_layer_norm"), vec![h]);
    }
    if proj != h {
        t.push((format!("{d}.project_out.weight"), vec![proj, h]));
    }
    if !cfg.tie_word_embeddings {
        t.push(("lm_head.weight".to_string(), vec![v, proj]));
    }
    t
}

/// A [`WeightSource`] that generates every tensor of a [`ModelConfig`] on demand.
#[derive(Debug, Clone)]
pub struct DummySource {
    /// Names in checkpoint order.
    names: Vec<String>,
    shapes: HashMap<String, Vec<usize>>,
}

impl DummySource {
    /// Dummy weights for `cfg`; fails if the config is inconsistent.
    pub fn new(cfg: &ModelConfig) -> Result<Self> {
        cfg.validate().map_err(ModelError::Config)?;
        let list = tensor_shapes(cfg);
        let names = list.iter().map(|(n, _)| n.clone()).collect();
        Ok(DummySource {
            names,
            shapes: list.into_iter().collect(),
        })
    }

    /// Every tensor name, in checkpoint order.
    pub fn tensor_names(&self) -> &[String] {
        &self.names
    }

    /// The shape of tensor `name`, if the architecture has it.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.shapes.get(name).map(Vec::as_slice)
    }

    /// Total number of parameters (tied embeddings counted once).
    pub fn num_parameters(&self) -> usize {
        self.shapes
            .values()
            .map(|s| s.iter().product::<usize>())
            .sum()
    }
}

impl WeightSource for DummySource {
    fn get(&self, name: &str) -> Result<HostTensor> {
        let shape = self
            .shapes
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        Ok(HostTensor::f32(shape.clone(), dummy_values(name, shape)))
    }

    fn contains(&self, name: &str) -> bool {
        self.shapes.contains_key(name)
    }
}

#[cfg(test)]
#[path = "dummy_tests.rs"]
mod tests;
