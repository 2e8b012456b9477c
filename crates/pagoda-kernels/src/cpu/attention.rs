//! Paged KV writes and causal attention over the paged cache.
//!
//! Cache layout `[num_blocks, block_size, num_kv_heads, head_dim]`: the K (or V)
//! of one token and kv head is `head_dim` contiguous f32 at
//! `((slot * num_kv_heads) + kv_head) * head_dim`, where `slot = block *
//! block_size + offset` and `block = block_table[pos / block_size]`.
//!
//! Attention handles any mix of prefill (with or without a cached prefix) and
//! decode sequences in one step (varlen). Query token `j` of a sequence with
//! `context_len` cached tokens sees positions `0..=context_len + j`; query head
//! `h` reads kv head `h / (num_heads / num_kv_heads)` (GQA). Scores, the
//! softmax (online, max-subtracted) and the weighted V sum are in f32.
//! Every block id and slot is checked against the cache before any work.
//!
//! Work is split into items of (sequence, kv head, tile of up to `Q_TILE`
//! query tokens): the tile's query heads that share the kv head are stacked
//! into one matrix, and keys are visited in chunks of `K_CHUNK` gathered into
//! contiguous buffers, so both products are small GEMMs and each K/V row is
//! read once per tile rather than once per query. Scratch is O(tile * chunk).

use super::storage::{CpuKvCache, CpuStep, CpuTensor};
use crate::{AttentionParams, KernelError, Result};
use rayon::prelude::*;

fn shape_err(op: &'static str, detail: String) -> KernelError {
    KernelError::Shape { op, detail }
}

pub fn store_kv(
    k: &CpuTensor,
    v: &CpuTensor,
    cache: &mut CpuKvCache,
    step: &CpuStep,
) -> Result<()> {
    let width = cache.shape.num_kv_heads * cache.shape.head_dim;
    let t = step.ctx.num_tokens();
    for (name, x) in [("k", k), ("v", v)] {
        if x.rows != t || x.cols != width {
            return Err(shape_err(
                "store_kv",
                format!(
                    "{name} is [{}, {}], expected [{t}, {width}]",
                    x.rows, x.cols
                ),
            ));
        }
    }
    let slots = cache.num_slots() as i64;
    if let Some(&bad) = step
        .ctx
        .slot_mapping
        .iter()
        .find(|&&s| s < -1 || s >= slots)
    {
        return Err(shape_err(
            "store_kv",
            format!("slot {bad} outside the cache ({slots} slots)"),
        ));
    }
    for (i, &s) in step.ctx.slot_mapping.iter().enumerate() {
        if s < 0 {
            continue;
        }
        let (dst, src) = (s as usize * width, i * width);
        cache.k[dst..dst + width].copy_from_slice(&k.data[src..src + width]);
        cache.v[dst..dst + width].copy_from_slice(&v.data[src..src + width]);
    }
    Ok(())
}

/// Checks the head layout and every block id the step's sequences will read.
pub(crate) fn check(
    q: &CpuTensor,
    cache: &CpuKvCache,
    step: &CpuStep,
    p: &AttentionParams,
) -> Result<()> {
    let s = cache.shape;
    if p.num_kv_heads == 0 || p.num_heads % p.num_kv_heads != 0 {
        return Err(shape_err(
            "attention",
            format!(
                "num_heads {} not a multiple of num_kv_heads {}",
                p.num_heads, p.num_kv_heads
            ),
        ));
    }
    if p.num_kv_heads != s.num_kv_heads || p.head_dim != s.head_dim {
        return Err(shape_err(
            "attention",
            format!("params {p:?} do not match the cache {s:?}"),
        ));
    }
    if q.rows != step.ctx.num_tokens() || q.cols != p.num_heads * p.head_dim {
        return Err(shape_err(
            "attention",
            format!(
                "q is [{}, {}], expected [{}, {}]",
                q.rows,
                q.cols,
                step.ctx.num_tokens(),
                p.num_heads * p.head_dim
            ),
        ));
    }
    if step.ctx.block_size != s.block_size {
        return Err(shape_err(
            "attention",
            format!(
                "step block_size {} vs cache {}",
                step.ctx.block_size, s.block_size
            ),
        ));
    }
    for i in 0..step.ctx.num_seqs() {
        let need = (step.ctx.seq_lens[i] as usize).div_ceil(s.block_size);
        if let Some(&b) = step.ctx.block_table(i)[..need]
            .iter()
            .find(|&&b| b as usize >= s.num_blocks)
        {
            return Err(shape_err(
                "attention",
                format!(
                    "sequence {i}: block {b} outside the cache ({} blocks)",
                    s.num_blocks
                ),
            ));
        }
    }
    Ok(())
}

