//! Mixture-of-experts layers on the device: routing ([`route`]), routes
//! given on the host ([`routes_from_host`]) and the expert MLPs
//! ([`experts`]); the kernels are in `kernels/moe.cu`, whose header gives
//! the algorithms.
//!
//! `experts` takes one of two paths, chosen from the step's shape alone
//! ([`MoePath::for_shape`]), so a captured graph stays valid for any routes:
//!
//! - GEMV (at most [`GEMV_MAX_ROWS`] rows and at most one pair per expert
//!   on average, 16-byte rows): two launches, `moe_gemv_gate_up` (each
//!   pair's gate and up rows streamed by warps, SiLU(gate) * up fused, `[pairs,
//!   inter]`) and `moe_gemv_down` (each row's k down products with the
//!   routing weights, summed in k order in f32 and rounded once). Decode at
//!   small batch is a pass over the chosen experts' weights; this path
//!   streams them without padding or grouping.
//! - Grouped, per chunk of at most [`CHUNK_ROWS`] rows, four launches
//!   ([`MoePath::GroupedGemv`], for timing, swaps the two GEMMs for warps
//!   streaming each expert's rows once per tile of 8 slots;
//!   [`MoePath::Stream`], by default at decode-sized chunks and for FP8
//!   experts past [`FP8_GEMV_MAX_ROWS`] rows (`PAGODA_MOE_KERNEL=grouped`
//!   turns it off), for blocks that hold all of an expert's slots and
//!   stream its weights once, see [`super::moe_stream`]):
//!   `moe_group` (pairs grouped by expert on the device, tiles padded to the
//!   GEMM tile height), the gate_up GEMM with SiLU(gate) * up fused
//!   (`[slots, inter]`), the down GEMM with the routing weight folded in
//!   (`[slots, hidden]`), and `moe_combine_bf16` (each row's k outputs
//!   summed in k order, f32, rounded once).
//!
//! Nothing waits for the device and nothing depends on the routing on the
//! host: every grid is sized from the rows (the grouped GEMMs' at most
//! `ceil(pairs / BM) + min(E, pairs)` tiles; blocks past the real tile
//! count exit), so the launches can be captured in a graph and replayed with
//! other routes. Both paths are deterministic; a row's result depends on
//! the step's row count only through the path (the two round differently:
//! bf16 per pair output in the grouped path, f32 through the combine in the
//! GEMV one). Scratch comes from the step pool like every other op's.
//!
//! Checks, all on the host before any launch: shapes, `1 <= top_k <= E`
//! for routing, `E <= MAX_EXPERTS`, 32-bit index ranges, and that the
//! routes' ids are below the layer's expert count: [`CudaRoutes`] carries a
//! bound on its ids (the router's expert count, or the largest host id +
//! 1). The kernels also drop an out-of-range id (its pair adds nothing),
//! so a bad id can never address memory outside the weights.
//! Host routes may repeat an expert within a row (each pair counts).

use super::launch::Launch;
use super::moe_stream::StreamUse;
use super::pool::DeviceBuf;
use super::storage::{Act, CudaTensor, CudaWeight, WeightBuf};
use super::{device_err, CudaBackend};
use crate::{KernelError, Result};
use cudarc::driver::{CudaSlice, LaunchConfig};

/// Rows per chunk of `experts`: bounds the scratch (about `CHUNK_ROWS *
/// top_k * (hidden + inter) * 2` bytes) and the single-block grouping.
pub(crate) const CHUNK_ROWS: usize = 4096;
/// Largest expert count (the group kernel keeps `10 * E` ints in shared
/// memory, under the 48 KiB a launch gets without opting in).
pub(crate) const MAX_EXPERTS: usize = 1024;
/// `MG_THREADS` of the group kernel.
const GROUP_THREADS: u32 = 256;
/// `MG_WARPS`.
const GROUP_WARPS: usize = 8;
/// Rows per block of the routing kernel (`MR_WARPS`).
const ROUTE_WARPS: usize = 4;
/// Warps of a GEMV block (`MV_WARPS`): output features per block.
const GEMV_WARPS: usize = 8;
/// Most rows the GEMV path takes (with at most one pair per expert on
/// average: past that the grouped GEMMs share each expert's weights).
pub const GEMV_MAX_ROWS: usize = 16;
/// Slots of a grouped-GEMV tile (`MV_BM`).
const GGEMV_BM: usize = 8;
/// Threads of a GEMM block (`MOE_THREADS`) and its column tile (BN).
const GEMM_THREADS: u32 = 128;
const GEMM_BN: usize = 64;

/// The expert choices of a step's rows, on the device.
pub struct CudaRoutes {
    rows: usize,
    top_k: usize,
    /// `[rows, top_k]` expert ids.
    ids: DeviceBuf<i32>,
    /// `[rows, top_k]` routing weights.
    weights: DeviceBuf<f32>,
    /// Every id is below this.
    id_bound: usize,
}

impl std::fmt::Debug for CudaRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaRoutes")
            .field("rows", &self.rows)
            .field("top_k", &self.top_k)
            .field("id_bound", &self.id_bound)
            .finish()
    }
}

impl CudaRoutes {
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn top_k(&self) -> usize {
        self.top_k
    }
}

impl CudaBackend {
    /// The ids and weights of `routes`, row-major `[rows, top_k]` (waits
    /// for the device; for tests and debugging).
    pub fn routes_to_host(&self, routes: &CudaRoutes) -> Result<(Vec<u32>, Vec<f32>)> {
        let n = routes.rows * routes.top_k;
        let ids = self.download_raw(&routes.ids, n)?;
        let weights = self.download_raw(&routes.weights, n)?;
        Ok((ids.into_iter().map(|i| i as u32).collect(), weights))
    }

    /// `moe_experts` on a given path rather than the one the shape picks
    /// (tests and benchmarks compare the two).
    pub fn moe_experts_on(
        &self,
        x: &CudaTensor,
        routes: &CudaRoutes,
        gate_up: &CudaWeight,
        down: &CudaWeight,
        num_experts: usize,
        path: MoePath,
    ) -> Result<CudaTensor> {
        experts_on(self, x, routes, gate_up, down, num_experts, Some(path))
    }
}

