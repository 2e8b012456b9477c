//! The batch-1 GEMV path (kernels/gemv1.cu): which products of one row it
//! takes, its split-K choice, and its launches.
//!
//! [`Gemv1`] is chosen per backend from [`GEMV1_ENV`] (default
//! [`Gemv1::Off`], the measured `gemv.cu` kernels). When on, every product
//! of one row that the small-row path gives the CUDA-core GEMV
//! ([`super::gemv::GemvKernel::Warp`]) runs the batch-1 kernel instead:
//! `linear`, `add_linear` (the residual add in its epilogue), `linear3`,
//! the fused-norm `norm_linear3` / `norm_gate_up_silu`, and the gate/up
//! product with its SiLU gate where the norm is not fused (one launch
//! instead of `linear` + `silu_mul`). [`Gemv1::All`] also folds the
//! RMSNorm into the GEMV at every weight size (the `gemv.cu` fusion is kept
//! under [`super::gemv::LARGE_WEIGHT_BYTES`]).
//!
//! The choices depend only on the product's shape, so a captured decode
//! graph replays what it recorded; the launches allocate nothing.

use super::gemv::{GemvInput, WARP_WARPS};
use super::ops::Dest;
use super::CudaBackend;
use crate::{KernelError, Result};
use cudarc::driver::{CudaSlice, LaunchConfig};
use half::bf16;

/// The environment variable choosing the batch-1 GEMV of new backends:
/// `off` (default), `on`, or `all` (on, and the RMSNorm folded into the
/// GEMV at every weight size).
pub const GEMV1_ENV: &str = "PAGODA_GEMV1";

/// Whether products of one row take the batch-1 GEMV.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Gemv1 {
    /// The `gemv.cu` kernels at every row count.
    #[default]
    Off,
    /// The batch-1 kernels; the norm fusion where `gemv.cu` has it.
    On,
    /// The batch-1 kernels, the norm fused at every weight size.
    All,
}

impl Gemv1 {
    /// The mode [`GEMV1_ENV`] names (unset, empty or unknown: `Off`).
    pub fn from_env() -> Gemv1 {
        Self::parse(&std::env::var(GEMV1_ENV).unwrap_or_default())
    }

    /// `on`/`1`/`true` and `all` (any case, trimmed); anything else `Off`.
    pub fn parse(v: &str) -> Gemv1 {
        match v.trim().to_ascii_lowercase().as_str() {
            "on" | "1" | "true" => Gemv1::On,
            "all" => Gemv1::All,
            _ => Gemv1::Off,
        }
    }

    pub(crate) fn to_u8(self) -> u8 {
        match self {
            Gemv1::Off => 0,
            Gemv1::On => 1,
            Gemv1::All => 2,
        }
    }

    pub(crate) fn from_u8(v: u8) -> Gemv1 {
        match v {
            1 => Gemv1::On,
            2 => Gemv1::All,
            _ => Gemv1::Off,
        }
    }

    /// Whether this mode runs the batch-1 kernels.
    pub fn on(self) -> bool {
        self != Gemv1::Off
    }
}

/// Warps sharing one output of `out` outputs of `inner` wide rows: enough
/// that the grid has about 4,096 warps (every SM of an H100/H200 busy with
/// 3-4 blocks), at most 8 (the block), and each warp keeps at least two
/// 512-byte slices of its row.
pub fn split_for(out: usize, inner: usize) -> usize {
    let chunks = inner / 8;
    let mut s = 1;
    while s < WARP_WARPS && out.saturating_mul(s) < 4096 && chunks >= s * 2 * 64 {
        s *= 2;
    }
    s
}

fn i32_of(v: usize, op: &'static str) -> Result<i32> {
    i32::try_from(v).map_err(|_| KernelError::Shape {
        op,
        detail: format!("{v} does not fit in 32 bits"),
    })
}

/// The grid of `outputs` outputs at `split` warps each.
fn cfg(outputs: usize, split: usize, smem: u32, op: &'static str) -> Result<LaunchConfig> {
    let blocks = outputs.saturating_mul(split).div_ceil(WARP_WARPS);
    Ok(LaunchConfig {
        grid_dim: (i32_of(blocks, op)? as u32, 1, 1),
        block_dim: (32 * WARP_WARPS as u32, 1, 1),
        shared_mem_bytes: smem,
    })
}

/// Shared memory of a fused-norm launch: the one normalized row.
fn norm_smem(inner: usize, op: &'static str) -> Result<u32> {
    if !super::gemv::norm_fits(1, inner) {
        return Err(KernelError::Shape {
            op,
            detail: format!("a normalized row of {inner} does not fit the GEMV"),
        });
    }
    Ok((inner * 2) as u32)
}

/// `dest = x @ w^T (+ bias)` (or `+=` into an f32 `dest`) for one row x of
/// `inner` and w `[out, inner]`, checked by the caller (`inner % 8 == 0`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch(
    b: &CudaBackend,
    op: &'static str,
    (out, inner): (usize, usize),
    xd: &CudaSlice<bf16>,
    wd: &CudaSlice<bf16>,
    bias: Option<&CudaSlice<bf16>>,
    dest: &mut Dest<'_>,
) -> Result<()> {
    let split = split_for(out, inner);
    let (n, kk, sp) = (i32_of(out, op)?, i32_of(inner, op)?, split as i32);
    let has_bias = i32::from(bias.is_some());
    let name = match dest {
        Dest::Bf16(_) => "gemv1_bf16",
        Dest::AccF32(_) => "gemv1_acc_f32",
    };
    let mut l = b.dev.launch(name)?;
    match dest {
        Dest::Bf16(y) => l.out(&mut **y),
        Dest::AccF32(y) => l.out(&mut **y),
    };
    l.arg(xd)
        .arg(wd)
        .arg(bias.unwrap_or(wd))
        .arg(&has_bias)
        .arg(&n)
        .arg(&kk)
        .arg(&sp);
    l.run(cfg(out, split, 0, op)?)?;
    Ok(())
}

