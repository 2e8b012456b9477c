//! Mixture-of-experts GGUF files: their config and their stacked experts,
//! for the GGUF source ([`super::gguf`]).
//!
//! llama.cpp stores a sparse layer's experts stacked, one tensor per
//! projection: `blk.N.ffn_gate_exps`, `ffn_up_exps` (`[E, inter, hidden]`)
//! and `ffn_down_exps` (`[E, hidden, inter]`), with the router
//! `ffn_gate_inp` (`[E, hidden]`); `{arch}.expert_count`,
//! `.expert_used_count` and `.expert_feed_forward_length` size them. The
//! source answers them by transformers 5's names: `mlp.gate.weight`,
//! `mlp.experts.down_proj` (the down tensor as it is) and
//! `mlp.experts.gate_up_proj`, made here by putting each expert's up rows
//! after its gate rows (rows are independent, so quantized blocks move as
//! byte strings).
//!
//! Supported: `qwen3moe` (weights always renormalized, as llama.cpp does),
//! `llama` files with experts (Mixtral, renormalized) and `qwen2moe` (not
//! renormalized, as llama.cpp runs it; a shared expert in every sparse
//! layer: `ffn_{gate,up,down}_shexp` of
//! `{arch}.expert_shared_feed_forward_length`, gated by
//! `ffn_gate_inp_shexp`, answered by the source under Hugging Face's
//! `mlp.shared_expert.*` and `mlp.shared_expert_gate` names). A layer is
//! sparse where the file has its router. Refused with the reason: other MoE
//! architectures (by name), the old per-expert layout
//! (`blk.N.ffn_gate.E.weight`), and shared experts outside `qwen2moe`.

use crate::{ModelError, MoeConfig, Result};
use pagoda_gguf::{GgmlType, GgufFile, Metadata, TensorValues};
use pagoda_kernels::{HostData, HostTensor, QuantData};

/// llama.cpp architectures with experts that pagoda does not implement.
pub const UNSUPPORTED_MOE_ARCHS: &[&str] = &[
    "qwen3next",
    "deepseek",
    "deepseek2",
    "gpt-oss",
    "olmoe",
    "dbrx",
    "granitemoe",
    "granitehybrid",
    "phimoe",
    "arctic",
    "llama4",
    "glm4moe",
    "grok",
    "bailingmoe",
    "bailingmoe2",
    "ernie4_5-moe",
    "hunyuan-moe",
    "jamba",
    "minimax-m2",
    "dots1",
];

/// The error for a GGUF architecture in [`UNSUPPORTED_MOE_ARCHS`].
pub fn unsupported_arch(arch: &str) -> ModelError {
    ModelError::Config(format!(
        "GGUF architecture {arch:?} is a mixture-of-experts family pagoda does not implement \
         (mixture-of-experts GGUF files supported: qwen3moe, qwen2moe, and llama with experts \
         (Mixtral))"
    ))
}

/// The expert count of a `llama`/`qwen3moe`/`qwen2moe` file (0 without
/// experts).
pub fn expert_count(file: &GgufFile, arch: &str) -> Result<usize> {
    let md = file.metadata();
    md.optional(&format!("{arch}.expert_count"), Metadata::get_usize)
        .map(|n| n.unwrap_or(0))
        .map_err(|e| ModelError::Config(e.to_string()))
}

/// The [`MoeConfig`] of a file with `num_experts > 0` experts and
/// `num_layers` layers; `dense_ffn` is `{arch}.feed_forward_length`.
pub fn moe_config(
    file: &GgufFile,
    arch: &str,
    num_experts: usize,
    num_layers: usize,
    dense_ffn: Option<usize>,
) -> Result<MoeConfig> {
    let md = file.metadata();
    let cfg = |e: pagoda_gguf::GgufError| ModelError::Config(e.to_string());
    let key = |k: &str| format!("{arch}.{k}");
    let top_k = md.get_usize(&key("expert_used_count")).map_err(cfg)?;
    let width = match md
        .optional(&key("expert_feed_forward_length"), Metadata::get_usize)
        .map_err(cfg)?
    {
        Some(w) => w,
        None if arch == "llama" => dense_ffn.ok_or_else(|| {
            ModelError::Config(format!(
                "missing {} and {}",
                key("expert_feed_forward_length"),
                key("feed_forward_length")
            ))
        })?,
        None => md
            .get_usize(&key("expert_feed_forward_length"))
            .map_err(cfg)?,
    };
    let shared = arch == "qwen2moe";
    let shared_width = if shared {
        Some(
            md.get_usize(&key("expert_shared_feed_forward_length"))
                .map_err(cfg)?,
        )
    } else {
        None
    };
    let has_shared_tensors = (0..num_layers).any(|i| {
        file.tensor(&format!("blk.{i}.ffn_gate_shexp.weight"))
            .is_some()
    });
    if !shared
        && (md
            .optional(&key("expert_shared_count"), Metadata::get_usize)
            .map_err(cfg)?
            .unwrap_or(0)
            > 0
            || has_shared_tensors)
    {
        return Err(ModelError::Config(format!(
            "GGUF {arch} file with shared experts is not supported (only qwen2moe's)"
        )));
    }
    let mut sparse_layers = Vec::with_capacity(num_layers);
    for i in 0..num_layers {
        let sparse = file
            .tensor(&format!("blk.{i}.ffn_gate_inp.weight"))
            .is_some();
        if sparse {
            if file.tensor(&format!("blk.{i}.ffn_gate.0.weight")).is_some() {
                return Err(ModelError::Config(format!(
                    "GGUF layout with one tensor per expert (blk.{i}.ffn_gate.0.weight, from \
                     old conversions) is not supported: convert the model again with a recent \
                     llama.cpp (stacked blk.N.ffn_gate_exps tensors)"
                )));
            }
            let mut needed: Vec<String> = ["gate", "up", "down"]
                .iter()
                .map(|p| format!("blk.{i}.ffn_{p}_exps.weight"))
                .collect();
            if shared {
                needed.extend(
                    ["gate_shexp", "up_shexp", "down_shexp", "gate_inp_shexp"]
                        .iter()
                        .map(|p| format!("blk.{i}.ffn_{p}.weight")),
                );
            }
            for name in needed {
                if file.tensor(&name).is_none() {
                    return Err(ModelError::Config(format!(
                        "GGUF {arch} file has the router of layer {i} but no {name}"
                    )));
                }
            }
        }
        sparse_layers.push(sparse);
    }
    Ok(MoeConfig {
        num_experts,
        num_experts_per_tok: top_k,
        moe_intermediate_size: width,
        // llama.cpp renormalizes the chosen weights of qwen3moe and llama,
        // not qwen2moe's.
        norm_topk_prob: !shared,
        sparse_layers,
        shared_expert_intermediate_size: shared_width,
    })
}