fn shape_err(op: &'static str, detail: String) -> KernelError {
    KernelError::Shape { op, detail }
}

fn i32_of(v: usize, op: &'static str) -> Result<i32> {
    i32::try_from(v).map_err(|_| shape_err(op, format!("{v} does not fit in 32 bits")))
}

/// `Backend::moe_route`: softmax, top-k, optional renormalization.
pub(crate) fn route(
    b: &CudaBackend,
    logits: &CudaTensor,
    top_k: usize,
    renormalize: bool,
) -> Result<CudaRoutes> {
    let op = "moe_route";
    let (rows, n_exp) = (logits.rows, logits.cols);
    if top_k == 0 || top_k > n_exp {
        return Err(shape_err(
            op,
            format!("top_k {top_k} for {n_exp} experts (1 ..= experts)"),
        ));
    }
    let n = rows * top_k;
    i32_of(n, op)?;
    let (r, e, k) = (i32_of(rows, op)?, i32_of(n_exp, op)?, top_k as i32);
    let mut ids = b.alloc_i32(n)?;
    let mut weights = b.alloc_f32(n)?;
    if rows > 0 {
        let name = match logits.data {
            Act::Bf16(_) => "moe_route_bf16",
            Act::F32(_) => "moe_route_f32",
        };
        let renorm = i32::from(renormalize);
        let mut l = b.dev.launch(name)?;
        l.arg(&logits.data)
            .arg(&r)
            .arg(&e)
            .arg(&k)
            .arg(&renorm)
            .out(&mut ids)
            .out(&mut weights);
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(ROUTE_WARPS) as u32, 1, 1),
            block_dim: (32 * ROUTE_WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // In bounds: the kernel reads `rows * n_exp` logits (the tensor holds
        // them) and writes `rows * top_k` ids and weights (both buffers hold
        // that many); every id it writes is below `n_exp` (top_k <= n_exp).
        l.run(cfg)?;
    }
    Ok(CudaRoutes {
        rows,
        top_k,
        ids,
        weights,
        id_bound: n_exp,
    })
}

/// `Backend::moe_routes_from_host`: uploads the ids and weights.
pub(crate) fn routes_from_host(
    b: &CudaBackend,
    ids: &[u32],
    weights: &[f32],
    top_k: usize,
) -> Result<CudaRoutes> {
    let op = "moe_routes_from_host";
    if top_k == 0 || ids.len() != weights.len() || !ids.len().is_multiple_of(top_k) {
        return Err(shape_err(
            op,
            format!(
                "{} ids and {} weights for top_k {top_k} (equal counts, a multiple of top_k >= 1)",
                ids.len(),
                weights.len()
            ),
        ));
    }
    i32_of(ids.len(), op)?;
    let id_bound = match ids.iter().max() {
        Some(&m) => i32_of(m as usize, op)? as usize + 1,
        None => 0,
    };
    let n = ids.len();
    let mut d_ids = b.alloc_i32(n)?;
    let mut d_w = b.alloc_f32(n)?;
    if n > 0 {
        let host_ids: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
        let stream = &b.dev.stream;
        stream
            .memcpy_htod(&host_ids, &mut d_ids.slice_mut(..n))
            .map_err(|e| device_err(op, e))?;
        stream
            .memcpy_htod(weights, &mut d_w.slice_mut(..n))
            .map_err(|e| device_err(op, e))?;
    }
    Ok(CudaRoutes {
        rows: n / top_k,
        top_k,
        ids: d_ids,
        weights: d_w,
        id_bound,
    })
}

/// A stacked expert weight as the kernels take it: bf16 elements, or FP8
/// codes with one f32 scale per row (the kernels named `..._fp8`).
#[derive(Clone, Copy)]
pub(super) enum ExpertWeight<'a> {
    Bf16(&'a CudaSlice<half::bf16>),
    Fp8 {
        codes: &'a CudaSlice<u8>,
        scales: &'a CudaSlice<f32>,
    },
}

/// The scale argument of the bf16 kernels, which never read it: null.
static NO_SCALES: u64 = 0;

impl<'a> ExpertWeight<'a> {
    fn of(w: &'a CudaWeight, what: &str) -> Result<Self> {
        match &w.data {
            WeightBuf::Bf16(d) => Ok(ExpertWeight::Bf16(d)),
            WeightBuf::Fp8 { codes, scales } => Ok(ExpertWeight::Fp8 { codes, scales }),
            WeightBuf::F32(_) => Err(shape_err(
                "moe_experts",
                format!("{what} is an f32 table (expected bf16 or FP8 expert weights)"),
            )),
        }
    }

    pub(super) fn is_fp8(self) -> bool {
        matches!(self, ExpertWeight::Fp8 { .. })
    }

    /// Pushes the weight and its scales: two kernel arguments.
    pub(super) fn push<'l>(self, l: &mut Launch<'l>)
    where
        'a: 'l,
    {
        match self {
            ExpertWeight::Bf16(d) => l.arg(d).arg(&NO_SCALES),
            ExpertWeight::Fp8 { codes, scales } => l.arg(codes).arg(scales),
        };
    }
}

/// The FP8-weight variant of expert kernel `base` (no allocation on the
/// launch path).
fn fp8_kernel(base: &str) -> Option<&'static str> {
    Some(match base {
        "moe_gemm_gate_up_m64" => "moe_gemm_gate_up_m64_fp8",
        "moe_gemm_gate_up_m16" => "moe_gemm_gate_up_m16_fp8",
        "moe_gemm_down_m64" => "moe_gemm_down_m64_fp8",
        "moe_gemm_down_m16" => "moe_gemm_down_m16_fp8",
        "moe_gemm_gate_up_m128" => "moe_gemm_gate_up_m128_fp8",
        "moe_gemm_down_m128" => "moe_gemm_down_m128_fp8",
        "moe_gemv_gate_up" => "moe_gemv_gate_up_fp8",
        "moe_gemv_down" => "moe_gemv_down_fp8",
        "moe_ggemv_gate_up" => "moe_ggemv_gate_up_fp8",
        "moe_ggemv_down" => "moe_ggemv_down_fp8",
        "moe_stream_gate_up" => "moe_stream_gate_up_fp8",
        "moe_stream_down" => "moe_stream_down_fp8",
        _ => return None,
    })
}

