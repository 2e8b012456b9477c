//! The CPU backend: multi-threaded (rayon), f32 activations.
//!
//! Placeholder until the implementation lands.

/// The CPU implementation of [`crate::Backend`].
#[derive(Debug, Clone, Default)]
pub struct CpuBackend;
