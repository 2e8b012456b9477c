//! Building a step's [`ForwardContext`] from the sequences scheduled into it.
//!
//! Cost: O(tokens in the step + blocks of the scheduled sequences); nothing
//! here looks at the rest of the cache.

use pagoda_kernels::ForwardContext;

/// One sequence's share of a step.
#[derive(Debug, Clone, Copy)]
pub struct ScheduledSeq<'a> {
    /// The tokens computed this step (a prompt chunk, or the last sampled token).
    pub token_ids: &'a [u32],
    /// Tokens already in the KV cache (vLLM's num_computed_tokens).
    pub context_len: usize,
    /// KV blocks of the sequence, in order; must cover `context_len + token_ids.len()`.
    pub block_table: &'a [u32],
    /// Whether the logits of the last token are wanted (false for a prompt
    /// chunk that does not finish the prompt).
    pub want_logits: bool,
}

/// Lays the scheduled sequences out as one step. A sequence with a single
/// token and a non-empty context counts as a decode; everything else as a
/// prefill (chunk).
pub fn build_forward_context(seqs: &[ScheduledSeq<'_>], block_size: usize) -> ForwardContext {
    let num_tokens: usize = seqs.iter().map(|s| s.token_ids.len()).sum();
    let max_blocks = seqs.iter().map(|s| s.block_table.len()).max().unwrap_or(0);
    let mut ctx = ForwardContext {
        input_ids: Vec::with_capacity(num_tokens),
        positions: Vec::with_capacity(num_tokens),
        cu_seqlens_q: Vec::with_capacity(seqs.len() + 1),
        cu_seqlens_k: Vec::with_capacity(seqs.len() + 1),
        seq_lens: Vec::with_capacity(seqs.len()),
        context_lens: Vec::with_capacity(seqs.len()),
        slot_mapping: Vec::with_capacity(num_tokens),
        block_tables: vec![0; seqs.len() * max_blocks],
        max_blocks_per_seq: max_blocks,
        block_size,
        ..Default::default()
    };
    ctx.cu_seqlens_q.push(0);
    ctx.cu_seqlens_k.push(0);
    for (i, s) in seqs.iter().enumerate() {
        let query_len = s.token_ids.len();
        let seq_len = s.context_len + query_len;
        for (j, &t) in s.token_ids.iter().enumerate() {
            let pos = s.context_len + j;
            ctx.input_ids.push(t);
            ctx.positions.push(pos as u32);
            let block = s.block_table[pos / block_size] as i64;
            ctx.slot_mapping
                .push(block * block_size as i64 + (pos % block_size) as i64);
        }
        ctx.cu_seqlens_q.push(ctx.input_ids.len() as u32);
        ctx.cu_seqlens_k.push(ctx.cu_seqlens_k[i] + seq_len as u32);
        ctx.seq_lens.push(seq_len as u32);
        ctx.context_lens.push(s.context_len as u32);
        ctx.block_tables[i * max_blocks..i * max_blocks + s.block_table.len()]
            .copy_from_slice(s.block_table);
        ctx.max_query_len = ctx.max_query_len.max(query_len);
        ctx.max_seq_len = ctx.max_seq_len.max(seq_len);
        if query_len == 1 && s.context_len > 0 {
            ctx.num_decode_tokens += 1;
        } else {
            ctx.num_prefills += 1;
            ctx.num_prefill_tokens += query_len;
        }
        if s.want_logits && query_len > 0 {
            ctx.logits_indices.push(ctx.input_ids.len() as u32 - 1);
        }
    }
    ctx
}

/// Gives `ctx` (built by [`build_forward_context`]) KV cache groups
/// 1..=`extra`: `tables[i * extra + g - 1]` is group `g`'s block table of
/// sequence `i`, as long as its group-0 table. Slots and table rows are laid
/// out as group 0's. O(extra * (tokens + table entries)).
pub fn add_kv_groups(ctx: &mut ForwardContext, extra: usize, tables: &[Vec<u32>]) {
    let (n, t, w, bs) = (
        ctx.num_seqs(),
        ctx.num_tokens(),
        ctx.max_blocks_per_seq,
        ctx.block_size,
    );
    ctx.extra_kv_groups = extra;
    ctx.group_slot_mapping.clear();
    ctx.group_block_tables.clear();
    ctx.group_slot_mapping.reserve(extra * t);
    ctx.group_block_tables.resize(extra * n * w, 0);
    for g in 1..=extra {
        for i in 0..n {
            let table = &tables[i * extra + g - 1];
            let row = ((g - 1) * n + i) * w;
            ctx.group_block_tables[row..row + table.len()].copy_from_slice(table);
            for j in ctx.cu_seqlens_q[i]..ctx.cu_seqlens_q[i + 1] {
                let pos = ctx.positions[j as usize] as usize;
                let block = table[pos / bs] as i64;
                ctx.group_slot_mapping
                    .push(block * bs as i64 + (pos % bs) as i64);
            }
        }
    }
}

/// Gives `ctx` KV cache groups 1..=`extra` whose tables are group 0's
/// shifted by `g * stride` pages (each group on pages of its own): for
/// benchmarks and tests that lay out block tables by hand. Group 0's tables
/// must use pages below `stride`.
pub fn shifted_kv_groups(ctx: &mut ForwardContext, extra: usize, stride: usize) {
    let (n, w, bs) = (ctx.num_seqs(), ctx.max_blocks_per_seq, ctx.block_size);
    ctx.extra_kv_groups = extra;
    ctx.group_slot_mapping.clear();
    ctx.group_block_tables.clear();
    for g in 1..=extra {
        let shift = (g * stride) as u32;
        ctx.group_block_tables
            .extend(ctx.block_tables[..n * w].iter().map(|&b| b + shift));
        let slots = ctx.slot_mapping.iter().map(|&s| {
            if s < 0 {
                s
            } else {
                s + (g * stride * bs) as i64
            }
        });
        ctx.group_slot_mapping.extend(slots.collect::<Vec<_>>());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 5-token prompt chunk (blocks 7, 3) then a decode at position 4
    /// (blocks 1, 9), block size 4.
    fn mixed_step(prompt: &[u32]) -> [ScheduledSeq<'_>; 2] {
        [
            ScheduledSeq {
                token_ids: prompt,
                context_len: 0,
                block_table: &[7, 3],
                want_logits: true,
            },
            ScheduledSeq {
                token_ids: &[42],
                context_len: 4,
                block_table: &[1, 9],
                want_logits: true,
            },
        ]
    }

    #[test]
    fn group_tables_and_slots_follow_their_own_pages() {
        let prompt: Vec<u32> = (0..5).collect();
        let seqs = mixed_step(&prompt);
        let mut ctx = build_forward_context(&seqs, 4);
        // Group 1: [20, 21] and [0, 22]; group 2: [30, 31] and [0, 32]
        // (0: a released entry).
        let tables = vec![vec![20, 21], vec![30, 31], vec![0, 22], vec![0, 32]];
        add_kv_groups(&mut ctx, 2, &tables);
        ctx.validate().unwrap();
        assert_eq!(ctx.slot_mapping_of(0), &[28, 29, 30, 31, 12, 36]);
        assert_eq!(ctx.slot_mapping_of(1), &[80, 81, 82, 83, 84, 88]);
        assert_eq!(ctx.slot_mapping_of(2), &[120, 121, 122, 123, 124, 128]);
        assert_eq!(ctx.group_block_table(1, 1), &[0, 22]);
        assert_eq!(ctx.group_block_table(2, 0), &[30, 31]);
        let mut shifted = build_forward_context(&seqs, 4);
        shifted_kv_groups(&mut shifted, 1, 100);
        shifted.validate().unwrap();
        assert_eq!(shifted.group_block_table(1, 0), &[107, 103]);
        assert_eq!(shifted.slot_mapping_of(1)[5], 436);
    }

    #[test]
    fn mixed_step_lays_out_prefill_chunk_and_decode() {
        let prompt: Vec<u32> = (0..5).collect();
        let seqs = mixed_step(&prompt);
        let ctx = build_forward_context(&seqs, 4);
        ctx.validate().unwrap();
        assert_eq!(ctx.positions, vec![0, 1, 2, 3, 4, 4]);
        assert_eq!(ctx.slot_mapping, vec![28, 29, 30, 31, 12, 36]);
        assert_eq!(ctx.cu_seqlens_q, vec![0, 5, 6]);
        assert_eq!(ctx.cu_seqlens_k, vec![0, 5, 10]);
        assert_eq!(ctx.seq_lens, vec![5, 5]);
        assert_eq!(ctx.context_lens, vec![0, 4]);
        assert_eq!(
            (
                ctx.num_prefills,
                ctx.num_prefill_tokens,
                ctx.num_decode_tokens
            ),
            (1, 5, 1)
        );
        assert_eq!(ctx.logits_indices, vec![4, 5]);
        assert_eq!(ctx.block_tables, vec![7, 3, 1, 9]);
    }

    #[test]
    fn chunk_that_does_not_finish_the_prompt_wants_no_logits() {
        let chunk: Vec<u32> = (0..3).collect();
        let seqs = [ScheduledSeq {
            token_ids: &chunk,
            context_len: 3,
            block_table: &[0, 1],
            want_logits: false,
        }];
        let ctx = build_forward_context(&seqs, 4);
        ctx.validate().unwrap();
        assert!(ctx.logits_indices.is_empty());
        assert_eq!(ctx.positions, vec![3, 4, 5]);
        assert_eq!(ctx.slot_mapping, vec![3, 4, 5]);
        assert_eq!(ctx.num_prefills, 1);
    }
}