/// The layer's sizes, checked, and its weights.
pub(super) struct Dims<'a> {
    pub(super) rows: usize,
    pub(super) hidden: usize,
    pub(super) inter: usize,
    pub(super) n_exp: usize,
    pub(super) top_k: usize,
    pub(super) gate_up: ExpertWeight<'a>,
    pub(super) down: ExpertWeight<'a>,
}

impl Dims<'_> {
    /// The kernel `base` for these weights (`base_fp8` for FP8 ones).
    pub(super) fn kernel_name(&self, base: &'static str) -> Result<&'static str> {
        if !self.gate_up.is_fp8() {
            return Ok(base);
        }
        fp8_kernel(base)
            .ok_or_else(|| KernelError::Device(format!("no FP8 variant of kernel {base}")))
    }
}

fn check<'a>(
    x: &CudaTensor,
    routes: &CudaRoutes,
    gate_up: &'a CudaWeight,
    down: &'a CudaWeight,
    n_exp: usize,
) -> Result<Dims<'a>> {
    let op = "moe_experts";
    x.bf16(op)?;
    let (gu_w, dn_w) = (
        ExpertWeight::of(gate_up, "gate_up")?,
        ExpertWeight::of(down, "down")?,
    );
    if gu_w.is_fp8() != dn_w.is_fp8() {
        return Err(shape_err(
            op,
            "gate_up and down must both be bf16 or both FP8".into(),
        ));
    }
    let (rows, hidden) = (x.rows, x.cols);
    if n_exp == 0 || n_exp > MAX_EXPERTS {
        return Err(shape_err(
            op,
            format!("{n_exp} experts (1 ..= {MAX_EXPERTS})"),
        ));
    }
    if routes.rows != rows {
        return Err(shape_err(
            op,
            format!("routes for {} rows, x has {rows}", routes.rows),
        ));
    }
    if routes.id_bound > n_exp {
        return Err(shape_err(
            op,
            format!(
                "a route names expert {} of a layer of {n_exp} experts",
                routes.id_bound - 1
            ),
        ));
    }
    if gate_up.cols != hidden || !gate_up.rows.is_multiple_of(2 * n_exp) {
        return Err(shape_err(
            op,
            format!(
                "gate_up is [{}, {}], expected [{n_exp} * 2 * inter, {hidden}]",
                gate_up.rows, gate_up.cols
            ),
        ));
    }
    let inter = gate_up.rows / (2 * n_exp);
    if (down.rows, down.cols) != (n_exp * hidden, inter) {
        return Err(shape_err(
            op,
            format!(
                "down is [{}, {}], expected [{}, {inter}]",
                down.rows,
                down.cols,
                n_exp * hidden
            ),
        ));
    }
    // Every index the kernels form: slots * width and weight rows * width
    // are 64-bit there; counts and widths must fit in 32 bits.
    // (The grouped GEMV's 8-slot tiles never need more slots than 16-slot ones.)
    let (_, slots) = capacity(rows, routes.top_k, n_exp, None);
    for v in [
        rows * routes.top_k,
        slots,
        hidden,
        inter,
        gate_up.rows,
        down.rows,
    ] {
        i32_of(v, op)?;
    }
    if hidden.max(inter).div_ceil(GEMM_BN) > 65535 {
        return Err(shape_err(
            op,
            format!("hidden {hidden} / inter {inter}: too many column blocks"),
        ));
    }
    Ok(Dims {
        rows,
        hidden,
        inter,
        n_exp,
        top_k: routes.top_k,
        gate_up: gu_w,
        down: dn_w,
    })
}

/// Tiles of height `bm` that `pairs` pairs over `n_exp` experts can need:
/// each expert's last tile may be partial.
fn max_tiles(pairs: usize, n_exp: usize, bm: usize) -> usize {
    pairs.div_ceil(bm) + n_exp.min(pairs)
}

/// The tile height for a chunk: 16 while the average expert gets fewer than
/// 32 pairs (decode), 64 below [`M128_PAIRS`] pairs an expert, 128 from
/// there (prefill-sized chunks). Depends only on the shape.
fn tile_rows(pairs: usize, n_exp: usize) -> usize {
    if pairs < 32 * n_exp {
        16
    } else if pairs < M128_PAIRS * n_exp {
        64
    } else {
        128
    }
}

/// Average pairs an expert from which chunks take the 128-row tiles: the
/// padding of each expert's last tile (half a tile on average) stays under
/// a third of its rows, while each block reads half as many weight bytes
/// per product from L2 (where the 64-row tiles were bound: BENCHMARKS.md).
const M128_PAIRS: usize = 192;

/// Threads of the 128-row GEMM blocks (8 warps).
const M128_THREADS: u32 = 256;

/// Output columns of a 128-row block: 64 of gate and of up for gate_up,
/// 128 for down.
fn m128_cols(gate_up: bool) -> usize {
    if gate_up {
        64
    } else {
        128
    }
}

/// Dynamic shared memory of a 128-row GEMM block (`MoeGemmSmem<W, 128, BN,
/// 4, MODE>::BYTES` in kernels/moe.cu: both modes stream 128 weight rows):
/// 4 stages of the 128 x (32 + 8) bf16 A tile, and of the bf16 B tile
/// (bf16 weights) or of the 128 x (32 + 16)-byte code tile plus one
/// widened bf16 B tile (FP8).
pub(crate) fn m128_smem_bytes(fp8: bool) -> usize {
    const STAGES: usize = 4;
    let tile = 128 * (32 + 8) * 2;
    let a = STAGES * tile;
    if fp8 {
        a + tile + STAGES * 128 * (32 + 16)
    } else {
        a + STAGES * tile + 16
    }
}

/// Lets the 128-row GEMM kernels use their dynamic shared memory.
pub(crate) fn configure(
    kernels: &std::collections::HashMap<&'static str, cudarc::driver::CudaFunction>,
) -> Result<()> {
    super::attention_prefill::raise_smem(
        kernels,
        [
            (Some("moe_gemm_gate_up_m128"), m128_smem_bytes(false)),
            (Some("moe_gemm_down_m128"), m128_smem_bytes(false)),
            (Some("moe_gemm_gate_up_m128_fp8"), m128_smem_bytes(true)),
            (Some("moe_gemm_down_m128_fp8"), m128_smem_bytes(true)),
        ],
    )
}

