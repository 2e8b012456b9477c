//! Paged KV writes and causal attention over the paged cache.
//!
//! Cache layout `[num_blocks, block_size, num_kv_heads, head_dim]`: the K (or V)
//! of one token and kv head is `head_dim` contiguous elements (f32, or FP8
//! bytes read back as f32 through the cache's scale) at
//! `((slot * num_kv_heads) + kv_head) * head_dim`, where `slot = block *
//! block_size + offset` and `block = block_table[pos / block_size]`.
//!
//! Attention handles any mix of prefill (with or without a cached prefix) and
//! decode sequences in one step (varlen). Query token `j` of a sequence with
//! `context_len` cached tokens sees positions `0..=context_len + j`; query head
//! `h` reads kv head `h / (num_heads / num_kv_heads)` (GQA). With a sliding
//! window ([`AttentionParams::window`]) it sees only the last `window` of
//! those positions, and items never visit keys older than their tile's
//! window; with soft-capping ([`AttentionParams::softcap`]) each scaled score
//! is capped before the softmax. Scores, the softmax (max-subtracted) and the
//! weighted V sum are in f32. Every block id and slot is checked against the
//! cache before any work.
//!
//! Work is split into items of (sequence, kv head, tile of query tokens, key
//! range); the query heads sharing a kv head are handled together, so each K/V
//! row is read once per item. Multi-token tiles ([`prefill`]) stack their
//! queries into a matrix and multiply chunks of gathered keys with small GEMMs
//! under an online softmax; single tokens ([`decode`]) take dot products
//! straight from the cache, and long contexts are split into key ranges
//! across threads (flash-decoding). Each item returns an unnormalized
//! [`Part`]; parts of one tile are merged by their softmax maxima and sums.

mod decode;
mod prefill;

use super::storage::{CpuKvCache, CpuStep, CpuTensor};
use crate::{AttentionParams, KernelError, Result};
use rayon::prelude::*;

/// Query tokens per multi-token item.
const Q_TILE: usize = 32;
/// Fewest keys a decode item's key range is split down to.
const MIN_SPLIT_KEYS: usize = 128;

fn shape_err(op: &'static str, detail: String) -> KernelError {
    KernelError::Shape { op, detail }
}

