//! The one place that decides which kernel runs a dense bf16 `linear` /
//! `add_linear` of few rows (decode steps), and its launches.
//!
//! [`SmallLinear::kernel_for`] maps (path, rows, out, inner) to a GEMV
//! kernel or to `None` (cuBLASLt): the choice depends only on the step's
//! shape and the weight's, so a captured decode graph always replays the
//! kernel it recorded.
//!
//! - [`SmallLinear::Auto`] (the default): by rows and weight size, from
//!   H200 measurements: the CUDA-core GEMV at 1 row, and at 2-4 rows of a
//!   weight under [`LARGE_WEIGHT_BYTES`]; the tensor-core GEMV at 5-16 rows
//!   of such a weight; cuBLASLt for the rest (at the Llama-3.1-8B shape
//!   cuBLASLt reads the weights faster from 2 rows up; at the 2,048-wide
//!   MoE shape the CUDA-core GEMV is fastest to 4 rows, the tensor-core one
//!   at 8-16).
//! - [`SmallLinear::Mma`] runs `gemv_mma_*` (kernels/gemv_mma.cu)
//!   for 1..=[`MMA_MAX_ROWS`] rows, tensor cores, 8 outputs per block.
//! - [`SmallLinear::Warp`]: the CUDA-core `gemv_*` kernels (kernels/gemv.cu,
//!   one warp per output) for 1..=[`WARP_MAX_ROWS`] rows.
//! - [`SmallLinear::Cublas`]: no GEMV, every product on cuBLASLt.
//!
//! [`launch3`] runs three products of one x (q, k, v) as one GEMV launch on
//! either kernel; [`launch_silu`] the stacked gate/up product with the
//! gated MLP's SiLU taken into its output (`gemv_silu_bf16`, CUDA-core).
//! RMSNorms run as their own launch: folding one into the next product's
//! input load (every block normalizing its rows) or into the previous
//! residual product's last block both measured slower on an H200
//! (BENCHMARKS.md, "Batch-1 decode: the norms apart").
//!
//! Both GEMV kernels need `inner % 8 == 0` (16-byte rows); other shapes go to
//! cuBLASLt on every path. New backends start from [`SMALL_LINEAR_ENV`].

use super::ops::Dest;
use super::CudaBackend;
use crate::{KernelError, Result};
use cudarc::driver::{CudaSlice, LaunchConfig};
use half::bf16;

/// The environment variable choosing the small-row path of new backends:
/// `auto` (default), `warp`, `mma` or `cublas`.
pub const SMALL_LINEAR_ENV: &str = "PAGODA_SMALL_LINEAR";

/// The environment variable turning the decode fusions of new backends
/// off (`off`, `0` or `false`; `on`, `1`, `true` or `auto` leaves them on;
/// any other value is an error).
pub const DECODE_FUSION_ENV: &str = "PAGODA_DECODE_FUSION";

/// Whether [`DECODE_FUSION_ENV`] leaves the fusions on.
pub(crate) fn fusion_from_env() -> Result<bool> {
    crate::knob::on_off(DECODE_FUSION_ENV, true)
}

/// Most rows the tensor-core GEMV takes (its two m16 row halves).
pub const MMA_MAX_ROWS: usize = 16;
/// Most rows the CUDA-core GEMV takes (must match `GEMV_MAX_ROWS`).
pub const WARP_MAX_ROWS: usize = 8;
/// Outputs per `gemv_mma_*` block and its warps (must match gemv_mma.cu).
const MMA_OUTPUTS: usize = 8;
const MMA_WARPS: u32 = 8;
/// Warps per `gemv_bf16` block (must match `GEMV_WARPS`).
const WARP_WARPS: usize = 8;
/// Weights of at least this many bytes (all three of a `linear3`) take
/// cuBLASLt from 2 rows on the [`SmallLinear::Auto`] path: the Llama-3.1-8B
/// layer's products (32 MiB and up) are over it, the 2,048-wide MoE
/// model's attention products (16-20 MiB) and Qwen3-0.6B's under.
pub const LARGE_WEIGHT_BYTES: usize = 24 << 20;

