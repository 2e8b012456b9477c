//! Per-step batch metadata: what one forward pass computes and where its KV goes.
//!
//! Built once per step by the model runner from the scheduler's plan and passed
//! explicitly to every op that needs it (no globals). Sequences appear in the
//! order the runner chose; each contributes `query_len` new tokens that are laid
//! out contiguously in the step's token dimension. Building it is O(tokens in the
//! step + blocks of the scheduled sequences), never O(cache).
//!
//! Words follow vLLM: for sequence `i`,
//! - `context_lens[i]` tokens are already in the KV cache before this step,
//! - `query_len = cu_seqlens_q[i+1] - cu_seqlens_q[i]` tokens are computed now,
//! - `seq_lens[i] = context_lens[i] + query_len` tokens are in the cache after it.

/// Everything a forward pass needs to know about the batch, as plain host data.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForwardContext {
    /// Token ids of the step, `[num_tokens]`.
    pub input_ids: Vec<u32>,
    /// Absolute position of each token in its sequence, `[num_tokens]`.
    pub positions: Vec<u32>,
    /// Prefix sums of query lengths, `[num_seqs + 1]` (vLLM's query_start_loc).
    pub cu_seqlens_q: Vec<u32>,
    /// Prefix sums of `seq_lens`, `[num_seqs + 1]` (vLLM's seq_start_loc).
    pub cu_seqlens_k: Vec<u32>,
    /// Tokens in the cache after this step, per sequence.
    pub seq_lens: Vec<u32>,
    /// Tokens in the cache before this step, per sequence.
    pub context_lens: Vec<u32>,
    /// Cache slot (`block_id * block_size + offset`) for each token's K/V;
    /// `-1` means padding: the token's K/V is not stored.
    pub slot_mapping: Vec<i64>,
    /// Block tables, row-major `[num_seqs, max_blocks_per_seq]`, rows padded with 0.
    pub block_tables: Vec<u32>,
    /// Width of a `block_tables` row.
    pub max_blocks_per_seq: usize,
    /// KV cache groups after the first (0 for a model whose layers all
    /// share one block table; see `pagoda_model::KvLayout`).
    pub extra_kv_groups: usize,
    /// The slot mappings of groups 1..=`extra_kv_groups`, one after
    /// another, `[extra_kv_groups, num_tokens]` (group 0's is `slot_mapping`).
    pub group_slot_mapping: Vec<i64>,
    /// The block tables of groups 1..=`extra_kv_groups`, one after
    /// another, `[extra_kv_groups, num_seqs, max_blocks_per_seq]` (group 0's
    /// is `block_tables`).
    pub group_block_tables: Vec<u32>,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Longest query in the step.
    pub max_query_len: usize,
    /// Longest sequence (after this step) in the step.
    pub max_seq_len: usize,
    /// Sequences whose query is a prompt chunk (query_len > 1 or first token).
    pub num_prefills: usize,
    /// Tokens belonging to prefill sequences.
    pub num_prefill_tokens: usize,
    /// Tokens belonging to decode sequences (one each).
    pub num_decode_tokens: usize,
    /// Rows of the step whose logits are wanted (typically each sequence's last token).
    pub logits_indices: Vec<u32>,
    /// How to sample each logits row on the device, one entry per leading
    /// `logits_indices` entry (any rows after them are prompt-logprobs rows,
    /// see [`crate::SamplingOptions::prompt_rows`]); empty when the caller
    /// samples on the host from the logits (see [`crate::Backend::sample`]).
    pub sampling: Vec<SamplingRow>,
}

/// One row's sampling parameters for device-side sampling; the semantics are
/// those of the engine's host sampler (temperature below 1e-5 is greedy;
/// otherwise softmax(logits / temperature), then top-k, top-p, min-p, and one
/// draw from what is left, renormalized).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingRow {
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: u32,
    /// Keep the smallest most-likely set whose mass reaches `top_p`; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p * p_max`; 0 keeps all.
    pub min_p: f32,
    /// This draw's 64 random bits, from the request's own stream; the draw
    /// uses `u = (random >> 11) * 2^-53` in [0, 1).
    pub random: u64,
}

impl SamplingRow {
    /// Greedy decoding (argmax, ties to the lowest id).
    pub const GREEDY: SamplingRow = SamplingRow {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        random: 0,
    };
}

impl ForwardContext {
    pub fn num_seqs(&self) -> usize {
        self.seq_lens.len()
    }

    pub fn num_tokens(&self) -> usize {
        self.input_ids.len()
    }