/// The launch shape of a chunk of `n` rows: its pairs, tile height and
/// tile bound (the GEMM grid's x extent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ChunkPlan {
    pairs: usize,
    bm: usize,
    tiles: usize,
}

/// `fixed`: the path's own tile height (see [`fixed_tile_rows`]), else
/// [`tile_rows`].
fn plan(n: usize, top_k: usize, n_exp: usize, fixed: Option<usize>) -> ChunkPlan {
    let pairs = n * top_k;
    let bm = fixed.unwrap_or_else(|| tile_rows(pairs, n_exp));
    ChunkPlan {
        pairs,
        bm,
        tiles: max_tiles(pairs, n_exp, bm),
    }
}

/// Scratch that serves every chunk of `rows` rows: `(meta ints, slots)`,
/// the largest over the full chunk and the remainder (the only two shapes).
fn capacity(rows: usize, top_k: usize, n_exp: usize, fixed: Option<usize>) -> (usize, usize) {
    let full = plan(CHUNK_ROWS.min(rows), top_k, n_exp, fixed);
    let rest = plan(rows % CHUNK_ROWS, top_k, n_exp, fixed);
    (
        1 + full.tiles.max(rest.tiles),
        (full.tiles * full.bm).max(rest.tiles * rest.bm),
    )
}

/// How `moe_experts` computes a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoePath {
    /// One pass over each pair's expert rows, combine fused.
    Gemv,
    /// Pairs grouped by expert, tensor-core GEMMs, then the combine.
    Grouped,
    /// Pairs grouped by expert in tiles of [`GGEMV_BM`], each expert's rows
    /// streamed once per tile by warps (no tensor cores), then the combine.
    /// Never chosen by the shape yet: for timing against `Grouped` at
    /// batches with a few pairs per expert.
    GroupedGemv,
    /// Pairs grouped by expert in tiles of 16, a block per (expert, column
    /// slice) holding all of the expert's slots and streaming its weights
    /// once over K (see [`super::moe_stream`]), then the combine. Taken
    /// where the shape picks `Grouped` at 16-slot tiles unless
    /// [`super::moe_stream::MOE_KERNEL_ENV`] says `grouped`.
    Stream,
}

/// The tile height a path groups by, where it is its own: the grouped
/// GEMV's [`GGEMV_BM`], the stream kernels' 16; `None`: [`tile_rows`].
fn fixed_tile_rows(path: MoePath) -> Option<usize> {
    match path {
        MoePath::GroupedGemv => Some(GGEMV_BM),
        MoePath::Stream => Some(super::moe_stream::TILE_ROWS),
        MoePath::Gemv | MoePath::Grouped => None,
    }
}

impl MoePath {
    /// The path for `rows` rows of `top_k` pairs over `n_exp` experts of
    /// the given widths: GEMV for at most [`GEMV_MAX_ROWS`] rows whose pairs
    /// number at most the experts (or `top_k`), when both widths are
    /// multiples of 8 (16-byte rows); grouped otherwise. Depends only on
    /// the shape.
    pub fn for_shape(
        rows: usize,
        top_k: usize,
        n_exp: usize,
        hidden: usize,
        inter: usize,
    ) -> MoePath {
        let aligned = hidden.is_multiple_of(8) && inter.is_multiple_of(8);
        if aligned && rows <= GEMV_MAX_ROWS && rows * top_k <= n_exp.max(top_k) {
            MoePath::Gemv
        } else {
            MoePath::Grouped
        }
    }
}

impl MoePath {
    /// The path `moe_experts` takes: [`MoePath::for_shape`]'s, with the
    /// stream kernels in place of the grouped GEMMs where
    /// [`super::moe_stream::MOE_KERNEL_ENV`] (read once) lets them, and in
    /// place of the GEMV past [`FP8_GEMV_MAX_ROWS`] rows of FP8 experts.
    pub fn chosen(
        rows: usize,
        top_k: usize,
        n_exp: usize,
        (hidden, inter): (usize, usize),
        fp8: bool,
    ) -> MoePath {
        stream_or(
            MoePath::for_shape(rows, top_k, n_exp, hidden, inter),
            (rows, top_k, n_exp),
            fp8,
            // A bad value stops `CudaBackend::new`: no step gets here with one.
            super::moe_stream::from_env().unwrap_or(super::moe_stream::StreamUse::Grouped),
        )
    }
}

/// Most rows FP8 experts take the GEMV path for where the stream kernels
/// are on: from 12 rows the FP8 stream kernels measured faster at the
/// Qwen3-30B-A3B shape on an H200 (144.7 against 168.0 us a layer at 12
/// rows, 166.4 against 223.4 at 16; 125.2 against 114.8 at 8), while bf16
/// experts keep the GEMV to [`GEMV_MAX_ROWS`] (257.9 against 266.7 us at
/// 16 rows, 222.4 against 203.6 at 12: BENCHMARKS.md).
pub const FP8_GEMV_MAX_ROWS: usize = 8;

/// The stream path where `stream` asks for it in place of `auto`: grouped
/// steps of decode-sized chunks (16-slot tiles), GEMV steps of FP8 experts
/// past [`FP8_GEMV_MAX_ROWS`] rows, and with [`StreamUse::All`] every GEMV
/// step. Depends only on the shape and the weights' type.
fn stream_or(
    auto: MoePath,
    (rows, top_k, n_exp): (usize, usize, usize),
    fp8: bool,
    stream: StreamUse,
) -> MoePath {
    let decode = tile_rows(CHUNK_ROWS.min(rows) * top_k, n_exp) == 16;
    let on = matches!(stream, StreamUse::Grouped | StreamUse::All);
    match (auto, stream) {
        (MoePath::Grouped, _) if on && decode => MoePath::Stream,
        (MoePath::Gemv, StreamUse::All) => MoePath::Stream,
        (MoePath::Gemv, _) if on && fp8 && rows > FP8_GEMV_MAX_ROWS => MoePath::Stream,
        _ => auto,
    }
}