pub fn store_kv(
    k: &CpuTensor,
    v: &CpuTensor,
    cache: &mut CpuKvCache,
    step: &CpuStep,
    group: usize,
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
    step.ctx
        .check_kv_group(group)
        .map_err(|e| shape_err("store_kv", e))?;
    let slot_mapping = step.ctx.slot_mapping_of(group);
    let slots = cache.num_slots() as i64;
    if let Some(&bad) = slot_mapping.iter().find(|&&s| s < -1 || s >= slots) {
        return Err(shape_err(
            "store_kv",
            format!("slot {bad} outside the cache ({slots} slots)"),
        ));
    }
    for (i, &s) in slot_mapping.iter().enumerate() {
        if s < 0 {
            continue;
        }
        let (dst, src) = (s as usize * width, i * width);
        cache.write(dst, &k.data[src..src + width], &v.data[src..src + width]);
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
    p.check_variants().map_err(|e| shape_err("attention", e))?;
    step.ctx
        .check_kv_group(p.kv_group)
        .map_err(|e| shape_err("attention", e))?;
    if p.num_kv_heads == 0 || !p.num_heads.is_multiple_of(p.num_kv_heads) {
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
        if let Some(&b) = step.ctx.group_block_table(p.kv_group, i)[..need]
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

/// One work item: query tokens `t0..t0 + nt` of sequence `seq`, all query
/// heads of kv head `kvh`, over keys `k0..k1` (clipped to each row's causal
/// limit and window).
#[derive(Debug, Clone, Copy)]
struct Item {
    seq: usize,
    kvh: usize,
    t0: usize,
    nt: usize,
    k0: usize,
    k1: usize,
}

/// An item's result for its `m = nt * group` rows (token-major, then head):
/// `o = sum_j e^(s_j - max) v_j` (not yet divided by `sum`), the row's `max`
/// and `sum = sum_j e^(s_j - max)`.
struct Part {
    o: Vec<f32>,
    max: Vec<f32>,
    sum: Vec<f32>,
}

/// Per-thread scratch, reused across items.
#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    s: Vec<f32>,
    idx: Vec<usize>,
}

/// The step's items, parts of one tile adjacent.
fn plan(step: &CpuStep, p: &AttentionParams, threads: usize) -> Vec<Item> {
    let nkv = p.num_kv_heads;
    let ctx = &step.ctx;
    let singles: usize = (0..ctx.num_seqs())
        .filter(|&i| ctx.query_len(i) == 1)
        .count()
        * nkv;
    // Split single-token items until there are about 4 per thread.
    let want = (4 * threads).div_ceil(singles.max(1)).max(1);
    let mut items = Vec::new();
    for seq in 0..ctx.num_seqs() {
        let ql = ctx.query_len(seq);
        let context_len = ctx.context_lens[seq] as usize;
        for kvh in 0..nkv {
            for t0 in (0..ql).step_by(Q_TILE) {
                let nt = Q_TILE.min(ql - t0);
                let n_keys = context_len + t0 + nt;
                // The tile's first query sees the oldest key of the tile.
                let first = p.first_key(context_len + t0);
                let span = n_keys - first;
                let splits = if ql == 1 {
                    want.min(span.div_ceil(MIN_SPLIT_KEYS)).max(1)
                } else {
                    1
                };
                let per = span.div_ceil(splits);
                for k0 in (first..n_keys).step_by(per) {
                    let k1 = (k0 + per).min(n_keys);
                    items.push(Item {
                        seq,
                        kvh,
                        t0,
                        nt,
                        k0,
                        k1,
                    });
                }
            }
        }
    }
    items
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
    if hd == 0 || nh == 0 || q.rows == 0 {
        return Ok(out);
    }
    let items = plan(step, p, rayon::current_num_threads());
    let parts: Vec<Part> = items
        .par_iter()
        .map_init(Scratch::default, |s, it| {
            if it.nt == 1 {
                decode::part(q, cache, step, p, *it, s)
            } else {
                prefill::part(q, cache, step, p, *it, s)
            }
        })
        .collect();
    // Merge the parts of each tile and scatter rows (t, g) to token t, head kvh * group + g.
    let mut i = 0;
    while i < items.len() {
        let it = items[i];
        let mut j = i + 1;
        while j < items.len()
            && (items[j].seq, items[j].kvh, items[j].t0) == (it.seq, it.kvh, it.t0)
        {
            j += 1;
        }
        let tok0 = ctx.cu_seqlens_q[it.seq] as usize + it.t0;
        for r in 0..it.nt * group {
            let (t, g) = (r / group, r % group);
            let dst = (tok0 + t) * q.cols + (it.kvh * group + g) * hd;
            merge_row(&parts[i..j], r, hd, &mut out.data[dst..dst + hd]);
        }
        i = j;
    }
    Ok(out)
}

/// `x = cap * tanh(x / cap)` for each score, where the params ask for it.
#[inline]
pub(super) fn softcap(p: &AttentionParams, scores: &mut [f32]) {
    if let Some(cap) = p.softcap {
        let inv = 1.0 / cap;
        for x in scores.iter_mut() {
            *x = cap * (*x * inv).tanh();
        }
    }
}

/// `out = (sum_i w_i o_i) / (sum_i w_i sum_i)` with `w_i = e^(max_i - max)`
/// for row `r` of the parts.
fn merge_row(parts: &[Part], r: usize, hd: usize, out: &mut [f32]) {
    let max = parts.iter().fold(f32::NEG_INFINITY, |m, p| m.max(p.max[r]));
    out.fill(0.0);
    let mut sum = 0f32;
    for p in parts {
        if p.sum[r] == 0.0 {
            continue;
        }
        let w = (p.max[r] - max).exp();
        sum += w * p.sum[r];
        for (o, x) in out.iter_mut().zip(&p.o[r * hd..(r + 1) * hd]) {
            *o += w * x;
        }
    }
    let inv = 1.0 / sum;
    for o in out.iter_mut() {
        *o *= inv;
    }
}

/// Calls `f(pos, offset)` for positions `p0..p1` of a sequence, where `offset`
/// is the index in K (or V) of that position's head at `head_offset`
/// (`token_width = num_kv_heads * head_dim`). Walks whole blocks, so there is
/// one division per call rather than per key.
#[inline(always)]
pub(super) fn for_each_key(
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