    /// Query length of sequence `i`.
    pub fn query_len(&self, i: usize) -> usize {
        (self.cu_seqlens_q[i + 1] - self.cu_seqlens_q[i]) as usize
    }

    /// Block table row of sequence `i` (padded to `max_blocks_per_seq`).
    pub fn block_table(&self, i: usize) -> &[u32] {
        let w = self.max_blocks_per_seq;
        &self.block_tables[i * w..(i + 1) * w]
    }

    /// The slot mapping of KV cache group `g` (0: `slot_mapping`).
    pub fn slot_mapping_of(&self, g: usize) -> &[i64] {
        if g == 0 {
            return &self.slot_mapping;
        }
        let t = self.num_tokens();
        &self.group_slot_mapping[(g - 1) * t..g * t]
    }

    /// All block tables of KV cache group `g` (0: `block_tables`).
    pub fn block_tables_of(&self, g: usize) -> &[u32] {
        if g == 0 {
            return &self.block_tables;
        }
        let n = self.num_seqs() * self.max_blocks_per_seq;
        &self.group_block_tables[(g - 1) * n..g * n]
    }

    /// Block table row of sequence `i` in KV cache group `g`.
    pub fn group_block_table(&self, g: usize, i: usize) -> &[u32] {
        let w = self.max_blocks_per_seq;
        &self.block_tables_of(g)[i * w..(i + 1) * w]
    }

    /// Gives the step `extra` KV cache groups after the first that store
    /// nothing (slot -1) and read block 0: for dummy steps (profiling,
    /// warm-up) of a model with several groups.
    pub fn fill_unused_kv_groups(&mut self, extra: usize) {
        self.extra_kv_groups = extra;
        self.group_slot_mapping = vec![-1; extra * self.num_tokens()];
        self.group_block_tables = vec![0; extra * self.num_seqs() * self.max_blocks_per_seq];
    }

    /// Checks that KV cache group `g` exists in this step.
    pub fn check_kv_group(&self, g: usize) -> Result<(), String> {
        if g > self.extra_kv_groups {
            return Err(format!(
                "KV cache group {g} but the step has {} groups",
                self.extra_kv_groups + 1
            ));
        }
        Ok(())
    }

    /// Checks the internal consistency of the metadata; backends call this in
    /// debug builds, tests call it always.
    pub fn validate(&self) -> Result<(), String> {
        let n = self.num_seqs();
        let t = self.num_tokens();
        if self.positions.len() != t || self.slot_mapping.len() != t {
            return Err(format!(
                "positions ({}) and slot_mapping ({}) must have one entry per token ({t})",
                self.positions.len(),
                self.slot_mapping.len()
            ));
        }
        if self.cu_seqlens_q.len() != n + 1 || self.cu_seqlens_k.len() != n + 1 {
            return Err("cu_seqlens_q/k must have num_seqs + 1 entries".into());
        }
        if self.context_lens.len() != n {
            return Err("context_lens must have one entry per sequence".into());
        }
        if self.cu_seqlens_q.last().copied().unwrap_or(0) as usize != t {
            return Err("cu_seqlens_q must end at num_tokens".into());
        }
        if self.block_tables.len() != n * self.max_blocks_per_seq {
            return Err("block_tables must be num_seqs * max_blocks_per_seq".into());
        }
        let g = self.extra_kv_groups;
        if self.group_slot_mapping.len() != g * t
            || self.group_block_tables.len() != g * n * self.max_blocks_per_seq
        {
            return Err("group slot mappings and block tables must cover every extra group".into());
        }
        for i in 0..n {
            let q = self.query_len(i) as u32;
            if self.context_lens[i] + q != self.seq_lens[i] {
                return Err(format!("sequence {i}: context_len + query_len != seq_len"));
            }
            if self.cu_seqlens_k[i + 1] - self.cu_seqlens_k[i] != self.seq_lens[i] {
                return Err(format!(
                    "sequence {i}: cu_seqlens_k disagrees with seq_lens"
                ));
            }
            let need = (self.seq_lens[i] as usize).div_ceil(self.block_size.max(1));
            if need > self.max_blocks_per_seq {
                return Err(format!("sequence {i}: block table too short"));
            }
        }
        if self.logits_indices.iter().any(|&r| r as usize >= t) {
            return Err("logits index out of range".into());
        }
        if self.sampling.len() > self.logits_indices.len() {
            return Err("more sampling rows than logits indices".into());
        }
        Ok(())
    }
}
