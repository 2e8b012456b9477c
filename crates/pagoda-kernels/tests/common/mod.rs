//! Shared test helpers: a seeded PRNG and random vectors, backend
//! constructors, closeness checks, a builder of consistent
//! `ForwardContext`s over shuffled paged blocks, and storing a step's K/V
//! on any backend. (The CUDA tests open the
//! device through `pagoda_kernels::cuda::testing`.)
#![allow(dead_code)]

pub mod moe;

use pagoda_kernels::cpu::{CpuBackend, CpuOptions, CpuTensor, WeightDtype};
use pagoda_kernels::{Backend, ForwardContext, HostTensor};

/// SplitMix64: small, seeded, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `[-1, 1)`.
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// `v` rounded to bf16.
pub fn bf(v: f32) -> f32 {
    half::bf16::from_f32(v).to_f32()
}

/// `n` random values in `[-scale, scale)`, rounded to bf16 (what the device holds).
pub fn rvec(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| bf(rng.uniform() * scale)).collect()
}

/// `n` random values in `[-scale, scale)`, unrounded.
pub fn rvec_f32(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.uniform() * scale).collect()
}

/// A backend; in the `cpu_portable` test binary (whose root sets
/// `PORTABLE`), with the AVX2 kernels switched off.
pub fn backend(threads: usize, weight_dtype: WeightDtype) -> CpuBackend {
    if crate::PORTABLE {
        pagoda_kernels::cpu::set_simd_enabled(false);
    }
    CpuBackend::new(CpuOptions {
        threads,
        weight_dtype,
    })
    .expect("thread pool")
}

pub fn tensor(b: &CpuBackend, rows: usize, cols: usize, data: &[f32]) -> CpuTensor {
    b.tensor_from_host(rows, cols, data).expect("tensor")
}

pub fn host(b: &CpuBackend, x: &CpuTensor) -> Vec<f32> {
    b.tensor_to_host(x).expect("to host")
}

pub fn weight2(rows: usize, cols: usize, data: Vec<f32>) -> HostTensor {
    HostTensor::f32(vec![rows, cols], data)
}

/// What a weight value becomes when stored in `dtype`.
pub fn round(v: f32, dtype: WeightDtype) -> f32 {
    match dtype {
        WeightDtype::F32 => v,
        WeightDtype::F16 => half::f16::from_f32(v).to_f32(),
        WeightDtype::BF16 => half::bf16::from_f32(v).to_f32(),
    }
}

/// Asserts every element is finite and `|got - want| <= atol + rtol * scale[i]`.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], scale: &[f64], atol: f64, rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.is_finite(),
            "{what}: element {i} is {g} (unwritten or overflow)"
        );
        let tol = atol + rtol * scale[i];
        assert!(
            (g as f64 - w).abs() <= tol,
            "{what}: element {i}: got {g}, want {w}, tol {tol}"
        );
    }
}

/// Like [`assert_close`] with the scale of each element being `|want|`.
pub fn assert_close_rel(what: &str, got: &[f32], want: &[f64], atol: f64, rtol: f64) {
    let scale: Vec<f64> = want.iter().map(|w| w.abs()).collect();
    assert_close(what, got, want, &scale, atol, rtol);
}

/// One sequence of a step: `context_len` cached tokens, `query_len` new ones.
#[derive(Debug, Clone, Copy)]
pub struct SeqSpec {
    pub context_len: usize,
    pub query_len: usize,
}

/// A sequence of `context_len` cached tokens and a `query_len`-token chunk.
pub fn s(context_len: usize, query_len: usize) -> SeqSpec {
    SeqSpec {
        context_len,
        query_len,
    }
}

/// A step over sequences whose blocks were drawn at random from the pool.
pub struct PagedStep {
    pub ctx: ForwardContext,
    /// Each sequence's block table (only the blocks it uses).
    pub tables: Vec<Vec<u32>>,
}

