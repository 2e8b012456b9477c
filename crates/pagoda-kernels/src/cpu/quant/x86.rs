//! x86-64 block dot products, one set per instruction set: [`avx2`]
//! (`vpmaddubsw` + `vpmaddwd`) and [`vnni`] (AVX-512 VNNI `vpdpbusd` /
//! `vpdpwssd` on 256-bit registers, through inline assembly so that the
//! crate's minimum Rust version needs no AVX-512 intrinsics).
//!
//! Both sets come from one macro. Every weight block is unpacked once per
//! group of up to 8 x rows and dotted with each row of the group, so that decoding many
//! sequences at once pays the unpacking once per block rather than once per
//! row:
//! - 32-block types: 32 unsigned quants per register (nibbles, plus fifth
//!   bits), multiplied with 32 signed 8-bit activations into 8 i32 lanes
//!   (`udot`), scaled per block in f32; offsets and minimums come from the
//!   activation sums in scalar code.
//! - k-quants ([`KBlock`]): eight registers of unsigned quants and their
//!   16-bit scales, multiplied pairwise into 16-bit sums (`vpmaddubsw`, no
//!   saturation for quants below 64) and scaled into i32 (`kdot`); the
//!   minimum or offset term is the activations' 16-sums (`bsums`) times one
//!   16-bit factor per 16 elements.
//! - IQ4_NL and IQ4_XS look their nibbles up in the 16-entry table
//!   (`vpshufb`) and then take the signed path of Q8_0 (IQ4_XS one row at a
//!   time).
//!
//! The integer sums equal the portable kernels' ([`super::scalar`]) exactly.
//!
//! Both sets prefetch the weights [`WEIGHT_PREFETCH`] bytes ahead of the
//! block they unpack (every cache line of that block's span). On a 2-core
//! AMD EPYC without AVX-512 that raised Qwen2.5-1.5B Q4_K_M decode from
//! 14.2 to 17.8 tok/s at two threads and from 8.1 to 10.0 at one (medians,
//! BENCHMARKS.md): the hardware prefetchers alone left the memory bus
//! under-used there (a plain two-thread read streams 20-23 GB/s, decode
//! without the prefetch 14). On a 2-core Intel Xeon with AVX-512 VNNI the
//! VNNI set without it stalled on the weight loads (44% of the Q4_1
//! kernel's samples on the instruction after the load): SmolLM2 Q4_1
//! decode went from 87-103 to 172-182 tok/s at two threads, Qwen2.5-1.5B
//! Q4_K_M from 14.2-14.3 to 19.5-19.7 (BENCHMARKS.md). (On the AMD EPYC
//! with AVX-512 a prefetch 1 KiB ahead had measured slower; 4 KiB is
//! unmeasured there.)
//!
//! One x row against runs of k-quant weight rows (decode): `one_row`
//! (x86_one_row.rs), on the same unpacking and integer steps; for the
//! 32-block formats each set's `*_one_row` (four weight rows a pass).
//!
//! Safety: every function needs AVX2, FMA and F16C (and the VNNI set AVX-512
//! VNNI + VL), detected by the caller ([`super::Isa::available`]), and a
//! weight row of `a.len() / rows` whole blocks.

use super::act::{BlockQ8, BlockQ8K};
use super::scalar::{q3_k_scales, KVALUES_IQ4NL};
use pagoda_gguf::dequant::iquants::iq4_xs_scale;
use std::arch::x86_64::*;

/// Bytes ahead of the current block the kernels prefetch (measured for
/// the AVX2 set on the AMD machine of the module docs: 3 and 4 KiB alike,
/// 512 B-2 KiB and 8 KiB less).
pub(crate) const WEIGHT_PREFETCH: usize = 4096;

/// Prefetches the cache lines of the `bytes` bytes `dist` past `b`, where
/// `dist > 0` (a constant of the kernel set). Addresses past the weights
/// are harmless: a prefetch never faults.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn prefetch_ahead(b: *const u8, dist: usize, bytes: usize) {
    if dist > 0 {
        for l in 0..bytes.div_ceil(64) {
            _mm_prefetch(b.wrapping_add(dist + 64 * l) as *const i8, _MM_HINT_T0);
        }
    }
}