/// `(Hugging Face name, GGUF name)` of each layer's stacked experts; the
/// gate_up entry names the gate tensor (the up tensor is found from it).
pub fn expert_names(file: &GgufFile) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for t in file.tensors() {
        let Some(layer) = t
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.strip_suffix(".ffn_down_exps.weight"))
            .filter(|l| l.parse::<usize>().is_ok())
        else {
            continue;
        };
        let p = format!("model.layers.{layer}.mlp.experts");
        out.push((format!("{p}.down_proj"), t.name.clone()));
        let gate = format!("blk.{layer}.ffn_gate_exps.weight");
        let up = format!("blk.{layer}.ffn_up_exps.weight");
        if file.tensor(&gate).is_some() && file.tensor(&up).is_some() {
            out.push((format!("{p}.gate_up_proj"), gate));
        }
    }
    out
}

/// Whether `hf_name` is a stacked gate_up made by [`gate_up`].
pub fn is_gate_up(hf_name: &str) -> bool {
    hf_name.ends_with(".mlp.experts.gate_up_proj")
}

/// Each expert's gate rows then its up rows (`[E, 2 * inter, hidden]`),
/// from `gate` (a GGUF `ffn_gate_exps` name) and the matching up tensor; as
/// blocks when `stored` and both are quantized the same way, else as values.
pub fn gate_up(file: &GgufFile, gate: &str, stored: bool) -> Result<HostTensor> {
    let up = gate.replace(".ffn_gate_exps.", ".ffn_up_exps.");
    let missing = || ModelError::MissingTensor(up.clone());
    let (gi, ui) = (
        file.tensor(gate)
            .ok_or_else(|| ModelError::MissingTensor(gate.to_string()))?,
        file.tensor(&up).ok_or_else(missing)?,
    );
    let shape = gi.shape();
    if ui.shape() != shape || shape.len() != 3 {
        return Err(ModelError::Config(format!(
            "{gate} is {:?} but {up} is {:?} (want equal [experts, inter, hidden])",
            shape,
            ui.shape()
        )));
    }
    let experts = shape[0];
    let out_shape = vec![shape[0], 2 * shape[1], shape[2]];
    let ty = gi.ggml_type;
    let dense = matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
    if stored && !dense && ty == ui.ggml_type && ty.can_dequantize() {
        let bytes = interleave(file.tensor_bytes(gi), file.tensor_bytes(ui), experts);
        return Ok(HostTensor {
            shape: out_shape,
            data: HostData::Quant(QuantData { ty, bytes }),
        });
    }
    let data = match (file.tensor_values(gate)?, file.tensor_values(&up)?) {
        (TensorValues::F16(g), TensorValues::F16(u)) => HostData::F16(interleave(&g, &u, experts)),
        (TensorValues::BF16(g), TensorValues::BF16(u)) => {
            HostData::BF16(interleave(&g, &u, experts))
        }
        (g, u) => HostData::F32(interleave(&to_f32(g), &to_f32(u), experts)),
    };
    Ok(HostTensor {
        shape: out_shape,
        data,
    })
}

fn to_f32(v: TensorValues) -> Vec<f32> {
    match v {
        TensorValues::F32(v) => v,
        TensorValues::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
        TensorValues::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
    }
}

/// Expert `e`'s part of `a`, then its part of `b`, for each of `experts`
/// equal parts (`a` and `b` of equal length).
pub fn interleave<T: Copy>(a: &[T], b: &[T], experts: usize) -> Vec<T> {
    let n = a.len() / experts.max(1);
    let mut out = Vec::with_capacity(a.len() + b.len());
    for e in 0..experts {
        out.extend_from_slice(&a[e * n..(e + 1) * n]);
        out.extend_from_slice(&b[e * n..(e + 1) * n]);
    }
    out
}
