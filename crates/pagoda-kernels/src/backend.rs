//! The op set pagoda's models are written in.
//!
//! A model file holds `B::Weight`s and calls these ops on `B::Tensor`s; it never
//! touches device memory directly and never owns KV state (the runner owns the
//! per-layer `B::KvCache` and lends it to each forward pass).
//!
//! Conventions, for every implementation:
//! - activations are row-major `[rows, cols]`, one row per token of the step;
//! - a linear weight is `[out_features, in_features]`; `linear` computes
//!   `x @ w^T (+ bias)`;
//! - a KV cache layer holds K and V, each `[num_blocks, block_size,
//!   num_kv_heads, head_dim]`, and `slot = block * block_size + offset`
//!   (elements of the backend's cache dtype: its native one, or FP8 E4M3
//!   bytes with a per-layer scale, see [`crate::kv_dtype`]);
//! - ops that read batch metadata take the backend's `Step`, made once per
//!   forward pass by [`Backend::begin_step`] from a [`ForwardContext`];
//! - the residual stream (what [`Backend::embedding`] returns, and what
//!   [`Backend::add_linear`], [`Backend::add`] and
//!   [`Backend::add_position_embedding`] accumulate into) is kept at f32 on
//!   every backend, even where other activations are bf16; the norms read it
//!   and return an activation of the backend's compute precision, which is
//!   what every other op takes.

use pagoda_core::BlockCopy;

use crate::{
    DeviceSamples, ForwardContext, Fp8Matrix, HostTensor, Result, SamplingOptions, TokenMasks,
};

/// How rotary embedding pairs up the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// GPT-NeoX / Hugging Face "rotate_half": dimension `i` pairs with `i + rotary_dim/2`.
    Neox,
    /// GPT-J / original Llama: dimension `2i` pairs with `2i + 1`.
    Interleaved,
}

/// Shape of one layer's KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheShape {
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl KvCacheShape {
    /// Elements of K (or of V) in one layer.
    pub fn elements(&self) -> usize {
        self.num_blocks * self.block_size * self.num_kv_heads * self.head_dim
    }
}

/// Head layout and scale of an attention op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Softmax scale, usually `1/sqrt(head_dim)`.
    pub scale: f32,
    /// Sliding window (transformers' `sliding_window`): the query at position
    /// `p` sees only the keys at positions `p + 1 - window ..= p` (`window`
    /// keys, itself included). `None`: every position up to its own. A window
    /// of 0 is an error.
    pub window: Option<usize>,
    /// Logit soft-capping (Gemma 2's `attn_logit_softcapping`): each scaled
    /// score `s` becomes `cap * tanh(s / cap)` before the softmax. A cap that
    /// is not positive and finite is an error.
    pub softcap: Option<f32>,
    /// The KV cache group whose block tables the layer reads (see
    /// [`crate::ForwardContext::extra_kv_groups`]); 0 for one group.
    pub kv_group: usize,
}

impl AttentionParams {
    /// Full causal attention with the usual `1/sqrt(head_dim)` scale.
    pub fn causal(num_heads: usize, num_kv_heads: usize, head_dim: usize) -> Self {
        AttentionParams {
            num_heads,
            num_kv_heads,
            head_dim,
            scale: 1.0 / (head_dim.max(1) as f32).sqrt(),
            window: None,
            softcap: None,
            kv_group: 0,
        }
    }

    /// The first key position the query at position `pos` sees.
    pub fn first_key(&self, pos: usize) -> usize {
        match self.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        }
    }

    /// Checks the window and the cap (see the fields).
    pub fn check_variants(&self) -> std::result::Result<(), String> {
        if self.window == Some(0) {
            return Err("sliding window of 0 keys".into());
        }
        if let Some(c) = self.softcap {
            if !(c.is_finite() && c > 0.0) {
                return Err(format!("soft-capping {c} is not positive and finite"));
            }
        }
        Ok(())
    }
}

