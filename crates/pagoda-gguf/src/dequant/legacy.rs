//! The 32-element block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
//!
//! Layouts (little-endian): `d` (and `m`) are f16 scale (and minimum); 4-bit
//! quants pack element `j` in the low nibble and element `j + 16` in the high
//! nibble of byte `j`; Q5 types add a u32 `qh` whose bit `j` is the fifth bit
//! of element `j`. Values: `(q - offset) * d`, or `q * d + m` with a minimum.

use super::f16_at;

/// Q4_0: d, 16 bytes of nibbles; x = (q - 8) * d.
pub(super) fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

/// Q4_1: d, m, 16 bytes of nibbles; x = q * d + m.
pub(super) fn q4_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        y[j] = (qs[j] & 0x0F) as f32 * d + m;
        y[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

fn qh_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// Q5_0: d, qh, 16 bytes of nibbles; x = (q - 16) * d.
pub(super) fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = qh_at(b, 2);
    let qs = &b[6..22];
    for j in 0..16 {
        let h0 = ((qh >> j) & 1) << 4;
        let h1 = ((qh >> (j + 16)) & 1) << 4;
        y[j] = ((u32::from(qs[j] & 0x0F) | h0) as i32 - 16) as f32 * d;
        y[j + 16] = ((u32::from(qs[j] >> 4) | h1) as i32 - 16) as f32 * d;
    }
}

/// Q5_1: d, m, qh, 16 bytes of nibbles; x = q * d + m.
pub(super) fn q5_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = qh_at(b, 4);
    let qs = &b[8..24];
    for j in 0..16 {
        let h0 = ((qh >> j) & 1) << 4;
        let h1 = ((qh >> (j + 16)) & 1) << 4;
        y[j] = (u32::from(qs[j] & 0x0F) | h0) as f32 * d + m;
        y[j + 16] = (u32::from(qs[j] >> 4) | h1) as f32 * d + m;
    }
}

/// Q8_0: d, 32 signed bytes; x = q * d.
pub(super) fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (x, &q) in y.iter_mut().zip(&b[2..34]) {
        *x = q as i8 as f32 * d;
    }
}