/// `Backend::moe_experts`.
pub(crate) fn experts(
    b: &CudaBackend,
    x: &CudaTensor,
    routes: &CudaRoutes,
    gate_up: &CudaWeight,
    down: &CudaWeight,
    n_exp: usize,
) -> Result<CudaTensor> {
    experts_on(b, x, routes, gate_up, down, n_exp, None)
}

/// [`experts`] on the given path (`None`: [`MoePath::for_shape`]); the
/// GEMV path refuses widths that are not multiples of 8.
pub(crate) fn experts_on(
    b: &CudaBackend,
    x: &CudaTensor,
    routes: &CudaRoutes,
    gate_up: &CudaWeight,
    down: &CudaWeight,
    n_exp: usize,
    path: Option<MoePath>,
) -> Result<CudaTensor> {
    let op = "moe_experts";
    let d = check(x, routes, gate_up, down, n_exp)?;
    let path = path.unwrap_or_else(|| {
        MoePath::chosen(
            d.rows,
            d.top_k,
            n_exp,
            (d.hidden, d.inter),
            d.gate_up.is_fp8(),
        )
    });
    let any_width = matches!(path, MoePath::Grouped | MoePath::Stream);
    let aligned = d.hidden.is_multiple_of(8) && d.inter.is_multiple_of(8);
    if !any_width && !aligned {
        return Err(shape_err(
            op,
            format!(
                "the {path:?} path needs hidden ({}) and inter ({}) multiples of 8",
                d.hidden, d.inter
            ),
        ));
    }
    let mut out = b.output(d.rows, d.hidden)?;
    if d.rows == 0 || d.hidden == 0 {
        return Ok(out);
    }
    if d.inter == 0 {
        // Every expert is the zero map.
        super::ops::fill(b, out.bf16_mut(op)?, d.rows * d.hidden, 0)?;
        return Ok(out);
    }
    if path == MoePath::Gemv {
        gemv(b, &d, x, routes, &mut out)?;
        return Ok(out);
    }
    // Scratch for every chunk, reused by the next (stream order).
    let (meta, slots) = capacity(d.rows, d.top_k, n_exp, fixed_tile_rows(path));
    let mut s = Scratch {
        meta: b.alloc_i32(meta)?,
        slot_pair: b.alloc_i32(slots)?,
        pair_slot: b.alloc_i32(CHUNK_ROWS.min(d.rows) * d.top_k)?,
        h: b.alloc_bf16(slots * d.inter)?,
        y: b.alloc_bf16(slots * d.hidden)?,
    };
    let mut r0 = 0;
    while r0 < d.rows {
        let n = CHUNK_ROWS.min(d.rows - r0);
        run_chunk(b, &d, x, routes, &mut out, &mut s, r0, n, path)?;
        r0 += n;
    }
    Ok(out)
}