/// Builds the step computing each sequence's `query_len` new tokens, with
/// blocks drawn without replacement from a shuffled pool of `num_blocks`.
/// Padding tokens (`pad` of them) are appended as one-token sequences with
/// slot -1 (they read block 0 and their outputs are ignored).
pub fn paged_step(
    rng: &mut Rng,
    seqs: &[SeqSpec],
    block_size: usize,
    num_blocks: usize,
    pad: usize,
) -> PagedStep {
    let mut pool: Vec<u32> = (0..num_blocks as u32).collect();
    rng.shuffle(&mut pool);
    let mut tables = Vec::new();
    for s in seqs {
        let n = (s.context_len + s.query_len).div_ceil(block_size);
        assert!(pool.len() >= n, "test needs more blocks");
        tables.push(pool.split_off(pool.len() - n));
    }
    let all: Vec<SeqSpec> = seqs
        .iter()
        .copied()
        .chain((0..pad).map(|_| SeqSpec {
            context_len: 0,
            query_len: 1,
        }))
        .collect();
    let mut ctx = ForwardContext {
        block_size,
        ..Default::default()
    };
    ctx.max_blocks_per_seq = tables.iter().map(Vec::len).max().unwrap_or(0).max(1) + 1;
    ctx.cu_seqlens_q.push(0);
    ctx.cu_seqlens_k.push(0);
    for (i, s) in all.iter().enumerate() {
        let seq_len = s.context_len + s.query_len;
        let mut row = vec![0u32; ctx.max_blocks_per_seq];
        if let Some(t) = tables.get(i) {
            row[..t.len()].copy_from_slice(t);
        }
        for j in 0..s.query_len {
            let pos = s.context_len + j;
            ctx.input_ids.push(rng.below(100) as u32);
            ctx.positions.push(pos as u32);
            ctx.slot_mapping.push(match tables.get(i) {
                Some(t) => (t[pos / block_size] as usize * block_size + pos % block_size) as i64,
                None => -1,
            });
        }
        ctx.block_tables.extend_from_slice(&row);
        ctx.cu_seqlens_q
            .push(ctx.cu_seqlens_q[i] + s.query_len as u32);
        ctx.cu_seqlens_k.push(ctx.cu_seqlens_k[i] + seq_len as u32);
        ctx.seq_lens.push(seq_len as u32);
        ctx.context_lens.push(s.context_len as u32);
        ctx.max_query_len = ctx.max_query_len.max(s.query_len);
        ctx.max_seq_len = ctx.max_seq_len.max(seq_len);
        if s.query_len > 1 || s.context_len == 0 {
            ctx.num_prefills += 1;
            ctx.num_prefill_tokens += s.query_len;
        } else {
            ctx.num_decode_tokens += 1;
        }
        ctx.logits_indices.push(ctx.cu_seqlens_q[i + 1] - 1);
    }
    ctx.validate().expect("consistent test step");
    PagedStep { ctx, tables }
}

/// The step that writes each sequence's cached prefix (positions
/// `0..context_len`) into the same blocks, as an earlier prefill would have.
pub fn prefix_step(main: &PagedStep, seqs: &[SeqSpec]) -> ForwardContext {
    let bs = main.ctx.block_size;
    let mut ctx = ForwardContext {
        block_size: bs,
        max_blocks_per_seq: main.ctx.max_blocks_per_seq,
        ..Default::default()
    };
    ctx.cu_seqlens_q.push(0);
    ctx.cu_seqlens_k.push(0);
    for (i, s) in seqs.iter().enumerate() {
        let t = &main.tables[i];
        for pos in 0..s.context_len {
            ctx.input_ids.push(0);
            ctx.positions.push(pos as u32);
            ctx.slot_mapping
                .push((t[pos / bs] as usize * bs + pos % bs) as i64);
        }
        ctx.block_tables.extend_from_slice(main.ctx.block_table(i));
        ctx.cu_seqlens_q
            .push(ctx.cu_seqlens_q[i] + s.context_len as u32);
        ctx.cu_seqlens_k
            .push(ctx.cu_seqlens_k[i] + s.context_len as u32);
        ctx.seq_lens.push(s.context_len as u32);
        ctx.context_lens.push(0);
    }
    ctx.validate().expect("consistent prefix step");
    ctx
}

/// Stores `k`/`v` (`[tokens, width]`) of the step `ctx` into `cache` on
/// backend `b` (nothing for an empty step).
pub fn store_step_kv<B: Backend>(
    b: &B,
    cache: &mut B::KvCache,
    ctx: &ForwardContext,
    k: &[f32],
    v: &[f32],
) {
    let rows = ctx.num_tokens();
    if rows == 0 {
        return;
    }
    let width = k.len() / rows;
    let st = b.begin_step(ctx).unwrap();
    let tk = b.tensor_from_host(rows, width, k).unwrap();
    let tv = b.tensor_from_host(rows, width, v).unwrap();
    b.store_kv(&tk, &tv, cache, &st).unwrap();
}
