//! The device boundary of pagoda.
//!
//! This crate owns the small op set every model is written in ([`Backend`]),
//! the per-step batch metadata those ops read ([`ForwardContext`]), and the
//! host-side weight container loaders produce ([`HostTensor`]). It knows
//! nothing of requests, scheduling or HTTP.
//!
//! Implementations:
//! - [`cpu::CpuBackend`]: multi-threaded, f32 activations; also the reference
//!   every other backend is tested against.
//! - `cuda::CudaBackend` (feature `cuda`): bf16 on NVIDIA GPUs.

// Host bookkeeping of the CUDA activation arena (plain data, tested everywhere).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod arena;
pub mod backend;
pub mod context;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod error;
pub mod fp8;
pub mod fp8_matrix;
pub mod host;
pub mod knob;
pub mod kv_dtype;
pub mod logit_adjust;
pub mod sampling_options;

pub use backend::{AttentionParams, Backend, KvCacheShape, NoGraph, NoRoutes, RopeStyle};
pub use context::{ForwardContext, SamplingRow};
pub use error::{KernelError, Result};
pub use fp8_matrix::Fp8Matrix;
pub use host::{GgmlType, HostData, HostTensor, QuantData};
pub use kv_dtype::KvCacheDtype;
pub use logit_adjust::{LogitAdjustments, RowAdjust, MAX_LOGIT_ENTRIES};
pub use sampling_options::{
    DeviceSamples, PromptRow, PromptRowLogprobs, RowLogprobs, RowOptions, SamplingOptions,
    TokenMasks, MAX_LOGPROBS,
};
