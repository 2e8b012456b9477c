//! The feed-forward block of the Llama-family bodies: a dense SwiGLU MLP, or
//! a sparse mixture of SwiGLU experts (Qwen3-MoE, Mixtral, Qwen2-MoE), chosen
//! per layer by [`crate::MoeConfig::sparse_layers`].
//!
//! A sparse layer, as transformers' `Qwen3MoeSparseMoeBlock` /
//! `MixtralSparseMoeBlock`: router logits `h @ gate^T` -> softmax, top-k
//! (renormalized where the config says) -> each token's experts' MLPs,
//! weighted and summed -> added to the residual stream. Everything runs
//! through [`Backend::moe_route`] and [`Backend::moe_experts`], whose
//! experts are stacked in two weights: `gate_up` `[E * 2 * inter, hidden]`
//! (expert e's gate rows, then its up rows) and `down` `[E * hidden, inter]`.
//!
//! Weights are read by Hugging Face name, stacked form first: transformers
//! 5's `mlp.experts.gate_up_proj` `[E, 2 * inter, hidden]` and
//! `mlp.experts.down_proj` `[E, hidden, inter]` (what the dummy and GGUF
//! sources answer), else the per-expert tensors of published checkpoints
//! (`mlp.experts.{e}.gate_proj/up_proj/down_proj` for Qwen,
//! `block_sparse_moe.experts.{e}.w1/w3/w2` for Mixtral), stacked here once
//! at load. The router is `mlp.gate` (`block_sparse_moe.gate` in Mixtral
//! checkpoints). The stacked experts load through
//! [`Backend::load_experts`] (FP8 under `--quantization fp8`: one scale per
//! output row of each expert), or, from an FP8 checkpoint's per-expert
//! tensors, as stored through [`Backend::load_fp8_experts`]; the router
//! stays in the backend's dense dtype.
//!
//! Qwen2-MoE's shared expert (`Qwen2MoeSparseMoeBlock`): a dense SwiGLU MLP
//! of `shared_expert_intermediate_size` (`mlp.shared_expert.{gate,up,down}_proj`)
//! whose output is scaled per token by `sigmoid(h . mlp.shared_expert_gate)`
//! and added with the routed experts'. The scale is applied to the MLP's
//! inner activation before its down projection (the same by linearity), so
//! the down projection adds straight into the residual stream; the gate's
//! `[1, hidden]` row is padded with zero rows to [`GATE_ROWS`] so its
//! product has 16-byte rows on every backend.

use super::weights::{concat_rows, load, load_linear, read, read_linear, LinearHost};
use crate::loader::WeightSource;
use crate::{Architecture, ModelConfig, ModelError, Result};
use pagoda_kernels::{Backend, HostTensor};

/// One layer's feed-forward block.
pub enum FeedForward<B: Backend> {
    /// SwiGLU with gate_proj and up_proj stacked into one matrix.
    Dense {
        gate_up_proj: B::Weight,
        down_proj: B::Weight,
    },
    /// A mixture of SwiGLU experts.
    Sparse(SparseMoe<B>),
}

/// Rows of a shared expert's gate weight as loaded (its one row, then zeros).
const GATE_ROWS: usize = 8;

/// Qwen2-MoE's shared expert of a sparse layer.
pub struct SharedExpert<B: Backend> {
    /// `[2 * inter, hidden]`: gate_proj then up_proj.
    gate_up: B::Weight,
    /// `[hidden, inter]`.
    down: B::Weight,
    /// `[GATE_ROWS, hidden]`: `shared_expert_gate` then zero rows.
    gate: B::Weight,
}

/// The router and the stacked experts of a sparse layer.
pub struct SparseMoe<B: Backend> {
    /// `[num_experts, hidden]`.
    gate: B::Weight,
    /// `[num_experts * 2 * inter, hidden]`.
    gate_up: B::Weight,
    /// `[num_experts * hidden, inter]`.
    down: B::Weight,
    num_experts: usize,
    top_k: usize,
    renormalize: bool,
    shared: Option<SharedExpert<B>>,
}

/// How a family's checkpoints name the per-expert tensors and the router.
struct ExpertNames {
    /// Prefix of the per-expert tensors and router, after `model.layers.N.`.
    block: &'static str,
    /// Gate, up and down projections of one expert.
    gate: &'static str,
    up: &'static str,
    down: &'static str,
}

