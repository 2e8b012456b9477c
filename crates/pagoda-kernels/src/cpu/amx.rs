//! `y = x @ w^T` for quantized weights on Intel AMX: the weight widened to
//! bf16 a slice at a time, the activations rounded to bf16, products accumulated in f32
//! by the tile unit (`tdpbf16ps`).
//!
//! - When: x86-64 Linux CPUs that list AMX-TILE and AMX-BF16 (and AVX-512
//!   F/BW for the packing code), once the kernel has granted the process
//!   the tile data state ([`available`]: `arch_prctl(ARCH_REQ_XCOMP_PERM)`
//!   once; a refusal leaves the other paths in place). [`super::matmul`]
//!   takes this path for enough rows ([`MIN_ROWS`], [`KGEMM_MIN_ROWS`]).
//! - Operands: the weight is the A operand (16 weight rows by 32 k of a
//!   row-major bf16 slice: blocks widened straight to bf16 where
//!   [`super::quant::widen_bf16`] has the type, else through f32 and
//!   rounded), the activations the B operand (packed once per call into 1 KiB
//!   tiles of 16 k-pairs by 16 x rows, the layout `tdpbf16ps` reads), so the
//!   weight needs no transpose; each 16 by 16 f32 result tile is transposed
//!   on its way into `y` (one per 16 x rows, 16 features and the whole k).
//! - Work: parallel over tasks of blocks of 32 weight rows. For up to 64 x
//!   rows (batched decode) K is taken in slices of 256: a block's slice is widened into a per-thread buffer
//!   that stays in L1 (with the activations' slice, which every block of
//!   the task reuses) and multiplied, two weight tiles by two activation
//!   tiles at a time (by one for an odd last tile of 16 x rows), into the
//!   block's f32 result tiles, loaded and stored once a slice (`tmm0..3`
//!   results, A in `tmm4..5`, B in `tmm6..7`). For more (prefill) a block's
//!   whole rows are widened once, into L2, and each result tile stays in
//!   its register across the whole k.
//! - Numbers: both operands rounded to nearest-even bf16 (a relative error of
//!   at most 2^-9 each, finer than the 8-bit activations of the block
//!   kernels), products and sums in f32. Padding (x rows past a multiple of
//!   16, weight rows past a multiple of 32) is zeros and never written out.

use super::storage::WeightView;
use rayon::prelude::*;

/// Fewest x rows that take this path (below it the integer block kernels
/// read the weights once with less work per row).
pub(crate) const MIN_ROWS: usize = 8;

/// Fewest x rows that take this path for the k-quants, which the integer
/// GEMM ([`super::quant::kgemm`]) prefers: it keeps up with the tiles below
/// (`super::matmul::takes_amx` has the figures).
pub(crate) const KGEMM_MIN_ROWS: usize = 32;

/// Elements of k per tile (32 bf16 = one 64-byte tile row).
const KC: usize = 32;

/// Whether this path runs here: the CPU has AMX-TILE, AMX-BF16, AVX-512 F
/// and BW, SIMD is not turned off ([`super::set_simd_enabled`]), and the
/// kernel granted the tile data state (asked once per process).
pub(crate) fn available() -> bool {
    super::simd::has_avx2_f16c() && imp::granted()
}

/// Whether `matmul` takes `rows` x rows against a weight of `k` columns.
pub(crate) fn takes(rows: usize, k: usize) -> bool {
    rows >= MIN_ROWS && k > 0 && k.is_multiple_of(KC) && available()
}