/// The f16 at `p`, as f32.
///
/// Through `vmovd` from a general register, which zeroes the rest of the
/// vector, so the conversion depends on `p` alone. (`_mm_cvtsi32_si128`
/// here compiles to `vpinsrw` into an arbitrary register, whose other lanes
/// it keeps: in the block loops that register was the running sum of the
/// minimum terms, which chained every block's scale load to the previous
/// block and halved the decode GEMV speed.)
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) unsafe fn fp16(p: *const u8) -> f32 {
    let bits = u16::from_le_bytes([*p, *p.add(1)]) as u32;
    let v: __m128;
    std::arch::asm!(
        "vmovd {v}, {b:e}",
        "vcvtph2ps {v}, {v}",
        b = in(reg) bits,
        v = out(xmm_reg) v,
        options(pure, nomem, nostack)
    );
    _mm_cvtss_f32(v)
}

/// The two f16 at `p` and `p + 2` (a Q4_1 / Q5_1 block's `d` and `m`), as
/// f32: one 32-bit load and one conversion, through `vmovd` as [`fp16`].
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn fp16x2(p: *const u8) -> (f32, f32) {
    let bits = u32::from_le_bytes(*(p as *const [u8; 4]));
    let v: __m128;
    std::arch::asm!(
        "vmovd {v}, {b:e}",
        "vcvtph2ps {v}, {v}",
        b = in(reg) bits,
        v = out(xmm_reg) v,
        options(pure, nomem, nostack)
    );
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// Sum of the 8 lanes (also the k-quant GEMM's, `kgemm`).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// 32 bytes at `p`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// The 32 nibbles of 16 bytes at `p`: low nibbles in bytes 0..16, high in 16..32.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let x = _mm_loadu_si128(p as *const __m128i);
    let hi = _mm_srli_epi16(x, 4);
    _mm256_and_si256(_mm256_set_m128i(hi, x), _mm256_set1_epi8(0x0F))
}

/// The IQ4 table's value (a signed byte) of each index byte (`0..16`).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn iq4_values(idx: __m256i) -> __m256i {
    let t = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
    _mm256_shuffle_epi8(_mm256_set_m128i(t, t), idx)
}

/// 16 in byte `i` where bit `i` of `qh` is set, else 0.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn fifth_bits(qh: u32) -> __m256i {
    let shuf = _mm256_set_epi64x(
        0x0303030303030303,
        0x0202020202020202,
        0x0101010101010101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), shuf);
    let mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(bytes, mask), _mm256_set1_epi64x(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// `(v >> n) & mask` per byte (`n < 8`).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn bits(v: __m256i, n: i32, mask: i8) -> __m256i {
    _mm256_and_si256(
        _mm256_srl_epi16(v, _mm_cvtsi32_si128(n)),
        _mm256_set1_epi8(mask),
    )
}

/// 16-bit scales for [`avx2_ops::sdot`]-style products: `lo` for bytes
/// 0..16, `hi` for 16..32.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn scales16(lo: i32, hi: i32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16))
}

/// One k-quant block unpacked for the multi-row products: register `j`
/// holds the unsigned quants of elements `32 j..32 j + 32` (matching 32
/// activation bytes at offset `32 j`) and `sc[j]` their 16-bit scales (one
/// per 16 elements); `mg` holds one 16-bit factor per 16 elements for the
/// activation sums (`bsums`). The block's value against activations `a` is
/// `d * a.d * (sum_j sc[j] (u[j] . a[j]) [+ mg . bsums]) [+ dm * a.d * (mg . bsums)]`,
/// the bracketed term folded into the integer sum when `dm` is unused.
pub(super) struct KBlock {
    pub(super) u: [__m256i; 8],
    sc: [__m256i; 8],
    mg: __m256i,
    pub(super) d: f32,
    pub(super) dm: f32,
}

