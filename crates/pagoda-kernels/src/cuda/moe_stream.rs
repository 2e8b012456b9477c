//! The decode-regime expert GEMMs of [`super::moe`] ([`super::moe::MoePath::Stream`]):
//! the launches of `moe_stream_{gate_up,down}[_fp8]` (see
//! `kernels/moe_stream.cu`), their shared-memory setup, and the
//! environment switch that makes `moe_experts` take them.
//!
//! They replace the grouped path's two GEMMs and keep its grouping (tiles
//! of 16 slots) and combine: a block per (expert, column slice) holds all of
//! the expert's slots (32 a pass) and streams its weight rows once over K
//! in 128-byte stages, so at a few pairs per expert every touched expert's
//! weights are read once per step and untouched experts not at all. Grids
//! are `(E, ceil(N / BN))`, sized from the layer alone (graph-safe; blocks
//! of experts without pairs exit at once).
//!
//! The path is chosen by [`MOE_KERNEL_ENV`]: `stream` where the shape
//! would take the grouped GEMMs at 16-slot tiles (decode-sized chunks) and
//! for FP8 experts past `FP8_GEMV_MAX_ROWS` rows of the GEMV path,
//! `stream-all` there and where it would take the GEMV path (small
//! batches); or forced with `moe_experts_on` (tests and benchmarks).
//! Unset is `stream`.

use super::moe::{Dims, Scratch};
use super::storage::CudaTensor;
use super::CudaBackend;
use crate::{KernelError, Result};
use cudarc::driver::{CudaFunction, CudaView, LaunchConfig};
use std::collections::HashMap;
use std::sync::OnceLock;

/// The environment variable that chooses where `moe_experts` takes the
/// stream kernels: by default (unset, or `stream`) for steps the grouped
/// GEMMs would take at 16-slot tiles (where they measured 1.2-1.5x faster
/// than the grouped GEMMs on an H200, 17-511 rows at the Qwen3-30B-A3B
/// shape) and for FP8 experts' GEMV steps past
/// [`super::moe::FP8_GEMV_MAX_ROWS`] rows (also `auto`); `stream-all` for
/// every GEMV step too (slower at 1-8 rows); `grouped` keeps the paths
/// [`super::moe::MoePath::for_shape`] picks. Any other value is an error
/// (from `CudaBackend::new`).
pub const MOE_KERNEL_ENV: &str = "PAGODA_MOE_KERNEL";

/// What [`MOE_KERNEL_ENV`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamUse {
    Off,
    /// In place of the grouped GEMMs at 16-slot tiles.
    Grouped,
    /// Also in place of the GEMV path.
    All,
}

/// `MS_THREADS` of the kernels.
const THREADS: u32 = 256;
/// Weight rows a block streams (`MS_ROWS`): output columns are this for
/// down and half of it for gate_up (gate and up rows).
const ROWS: usize = 128;
/// Slots a block holds per pass (`MS_SLOTS`).
const SLOTS: usize = 32;
/// Pipeline stages (`MS_STAGES`) and bytes of each weight row a stage
/// holds (`MS_ROW_BYTES`).
const STAGES: usize = 4;
const ROW_BYTES: usize = 128;
/// The grouping's tile height on this path (the kernels find an expert's
/// slots as whole 16-slot tiles).
pub(crate) const TILE_ROWS: usize = 16;

/// What [`MOE_KERNEL_ENV`] asks for (read once per process).
pub(crate) fn from_env() -> Result<StreamUse> {
    static USE: OnceLock<std::result::Result<StreamUse, String>> = OnceLock::new();
    USE.get_or_init(|| {
        let v = std::env::var(MOE_KERNEL_ENV).ok();
        // The message alone: it is wrapped in `Unsupported` again below.
        parse_env(v.as_deref()).map_err(|e| match e {
            KernelError::Unsupported(m) => m,
            e => e.to_string(),
        })
    })
    .clone()
    .map_err(KernelError::Unsupported)
}

