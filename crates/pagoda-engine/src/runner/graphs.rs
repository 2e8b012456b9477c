//! Decode graphs: the batch-size ladder, the table-width tiers, and padding a
//! decode step up to a captured shape.
//!
//! A decode step of `n` sequences whose longest block table is `w` blocks
//! replays the graph of the narrowest tier at least `w` wide and the
//! smallest ladder size `>= n`. Its context is padded to that size with rows
//! that read block 0 at position 0, store nothing (slot -1) and sample
//! greedily, and its block tables are widened to the tier's width, so every
//! step of one tier and size has the packed layout the graph was captured
//! with. Padding costs O(size * tier width) host work, and the attention
//! grid of a tier is sized for its width, which is why short contexts get
//! narrow tiers of their own.

use pagoda_kernels::{ForwardContext, SamplingRow};

/// vLLM's ladder: 1, 2, 4, then every multiple of 8 up to `max_batch`
/// (and `max_batch` itself).
pub fn ladder(max_batch: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = [1, 2, 4]
        .into_iter()
        .chain((8..=max_batch).step_by(8))
        .filter(|&s| s <= max_batch)
        .collect();
    if max_batch > 0 && sizes.last() != Some(&max_batch) {
        sizes.push(max_batch);
    }
    sizes
}

/// Context lengths in tokens of the width tiers for `max_model_len`: 4,096,
/// then 4x wider each while at most half of `max_model_len`, then
/// `max_model_len` itself (always the last). At most four tiers, so start-up
/// captures at most 4x the ladder.
pub fn tiers(max_model_len: usize) -> Vec<usize> {
    const NARROWEST: usize = 4096;
    let mut tiers = Vec::new();
    let mut t = NARROWEST;
    while t * 2 <= max_model_len && tiers.len() < 3 {
        tiers.push(t);
        t *= 4;
    }
    tiers.push(max_model_len);
    tiers
}

/// Whether `ctx` is a decode step a graph can run: one query token and one
/// sampled row per sequence, sampling on the device.
pub fn is_graph_decode(ctx: &ForwardContext) -> bool {
    let n = ctx.num_seqs();
    n > 0
        && ctx.num_tokens() == n
        && ctx.logits_indices.len() == n
        && ctx.sampling.len() == n
        && ctx
            .logits_indices
            .iter()
            .enumerate()
            .all(|(i, &r)| r as usize == i)
}

