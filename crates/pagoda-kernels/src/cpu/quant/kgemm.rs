//! Many-row products of k-quant weights (Q4_K, Q5_K, Q6_K), for prefill
//! and batched decode steps of 17 rows or more, and of Q4_1 for batched
//! decode steps of 17-32 rows on AVX2:
//! an integer GEMM over 8-bit activations in which every weight block is
//! unpacked once per call and reused by every x row.
//!
//! - Groups: a block's sub-blocks (8 of 32 elements for Q4_K / Q5_K, 16 of
//!   16 for Q6_K) are taken 8 at a time, one per i32 lane of a 256-bit
//!   register: step `s` of a group holds elements `4 s..4 s + 4` of each of
//!   its 8 sub-blocks. `vpdpbusd` (or `vpmaddubsw` + `vpmaddwd` on AVX2)
//!   over the steps leaves each lane with one sub-block's integer dot
//!   product, so the per-sub-block scales are applied once per group in f32
//!   (`d sc` per lane) rather than once per step.
//! - Weights: each task unpacks a panel of output features into unsigned
//!   quants in that order plus, per group, `d sc` and the offset factor
//!   (`-dmin m` for Q4_K / Q5_K, `-32 d sc` for Q6_K) per lane. Q4_1's
//!   group is 8 of its 32-blocks (`d` and `m` per lane), a row's last group
//!   padded with zero lanes where K is no multiple of 256.
//! - Activations: each x row is quantized once per call to 256-blocks as
//!   for the block kernels ([`super::act::quantize_q8k`]; Q4_1's to
//!   32-blocks, [`super::act::quantize_q8`]: so the integer sums are the
//!   same), reordered like the weights, with the block scale per lane and
//!   the per-sub-block sums times it.
//! - A group's value for one (x row, weight row) pair is
//!   `sum_lanes dot * (d sc) * da + off * (da bsum)`; in tiles of 4 x rows
//!   by 2 weight rows each load serves several products, and K is taken in
//!   slices of 1024 so that a tile's operands stay in L1.
//!
//! Runs on the AVX-512 VNNI and AVX2 paths ([`super::Isa`]); elsewhere
//! [`matmul`] returns false and the caller takes the dequantized tiles.
//! The tiles of the VNNI path are here; on AVX2 (no `vpdpbusd`) the
//! products are [`super::kgemm_avx2`]'s, whose `vpmaddubsw` pair sums are
//! added in 16-bit lanes for as many steps as cannot overflow and widened
//! once per run, a third fewer integer instructions than widening every
//! step. The weight panel is reordered in registers (a transpose of 4-byte
//! runs per block), not element by element.

use super::Isa;
use crate::GgmlType;

/// Elements per sub-block (one lane of a group) of `ty`, for the types this
/// GEMM handles.
fn sub_len(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q4_1 => Some(32),
        GgmlType::Q6_K => Some(16),
        _ => None,
    }
}

/// Whether [`matmul`] handles `ty` on `isa`: the k-quants on both SIMD
/// paths, Q4_1 on AVX2 (its 32-blocks one lane each, 8 to a group, the
/// activations in 32-blocks as for its block kernels; with VNNI those
/// kernels stay, unmeasured against this GEMM there).
pub fn handles(ty: GgmlType, isa: Isa) -> bool {
    cfg!(target_arch = "x86_64")
        && sub_len(ty).is_some()
        && match isa {
            Isa::Avx2 => true,
            Isa::Avx512Vnni => ty != GgmlType::Q4_1,
            Isa::Scalar => false,
        }
        && isa.is_available()
}

/// Whether prefill rows take this GEMM on `isa` ([`super::super::matmul`])
/// rather than dequantized f32 tiles: on both SIMD paths. With AVX-512
/// VNNI it runs at about twice the tiles' rate; on AVX2 (`vpmaddubsw`
/// pair sums added in 16-bit lanes, [`super::kgemm_avx2`]) Qwen2.5-1.5B
/// Q4_K_M prefill ran 38-41 against the tiles' 35 tok/s on a 2-core AMD
/// EPYC without AVX-512 (BENCHMARKS.md) before the register tiles of that
/// module.
/// Q4_1 prefill stays on the tiles (SmolLM2-135M pp512 at twice
/// llama.cpp's there, and f32 products for the prompt).
pub fn preferred(ty: GgmlType, isa: Isa) -> bool {
    handles(ty, isa) && ty != GgmlType::Q4_1
}