/// Three products of one row (`gemv1_3_bf16`, or `gemv1_3_norm_bf16` for a
/// normalized input), shapes checked by the caller.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch3(
    b: &CudaBackend,
    op: &'static str,
    inner: usize,
    x: GemvInput<'_>,
    w: [&CudaSlice<bf16>; 3],
    dims: [usize; 3],
    bias: [Option<&CudaSlice<bf16>>; 3],
    outs: [&mut CudaSlice<bf16>; 3],
) -> Result<()> {
    let total: usize = dims.iter().sum();
    if total == 0 {
        return Ok(());
    }
    let split = split_for(total, inner);
    let (kk, sp) = (i32_of(inner, op)?, split as i32);
    let n = [
        i32_of(dims[0], op)?,
        i32_of(dims[1], op)?,
        i32_of(dims[2], op)?,
    ];
    let mask: i32 = (0..3).filter(|&i| bias[i].is_some()).map(|i| 1 << i).sum();
    let (name, smem) = match &x {
        GemvInput::Bf16(_) => ("gemv1_3_bf16", 0),
        GemvInput::Norm(..) => ("gemv1_3_norm_bf16", norm_smem(inner, op)?),
    };
    let mut l = b.dev.launch(name)?;
    let [o0, o1, o2] = outs;
    l.arg(o0).arg(o1).arg(o2);
    match &x {
        GemvInput::Bf16(xd) => l.arg(*xd),
        GemvInput::Norm(xr, nw, eps) => l.arg(*xr).arg(*nw).arg(eps),
    };
    l.arg(w[0]).arg(w[1]).arg(w[2]);
    // A missing bias is never read: its weight stands in.
    for (bi, wi) in bias.iter().zip(w) {
        l.arg(bi.unwrap_or(wi));
    }
    l.arg(&mask)
        .arg(&n[0])
        .arg(&n[1])
        .arg(&n[2])
        .arg(&kk)
        .arg(&sp);
    l.run(cfg(total, split, smem, op)?)?;
    Ok(())
}

/// `y = silu(h @ gate^T) * (h @ up^T)` for the stacked `[2 * n, inner]`
/// weight and one row `h`: bf16 (`gemv1_silu_bf16`) or the f32 residual
/// normalized on load (`gemv1_norm_silu_bf16`); shapes checked by the
/// caller.
pub(crate) fn launch_silu(
    b: &CudaBackend,
    op: &'static str,
    (n, inner): (usize, usize),
    x: GemvInput<'_>,
    gate_up: &CudaSlice<bf16>,
    y: &mut CudaSlice<bf16>,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let split = split_for(n, inner);
    let (nn, kk, sp) = (i32_of(n, op)?, i32_of(inner, op)?, split as i32);
    let (name, smem) = match &x {
        GemvInput::Bf16(_) => ("gemv1_silu_bf16", 0),
        GemvInput::Norm(..) => ("gemv1_norm_silu_bf16", norm_smem(inner, op)?),
    };
    let mut l = b.dev.launch(name)?;
    l.out(y);
    match &x {
        GemvInput::Bf16(xd) => l.arg(*xd),
        GemvInput::Norm(xr, nw, eps) => l.arg(*xr).arg(*nw).arg(eps),
    };
    l.arg(gate_up).arg(&nn).arg(&kk).arg(&sp);
    l.run(cfg(n, split, smem, op)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values_parse() {
        assert_eq!(Gemv1::parse(""), Gemv1::Off);
        assert_eq!(Gemv1::parse("off"), Gemv1::Off);
        assert_eq!(Gemv1::parse(" On "), Gemv1::On);
        assert_eq!(Gemv1::parse("1"), Gemv1::On);
        assert_eq!(Gemv1::parse("ALL"), Gemv1::All);
        for m in [Gemv1::Off, Gemv1::On, Gemv1::All] {
            assert_eq!(Gemv1::from_u8(m.to_u8()), m);
        }
    }

    /// The split at the decode shapes: long products keep one warp per
    /// output, short ones share it so the grid fills the GPU.
    #[test]
    fn split_by_outputs_and_width() {
        // Llama-3.1-8B: qkv, o_proj, gate (of gate_up), down, LM head.
        assert_eq!(split_for(6144, 4096), 1);
        assert_eq!(split_for(4096, 4096), 1);
        assert_eq!(split_for(14336, 4096), 1);
        assert_eq!(split_for(4096, 14336), 1);
        assert_eq!(split_for(128256, 4096), 1);
        // Qwen3-0.6B: qkv, o_proj, gate, down.
        assert_eq!(split_for(4096, 1024), 1);
        assert_eq!(split_for(1024, 2048), 4);
        assert_eq!(split_for(3072, 1024), 2);
        assert_eq!(split_for(1024, 3072), 4);
        // Narrow rows keep at least two slices per warp; at most 8 warps.
        assert_eq!(split_for(64, 64), 1);
        assert_eq!(split_for(16, 1 << 16), 8);
        assert_eq!(split_for(1024, 1024), 2);
    }
}
