//! The engine: model runner, sampler, detokenization, step loop.

pub mod sampler;
