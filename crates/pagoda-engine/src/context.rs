//! Building a step's [`ForwardContext`] from the sequences scheduled into it.
//!
//! Cost: O(tokens in the step + blocks of the scheduled sequences); nothing
//! here looks at the rest of the cache.

use pagoda_core::{BlockId, ScheduledSequence};
use pagoda_kernels::ForwardContext;

/// A block table entry as the kernels read it: a block a sliding window
/// released ([`BlockId::NULL`]) is never read, so it is laid out as block 0.
fn entry(b: BlockId) -> u32 {
    if b.is_null() {
        0
    } else {
        b.0
    }
}

/// Lays the scheduled sequences out as one step. A sequence with a single
/// token and a non-empty context counts as a decode; everything else as a
/// prefill (chunk). Every sequence carries the same number of group tables
/// (the KV cache groups past the first); their slots and table rows are laid
/// out as group 0's, O(groups * (tokens + table entries)).
pub fn build_forward_context(seqs: &[ScheduledSequence], block_size: usize) -> ForwardContext {
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
        let context_len = s.num_computed_tokens;
        let seq_len = context_len + query_len;
        for (j, &t) in s.token_ids.iter().enumerate() {
            let pos = context_len + j;
            ctx.input_ids.push(t);
            ctx.positions.push(pos as u32);
            let block = entry(s.block_table[pos / block_size]) as i64;
            ctx.slot_mapping
                .push(block * block_size as i64 + (pos % block_size) as i64);
        }
        ctx.cu_seqlens_q.push(ctx.input_ids.len() as u32);
        ctx.cu_seqlens_k.push(ctx.cu_seqlens_k[i] + seq_len as u32);
        ctx.seq_lens.push(seq_len as u32);
        ctx.context_lens.push(context_len as u32);
        let row = &mut ctx.block_tables[i * max_blocks..i * max_blocks + s.block_table.len()];
        for (dst, &b) in row.iter_mut().zip(&s.block_table) {
            *dst = entry(b);
        }
        ctx.max_query_len = ctx.max_query_len.max(query_len);
        ctx.max_seq_len = ctx.max_seq_len.max(seq_len);
        if query_len == 1 && context_len > 0 {
            ctx.num_decode_tokens += 1;
        } else {
            ctx.num_prefills += 1;
            ctx.num_prefill_tokens += query_len;
        }
        if s.needs_logits && query_len > 0 {
            ctx.logits_indices.push(ctx.input_ids.len() as u32 - 1);
        }
    }
    let extra = seqs.first().map_or(0, |s| s.group_tables.len());
    if extra > 0 {
        add_kv_groups(&mut ctx, seqs, extra);
    }
    ctx
}

/// Gives `ctx` (laid out from `seqs` by [`build_forward_context`]) KV cache
/// groups 1..=`extra` from each sequence's group tables.
fn add_kv_groups(ctx: &mut ForwardContext, seqs: &[ScheduledSequence], extra: usize) {
    let (n, t, w, bs) = (
        ctx.num_seqs(),
        ctx.num_tokens(),
        ctx.max_blocks_per_seq,
        ctx.block_size,
    );
    ctx.extra_kv_groups = extra;
    ctx.group_slot_mapping.reserve(extra * t);
    ctx.group_block_tables.resize(extra * n * w, 0);
    for g in 1..=extra {
        for (i, s) in seqs.iter().enumerate() {
            let table = &s.group_tables[g - 1];
            let row = ((g - 1) * n + i) * w;
            for (dst, &b) in ctx.group_block_tables[row..row + table.len()]
                .iter_mut()
                .zip(table)
            {
                *dst = entry(b);
            }
            for j in ctx.cu_seqlens_q[i]..ctx.cu_seqlens_q[i + 1] {
                let pos = ctx.positions[j as usize] as usize;
                let block = entry(table[pos / bs]) as i64;
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
    use pagoda_core::RequestId;

    fn blocks(ids: &[u32]) -> Vec<BlockId> {
        ids.iter().map(|&b| BlockId(b)).collect()
    }

    /// A 5-token prompt chunk (blocks 7, 3) then a decode at position 4
    /// (blocks 1, 9), block size 4.
    fn mixed_step(prompt: &[u32]) -> [ScheduledSequence; 2] {
        [
            ScheduledSequence::new(RequestId(0), prompt.to_vec(), 0, blocks(&[7, 3]), true),
            ScheduledSequence::new(RequestId(1), vec![42], 4, blocks(&[1, 9]), true),
        ]
    }

    #[test]
    fn group_tables_and_slots_follow_their_own_pages() {
        let prompt: Vec<u32> = (0..5).collect();
        let seqs = mixed_step(&prompt);
        // Group 1: [20, 21] and [NULL, 22]; group 2: [30, 31] and [NULL, 32]
        // (NULL: an entry a sliding window released, laid out as block 0).
        let [a, b] = seqs.clone();
        let grouped = [
            a.with_group_tables(vec![blocks(&[20, 21]), blocks(&[30, 31])]),
            b.with_group_tables(vec![
                vec![BlockId::NULL, BlockId(22)],
                vec![BlockId::NULL, BlockId(32)],
            ]),
        ];
        let ctx = build_forward_context(&grouped, 4);
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
        let seqs = [ScheduledSequence::new(
            RequestId(0),
            chunk,
            3,
            blocks(&[0, 1]),
            false,
        )];
        let ctx = build_forward_context(&seqs, 4);
        ctx.validate().unwrap();
        assert!(ctx.logits_indices.is_empty());
        assert_eq!(ctx.positions, vec![3, 4, 5]);
        assert_eq!(ctx.slot_mapping, vec![3, 4, 5]);
        assert_eq!(ctx.num_prefills, 1);
    }
}
