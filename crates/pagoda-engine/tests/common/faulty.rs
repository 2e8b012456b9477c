//! A backend that forwards to the CPU backend and fails or panics on demand
//! at the start of a forward pass, for tests of how the engine recovers from
//! a failed step.

use pagoda_core::BlockCopy;
use pagoda_kernels::cpu::CpuBackend;
use pagoda_kernels::{
    AttentionParams, Backend, ForwardContext, HostTensor, KernelError, KvCacheShape, Result,
    RopeStyle,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// What the next forward passes do.
#[derive(Debug, Default)]
pub struct Faults {
    /// Forward passes still to fail with a device error.
    pub fail_steps: AtomicUsize,
    /// Forward passes still to panic.
    pub panic_steps: AtomicUsize,
}

impl Faults {
    fn take(counter: &AtomicUsize) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

pub struct FaultyBackend {
    pub inner: CpuBackend,
    pub faults: Arc<Faults>,
}

impl Backend for FaultyBackend {
    type Tensor = <CpuBackend as Backend>::Tensor;
    type Weight = <CpuBackend as Backend>::Weight;
    type KvCache = <CpuBackend as Backend>::KvCache;
    type Step = <CpuBackend as Backend>::Step;
    type Graph = pagoda_kernels::NoGraph;
    type Routes = <CpuBackend as Backend>::Routes;

    fn name(&self) -> String {
        format!("faulty {}", self.inner.name())
    }
    fn load_weight(&self, w: HostTensor) -> Result<Self::Weight> {
        self.inner.load_weight(w)
    }
    fn load_table(&self, t: HostTensor) -> Result<Self::Weight> {
        self.inner.load_table(t)
    }
    fn alloc_kv_cache(&self, shape: KvCacheShape) -> Result<Self::KvCache> {
        self.inner.alloc_kv_cache(shape)
    }
    fn kv_cache_bytes(&self, shape: KvCacheShape) -> usize {
        self.inner.kv_cache_bytes(shape)
    }
    fn kv_cache_fp8(&self) -> bool {
        self.inner.kv_cache_fp8()
    }
    fn set_kv_scales(&self, cache: &mut Self::KvCache, k: f32, v: f32) -> Result<()> {
        self.inner.set_kv_scales(cache, k, v)
    }
    fn tensor_from_host(&self, rows: usize, cols: usize, data: &[f32]) -> Result<Self::Tensor> {
        self.inner.tensor_from_host(rows, cols, data)
    }
    fn tensor_to_host(&self, x: &Self::Tensor) -> Result<Vec<f32>> {
        self.inner.tensor_to_host(x)
    }
    fn dims(&self, x: &Self::Tensor) -> (usize, usize) {
        self.inner.dims(x)
    }
    fn begin_step(&self, ctx: &ForwardContext) -> Result<Self::Step> {
        if Faults::take(&self.faults.panic_steps) {
            panic!("injected panic");
        }
        if Faults::take(&self.faults.fail_steps) {
            return Err(KernelError::Device("injected failure".into()));
        }
        self.inner.begin_step(ctx)
    }
    fn embedding(&self, step: &Self::Step, table: &Self::Weight) -> Result<Self::Tensor> {
        self.inner.embedding(step, table)
    }
    fn linear(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        bias: Option<&Self::Weight>,
    ) -> Result<Self::Tensor> {
        self.inner.linear(x, w, bias)
    }
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Weight, eps: f32) -> Result<Self::Tensor> {
        self.inner.rms_norm(x, w, eps)
    }
    fn add_rms_norm(
        &self,
        residual: &mut Self::Tensor,
        x: &Self::Tensor,
        w: &Self::Weight,
        eps: f32,
    ) -> Result<Self::Tensor> {
        self.inner.add_rms_norm(residual, x, w, eps)
    }
    fn head_rms_norm(
        &self,
        x: &mut Self::Tensor,
        w: &Self::Weight,
        head_dim: usize,
        eps: f32,
    ) -> Result<()> {
        self.inner.head_rms_norm(x, w, head_dim, eps)
    }
    fn layer_norm(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        b: &Self::Weight,
        eps: f32,
    ) -> Result<Self::Tensor> {
        self.inner.layer_norm(x, w, b, eps)
    }
    fn rope(
        &self,
        x: &mut Self::Tensor,
        step: &Self::Step,
        cos_sin: &Self::Weight,
        head_dim: usize,
        style: RopeStyle,
    ) -> Result<()> {
        self.inner.rope(x, step, cos_sin, head_dim, style)
    }
    fn silu_mul(&self, gate_up: &Self::Tensor) -> Result<Self::Tensor> {
        self.inner.silu_mul(gate_up)
    }
    fn silu_mul2(&self, gate: &Self::Tensor, up: &Self::Tensor) -> Result<Self::Tensor> {
        self.inner.silu_mul2(gate, up)
    }
    fn relu(&self, x: &mut Self::Tensor) -> Result<()> {
        self.inner.relu(x)
    }
    fn add(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<()> {
        self.inner.add(x, y)
    }
    fn add_position_embedding(
        &self,
        x: &mut Self::Tensor,
        step: &Self::Step,
        table: &Self::Weight,
        offset: usize,
    ) -> Result<()> {
        self.inner.add_position_embedding(x, step, table, offset)
    }
    fn gather_logits_rows(&self, x: &Self::Tensor, step: &Self::Step) -> Result<Self::Tensor> {
        self.inner.gather_logits_rows(x, step)
    }
    fn store_kv_in_group(
        &self,
        k: &Self::Tensor,
        v: &Self::Tensor,
        cache: &mut Self::KvCache,
        step: &Self::Step,
        group: usize,
    ) -> Result<()> {
        self.inner.store_kv_in_group(k, v, cache, step, group)
    }
    fn copy_blocks(&self, cache: &mut Self::KvCache, copies: &[BlockCopy]) -> Result<()> {
        self.inner.copy_blocks(cache, copies)
    }
    fn attention(
        &self,
        q: &Self::Tensor,
        cache: &Self::KvCache,
        step: &Self::Step,
        params: &AttentionParams,
    ) -> Result<Self::Tensor> {
        self.inner.attention(q, cache, step, params)
    }
    fn moe_route(
        &self,
        router_logits: &Self::Tensor,
        top_k: usize,
        renormalize: bool,
    ) -> Result<Self::Routes> {
        self.inner.moe_route(router_logits, top_k, renormalize)
    }
    fn moe_routes_from_host(
        &self,
        ids: &[u32],
        weights: &[f32],
        top_k: usize,
    ) -> Result<Self::Routes> {
        self.inner.moe_routes_from_host(ids, weights, top_k)
    }
    fn moe_experts(
        &self,
        x: &Self::Tensor,
        routes: &Self::Routes,
        gate_up: &Self::Weight,
        down: &Self::Weight,
        num_experts: usize,
    ) -> Result<Self::Tensor> {
        self.inner
            .moe_experts(x, routes, gate_up, down, num_experts)
    }
    fn sigmoid_gate_rows(&self, x: &mut Self::Tensor, gate: &Self::Tensor) -> Result<()> {
        self.inner.sigmoid_gate_rows(x, gate)
    }
}
