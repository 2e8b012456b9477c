//! Quantized weights on the CPU: GGUF blocks kept as loaded, multiplied by
//! activations quantized to 8 bits, with integer SIMD.
//!
//! - Storage: a [`crate::QuantData`] per matrix, each row `cols /
//!   block_size` whole blocks in the file's layout (see
//!   [`super::storage::CpuWeight`]); [`supported`] lists the types with
//!   kernels, others are dequantized at load.
//! - Few rows (decode, [`matmul`]; up to 32 rows, so batched decode too,
//!   but 16 for the k-quants on AVX-512 VNNI):
//!   each x row is quantized once per call
//!   ([`act`]: 32-blocks for Q4_0..Q8_0 and IQ4_NL, 256-blocks with 16-sums
//!   for the k-quants and IQ4_XS), then every weight row is dotted with every x row, block by
//!   block, in parallel over chunks of output features. The weight row stays
//!   in L1 across the x rows, so the weights stream once per call. At one x
//!   row the SIMD paths take a kernel per chunk of weight rows instead, with
//!   no call per weight row: [`one_row_fn`] for the k-quants,
//!   [`one_row_q8_fn`] for the 32-block formats (four weight rows a pass,
//!   bitwise the row kernels' values; SmolLM2 Q4_1 decode 1.13-1.27x on a
//!   2-core AMD EPYC with AVX2, BENCHMARKS.md).
//! - Several matrices of the same x rows (a step's q, k and v): [`fused`],
//!   one pass over all of them with the activations quantized once.
//! - Many rows (prefill, and batched decode steps from 17 rows): Q4_K,
//!   Q5_K and Q6_K on AVX-512 VNNI and AVX2 take [`kgemm`], an integer GEMM
//!   that unpacks each block once per call (the row counts are
//!   [`super::matmul`]'s; the AVX2 products are `kgemm_avx2`'s);
//!   other types go through [`super::matmul`],
//!   which dequantizes tiles of rows to f32 ([`dequantize`], with SIMD for
//!   Q4_1, Q4_K and Q6_K: [`widen`]) and runs the f32 GEMM, as for f16
//!   weights.
//! - Dispatch ([`Isa`]): AVX-512 VNNI, AVX2 or portable scalar, detected at
//!   run time ([`Isa::detect`]); each path is a table of per-type row dot
//!   products ([`scalar`], [`x86`]). Tests force each path ([`matmul`]
//!   takes the `Isa`).

pub mod act;
pub mod fused;
pub mod kgemm;
#[cfg(target_arch = "x86_64")]
mod kgemm_avx2;
#[cfg(test)]
mod kgemm_tests;
#[cfg(target_arch = "x86_64")]
pub(crate) mod kgemm_vnni;
#[cfg(test)]
mod one_row_tests;
pub mod scalar;
#[cfg(test)]
pub(crate) mod tests;
mod widen;
pub(crate) mod widen_bf16;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::GgmlType;
use act::{BlockQ8, BlockQ8K};
use rayon::prelude::*;

/// A path of block dot products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust, any machine.
    Scalar,
    /// AVX2 + FMA + F16C (`vpmaddubsw`).
    Avx2,
    /// AVX2 + FMA + F16C + AVX-512 VNNI and VL (`vpdpbusd` on 256 bits).
    Avx512Vnni,
}

