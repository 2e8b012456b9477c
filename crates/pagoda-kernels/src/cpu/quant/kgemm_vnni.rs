//! The AVX-512 VNNI inner product of [`super::kgemm`]: every x row against
//! a panel of reordered weight rows in the paired layout
//! ([`super::kgemm::x86::Layout`]), 512-bit `vpdpbusd` over two groups at
//! once, in tiles of [`VR`] x rows by [`VC`] weight rows.
//!
//! - Per step (64 bytes of K: one step of two groups) a tile loads `VC`
//!   weight vectors and `VR` x vectors for `VR VC` products: 8 loads for
//!   16, where the 16 registers of AVX2 hold a 4 x 2 tile (6 for 8).
//! - The i32 sums of a group pair (8 steps for Q4_K / Q5_K, 4 for Q6_K)
//!   and the tile's f32 sums (16 lanes, two groups' sub-blocks) stay in
//!   the 32 registers; the epilogue of a pair (convert, scale, two FMAs)
//!   serves both groups. Kept in a scratch in memory instead, as the AVX2
//!   tiles keep theirs, the f32 sums cost a third of the speed
//!   (`products_timing` on a Zen 4: 77-94 against 120-128 G MACs a second
//!   a core on Q4_K, 32 rows; the 256-bit 4 x 2 tiles before ran 77-83).
//! - Operands are addressed from one base pointer per side and the row
//!   strides; a tile's f32 lane sums are reduced and added to the output
//!   once per K slice.
//!
//! The sums are the same integers as the AVX2 path's; only the f32 order
//! of the lane sums differs.

use super::kgemm::x86::{Acts, Panel, SharedOut, Tile};
use std::arch::x86_64::*;

/// x rows per tile.
pub(super) const VR: usize = 4;
/// Weight rows per tile.
pub(super) const VC: usize = 4;

/// Every x row against the panel's weight rows `j0..j1`, tile by tile, K
/// slice by K slice (`per_slice` groups), summed into columns `j0..j1` of
/// `out` (`[rows, n]`).
///
/// # Safety
/// AVX2, FMA, AVX-512F, VL and VNNI; `a` and `p` prepared for `rows` x rows
/// and `j1 - j0` weight rows with sub-blocks of `sub`, reordered to `k`
/// columns in the paired layout (`per_slice` even); `out` holds `rows * n`
/// values of which this call alone writes columns `j0..j1`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
pub(super) unsafe fn multiply(
    a: &Acts,
    p: &Panel,
    rows: usize,
    (j0, j1): (usize, usize),
    n: usize,
    k: usize,
    sub: usize,
    per_slice: usize,
    out: &SharedOut,
) {
    let groups = k / (8 * sub);
    let cols = j1 - j0;
    // A tile's f32 lane sums, handed from `run` to the reduction below.
    let mut sums = [[_mm512_setzero_ps(); VC]; VR];
    let acc = sums.as_mut_ptr() as *mut __m512;
    for g0 in (0..groups).step_by(per_slice) {
        let g1 = (g0 + per_slice).min(groups);
        for r0 in (0..rows).step_by(VR) {
            let rn = (rows - r0).min(VR);
            for c0 in (0..cols).step_by(VC) {
                let cn = (cols - c0).min(VC);
                let tile = Tile::at(a, p, (r0, c0), k, groups, (g0, g1));
                if sub == 32 {
                    tile.dispatch_vnni::<8>(rn, cn, acc)
                } else {
                    tile.dispatch_vnni::<4>(rn, cn, acc)
                }
                for r in 0..rn {
                    for c in 0..cn {
                        let v = _mm512_reduce_add_ps(*acc.add(r * VC + c));
                        // SAFETY: `(r0 + r) * n + j0 + c0 + c < rows * n`,
                        // a column of this call's alone.
                        let o = out.0.add((r0 + r) * n + j0 + c0 + c);
                        *o = if g0 == 0 { v } else { *o + v };
                    }
                }
            }
        }
    }
}

