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
//! softmax (max-subtracted, two-pass) and the weighted V sum are in f32.
//! Every block id and slot is checked against the cache before any work.

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

pub fn attention(
    q: &CpuTensor,
    cache: &CpuKvCache,
    step: &CpuStep,
    p: &AttentionParams,
) -> Result<CpuTensor> {
    check(q, cache, step, p)?;
    let (hd, nh, nkv) = (p.head_dim, p.num_heads, p.num_kv_heads);
    let group = nh / nkv;
    let bs = cache.shape.block_size;
    let ctx = &step.ctx;
    let mut out = CpuTensor::for_overwrite(q.rows, q.cols);
    if hd == 0 || nh == 0 {
        return Ok(out);
    }
    out.data.par_chunks_mut(hd).enumerate().for_each_init(
        Vec::new,
        |scores: &mut Vec<f32>, (item, o)| {
            let (t, h) = (item / nh, item % nh);
            let seq = step.token_seq[t] as usize;
            let j = t - ctx.cu_seqlens_q[seq] as usize;
            let n_keys = ctx.context_lens[seq] as usize + j + 1;
            let table = ctx.block_table(seq);
            let kvh = h / group;
            let qv = &q.data[t * q.cols + h * hd..t * q.cols + (h + 1) * hd];
            let at = |pos: usize| ((table[pos / bs] as usize * bs + pos % bs) * nkv + kvh) * hd;
            o.fill(0.0);
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            for pos in 0..n_keys {
                let a = at(pos);
                let s = super::dot(qv, &cache.k[a..a + hd]) * p.scale;
                max = max.max(s);
                scores.push(s);
            }
            let mut sum = 0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            for (pos, &w) in scores.iter().enumerate() {
                let a = at(pos);
                for (o, v) in o.iter_mut().zip(&cache.v[a..a + hd]) {
                    *o += w * v;
                }
            }
            let inv = 1.0 / sum;
            for o in o.iter_mut() {
                *o *= inv;
            }
        },
    );
    Ok(out)
}