/// The 8 six-bit scales and 8 six-bit minimums of a Q4_K / Q5_K block's
/// 12 scale bytes at `p`, one per byte (sub-block `j` in byte `j`), as
/// [`super::scalar::scale_min_k4`] reads them: scales 0..4 and minimums 0..4 are the low 6
/// bits of bytes 0..4 and 4..8; scales and minimums 4..8 take their low 4
/// bits from the nibbles of bytes 8..12 and their top 2 bits from the top
/// bits of bytes 0..4 and 4..8.
#[inline]
pub(super) unsafe fn k4_scales_mins(p: *const u8) -> (u64, u64) {
    let w = |i: usize| u32::from_le_bytes(*(p.add(4 * i) as *const [u8; 4]));
    let (s0, s1, s2) = (w(0), w(1), w(2));
    let (low6, low4, top2) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
    let sc_lo = s0 & low6;
    let sc_hi = (s2 & low4) | (((s0 >> 6) & top2) << 4);
    let m_lo = s1 & low6;
    let m_hi = ((s2 >> 4) & low4) | (((s1 >> 6) & top2) << 4);
    (
        sc_lo as u64 | (sc_hi as u64) << 32,
        m_lo as u64 | (m_hi as u64) << 32,
    )
}

/// `vpshufb` masks that spread one 16-bit lane of a 128-bit half over the
/// whole half: entry `i` picks lane `i`.
const SPREAD16: [[u8; 16]; 8] = {
    let mut m = [[0u8; 16]; 8];
    let mut i = 0;
    while i < 8 {
        let mut b = 0;
        while b < 8 {
            m[i][2 * b] = 2 * i as u8;
            m[i][2 * b + 1] = 2 * i as u8 + 1;
            b += 1;
        }
        i += 1;
    }
    m
};

/// Both halves spread by [`SPREAD16`]: lane `lo` over the low half, lane
/// `hi` over the high one.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn spread(v: __m256i, lo: usize, hi: usize) -> __m256i {
    let m = _mm256_set_m128i(
        _mm_loadu_si128(SPREAD16[hi].as_ptr() as *const __m128i),
        _mm_loadu_si128(SPREAD16[lo].as_ptr() as *const __m128i),
    );
    _mm256_shuffle_epi8(v, m)
}

/// Q4_K (`FIVE` = false, 144 bytes) and Q5_K (176 bytes): `x = d sc q - dmin m`.
///
/// The scales are decoded with word-wide bit operations ([`k4_scales_mins`])
/// and spread to their registers by byte shuffles, with no scalar work per
/// sub-block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn unpack_q45_k<const FIVE: bool>(b: *const u8) -> KBlock {
    let qs = if FIVE { b.add(48) } else { b.add(16) };
    let qh = if FIVE {
        load(b.add(16))
    } else {
        _mm256_setzero_si256()
    };
    let (sc8, m8) = k4_scales_mins(b.add(4));
    let sc16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc8 as i64));
    let sc16 = _mm256_set_m128i(sc16, sc16);
    let m8 = _mm_cvtsi64_si128(m8 as i64);
    let zero = _mm256_setzero_si256();
    let (mut u, mut sc) = ([zero; 8], [zero; 8]);
    for j in 0..4 {
        let q = load(qs.add(32 * j));
        let mut lo = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
        let mut hi = bits(q, 4, 0x0F);
        if FIVE {
            let h1 = bits(qh, 2 * j as i32, 1);
            let h2 = bits(qh, 2 * j as i32 + 1, 1);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(h1, 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(h2, 4));
        }
        (u[2 * j], u[2 * j + 1]) = (lo, hi);
        sc[2 * j] = spread(sc16, 2 * j, 2 * j);
        sc[2 * j + 1] = spread(sc16, 2 * j + 1, 2 * j + 1);
    }
    KBlock {
        u,
        sc,
        // Each minimum twice: one factor per 16 elements.
        mg: _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)),
        d: fp16(b),
        dm: -fp16(b.add(2)),
    }
}

