//! Many-row products of k-quant weights (Q4_K, Q5_K, Q6_K), for prefill
//! and batched decode steps ([`min_rows`]: 8 rows or more with VNNI, 17 on
//! AVX2), and of Q4_1 for batched decode steps of 16-32 rows (17-32 on
//! AVX2):
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
//!   `sum_lanes dot * (d sc) * da + off * (da bsum)`; in register tiles of
//!   x rows by weight rows each load serves several products, and K is
//!   taken in slices so that a tile's operands stay in L1.
//! - The VNNI path lays two groups side by side ([`x86::Layout`], paired)
//!   so that each 512-bit `vpdpbusd` and each f32 step of a group's
//!   epilogue serves two groups.
//!
//! Runs on the AVX-512 VNNI and AVX2 paths ([`super::Isa`]); elsewhere
//! [`matmul`] returns false and the caller takes the dequantized tiles.
//! Here are the layouts, the panel and the activations; the products are
//! [`super::kgemm_vnni`]'s (4 x 4 tiles with the 32 registers of
//! AVX-512) and on AVX2 (no `vpdpbusd`) [`super::kgemm_avx2`]'s (4 x 2),
//! whose `vpmaddubsw` pair sums are added in 16-bit lanes for as many
//! steps as cannot overflow and widened once per run, a third fewer
//! integer instructions than widening every step. The weight panel is
//! reordered in registers (a transpose of 4-byte runs per block), not
//! element by element.

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

