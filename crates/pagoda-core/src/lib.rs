//! pagoda's plain-data core.
//!
//! Owns what a request asks for ([`SamplingParams`]) and, as it grows, the
//! block pool, the radix prefix cache and the scheduler. Nothing here touches
//! tensors, devices, threads or I/O, so every piece is tested with plain values.

pub mod sampling;

pub use sampling::{SamplingParams, SamplingParamsError};