/// `y = x @ w^T` for `x: [rows, k]`, `y: [rows, w.rows]` (every element
/// written); the caller checked [`takes`].
pub(crate) fn matmul(x: &[f32], rows: usize, w: WeightView<'_>, y: &mut [f32], threads: usize) {
    let (k, n) = (w.cols, w.rows);
    assert!(takes(rows, k) && x.len() == rows * k && y.len() == rows * n);
    imp::matmul(x, rows, k, w, y, threads);
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use super::super::storage::ViewData;
    use super::*;
    use std::arch::asm;
    use std::arch::x86_64::*;
    use std::cell::RefCell;
    use std::sync::OnceLock;

    /// The CPU lists the features and the kernel granted the tile data.
    pub(super) fn granted() -> bool {
        static GRANTED: OnceLock<bool> = OnceLock::new();
        *GRANTED.get_or_init(|| {
            // CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
            let l7 = __cpuid_count(7, 0);
            let listed = (l7.edx >> 22) & 1 == 1
                && (l7.edx >> 24) & 1 == 1
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw");
            listed && request_tile_data()
        })
    }

    /// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: Linux hands
    /// out the tile data state per process, on request; 0 is granted.
    fn request_tile_data() -> bool {
        const SYS_ARCH_PRCTL: i64 = 158;
        const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
        const XFEATURE_XTILEDATA: i64 = 18;
        let ret: i64;
        // SAFETY: a plain system call with two integer arguments; it reads
        // and writes no memory of ours, and `syscall` clobbers only rcx and
        // r11 (declared) besides the result in rax.
        unsafe {
            asm!(
                "syscall",
                inlateout("rax") SYS_ARCH_PRCTL => ret,
                in("rdi") ARCH_REQ_XCOMP_PERM,
                in("rsi") XFEATURE_XTILEDATA,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        ret == 0
    }

    /// The tile configuration (palette 1): all eight tiles 16 rows of 64 bytes.
    #[repr(C, align(64))]
    struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
        tail: [u8; 16],
    }

    const CONFIG: TileConfig = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
        rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
        tail: [0; 16],
    };

    /// Round to nearest even bf16 (the values here are finite).
    #[inline(always)]
    fn bf16(v: f32) -> u32 {
        let b = v.to_bits();
        b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16
    }

    /// `dst[i] = bf16(src[i])` (`dst` as long as `src`), 16 at a time with
    /// AVX-512 F (the same integer rounding, so the same bits), the tail
    /// one by one.
    #[target_feature(enable = "avx512f")]
    unsafe fn round_row(src: &[f32], dst: &mut [u16]) {
        let n = src.len();
        assert_eq!(dst.len(), n);
        let (one, half) = (_mm512_set1_epi32(1), _mm512_set1_epi32(0x7fff));
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: elements i..i + 16 lie inside both slices.
            let b = _mm512_castps_si512(_mm512_loadu_ps(src.as_ptr().add(i)));
            let odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), one);
            let r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(half, odd)), 16);
            let out = dst.as_mut_ptr().add(i) as *mut __m256i;
            _mm256_storeu_si256(out, _mm512_cvtepi32_epi16(r));
            i += 16;
        }
        for j in i..n {
            dst[j] = bf16(src[j]) as u16;
        }
    }

    /// `y`'s pointer, shared by tasks that write disjoint columns.
    #[derive(Clone, Copy)]
    struct Out(*mut f32);
    // SAFETY: each task writes only its own block's columns of `y`
    // (disjoint), and `matmul` holds `y` borrowed until every task is done.
    unsafe impl Send for Out {}
    unsafe impl Sync for Out {}

    /// A worker's buffers: the bf16 slice of 32 weight rows (`stride_for`
    /// elements a row), an f32 row piece for weights widened through f32,
    /// and the f32 result tiles of its blocks of 32 weight rows (two per
    /// activation tile and block: `acc[(b * tiles + t) * 2 + i]` holds
    /// weight rows `16 i..16 i + 16` of block `b` by x rows `16 t..`).
    #[derive(Default)]
    struct Work {
        slice: Vec<u16>,
        f: Vec<f32>,
        acc: Vec<[f32; 256]>,
    }

    thread_local! {
        /// The packed activations of the call running on this thread.
        static PACKED: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
        static WORK: RefCell<Work> = RefCell::new(Work::default());
    }

    pub(super) fn matmul(
        x: &[f32],
        rows: usize,
        k: usize,
        w: WeightView<'_>,
        y: &mut [f32],
        threads: usize,
    ) {
        let n = w.rows;
        // Activation tiles: 16 x rows each.
        let tiles = rows.div_ceil(16);
        let kcs = k / KC;
        let words = tiles * kcs * 256;
        // Blocks of 32 weight rows per task: enough tasks to share.
        let blocks = n.div_ceil(32);
        let per_task = blocks.div_ceil(4 * threads.max(1)).max(1);
        // Blocks that share each slice of the activations (in L1), so that
        // their result tiles take at most 32 KiB.
        let group = (16 / tiles).max(1);
        let out = Out(y.as_mut_ptr());
        let run = |packed: &mut Vec<u32>| {
            packed.clear();
            packed.resize(words, 0);
            pack(x, rows, k, packed);
            let packed = &packed[..];
            (0..blocks.div_ceil(per_task))
                .into_par_iter()
                .for_each(|task| {
                    let bs = (task * per_task, ((task + 1) * per_task).min(blocks));
                    WORK.with(|cell| {
                        let mut fresh = Work::default();
                        let mut held = cell.try_borrow_mut();
                        let work = match held.as_mut() {
                            Ok(b) => &mut **b,
                            Err(_) => &mut fresh,
                        };
                        for g in (bs.0..bs.1).step_by(group) {
                            let g = (g, (g + group).min(bs.1));
                            // SAFETY: AMX-BF16 and AVX-512 F/BW are present and
                            // the tile data granted (`takes`, checked by the
                            // caller); `packed` holds `tiles` activation tiles of
                            // `kcs` chunks, and this task writes columns 32 g.0..
                            // 32 g.1 (at most n) of the `rows` rows of `y`
                            // ([rows, n]) alone.
                            unsafe { blocks_of(w, g, work, packed, tiles, rows, out) };
                        }
                    });
                });
        };
        PACKED.with(|cell| match cell.try_borrow_mut() {
            Ok(mut b) => run(&mut b),
            Err(_) => run(&mut Vec::new()),
        });
    }

    /// Packs `x` ([rows, k] f32) into bf16 activation tiles: tile `t`, chunk
    /// `c` is 256 words at `(t * kcs + c) * 256`, word `p * 16 + r` holding
    /// x row `16 t + r` at k `32 c + 2 p` (low half) and `+ 1` (high half).
    /// Rows past `rows` stay zero.
    fn pack(x: &[f32], rows: usize, k: usize, packed: &mut [u32]) {
        let kcs = k / KC;
        packed
            .par_chunks_mut(kcs * 256)
            .enumerate()
            .for_each(|(t, tile)| {
                for r in 0..16 {
                    let row = t * 16 + r;
                    if row >= rows {
                        break;
                    }
                    let xr = &x[row * k..(row + 1) * k];
                    for (c, chunk) in xr.chunks_exact(KC).enumerate() {
                        let dst = &mut tile[c * 256..(c + 1) * 256];
                        for (p, pair) in chunk.chunks_exact(2).enumerate() {
                            dst[p * 16 + r] = bf16(pair[0]) | (bf16(pair[1]) << 16);
                        }
                    }
                }
            });
    }

    /// Elements of k widened at a time for up to [`MAX_SLICED_TILES`]
    /// activation tiles (a whole number of blocks of every type: 256 or the
    /// row's rest, a multiple of 32).
    const SLICE: usize = 256;

    /// Most activation tiles that take k in slices. Past them (prefill) a
    /// block's whole rows are widened once (into L2) and each result tile
    /// stays in its register across the whole k: slices would load and
    /// store every result tile once a slice (Qwen2.5-1.5B prefill chunks
    /// ran 0.86x as fast sliced).
    const MAX_SLICED_TILES: usize = 4;

    /// Elements of k taken at a time for `tiles` activation tiles.
    fn slice_len(tiles: usize, k: usize) -> usize {
        if tiles <= MAX_SLICED_TILES {
            SLICE
        } else {
            k
        }
    }

    /// Elements a row of the widened slice takes for slices of `len`: one
    /// cache line more, so that a tile's 16 rows do not share cache sets.
    fn stride_for(len: usize) -> usize {
        len + 32
    }

    /// Weight rows `r0..r0 + nr`, elements `k0..k0 + len` (whole blocks), as
    /// bf16 rows of `stride` in `dst`: straight from the blocks where
    /// [`super::super::quant::widen_bf16`] has the type, else through f32
    /// (`f`) and rounded.
    fn widen(
        w: WeightView<'_>,
        (r0, nr): (usize, usize),
        (k0, len): (usize, usize),
        (dst, stride): (&mut [u16], usize),
        f: &mut Vec<f32>,
    ) {
        use super::super::quant::{dequantize, row_bytes, widen_bf16};
        let k = w.cols;
        if let ViewData::Quant(ty, bytes) = w.data {
            if widen_bf16::rows(ty, bytes, k, (r0, nr), (k0, len), dst, stride) {
                return;
            }
        }
        f.resize(len, 0.0);
        for (i, d) in dst.chunks_exact_mut(stride).take(nr).enumerate() {
            let at = (r0 + i) * k + k0;
            match w.data {
                ViewData::F32(v) => f.copy_from_slice(&v[at..at + len]),
                ViewData::F16(v) => super::super::convert::f16_to_f32(&v[at..at + len], f),
                ViewData::BF16(v) => super::super::convert::bf16_to_f32(&v[at..at + len], f),
                ViewData::Quant(ty, bytes) => {
                    let (rb, bs, ts) = (row_bytes(ty, k), ty.block_size(), ty.type_size());
                    let row = (r0 + i) * rb;
                    dequantize(
                        ty,
                        &bytes[row + k0 / bs * ts..row + (k0 + len) / bs * ts],
                        f,
                    );
                }
            }
            // SAFETY: this path runs only where `granted` saw AVX-512 F.
            unsafe { round_row(f, &mut d[..len]) };
        }
    }

    /// The blocks `bs.0..bs.1` of 32 weight rows (those below `w.rows`)
    /// against every activation tile. K is taken in slices: each block's
    /// slice is widened into `work.slice` (where the tile loads find it in
    /// L1, with the activations' slice, which every block here reuses) and
    /// multiplied, two weight tiles by two activation tiles at a
    /// time (by one for an odd last tile), into the block's result tiles in
    /// `work.acc`, loaded and stored once a slice; then each result tile is
    /// transposed into `y`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn blocks_of(
        w: WeightView<'_>,
        bs: (usize, usize),
        work: &mut Work,
        packed: &[u32],
        tiles: usize,
        rows: usize,
        y: Out,
    ) {
        let (k, n) = (w.cols, w.rows);
        let kcs = k / KC;
        let Work { slice, f, acc } = work;
        let piece = slice_len(tiles, k);
        let stride = stride_for(piece);
        slice.resize(32 * stride, 0);
        acc.resize((bs.1 - bs.0) * tiles * 2, [0.0; 256]);
        let (sa, s64) = (stride * 2, 64usize);
        // SAFETY (all the asm below): the configuration is a valid palette-1
        // layout; every tile load reads 16 rows of 64 bytes inside `slice`
        // (rows 0..32 of `stride` elements, k < piece), inside
        // `packed` (tile t or t + 1 < tiles, chunks c0..c0 + cs of kcs, 1
        // KiB each) or one 1 KiB array of `acc`, and every store writes one
        // array of `acc`. The tile registers are used by no code but this
        // function's, which configures them first and releases them last.
        asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly));
        for k0 in (0..k).step_by(piece) {
            let len = (k - k0).min(piece);
            let (c0, cs) = (k0 / KC, len / KC);
            for b in bs.0..bs.1 {
                let nr = (n - 32 * b).min(32);
                // Rows past `nr` (the last block's) zero in every slice.
                slice[nr * stride..].fill(0);
                widen(w, (32 * b, nr), (k0, len), (slice, stride), f);
                let a0 = slice.as_ptr();
                let a1 = a0.add(16 * stride);
                let acc = acc[(b - bs.0) * tiles * 2..].as_mut_ptr();
                for t in (0..tiles).step_by(2) {
                    let b0 = packed.as_ptr().add((t * kcs + c0) * 256);
                    // Result tiles: tmm0 / tmm2 weight halves 0 / 1 by x
                    // tile t, tmm1 / tmm3 by x tile t + 1.
                    let o = [
                        acc.add(2 * t),
                        acc.add(2 * t + 2),
                        acc.add(2 * t + 1),
                        acc.add(2 * t + 3),
                    ];
                    if t + 1 < tiles {
                        let b1 = b0.add(kcs * 256);
                        if k0 == 0 {
                            asm!(
                                "tilezero tmm0",
                                "tilezero tmm1",
                                "tilezero tmm2",
                                "tilezero tmm3",
                                options(nostack, nomem)
                            );
                        } else {
                            asm!(
                                "tileloadd tmm0, [{o0} + {s}*1]",
                                "tileloadd tmm1, [{o1} + {s}*1]",
                                "tileloadd tmm2, [{o2} + {s}*1]",
                                "tileloadd tmm3, [{o3} + {s}*1]",
                                o0 = in(reg) o[0], o1 = in(reg) o[1], o2 = in(reg) o[2], o3 = in(reg) o[3],
                                s = in(reg) s64,
                                options(nostack, readonly),
                            );
                        }
                        asm!(
                            "2:",
                            "tileloadd tmm4, [{a0} + {sa}*1]",
                            "tileloadd tmm6, [{b0} + {s}*1]",
                            "tdpbf16ps tmm0, tmm4, tmm6",
                            "tileloadd tmm7, [{b1} + {s}*1]",
                            "tdpbf16ps tmm1, tmm4, tmm7",
                            "tileloadd tmm5, [{a1} + {sa}*1]",
                            "tdpbf16ps tmm2, tmm5, tmm6",
                            "tdpbf16ps tmm3, tmm5, tmm7",
                            "add {a0}, 64",
                            "add {a1}, 64",
                            "add {b0}, 1024",
                            "add {b1}, 1024",
                            "dec {c}",
                            "jnz 2b",
                            "tilestored [{o0} + {s}*1], tmm0",
                            "tilestored [{o1} + {s}*1], tmm1",
                            "tilestored [{o2} + {s}*1], tmm2",
                            "tilestored [{o3} + {s}*1], tmm3",
                            a0 = inout(reg) a0 => _,
                            a1 = inout(reg) a1 => _,
                            b0 = inout(reg) b0 => _,
                            b1 = inout(reg) b1 => _,
                            c = inout(reg) cs => _,
                            sa = in(reg) sa,
                            s = in(reg) s64,
                            o0 = in(reg) o[0],
                            o1 = in(reg) o[1],
                            o2 = in(reg) o[2],
                            o3 = in(reg) o[3],
                            options(nostack),
                        );
                    } else {
                        if k0 == 0 {
                            asm!("tilezero tmm0", "tilezero tmm2", options(nostack, nomem));
                        } else {
                            asm!(
                                "tileloadd tmm0, [{o0} + {s}*1]",
                                "tileloadd tmm2, [{o2} + {s}*1]",
                                o0 = in(reg) o[0], o2 = in(reg) o[2],
                                s = in(reg) s64,
                                options(nostack, readonly),
                            );
                        }
                        asm!(
                            "2:",
                            "tileloadd tmm4, [{a0} + {sa}*1]",
                            "tileloadd tmm6, [{b0} + {s}*1]",
                            "tdpbf16ps tmm0, tmm4, tmm6",
                            "tileloadd tmm5, [{a1} + {sa}*1]",
                            "tdpbf16ps tmm2, tmm5, tmm6",
                            "add {a0}, 64",
                            "add {a1}, 64",
                            "add {b0}, 1024",
                            "dec {c}",
                            "jnz 2b",
                            "tilestored [{o0} + {s}*1], tmm0",
                            "tilestored [{o2} + {s}*1], tmm2",
                            a0 = inout(reg) a0 => _,
                            a1 = inout(reg) a1 => _,
                            b0 = inout(reg) b0 => _,
                            c = inout(reg) cs => _,
                            sa = in(reg) sa,
                            s = in(reg) s64,
                            o0 = in(reg) o[0],
                            o2 = in(reg) o[2],
                            options(nostack),
                        );
                    }
                }
            }
        }
        asm!("tilerelease", options(nostack, nomem));
        for b in bs.0..bs.1 {
            let (j0, nr) = (32 * b, (n - 32 * b).min(32));
            for t in 0..tiles {
                let r0 = 16 * t;
                for i in 0..2 {
                    let j = 16 * i;
                    if j >= nr {
                        break;
                    }
                    store_transposed(
                        &acc[((b - bs.0) * tiles + t) * 2 + i],
                        y,
                        n,
                        r0,
                        (rows - r0).min(16),
                        j0 + j,
                        (nr - j).min(16),
                    );
                }
            }
        }
    }

    /// `y[r0 + r][c0 + j] = a[j * 16 + r]` for `r < nrows`, `j < ncols`.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn store_transposed(
        a: &[f32; 256],
        y: Out,
        n: usize,
        r0: usize,
        nrows: usize,
        c0: usize,
        ncols: usize,
    ) {
        let mut v: [__m512; 16] = std::array::from_fn(|j| _mm512_loadu_ps(a.as_ptr().add(j * 16)));
        // Four rounds, each swapping bit `b` of the row index with bit `b`
        // of the column index (rows i and i + b trade their b-blocks).
        for b in [8usize, 4, 2, 1] {
            let lo: [i32; 16] = std::array::from_fn(|e| {
                if e & b == 0 {
                    e as i32
                } else {
                    (16 + e - b) as i32
                }
            });
            let hi: [i32; 16] = std::array::from_fn(|e| {
                if e & b == 0 {
                    (e + b) as i32
                } else {
                    (16 + e) as i32
                }
            });
            let (lo, hi) = (
                _mm512_loadu_si512(lo.as_ptr().cast()),
                _mm512_loadu_si512(hi.as_ptr().cast()),
            );
            for i in (0..16).filter(|i| i & b == 0) {
                let (p, q) = (v[i], v[i + b]);
                v[i] = _mm512_permutex2var_ps(p, lo, q);
                v[i + b] = _mm512_permutex2var_ps(p, hi, q);
            }
        }
        let mask: __mmask16 = if ncols >= 16 {
            0xffff
        } else {
            (1u16 << ncols) - 1
        };
        for (r, row) in v.iter().enumerate().take(nrows) {
            _mm512_mask_storeu_ps(y.0.add((r0 + r) * n + c0), mask, *row);
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn vector_rounding_is_the_scalar_rounding() {
            if !granted() {
                return;
            }
            // Ties both ways, values next to them, signs, and a 7-element tail.
            let mut src = vec![1.0f32, -2.5, 0.0, -0.0, 1e-30, 65504.0];
            for hi in [0x3f80_0000u32, 0xbf81_0000, 0x4000_0000] {
                for lo in [0x7fff, 0x8000, 0x8001, 0x18000, 0xffff] {
                    src.push(f32::from_bits(hi | lo));
                }
            }
            src.extend((0..32).map(|i| (i as f32 * 0.37).sin() * 1e3));
            let mut got = vec![0u16; src.len()];
            // SAFETY: `granted` saw AVX-512 F.
            unsafe { round_row(&src, &mut got) };
            for (g, v) in got.iter().zip(&src) {
                assert_eq!(*g as u32, bf16(*v), "{v}");
            }
        }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod imp {
    use super::*;

    pub(super) fn granted() -> bool {
        false
    }

    pub(super) fn matmul(
        _: &[f32],
        _: usize,
        _: usize,
        _: WeightView<'_>,
        _: &mut [f32],
        _: usize,
    ) {
        unreachable!("amx::takes is false off x86-64 Linux")
    }
}

#[cfg(test)]
#[path = "amx_tests.rs"]
mod tests;