fn parse_env(v: Option<&str>) -> Result<StreamUse> {
    let c = [
        ("auto", StreamUse::Grouped),
        ("stream", StreamUse::Grouped),
        ("stream-all", StreamUse::All),
        ("grouped", StreamUse::Off),
    ];
    crate::knob::parse(MOE_KERNEL_ENV, v, &c, StreamUse::Grouped)
}

/// Dynamic shared memory of a block: `STAGES` stages of `ROWS` weight rows
/// of `ROW_BYTES` and of `SLOTS` activation rows over the same k range
/// (bf16: twice the k of a stage in bytes; k is `ROW_BYTES` codes for FP8,
/// half that for bf16). 98,304 bytes for FP8, 81,920 for bf16: within the
/// opt-in limit of every GPU these kernels run on (99 KB on sm_86/89).
pub(crate) fn smem_bytes(fp8: bool) -> usize {
    let k = if fp8 { ROW_BYTES } else { ROW_BYTES / 2 };
    STAGES * (ROWS * ROW_BYTES + SLOTS * 2 * k)
}

/// Lets the four kernels use their dynamic shared memory.
pub(crate) fn configure(kernels: &HashMap<&'static str, CudaFunction>) -> Result<()> {
    super::attention_prefill::raise_smem(
        kernels,
        [
            (Some("moe_stream_gate_up"), smem_bytes(false)),
            (Some("moe_stream_down"), smem_bytes(false)),
            (Some("moe_stream_gate_up_fp8"), smem_bytes(true)),
            (Some("moe_stream_down_fp8"), smem_bytes(true)),
        ],
    )
}

/// Output columns of a block: `ROWS / 2` for gate_up, `ROWS` for down.
fn block_cols(gate_up: bool) -> usize {
    if gate_up {
        ROWS / 2
    } else {
        ROWS
    }
}

/// The stream path's two GEMMs of rows `r0 .. r0 + n`, after `moe_group`
/// grouped them in tiles of [`TILE_ROWS`]: `h[slot, inter]` then
/// `y[slot, hidden]`, as the grouped GEMMs write them. Grid (E, column
/// slices): block x is an expert below E, reading only its own tiles.
pub(crate) fn gemms(
    b: &CudaBackend,
    d: &Dims<'_>,
    x: &CudaTensor,
    s: &mut Scratch,
    weights: &CudaView<'_, f32>,
    r0: usize,
    n: usize,
) -> Result<()> {
    let smem = smem_bytes(d.gate_up.is_fp8()) as u32;
    let cfg = |cols: usize, gate_up: bool| LaunchConfig {
        grid_dim: (d.n_exp as u32, cols.div_ceil(block_cols(gate_up)) as u32, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: smem,
    };
    let names = ["moe_stream_gate_up", "moe_stream_down"];
    super::moe::expert_gemms(b, d, x, s, weights, r0, n, names, cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_stream_values_select_the_stream_kernels() {
        assert_eq!(parse_env(Some("stream")).unwrap(), StreamUse::Grouped);
        assert_eq!(parse_env(Some(" Stream ")).unwrap(), StreamUse::Grouped);
        assert_eq!(parse_env(Some("stream-all")).unwrap(), StreamUse::All);
        assert_eq!(parse_env(None).unwrap(), StreamUse::Grouped);
        assert_eq!(parse_env(Some("grouped")).unwrap(), StreamUse::Off);
        assert_eq!(parse_env(Some(" Grouped ")).unwrap(), StreamUse::Off);
        assert_eq!(parse_env(Some("")).unwrap(), StreamUse::Grouped);
        assert!(parse_env(Some("streams")).is_err());
    }

    #[test]
    fn shared_memory_fits_every_target() {
        assert_eq!(smem_bytes(true), 98_304);
        assert_eq!(smem_bytes(false), 81_920);
        // sm_86/89's opt-in limit per block, less the static arrays.
        assert!(smem_bytes(true) + 2048 <= 101_376);
    }
}
