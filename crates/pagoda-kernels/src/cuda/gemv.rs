//! The one place that decides which kernel runs a dense bf16 `linear` /
//! `add_linear` of few rows (decode steps), and its launch.
//!
//! [`SmallLinear::kernel_for`] maps (path, rows, inner) to a GEMV kernel or
//! to `None` (cuBLASLt): the choice depends only on the step's shape, so a
//! captured decode graph always replays the kernel it recorded.
//!
//! - [`SmallLinear::Mma`] runs `gemv_mma_*` (kernels/gemv_mma.cu)
//!   for 1..=[`MMA_MAX_ROWS`] rows, tensor cores, 8 outputs per block.
//! - [`SmallLinear::Warp`] (the default): the CUDA-core `gemv_*` kernels (kernels/gemv.cu,
//!   one warp per output) for 1..=[`WARP_MAX_ROWS`] rows (on an H200 the
//!   fastest at 1-2 rows at both the 8B and the MoE shapes).
//! - [`SmallLinear::Cublas`]: no GEMV, every product on cuBLASLt.
//!
//! [`launch3`] runs three products of one x (q, k, v) as one tensor-core
//! GEMV launch.
//!
//! Both GEMV kernels need `inner % 8 == 0` (16-byte rows); other shapes go to
//! cuBLASLt on every path. New backends start from [`SMALL_LINEAR_ENV`].

use super::ops::Dest;
use super::{device_err, CudaBackend};
use crate::{KernelError, Result};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::bf16;

/// The environment variable choosing the small-row path of new backends:
/// `warp` (default), `mma` or `cublas`.
pub const SMALL_LINEAR_ENV: &str = "PAGODA_SMALL_LINEAR";

/// Most rows the tensor-core GEMV takes (its two m16 row halves).
pub const MMA_MAX_ROWS: usize = 16;
/// Most rows the CUDA-core GEMV takes (must match `GEMV_MAX_ROWS`).
pub const WARP_MAX_ROWS: usize = 8;
/// Outputs per `gemv_mma_*` block and its warps (must match gemv_mma.cu).
const MMA_OUTPUTS: usize = 8;
const MMA_WARPS: u32 = 8;
/// Warps per `gemv_bf16` block (must match `GEMV_WARPS`).
const WARP_WARPS: usize = 8;

/// Which kernels run linear layers of few rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SmallLinear {
    /// Tensor-core GEMV up to [`MMA_MAX_ROWS`] rows (measured on an H200:
    /// ahead at 8-16 rows of the MoE shape's small products, behind
    /// cuBLASLt at the 8B shape's; not the default yet).
    Mma,
    /// CUDA-core GEMV (one warp per output) up to [`WARP_MAX_ROWS`] rows.
    #[default]
    Warp,
    /// cuBLASLt at every row count.
    Cublas,
}

/// A GEMV kernel family chosen for one product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemvKernel {
    /// `gemv_mma_bf16` / `gemv_mma_acc_f32`.
    Mma,
    /// `gemv_bf16` / `gemv_bf16_acc_f32`.
    Warp,
}

impl SmallLinear {
    /// The path [`SMALL_LINEAR_ENV`] names (unset, empty or unknown: `Warp`).
    pub fn from_env() -> SmallLinear {
        Self::parse(&std::env::var(SMALL_LINEAR_ENV).unwrap_or_default())
    }

    /// `mma` and `cublas` (any case, trimmed); anything else is `Warp`.
    pub fn parse(v: &str) -> SmallLinear {
        match v.trim().to_ascii_lowercase().as_str() {
            "mma" => SmallLinear::Mma,
            "cublas" => SmallLinear::Cublas,
            _ => SmallLinear::Warp,
        }
    }

    pub(crate) fn to_u8(self) -> u8 {
        match self {
            SmallLinear::Mma => 0,
            SmallLinear::Warp => 1,
            SmallLinear::Cublas => 2,
        }
    }

    pub(crate) fn from_u8(v: u8) -> SmallLinear {
        match v {
            0 => SmallLinear::Mma,
            2 => SmallLinear::Cublas,
            _ => SmallLinear::Warp,
        }
    }

    /// Most rows a product takes a GEMV on this path (0: never).
    pub fn max_gemv_rows(self) -> usize {
        match self {
            SmallLinear::Mma => MMA_MAX_ROWS,
            SmallLinear::Warp => WARP_MAX_ROWS,
            SmallLinear::Cublas => 0,
        }
    }

    /// The GEMV kernel for a product of `rows` x `inner` on this path, or
    /// `None` for cuBLASLt.
    pub fn kernel_for(self, rows: usize, inner: usize) -> Option<GemvKernel> {
        if rows == 0 || inner == 0 || !inner.is_multiple_of(8) {
            return None;
        }
        if rows > self.max_gemv_rows() {
            return None;
        }
        match self {
            SmallLinear::Mma => Some(GemvKernel::Mma),
            SmallLinear::Warp => Some(GemvKernel::Warp),
            SmallLinear::Cublas => None,
        }
    }
}

fn i32_of(v: usize, op: &'static str) -> Result<i32> {
    i32::try_from(v).map_err(|_| KernelError::Shape {
        op,
        detail: format!("{v} does not fit in 32 bits"),
    })
}

