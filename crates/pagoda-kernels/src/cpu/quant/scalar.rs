//! Portable block dot products: one weight row of GGUF blocks against one
//! row of 8-bit activations, integer sums per block, f32 across blocks.
//!
//! These are the reference for the SIMD kernels (same integer sums, so they
//! differ only in the order of the f32 additions) and the path on machines
//! without AVX2. On that path ([`rows`]) the k-quants unpack each block once
//! per group of up to 8 x rows ([`KBlock`]), with the same integer sums as
//! the one-row functions. Layouts follow ggml's `ggml-common.h` (see
//! `pagoda_gguf::dequant`, whose dequantizers they must agree with).

// The loops index several arrays with ggml's offset arithmetic, kept
// recognizable next to the layouts rather than rewritten as iterators.
#![allow(clippy::needless_range_loop)]

use super::act::{BlockQ8, BlockQ8K};

/// The little-endian f16 at byte `i` of `b`, as f32.
#[inline]
pub(super) fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Q4_0/Q4_1 and Q5_0/Q5_1 quants `0..16` / `0..32` of one 32-block
/// (`qh`: the fifth bits, 0 for 4-bit types), dotted with `a.q`.
#[inline]
fn dot_nibbles(qs: &[u8], qh: u32, a: &BlockQ8) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        let lo = (qs[j] & 0x0F) as i32 | ((((qh >> j) & 1) as i32) << 4);
        let hi = (qs[j] >> 4) as i32 | ((((qh >> (j + 16)) & 1) as i32) << 4);
        s += lo * a.q[j] as i32 + hi * a.q[j + 16] as i32;
    }
    s
}

fn qh_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// Q4_0 (18 bytes: d, 16 nibble bytes): `x = d (q - 8)`.
pub fn q4_0(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.chunks_exact(18).zip(a) {
        let d = f16_at(b, 0);
        acc += d * a.d * dot_nibbles(&b[2..18], 0, a) as f32 - 8.0 * d * a.s;
    }
    acc
}

/// Q4_1 (20 bytes: d, m, 16 nibble bytes): `x = d q + m`.
pub fn q4_1(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.chunks_exact(20).zip(a) {
        let s = dot_nibbles(&b[4..20], 0, a);
        acc += f16_at(b, 0) * a.d * s as f32 + f16_at(b, 2) * a.s;
    }
    acc
}

/// Q5_0 (22 bytes: d, qh, 16 nibble bytes): `x = d (q - 16)`.
pub fn q5_0(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.chunks_exact(22).zip(a) {
        let d = f16_at(b, 0);
        acc += d * a.d * dot_nibbles(&b[6..22], qh_at(b, 2), a) as f32 - 16.0 * d * a.s;
    }
    acc
}

/// Q5_1 (24 bytes: d, m, qh, 16 nibble bytes): `x = d q + m`.
pub fn q5_1(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.chunks_exact(24).zip(a) {
        let s = dot_nibbles(&b[8..24], qh_at(b, 4), a);
        acc += f16_at(b, 0) * a.d * s as f32 + f16_at(b, 2) * a.s;
    }
    acc
}

/// Q8_0 (34 bytes: d, 32 signed bytes): `x = d q`.
pub fn q8_0(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.chunks_exact(34).zip(a) {
        let s: i32 = (0..32).map(|j| b[2 + j] as i8 as i32 * a.q[j] as i32).sum();
        acc += f16_at(b, 0) * a.d * s as f32;
    }
    acc
}

/// ggml's `kvalues_iq4nl`, the values of IQ4_NL and IQ4_XS indices.
pub(super) use pagoda_gguf::dequant::iquants::KVALUES_IQ4NL;

/// 16 nibble bytes of table indices (elements `j` and `j + 16` in byte
/// `j`) dotted with 32 activations.
#[inline]
fn dot_iq4(qs: &[u8], a: &[i8]) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        let lo = KVALUES_IQ4NL[(qs[j] & 0x0F) as usize] as i32;
        let hi = KVALUES_IQ4NL[(qs[j] >> 4) as usize] as i32;
        s += lo * a[j] as i32 + hi * a[j + 16] as i32;
    }
    s
}

/// IQ4_NL (18 bytes: d, 16 nibble bytes): `x = d kvalues[q]`.
pub fn iq4_nl(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.chunks_exact(18).zip(a) {
        acc += f16_at(b, 0) * a.d * dot_iq4(&b[2..18], &a.q) as f32;
    }
    acc
}

