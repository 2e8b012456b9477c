//! The op and attention tests again with the AVX2 kernels switched off, so the
//! portable fallbacks are checked on machines that have AVX2 too.

// Both included files load the shared `common` module, by design.
#![allow(clippy::duplicate_mod)]

/// Read by `common::backend`: every backend of this binary runs portable code.
const PORTABLE: bool = true;

#[path = "cpu_ops.rs"]
mod ops;

#[path = "cpu_attention.rs"]
mod attention;
