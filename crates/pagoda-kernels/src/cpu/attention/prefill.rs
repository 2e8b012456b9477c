//! Multi-token tiles: a flash-attention style pass with small GEMMs.
//!
//! The tile's `nt` tokens times `group` query heads form the rows of Q; keys
//! are visited in chunks of `K_CHUNK` gathered into contiguous K and V
//! buffers through the block table; `S = scale * Q K^T` and `O += P V` go
//! through the `gemm` crate, with an online softmax (running max and sum per
//! row) in between. Rows past their causal limit, or before their window,
//! get zero weight; soft-capping applies to the scaled scores. Scratch is
//! O(rows * K_CHUNK + K_CHUNK * head_dim).

use super::{for_each_key, softcap, Item, Part, Scratch};
use crate::cpu::math::exp_sub_sum;
use crate::cpu::storage::{CpuKvCache, CpuStep, CpuTensor};
use crate::AttentionParams;

/// Keys per online-softmax chunk.
const K_CHUNK: usize = 256;

/// Flash-attention style pass over one item: for each chunk of keys, S = Q K^T
/// (scaled), online softmax with running max and sum per row, O += P V.
pub(super) fn part(
    q: &CpuTensor,
    cache: &CpuKvCache,
    step: &CpuStep,
    p: &AttentionParams,
    it: Item,
    s: &mut Scratch,
) -> Part {
    let (hd, nkv) = (p.head_dim, p.num_kv_heads);
    let group = p.num_heads / nkv;
    let bs = cache.shape.block_size;
    let ctx = &step.ctx;
    let table = ctx.group_block_table(p.kv_group, it.seq);
    let context_len = ctx.context_lens[it.seq] as usize;
    let tok0 = ctx.cu_seqlens_q[it.seq] as usize + it.t0;
    let m = it.nt * group;
    // Row r = (token t, head g) of the tile sees keys < context_len + t0 + t + 1.
    let limit = |r: usize| context_len + it.t0 + r / group + 1;
    // ... and keys from its window's first on.
    let first = |r: usize| p.first_key(context_len + it.t0 + r / group);
    let n_keys = limit(m - 1);

    s.q.clear();
    for t in 0..it.nt {
        let a = (tok0 + t) * q.cols + it.kvh * group * hd;
        s.q.extend_from_slice(&q.data[a..a + group * hd]);
    }
    let mut o = vec![0f32; m * hd];
    let mut max = vec![f32::NEG_INFINITY; m];
    let mut sum = vec![0f32; m];

    let end = n_keys.min(it.k1);
    for c0 in (it.k0..end).step_by(K_CHUNK) {
        let kc = K_CHUNK.min(end - c0);
        // 1. Gather this chunk's K and V rows of kv head `kvh` through the block table.
        s.k.clear();
        s.v.clear();
        for_each_key(table, bs, nkv * hd, it.kvh * hd, c0, c0 + kc, |_, a| {
            cache.extend_k(&mut s.k, a, hd);
            cache.extend_v(&mut s.v, a, hd);
        });
        // 2. S = scale * Q K^T, [m, kc].
        s.s.resize(m * kc, 0.0);
        // SAFETY: dst s.s is [m, kc] row-major; lhs s.q is [m, hd]; rhs is
        // s.k^T ([hd, kc], element (d, j) at s.k[j * hd + d]); all in bounds.
        unsafe {
            gemm::gemm(
                m,
                kc,
                hd,
                s.s.as_mut_ptr(),
                1,
                kc as isize,
                false,
                s.q.as_ptr(),
                1,
                hd as isize,
                s.k.as_ptr(),
                hd as isize,
                1,
                0.0,
                p.scale,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
        // 3. Online softmax: mask, new running max, rescale O and the sum, P = exp(S - max).
        for r in 0..m {
            let valid = limit(r).saturating_sub(c0).min(kc);
            let start = first(r).saturating_sub(c0).min(kc);
            let row = &mut s.s[r * kc..(r + 1) * kc];
            if start >= valid {
                row.fill(0.0);
                continue;
            }
            let live = &mut row[start..valid];
            softcap(p, live);
            let chunk_max = live.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let new_max = max[r].max(chunk_max);
            let correction = (max[r] - new_max).exp();
            max[r] = new_max;
            let row_sum = exp_sub_sum(live, new_max);
            row[..start].fill(0.0);
            row[valid..].fill(0.0);
            sum[r] = sum[r] * correction + row_sum;
            if correction != 1.0 {
                for x in o[r * hd..(r + 1) * hd].iter_mut() {
                    *x *= correction;
                }
            }
        }
        // 4. O += P V.
        // SAFETY: dst o is [m, hd]; lhs s.s is [m, kc]; rhs s.v is [kc, hd]; all in bounds.
        unsafe {
            gemm::gemm(
                m,
                hd,
                kc,
                o.as_mut_ptr(),
                1,
                hd as isize,
                true,
                s.s.as_ptr(),
                1,
                kc as isize,
                s.v.as_ptr(),
                1,
                hd as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    }
    Part { o, max, sum }
}