/// Query tokens per work item (times the GQA group size = rows of its GEMMs).
const Q_TILE: usize = 32;
/// Keys per online-softmax chunk (bounds every scratch buffer).
const K_CHUNK: usize = 256;

/// One work item: query tokens `t0..t0 + nt` of sequence `seq`, all query
/// heads of kv head `kvh`.
#[derive(Clone, Copy)]
struct Item {
    seq: usize,
    kvh: usize,
    t0: usize,
    nt: usize,
}

/// Per-thread scratch, reused across items.
#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    s: Vec<f32>,
    max: Vec<f32>,
    sum: Vec<f32>,
}

pub fn attention(
    q: &CpuTensor,
    cache: &CpuKvCache,
    step: &CpuStep,
    p: &AttentionParams,
) -> Result<CpuTensor> {
    check(q, cache, step, p)?;
    let (hd, nh, nkv) = (p.head_dim, p.num_heads, p.num_kv_heads);
    let group = nh / nkv;
    let ctx = &step.ctx;
    let mut out = CpuTensor::for_overwrite(q.rows, q.cols);
    if hd == 0 || nh == 0 {
        return Ok(out);
    }
    let mut items = Vec::new();
    for seq in 0..ctx.num_seqs() {
        let ql = ctx.query_len(seq);
        for kvh in 0..nkv {
            for t0 in (0..ql).step_by(Q_TILE) {
                items.push(Item {
                    seq,
                    kvh,
                    t0,
                    nt: Q_TILE.min(ql - t0),
                });
            }
        }
    }
    // Each item returns its `[nt, group, head_dim]` output, scattered below.
    let tiles: Vec<Vec<f32>> = items
        .par_iter()
        .map_init(Scratch::default, |s, it| {
            if it.nt == 1 {
                decode_tile(q, cache, step, p, *it, s)
            } else {
                tile(q, cache, step, p, *it, s)
            }
        })
        .collect();
    for (it, o) in items.iter().zip(&tiles) {
        let tok0 = ctx.cu_seqlens_q[it.seq] as usize + it.t0;
        for t in 0..it.nt {
            let dst = (tok0 + t) * q.cols + it.kvh * group * hd;
            out.data[dst..dst + group * hd]
                .copy_from_slice(&o[t * group * hd..(t + 1) * group * hd]);
        }
    }
    Ok(out)
}

/// Calls `f(pos, offset)` for positions `p0..p1` of a sequence, where `offset`
/// is the index in K (or V) of that position's head at `head_offset`
/// (`token_width = num_kv_heads * head_dim`). Walks whole blocks, so there is
/// one division per call rather than per key.
#[inline]
fn for_each_key(
    table: &[u32],
    bs: usize,
    token_width: usize,
    head_offset: usize,
    p0: usize,
    p1: usize,
    mut f: impl FnMut(usize, usize),
) {
    let mut pos = p0;
    let mut bi = p0 / bs;
    let mut off = p0 % bs;
    while pos < p1 {
        let base = table[bi] as usize * bs;
        let end = (p1 - pos).min(bs - off);
        for o in off..off + end {
            f(pos, (base + o) * token_width + head_offset);
            pos += 1;
        }
        bi += 1;
        off = 0;
    }
}