impl Tile {
    /// [`Tile::run_vnni`] for a tile of `rn` x rows by `cn` weight rows (at most
    /// [`VR`] by [`VC`]).
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn dispatch_vnni<const S: usize>(&self, rn: usize, cn: usize, acc: *mut __m512) {
        const { assert!(VR == 4 && VC == 4, "the arms below cover 4 x 4 tiles") };
        macro_rules! cols {
            ($r:literal) => {
                match cn {
                    1 => self.run_vnni::<$r, 1, S>(acc),
                    2 => self.run_vnni::<$r, 2, S>(acc),
                    3 => self.run_vnni::<$r, 3, S>(acc),
                    _ => self.run_vnni::<$r, 4, S>(acc),
                }
            };
        }
        match rn {
            1 => cols!(1),
            2 => cols!(2),
            3 => cols!(3),
            _ => cols!(4),
        }
    }

    /// The f32 sums of the first `R` x rows against the first `C` weight
    /// rows into `acc[r * VC + c]` (16 lanes each, overwritten), group pairs
    /// of `S` steps ([`super::kgemm::x86::Layout`]: 64 bytes a step, two
    /// groups' 8 lanes) and a row's odd last group alone (256-bit steps).
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn run_vnni<const R: usize, const C: usize, const S: usize>(&self, acc: *mut __m512) {
        let mut fsum = [[_mm512_setzero_ps(); C]; R];
        for h in self.g0 / 2..self.g1 / 2 {
            let mut isum = [[_mm512_setzero_si512(); C]; R];
            for s in 0..S {
                let off = (h * S + s) * 64;
                let w: [__m512i; C] = std::array::from_fn(|c| {
                    _mm512_loadu_si512(self.wq.add(c * self.k + off) as *const __m512i)
                });
                for (r, ir) in isum.iter_mut().enumerate() {
                    let x = _mm512_loadu_si512(self.aq.add(r * self.k + off) as *const __m512i);
                    for (iv, wv) in ir.iter_mut().zip(&w) {
                        *iv = _mm512_dpbusd_epi32(*iv, *wv, x);
                    }
                }
            }
            for (r, ir) in isum.iter().enumerate() {
                let d = _mm512_loadu_ps(self.ad.add((r * self.groups + 2 * h) * 8));
                let sums = _mm512_loadu_ps(self.as_.add((r * self.groups + 2 * h) * 8));
                for (c, iv) in ir.iter().enumerate() {
                    let f = self.wf.add((c * self.groups + 2 * h) * 16);
                    let scale = _mm512_mul_ps(_mm512_loadu_ps(f), d);
                    let t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(*iv), scale, fsum[r][c]);
                    fsum[r][c] = _mm512_fmadd_ps(_mm512_loadu_ps(f.add(16)), sums, t);
                }
            }
        }
        if self.g1 % 2 == 1 {
            // A row's odd last group, alone: 256-bit steps and factors.
            let g = self.g1 - 1;
            let mut isum = [[_mm256_setzero_si256(); C]; R];
            for s in 0..S {
                let off = (g * S + s) * 32;
                let w: [__m256i; C] = std::array::from_fn(|c| {
                    _mm256_loadu_si256(self.wq.add(c * self.k + off) as *const __m256i)
                });
                for (r, ir) in isum.iter_mut().enumerate() {
                    let x = _mm256_loadu_si256(self.aq.add(r * self.k + off) as *const __m256i);
                    for (iv, wv) in ir.iter_mut().zip(&w) {
                        *iv = _mm256_dpbusd_epi32(*iv, *wv, x);
                    }
                }
            }
            for (r, ir) in isum.iter().enumerate() {
                let d = _mm256_loadu_ps(self.ad.add((r * self.groups + g) * 8));
                let sums = _mm256_loadu_ps(self.as_.add((r * self.groups + g) * 8));
                for (c, iv) in ir.iter().enumerate() {
                    let f = self.wf.add((c * self.groups + g) * 16);
                    let scale = _mm256_mul_ps(_mm256_loadu_ps(f), d);
                    let t = _mm256_mul_ps(_mm256_cvtepi32_ps(*iv), scale);
                    let t = _mm256_fmadd_ps(_mm256_loadu_ps(f.add(8)), sums, t);
                    fsum[r][c] = _mm512_add_ps(fsum[r][c], _mm512_zextps256_ps512(t));
                }
            }
        }
        for (r, fr) in fsum.iter().enumerate() {
            for (c, v) in fr.iter().enumerate() {
                acc.add(r * VC + c).write(*v);
            }
        }
    }
}