/// `dest = x @ w^T (+ bias)` (or `+=` into an f32 `dest`) on kernel `k`, for
/// x `[rows, inner]` and w `[out, inner]` already checked by the caller
/// (`inner % 8 == 0`, rows within `k`'s limit).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch(
    b: &CudaBackend,
    op: &'static str,
    k: GemvKernel,
    (rows, out, inner): (usize, usize, usize),
    xd: &CudaSlice<bf16>,
    wd: &CudaSlice<bf16>,
    bias: Option<&CudaSlice<bf16>>,
    dest: &mut Dest<'_>,
) -> Result<()> {
    let (m, n, kk) = (i32_of(rows, op)?, i32_of(out, op)?, i32_of(inner, op)?);
    let has_bias = i32::from(bias.is_some());
    let (name, cfg) = match (k, &*dest) {
        (GemvKernel::Mma, d) => (
            if matches!(d, Dest::Bf16(_)) {
                "gemv_mma_bf16"
            } else {
                "gemv_mma_acc_f32"
            },
            LaunchConfig {
                grid_dim: (out.div_ceil(MMA_OUTPUTS) as u32, 1, 1),
                block_dim: (32 * MMA_WARPS, 1, 1),
                shared_mem_bytes: 0,
            },
        ),
        (GemvKernel::Warp, d) => (
            if matches!(d, Dest::Bf16(_)) {
                "gemv_bf16"
            } else {
                "gemv_bf16_acc_f32"
            },
            LaunchConfig {
                grid_dim: (out.div_ceil(WARP_WARPS) as u32, 1, 1),
                block_dim: (32 * WARP_WARPS as u32, 1, 1),
                shared_mem_bytes: 0,
            },
        ),
    };
    let mut l = b.dev.stream.launch_builder(b.dev.kernel(name)?);
    match dest {
        Dest::Bf16(y) => l.arg(&mut **y),
        Dest::AccF32(y) => l.arg(&mut **y),
    };
    l.arg(xd)
        .arg(wd)
        .arg(bias.unwrap_or(wd))
        .arg(&has_bias)
        .arg(&m)
        .arg(&n)
        .arg(&kk);
    unsafe { l.launch(cfg) }.map_err(|e| device_err("linear (gemv)", e))?;
    Ok(())
}

/// `outs[i] = x @ w[i]^T (+ bias[i])` for three weights of `dims[i]`
/// outputs and x `[rows, inner]`, all checked by the caller, in one
/// `gemv_mma3_bf16` launch (the tensor-core GEMV's rows and width limits
/// hold: the caller asked [`SmallLinear::kernel_for`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch3(
    b: &CudaBackend,
    op: &'static str,
    (rows, inner): (usize, usize),
    xd: &CudaSlice<bf16>,
    w: [&CudaSlice<bf16>; 3],
    dims: [usize; 3],
    bias: [Option<&CudaSlice<bf16>>; 3],
    outs: [&mut CudaSlice<bf16>; 3],
) -> Result<()> {
    let blocks: usize = dims.iter().map(|n| n.div_ceil(MMA_OUTPUTS)).sum();
    if rows == 0 || blocks == 0 {
        return Ok(());
    }
    let (m, k) = (i32_of(rows, op)?, i32_of(inner, op)?);
    let n = [
        i32_of(dims[0], op)?,
        i32_of(dims[1], op)?,
        i32_of(dims[2], op)?,
    ];
    let mask: i32 = (0..3).filter(|&i| bias[i].is_some()).map(|i| 1 << i).sum();
    let cfg = LaunchConfig {
        grid_dim: (i32_of(blocks, op)? as u32, 1, 1),
        block_dim: (32 * MMA_WARPS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = b.dev.stream.launch_builder(b.dev.kernel("gemv_mma3_bf16")?);
    let [o0, o1, o2] = outs;
    l.arg(o0).arg(o1).arg(o2).arg(xd);
    l.arg(w[0]).arg(w[1]).arg(w[2]);
    // A missing bias is never read: its weight stands in.
    for (bi, wi) in bias.iter().zip(w) {
        l.arg(bi.unwrap_or(wi));
    }
    l.arg(&mask)
        .arg(&m)
        .arg(&n[0])
        .arg(&n[1])
        .arg(&n[2])
        .arg(&k);
    unsafe { l.launch(cfg) }.map_err(|e| device_err("linear3 (gemv)", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_depends_on_shape_and_path_only() {
        let mma = SmallLinear::Mma;
        assert_eq!(mma.kernel_for(1, 4096), Some(GemvKernel::Mma));
        assert_eq!(mma.kernel_for(16, 2048), Some(GemvKernel::Mma));
        assert_eq!(mma.kernel_for(17, 2048), None);
        assert_eq!(mma.kernel_for(4, 4100), None);
        assert_eq!(mma.kernel_for(0, 64), None);
        let warp = SmallLinear::Warp;
        assert_eq!(warp.kernel_for(8, 64), Some(GemvKernel::Warp));
        assert_eq!(warp.kernel_for(9, 64), None);
        assert_eq!(SmallLinear::Cublas.kernel_for(1, 64), None);
    }

    #[test]
    fn env_values_parse() {
        assert_eq!(SmallLinear::parse(""), SmallLinear::Warp);
        assert_eq!(SmallLinear::parse(" Warp "), SmallLinear::Warp);
        assert_eq!(SmallLinear::parse("CUBLAS"), SmallLinear::Cublas);
        assert_eq!(SmallLinear::parse("mma"), SmallLinear::Mma);
        for p in [SmallLinear::Mma, SmallLinear::Warp, SmallLinear::Cublas] {
            assert_eq!(SmallLinear::from_u8(p.to_u8()), p);
        }
    }
}
