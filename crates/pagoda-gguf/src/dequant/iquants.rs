//! The non-linear 4-bit types: IQ4_NL (32-element blocks) and IQ4_XS
//! (256-element super-blocks of eight 32-element sub-blocks).
//!
//! Both map each 4-bit index through ggml's 16-entry table
//! [`KVALUES_IQ4NL`] (`kvalues_iq4nl` in `ggml-common.h`) and scale it;
//! nibbles pack element `j` of a 32-element (sub-)block in the low nibble
//! and element `j + 16` in the high nibble of byte `j`, as in Q4_0.

use super::f16_at;

/// ggml's `kvalues_iq4nl`: the value of each 4-bit index, before scaling.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// 16 bytes of nibbles scaled by `d` into 32 values.
fn nibbles(qs: &[u8], d: f32, y: &mut [f32]) {
    for j in 0..16 {
        y[j] = d * KVALUES_IQ4NL[(qs[j] & 0x0F) as usize] as f32;
        y[j + 16] = d * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
    }
}

/// IQ4_NL (18 bytes): d, 16 bytes of nibbles; x = d * kvalues[q].
pub(super) fn iq4_nl(b: &[u8], y: &mut [f32]) {
    nibbles(&b[2..18], f16_at(b, 0), y);
}

/// The 6-bit scale of sub-block `ib` of an IQ4_XS block, minus 32: the low
/// 4 bits from `scales_l` (two per byte), the high 2 from `scales_h`.
pub fn iq4_xs_scale(b: &[u8], ib: usize) -> i32 {
    let scales_h = u16::from_le_bytes([b[2], b[3]]) as i32;
    let low = (b[4 + ib / 2] >> (4 * (ib % 2))) as i32 & 0x0F;
    let high = (scales_h >> (2 * ib)) & 3;
    (low | (high << 4)) - 32
}

/// IQ4_XS (136 bytes): d, scales_h (u16), scales_l (4 bytes), 128 bytes of
/// nibbles (16 per sub-block); x = d * (scale - 32) * kvalues[q].
pub(super) fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for ib in 0..8 {
        let dl = d * iq4_xs_scale(b, ib) as f32;
        nibbles(
            &b[8 + 16 * ib..24 + 16 * ib],
            dl,
            &mut y[32 * ib..32 * ib + 32],
        );
    }
}