super::math::multiversion! {
/// A single query token (decode): its `group` heads' scores are dot products
/// read straight from the cache, then an exact two-pass softmax and a
/// weighted sum of V rows. Scratch is O(group * context).
fn decode_tile(
    q: &CpuTensor,
    cache: &CpuKvCache,
    step: &CpuStep,
    p: &AttentionParams,
    it: Item,
    s: &mut Scratch
) -> Vec<f32> {
    let (hd, nkv) = (p.head_dim, p.num_kv_heads);
    let group = p.num_heads / nkv;
    let bs = cache.shape.block_size;
    let ctx = &step.ctx;
    let table = ctx.block_table(it.seq);
    let n_keys = ctx.context_lens[it.seq] as usize + it.t0 + 1;
    let tok = ctx.cu_seqlens_q[it.seq] as usize + it.t0;
    let qa = tok * q.cols + it.kvh * group * hd;
    let qs = &q.data[qa..qa + group * hd];
    // 1. Scores, [group, n_keys].
    s.s.clear();
    s.s.resize(group * n_keys, 0.0);
    for_each_key(table, bs, nkv * hd, it.kvh * hd, 0, n_keys, |pos, a| {
        let k = &cache.k[a..a + hd];
        for g in 0..group {
            s.s[g * n_keys + pos] = super::dot(&qs[g * hd..(g + 1) * hd], k) * p.scale;
        }
    });
    // 2. Softmax per head (weights left unnormalized; divided at the end).
    s.sum.clear();
    for g in 0..group {
        let row = &mut s.s[g * n_keys..(g + 1) * n_keys];
        let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        s.sum.push(super::math::exp_sub_sum(row, max));
    }
    // 3. O = P V / sum.
    let mut o = vec![0f32; group * hd];
    for_each_key(table, bs, nkv * hd, it.kvh * hd, 0, n_keys, |pos, a| {
        let v = &cache.v[a..a + hd];
        for g in 0..group {
            let w = s.s[g * n_keys + pos];
            for (o, v) in o[g * hd..(g + 1) * hd].iter_mut().zip(v) {
                *o += w * v;
            }
        }
    });
    for g in 0..group {
        let inv = 1.0 / s.sum[g];
        for x in o[g * hd..(g + 1) * hd].iter_mut() {
            *x *= inv;
        }
    }
    o
}
}

/// Flash-attention style pass over one item: for each chunk of keys, S = Q K^T
/// (scaled), online softmax with running max and sum per row, O += P V.
fn tile(
    q: &CpuTensor,
    cache: &CpuKvCache,
    step: &CpuStep,
    p: &AttentionParams,
    it: Item,
    s: &mut Scratch,
) -> Vec<f32> {
    let (hd, nkv) = (p.head_dim, p.num_kv_heads);
    let group = p.num_heads / nkv;
    let bs = cache.shape.block_size;
    let ctx = &step.ctx;
    let table = ctx.block_table(it.seq);
    let context_len = ctx.context_lens[it.seq] as usize;
    let tok0 = ctx.cu_seqlens_q[it.seq] as usize + it.t0;
    let m = it.nt * group;
    // Row r = (token t, head g) of the tile sees keys < context_len + t0 + t + 1.
    let limit = |r: usize| context_len + it.t0 + r / group + 1;
    let n_keys = limit(m - 1);

    s.q.clear();
    for t in 0..it.nt {
        let a = (tok0 + t) * q.cols + it.kvh * group * hd;
        s.q.extend_from_slice(&q.data[a..a + group * hd]);
    }
    let mut o = vec![0f32; m * hd];
    s.max.clear();
    s.max.resize(m, f32::NEG_INFINITY);
    s.sum.clear();
    s.sum.resize(m, 0.0);

    for c0 in (0..n_keys).step_by(K_CHUNK) {
        let kc = K_CHUNK.min(n_keys - c0);
        // 1. Gather this chunk's K and V rows of kv head `kvh` through the block table.
        s.k.clear();
        s.v.clear();
        for_each_key(table, bs, nkv * hd, it.kvh * hd, c0, c0 + kc, |_, a| {
            s.k.extend_from_slice(&cache.k[a..a + hd]);
            s.v.extend_from_slice(&cache.v[a..a + hd]);
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
            let row = &mut s.s[r * kc..(r + 1) * kc];
            if valid == 0 {
                row.fill(0.0);
                continue;
            }
            let chunk_max = row[..valid]
                .iter()
                .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let new_max = s.max[r].max(chunk_max);
            let correction = (s.max[r] - new_max).exp();
            s.max[r] = new_max;
            let sum = super::math::exp_sub_sum(&mut row[..valid], new_max);
            row[valid..].fill(0.0);
            s.sum[r] = s.sum[r] * correction + sum;
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
    for r in 0..m {
        let inv = 1.0 / s.sum[r];
        for x in o[r * hd..(r + 1) * hd].iter_mut() {
            *x *= inv;
        }
    }
    o
}