/// IQ4_XS (136 bytes: d, scales_h, 4 scales_l bytes, 128 nibble bytes):
/// `x = d (sc - 32) kvalues[q]` per 32-element sub-block.
pub fn iq4_xs(w: &[u8], a: &[BlockQ8K]) -> f32 {
    use pagoda_gguf::dequant::iquants::iq4_xs_scale;
    let mut acc = 0f32;
    for (b, a) in w.chunks_exact(136).zip(a) {
        let mut sumi = 0i32;
        for ib in 0..8 {
            let qs = &b[8 + 16 * ib..24 + 16 * ib];
            sumi += iq4_xs_scale(b, ib) * dot_iq4(qs, &a.q[32 * ib..32 * ib + 32]);
        }
        acc += f16_at(b, 0) * a.d * sumi as f32;
    }
    acc
}

/// Q4_K/Q5_K 6-bit (scale, min) of sub-block `j` from the 12 packed bytes.
#[inline]
pub(super) fn scale_min_k4(j: usize, q: &[u8]) -> (i32, i32) {
    if j < 4 {
        ((q[j] & 63) as i32, (q[j + 4] & 63) as i32)
    } else {
        let sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        let m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        (sc as i32, m as i32)
    }
}

/// Sum of the 32 activations of sub-block `j` of a 256-block.
#[inline]
pub(super) fn bsum32(a: &BlockQ8K, j: usize) -> i32 {
    a.bsums[2 * j] as i32 + a.bsums[2 * j + 1] as i32
}

/// Q4_K and Q5_K (`qh` = Some): `x = d sc q - dmin m` per 32-element sub-block.
fn q45_k(w: &[u8], a: &[BlockQ8K], bytes: usize, five: bool) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.chunks_exact(bytes).zip(a) {
        let scales = &b[4..16];
        let (qh, qs) = if five {
            (&b[16..48], &b[48..176])
        } else {
            (&b[0..0], &b[16..144])
        };
        let (mut sumi, mut summ) = (0i32, 0i32);
        for i in 0..4 {
            for half in 0..2 {
                let j = 2 * i + half;
                let (sc, m) = scale_min_k4(j, scales);
                let mut s = 0i32;
                for l in 0..32 {
                    let mut q = (qs[32 * i + l] >> (4 * half)) & 0x0F;
                    if five {
                        q |= ((qh[l] >> j) & 1) << 4;
                    }
                    s += q as i32 * a.q[32 * j + l] as i32;
                }
                sumi += sc * s;
                summ += m * bsum32(a, j);
            }
        }
        acc += a.d * (f16_at(b, 0) * sumi as f32 - f16_at(b, 2) * summ as f32);
    }
    acc
}

/// Q4_K (144 bytes: d, dmin, 12 scale bytes, 128 nibble bytes).
pub fn q4_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    q45_k(w, a, 144, false)
}

/// Q5_K (176 bytes: d, dmin, 12 scale bytes, 32 high-bit bytes, 128 nibble bytes).
pub fn q5_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    q45_k(w, a, 176, true)
}

/// Q6_K (210 bytes: 128 low-nibble bytes, 64 high-bit bytes, 16 i8 scales,
/// d): `x = d sc (q - 32)`, 16 elements per scale.
pub fn q6_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.chunks_exact(210).zip(a) {
        let sc = &b[192..208];
        let mut sumi = 0i32;
        for half in 0..2 {
            let ql = &b[64 * half..64 * half + 64];
            let qh = &b[128 + 32 * half..128 + 32 * half + 32];
            for l in 0..32 {
                let q = [
                    (ql[l] & 0x0F) | ((qh[l] & 3) << 4),
                    (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4),
                    (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                    (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                ];
                for (r, &q) in q.iter().enumerate() {
                    let pos = 128 * half + 32 * r + l;
                    sumi += (sc[pos / 16] as i8 as i32) * (q as i32) * a.q[pos] as i32;
                }
            }
        }
        let corr: i32 = (0..16)
            .map(|g| sc[g] as i8 as i32 * a.bsums[g] as i32)
            .sum();
        acc += f16_at(b, 208) * a.d * (sumi - 32 * corr) as f32;
    }
    acc
}

/// Q2_K (84 bytes: 16 scale bytes (low nibble scale, high nibble min), 64
/// bytes of 2-bit quants, d, dmin): `x = d sc q - dmin m`, 16 per scale.
pub fn q2_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.chunks_exact(84).zip(a) {
        let (scales, qs) = (&b[0..16], &b[16..80]);
        let mut sumi = 0i32;
        for pos in 0..256 {
            let (half, j, l) = (pos / 128, (pos % 128) / 32, pos % 32);
            let q = (qs[32 * half + l] >> (2 * j)) & 3;
            sumi += (scales[pos / 16] & 0x0F) as i32 * q as i32 * a.q[pos] as i32;
        }
        let summ: i32 = (0..16)
            .map(|g| (scales[g] >> 4) as i32 * a.bsums[g] as i32)
            .sum();
        acc += a.d * (f16_at(b, 80) * sumi as f32 - f16_at(b, 82) * summ as f32);
    }
    acc
}