/// Which kernels run linear layers of few rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SmallLinear {
    /// By rows and weight size ([`SmallLinear::kernel_for`]).
    #[default]
    Auto,
    /// Tensor-core GEMV up to [`MMA_MAX_ROWS`] rows (measured on an H200:
    /// ahead at 8-16 rows of the MoE shape's small products, behind
    /// cuBLASLt at the 8B shape's; not the default yet).
    Mma,
    /// CUDA-core GEMV (one warp per output) up to [`WARP_MAX_ROWS`] rows.
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
    /// The names [`SMALL_LINEAR_ENV`] takes.
    const NAMES: [(&'static str, SmallLinear); 4] = [
        ("auto", SmallLinear::Auto),
        ("warp", SmallLinear::Warp),
        ("mma", SmallLinear::Mma),
        ("cublas", SmallLinear::Cublas),
    ];

    /// The path [`SMALL_LINEAR_ENV`] names (unset or empty: `Auto`; a name
    /// other than `auto`, `warp`, `mma` and `cublas` is an error).
    pub fn from_env() -> Result<SmallLinear> {
        crate::knob::choice(SMALL_LINEAR_ENV, &Self::NAMES, SmallLinear::Auto)
    }

    pub(crate) fn to_u8(self) -> u8 {
        match self {
            SmallLinear::Mma => 0,
            SmallLinear::Warp => 1,
            SmallLinear::Cublas => 2,
            SmallLinear::Auto => 3,
        }
    }

    pub(crate) fn from_u8(v: u8) -> SmallLinear {
        match v {
            0 => SmallLinear::Mma,
            1 => SmallLinear::Warp,
            2 => SmallLinear::Cublas,
            _ => SmallLinear::Auto,
        }
    }

    /// Fewest rows at which some product takes cuBLASLt on this path (its
    /// GEMM plans are warmed up from there).
    pub fn min_cublas_rows(self) -> usize {
        match self {
            SmallLinear::Auto => 2,
            SmallLinear::Mma => MMA_MAX_ROWS + 1,
            SmallLinear::Warp => WARP_MAX_ROWS + 1,
            SmallLinear::Cublas => 1,
        }
    }

    /// The GEMV kernel for a product of `rows` x `inner` by an `[out,
    /// inner]` weight (for `linear3`, `out` the three weights' rows
    /// together) on this path, or `None` for cuBLASLt.
    pub fn kernel_for(self, rows: usize, out: usize, inner: usize) -> Option<GemvKernel> {
        if rows == 0 || inner == 0 || !inner.is_multiple_of(8) {
            return None;
        }
        let large = out.saturating_mul(inner).saturating_mul(2) >= LARGE_WEIGHT_BYTES;
        match self {
            SmallLinear::Mma => (rows <= MMA_MAX_ROWS).then_some(GemvKernel::Mma),
            SmallLinear::Warp => (rows <= WARP_MAX_ROWS).then_some(GemvKernel::Warp),
            SmallLinear::Cublas => None,
            SmallLinear::Auto => match rows {
                1 => Some(GemvKernel::Warp),
                2..=4 if !large => Some(GemvKernel::Warp),
                5..=MMA_MAX_ROWS if !large => Some(GemvKernel::Mma),
                _ => None,
            },
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
    let mut l = b.dev.launch(name)?;
    match dest {
        Dest::Bf16(y) => l.out(&mut **y),
        Dest::AccF32(y) => l.out(&mut **y),
    };
    l.arg(xd)
        .arg(wd)
        .arg(bias.unwrap_or(wd))
        .arg(&has_bias)
        .arg(&m)
        .arg(&n)
        .arg(&kk);
    l.run(cfg)?;
    Ok(())
}

/// `outs[i] = x @ w[i]^T (+ bias[i])` for three weights of `dims[i]`
/// outputs and x `[rows, inner]`, all checked by the caller, in one launch
/// of kernel `k` (`gemv_mma3_bf16` or `gemv3_bf16`; the caller asked
/// [`SmallLinear::kernel_for`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch3(
    b: &CudaBackend,
    op: &'static str,
    k: GemvKernel,
    (rows, inner): (usize, usize),
    x: &CudaSlice<bf16>,
    w: [&CudaSlice<bf16>; 3],
    dims: [usize; 3],
    bias: [Option<&CudaSlice<bf16>>; 3],
    outs: [&mut CudaSlice<bf16>; 3],
) -> Result<()> {
    let per_block = match k {
        GemvKernel::Mma => MMA_OUTPUTS,
        GemvKernel::Warp => WARP_WARPS,
    };
    let blocks: usize = match k {
        GemvKernel::Mma => dims.iter().map(|n| n.div_ceil(per_block)).sum(),
        GemvKernel::Warp => dims.iter().sum::<usize>().div_ceil(per_block),
    };
    if rows == 0 || blocks == 0 {
        return Ok(());
    }
    let (m, kk) = (i32_of(rows, op)?, i32_of(inner, op)?);
    let n = [
        i32_of(dims[0], op)?,
        i32_of(dims[1], op)?,
        i32_of(dims[2], op)?,
    ];
    let mask: i32 = (0..3).filter(|&i| bias[i].is_some()).map(|i| 1 << i).sum();
    let (name, threads) = match k {
        GemvKernel::Mma => ("gemv_mma3_bf16", 32 * MMA_WARPS),
        GemvKernel::Warp => ("gemv3_bf16", 32 * WARP_WARPS as u32),
    };
    let cfg = LaunchConfig {
        grid_dim: (i32_of(blocks, op)? as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = b.dev.launch(name)?;
    let [o0, o1, o2] = outs;
    l.arg(o0).arg(o1).arg(o2).arg(x);
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
        .arg(&kk);
    l.run(cfg)?;
    Ok(())
}

/// `y = silu(h @ gate^T) * (h @ up^T)` for the stacked `[2 * n, inner]`
/// `gate_up` weight, h `[rows, inner]` and y `[rows, n]`, in one
/// `gemv_silu_bf16` launch; shapes checked by the caller, who asked
/// [`SmallLinear::kernel_for`] for the CUDA-core GEMV.
pub(crate) fn launch_silu(
    b: &CudaBackend,
    op: &'static str,
    (rows, n, inner): (usize, usize, usize),
    h: &CudaSlice<bf16>,
    gate_up: &CudaSlice<bf16>,
    y: &mut CudaSlice<bf16>,
) -> Result<()> {
    if rows == 0 || n == 0 {
        return Ok(());
    }
    if rows > WARP_MAX_ROWS {
        return Err(KernelError::Shape {
            op,
            detail: format!("{rows} rows exceed the GEMV's {WARP_MAX_ROWS}"),
        });
    }
    let (m, nn, kk) = (i32_of(rows, op)?, i32_of(n, op)?, i32_of(inner, op)?);
    let cfg = LaunchConfig {
        grid_dim: (i32_of(n.div_ceil(WARP_WARPS), op)? as u32, 1, 1),
        block_dim: (32 * WARP_WARPS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = b.dev.launch("gemv_silu_bf16")?;
    l.arg(y).arg(h).arg(gate_up).arg(&m).arg(&nn).arg(&kk);
    l.run(cfg)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_depends_on_shape_and_path_only() {
        let mma = SmallLinear::Mma;
        assert_eq!(mma.kernel_for(1, 64, 4096), Some(GemvKernel::Mma));
        assert_eq!(mma.kernel_for(16, 1 << 20, 2048), Some(GemvKernel::Mma));
        assert_eq!(mma.kernel_for(17, 64, 2048), None);
        assert_eq!(mma.kernel_for(4, 64, 4100), None);
        assert_eq!(mma.kernel_for(0, 64, 64), None);
        let warp = SmallLinear::Warp;
        assert_eq!(warp.kernel_for(8, 64, 64), Some(GemvKernel::Warp));
        assert_eq!(warp.kernel_for(9, 64, 64), None);
        assert_eq!(SmallLinear::Cublas.kernel_for(1, 64, 64), None);
    }

    /// The default path's decisions at the shapes it was measured on.
    #[test]
    fn auto_choice_by_rows_and_weight_size() {
        let auto = |rows, out, inner| SmallLinear::Auto.kernel_for(rows, out, inner);
        let (w, m) = (Some(GemvKernel::Warp), Some(GemvKernel::Mma));
        // Llama-3.1-8B: qkv together, o_proj, gate_up, down, LM head.
        let l8 = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)];
        for (out, inner) in l8.into_iter().chain([(128256, 4096)]) {
            assert_eq!(auto(1, out, inner), w, "8B {out}x{inner} at 1 row");
            for rows in [2, 3, 4, 8, 16, 17] {
                assert_eq!(auto(rows, out, inner), None, "8B {out}x{inner} at {rows}");
            }
        }
        // Qwen3-0.6B: qkv together, o_proj, gate_up, down; the
        // Qwen3-30B-A3B attention products (hidden 2048).
        let small = [
            (4096, 1024),
            (1024, 2048),
            (6144, 1024),
            (1024, 3072),
            (5120, 2048),
            (2048, 4096),
        ];
        for (out, inner) in small {
            for rows in 1..=4 {
                assert_eq!(auto(rows, out, inner), w, "{out}x{inner} at {rows}");
            }
            for rows in 5..=16 {
                assert_eq!(auto(rows, out, inner), m, "{out}x{inner} at {rows}");
            }
            assert_eq!(auto(17, out, inner), None);
        }
        // A large weight (Qwen3-0.6B's tied LM head) from 2 rows; widths
        // the GEMVs do not take; no rows.
        assert_eq!(auto(1, 151936, 1024), w);
        assert_eq!(auto(2, 151936, 1024), None);
        assert_eq!(auto(1, 64, 1020), None);
        assert_eq!(auto(0, 64, 64), None);
        // The boundary itself.
        let edge = LARGE_WEIGHT_BYTES / 2 / 1024;
        assert_eq!(auto(2, edge - 1, 1024), w);
        assert_eq!(auto(2, edge, 1024), None);
    }

    #[test]
    fn cublas_warm_up_starts_where_cublas_may_run() {
        for p in [
            SmallLinear::Auto,
            SmallLinear::Mma,
            SmallLinear::Warp,
            SmallLinear::Cublas,
        ] {
            let first = (1..=64)
                .find(|&r| p.kernel_for(r, 1 << 20, 4096).is_none())
                .unwrap();
            assert_eq!(p.min_cublas_rows(), first, "{p:?}");
        }
    }

    #[test]
    fn env_values_parse() {
        let parse = |v| crate::knob::parse("K", Some(v), &SmallLinear::NAMES, SmallLinear::Auto);
        assert_eq!(parse("").unwrap(), SmallLinear::Auto);
        assert!(parse("other").is_err());
        assert_eq!(parse(" Warp ").unwrap(), SmallLinear::Warp);
        assert_eq!(parse("CUBLAS").unwrap(), SmallLinear::Cublas);
        assert_eq!(parse("mma").unwrap(), SmallLinear::Mma);
        for p in [
            SmallLinear::Mma,
            SmallLinear::Warp,
            SmallLinear::Cublas,
            SmallLinear::Auto,
        ] {
            assert_eq!(SmallLinear::from_u8(p.to_u8()), p);
        }
    }
}
