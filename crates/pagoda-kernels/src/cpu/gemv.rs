//! Matrix-vector products for few rows (decode): `out = x @ w^T` with `x: [rows, k]`,
//! `rows <= MAX_ROWS`, `w: [n, k]` in f32, f16 or bf16.
//!
//! Decode is bound by the bytes of weights streamed, so each weight row is read
//! exactly once and converted to f32 in registers (F16C for f16, a shift for
//! bf16), multiplied against every x row (up to 4, kept in L1) with FMA, and
//! accumulated in f32. Work is split over the output features in chunks, one
//! rayon task each. With AVX2+FMA+F16C (detected at run time) the kernel
//! handles `R` x rows times `NW` weight rows per inner step; elsewhere a
//! portable loop converts a row to f32 and takes plain dot products.
//!
//! The result is produced transposed, `[n, rows]`, and transposed back by the
//! caller, so that every task writes one contiguous chunk.

use super::storage::{ViewData, WeightView};
use rayon::prelude::*;

/// Most x rows the GEMV path handles in one pass over the weights.
pub const MAX_ROWS: usize = 4;

/// `out_t[j * rows + r] = dot(x[r], w[j])` for all `j < w.rows`, `r < rows`.
/// `x` is `[rows, w.cols]`, `rows` in `1..=MAX_ROWS`; `out_t` is `[w.rows, rows]`.
pub fn gemv_t(x: &[f32], rows: usize, w: WeightView<'_>, out_t: &mut [f32], threads: usize) {
    let (n, k) = (w.rows, w.cols);
    debug_assert!((1..=MAX_ROWS).contains(&rows));
    debug_assert_eq!(x.len(), rows * k);
    debug_assert_eq!(out_t.len(), n * rows);
    // Chunks of about 64 KiB of weights, at least 8 tasks per thread when n allows.
    let row_bytes = k * if matches!(w.data, ViewData::F32(_)) {
        4
    } else {
        2
    };
    let by_bytes = (64 * 1024 / row_bytes.max(1)).max(4);
    let by_tasks = n.div_ceil(threads.max(1) * 8).max(4);
    let chunk = by_bytes.min(by_tasks).next_multiple_of(4);
    let fast = super::simd::has_avx2_f16c();
    out_t
        .par_chunks_mut(chunk * rows)
        .enumerate()
        .for_each(|(c, out)| {
            let j0 = c * chunk;
            let nj = out.len() / rows;
            if fast {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX2, FMA and F16C were detected at run time; the
                // slices passed are in bounds (checked by the callee's asserts).
                unsafe {
                    avx2::gemv_chunk(x, rows, k, &w, j0, nj, out)
                };
            } else {
                portable_chunk(x, rows, k, &w, j0, nj, out);
            }
        });
}

