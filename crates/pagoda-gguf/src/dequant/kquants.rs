//! The 256-element "k-quant" super-block types: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
//!
//! A super-block has one or two f16 super-scales and 8 or 16 sub-block scales
//! quantized to 4, 6 or 8 bits. Element order within a super-block follows
//! ggml: quant bytes are walked in 32-byte groups, each group's bit planes
//! (low nibble / high nibble, or 2-bit shifts) giving consecutive runs of 32
//! elements.

use super::f16_at;

/// Q4_K/Q5_K 6-bit (scale, min) of sub-block `j` from the 12 packed bytes:
/// sub-blocks 0..4 use the low 6 bits of bytes j and j+4; sub-blocks 4..8
/// take their low 4 bits from byte j+4 and their top 2 bits from the top
/// bits of bytes j-4 (scale) and j (min).
#[inline]
fn scale_min_k4(j: usize, q: &[u8]) -> (f32, f32) {
    if j < 4 {
        ((q[j] & 63) as f32, (q[j + 4] & 63) as f32)
    } else {
        let sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        let m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        (sc as f32, m as f32)
    }
}

/// Q2_K: 16 scale bytes (low nibble scale, high nibble min), 64 bytes of
/// 2-bit quants, d, dmin; x = d * sc * q - dmin * m, 16 elements per scale.
pub(super) fn q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for j in 0..4 {
            let shift = 2 * j;
            for part in 0..2 {
                let sc = scales[8 * half + 2 * j + part];
                let dl = d * (sc & 0x0F) as f32;
                let ml = dmin * (sc >> 4) as f32;
                let base = 128 * half + 32 * j + 16 * part;
                for l in 0..16 {
                    let qv = (q[16 * part + l] >> shift) & 3;
                    y[base + l] = dl * qv as f32 - ml;
                }
            }
        }
    }
}

/// Q3_K: 32 bytes of high-bit masks, 64 bytes of 2-bit quants, 12 bytes of
/// 6-bit scales (offset 32), d; x = d * (sc - 32) * (q - (hbit ? 0 : 4)).
pub(super) fn q3_k(b: &[u8], y: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let sc = &b[96..108];
    let d = f16_at(b, 108);
    let mut scales = [0f32; 16];
    for (s, out) in scales.iter_mut().enumerate() {
        let low = if s < 8 { sc[s] & 0x0F } else { sc[s - 8] >> 4 };
        let high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        *out = ((low | (high << 4)) as i32 - 32) as f32;
    }
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for j in 0..4 {
            let shift = 2 * j;
            let bit = 1u8 << (4 * half + j);
            for k in 0..32 {
                let idx = 128 * half + 32 * j + k;
                let low = ((q[k] >> shift) & 3) as i32;
                let sub = if hmask[k] & bit != 0 { 0 } else { 4 };
                y[idx] = d * scales[idx / 16] * (low - sub) as f32;
            }
        }
    }
}

/// Q4_K: d, dmin, 12 bytes of 6-bit (scale, min) pairs, 128 bytes of
/// nibbles; each 32-byte group gives 32 elements from low nibbles (sub-block
/// 2i) then 32 from high nibbles (sub-block 2i+1).
pub(super) fn q4_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for i in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * i, scales);
        let (sc2, m2) = scale_min_k4(2 * i + 1, scales);
        let (d1, min1, d2, min2) = (d * sc1, dmin * m1, d * sc2, dmin * m2);
        let q = &qs[32 * i..32 * i + 32];
        let out = &mut y[64 * i..64 * i + 64];
        for l in 0..32 {
            out[l] = d1 * (q[l] & 0x0F) as f32 - min1;
            out[l + 32] = d2 * (q[l] >> 4) as f32 - min2;
        }
    }
}

/// Q5_K: Q4_K plus 32 bytes `qh`; bit 2i of `qh[l]` is the fifth bit of the
/// low-nibble element l of group i, bit 2i+1 that of the high-nibble one.
pub(super) fn q5_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for i in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * i, scales);
        let (sc2, m2) = scale_min_k4(2 * i + 1, scales);
        let (d1, min1, d2, min2) = (d * sc1, dmin * m1, d * sc2, dmin * m2);
        let (u1, u2) = (1u8 << (2 * i), 2u8 << (2 * i));
        let q = &qs[32 * i..32 * i + 32];
        let out = &mut y[64 * i..64 * i + 64];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            out[l] = d1 * ((q[l] & 0x0F) + h1) as f32 - min1;
            out[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - min2;
        }
    }
}

/// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit high parts, 16 signed
/// 8-bit scales, d; x = d * sc * (q - 32), 16 elements per scale.
pub(super) fn q6_k(b: &[u8], y: &mut [f32]) {
    let ql_all = &b[0..128];
    let qh_all = &b[128..192];
    let sc_all = &b[192..208];
    let d = f16_at(b, 208);
    for half in 0..2 {
        let ql = &ql_all[64 * half..64 * half + 64];
        let qh = &qh_all[32 * half..32 * half + 32];
        let sc = &sc_all[8 * half..8 * half + 8];
        let out = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            out[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            out[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            out[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            out[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}
