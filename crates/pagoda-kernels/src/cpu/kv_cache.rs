//! One layer's paged KV cache on the CPU: K and V, each `[num_blocks,
//! block_size, num_kv_heads, head_dim]`, zero-filled at allocation (allocated zeroed: pages
//! the OS supplies as zeros on first touch).
//!
//! Two element types ([`crate::kv_dtype`]): f32 (the native cache), or FP8
//! E4M3 bytes through [`crate::fp8`] with one scale for K and one for V
//! (`value = byte * scale`). The FP8 cache is the reference the CUDA FP8
//! cache is tested against: writes divide by the scale and round to nearest
//! even with saturation; reads ([`CpuKvCache::extend_k`] and `extend_v`)
//! give the dequantized f32 values. Block copies move whole slots of
//! either type unchanged.

use crate::fp8::{e4m3_to_f32, f32_to_e4m3};
use crate::{KernelError, KvCacheShape, Result};
use pagoda_core::BlockCopy;
use std::borrow::Cow;

/// The elements of K and V.
#[derive(Debug, Clone)]
pub(crate) enum KvData {
    F32 {
        k: Vec<f32>,
        v: Vec<f32>,
    },
    Fp8 {
        k: Vec<u8>,
        v: Vec<u8>,
        k_scale: f32,
        v_scale: f32,
    },
}

/// One layer's paged KV cache.
#[derive(Debug, Clone)]
pub struct CpuKvCache {
    pub(crate) shape: KvCacheShape,
    pub(crate) data: KvData,
}

/// Element types whose all-zero bytes are the value zero.
///
/// # Safety
/// An implementor must be a non-zero-sized type for which every byte 0 is
/// a valid value.
unsafe trait ZeroBits: Copy {}
// SAFETY: both are 4 and 1 bytes; zero bytes are 0.0 and 0.
unsafe impl ZeroBits for f32 {}
unsafe impl ZeroBits for u8 {}

/// `n` zeros, allocated zeroed rather than written: the allocator takes
/// fresh pages, which the OS zeroes on first touch, so the cache costs no
/// start-up time to clear and its untouched blocks no resident memory
/// (writing the zeros took 3.1 s of a 32-sequence bench's start on a
/// 2-core machine). A refused allocation is an error, not an abort.
fn zeros<T: ZeroBits>(n: usize, shape: KvCacheShape) -> Result<Vec<T>> {
    let oom = |what: &str| KernelError::OutOfMemory(format!("KV cache {shape:?}: {what}"));
    if n == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<T>(n).map_err(|e| oom(&e.to_string()))?;
    // SAFETY: the layout's size is non-zero (n > 0, T not zero-sized, as
    // ZeroBits requires).
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if p.is_null() {
        return Err(oom(&format!("{} bytes refused", layout.size())));
    }
    // SAFETY: p comes from the global allocator with T's alignment and a
    // size of exactly n elements (Layout::array), and all n are
    // initialized: zero bytes are valid Ts (ZeroBits).
    Ok(unsafe { Vec::from_raw_parts(p, n, n) })
}

impl CpuKvCache {
    /// A zero-filled cache, of FP8 bytes (scales 1.0) when `fp8`, else f32.
    pub(crate) fn new(shape: KvCacheShape, fp8: bool) -> Result<Self> {
        let n = shape.elements();
        let data = if fp8 {
            KvData::Fp8 {
                k: zeros(n, shape)?,
                v: zeros(n, shape)?,
                k_scale: 1.0,
                v_scale: 1.0,
            }
        } else {
            KvData::F32 {
                k: zeros(n, shape)?,
                v: zeros(n, shape)?,
            }
        };
        Ok(CpuKvCache { shape, data })
    }

    pub fn shape(&self) -> KvCacheShape {
        self.shape
    }

    /// Whether the cache holds FP8 bytes.
    pub fn is_fp8(&self) -> bool {
        matches!(self.data, KvData::Fp8 { .. })
    }

    /// The K and V scales (1.0 for an f32 cache).
    pub fn scales(&self) -> (f32, f32) {
        match self.data {
            KvData::F32 { .. } => (1.0, 1.0),
            KvData::Fp8 {
                k_scale, v_scale, ..
            } => (k_scale, v_scale),
        }
    }