/// Q3_K's 16 signed 6-bit scales from their 12 packed bytes.
#[inline]
pub(super) fn q3_k_scales(sc: &[u8]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (s, o) in out.iter_mut().enumerate() {
        let low = if s < 8 { sc[s] & 0x0F } else { sc[s - 8] >> 4 };
        let high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        *o = (low | (high << 4)) as i32 - 32;
    }
    out
}

/// Q3_K (110 bytes: 32 high-bit mask bytes, 64 bytes of 2-bit quants, 12
/// scale bytes, d): `x = d sc (q - 4)` with `q = low | hbit << 2`, 16 per scale.
pub fn q3_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.chunks_exact(110).zip(a) {
        let (hmask, qs) = (&b[0..32], &b[32..96]);
        let sc = q3_k_scales(&b[96..108]);
        let mut sumi = 0i32;
        for pos in 0..256 {
            let (half, j, l) = (pos / 128, (pos % 128) / 32, pos % 32);
            let low = (qs[32 * half + l] >> (2 * j)) & 3;
            let hbit = (hmask[l] >> (4 * half + j)) & 1;
            sumi += sc[pos / 16] * (low | (hbit << 2)) as i32 * a.q[pos] as i32;
        }
        let corr: i32 = (0..16).map(|g| sc[g] * a.bsums[g] as i32).sum();
        acc += f16_at(b, 108) * a.d * (sumi - 4 * corr) as f32;
    }
    acc
}

/// One k-quant block unpacked for the multi-row products (the layout of
/// the SIMD kernels' `KBlock`): the unsigned quants in element order, a
/// scale per 16 elements, and a factor per 16 elements for the activation
/// sums. Against activations `a` the block is worth `d a.d (sum_g sc[g] (u .
/// a)_g [+ mg . bsums]) [+ dm a.d (mg . bsums)]`, the bracketed term folded
/// into the integer sum when the type's factor is `d` (`fold`).
struct KBlock {
    u: [u8; 256],
    sc: [i32; 16],
    mg: [i32; 16],
    d: f32,
    dm: f32,
}

impl KBlock {
    fn new() -> Self {
        KBlock {
            u: [0; 256],
            sc: [0; 16],
            mg: [0; 16],
            d: 0.0,
            dm: 0.0,
        }
    }
}

/// Q4_K / Q5_K (`five`) into `k`.
fn unpack_q45_k(b: &[u8], five: bool, k: &mut KBlock) {
    let scales = &b[4..16];
    let (qh, qs) = if five {
        (&b[16..48], &b[48..176])
    } else {
        (&b[0..0], &b[16..144])
    };
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, scales);
        k.sc[2 * j..2 * j + 2].fill(sc);
        k.mg[2 * j..2 * j + 2].fill(m);
        let (i, half) = (j / 2, j % 2);
        for l in 0..32 {
            let mut q = (qs[32 * i + l] >> (4 * half)) & 0x0F;
            if five {
                q |= ((qh[l] >> j) & 1) << 4;
            }
            k.u[32 * j + l] = q;
        }
    }
    k.d = f16_at(b, 0);
    k.dm = -f16_at(b, 2);
}

fn unpack_q4_k(b: &[u8], k: &mut KBlock) {
    unpack_q45_k(b, false, k)
}

fn unpack_q5_k(b: &[u8], k: &mut KBlock) {
    unpack_q45_k(b, true, k)
}