/// Q6_K (210 bytes): `x = d sc (q - 32)`; the `-32` folded into `mg`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn unpack_q6_k(b: *const u8) -> KBlock {
    let zero = _mm256_setzero_si256();
    let (mut u, mut sc) = ([zero; 8], [zero; 8]);
    let m4 = _mm256_set1_epi8(0x0F);
    // The 16 scales as 16-bit lanes; each half of the block's registers
    // takes its scales from one half of them.
    let s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192) as *const __m128i));
    let halves = [
        _mm256_permute2x128_si256(s16, s16, 0x00),
        _mm256_permute2x128_si256(s16, s16, 0x11),
    ];
    for h in 0..2 {
        let ql0 = load(b.add(64 * h));
        let ql1 = load(b.add(64 * h + 32));
        let qh = load(b.add(128 + 32 * h));
        let q = [
            (_mm256_and_si256(ql0, m4), bits(qh, 0, 3)),
            (_mm256_and_si256(ql1, m4), bits(qh, 2, 3)),
            (bits(ql0, 4, 0x0F), bits(qh, 4, 3)),
            (bits(ql1, 4, 0x0F), bits(qh, 6, 3)),
        ];
        for (r, (lo, hi)) in q.into_iter().enumerate() {
            u[4 * h + r] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
            // Scales 8 h + 2 r (low half) and 8 h + 2 r + 1 (high half).
            sc[4 * h + r] = spread(halves[h], 2 * r, 2 * r + 1);
        }
    }
    KBlock {
        u,
        sc,
        mg: _mm256_slli_epi16(_mm256_sub_epi16(zero, s16), 5),
        d: fp16(b.add(208)),
        dm: 0.0,
    }
}

/// Q3_K (110 bytes): `x = d sc (q - 4)`, `q = low | hbit << 2`; the `-4`
/// folded into `mg`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn unpack_q3_k(b: *const u8) -> KBlock {
    let s = q3_k_scales(std::slice::from_raw_parts(b.add(96), 12));
    let hm = load(b);
    let zero = _mm256_setzero_si256();
    let (mut u, mut sc) = ([zero; 8], [zero; 8]);
    for h in 0..2 {
        let q = load(b.add(32 + 32 * h));
        for j in 0..4 {
            let low = bits(q, 2 * j as i32, 3);
            let hb = bits(hm, (4 * h + j) as i32, 1);
            u[4 * h + j] = _mm256_or_si256(low, _mm256_slli_epi16(hb, 2));
            let g = 8 * h + 2 * j;
            sc[4 * h + j] = scales16(s[g], s[g + 1]);
        }
    }
    let mut m = [0i16; 16];
    for (m, s) in m.iter_mut().zip(s) {
        *m = (-4 * s) as i16;
    }
    KBlock {
        u,
        sc,
        mg: load(m.as_ptr() as *const u8),
        d: fp16(b.add(108)),
        dm: 0.0,
    }
}

/// Q2_K (84 bytes): `x = d sc q - dmin m`, 16 elements per (sc, m) nibble pair.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn unpack_q2_k(b: *const u8) -> KBlock {
    let sb = std::slice::from_raw_parts(b, 16);
    let zero = _mm256_setzero_si256();
    let (mut u, mut sc) = ([zero; 8], [zero; 8]);
    for h in 0..2 {
        let q = load(b.add(16 + 32 * h));
        for j in 0..4 {
            u[4 * h + j] = bits(q, 2 * j as i32, 3);
            let g = 8 * h + 2 * j;
            sc[4 * h + j] = scales16((sb[g] & 0x0F) as i32, (sb[g + 1] & 0x0F) as i32);
        }
    }
    let s16 = _mm256_cvtepu8_epi16(_mm_loadu_si128(b as *const __m128i));
    KBlock {
        u,
        sc,
        mg: _mm256_srli_epi16(s16, 4),
        d: fp16(b.add(80)),
        dm: -fp16(b.add(82)),
    }
}

/// The AVX2 integer dot steps.
mod avx2_ops {
    use std::arch::x86_64::*;