    /// Sets the FP8 scales (checked positive and finite); an f32 cache takes only 1.0.
    pub(crate) fn set_scales(&mut self, ks: f32, vs: f32) -> Result<()> {
        for (name, s) in [("k_scale", ks), ("v_scale", vs)] {
            crate::kv_dtype::check_kv_scale(name, s).map_err(|detail| KernelError::Shape {
                op: "set_kv_scales",
                detail,
            })?;
        }
        match &mut self.data {
            KvData::Fp8 {
                k_scale, v_scale, ..
            } => {
                *k_scale = ks;
                *v_scale = vs;
                Ok(())
            }
            KvData::F32 { .. } if ks == 1.0 && vs == 1.0 => Ok(()),
            KvData::F32 { .. } => Err(KernelError::Unsupported(
                "KV cache scales on an f32 cache".into(),
            )),
        }
    }

    /// K, `[num_blocks, block_size, num_kv_heads, head_dim]`, as f32
    /// (dequantized when FP8).
    pub fn k(&self) -> Cow<'_, [f32]> {
        match &self.data {
            KvData::F32 { k, .. } => Cow::Borrowed(k),
            KvData::Fp8 { k, k_scale, .. } => Cow::Owned(dequant(k, *k_scale)),
        }
    }

    /// V, same layout as K.
    pub fn v(&self) -> Cow<'_, [f32]> {
        match &self.data {
            KvData::F32 { v, .. } => Cow::Borrowed(v),
            KvData::Fp8 { v, v_scale, .. } => Cow::Owned(dequant(v, *v_scale)),
        }
    }

    /// The raw FP8 bytes of K and V (`None` for an f32 cache).
    pub fn fp8_bytes(&self) -> Option<(&[u8], &[u8])> {
        match &self.data {
            KvData::Fp8 { k, v, .. } => Some((k, v)),
            KvData::F32 { .. } => None,
        }
    }

    /// K and V as f32 slices, when that is how they are stored.
    pub(crate) fn f32_kv(&self) -> Option<(&[f32], &[f32])> {
        match &self.data {
            KvData::F32 { k, v } => Some((k, v)),
            KvData::Fp8 { .. } => None,
        }
    }

    /// Appends `n` values of K from element `a` on, as f32.
    #[inline]
    pub(crate) fn extend_k(&self, out: &mut Vec<f32>, a: usize, n: usize) {
        match &self.data {
            KvData::F32 { k, .. } => out.extend_from_slice(&k[a..a + n]),
            KvData::Fp8 { k, k_scale, .. } => {
                out.extend(k[a..a + n].iter().map(|&b| e4m3_to_f32(b) * k_scale))
            }
        }
    }

    /// Appends `n` values of V from element `a` on, as f32.
    #[inline]
    pub(crate) fn extend_v(&self, out: &mut Vec<f32>, a: usize, n: usize) {
        match &self.data {
            KvData::F32 { v, .. } => out.extend_from_slice(&v[a..a + n]),
            KvData::Fp8 { v, v_scale, .. } => {
                out.extend(v[a..a + n].iter().map(|&b| e4m3_to_f32(b) * v_scale))
            }
        }
    }

    /// Writes one slot row of K and V (`k.len() == v.len()` values from
    /// element `dst` on), quantizing when FP8.
    pub(crate) fn write(&mut self, dst: usize, k: &[f32], v: &[f32]) {
        let n = k.len();
        match &mut self.data {
            KvData::F32 { k: ck, v: cv } => {
                ck[dst..dst + n].copy_from_slice(k);
                cv[dst..dst + n].copy_from_slice(v);
            }
            KvData::Fp8 {
                k: ck,
                v: cv,
                k_scale,
                v_scale,
            } => {
                for (o, &x) in ck[dst..dst + n].iter_mut().zip(k) {
                    *o = f32_to_e4m3(x / *k_scale);
                }
                for (o, &x) in cv[dst..dst + n].iter_mut().zip(v) {
                    *o = f32_to_e4m3(x / *v_scale);
                }
            }
        }
    }

    /// Copies the first `num_tokens` slots of each `src` block to its `dst`
    /// block, K and V. Out-of-range blocks or counts are an error, not a panic.
    pub(crate) fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<()> {
        let s = self.shape;
        let slot = s.num_kv_heads * s.head_dim;
        let block = s.block_size * slot;
        for c in copies {
            if c.src.0 as usize >= s.num_blocks
                || c.dst.0 as usize >= s.num_blocks
                || c.num_tokens > s.block_size
            {
                return Err(KernelError::Shape {
                    op: "copy_blocks",
                    detail: format!(
                        "{c:?} outside a cache of {} blocks of {}",
                        s.num_blocks, s.block_size
                    ),
                });
            }
            let (src, dst, n) = (
                c.src.0 as usize * block,
                c.dst.0 as usize * block,
                c.num_tokens * slot,
            );
            match &mut self.data {
                KvData::F32 { k, v } => {
                    k.copy_within(src..src + n, dst);
                    v.copy_within(src..src + n, dst);
                }
                KvData::Fp8 { k, v, .. } => {
                    k.copy_within(src..src + n, dst);
                    v.copy_within(src..src + n, dst);
                }
            }
        }
        Ok(())
    }

    /// Number of slots (`num_blocks * block_size`).
    pub(crate) fn num_slots(&self) -> usize {
        self.shape.num_blocks * self.shape.block_size
    }
}