/// Q6_K into `k`, the `-32` offset folded into `mg`.
fn unpack_q6_k(b: &[u8], k: &mut KBlock) {
    let sc = &b[192..208];
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        for l in 0..32 {
            let u = &mut k.u[128 * half..];
            u[l] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
            u[l + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
            u[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            u[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    for g in 0..16 {
        k.sc[g] = sc[g] as i8 as i32;
        k.mg[g] = -32 * k.sc[g];
    }
    k.d = f16_at(b, 208);
}

/// Q3_K into `k`, the `-4` offset folded into `mg`.
fn unpack_q3_k(b: &[u8], k: &mut KBlock) {
    let (hmask, qs) = (&b[0..32], &b[32..96]);
    k.sc = q3_k_scales(&b[96..108]);
    for pos in 0..256 {
        let (half, j, l) = (pos / 128, (pos % 128) / 32, pos % 32);
        let low = (qs[32 * half + l] >> (2 * j)) & 3;
        let hbit = (hmask[l] >> (4 * half + j)) & 1;
        k.u[pos] = low | (hbit << 2);
    }
    for g in 0..16 {
        k.mg[g] = -4 * k.sc[g];
    }
    k.d = f16_at(b, 108);
}

/// Q2_K into `k`.
fn unpack_q2_k(b: &[u8], k: &mut KBlock) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    for pos in 0..256 {
        let (half, j, l) = (pos / 128, (pos % 128) / 32, pos % 32);
        k.u[pos] = (qs[32 * half + l] >> (2 * j)) & 3;
    }
    for g in 0..16 {
        k.sc[g] = (scales[g] & 0x0F) as i32;
        k.mg[g] = (scales[g] >> 4) as i32;
    }
    k.d = f16_at(b, 80);
    k.dm = -f16_at(b, 82);
}

/// A k-quant weight row (blocks of `bytes`, unpacked by `unpack`) against
/// `rows` x rows, in groups of up to 8 rows that share each unpacked block.
fn k_rows(
    w: &[u8],
    a: &[BlockQ8K],
    rows: usize,
    out: &mut [f32],
    bytes: usize,
    fold: bool,
    unpack: fn(&[u8], &mut KBlock),
) {
    let nb = a.len() / rows;
    let mut k = KBlock::new();
    for r0 in (0..rows).step_by(8) {
        let g = (rows - r0).min(8);
        let mut acc = [0f32; 8];
        for (i, b) in w.chunks_exact(bytes).take(nb).enumerate() {
            unpack(b, &mut k);
            for (r, acc) in acc[..g].iter_mut().enumerate() {
                let a = &a[(r0 + r) * nb + i];
                let mut sumi = 0i32;
                for (gi, (u, q)) in k.u.chunks_exact(16).zip(a.q.chunks_exact(16)).enumerate() {
                    let s: i32 = u.iter().zip(q).map(|(&u, &q)| u as i32 * q as i32).sum();
                    sumi += k.sc[gi] * s;
                }
                let mins: i32 = k.mg.iter().zip(&a.bsums).map(|(&m, &s)| m * s as i32).sum();
                *acc += if fold {
                    k.d * a.d * (sumi + mins) as f32
                } else {
                    a.d * (k.d * sumi as f32 + k.dm * mins as f32)
                };
            }
        }
        out[r0..r0 + g].copy_from_slice(&acc[..g]);
    }
}

/// The dot products above over `rows` x rows (`a` holds them one after
/// another), the signature the dispatch in [`super`] takes: the 32-block
/// types and IQ4_XS row by row, the k-quants through [`k_rows`].
pub mod rows {
    use super::super::act::{BlockQ8, BlockQ8K};

    macro_rules! rows {
        ($($name:ident: $act:ty),*) => {$(
            pub fn $name(w: &[u8], a: &[$act], rows: usize, out: &mut [f32]) {
                let nb = a.len() / rows;
                for (r, o) in out[..rows].iter_mut().enumerate() {
                    *o = super::$name(w, &a[r * nb..(r + 1) * nb]);
                }
            }
        )*};
    }

    rows!(q4_0: BlockQ8, q4_1: BlockQ8, q5_0: BlockQ8, q5_1: BlockQ8, q8_0: BlockQ8);
    rows!(iq4_nl: BlockQ8, iq4_xs: BlockQ8K);

    macro_rules! k_rows {
        ($($name:ident: $bytes:expr, $fold:expr, $unpack:ident);*) => {$(
            pub fn $name(w: &[u8], a: &[BlockQ8K], rows: usize, out: &mut [f32]) {
                super::k_rows(w, a, rows, out, $bytes, $fold, super::$unpack)
            }
        )*};
    }

    k_rows!(
        q2_k: 84, false, unpack_q2_k;
        q3_k: 110, true, unpack_q3_k;
        q4_k: 144, false, unpack_q4_k;
        q5_k: 176, false, unpack_q5_k;
        q6_k: 210, true, unpack_q6_k
    );
}