impl Isa {
    /// Whether this machine runs the path (the portable one always).
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => has_avx2(),
            Isa::Avx512Vnni => has_avx2() && has_vnni(),
        }
    }

    /// Every path this machine runs, fastest last.
    pub fn available() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni]
            .into_iter()
            .filter(|i| i.is_available())
            .collect()
    }

    /// The fastest path here (the portable one when SIMD is turned off with
    /// [`super::set_simd_enabled`]).
    pub fn detect() -> Isa {
        if !super::simd::has_avx2_f16c() {
            Isa::Scalar
        } else if has_vnni() {
            Isa::Avx512Vnni
        } else {
            Isa::Avx2
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

#[cfg(target_arch = "x86_64")]
fn has_vnni() -> bool {
    is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx2() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn has_vnni() -> bool {
    false
}

/// Whether the CPU backend has kernels for `ty` blocks.
pub fn supported(ty: GgmlType) -> bool {
    dot_fn(ty, Isa::Scalar).is_some()
}

/// Bytes of one row of `cols` elements of `ty` (`cols` a multiple of the block size).
pub fn row_bytes(ty: GgmlType, cols: usize) -> usize {
    cols / ty.block_size() * ty.type_size()
}

/// Dequantizes whole blocks of `ty` into `out`, with SIMD on `isa` where
/// [`widen`] has it (bitwise the same values as the portable dequantizers).
pub fn dequantize_on(ty: GgmlType, bytes: &[u8], out: &mut [f32], isa: Isa) {
    let ok = widen::widen(ty, bytes, out, isa != Isa::Scalar && isa.is_available());
    debug_assert!(ok, "{ty:?} is stored only when it can be dequantized");
}

/// [`dequantize_on`] the fastest path here.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    dequantize_on(ty, bytes, out, Isa::detect())
}

/// `out[r] = dot(w, a[r])` for the `rows` quantized x rows in `a`.
type DotQ8 = unsafe fn(&[u8], &[BlockQ8], usize, &mut [f32]);
type DotQ8K = unsafe fn(&[u8], &[BlockQ8K], usize, &mut [f32]);

/// One weight row dotted with every quantized x row.
#[derive(Clone, Copy)]
enum Dot {
    Q8(DotQ8),
    Q8K(DotQ8K),
}

/// `out[j] = dot(w row j, a)` for `out.len()` consecutive weight rows of
/// `rb` bytes and one quantized x row `a` (256-blocks for the k-quants,
/// 32-blocks for the 32-block formats).
pub(super) type DotOneRow<A = BlockQ8K> = unsafe fn(&[u8], usize, &[A], &mut [f32]);

/// The one-x-row kernel over many weight rows for `ty` on `isa`, where
/// there is one (the k-quants of a Q4_K_M / Q5_K_M file on the SIMD paths);
/// `None` sends a one-row call through [`Dot`] row by row. Its values are
/// [`Dot`]'s up to the f32 summation order.
fn one_row_fn(ty: GgmlType, isa: Isa) -> Option<DotOneRow> {
    if !isa.is_available() {
        return None;
    }
    use GgmlType as T;
    #[cfg(target_arch = "x86_64")]
    macro_rules! simd {
        ($m:ident) => {
            match ty {
                T::Q4_K => Some(x86::$m::q4_k_one_row as DotOneRow),
                T::Q5_K => Some(x86::$m::q5_k_one_row as DotOneRow),
                T::Q6_K => Some(x86::$m::q6_k_one_row as DotOneRow),
                _ => None,
            }
        };
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => simd!(avx2_one_row),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => simd!(vnni_one_row),
        _ => None,
    }
}

/// The one-x-row kernel of a 32-block format (Q4_0, Q4_1, Q5_0, Q5_1,
/// Q8_0, IQ4_NL) on `isa`'s SIMD paths: four weight rows a pass against
/// the x row, where the row-by-row kernel paid its set-up and final sum
/// per weight row (18 blocks a row at SmolLM2's K of 576). Each weight
/// row's sums run in [`Dot`]'s order, so its values are [`Dot`]'s bit for
/// bit.
fn one_row_q8_fn(ty: GgmlType, isa: Isa) -> Option<DotOneRow<BlockQ8>> {
    if !isa.is_available() {
        return None;
    }
    use GgmlType as T;
    #[cfg(target_arch = "x86_64")]
    macro_rules! simd {
        ($m:ident) => {
            match ty {
                T::Q4_0 => Some(x86::$m::q4_0_one_row as DotOneRow<BlockQ8>),
                T::Q4_1 => Some(x86::$m::q4_1_one_row as DotOneRow<BlockQ8>),
                T::Q5_0 => Some(x86::$m::q5_0_one_row as DotOneRow<BlockQ8>),
                T::Q5_1 => Some(x86::$m::q5_1_one_row as DotOneRow<BlockQ8>),
                T::Q8_0 => Some(x86::$m::q8_0_one_row as DotOneRow<BlockQ8>),
                T::IQ4_NL => Some(x86::$m::iq4_nl_one_row as DotOneRow<BlockQ8>),
                _ => None,
            }
        };
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => simd!(avx2),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => simd!(vnni),
        _ => None,
    }
}

/// The row dot product for `ty` on `isa`; `None` when the type has no
/// kernel or the path is not available here (so a `Dot` is always safe to
/// call on whole blocks).
fn dot_fn(ty: GgmlType, isa: Isa) -> Option<Dot> {
    if !isa.is_available() {
        return None;
    }
    use GgmlType as T;
    #[cfg(target_arch = "x86_64")]
    macro_rules! simd {
        ($m:ident) => {
            match ty {
                T::Q4_0 => Dot::Q8(x86::$m::q4_0),
                T::Q4_1 => Dot::Q8(x86::$m::q4_1),
                T::Q5_0 => Dot::Q8(x86::$m::q5_0),
                T::Q5_1 => Dot::Q8(x86::$m::q5_1),
                T::Q8_0 => Dot::Q8(x86::$m::q8_0),
                T::Q2_K => Dot::Q8K(x86::$m::q2_k),
                T::Q3_K => Dot::Q8K(x86::$m::q3_k),
                T::Q4_K => Dot::Q8K(x86::$m::q4_k),
                T::Q5_K => Dot::Q8K(x86::$m::q5_k),
                T::Q6_K => Dot::Q8K(x86::$m::q6_k),
                T::IQ4_NL => Dot::Q8(x86::$m::iq4_nl),
                T::IQ4_XS => Dot::Q8K(x86::$m::iq4_xs),
                _ => return None,
            }
        };
    }
    Some(match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => simd!(avx2),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => simd!(vnni),
        _ => match ty {
            T::Q4_0 => Dot::Q8(scalar::rows::q4_0),
            T::Q4_1 => Dot::Q8(scalar::rows::q4_1),
            T::Q5_0 => Dot::Q8(scalar::rows::q5_0),
            T::Q5_1 => Dot::Q8(scalar::rows::q5_1),
            T::Q8_0 => Dot::Q8(scalar::rows::q8_0),
            T::Q2_K => Dot::Q8K(scalar::rows::q2_k),
            T::Q3_K => Dot::Q8K(scalar::rows::q3_k),
            T::Q4_K => Dot::Q8K(scalar::rows::q4_k),
            T::Q5_K => Dot::Q8K(scalar::rows::q5_k),
            T::Q6_K => Dot::Q8K(scalar::rows::q6_k),
            T::IQ4_NL => Dot::Q8(scalar::rows::iq4_nl),
            T::IQ4_XS => Dot::Q8K(scalar::rows::iq4_xs),
            _ => return None,
        },
    })
}

/// `y[r * n + j] = dot(x[r], w[j])` for the `n` rows of `w` (blocks of
/// `ty`, `k` columns); `x` is `[rows, k]`, `y` `[rows, n]`.
/// Returns false (computing nothing) when `ty` has no kernel on `isa`.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    x: &[f32],
    rows: usize,
    k: usize,
    ty: GgmlType,
    w: &[u8],
    y: &mut [f32],
    threads: usize,
    isa: Isa,
) -> bool {
    let Some(dot) = dot_fn(ty, isa) else {
        return false;
    };
    let rb = row_bytes(ty, k);
    assert!(k.is_multiple_of(ty.block_size()) && x.len() == rows * k);
    assert!(rows > 0 && y.len().is_multiple_of(rows) && w.len() >= y.len() / rows * rb);
    match dot {
        Dot::Q8(f) => {
            let mut a = vec![BlockQ8::default(); x.len() / 32];
            act::quantize_q8(x, &mut a);
            match one_row_q8_fn(ty, isa) {
                Some(f1) if rows == 1 => run_one_row(w, rb, &a, y, threads, f1),
                _ => run(w, rb, &a, rows, y, threads, f),
            }
        }
        Dot::Q8K(f) => {
            let mut a = vec![BlockQ8K::default(); x.len() / 256];
            act::quantize_q8k(x, &mut a);
            match one_row_fn(ty, isa) {
                Some(f1) if rows == 1 => run_one_row(w, rb, &a, y, threads, f1),
                _ => run(w, rb, &a, rows, y, threads, f),
            }
        }
    }
    true
}