/// A device able to run pagoda's models.
pub trait Backend: Send + Sync + 'static {
    /// A row-major `[rows, cols]` activation in device memory.
    type Tensor: Send;
    /// A weight (matrix, vector or table) prepared for this device.
    type Weight: Send + Sync;
    /// One layer's paged K and V cache.
    type KvCache: Send;
    /// Batch metadata of one forward pass, resident where the ops need it.
    type Step: Send + Sync;
    /// A captured decode graph ([`NoGraph`] where graphs are not supported).
    type Graph: Send;
    /// The expert choice of each row of a mixture-of-experts layer (see
    /// [`Backend::moe_route`]; [`NoRoutes`] where MoE is not supported).
    type Routes: Send;

    /// Human-readable device name, e.g. "cpu (2 threads)".
    fn name(&self) -> String;

    /// Runs a whole forward pass in the backend's execution context (the CPU
    /// backend's thread pool, so the many ops of a step do not each cross
    /// threads). Backends without one run `f` directly.
    fn scope<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        f()
    }

    // ---- memory -------------------------------------------------------------

    /// Uploads a weight, converting it to the backend's storage dtype.
    fn load_weight(&self, w: HostTensor) -> Result<Self::Weight>;
    /// Uploads a lookup table (the rotary cos/sin table) at full precision,
    /// whatever the weight dtype.
    fn load_table(&self, t: HostTensor) -> Result<Self::Weight>;
    /// Uploads the matrix of a dense linear layer (attention and MLP
    /// projections; never embeddings or the LM head). A backend built for
    /// FP8 weights quantizes it per output channel ([`Fp8Matrix::quantize`])
    /// and takes it as [`Backend::load_fp8_linear`] does; otherwise this is
    /// [`Backend::load_weight`].
    fn load_linear(&self, w: HostTensor) -> Result<Self::Weight> {
        self.load_weight(w)
    }
    /// Uploads an FP8 linear weight (E4M3 codes, one scale per output
    /// channel): `linear`/`add_linear` with it quantize their input per
    /// token and compute as the [`crate::fp8_matrix`] reference says.
    fn load_fp8_linear(&self, w: Fp8Matrix) -> Result<Self::Weight> {
        let _ = w;
        Err(crate::KernelError::Unsupported(
            "FP8 weights on this backend".into(),
        ))
    }
    /// Uploads a stacked mixture-of-experts weight (the `gate_up` or `down`
    /// of [`Backend::moe_experts`]). A backend built for FP8 weights
    /// quantizes it per row ([`Fp8Matrix::quantize`]: one scale per output
    /// row of each expert) and takes it as [`Backend::load_fp8_experts`]
    /// does; otherwise this is [`Backend::load_weight`].
    fn load_experts(&self, w: HostTensor) -> Result<Self::Weight> {
        self.load_weight(w)
    }
    /// Uploads a stacked expert weight in FP8 (E4M3 codes, one scale per
    /// row): [`Backend::moe_experts`] with it computes with the weight's
    /// values (`code * scale`) and takes its input as it is (activations
    /// are not quantized). Only `moe_experts` takes such a weight.
    fn load_fp8_experts(&self, w: Fp8Matrix) -> Result<Self::Weight> {
        let _ = w;
        Err(crate::KernelError::Unsupported(
            "FP8 expert weights on this backend".into(),
        ))
    }
    /// Allocates one layer's KV cache, zero-filled.
    fn alloc_kv_cache(&self, shape: KvCacheShape) -> Result<Self::KvCache>;
    /// Bytes one layer's KV cache of `shape` takes (K and V together), at
    /// the element size of the backend's cache dtype.
    fn kv_cache_bytes(&self, shape: KvCacheShape) -> usize;
    /// Whether the backend's KV caches hold FP8 E4M3 bytes (see
    /// [`crate::kv_dtype`]); then [`Backend::set_kv_scales`] matters.
    fn kv_cache_fp8(&self) -> bool {
        false
    }
    /// Sets one layer's K and V scales (`value = fp8 * scale`; both 1.0 at
    /// allocation). Takes effect for the ops queued after it (on CUDA the
    /// scales live in a small device buffer, so captured graphs see them).
    /// A scale that is not positive and finite is an error; caches that
    /// are not FP8 accept only 1.0.
    fn set_kv_scales(&self, cache: &mut Self::KvCache, k_scale: f32, v_scale: f32) -> Result<()> {
        let _ = cache;
        if k_scale == 1.0 && v_scale == 1.0 {
            return Ok(());
        }
        Err(crate::KernelError::Unsupported(
            "KV cache scales on a cache that is not FP8".into(),
        ))
    }
    /// Makes an activation from host rows.
    fn tensor_from_host(&self, rows: usize, cols: usize, data: &[f32]) -> Result<Self::Tensor>;
    /// Copies an activation back to the host as f32, row-major.
    fn tensor_to_host(&self, x: &Self::Tensor) -> Result<Vec<f32>>;
    /// `(rows, cols)` of an activation.
    fn dims(&self, x: &Self::Tensor) -> (usize, usize);
    /// Prepares the batch metadata of one forward pass.
    fn begin_step(&self, ctx: &ForwardContext) -> Result<Self::Step>;

    // ---- ops ----------------------------------------------------------------

    /// Rows of `table` (`[vocab, hidden]`) for each of the step's
    /// `input_ids`: the start of the residual stream (f32).
    fn embedding(&self, step: &Self::Step, table: &Self::Weight) -> Result<Self::Tensor>;
    /// `x @ w^T + bias` for `x: [rows, in]`, `w: [out, in]`, `bias: [out]`.
    fn linear(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        bias: Option<&Self::Weight>,
    ) -> Result<Self::Tensor>;
    /// Three `linear`s of the same `x` (an attention layer's q, k and v
    /// projections): the same results as three calls (what this default
    /// makes); a backend may run them as one pass.
    fn linear3(
        &self,
        x: &Self::Tensor,
        w: [&Self::Weight; 3],
        bias: [Option<&Self::Weight>; 3],
    ) -> Result<[Self::Tensor; 3]> {
        Ok([
            self.linear(x, w[0], bias[0])?,
            self.linear(x, w[1], bias[1])?,
            self.linear(x, w[2], bias[2])?,
        ])
    }
    /// `residual += x @ w^T (+ bias)`: a projection added into the residual
    /// stream at the residual's precision (on CUDA the GEMM accumulates into
    /// the f32 residual, so the projection is never rounded to bf16).
    fn add_linear(
        &self,
        residual: &mut Self::Tensor,
        x: &Self::Tensor,
        w: &Self::Weight,
        bias: Option<&Self::Weight>,
    ) -> Result<()> {
        let y = self.linear(x, w, bias)?;
        self.add(residual, &y)
    }
    /// `silu_mul(linear(h, gate_up))`: a dense SwiGLU MLP's stacked gate/up
    /// product and activation of normalized rows `h` (what this default
    /// does; a backend may take the activation into the product's output,
    /// with the same results).
    fn gate_up_silu(&self, h: &Self::Tensor, gate_up: &Self::Weight) -> Result<Self::Tensor> {
        self.silu_mul(&self.linear(h, gate_up, None)?)
    }
    /// RMSNorm of each row with weight `w: [cols]`.
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Weight, eps: f32) -> Result<Self::Tensor>;
    /// `residual += x`, then returns RMSNorm(residual) (the fused pre-norm step).
    fn add_rms_norm(
        &self,
        residual: &mut Self::Tensor,
        x: &Self::Tensor,
        w: &Self::Weight,
        eps: f32,
    ) -> Result<Self::Tensor>;
    /// RMSNorm applied to every `head_dim` slice of each row, in place (Qwen3's q/k norm).
    fn head_rms_norm(
        &self,
        x: &mut Self::Tensor,
        w: &Self::Weight,
        head_dim: usize,
        eps: f32,
    ) -> Result<()>;
    /// LayerNorm of each row with weight and bias `[cols]`.
    fn layer_norm(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        b: &Self::Weight,
        eps: f32,
    ) -> Result<Self::Tensor>;
    /// Rotary embedding in place on every head of every row, at the step's positions.
    /// `cos_sin` is a `[max_positions, rotary_dim]` table: cosines in the first
    /// `rotary_dim/2` columns, sines in the rest. Dimensions past `rotary_dim`
    /// are left alone.
    fn rope(
        &self,
        x: &mut Self::Tensor,
        step: &Self::Step,
        cos_sin: &Self::Weight,
        head_dim: usize,
        style: RopeStyle,
    ) -> Result<()>;
    /// Per-head RMSNorm of q and k (Qwen3's q/k norm, where `norms` gives
    /// the q and k weights) then the rotary embedding of both, in place:
    /// the same as `head_rms_norm` on q and on k, then `rope` on q and on
    /// k (what this default does; a backend may do it in one pass).
    #[allow(clippy::too_many_arguments)]
    fn qk_norm_rope(
        &self,
        q: &mut Self::Tensor,
        k: &mut Self::Tensor,
        norms: Option<(&Self::Weight, &Self::Weight)>,
        eps: f32,
        step: &Self::Step,
        cos_sin: &Self::Weight,
        head_dim: usize,
        style: RopeStyle,
    ) -> Result<()> {
        if let Some((qn, kn)) = norms {
            self.head_rms_norm(q, qn, head_dim, eps)?;
            self.head_rms_norm(k, kn, head_dim, eps)?;
        }
        self.rope(q, step, cos_sin, head_dim, style)?;
        self.rope(k, step, cos_sin, head_dim, style)
    }
    /// [`Self::qk_norm_rope`], then [`Self::store_kv`] of the final k and
    /// `v` into `cache` (what this default does; a backend may store from
    /// the same pass, with the same results).
    #[allow(clippy::too_many_arguments)]
    fn qk_norm_rope_store_kv(
        &self,
        q: &mut Self::Tensor,
        k: &mut Self::Tensor,
        v: &Self::Tensor,
        norms: Option<(&Self::Weight, &Self::Weight)>,
        eps: f32,
        step: &Self::Step,
        cos_sin: &Self::Weight,
        head_dim: usize,
        style: RopeStyle,
        cache: &mut Self::KvCache,
    ) -> Result<()> {
        self.qk_norm_rope(q, k, norms, eps, step, cos_sin, head_dim, style)?;
        self.store_kv(k, v, cache, step)
    }
    /// `silu(gate) * up` for `gate_up: [rows, 2 * n]` (gate in the first half).
    fn silu_mul(&self, gate_up: &Self::Tensor) -> Result<Self::Tensor>;
    /// `silu(gate) * up` for separate `[rows, n]` inputs.
    fn silu_mul2(&self, gate: &Self::Tensor, up: &Self::Tensor) -> Result<Self::Tensor>;
    /// `gelu_tanh(gate) * up` for `gate_up: [rows, 2 * n]` (gate in the
    /// first half): Gemma's gated MLP (transformers' `gelu_pytorch_tanh`).
    fn gelu_tanh_mul(&self, gate_up: &Self::Tensor) -> Result<Self::Tensor> {
        let _ = gate_up;
        Err(crate::KernelError::Unsupported(
            "gelu_tanh_mul (Gemma's MLP) on this backend".into(),
        ))
    }
    /// `x *= factor` in place (Gemma's embedding scale).
    fn scale(&self, x: &mut Self::Tensor, factor: f32) -> Result<()> {
        let _ = (x, factor);
        Err(crate::KernelError::Unsupported(
            "scale (Gemma's embedding scale) on this backend".into(),
        ))
    }
    /// `x = cap * tanh(x / cap)` in place (Gemma 2's final logit
    /// soft-capping).
    fn softcap(&self, x: &mut Self::Tensor, cap: f32) -> Result<()> {
        let _ = (x, cap);
        Err(crate::KernelError::Unsupported(
            "softcap (logit soft-capping) on this backend".into(),
        ))
    }
    /// ReLU in place.
    fn relu(&self, x: &mut Self::Tensor) -> Result<()>;
    /// `x += y`.
    fn add(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<()>;
    /// `x += table[row]` for row = `positions[i] + offset` (learned position embeddings).
    fn add_position_embedding(
        &self,
        x: &mut Self::Tensor,
        step: &Self::Step,
        table: &Self::Weight,
        offset: usize,
    ) -> Result<()>;
    /// The rows of `x` named by the step's `logits_indices`.
    fn gather_logits_rows(&self, x: &Self::Tensor, step: &Self::Step) -> Result<Self::Tensor>;
    /// Writes each token's K and V (`[rows, num_kv_heads * head_dim]`) into its
    /// slot; tokens whose slot is -1 are skipped.
    fn store_kv(
        &self,
        k: &Self::Tensor,
        v: &Self::Tensor,
        cache: &mut Self::KvCache,
        step: &Self::Step,
    ) -> Result<()> {
        self.store_kv_in_group(k, v, cache, step, 0)
    }
    /// [`Self::store_kv`] at the slots of KV cache group `group` (see
    /// [`crate::ForwardContext::extra_kv_groups`]).
    fn store_kv_in_group(
        &self,
        k: &Self::Tensor,
        v: &Self::Tensor,
        cache: &mut Self::KvCache,
        step: &Self::Step,
        group: usize,
    ) -> Result<()>;
    /// Copy-on-write of shared prefix blocks, as the scheduler plans them:
    /// for each copy, the K and V of the first `num_tokens` slots of block
    /// `src` into block `dst`. Runs before the forward pass that writes into
    /// `dst`.
    fn copy_blocks(&self, cache: &mut Self::KvCache, copies: &[BlockCopy]) -> Result<()>;
    /// Causal attention of each sequence's queries (`q: [rows, num_heads * head_dim]`)
    /// over its cached K/V (context and the step's own tokens, already stored),
    /// read through the block tables. Returns `[rows, num_heads * head_dim]`.
    /// Query token `j` of sequence `i` sees cache positions `0..=context_len + j`
    /// (only the last `window` of them with a sliding window); scores are
    /// scaled, then soft-capped where `params.softcap` says so. A backend that
    /// does not implement a variant refuses it (never full attention instead).
    fn attention(
        &self,
        q: &Self::Tensor,
        cache: &Self::KvCache,
        step: &Self::Step,
        params: &AttentionParams,
    ) -> Result<Self::Tensor>;

    // ---- mixture of experts -------------------------------------------------

    /// Chooses each row's experts from `router_logits: [rows, num_experts]`:
    /// softmax over all experts (f32 math), the `top_k` largest
    /// probabilities (ties to the lower expert index), each row's chosen
    /// weights divided by their sum when `renormalize` (Mixtral, Qwen3-MoE's
    /// `norm_topk_prob`), kept as they are otherwise (Qwen2-MoE).
    fn moe_route(
        &self,
        router_logits: &Self::Tensor,
        top_k: usize,
        renormalize: bool,
    ) -> Result<Self::Routes> {
        let _ = (router_logits, top_k, renormalize);
        Err(crate::KernelError::Unsupported(
            "mixture-of-experts routing on this backend".into(),
        ))
    }
    /// Routes given on the host (tests and reference checks): row `r` uses
    /// experts `ids[r * top_k..][..top_k]` with `weights` at the same
    /// places; an id at or past the layer's expert count is an error of
    /// [`Backend::moe_experts`].
    fn moe_routes_from_host(
        &self,
        ids: &[u32],
        weights: &[f32],
        top_k: usize,
    ) -> Result<Self::Routes> {
        let _ = (ids, weights, top_k);
        Err(crate::KernelError::Unsupported(
            "mixture-of-experts routing on this backend".into(),
        ))
    }
    /// The expert MLPs of a mixture-of-experts layer: for each row `x` of
    /// `x: [rows, hidden]`, `sum_k w_k * down_e(silu(gate_e x) * up_e x)`
    /// over the row's routes `(e, w_k)`. The experts are stacked in two
    /// ordinary weights: `gate_up: [num_experts * 2 * inter, hidden]`
    /// (expert `e`'s `inter` gate rows, then its `inter` up rows) and
    /// `down: [num_experts * hidden, inter]` (expert `e`'s `hidden` rows).
    /// Returns `[rows, hidden]` at the backend's compute precision.
    fn moe_experts(
        &self,
        x: &Self::Tensor,
        routes: &Self::Routes,
        gate_up: &Self::Weight,
        down: &Self::Weight,
        num_experts: usize,
    ) -> Result<Self::Tensor> {
        let _ = (x, routes, gate_up, down, num_experts);
        Err(crate::KernelError::Unsupported(
            "mixture-of-experts MLPs on this backend".into(),
        ))
    }
    /// A shared expert's gate (Qwen2-MoE): `x[r, :] *= sigmoid(gate[r, 0])`
    /// for each row, `gate: [rows, c]` with `c >= 1` (only column 0 is
    /// read; a model may pad its gate weight so the product has aligned
    /// rows). `x` is an activation of the backend's compute precision.
    fn sigmoid_gate_rows(&self, x: &mut Self::Tensor, gate: &Self::Tensor) -> Result<()> {
        let _ = (x, gate);
        Err(crate::KernelError::Unsupported(
            "shared-expert gates on this backend".into(),
        ))
    }

    /// Ends the warm-up of a device's step memory: from now on every step
    /// takes its activations and scratch from a fixed reservation sized by
    /// the steps run so far (the runner's profiling steps), and never
    /// allocates device memory again; a step that does not fit fails with
    /// [`crate::KernelError::OutOfMemory`]. Returns the reserved bytes
    /// (`None` where the backend has no such reservation, e.g. the CPU).
    fn freeze_step_memory(&self) -> Result<Option<usize>> {
        Ok(None)
    }

    /// Row counts (up to `max_rows`) a warm-up should run a step at so
    /// that the backend has planned, and loaded the library kernels for,
    /// every GEMM a step of any size will need (see the runner's
    /// profiling). Empty where nothing needs warming.
    fn warmup_row_counts(&self, _max_rows: usize) -> Vec<usize> {
        Vec::new()
    }

    /// One line on how the backend chose its GEMM algorithms during the
    /// warm-up (timed, from a disk cache, or the library's first choice),
    /// for the start-up log; `None` where there is no such choice.
    fn gemm_tuning_summary(&self) -> Option<String> {
        None
    }

    // ---- device sampling and decode graphs (optional) ---------------------

    /// Whether [`Backend::sample`] works: then the runner fills
    /// [`ForwardContext::sampling`] and asks for token ids instead of logits.
    fn samples_on_device(&self) -> bool {
        false
    }
    /// Samples one token per row of `logits` (the step's logits rows, in
    /// order) with the step's [`ForwardContext::sampling`] rows; waits for
    /// the device and returns the ids.
    fn sample(&self, logits: &Self::Tensor, step: &Self::Step) -> Result<Vec<u32>> {
        let _ = (logits, step);
        Err(crate::KernelError::Unsupported(
            "sampling on this backend's device".into(),
        ))
    }
    /// [`Backend::begin_step`] for a step whose sampling rows carry
    /// penalties or logprobs requests (`opts`, see [`SamplingOptions`]),
    /// uploaded with the step's metadata. Backends without device sampling
    /// accept only empty options.
    fn begin_step_with(&self, ctx: &ForwardContext, opts: &SamplingOptions) -> Result<Self::Step> {
        if !opts.is_empty() {
            return Err(crate::KernelError::Unsupported(
                "sampling options on this backend's device".into(),
            ));
        }
        self.begin_step(ctx)
    }
    /// [`Backend::sample`] with the step's sampling options applied
    /// (penalties before sampling; logprobs of the rows that ask); one wait
    /// for the device, one download of the ids and the small logprob results.
    /// Penalties rewrite the penalized logits of `logits` in place.
    fn sample_full(&self, logits: &Self::Tensor, step: &Self::Step) -> Result<DeviceSamples> {
        let _ = (logits, step);
        Err(crate::KernelError::Unsupported(
            "sampling on this backend's device".into(),
        ))
    }
    /// Sets the logits of every token a constrained row's mask disallows
    /// to -inf, in place, queued before the step's sampling (no wait for
    /// the device). Backends without device sampling accept only empty
    /// masks (the host sampler applies them).
    fn apply_token_masks(&self, logits: &Self::Tensor, masks: &TokenMasks) -> Result<()> {
        let _ = logits;
        if masks.is_empty() {
            return Ok(());
        }
        Err(crate::KernelError::Unsupported(
            "token masks on this backend's device".into(),
        ))
    }
    /// Whether [`Backend::capture_graph`] works.
    fn supports_graphs(&self) -> bool {
        false
    }
    /// Records `forward` (the model's forward pass over `step`, returning the
    /// logits rows) into a replayable graph whose logits stay in a buffer of
    /// the graph's own; replays sample them after the graph runs, outside it,
    /// so per-row sampling options never change what was captured. Nothing
    /// runs now; [`Backend::replay_graph`] runs it.
    fn capture_graph(
        &self,
        step: Self::Step,
        forward: &mut dyn FnMut(&Self::Step) -> Result<Self::Tensor>,
    ) -> Result<Self::Graph> {
        let _ = (step, forward);
        Err(crate::KernelError::Unsupported(
            "graphs on this backend".into(),
        ))
    }
    /// Runs `graph` on `ctx`, which must have the shape the graph was
    /// captured with (tokens, sequences, block-table width, sampling rows);
    /// returns the sampled token ids (one sync with the device).
    fn replay_graph(&self, graph: &mut Self::Graph, ctx: &ForwardContext) -> Result<Vec<u32>> {
        Ok(self
            .replay_graph_with(graph, ctx, &SamplingOptions::default())?
            .tokens)
    }
    /// [`Backend::replay_graph_with`] whose sampling waits for the step's
    /// token masks: `masks` is called once the graph is queued (so the host
    /// computes masks while the device runs the forward pass) and fills
    /// the masks, applied before the sampling.
    fn replay_graph_masked(
        &self,
        graph: &mut Self::Graph,
        ctx: &ForwardContext,
        opts: &SamplingOptions,
        masks: &mut dyn FnMut() -> Result<TokenMasks>,
    ) -> Result<DeviceSamples> {
        if !masks()?.is_empty() {
            return Err(crate::KernelError::Unsupported(
                "token masks on this backend's device".into(),
            ));
        }
        self.replay_graph_with(graph, ctx, opts)
    }
    /// [`Backend::replay_graph`] with sampling options (see
    /// [`Backend::sample_full`]); still one wait for the device.
    fn replay_graph_with(
        &self,
        graph: &mut Self::Graph,
        ctx: &ForwardContext,
        opts: &SamplingOptions,
    ) -> Result<DeviceSamples> {
        let _ = (graph, ctx, opts);
        Err(crate::KernelError::Unsupported(
            "graphs on this backend".into(),
        ))
    }
}

/// The graph type of backends without graphs (no value of it exists).
#[derive(Debug)]
pub enum NoGraph {}

/// The routes type of backends without mixture-of-experts ops (no value of
/// it exists).
#[derive(Debug)]
pub enum NoRoutes {}