fn dequant(b: &[u8], scale: f32) -> Vec<f32> {
    b.iter().map(|&x| e4m3_to_f32(x) * scale).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagoda_core::BlockId;

    const SHAPE: KvCacheShape = KvCacheShape {
        num_blocks: 3,
        block_size: 4,
        num_kv_heads: 2,
        head_dim: 2,
    };

    #[test]
    fn copies_only_the_leading_slots_of_k_and_v() {
        for fp8 in [false, true] {
            let mut c = CpuKvCache::new(SHAPE, fp8).unwrap();
            let width = 4;
            for slot in 0..12 {
                let k: Vec<f32> = (0..width).map(|i| (slot * width + i) as f32).collect();
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                c.write(slot * width, &k, &v);
            }
            let (k0, v0) = (c.k().into_owned(), c.v().into_owned());
            c.copy_blocks(&[BlockCopy {
                src: BlockId(0),
                dst: BlockId(2),
                num_tokens: 3,
            }])
            .unwrap();
            let (k1, v1) = (c.k(), c.v());
            let block = 4 * 2 * 2;
            let copied = 3 * 2 * 2;
            assert_eq!(k1[2 * block..2 * block + copied], k0[..copied]);
            assert_eq!(v1[2 * block..2 * block + copied], v0[..copied]);
            assert_eq!(k1[2 * block + copied..], k0[2 * block + copied..]);
            assert_eq!(k1[..2 * block], k0[..2 * block]);
            assert!(c
                .copy_blocks(&[BlockCopy {
                    src: BlockId(3),
                    dst: BlockId(0),
                    num_tokens: 1
                }])
                .is_err());
            assert!(c
                .copy_blocks(&[BlockCopy {
                    src: BlockId(0),
                    dst: BlockId(1),
                    num_tokens: 5
                }])
                .is_err());
        }
    }

    #[test]
    fn fp8_writes_divide_by_the_scale_and_round_like_fp8_rs() {
        let mut c = CpuKvCache::new(SHAPE, true).unwrap();
        c.set_scales(0.5, 4.0).unwrap();
        let k = [1.0f32, 0.3, -1000.0, f32::NAN];
        let v = [1.0f32, 0.3, 3000.0, 1e-6];
        c.write(4, &k, &v);
        let (kb, vb) = c.fp8_bytes().unwrap();
        for i in 0..4 {
            assert_eq!(kb[4 + i], f32_to_e4m3(k[i] / 0.5));
            assert_eq!(vb[4 + i], f32_to_e4m3(v[i] / 4.0));
        }
        // Saturated: 448 * scale.
        assert_eq!(c.k()[6], -224.0);
        assert_eq!(c.v()[6], 1792.0);
        assert_eq!(c.k()[4], 1.0);
        assert!(c.set_scales(0.0, 1.0).is_err());
        assert!(c.set_scales(1.0, f32::NAN).is_err());
        let mut f = CpuKvCache::new(SHAPE, false).unwrap();
        assert!(f.set_scales(1.0, 1.0).is_ok());
        assert!(f.set_scales(2.0, 1.0).is_err());
    }
}