impl ExpertNames {
    fn of(arch: Architecture) -> ExpertNames {
        match arch {
            Architecture::Mixtral => ExpertNames {
                block: "block_sparse_moe",
                gate: "w1",
                up: "w3",
                down: "w2",
            },
            _ => ExpertNames {
                block: "mlp",
                gate: "gate_proj",
                up: "up_proj",
                down: "down_proj",
            },
        }
    }
}

impl<B: Backend> FeedForward<B> {
    /// Loads layer `layer`'s block (`p` = `model.layers.{layer}`); a dense
    /// block reads Phi-3's fused `gate_up_proj` where `fused_gate_up`.
    pub fn load(
        b: &B,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
        layer: usize,
        p: &str,
        fused_gate_up: bool,
    ) -> Result<Self> {
        let h = cfg.hidden_size;
        let moe = cfg
            .moe
            .as_ref()
            .filter(|m| m.sparse_layers.get(layer).copied().unwrap_or(false));
        let Some(m) = moe else {
            let inter = cfg.intermediate_size;
            let gate_up_proj = if fused_gate_up {
                load_linear(
                    b,
                    src,
                    &format!("{p}.mlp.gate_up_proj.weight"),
                    &[2 * inter, h],
                )?
            } else {
                let gate = read_linear(src, &format!("{p}.mlp.gate_proj.weight"), &[inter, h])?;
                let up = read_linear(src, &format!("{p}.mlp.up_proj.weight"), &[inter, h])?;
                gate.concat_rows(up, &format!("{p}.mlp.gate_proj/up_proj"))?
                    .upload(b)?
            };
            return Ok(FeedForward::Dense {
                gate_up_proj,
                down_proj: load_linear(b, src, &format!("{p}.mlp.down_proj.weight"), &[h, inter])?,
            });
        };
        let (e, inter) = (m.num_experts, m.moe_intermediate_size);
        let names = ExpertNames::of(cfg.architecture);
        let router = [
            format!("{p}.mlp.gate.weight"),
            format!("{p}.{}.gate.weight", names.block),
        ];
        let router = router
            .iter()
            .find(|n| src.contains(n))
            .unwrap_or(&router[0]);
        let (gate_up, down) = read_experts(src, p, &names, e, inter, h)?;
        let shared = match m.shared_expert_intermediate_size {
            Some(si) => Some(SharedExpert::load(b, src, p, si, h)?),
            None => None,
        };
        Ok(FeedForward::Sparse(SparseMoe {
            gate: load(b, src, router, &[e, h])?,
            gate_up: gate_up.upload_experts(b)?,
            down: down.upload_experts(b)?,
            num_experts: e,
            top_k: m.num_experts_per_tok,
            renormalize: m.norm_topk_prob,
            shared,
        }))
    }

    /// `x += ffn(h)`, then returns `rms_norm(x, norm, eps)` (the next
    /// block's input): `x` the residual stream, `h` its normalized rows. A
    /// dense block's gate/up product and activation are one backend op
    /// ([`Backend::gate_up_silu`]).
    pub fn add_then_norm(
        &self,
        b: &B,
        x: &mut B::Tensor,
        h: &B::Tensor,
        norm: &B::Weight,
        eps: f32,
    ) -> Result<B::Tensor> {
        match self {
            FeedForward::Dense {
                gate_up_proj,
                down_proj,
            } => {
                let act = b.gate_up_silu(h, gate_up_proj)?;
                b.add_linear(x, &act, down_proj, None)?;
            }
            FeedForward::Sparse(m) => m.add_to(b, x, h)?,
        }
        Ok(b.rms_norm(x, norm, eps)?)
    }
}

impl<B: Backend> SparseMoe<B> {
    /// `x += experts(h)` (+ the gated shared expert): `x` the residual
    /// stream, `h` its normalized rows.
    fn add_to(&self, b: &B, x: &mut B::Tensor, h: &B::Tensor) -> Result<()> {
        // 1. Route: each row's top-k experts and their weights.
        let logits = b.linear(h, &self.gate, None)?;
        let routes = b.moe_route(&logits, self.top_k, self.renormalize)?;
        // 2. The chosen experts' MLPs, weighted and summed per row.
        let y = b.moe_experts(h, &routes, &self.gate_up, &self.down, self.num_experts)?;
        b.add(x, &y)?;
        // 3. The shared expert, gated per row.
        if let Some(s) = &self.shared {
            let mut act = b.gate_up_silu(h, &s.gate_up)?;
            let gate = b.linear(h, &s.gate, None)?;
            b.sigmoid_gate_rows(&mut act, &gate)?;
            b.add_linear(x, &act, &s.down, None)?;
        }
        Ok(())
    }
}