/// Portable fallback: converts each weight row to f32, then dots it with every x row.
fn portable_chunk(
    x: &[f32],
    rows: usize,
    k: usize,
    w: &WeightView<'_>,
    j0: usize,
    nj: usize,
    out: &mut [f32],
) {
    let mut buf = vec![0f32; k];
    for jj in 0..nj {
        let wrow: &[f32] = match &w.data {
            ViewData::F32(v) => &v[(j0 + jj) * k..(j0 + jj + 1) * k],
            _ => {
                w.row_to_f32(j0 + jj, &mut buf);
                &buf
            }
        };
        for r in 0..rows {
            out[jj * rows + r] = super::dot(&x[r * k..(r + 1) * k], wrow);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::super::storage::{ViewData, WeightView};
    use std::arch::x86_64::*;

    /// Sum of the 8 lanes.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// Generates a kernel over `NW` weight rows of element type `$t` and `R`
    /// x rows; `$load(ptr)` loads 8 weights as f32, `$one(v)` converts one.
    macro_rules! kernel {
        ($name:ident, $t:ty, $load:expr, $one:expr) => {
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn $name<const R: usize, const NW: usize>(
                x: &[f32],
                k: usize,
                w: &[$t],
                out: &mut [f32],
            ) {
                assert!(x.len() >= R * k && w.len() >= NW * k && out.len() >= NW * R);
                let xp = x.as_ptr();
                let wp = w.as_ptr();
                let mut acc = [[_mm256_setzero_ps(); R]; NW];
                let k8 = k / 8 * 8;
                let mut i = 0;
                while i < k8 {
                    let mut wv = [_mm256_setzero_ps(); NW];
                    for q in 0..NW {
                        wv[q] = $load(wp.add(q * k + i));
                    }
                    for r in 0..R {
                        let xv = _mm256_loadu_ps(xp.add(r * k + i));
                        for q in 0..NW {
                            acc[q][r] = _mm256_fmadd_ps(wv[q], xv, acc[q][r]);
                        }
                    }
                    i += 8;
                }
                for q in 0..NW {
                    for r in 0..R {
                        let mut s = hsum(acc[q][r]);
                        for t in k8..k {
                            s += $one(*wp.add(q * k + t)) * *xp.add(r * k + t);
                        }
                        out[q * R + r] = s;
                    }
                }
            }
        };
    }

    kernel!(
        kern_f32,
        f32,
        |p: *const f32| _mm256_loadu_ps(p),
        |v: f32| v
    );
    kernel!(
        kern_f16,
        half::f16,
        |p: *const half::f16| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
        |v: half::f16| v.to_f32()
    );
    kernel!(
        kern_bf16,
        half::bf16,
        |p: *const half::bf16| _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i)),
            16
        )),
        |v: half::bf16| v.to_f32()
    );

    /// Runs the kernel of `w`'s dtype over weight rows `j0..j0 + nj`.
    macro_rules! dispatch {
        ($kern:ident, $x:expr, $rows:expr, $k:expr, $w:expr, $j0:expr, $nj:expr, $out:expr) => {{
            let (x, rows, k, w, j0, nj, out) = ($x, $rows, $k, $w, $j0, $nj, $out);
            // Weight rows per step: 4 for one x row, 2 for more (registers).
            let nw = if rows == 1 { 4 } else { 2 };
            let mut jj = 0;
            while jj < nj {
                let step = if nj - jj >= nw { nw } else { 1 };
                let ws = &w[(j0 + jj) * k..(j0 + jj + step) * k];
                let o = &mut out[jj * rows..(jj + step) * rows];
                match (rows, step) {
                    (1, 4) => $kern::<1, 4>(x, k, ws, o),
                    (1, _) => $kern::<1, 1>(x, k, ws, o),
                    (2, 2) => $kern::<2, 2>(x, k, ws, o),
                    (2, _) => $kern::<2, 1>(x, k, ws, o),
                    (3, 2) => $kern::<3, 2>(x, k, ws, o),
                    (3, _) => $kern::<3, 1>(x, k, ws, o),
                    (_, 2) => $kern::<4, 2>(x, k, ws, o),
                    (_, _) => $kern::<4, 1>(x, k, ws, o),
                }
                jj += step;
            }
        }};
    }

    /// `out[jj * rows + r] = dot(x[r], w[j0 + jj])` for `jj < nj`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn gemv_chunk(
        x: &[f32],
        rows: usize,
        k: usize,
        w: &WeightView<'_>,
        j0: usize,
        nj: usize,
        out: &mut [f32],
    ) {
        match w.data {
            ViewData::F32(v) => dispatch!(kern_f32, x, rows, k, v, j0, nj, out),
            ViewData::F16(v) => dispatch!(kern_f16, x, rows, k, v, j0, nj, out),
            ViewData::BF16(v) => dispatch!(kern_bf16, x, rows, k, v, j0, nj, out),
            // Quantized weights go to `quant` (see `matmul`); this stays correct.
            ViewData::Quant(..) => super::portable_chunk(x, rows, k, w, j0, nj, out),
        }
    }
}