    /// `u (unsigned) . s (signed)` per 4 bytes into 8 i32 lanes (no
    /// saturation for `u <= 128`).
    #[target_feature(enable = "avx2")]
    #[inline]
    pub unsafe fn udot(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }

    /// Scales for [`sdot`]: `lo` for bytes 0..16, `hi` for 16..32.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub unsafe fn scales(lo: i32, hi: i32) -> __m256i {
        _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16))
    }

    /// [`udot`] with each half's lanes multiplied by its scale.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub unsafe fn sdot(u: __m256i, s: __m256i, sc: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), sc)
    }

    /// `acc + ` the pairwise `u . s` sums (16-bit, no saturation for `u <=
    /// 64`) times the 16-bit scales `sc16` ([`super::scales16`]).
    #[target_feature(enable = "avx2")]
    #[inline]
    pub unsafe fn kdot(acc: __m256i, u: __m256i, s: __m256i, sc16: __m256i) -> __m256i {
        _mm256_add_epi32(acc, sdot(u, s, sc16))
    }

    /// `acc + ` the pairwise products of 16-bit lanes summed into i32.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub unsafe fn wdot(acc: __m256i, p: __m256i, sc16: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc16))
    }
}

/// The AVX-512 VNNI integer dot steps.
mod vnni_ops {
    use std::arch::asm;
    use std::arch::x86_64::*;

    /// `u (unsigned) . s (signed)` per 4 bytes into 8 i32 lanes (`vpdpbusd`).
    #[target_feature(enable = "avx2")]
    #[inline]
    pub unsafe fn udot(u: __m256i, s: __m256i) -> __m256i {
        let mut acc = _mm256_setzero_si256();
        asm!(
            "vpdpbusd {a}, {u}, {s}",
            a = inout(ymm_reg) acc,
            u = in(ymm_reg) u,
            s = in(ymm_reg) s,
            options(pure, nomem, nostack)
        );
        acc
    }

    /// Scales for [`sdot`]: `lo` for bytes 0..16, `hi` for 16..32.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub unsafe fn scales(lo: i32, hi: i32) -> __m256i {
        _mm256_set_m128i(_mm_set1_epi32(hi), _mm_set1_epi32(lo))
    }

    /// [`udot`] with each half's lanes multiplied by its scale.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub unsafe fn sdot(u: __m256i, s: __m256i, sc: __m256i) -> __m256i {
        _mm256_mullo_epi32(udot(u, s), sc)
    }

    /// `acc + ` the pairwise `u . s` sums (16-bit, no saturation for `u <=
    /// 64`) times the 16-bit scales `sc16` (`vpdpwssd`).
    #[target_feature(enable = "avx2")]
    #[inline]
    pub unsafe fn kdot(acc: __m256i, u: __m256i, s: __m256i, sc16: __m256i) -> __m256i {
        wdot(acc, _mm256_maddubs_epi16(u, s), sc16)
    }

    /// `acc + ` the pairwise products of 16-bit lanes summed into i32
    /// (`vpdpwssd`).
    #[target_feature(enable = "avx2")]
    #[inline]
    pub unsafe fn wdot(mut acc: __m256i, p: __m256i, sc16: __m256i) -> __m256i {
        asm!(
            "vpdpwssd {a}, {p}, {c}",
            a = inout(ymm_reg) acc,
            p = in(ymm_reg) p,
            c = in(ymm_reg) sc16,
            options(pure, nomem, nostack)
        );
        acc
    }
}

