//! Dequantization of ggml tensor data to f32.
//!
//! Each supported type has one function turning one block of bytes into
//! `block_size` f32 values, written from the block layouts of ggml
//! (`ggml-common.h`); [`dequantize_into`] runs it over all blocks in
//! parallel (rayon, a few thousand elements per task). Cost: one pass over
//! the data, output 4 bytes per element; no intermediate buffers.

pub mod iquants;
mod kquants;
mod legacy;

use crate::types::GgmlType;
use rayon::prelude::*;

/// Elements each rayon task converts (a multiple of every block size).
const ELEMENTS_PER_TASK: usize = 16 * 1024;

type BlockFn = fn(&[u8], &mut [f32]);

/// Reads the little-endian f16 at byte `i` of `b` as f32.
#[inline]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

fn block_fn(t: GgmlType) -> Option<BlockFn> {
    Some(match t {
        GgmlType::Q4_0 => legacy::q4_0,
        GgmlType::Q4_1 => legacy::q4_1,
        GgmlType::Q5_0 => legacy::q5_0,
        GgmlType::Q5_1 => legacy::q5_1,
        GgmlType::Q8_0 => legacy::q8_0,
        GgmlType::Q2_K => kquants::q2_k,
        GgmlType::Q3_K => kquants::q3_k,
        GgmlType::Q4_K => kquants::q4_k,
        GgmlType::Q5_K => kquants::q5_k,
        GgmlType::Q6_K => kquants::q6_k,
        GgmlType::IQ4_NL => iquants::iq4_nl,
        GgmlType::IQ4_XS => iquants::iq4_xs,
        _ => return None,
    })
}

/// Dequantizes `data` (whole blocks of type `t`) into `out`, which holds
/// `data.len() / type_size * block_size` elements. Returns the type's name
/// as the error when `t` is not supported.
pub fn dequantize_into(t: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), &'static str> {
    let (bs, ts) = (t.block_size(), t.type_size());
    let elems = ELEMENTS_PER_TASK;
    let bytes = elems / bs * ts;
    let chunks = out.par_chunks_mut(elems).zip(data.par_chunks(bytes));
    match t {
        GgmlType::F32 => chunks.for_each(|(o, d)| {
            for (x, b) in o.iter_mut().zip(d.chunks_exact(4)) {
                *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }),
        GgmlType::F16 => chunks.for_each(|(o, d)| {
            for (x, b) in o.iter_mut().zip(d.chunks_exact(2)) {
                *x = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }),
        GgmlType::BF16 => chunks.for_each(|(o, d)| {
            for (x, b) in o.iter_mut().zip(d.chunks_exact(2)) {
                *x = half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }),
        _ => {
            let f = block_fn(t).ok_or(t.name())?;
            chunks.for_each(|(o, d)| {
                for (ob, db) in o.chunks_exact_mut(bs).zip(d.chunks_exact(ts)) {
                    f(db, ob);
                }
            });
        }
    }
    Ok(())
}

/// Little-endian 16-bit values of `data` as a half type.
pub(crate) fn half_from_le<T: Send>(data: &[u8], from_bits: fn(u16) -> T) -> Vec<T> {
    data.par_chunks_exact(2)
        .map(|b| from_bits(u16::from_le_bytes([b[0], b[1]])))
        .collect()
}