/// The GEMV path's two launches over all rows (widths multiples of 8).
fn gemv(
    b: &CudaBackend,
    d: &Dims<'_>,
    x: &CudaTensor,
    routes: &CudaRoutes,
    out: &mut CudaTensor,
) -> Result<()> {
    let op = "moe_experts";
    let pairs = d.rows * d.top_k;
    if pairs > 65535 || d.rows > 65535 {
        return Err(shape_err(
            op,
            format!("{pairs} pairs: too many for the GEMV path"),
        ));
    }
    let (k_i, e_i, hid_i, int_i) = (
        d.top_k as i32,
        i32_of(d.n_exp, op)?,
        i32_of(d.hidden, op)?,
        i32_of(d.inter, op)?,
    );
    let mut h = b.alloc_bf16(pairs * d.inter)?;
    let cfg = |cols: usize, y: usize| LaunchConfig {
        grid_dim: (cols.div_ceil(GEMV_WARPS) as u32, y as u32, 1),
        block_dim: (32 * GEMV_WARPS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    {
        let mut l = b.dev.launch(d.kernel_name("moe_gemv_gate_up")?)?;
        l.out(&mut h).arg(x.bf16(op)?);
        d.gate_up.push(&mut l);
        l.arg(&routes.ids)
            .arg(&k_i)
            .arg(&e_i)
            .arg(&int_i)
            .arg(&hid_i);
        // In bounds: reads `pairs` ids (the routes hold rows * top_k); an id
        // below E addresses gate_up rows below E * 2 * inter (checked
        // against the weight), others are skipped; x rows pair / top_k <
        // rows; writes h[pairs, inter] (allocated so). Rows are 16-byte
        // aligned: widths are multiples of 8 and buffers 512-byte aligned.
        l.run(cfg(d.inter, pairs))?;
    }
    {
        let mut l = b.dev.launch(d.kernel_name("moe_gemv_down")?)?;
        l.out(out.bf16_mut(op)?).arg(&h);
        d.down.push(&mut l);
        l.arg(&routes.ids)
            .arg(&routes.weights)
            .arg(&k_i)
            .arg(&e_i)
            .arg(&hid_i)
            .arg(&int_i);
        // In bounds: reads ids and weights below rows * top_k, h rows below
        // pairs, down rows below E * hidden (other ids read expert 0's row
        // and add nothing); writes out[rows, hidden].
        l.run(cfg(d.hidden, d.rows))?;
    }
    Ok(())
}

/// `Backend::sigmoid_gate_rows`: `x[r, :] *= sigmoid(gate[r, 0])`.
pub(crate) fn sigmoid_gate_rows(
    b: &CudaBackend,
    x: &mut CudaTensor,
    gate: &CudaTensor,
) -> Result<()> {
    let op = "sigmoid_gate_rows";
    if gate.rows != x.rows || gate.cols == 0 {
        return Err(shape_err(
            op,
            format!(
                "gate is [{}, {}] for {} rows (want [rows, >= 1])",
                gate.rows, gate.cols, x.rows
            ),
        ));
    }
    let (rows, cols) = (x.rows, x.cols);
    i32_of(rows * cols, op)?;
    i32_of(rows * gate.cols, op)?;
    let (r_i, c_i, g_i) = (rows as i32, cols as i32, gate.cols as i32);
    let n = rows * cols;
    let xd = x.bf16_mut(op)?;
    if n == 0 {
        return Ok(());
    }
    let name = match gate.data {
        Act::Bf16(_) => "moe_sigmoid_gate_bf16",
        Act::F32(_) => "moe_sigmoid_gate_f32",
    };
    let mut l = b.dev.launch(name)?;
    l.arg(xd).arg(&gate.data).arg(&r_i).arg(&c_i).arg(&g_i);
    // In bounds: writes rows * cols elements of x (it holds them); reads gate
    // at r * gate_cols for r < rows (it holds rows * gate_cols).
    l.run(super::ops::elems_cfg(n))?;
    Ok(())
}

/// Scratch of one chunk (see `kernels/moe.cu` for the layouts).
pub(super) struct Scratch {
    pub(super) meta: DeviceBuf<i32>,
    pub(super) slot_pair: DeviceBuf<i32>,
    pub(super) pair_slot: DeviceBuf<i32>,
    pub(super) h: DeviceBuf<half::bf16>,
    pub(super) y: DeviceBuf<half::bf16>,
}

/// The four launches of rows `r0 .. r0 + n`.
#[allow(clippy::too_many_arguments)]
fn run_chunk(
    b: &CudaBackend,
    d: &Dims<'_>,
    x: &CudaTensor,
    routes: &CudaRoutes,
    out: &mut CudaTensor,
    s: &mut Scratch,
    r0: usize,
    n: usize,
    path: MoePath,
) -> Result<()> {
    let op = "moe_experts";
    let ChunkPlan { pairs, bm, tiles } = plan(n, d.top_k, d.n_exp, fixed_tile_rows(path));
    let (p_i, e_i, bm_i, k_i) = (
        i32_of(pairs, op)?,
        i32_of(d.n_exp, op)?,
        bm as i32,
        d.top_k as i32,
    );
    let (hid_i, rows_i) = (i32_of(d.hidden, op)?, i32_of(n, op)?);
    let q0 = r0 * d.top_k;
    let ids = routes.ids.slice(q0..q0 + pairs);
    let weights = routes.weights.slice(q0..q0 + pairs);

    // Grouping: one block.
    {
        let mut l = b.dev.launch("moe_group")?;
        l.arg(&ids)
            .arg(&p_i)
            .arg(&e_i)
            .arg(&bm_i)
            .out(&mut s.meta)
            .out(&mut s.slot_pair)
            .out(&mut s.pair_slot);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (GROUP_THREADS, 1, 1),
            shared_mem_bytes: ((2 + GROUP_WARPS) * d.n_exp * 4) as u32,
        };
        // In bounds: reads `pairs` ids; writes meta[0 ..= tiles] (the padded
        // counts of `pairs` pairs fill at most `tiles` tiles of `bm`),
        // slot_pair below `tiles * bm` and pair_slot below `pairs`, all
        // inside the scratch (`capacity` covers every chunk's plan);
        // shared memory is 10 * E ints.
        l.run(cfg)?;
    }

    match path {
        MoePath::GroupedGemv => grouped_gemv(b, d, x, s, &weights, r0, n, tiles)?,
        MoePath::Stream => super::moe_stream::gemms(b, d, x, s, &weights, r0, n)?,
        MoePath::Gemv | MoePath::Grouped => grouped_gemm(b, d, x, s, &weights, r0, n, bm, tiles)?,
    }
    // Combine the k outputs of each row.
    {
        let mut od = out
            .bf16_mut(op)?
            .slice_mut(r0 * d.hidden..(r0 + n) * d.hidden);
        let mut l = b.dev.launch("moe_combine_bf16")?;
        l.out(&mut od)
            .arg(&s.y)
            .arg(&s.pair_slot)
            .arg(&rows_i)
            .arg(&k_i)
            .arg(&hid_i);
        // In bounds: writes n * hidden outputs (the view holds them), reads
        // pair_slot below `pairs` and y rows below tiles * bm.
        l.run(super::ops::elems_cfg(n * d.hidden))?;
    }
    Ok(())
}

/// How the grouped GEMMs of one tile height launch: the gate_up and down
/// kernels, threads a block, dynamic shared memory, and output columns a
/// block of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct GemmLaunch {
    names: [&'static str; 2],
    threads: u32,
    smem: u32,
    cols: [usize; 2],
}

impl GemmLaunch {
    /// The kernels of tile height `bm` (16, 64 or 128, [`tile_rows`]).
    fn for_tile_rows(bm: usize, fp8: bool) -> Self {
        match bm {
            128 => GemmLaunch {
                names: ["moe_gemm_gate_up_m128", "moe_gemm_down_m128"],
                threads: M128_THREADS,
                smem: m128_smem_bytes(fp8) as u32,
                cols: [m128_cols(true), m128_cols(false)],
            },
            16 => GemmLaunch {
                names: ["moe_gemm_gate_up_m16", "moe_gemm_down_m16"],
                threads: GEMM_THREADS,
                smem: 0,
                cols: [GEMM_BN; 2],
            },
            _ => GemmLaunch {
                names: ["moe_gemm_gate_up_m64", "moe_gemm_down_m64"],
                threads: GEMM_THREADS,
                smem: 0,
                cols: [GEMM_BN; 2],
            },
        }
    }
}

/// The grouped path's two tensor-core GEMMs of rows `r0 .. r0 + n`.
#[allow(clippy::too_many_arguments)]
fn grouped_gemm(
    b: &CudaBackend,
    d: &Dims<'_>,
    x: &CudaTensor,
    s: &mut Scratch,
    weights: &cudarc::driver::CudaView<'_, f32>,
    r0: usize,
    n: usize,
    bm: usize,
    tiles: usize,
) -> Result<()> {
    let g = GemmLaunch::for_tile_rows(bm, d.gate_up.is_fp8());
    // The grid's x extent is `tiles`, the bound meta[0] stays under.
    let cfg = |cols: usize, gate_up: bool| LaunchConfig {
        grid_dim: (
            tiles as u32,
            cols.div_ceil(g.cols[usize::from(!gate_up)]) as u32,
            1,
        ),
        block_dim: (g.threads, 1, 1),
        shared_mem_bytes: g.smem,
    };
    expert_gemms(b, d, x, s, weights, r0, n, g.names, cfg)
}

/// The two expert GEMMs of rows `r0 .. r0 + n` after `moe_group` grouped
/// them, with the arguments the grouped and the stream kernels share:
/// `names[0]` (gate_up with SiLU(gate) * up, `h[slot, inter]`) then
/// `names[1]` (down with the routing weight, `y[slot, hidden]`), each grid
/// sized by `cfg(output columns, is gate_up)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn expert_gemms(
    b: &CudaBackend,
    d: &Dims<'_>,
    x: &CudaTensor,
    s: &mut Scratch,
    weights: &cudarc::driver::CudaView<'_, f32>,
    r0: usize,
    n: usize,
    names: [&'static str; 2],
    cfg: impl Fn(usize, bool) -> LaunchConfig,
) -> Result<()> {
    let op = "moe_experts";
    let (hid_i, int_i, k_i) = (i32_of(d.hidden, op)?, i32_of(d.inter, op)?, d.top_k as i32);
    let vec_k = |k: usize| i32::from(k.is_multiple_of(8));
    // gate_up with SiLU(gate) * up: h[slot, inter].
    {
        let vec = vec_k(d.hidden);
        let xd = x.bf16(op)?.slice(r0 * d.hidden..(r0 + n) * d.hidden);
        let mut l = b.dev.launch(d.kernel_name(names[0])?)?;
        l.out(&mut s.h).arg(&xd);
        d.gate_up.push(&mut l);
        l.arg(&s.meta)
            .arg(&s.slot_pair)
            .arg(weights)
            .arg(&k_i)
            .arg(&int_i)
            .arg(&hid_i)
            .arg(&vec);
        // In bounds: a block works only on tiles below meta[0] (the group
        // kernel's tile count, within the scratch), whose experts are below
        // E (the group kernel drops other ids), so gate_up rows stay below
        // E * 2 * inter (checked against the weight); x rows are pair /
        // top_k < n; h rows are the tiles' slots (the scratch holds every
        // tile's). Dynamic shared memory, where `cfg` asks for it, was
        // raised at load.
        l.run(cfg(d.inter, true))?;
    }
    // down with the routing weight: y[slot, hidden].
    {
        let vec = vec_k(d.inter);
        let mut l = b.dev.launch(d.kernel_name(names[1])?)?;
        l.out(&mut s.y).arg(&s.h);
        d.down.push(&mut l);
        l.arg(&s.meta)
            .arg(&s.slot_pair)
            .arg(weights)
            .arg(&k_i)
            .arg(&hid_i)
            .arg(&int_i)
            .arg(&vec);
        // In bounds: as for gate_up: down rows below E * hidden, h and y rows
        // the tiles' slots, weights read at pair indices below `pairs`.
        l.run(cfg(d.hidden, false))?;
    }
    Ok(())
}

/// The grouped GEMV's two launches of rows `r0 .. r0 + n` (tiles of
/// [`GGEMV_BM`] slots; widths multiples of 8).
#[allow(clippy::too_many_arguments)]
fn grouped_gemv(
    b: &CudaBackend,
    d: &Dims<'_>,
    x: &CudaTensor,
    s: &mut Scratch,
    weights: &cudarc::driver::CudaView<'_, f32>,
    r0: usize,
    n: usize,
    tiles: usize,
) -> Result<()> {
    let op = "moe_experts";
    if tiles > 65535 {
        return Err(shape_err(
            op,
            format!("{tiles} tiles: too many for the grouped GEMV path"),
        ));
    }
    let (hid_i, int_i, k_i) = (i32_of(d.hidden, op)?, i32_of(d.inter, op)?, d.top_k as i32);
    let cfg = |cols: usize| LaunchConfig {
        grid_dim: (cols.div_ceil(GEMV_WARPS) as u32, tiles as u32, 1),
        block_dim: (32 * GEMV_WARPS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    {
        let xd = x.bf16(op)?.slice(r0 * d.hidden..(r0 + n) * d.hidden);
        let mut l = b.dev.launch(d.kernel_name("moe_ggemv_gate_up")?)?;
        l.out(&mut s.h).arg(&xd);
        d.gate_up.push(&mut l);
        l.arg(&s.meta)
            .arg(&s.slot_pair)
            .arg(&k_i)
            .arg(&int_i)
            .arg(&hid_i);
        // In bounds: as for the grouped GEMMs: tiles below meta[0] name experts
        // below E, slots below tiles * GGEMV_BM (the scratch holds them),
        // x rows pair / top_k < n; rows are 16-byte aligned (widths are
        // multiples of 8, buffers 512-byte aligned).
        l.run(cfg(d.inter))?;
    }
    {
        let mut l = b.dev.launch(d.kernel_name("moe_ggemv_down")?)?;
        l.out(&mut s.y).arg(&s.h);
        d.down.push(&mut l);
        l.arg(&s.meta)
            .arg(&s.slot_pair)
            .arg(weights)
            .arg(&hid_i)
            .arg(&int_i);
        // In bounds: down rows below E * hidden, h and y rows below tiles *
        // GGEMV_BM, weights read at pair indices below `pairs`.
        l.run(cfg(d.hidden))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_expert_kernel_has_a_loaded_fp8_variant() {
        let bases = [
            "moe_gemm_gate_up_m64",
            "moe_gemm_gate_up_m16",
            "moe_gemm_down_m64",
            "moe_gemm_down_m16",
            "moe_gemv_gate_up",
            "moe_gemv_down",
            "moe_ggemv_gate_up",
            "moe_ggemv_down",
            "moe_stream_gate_up",
            "moe_stream_down",
        ];
        for base in bases {
            let fp8 = fp8_kernel(base).expect("an FP8 variant");
            assert_eq!(fp8, format!("{base}_fp8"));
            assert!(super::super::compile::KERNELS.contains(&base), "{base}");
            assert!(super::super::compile::KERNELS.contains(&fp8), "{fp8}");
        }
        assert!(fp8_kernel("moe_combine_bf16").is_none());
    }

    /// Tiles the group kernel fills for these per-expert pair counts.
    fn tiles_for(counts: &[usize], bm: usize) -> usize {
        counts.iter().map(|c| c.div_ceil(bm)).sum()
    }

    #[test]
    fn the_tile_bound_holds_for_any_distribution_of_pairs() {
        let mut seed = 7u64;
        let mut next = |n: usize| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize % n
        };
        for n_exp in [1, 3, 8, 64, 128, 1024] {
            for pairs in [1, 2, 15, 16, 17, 100, 4096, 33000] {
                for bm in [16, 64, 128] {
                    let bound = max_tiles(pairs, n_exp, bm);
                    // All on one expert, spread one by one, and at random.
                    let mut one = vec![0; n_exp];
                    one[n_exp - 1] = pairs;
                    let spread: Vec<usize> = (0..n_exp)
                        .map(|e| pairs / n_exp + usize::from(e < pairs % n_exp))
                        .collect();
                    let mut random = vec![0; n_exp];
                    for _ in 0..pairs.min(5000) {
                        random[next(n_exp)] += 1;
                    }
                    for counts in [&one, &spread, &random] {
                        assert!(tiles_for(counts, bm) <= bound, "{n_exp} {pairs} {bm}");
                    }
                }
            }
        }
    }

    #[test]
    fn capacity_serves_every_chunk() {
        for rows in [1, 7, 300, 4095, 4096, 4097, 8192, 8200, 20000] {
            for (top_k, n_exp) in [(1, 8), (2, 64), (8, 128), (8, 1024)] {
                let (meta, slots) = capacity(rows, top_k, n_exp, None);
                let mut r0 = 0;
                while r0 < rows {
                    let n = CHUNK_ROWS.min(rows - r0);
                    let p = plan(n, top_k, n_exp, None);
                    assert!(p.tiles < meta && p.tiles * p.bm <= slots);
                    r0 += n;
                }
            }
        }
    }

    #[test]
    fn gemv_path_for_small_steps_only() {
        use MoePath::*;
        // Qwen3-30B-A3B: 128 experts, top 8: up to 16 rows.
        for rows in [1, 2, 4, 8, 16] {
            assert_eq!(MoePath::for_shape(rows, 8, 128, 2048, 768), Gemv, "{rows}");
        }
        assert_eq!(MoePath::for_shape(17, 8, 128, 2048, 768), Grouped);
        assert_eq!(MoePath::for_shape(64, 8, 128, 2048, 768), Grouped);
        // Mixtral: 8 experts, top 2: up to 4 rows.
        assert_eq!(MoePath::for_shape(4, 2, 8, 4096, 14336), Gemv);
        assert_eq!(MoePath::for_shape(5, 2, 8, 4096, 14336), Grouped);
        // Widths off 8 always group.
        assert_eq!(MoePath::for_shape(1, 2, 8, 20, 12), Grouped);
        assert_eq!(MoePath::for_shape(1, 2, 8, 96, 36), Grouped);
    }

    #[test]
    fn the_stream_path_replaces_decode_sized_steps_when_asked() {
        use MoePath::*;
        let at = |rows: usize, fp8: bool, s: StreamUse| {
            let auto = MoePath::for_shape(rows, 8, 128, 2048, 768);
            stream_or(auto, (rows, 8, 128), fp8, s)
        };
        for fp8 in [false, true] {
            for rows in [1, 8, 9, 16, 17, 64, 256, 511, 600] {
                assert_eq!(
                    at(rows, fp8, StreamUse::Off),
                    MoePath::for_shape(rows, 8, 128, 2048, 768)
                );
            }
            assert_eq!(at(1, fp8, StreamUse::Grouped), Gemv);
            assert_eq!(at(FP8_GEMV_MAX_ROWS, fp8, StreamUse::Grouped), Gemv);
            assert_eq!(at(1, fp8, StreamUse::All), Stream);
            assert_eq!(at(16, fp8, StreamUse::All), Stream);
            for s in [StreamUse::Grouped, StreamUse::All] {
                assert_eq!(at(17, fp8, s), Stream);
                assert_eq!(at(511, fp8, s), Stream);
                // 4,096 pairs over 128 experts: 64-slot tiles, the grouped GEMMs.
                assert_eq!(at(512, fp8, s), Grouped);
            }
        }
        // Past FP8_GEMV_MAX_ROWS, FP8 experts stream; bf16 ones keep the GEMV.
        assert_eq!(at(FP8_GEMV_MAX_ROWS + 1, true, StreamUse::Grouped), Stream);
        assert_eq!(at(16, true, StreamUse::Grouped), Stream);
        assert_eq!(at(FP8_GEMV_MAX_ROWS + 1, false, StreamUse::Grouped), Gemv);
        assert_eq!(at(16, false, StreamUse::Grouped), Gemv);
    }

    #[test]
    fn each_tile_height_launches_its_own_kernels() {
        let m128 = GemmLaunch::for_tile_rows(128, false);
        assert_eq!(m128.names, ["moe_gemm_gate_up_m128", "moe_gemm_down_m128"]);
        assert_eq!((m128.threads, m128.cols), (256, [64, 128]));
        assert_eq!(m128.smem as usize, m128_smem_bytes(false));
        assert_eq!(
            GemmLaunch::for_tile_rows(128, true).smem as usize,
            m128_smem_bytes(true)
        );
        for (bm, name) in [(16, "moe_gemm_gate_up_m16"), (64, "moe_gemm_gate_up_m64")] {
            let g = GemmLaunch::for_tile_rows(bm, true);
            assert_eq!(
                (g.names[0], g.threads, g.smem, g.cols),
                (name, 128, 0, [64, 64])
            );
        }
    }

    #[test]
    fn tile_height_follows_pairs_per_expert() {
        assert_eq!(plan(1, 8, 128, None).bm, 16);
        assert_eq!(plan(256, 8, 128, None).bm, 16);
        assert_eq!(plan(512, 8, 128, None).bm, 64);
        assert_eq!(plan(300, 2, 8, None).bm, 64);
        // Prefill-sized chunks: Qwen3-30B-A3B's full chunk, Mixtral's.
        assert_eq!(plan(4096, 8, 128, None).bm, 128);
        assert_eq!(plan(3071, 8, 128, None).bm, 64);
        assert_eq!(plan(1000, 2, 8, None).bm, 128);
    }
}