/// Most x rows one weight row is dotted with per kernel call (the results
/// go through a stack buffer of this many values).
const ROWS_PER_CALL: usize = 64;

/// `y`, written from several tasks at once, each at its own elements.
struct SharedOut(*mut f32);
// SAFETY: only used by `run`, whose tasks write disjoint columns of `y`.
unsafe impl Sync for SharedOut {}

/// Weight rows per task of a `threads`-thread call over `n` rows of `rb`
/// bytes: about 32 KiB of weights, at least 8 tasks per thread when `n`
/// allows.
fn task_rows(n: usize, rb: usize, threads: usize) -> usize {
    let by_bytes = (32 * 1024 / rb.max(1)).max(4);
    let by_tasks = n.div_ceil(threads.max(1) * 8).max(4);
    by_bytes.min(by_tasks)
}

/// `y[j] = dot(w row j, a)` for one x row (`a`), in parallel over chunks of
/// weight rows, each chunk one call of `f`.
fn run_one_row<A: Sync>(
    w: &[u8],
    rb: usize,
    a: &[A],
    y: &mut [f32],
    threads: usize,
    f: DotOneRow<A>,
) {
    let chunk = task_rows(y.len(), rb, threads);
    y.par_chunks_mut(chunk).enumerate().for_each(|(c, yc)| {
        let j0 = c * chunk;
        // SAFETY: `f` came from `one_row_fn` (paths this machine runs);
        // rows `j0..j0 + yc.len()` of `w` are whole blocks.
        unsafe { f(&w[j0 * rb..(j0 + yc.len()) * rb], rb, a, yc) };
    });
}