/// Whether [`matmul`] handles `ty` on `isa`: the k-quants and Q4_1 (its
/// 32-blocks one lane each, 8 to a group, the activations in 32-blocks as
/// for its block kernels) on both SIMD paths.
pub fn handles(ty: GgmlType, isa: Isa) -> bool {
    cfg!(target_arch = "x86_64")
        && sub_len(ty).is_some()
        && isa != Isa::Scalar
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
/// [`preferred`]: batched decode steps from 8 rows with VNNI, from 17 on
/// AVX2 for Q4_K and Q5_K; Q6_K on AVX2 only past the block kernels' 32
/// rows. `decode_rows_timing` (CPU time, Qwen2.5-1.5B shapes, the GEMM
/// against the block kernels): with VNNI on a Zen 4 (the 4 x 4 tiles of
/// [`super::kgemm_vnni`]) 0.81-1.01x at 8 rows, 0.5-0.9x at 16, 0.37-0.96x
/// at 32, and 1.26-1.69x at 4 (so the blocks keep those); on a 2-core AMD
/// EPYC without AVX-512, Q4_K 0.98-1.0x at 12-16 rows, 0.64-0.85x at 24,
/// 0.74-0.76x at 32; Q5_K 0.63x at 16, 0.76x at 32; Q6_K 1.2-1.35x at
/// 8-32 rows. Q4_1 takes it up to the block kernels' 32 rows (never for
/// prefill: [`preferred`]) from 16 with VNNI (SmolLM2 shapes on the Zen 4:
/// 0.71-0.97x at 16 rows, 0.54-0.72x at 32, 1.1-1.4x at 12) and from 17
/// on AVX2.
pub fn min_rows(ty: GgmlType, isa: Isa) -> usize {
    match (isa, ty) {
        (Isa::Avx512Vnni, GgmlType::Q4_1) => 16,
        (Isa::Avx512Vnni, _) => 8,
        (_, GgmlType::Q6_K) => 33,
        _ => 17,
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
    use super::super::x86::{prefetch_ahead, unpack_q45_k, unpack_q6_k, KBlock, WEIGHT_PREFETCH};
    use super::sub_len;
    use crate::GgmlType;
    use rayon::prelude::*;
    use std::arch::x86_64::*;
    use std::cell::RefCell;

    /// Reordered activations: `q` (`rows * kp` bytes, `kp` = `k` padded as
    /// [`Layout`] says, the padding zero), per (row, group) 8 lanes
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
    /// [`Acts`]) and per (row, group) 8 lanes of `d sc` (Q4_1: `d`) and 8
    /// of the offset factor (Q4_1: `m`; zero in padding lanes), where
    /// [`Layout`] puts them.
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

    /// One tile's operands for the products ([`super::super::kgemm_vnni`],
    /// [`super::super::kgemm_avx2`]): x rows from `aq` (stride `k` bytes),
    /// their block scales `ad` and scaled sums `as_` (8 lanes a group,
    /// stride `8 groups`); weight rows from `wq` (stride `k`) and their
    /// factors `wf` (stride `16 groups`); the groups `g0..g1` of one K slice.
    pub(in super::super) struct Tile {
        pub(in super::super) aq: *const i8,
        pub(in super::super) ad: *const f32,
        pub(in super::super) as_: *const f32,
        pub(in super::super) wq: *const u8,
        pub(in super::super) wf: *const f32,
        pub(in super::super) k: usize,
        pub(in super::super) groups: usize,
        pub(in super::super) g0: usize,
        pub(in super::super) g1: usize,
    }

    impl Tile {
        /// The tile from x row `r0` and panel row `c0` over groups `g0..g1`
        /// of rows reordered to `k` bytes.
        ///
        /// # Safety
        /// `a` and `p` hold those rows (the pointers are computed, not read).
        pub(in super::super) unsafe fn at(
            a: &Acts,
            p: &Panel,
            (r0, c0): (usize, usize),
            k: usize,
            groups: usize,
            (g0, g1): (usize, usize),
        ) -> Tile {
            Tile {
                aq: a.q.as_ptr().add(r0 * k),
                ad: a.d.as_ptr().add(r0 * groups * 8),
                as_: a.s.as_ptr().add(r0 * groups * 8),
                wq: p.q.as_ptr().add(c0 * k),
                wf: p.f.as_ptr().add(c0 * groups * 16),
                k,
                groups,
                g0,
                g1,
            }
        }
    }

    /// Where a group's bytes and factors lie in a reordered row (`kp` = K
    /// rounded up to whole groups of 256, the padding zero). Unpaired
    /// (AVX2), step `s` of group `g` is the 32 bytes at `32 (g S + s)` (`S`
    /// = `sub / 4` steps a group) and its factors the 16 floats at `16 g`
    /// (8 `d sc`, then 8 offsets). Paired (VNNI, whose 512-bit products
    /// take two groups at once), groups `2 h` and `2 h + 1` alternate step
    /// by step, 64 bytes a step, and their factors are the 32 floats at `32
    /// h` (16 `d sc`, then 16 offsets); where a row has an odd number of
    /// groups, its last one lies alone as unpaired (the same offsets: `g`
    /// even). The activations' `d` and `s` are 8 lanes a group in both, so
    /// two groups' lanes are adjacent already.
    #[derive(Clone, Copy, Debug)]
    pub(in super::super) struct Layout {
        pub(in super::super) sub: usize,
        /// Reordered row length in bytes.
        pub(in super::super) kp: usize,
        pub(in super::super) paired: bool,
    }

    impl Layout {
        pub(in super::super) fn new(ty: GgmlType, k: usize, paired: bool) -> Layout {
            let sub = sub_len(ty).expect("a type the GEMM handles");
            let kp = k.next_multiple_of(256);
            Layout { sub, kp, paired }
        }

        pub(in super::super) fn groups(self) -> usize {
            self.kp / (8 * self.sub)
        }

        /// Whether group `g` lies paired with its neighbour (which exists:
        /// its end is within `kp`; no division, as this runs per step).
        fn pairs(self, g: usize) -> bool {
            self.paired && ((g ^ 1) + 1) * 8 * self.sub <= self.kp
        }

        /// Byte offset of step `s` of group `g` in a reordered row.
        fn step_at(self, g: usize, s: usize) -> usize {
            let steps = self.sub / 4;
            if self.pairs(g) {
                ((g / 2) * steps + s) * 64 + (g % 2) * 32
            } else {
                (g * steps + s) * 32
            }
        }

        /// Float offsets of group `g`'s 8 `d sc` and 8 offset factors in a
        /// row's `16 groups` factors.
        fn factors_at(self, g: usize) -> (usize, usize) {
            if self.pairs(g) {
                let base = 32 * (g / 2) + 8 * (g % 2);
                (base, base + 16)
            } else {
                (16 * g, 16 * g + 8)
            }
        }
    }

    /// Most bytes of reordered weights per task and K slice (kept in L2
    /// while every x row passes over them).
    const PANEL_BYTES: usize = 192 * 1024;

    /// Elements of K per slice: a tile's x rows and weight rows of one
    /// slice stay in L1 while it runs (4 x 2 AVX2 tiles at 4096: 24 KiB),
    /// and each tile's f32 sums are reduced and added to the output once a
    /// slice. `products_timing` (one thread, 32 rows): VNNI (4 x 4 tiles)
    /// on a Zen 4, Q4_K 1.2-1.4x at 2048 against 1024, no clear gain past
    /// it; AVX2 on a 2-core AMD EPYC (Zen 3) at 4096 against 1024, three
    /// alternating rounds, Q4_K 1.04-1.15x and Q6_K 1.01-1.09x.
    pub(in super::super) const fn slice(vnni: bool) -> usize {
        if vnni {
            2048
        } else {
            4096
        }
    }

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
            let layout = Layout::new(ty, k, vnni);
            prepare_acts(x, rows, k, ty, layout, acts);
            let rb = super::super::row_bytes(ty, k);
            let kp = layout.kp;
            let per_row = kp.min(slice(vnni)) * 5 / 4;
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
                        prepare_panel(ty, &w[j0 * rb..j1 * rb], j1 - j0, k, layout, panel);
                        let per_slice = (slice(vnni) / (8 * sub)).max(1);
                        if vnni {
                            super::super::kgemm_vnni::multiply(
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

    /// Reorders `nat` (one 256-block, natural order, whose first group is
    /// `g0`) into the reordered row `out` ([`Layout`]): step `s` of a group
    /// holds 4 elements of each of its 8 sub-blocks.
    fn interleave<T: Copy>(nat: &[T; 256], layout: Layout, g0: usize, out: &mut [T]) {
        let sub = layout.sub;
        for g in 0..256 / (8 * sub) {
            for s in 0..sub / 4 {
                let at = layout.step_at(g0 + g, s);
                for l in 0..8 {
                    let (src, dst) = (g * 8 * sub + l * sub + 4 * s, at + 4 * l);
                    out[dst..dst + 4].copy_from_slice(&nat[src..src + 4]);
                }
            }
        }
    }

    /// Quantizes every x row (to 256-blocks; for Q4_1 to 32-blocks, as its
    /// block kernels do) and reorders it into `a`.
    pub(in super::super) fn prepare_acts(
        x: &[f32],
        rows: usize,
        k: usize,
        ty: GgmlType,
        layout: Layout,
        a: &mut Acts,
    ) {
        let (sub, kp, groups) = (layout.sub, layout.kp, layout.groups());
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
                        interleave(&nat, layout, g, q);
                    }
                    return;
                }
                let mut b = [BlockQ8K::default()];
                let gb = 256 / (8 * sub);
                for (i, xb) in x.chunks_exact(256).enumerate() {
                    quantize_q8k(xb, &mut b);
                    let b = &b[0];
                    interleave(&b.q, layout, gb * i, q);
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

    /// Unpacks `cols` weight rows of `ty` into the panel, laid out as
    /// `layout` says (its padding zero).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn prepare_panel(
        ty: GgmlType,
        w: &[u8],
        cols: usize,
        k: usize,
        layout: Layout,
        p: &mut Panel,
    ) {
        let (ts, kp, groups) = (ty.type_size(), layout.kp, layout.groups());
        let (sub, gb) = (layout.sub, 256 / (8 * layout.sub));
        p.q.resize(cols * kp, 0);
        p.f.resize(cols * groups * 16, 0.0);
        if ty == GgmlType::Q4_1 {
            // 8 blocks of 32 a group, one a lane; lanes past `k` zero.
            let (per_row, m4) = (k / 32, _mm_set1_epi8(0x0F));
            for c in 0..cols {
                let f = &mut p.f[16 * c * groups..16 * (c + 1) * groups];
                for g in 0..groups {
                    let (fs, fo) = layout.factors_at(g);
                    let u: [__m256i; 8] = std::array::from_fn(|l| {
                        let i = 8 * g + l;
                        if i >= per_row {
                            (f[fs + l], f[fo + l]) = (0.0, 0.0);
                            return _mm256_setzero_si256();
                        }
                        let b =
                            std::slice::from_raw_parts(w.as_ptr().add((c * per_row + i) * ts), ts);
                        (f[fs + l], f[fo + l]) = (f16_at(b, 0), f16_at(b, 2));
                        let qs = _mm_loadu_si128(b.as_ptr().add(4) as *const __m128i);
                        let lo = _mm_and_si128(qs, m4);
                        let hi = _mm_and_si128(_mm_srli_epi16(qs, 4), m4);
                        _mm256_set_m128i(hi, lo)
                    });
                    interleave_block(&u, layout, g, p.q.as_mut_ptr().add(c * kp));
                }
            }
            return;
        }
        let per_row = k / 256;
        for c in 0..cols {
            let (q, f) = (
                p.q.as_mut_ptr().add(c * kp),
                &mut p.f[16 * c * groups..16 * (c + 1) * groups],
            );
            for i in 0..per_row {
                let b = w.as_ptr().add((c * per_row + i) * ts);
                // The panel is one pass over its weight rows, streamed as
                // the block kernels stream theirs.
                prefetch_ahead(b, WEIGHT_PREFETCH, ts);
                let kb: KBlock = match ty {
                    GgmlType::Q4_K => unpack_q45_k::<false>(b),
                    GgmlType::Q5_K => unpack_q45_k::<true>(b),
                    _ => unpack_q6_k(b),
                };
                interleave_block(&kb.u, layout, gb * i, q);
                if sub == 32 {
                    let (fs, fo) = layout.factors_at(i);
                    let sb = std::slice::from_raw_parts(b.add(4), 12);
                    for l in 0..8 {
                        let (sc, m) = scale_min_k4(l, sb);
                        f[fs + l] = kb.d * sc as f32;
                        f[fo + l] = kb.dm * m as f32;
                    }
                } else {
                    let sb = std::slice::from_raw_parts(b.add(192) as *const i8, 16);
                    for g in 0..2 {
                        let (fs, fo) = layout.factors_at(2 * i + g);
                        for l in 0..8 {
                            let ds = kb.d * sb[8 * g + l] as f32;
                            f[fs + l] = ds;
                            f[fo + l] = -32.0 * ds;
                        }
                    }
                }
            }
        }
    }

    /// [`interleave`] of one unpacked block (`u[j]`: elements `32 j..32 j +
    /// 32`, the block's first group `g0`) into the reordered row at `out`,
    /// in registers: each 4-step run of the 8 lanes is a transpose of 8
    /// rows of 4 i32, two rows to a register (row `l` in the low half, `l +
    /// 4` in the high one).
    #[target_feature(enable = "avx2")]
    unsafe fn interleave_block(u: &[__m256i; 8], layout: Layout, g0: usize, out: *mut u8) {
        // For sub-blocks of 32 (Q4_K, Q5_K) the rows of run `h` are the
        // halves `h` of `u[l]` (steps `4 h..4 h + 4` of the block's one
        // group); for 16 (Q6_K), the rows of group `h` are sub-blocks `8 h +
        // l`, the halves `l % 2` of `u[4 h + l / 2]` (its 4 steps).
        let sub = layout.sub;
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
                let at = if sub == 32 {
                    layout.step_at(g0, 4 * h + s)
                } else {
                    layout.step_at(g0 + h, s)
                };
                _mm256_storeu_si256(out.add(at) as *mut __m256i, *v);
            }
        }
    }
}