/// Fewest x rows of `ty` that take this GEMM on `isa` where it is
/// [`preferred`]: batched decode steps from 17 rows with VNNI, and on AVX2
/// for Q4_K and Q5_K; Q6_K on AVX2 only past the block kernels' 32 rows.
/// `decode_rows_timing` on a 2-core AMD EPYC without AVX-512 (CPU time,
/// Qwen2.5-1.5B shapes, the GEMM against the block kernels): Q4_K 0.98-1.0x
/// at 12-16 rows, 0.64-0.85x at 24, 0.74-0.76x at 32; Q5_K 0.63x at 16,
/// 0.76x at 32; Q6_K 1.2-1.35x at 8-32 rows. Q4_1 takes it from 17 rows
/// up to the block kernels' 32 (never for prefill: [`preferred`]).
pub fn min_rows(ty: GgmlType, isa: Isa) -> usize {
    if isa == Isa::Avx512Vnni || ty != GgmlType::Q6_K {
        17
    } else {
        33
    }
}

/// `y[r * n + j] = dot(x[r], w[j])` for the `n = y.len() / rows` rows of `w`
/// (blocks of `ty`, `k` columns), as [`super::matmul`]; returns false
/// (computing nothing) when [`handles`] says no.
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
    if !handles(ty, isa) {
        return false;
    }
    let block = if ty == GgmlType::Q4_1 { 32 } else { 256 };
    assert!(k.is_multiple_of(block) && x.len() == rows * k);
    assert!(rows > 0 && y.len().is_multiple_of(rows));
    assert!(w.len() >= y.len() / rows * super::row_bytes(ty, k));
    #[cfg(target_arch = "x86_64")]
    x86::matmul(x, rows, k, ty, w, y, threads, isa == Isa::Avx512Vnni);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (w, y, threads);
    true
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use super::super::act::{quantize_q8, quantize_q8k, BlockQ8, BlockQ8K};
    use super::super::scalar::{f16_at, scale_min_k4};
    use super::super::x86::{
        hsum, prefetch_ahead, unpack_q45_k, unpack_q6_k, KBlock, WEIGHT_PREFETCH,
    };
    use super::sub_len;
    use crate::GgmlType;
    use rayon::prelude::*;
    use std::arch::asm;
    use std::arch::x86_64::*;
    use std::cell::RefCell;

    /// Reordered activations: `q` (`rows * kp` bytes, `kp` = `k` rounded up
    /// to whole groups of 256, the padding zero), per (row, group) 8 lanes
    /// of the block scale `d` (the same in every lane for the k-quants'
    /// 256-blocks; Q4_1's 32-blocks one a lane) and 8 lanes of `d *
    /// sum(q over the lane's sub-block)`.
    #[derive(Default)]
    pub(in super::super) struct Acts {
        pub(in super::super) q: Vec<i8>,
        pub(in super::super) d: Vec<f32>,
        pub(in super::super) s: Vec<f32>,
    }

    /// A task's reordered weight rows: `q` (`kp` bytes per row, as for
    /// [`Acts`]) and per (row, group) 8 lanes of `d sc` (Q4_1: `d`) then 8
    /// of the offset factor (Q4_1: `m`; zero in padding lanes).
    #[derive(Default)]
    pub(in super::super) struct Panel {
        pub(in super::super) q: Vec<u8>,
        pub(in super::super) f: Vec<f32>,
    }

    thread_local! {
        static ACTS: RefCell<Acts> = RefCell::new(Acts::default());
        static PANEL: RefCell<Panel> = RefCell::new(Panel::default());
    }

    /// `y`, written from several tasks at once, each at its own columns.
    pub(in super::super) struct SharedOut(pub(in super::super) *mut f32);
    // SAFETY: tasks of `matmul` write disjoint columns of `y`.
    unsafe impl Sync for SharedOut {}

    /// Most bytes of reordered weights per task and K slice (kept in L2
    /// while every x row passes over them).
    const PANEL_BYTES: usize = 192 * 1024;

    /// Elements of K per slice: a tile's x rows and weight rows of one
    /// slice stay in L1 while it runs.
    const SLICE: usize = 1024;

    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul(
        x: &[f32],
        rows: usize,
        k: usize,
        ty: GgmlType,
        w: &[u8],
        y: &mut [f32],
        threads: usize,
        vnni: bool,
    ) {
        let sub = sub_len(ty).expect("checked by the caller");
        let n = y.len() / rows;
        ACTS.with(|cell| {
            let mut fresh = Acts::default();
            let mut held = cell.try_borrow_mut();
            let acts = match held.as_mut() {
                Ok(a) => &mut **a,
                Err(_) => &mut fresh,
            };
            prepare_acts(x, rows, k, ty, sub, acts);
            let rb = super::super::row_bytes(ty, k);
            let kp = k.next_multiple_of(256);
            let per_row = kp.min(SLICE) * 5 / 4;
            let by_bytes = (PANEL_BYTES / per_row).max(2);
            let by_tasks = n.div_ceil(threads.max(1) * 4).max(2);
            let chunk = by_bytes.min(by_tasks).next_multiple_of(2);
            let out = SharedOut(y.as_mut_ptr());
            let (out, acts) = (&out, &*acts);
            (0..n.div_ceil(chunk)).into_par_iter().for_each(|c| {
                let (j0, j1) = (c * chunk, ((c + 1) * chunk).min(n));
                PANEL.with(|cell| {
                    let mut fresh = Panel::default();
                    let mut held = cell.try_borrow_mut();
                    let panel = match held.as_mut() {
                        Ok(p) => &mut **p,
                        Err(_) => &mut fresh,
                    };
                    // SAFETY: AVX2 (and VNNI where `vnni`) checked by
                    // `handles`; `w` holds `n` rows of `rb` bytes.
                    unsafe {
                        prepare_panel(ty, &w[j0 * rb..j1 * rb], j1 - j0, k, sub, panel);
                        let per_slice = (SLICE / (8 * sub)).max(1);
                        if vnni {
                            multiply(acts, panel, rows, (j0, j1), n, kp, sub, per_slice, out);
                        } else {
                            super::super::kgemm_avx2::multiply(
                                ty,
                                acts,
                                panel,
                                rows,
                                (j0, j1),
                                n,
                                kp,
                                sub,
                                per_slice,
                                out,
                            );
                        }
                    }
                });
            });
        });
    }

    /// Reorders `nat` (one block, natural order) into `out` by groups: step
    /// `s` of group `g` holds 4 elements of each of its 8 sub-blocks.
    fn interleave<T: Copy>(nat: &[T; 256], sub: usize, out: &mut [T]) {
        let steps = sub / 4;
        for g in 0..256 / (8 * sub) {
            for s in 0..steps {
                for l in 0..8 {
                    let (src, dst) = (g * 8 * sub + l * sub + 4 * s, (g * steps + s) * 32 + 4 * l);
                    out[dst..dst + 4].copy_from_slice(&nat[src..src + 4]);
                }
            }
        }
    }

    /// Quantizes every x row (to 256-blocks; for Q4_1 to 32-blocks, as its
    /// block kernels do) and reorders it into `a`.
    fn prepare_acts(x: &[f32], rows: usize, k: usize, ty: GgmlType, sub: usize, a: &mut Acts) {
        let kp = k.next_multiple_of(256);
        let groups = kp / (8 * sub);
        a.q.resize(rows * kp, 0);
        a.d.resize(rows * groups * 8, 0.0);
        a.s.resize(rows * groups * 8, 0.0);
        a.q.par_chunks_mut(kp)
            .zip(a.d.par_chunks_mut(groups * 8))
            .zip(a.s.par_chunks_mut(groups * 8))
            .zip(x.par_chunks(k))
            .for_each(|(((q, d), s), x)| {
                if ty == GgmlType::Q4_1 {
                    // A group is 8 blocks of 32; lanes past `k` stay zero.
                    let mut b = [BlockQ8 {
                        d: 0.0,
                        s: 0.0,
                        q: [0; 32],
                    }];
                    let mut nat = [0i8; 256];
                    for g in 0..groups {
                        nat.fill(0);
                        for l in 0..8 {
                            let i = 8 * g + l;
                            (d[i], s[i]) = if 32 * i < k {
                                quantize_q8(&x[32 * i..32 * i + 32], &mut b);
                                nat[32 * l..32 * l + 32].copy_from_slice(&b[0].q);
                                (b[0].d, b[0].s)
                            } else {
                                (0.0, 0.0)
                            };
                        }
                        interleave(&nat, sub, &mut q[256 * g..256 * (g + 1)]);
                    }
                    return;
                }
                let mut b = [BlockQ8K::default()];
                let gb = 256 / (8 * sub);
                for (i, xb) in x.chunks_exact(256).enumerate() {
                    quantize_q8k(xb, &mut b);
                    let b = &b[0];
                    interleave(&b.q, sub, &mut q[256 * i..256 * (i + 1)]);
                    for g in 0..gb {
                        for l in 0..8 {
                            let v = if sub == 32 {
                                b.bsums[2 * l] as i32 + b.bsums[2 * l + 1] as i32
                            } else {
                                b.bsums[8 * g + l] as i32
                            };
                            d[8 * (gb * i + g) + l] = b.d;
                            s[8 * (gb * i + g) + l] = b.d * v as f32;
                        }
                    }
                }
            });
    }

    /// Unpacks `cols` weight rows of `ty` into the panel.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prepare_panel(
        ty: GgmlType,
        w: &[u8],
        cols: usize,
        k: usize,
        sub: usize,
        p: &mut Panel,
    ) {
        let (ts, kp) = (ty.type_size(), k.next_multiple_of(256));
        let (groups, gb) = (kp / (8 * sub), 256 / (8 * sub));
        p.q.resize(cols * kp, 0);
        p.f.resize(cols * groups * 16, 0.0);
        if ty == GgmlType::Q4_1 {
            // 8 blocks of 32 a group, one a lane; lanes past `k` zero.
            let (per_row, m4) = (k / 32, _mm_set1_epi8(0x0F));
            for c in 0..cols {
                for g in 0..groups {
                    let f = &mut p.f[16 * (c * groups + g)..16 * (c * groups + g + 1)];
                    let u: [__m256i; 8] = std::array::from_fn(|l| {
                        let i = 8 * g + l;
                        if i >= per_row {
                            (f[l], f[8 + l]) = (0.0, 0.0);
                            return _mm256_setzero_si256();
                        }
                        let b =
                            std::slice::from_raw_parts(w.as_ptr().add((c * per_row + i) * ts), ts);
                        (f[l], f[8 + l]) = (f16_at(b, 0), f16_at(b, 2));
                        let qs = _mm_loadu_si128(b.as_ptr().add(4) as *const __m128i);
                        let lo = _mm_and_si128(qs, m4);
                        let hi = _mm_and_si128(_mm_srli_epi16(qs, 4), m4);
                        _mm256_set_m128i(hi, lo)
                    });
                    interleave_block(&u, sub, p.q.as_mut_ptr().add(c * kp + 256 * g));
                }
            }
            return;
        }
        for i in 0..cols * k / 256 {
            let b = w.as_ptr().add(i * ts);
            // The panel is one pass over its weight rows, streamed as the
            // block kernels stream theirs.
            prefetch_ahead(b, WEIGHT_PREFETCH, ts);
            let kb: KBlock = match ty {
                GgmlType::Q4_K => unpack_q45_k::<false>(b),
                GgmlType::Q5_K => unpack_q45_k::<true>(b),
                _ => unpack_q6_k(b),
            };
            interleave_block(&kb.u, sub, p.q.as_mut_ptr().add(256 * i));
            let f = &mut p.f[16 * gb * i..16 * gb * (i + 1)];
            if sub == 32 {
                let sb = std::slice::from_raw_parts(b.add(4), 12);
                for l in 0..8 {
                    let (sc, m) = scale_min_k4(l, sb);
                    f[l] = kb.d * sc as f32;
                    f[8 + l] = kb.dm * m as f32;
                }
            } else {
                let sb = std::slice::from_raw_parts(b.add(192) as *const i8, 16);
                for g in 0..2 {
                    for l in 0..8 {
                        let ds = kb.d * sb[8 * g + l] as f32;
                        f[16 * g + l] = ds;
                        f[16 * g + 8 + l] = -32.0 * ds;
                    }
                }
            }
        }
    }

    /// [`interleave`] of one unpacked block (`u[j]`: elements `32 j..32 j +
    /// 32`) into the 256 bytes at `out`, in registers: each 4-step run of
    /// the 8 lanes is a transpose of 8 rows of 4 i32, two rows to a
    /// register (row `l` in the low half, `l + 4` in the high one).
    #[target_feature(enable = "avx2")]
    unsafe fn interleave_block(u: &[__m256i; 8], sub: usize, out: *mut u8) {
        // For sub-blocks of 32 (Q4_K, Q5_K) the rows of run `h` are the
        // halves `h` of `u[l]`; for 16 (Q6_K), the rows of group `h` are
        // sub-blocks `8 h + l`, the halves `l % 2` of `u[4 h + l / 2]`.
        for h in 0..2 {
            let rows: [__m256i; 4] = std::array::from_fn(|l| {
                let (lo, hi, upper) = if sub == 32 {
                    (u[l], u[l + 4], h == 1)
                } else {
                    (u[4 * h + l / 2], u[4 * h + 2 + l / 2], l % 2 == 1)
                };
                if upper {
                    _mm256_permute2x128_si256(lo, hi, 0x31)
                } else {
                    _mm256_permute2x128_si256(lo, hi, 0x20)
                }
            });
            let t0 = _mm256_unpacklo_epi32(rows[0], rows[1]);
            let t1 = _mm256_unpacklo_epi32(rows[2], rows[3]);
            let t2 = _mm256_unpackhi_epi32(rows[0], rows[1]);
            let t3 = _mm256_unpackhi_epi32(rows[2], rows[3]);
            let steps = [
                _mm256_unpacklo_epi64(t0, t1),
                _mm256_unpackhi_epi64(t0, t1),
                _mm256_unpacklo_epi64(t2, t3),
                _mm256_unpackhi_epi64(t2, t3),
            ];
            for (s, v) in steps.iter().enumerate() {
                _mm256_storeu_si256(out.add(128 * h + 32 * s) as *mut __m256i, *v);
            }
        }
    }

    /// Every x row against the panel's weight rows `j0..j1` with VNNI, in
    /// tiles of `MR` x `NR`, K slice by K slice (`per_slice` groups, summed
    /// into the output), written to columns `j0..j1` of `out` (`[rows, n]`).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn multiply(
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
        let mut t = [[0f32; NR]; MR];
        for g0 in (0..groups).step_by(per_slice) {
            let g1 = (g0 + per_slice).min(groups);
            for r0 in (0..rows).step_by(MR) {
                let rn = (rows - r0).min(MR);
                for c0 in (0..cols).step_by(NR) {
                    let cn = (cols - c0).min(NR);
                    let row = |i: usize| r0 + i.min(rn - 1);
                    let col = |i: usize| c0 + i.min(cn - 1);
                    let tile = Tile {
                        aq: std::array::from_fn(|i| a.q.as_ptr().add(row(i) * k)),
                        ad: std::array::from_fn(|i| a.d.as_ptr().add(row(i) * groups * 8)),
                        as_: std::array::from_fn(|i| a.s.as_ptr().add(row(i) * groups * 8)),
                        wq: std::array::from_fn(|i| p.q.as_ptr().add(col(i) * k)),
                        wf: std::array::from_fn(|i| p.f.as_ptr().add(col(i) * groups * 16)),
                        g0,
                        g1,
                    };
                    macro_rules! go {
                        ($s:literal) => {
                            match (rn, cn) {
                                (4, 2) => tile.run::<4, 2, 1, $s>(&mut t),
                                (3, 2) => tile.run::<3, 2, 1, $s>(&mut t),
                                (2, 2) => tile.run::<2, 2, 2, $s>(&mut t),
                                (1, 2) => tile.run::<1, 2, 2, $s>(&mut t),
                                (4, _) => tile.run::<4, 1, 2, $s>(&mut t),
                                (3, _) => tile.run::<3, 1, 2, $s>(&mut t),
                                (2, _) => tile.run::<2, 1, 2, $s>(&mut t),
                                _ => tile.run::<1, 1, 2, $s>(&mut t),
                            }
                        };
                    }
                    if sub == 32 {
                        go!(8)
                    } else {
                        go!(4)
                    }
                    for (r, tr) in t.iter().enumerate().take(rn) {
                        for (c, v) in tr.iter().enumerate().take(cn) {
                            // SAFETY: `(r0 + r) * n + j0 + c0 + c < rows * n`,
                            // a column of this task's alone.
                            let o = out.0.add((r0 + r) * n + j0 + c0 + c);
                            *o = if g0 == 0 { *v } else { *o + *v };
                        }
                    }
                }
            }
        }
    }

    /// x rows per tile (both paths: the AVX2 one in `kgemm_avx2`).
    pub(in super::super) const MR: usize = 4;
    /// Weight rows per tile (both paths).
    pub(in super::super) const NR: usize = 2;

    /// Pointers to up to `MR` reordered x rows and `NR` weight rows.
    struct Tile {
        aq: [*const i8; MR],
        ad: [*const f32; MR],
        as_: [*const f32; MR],
        wq: [*const u8; NR],
        wf: [*const f32; NR],
        /// The groups of this K slice.
        g0: usize,
        g1: usize,
    }

    /// `acc + u . s` per 4 bytes (`u` unsigned, `s` signed): `vpdpbusd`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn dot(mut acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        asm!(
            "vpdpbusd {a}, {u}, {s}",
            a = inout(ymm_reg) acc,
            u = in(ymm_reg) u,
            s = in(ymm_reg) s,
            options(pure, nomem, nostack)
        );
        acc
    }

    impl Tile {
        /// `out[r][c]` for the first `R` x rows and `C` weight rows, groups of
        /// `S` steps (`vpdpbusd`), the integer sums spread over `P` sets of
        /// registers (enough independent chains to hide latency).
        #[target_feature(enable = "avx2,fma")]
        #[inline]
        unsafe fn run<const R: usize, const C: usize, const P: usize, const S: usize>(
            &self,
            out: &mut [[f32; NR]; MR],
        ) {
            let zero = _mm256_setzero_si256();
            let mut acc = [[_mm256_setzero_ps(); C]; R];
            for g in self.g0..self.g1 {
                let mut part = [[[zero; C]; R]; P];
                for s in 0..S {
                    let isum = &mut part[s % P];
                    let off = (g * S + s) * 32;
                    let mut wv = [zero; C];
                    for (c, v) in wv.iter_mut().enumerate() {
                        *v = _mm256_loadu_si256(self.wq[c].add(off) as *const __m256i);
                    }
                    for (r, row) in isum.iter_mut().enumerate() {
                        let av = _mm256_loadu_si256(self.aq[r].add(off) as *const __m256i);
                        for (c, v) in row.iter_mut().enumerate() {
                            *v = dot(*v, wv[c], av);
                        }
                    }
                }
                let mut isum = part[0];
                for q in &part[1..] {
                    for r in 0..R {
                        for c in 0..C {
                            isum[r][c] = _mm256_add_epi32(isum[r][c], q[r][c]);
                        }
                    }
                }
                for r in 0..R {
                    let d = _mm256_loadu_ps(self.ad[r].add(8 * g));
                    let sums = _mm256_loadu_ps(self.as_[r].add(8 * g));
                    for c in 0..C {
                        let f = self.wf[c].add(16 * g);
                        let scale = _mm256_mul_ps(_mm256_loadu_ps(f), d);
                        let v = _mm256_cvtepi32_ps(isum[r][c]);
                        let a = _mm256_fmadd_ps(v, scale, acc[r][c]);
                        acc[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(f.add(8)), sums, a);
                    }
                }
            }
            for r in 0..R {
                for c in 0..C {
                    out[r][c] = hsum(acc[r][c]);
                }
            }
        }
    }
}