/// Runs `f` over every (weight row, x row) pair, in parallel over chunks of
/// weight rows; `a` holds `rows` rows of quantized activations, `y` is
/// `[rows, n]`. Each task writes only its own columns of `y`.
fn run<A: Sync>(
    w: &[u8],
    rb: usize,
    a: &[A],
    rows: usize,
    y: &mut [f32],
    threads: usize,
    f: unsafe fn(&[u8], &[A], usize, &mut [f32]),
) {
    let n = y.len() / rows;
    let nb = a.len() / rows;
    let chunk = task_rows(n, rb, threads);
    let out = SharedOut(y.as_mut_ptr());
    let out = &out;
    (0..n.div_ceil(chunk)).into_par_iter().for_each(|c| {
        let mut tmp = [0f32; ROWS_PER_CALL];
        for j in c * chunk..((c + 1) * chunk).min(n) {
            let wrow = &w[j * rb..(j + 1) * rb];
            for r0 in (0..rows).step_by(ROWS_PER_CALL) {
                let g = (rows - r0).min(ROWS_PER_CALL);
                let ag = &a[r0 * nb..(r0 + g) * nb];
                // SAFETY: `f` came from `dot_fn`, which hands out only paths
                // this machine runs; `wrow` holds `nb` whole blocks.
                unsafe { f(wrow, ag, g, &mut tmp[..g]) };
                for (r, v) in tmp[..g].iter().enumerate() {
                    // SAFETY: `(r0 + r) * n + j < rows * n == y.len()`, and
                    // column `j` belongs to this task alone.
                    unsafe { *out.0.add((r0 + r) * n + j) = *v };
                }
            }
        }
    });
}