impl<B: Backend> SharedExpert<B> {
    /// Layer `p`'s shared expert of width `inter`.
    fn load(b: &B, src: &dyn WeightSource, p: &str, inter: usize, h: usize) -> Result<Self> {
        let s = format!("{p}.mlp.shared_expert");
        let gate = read(src, &format!("{s}.gate_proj.weight"), &[inter, h])?;
        let up = read(src, &format!("{s}.up_proj.weight"), &[inter, h])?;
        // `[1, hidden]`, or `[hidden]` as GGUF files may store it.
        let name = format!("{p}.mlp.shared_expert_gate.weight");
        let g = src.get(&name)?;
        if g.shape != [1, h] && g.shape != [h] {
            return Err(ModelError::TensorShape {
                name,
                got: g.shape,
                expected: vec![1, h],
            });
        }
        let zeros = HostTensor::f32(vec![GATE_ROWS - 1, h], vec![0.0; (GATE_ROWS - 1) * h]);
        let g = HostTensor::f32(vec![1, h], g.into_f32_vec());
        Ok(SharedExpert {
            gate_up: b.load_weight(concat_rows(gate, up))?,
            down: load(b, src, &format!("{s}.down_proj.weight"), &[h, inter])?,
            gate: b.load_weight(concat_rows(g, zeros))?,
        })
    }
}

/// The stacked `(gate_up [E * 2 * inter, hidden], down [E * hidden, inter])`
/// of one layer, from the stacked tensors or the per-expert ones (those
/// FP8 as stored in an FP8 checkpoint: every expert's projections then
/// FP8, each row with its scale).
fn read_experts(
    src: &dyn WeightSource,
    p: &str,
    names: &ExpertNames,
    e: usize,
    inter: usize,
    h: usize,
) -> Result<(LinearHost, LinearHost)> {
    let stacked = format!("{p}.mlp.experts.gate_up_proj");
    if src.contains(&stacked) {
        let gate_up = read(src, &stacked, &[e, 2 * inter, h])?;
        let down = read(src, &format!("{p}.mlp.experts.down_proj"), &[e, h, inter])?;
        return Ok((
            LinearHost::Dense(flatten(gate_up)),
            LinearHost::Dense(flatten(down)),
        ));
    }
    let name = |i: usize, proj: &str| format!("{p}.{}.experts.{i}.{proj}.weight", names.block);
    if !src.contains(&name(0, names.gate)) {
        return Err(ModelError::MissingTensor(format!(
            "{stacked} (or per-expert {})",
            name(0, names.gate)
        )));
    }
    let mut gate_up = Vec::with_capacity(2 * e);
    let mut down = Vec::with_capacity(e);
    for i in 0..e {
        gate_up.push(read_linear(src, &name(i, names.gate), &[inter, h])?);
        gate_up.push(read_linear(src, &name(i, names.up), &[inter, h])?);
        down.push(read_linear(src, &name(i, names.down), &[h, inter])?);
    }
    let what = format!("{p}.{}.experts", names.block);
    Ok((stack_rows(gate_up, &what)?, stack_rows(down, &what)?))
}

/// `[E, rows, cols]` as the 2-D `[E * rows, cols]` (same bytes).
fn flatten(mut t: HostTensor) -> HostTensor {
    let (rows, cols) = t.dims2();
    t.shape = vec![rows, cols];
    t
}

/// Matrices with the same column count stacked in order (one copy each);
/// FP8 and dense parts do not mix.
fn stack_rows(parts: Vec<LinearHost>, what: &str) -> Result<LinearHost> {
    let mut parts = parts.into_iter();
    let first = parts
        .next()
        .unwrap_or(LinearHost::Dense(HostTensor::f32(vec![0, 0], Vec::new())));
    parts.try_fold(first, |a, b| a.concat_rows(b, what))
}