macro_rules! kernels {
    ($name:ident, $ops:ident, $prefetch:expr) => {
        pub mod $name {
            use super::$ops::{kdot, scales, sdot, udot};
            use super::*;

            /// A 32-block format over `R` x rows at once (each block is
            /// unpacked once): `$unpack(block) -> (u8 quants, d, m)`; the
            /// sum is `d da (u . a) + (m - off d) s`, `s = da sum(a)`.
            macro_rules! legacy {
                ($fname:ident, $one:ident, $bytes:expr, $off:expr, $signed:expr, |$b:ident| $unpack:expr) => {
                    /// One x row against `out.len()` consecutive weight rows of
                    /// `rb` bytes (decode): `N` weight rows a pass, each with its
                    /// own sums, so that the x block is loaded once for all of
                    /// them and no sum chains every block to the one before.
                    #[target_feature(enable = "avx2,fma,f16c")]
                    pub unsafe fn $one(w: &[u8], rb: usize, a: &[BlockQ8], out: &mut [f32]) {
                        #[target_feature(enable = "avx2,fma,f16c")]
                        #[inline]
                        unsafe fn pass<const N: usize>(w: *const u8, rb: usize, a: &[BlockQ8], out: &mut [f32]) {
                            let mut acc = [_mm256_setzero_ps(); N];
                            let mut corr = [0f32; N];
                            for (i, a) in a.iter().enumerate() {
                                let x = load(a.q.as_ptr() as *const u8);
                                for r in 0..N {
                                    let $b = w.add(r * rb + i * $bytes);
                                    prefetch_ahead($b, $prefetch, $bytes);
                                    let (u, d, m): (__m256i, f32, f32) = $unpack;
                                    let ua = if $signed { _mm256_abs_epi8(u) } else { u };
                                    let mo = if $off == 0.0 { m } else { m - $off * d };
                                    let s = if $signed { _mm256_sign_epi8(x, u) } else { x };
                                    let p = _mm256_cvtepi32_ps(udot(ua, s));
                                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d), p, acc[r]);
                                    corr[r] += mo * a.s;
                                }
                            }
                            for r in 0..N {
                                out[r] = hsum(acc[r]) + corr[r];
                            }
                        }
                        let n = out.len();
                        assert!(rb == a.len() * $bytes && w.len() >= n * rb);
                        let w = w.as_ptr();
                        let mut j = 0;
                        while j + 4 <= n {
                            pass::<4>(w.add(j * rb), rb, a, &mut out[j..j + 4]);
                            j += 4;
                        }
                        let rest = &mut out[j..];
                        match rest.len() {
                            3 => pass::<3>(w.add(j * rb), rb, a, rest),
                            2 => pass::<2>(w.add(j * rb), rb, a, rest),
                            1 => pass::<1>(w.add(j * rb), rb, a, rest),
                            _ => {}
                        }
                    }

                    #[target_feature(enable = "avx2,fma,f16c")]
                    unsafe fn $fname<const R: usize>(w: &[u8], a: &[BlockQ8], out: &mut [f32]) {
                        let nb = a.len() / R;
                        assert!(w.len() >= nb * $bytes && out.len() >= R);
                        let mut acc = [_mm256_setzero_ps(); R];
                        let mut corr = [0f32; R];
                        for i in 0..nb {
                            let $b = w.as_ptr().add(i * $bytes);
                            prefetch_ahead($b, $prefetch, $bytes);
                            let (u, d, m): (__m256i, f32, f32) = $unpack;
                            let ua = if $signed { _mm256_abs_epi8(u) } else { u };
                            // (`$off` is a literal: no multiply when it is 0.)
                            let mo = if $off == 0.0 { m } else { m - $off * d };
                            let dv = _mm256_set1_ps(d);
                            for r in 0..R {
                                let a = &a[r * nb + i];
                                let s = load(a.q.as_ptr() as *const u8);
                                let s = if $signed { _mm256_sign_epi8(s, u) } else { s };
                                let dd = _mm256_mul_ps(dv, _mm256_set1_ps(a.d));
                                let p = _mm256_cvtepi32_ps(udot(ua, s));
                                acc[r] = _mm256_fmadd_ps(dd, p, acc[r]);
                                corr[r] += mo * a.s;
                            }
                        }
                        for r in 0..R {
                            out[r] = hsum(acc[r]) + corr[r];
                        }
                    }
                };
            }

            legacy!(q4_0_r, q4_0_one_row, 18, 8.0, false, |b| (
                nibbles(b.add(2)),
                fp16(b),
                0.0
            ));
            legacy!(q4_1_r, q4_1_one_row, 20, 0.0, false, |b| {
                let (d, m) = fp16x2(b);
                (nibbles(b.add(4)), d, m)
            });
            legacy!(q5_0_r, q5_0_one_row, 22, 16.0, false, |b| {
                let qh = u32::from_le_bytes(*(b.add(2) as *const [u8; 4]));
                let u = _mm256_or_si256(nibbles(b.add(6)), fifth_bits(qh));
                (u, fp16(b), 0.0)
            });
            legacy!(q5_1_r, q5_1_one_row, 24, 0.0, false, |b| {
                let qh = u32::from_le_bytes(*(b.add(4) as *const [u8; 4]));
                let u = _mm256_or_si256(nibbles(b.add(8)), fifth_bits(qh));
                let (d, m) = fp16x2(b);
                (u, d, m)
            });
            // Q8_0: signed weights, so `|w| . (a with w's sign)`.
            legacy!(q8_0_r, q8_0_one_row, 34, 0.0, true, |b| (load(b.add(2)), fp16(b), 0.0));
            // IQ4_NL: the nibbles looked up in the table, signed like Q8_0.
            legacy!(iq4_nl_r, iq4_nl_one_row, 18, 0.0, true, |b| (
                iq4_values(nibbles(b.add(2))),
                fp16(b),
                0.0
            ));

            /// Rows in groups of up to 8, each group one pass over the blocks.
            macro_rules! grouped {
                ($fname:ident, $inner:ident) => {
                    #[target_feature(enable = "avx2,fma,f16c")]
                    pub unsafe fn $fname(w: &[u8], a: &[BlockQ8], rows: usize, out: &mut [f32]) {
                        let nb = a.len() / rows;
                        let mut r0 = 0;
                        while r0 < rows {
                            let g = (rows - r0).min(8);
                            let (a, o) = (&a[r0 * nb..(r0 + g) * nb], &mut out[r0..r0 + g]);
                            match g {
                                1 => $inner::<1>(w, a, o),
                                2 => $inner::<2>(w, a, o),
                                3 => $inner::<3>(w, a, o),
                                4 => $inner::<4>(w, a, o),
                                5 => $inner::<5>(w, a, o),
                                6 => $inner::<6>(w, a, o),
                                7 => $inner::<7>(w, a, o),
                                _ => $inner::<8>(w, a, o),
                            }
                            r0 += g;
                        }
                    }
                };
            }

            grouped!(q4_0, q4_0_r);
            grouped!(q4_1, q4_1_r);
            grouped!(q5_0, q5_0_r);
            grouped!(q5_1, q5_1_r);
            grouped!(q8_0, q8_0_r);
            grouped!(iq4_nl, iq4_nl_r);

            /// IQ4_XS: per 32-element sub-block the looked-up values, signed
            /// like Q8_0, times the sub-block's signed scale.
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn iq4_xs_1(w: &[u8], a: &[BlockQ8K]) -> f32 {
                assert!(w.len() >= a.len() * 136);
                let mut acc = _mm256_setzero_ps();
                for (i, a) in a.iter().enumerate() {
                    let b = w.as_ptr().add(i * 136);
                    let block = std::slice::from_raw_parts(b, 136);
                    let aq = a.q.as_ptr() as *const u8;
                    let mut sumi = _mm256_setzero_si256();
                    for ib in 0..8 {
                        let v = iq4_values(nibbles(b.add(8 + 16 * ib)));
                        let s = _mm256_sign_epi8(load(aq.add(32 * ib)), v);
                        let sc = iq4_xs_scale(block, ib);
                        let p = sdot(_mm256_abs_epi8(v), s, scales(sc, sc));
                        sumi = _mm256_add_epi32(sumi, p);
                    }
                    let d = _mm256_set1_ps(fp16(b) * a.d);
                    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
                }
                hsum(acc)
            }

            /// IQ4_XS, one x row at a time (the weight row stays in L1).
            #[target_feature(enable = "avx2,fma,f16c")]
            pub unsafe fn iq4_xs(w: &[u8], a: &[BlockQ8K], rows: usize, out: &mut [f32]) {
                let nb = a.len() / rows;
                for (r, o) in out[..rows].iter_mut().enumerate() {
                    *o = iq4_xs_1(w, &a[r * nb..(r + 1) * nb]);
                }
            }

            /// A k-quant over rows in groups of up to 8: each block is
            /// unpacked once ([`KBlock`]) per group, then dotted with every
            /// row's 256 activations; with `$fold` the minimum term is added
            /// to the integer sum (its factor is `d`), else scaled by `dm`.
            macro_rules! k_grouped {
                ($fname:ident, $bytes:expr, $fold:expr, $unpack:expr) => {
                    #[target_feature(enable = "avx2,fma,f16c")]
                    pub unsafe fn $fname(w: &[u8], a: &[BlockQ8K], rows: usize, out: &mut [f32]) {
                        #[target_feature(enable = "avx2,fma,f16c")]
                        unsafe fn group<const R: usize>(w: &[u8], a: &[BlockQ8K], out: &mut [f32]) {
                            let nb = a.len() / R;
                            assert!(w.len() >= nb * $bytes && out.len() >= R);
                            let mut acc = [_mm256_setzero_ps(); R];
                            for i in 0..nb {
                                let k: KBlock = $unpack(w.as_ptr().add(i * $bytes));
                                for r in 0..R {
                                    let a = &a[r * nb + i];
                                    let aq = a.q.as_ptr() as *const u8;
                                    // Two sums, so that the products form two chains of 4.
                                    let mut s2 = [_mm256_setzero_si256(); 2];
                                    for j in 0..8 {
                                        s2[j % 2] =
                                            kdot(s2[j % 2], k.u[j], load(aq.add(32 * j)), k.sc[j]);
                                    }
                                    let mut sumi = _mm256_add_epi32(s2[0], s2[1]);
                                    let bs = load(a.bsums.as_ptr() as *const u8);
                                    let mins = _mm256_madd_epi16(k.mg, bs);
                                    if $fold {
                                        sumi = _mm256_add_epi32(sumi, mins);
                                    }
                                    let p = _mm256_cvtepi32_ps(sumi);
                                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(k.d * a.d), p, acc[r]);
                                    if !$fold {
                                        let m = _mm256_cvtepi32_ps(mins);
                                        let dm = _mm256_set1_ps(k.dm * a.d);
                                        acc[r] = _mm256_fmadd_ps(dm, m, acc[r]);
                                    }
                                }
                            }
                            for r in 0..R {
                                out[r] = hsum(acc[r]);
                            }
                        }
                        let nb = a.len() / rows;
                        let mut r0 = 0;
                        while r0 < rows {
                            let g = (rows - r0).min(8);
                            let (a, o) = (&a[r0 * nb..(r0 + g) * nb], &mut out[r0..r0 + g]);
                            match g {
                                1 => group::<1>(w, a, o),
                                2 => group::<2>(w, a, o),
                                3 => group::<3>(w, a, o),
                                4 => group::<4>(w, a, o),
                                5 => group::<5>(w, a, o),
                                6 => group::<6>(w, a, o),
                                7 => group::<7>(w, a, o),
                                _ => group::<8>(w, a, o),
                            }
                            r0 += g;
                        }
                    }
                };
            }

            k_grouped!(q2_k, 84, false, unpack_q2_k);
            k_grouped!(q3_k, 110, true, unpack_q3_k);
            k_grouped!(q4_k, 144, false, unpack_q45_k::<false>);
            k_grouped!(q5_k, 176, false, unpack_q45_k::<true>);
            k_grouped!(q6_k, 210, true, unpack_q6_k);
        }
    };
}

kernels!(avx2, avx2_ops, WEIGHT_PREFETCH);
kernels!(vnni, vnni_ops, WEIGHT_PREFETCH);

#[path = "x86_one_row.rs"]
mod one_row;
pub(super) use one_row::{avx2_one_row, vnni_one_row};