/// Writes into `out` the decode step `ctx` padded to `size` sequences with
/// block tables `width` wide. `ctx` must satisfy [`is_graph_decode`], have
/// at most `size` sequences and tables no wider than `width`.
pub fn pad_decode(ctx: &ForwardContext, size: usize, width: usize, out: &mut ForwardContext) {
    let n = ctx.num_seqs();
    debug_assert!(n <= size && ctx.max_blocks_per_seq <= width);
    out.input_ids.clear();
    out.positions.clear();
    out.slot_mapping.clear();
    out.context_lens.clear();
    out.seq_lens.clear();
    out.cu_seqlens_q.clear();
    out.cu_seqlens_k.clear();
    out.block_tables.clear();
    out.logits_indices.clear();
    out.sampling.clear();
    out.input_ids.extend_from_slice(&ctx.input_ids);
    out.input_ids.resize(size, 0);
    out.positions.extend_from_slice(&ctx.positions);
    out.positions.resize(size, 0);
    out.slot_mapping.extend_from_slice(&ctx.slot_mapping);
    out.slot_mapping.resize(size, -1);
    out.context_lens.extend_from_slice(&ctx.context_lens);
    out.context_lens.resize(size, 0);
    out.seq_lens.extend_from_slice(&ctx.seq_lens);
    out.seq_lens.resize(size, 1);
    out.cu_seqlens_q.extend(0..=size as u32);
    out.cu_seqlens_k.push(0);
    let mut k = 0u32;
    for &l in &out.seq_lens {
        k += l;
        out.cu_seqlens_k.push(k);
    }
    for i in 0..n {
        out.block_tables.extend_from_slice(ctx.block_table(i));
        out.block_tables.resize((i + 1) * width, 0);
    }
    out.block_tables.resize(size * width, 0);
    // Every KV cache group's slots and tables, padded alike.
    out.extra_kv_groups = ctx.extra_kv_groups;
    out.group_slot_mapping.clear();
    out.group_block_tables.clear();
    for g in 1..=ctx.extra_kv_groups {
        out.group_slot_mapping
            .extend_from_slice(ctx.slot_mapping_of(g));
        out.group_slot_mapping.resize(g * size, -1);
        for i in 0..n {
            let row = (g - 1) * size * width + i * width;
            out.group_block_tables
                .extend_from_slice(ctx.group_block_table(g, i));
            out.group_block_tables.resize(row + width, 0);
        }
        out.group_block_tables.resize(g * size * width, 0);
    }
    out.logits_indices.extend(0..size as u32);
    out.sampling.extend_from_slice(&ctx.sampling);
    out.sampling.resize(size, SamplingRow::GREEDY);
    out.max_blocks_per_seq = width;
    out.block_size = ctx.block_size;
    out.max_query_len = 1;
    out.max_seq_len = out.seq_lens.iter().copied().max().unwrap_or(0) as usize;
    // Padding rows count as decodes (one token, nothing to prefill).
    out.num_prefills = ctx.num_prefills;
    out.num_prefill_tokens = ctx.num_prefill_tokens;
    out.num_decode_tokens = size - ctx.num_prefill_tokens;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_grow_4x_from_4096_and_end_at_max_model_len() {
        assert_eq!(tiers(256), vec![256]);
        assert_eq!(tiers(4096), vec![4096]);
        assert_eq!(tiers(4097), vec![4097]);
        assert_eq!(tiers(8192), vec![4096, 8192]);
        assert_eq!(tiers(40_960), vec![4096, 16_384, 40_960]);
        assert_eq!(tiers(131_072), vec![4096, 16_384, 65_536, 131_072]);
        assert_eq!(tiers(1 << 20), vec![4096, 16_384, 65_536, 1 << 20]);
    }

    #[test]
    fn ladder_is_vllms() {
        assert_eq!(ladder(1), vec![1]);
        assert_eq!(ladder(3), vec![1, 2, 3]);
        assert_eq!(ladder(16), vec![1, 2, 4, 8, 16]);
        assert_eq!(ladder(20), vec![1, 2, 4, 8, 16, 20]);
        assert_eq!(ladder(256).len(), 35);
    }

    fn decode_ctx() -> ForwardContext {
        // Two sequences of 5 and 17 cached tokens, block size 4.
        let ctx = ForwardContext {
            input_ids: vec![7, 9],
            positions: vec![5, 17],
            cu_seqlens_q: vec![0, 1, 2],
            cu_seqlens_k: vec![0, 6, 24],
            seq_lens: vec![6, 18],
            context_lens: vec![5, 17],
            slot_mapping: vec![13, 41],
            block_tables: vec![2, 3, 0, 0, 0, 8, 9, 7, 10, 11],
            max_blocks_per_seq: 5,
            block_size: 4,
            max_query_len: 1,
            max_seq_len: 18,
            num_prefills: 0,
            num_prefill_tokens: 0,
            num_decode_tokens: 2,
            logits_indices: vec![0, 1],
            sampling: vec![SamplingRow::GREEDY; 2],
            ..Default::default()
        };
        ctx.validate().unwrap();
        ctx
    }

    #[test]
    fn padding_keeps_real_rows_and_adds_inert_ones() {
        let ctx = decode_ctx();
        assert!(is_graph_decode(&ctx));
        let mut out = ForwardContext::default();
        pad_decode(&ctx, 4, 8, &mut out);
        out.validate().unwrap();
        assert_eq!(out.num_seqs(), 4);
        assert_eq!(out.input_ids, vec![7, 9, 0, 0]);
        assert_eq!(out.slot_mapping, vec![13, 41, -1, -1]);
        assert_eq!(out.block_table(0), &[2, 3, 0, 0, 0, 0, 0, 0]);
        assert_eq!(out.block_table(1), &[8, 9, 7, 10, 11, 0, 0, 0]);
        assert_eq!(out.block_table(3), &[0; 8]);
        assert_eq!(out.logits_indices, vec![0, 1, 2, 3]);
        assert_eq!(out.seq_lens, vec![6, 18, 1, 1]);
        // Reusing the buffer for a smaller step leaves nothing behind.
        pad_decode(&ctx, 2, 5, &mut out);
        out.validate().unwrap();
        assert_eq!(out.block_tables, ctx.block_tables);
    }

    #[test]
    fn prefills_and_host_sampling_are_not_graph_steps() {
        let mut ctx = decode_ctx();
        ctx.sampling.clear();
        assert!(!is_graph_decode(&ctx));
        let mut ctx = decode_ctx();
        ctx.logits_indices = vec![1, 0];
        assert!(!is_graph_decode(&ctx));
    }
}
