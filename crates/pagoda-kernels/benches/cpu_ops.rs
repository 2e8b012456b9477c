//! CPU backend benchmark at SmolLM2-135M shapes (hidden 576, 9 heads, 3 kv
//! heads, head_dim 64, intermediate 1536, vocab 49152, 30 layers).
//!
//! Prints, as the median of several runs:
//! - `linear` for rows 1, 4, 8, 16, 32, 64 (GB/s of weights streamed) and
//!   512 (GFLOP/s) with f32 and f16 weights, and Q4_1 / Q8_0 / Q4_K / Q6_K
//!   blocks kept quantized (random blocks); at 32, 64 and 512 rows also the block
//!   kernels forced (label suffix `b`), against the backend's choice;
//! - attention for a 512-token prefill and a decode token at context 512;
//! - a synthetic SmolLM2-shaped forward pass (random weights, the op sequence
//!   of a Llama model): prefill 512 tokens and decode tokens/s.
//!
//! Run: `cargo bench -p pagoda-kernels --bench cpu_ops [-- THREADS [SECTION] [quick]]`
//! with SECTION one of linear, attention, model (or decode: the model's
//! decode alone, for profiling).

use pagoda_kernels::cpu::{quant, CpuBackend, CpuOptions, CpuTensor, CpuWeight, WeightDtype};
use pagoda_kernels::{
    AttentionParams, Backend, ForwardContext, GgmlType, HostData, HostTensor, KvCacheShape,
    QuantData, RopeStyle,
};
use std::time::Instant;

const HIDDEN: usize = 576;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const INTER: usize = 1536;
const VOCAB: usize = 49152;
const LAYERS: usize = 30;
const BLOCK: usize = 16;

struct Rng(u64);
impl Rng {
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 = self
                    .0
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }
}

/// Median and minimum seconds of `runs` calls of `f` after one warm-up (the
/// minimum is the better estimate on a machine shared with other work).
fn timed(runs: usize, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    match t.len() {
        0 => (f64::NAN, f64::NAN),
        n => (t[n / 2], t[0]),
    }
}

fn matrix(b: &CpuBackend, rng: &mut Rng, n: usize, k: usize) -> CpuWeight {
    let scale = 1.0 / (k as f32).sqrt();
    b.load_weight(HostTensor::f32(vec![n, k], rng.vec(n * k, scale)))
        .unwrap()
}

/// Random blocks of `ty` with small f16 scales at `halves` (byte offsets).
fn quant_matrix(b: &CpuBackend, rng: &mut Rng, ty: GgmlType, n: usize, k: usize) -> CpuWeight {
    let halves: &[usize] = match ty {
        GgmlType::Q4_1 | GgmlType::Q4_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[0],
    };
    let mut bytes: Vec<u8> = rng
        .vec(n * k / ty.block_size() * ty.type_size(), 128.0)
        .into_iter()
        .map(|v| (v + 128.0) as u8)
        .collect();
    for block in bytes.chunks_exact_mut(ty.type_size()) {
        for &o in halves {
            block[o..o + 2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
        }
    }
    let host = HostTensor {
        shape: vec![n, k],
        data: HostData::Quant(QuantData { ty, bytes }),
    };
    b.load_weight(host).unwrap()
}

fn bench_linear(threads: usize, quick: bool) {
    let mut rng = Rng(1);
    println!("linear (threads {threads})");
    println!(
        "  {:>6} {:>5} {:>12} {:>10} {:>14} {:>14}",
        "dtype", "rows", "[n, k]", "median ms", "median rate", "best rate"
    );
    let kinds = [
        (WeightDtype::F32, None),
        (WeightDtype::F16, None),
        (WeightDtype::F16, Some(GgmlType::Q4_1)),
        (WeightDtype::F16, Some(GgmlType::Q8_0)),
        (WeightDtype::F16, Some(GgmlType::Q4_K)),
        (WeightDtype::F16, Some(GgmlType::Q6_K)),
    ];
    for (dtype, quant) in kinds {
        let b = CpuBackend::new(CpuOptions {
            threads,
            weight_dtype: dtype,
        })
        .unwrap()
        .with_quantized_weights(quant.is_some());
        let label = quant.map_or(format!("{dtype:?}"), |t| t.name().to_string());
        let shapes: &[(usize, usize)] = match quant {
            Some(GgmlType::Q4_K | GgmlType::Q6_K) => &[(1536, 768), (49152, 768)],
            _ => &[(576, 576), (1536, 576), (576, 1536), (49152, 576)],
        };
        for &(n, k) in shapes {
            let w = match quant {
                None => matrix(&b, &mut rng, n, k),
                Some(t) => quant_matrix(&b, &mut rng, t, n, k),
            };
            for rows in [1usize, 4, 8, 16, 32, 64, 512] {
                let x = b
                    .tensor_from_host(rows, k, &rng.vec(rows * k, 1.0))
                    .unwrap();
                let runs = match (rows < 64, quick) {
                    (true, false) => 51,
                    (true, true) => 11,
                    (false, false) => 7,
                    (false, true) => 3,
                };
                let (t, best) = timed(runs, || {
                    std::hint::black_box(b.linear(&x, &w, None).unwrap());
                });
                let rate = |t: f64| {
                    if rows < 64 {
                        format!("{:.1} GB/s", w.bytes() as f64 / t / 1e9)
                    } else {
                        format!("{:.1} GFLOP/s", 2.0 * (rows * n * k) as f64 / t / 1e9)
                    }
                };
                println!(
                    "  {:>6} {:>5} {:>12} {:>10.3} {:>14} {:>14}",
                    label,
                    rows,
                    format!("[{n}, {k}]"),
                    t * 1e3,
                    rate(t),
                    rate(best)
                );
                if let (Some(ty), 32 | 64 | 512) = (quant, rows) {
                    // The block kernels forced at batched-decode widths.
                    let (xs, bytes) = (x.data(), w.quant_bytes().expect("kept quantized"));
                    let mut y = vec![0f32; rows * n];
                    let isa = quant::Isa::detect();
                    let (t, best) = timed(runs, || {
                        quant::matmul(xs, rows, k, ty, bytes, &mut y, threads, isa);
                    });
                    println!(
                        "  {:>6} {:>5} {:>12} {:>10.3} {:>14} {:>14}",
                        format!("{label}b"),
                        rows,
                        format!("[{n}, {k}]"),
                        t * 1e3,
                        rate(t),
                        rate(best)
                    );
                }
            }
        }
    }
}

/// A step over one sequence: `query` new tokens after `context` cached ones.
fn one_seq_step(context: usize, query: usize) -> ForwardContext {
    let seq = context + query;
    let blocks = seq.div_ceil(BLOCK);
    let ctx = ForwardContext {
        input_ids: (0..query as u32)
            .map(|i| (i * 7919) % VOCAB as u32)
            .collect(),
        positions: (context as u32..seq as u32).collect(),
        cu_seqlens_q: vec![0, query as u32],
        cu_seqlens_k: vec![0, seq as u32],
        seq_lens: vec![seq as u32],
        context_lens: vec![context as u32],
        slot_mapping: (context as i64..seq as i64).collect(),
        block_tables: (0..blocks as u32).collect(),
        max_blocks_per_seq: blocks,
        block_size: BLOCK,
        max_query_len: query,
        max_seq_len: seq,
        num_prefills: usize::from(query > 1),
        num_prefill_tokens: if query > 1 { query } else { 0 },
        num_decode_tokens: if query > 1 { 0 } else { 1 },
        logits_indices: vec![query as u32 - 1],
        sampling: Vec::new(),
        ..Default::default()
    };
    ctx.validate().unwrap();
    ctx
}

const PARAMS: AttentionParams = AttentionParams {
    num_heads: HEADS,
    num_kv_heads: KV_HEADS,
    head_dim: HEAD_DIM,
    scale: 0.125,
    window: None,
    softcap: None,
    kv_group: 0,
};

fn kv_shape(tokens: usize) -> KvCacheShape {
    KvCacheShape {
        num_blocks: tokens.div_ceil(BLOCK),
        block_size: BLOCK,
        num_kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
    }
}

fn bench_attention(threads: usize) {
    let b = CpuBackend::new(CpuOptions {
        threads,
        weight_dtype: WeightDtype::F32,
    })
    .unwrap();
    let mut rng = Rng(2);
    let mut cache = b.alloc_kv_cache(kv_shape(1024)).unwrap();
    let kv_w = KV_HEADS * HEAD_DIM;
    let pre = b.begin_step(&one_seq_step(0, 512)).unwrap();
    let k = b
        .tensor_from_host(512, kv_w, &rng.vec(512 * kv_w, 1.0))
        .unwrap();
    b.store_kv(&k, &k, &mut cache, &pre).unwrap();
    let q = b
        .tensor_from_host(512, HEADS * HEAD_DIM, &rng.vec(512 * HEADS * HEAD_DIM, 1.0))
        .unwrap();
    let (t, best) = timed(7, || {
        std::hint::black_box(b.attention(&q, &cache, &pre, &PARAMS).unwrap());
    });
    println!("attention (threads {threads})");
    println!(
        "  prefill 512 tokens, one layer: {:.3} ms (best {:.3})",
        t * 1e3,
        best * 1e3
    );
    let dec = b.begin_step(&one_seq_step(511, 1)).unwrap();
    let q1 = b
        .tensor_from_host(1, HEADS * HEAD_DIM, &rng.vec(HEADS * HEAD_DIM, 1.0))
        .unwrap();
    let (t, best) = timed(51, || {
        std::hint::black_box(b.attention(&q1, &cache, &dec, &PARAMS).unwrap());
    });
    println!(
        "  decode at context 512, one layer: {:.1} us (best {:.1})",
        t * 1e6,
        best * 1e6
    );
    let mut x = b
        .tensor_from_host(1, HIDDEN, &rng.vec(HIDDEN, 1.0))
        .unwrap();
    let y = b
        .tensor_from_host(1, HIDDEN, &rng.vec(HIDDEN, 1.0))
        .unwrap();
    let (t, best) = timed(201, || b.add(&mut x, &y).unwrap());
    println!(
        "  op overhead (add of one row): {:.1} us (best {:.1})",
        t * 1e6,
        best * 1e6
    );
}

struct Layer {
    ln1: CpuWeight,
    q: CpuWeight,
    k: CpuWeight,
    v: CpuWeight,
    o: CpuWeight,
    ln2: CpuWeight,
    gate_up: CpuWeight,
    down: CpuWeight,
}

struct Model {
    embed: CpuWeight,
    layers: Vec<Layer>,
    norm: CpuWeight,
    cos_sin: CpuWeight,
}

fn build_model(b: &CpuBackend, rng: &mut Rng) -> Model {
    let ones = |b: &CpuBackend| {
        b.load_weight(HostTensor::f32(vec![HIDDEN], vec![1.0; HIDDEN]))
            .unwrap()
    };
    let layers = (0..LAYERS)
        .map(|_| Layer {
            ln1: ones(b),
            q: matrix(b, rng, HEADS * HEAD_DIM, HIDDEN),
            k: matrix(b, rng, KV_HEADS * HEAD_DIM, HIDDEN),
            v: matrix(b, rng, KV_HEADS * HEAD_DIM, HIDDEN),
            o: matrix(b, rng, HIDDEN, HEADS * HEAD_DIM),
            ln2: ones(b),
            gate_up: matrix(b, rng, 2 * INTER, HIDDEN),
            down: matrix(b, rng, HIDDEN, INTER),
        })
        .collect();
    let max_pos = 2048;
    let mut table = vec![0f32; max_pos * HEAD_DIM];
    for p in 0..max_pos {
        for i in 0..HEAD_DIM / 2 {
            let a = p as f64 * 10000f64.powf(-(2.0 * i as f64) / HEAD_DIM as f64);
            table[p * HEAD_DIM + i] = a.cos() as f32;
            table[p * HEAD_DIM + HEAD_DIM / 2 + i] = a.sin() as f32;
        }
    }
    Model {
        embed: matrix(b, rng, VOCAB, HIDDEN),
        layers,
        norm: ones(b),
        cos_sin: b
            .load_weight(HostTensor::f32(vec![max_pos, HEAD_DIM], table))
            .unwrap(),
    }
}

/// The op sequence of a Llama-family forward pass; returns the logits.
fn forward(
    b: &CpuBackend,
    m: &Model,
    ctx: &ForwardContext,
    kv: &mut [pagoda_kernels::cpu::CpuKvCache],
) -> CpuTensor {
    let s = b.begin_step(ctx).unwrap();
    let mut x = b.embedding(&s, &m.embed).unwrap();
    let mut h = b.rms_norm(&x, &m.layers[0].ln1, 1e-5).unwrap();
    for (i, (l, cache)) in m.layers.iter().zip(kv.iter_mut()).enumerate() {
        let mut q = b.linear(&h, &l.q, None).unwrap();
        let mut k = b.linear(&h, &l.k, None).unwrap();
        let v = b.linear(&h, &l.v, None).unwrap();
        b.rope(&mut q, &s, &m.cos_sin, HEAD_DIM, RopeStyle::Neox)
            .unwrap();
        b.rope(&mut k, &s, &m.cos_sin, HEAD_DIM, RopeStyle::Neox)
            .unwrap();
        b.store_kv(&k, &v, cache, &s).unwrap();
        let a = b.attention(&q, cache, &s, &PARAMS).unwrap();
        let o = b.linear(&a, &l.o, None).unwrap();
        h = b.add_rms_norm(&mut x, &o, &l.ln2, 1e-5).unwrap();
        let gu = b.linear(&h, &l.gate_up, None).unwrap();
        let d = b.linear(&b.silu_mul(&gu).unwrap(), &l.down, None).unwrap();
        let next = m.layers.get(i + 1).map_or(&m.norm, |n| &n.ln1);
        h = b.add_rms_norm(&mut x, &d, next, 1e-5).unwrap();
    }
    let last = b.gather_logits_rows(&h, &s).unwrap();
    b.linear(&last, &m.embed, None).unwrap()
}

fn bench_model(threads: usize, quick: bool, decode_only: bool) {
    let b = CpuBackend::new(CpuOptions {
        threads,
        weight_dtype: WeightDtype::F16,
    })
    .unwrap();
    let mut rng = Rng(3);
    let m = build_model(&b, &mut rng);
    let mut kv: Vec<_> = (0..LAYERS)
        .map(|_| b.alloc_kv_cache(kv_shape(1024)).unwrap())
        .collect();
    println!("SmolLM2-135M-shaped model, f16 weights (threads {threads})");
    let prompt = 512;
    let pre = one_seq_step(0, prompt);
    let runs = match (quick, decode_only) {
        (_, true) => 0,
        (true, false) => 1,
        (false, false) => 3,
    };
    let (t, best) = timed(runs, || {
        std::hint::black_box(forward(&b, &m, &pre, &mut kv));
    });
    if !decode_only {
        println!(
            "  prefill {prompt} tokens: {:.3} s, {:.1} tok/s (best {:.1})",
            t,
            prompt as f64 / t,
            prompt as f64 / best
        );
    }
    let steps = if quick {
        16
    } else if decode_only {
        256
    } else {
        64
    };
    let mut times = Vec::new();
    for i in 0..steps {
        let ctx = one_seq_step(prompt + i, 1);
        let s = Instant::now();
        std::hint::black_box(forward(&b, &m, &ctx, &mut kv));
        times.push(s.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let t = times[times.len() / 2];
    println!(
        "  decode at context ~{prompt}: {:.2} ms/token, {:.1} tok/s",
        t * 1e3,
        1.0 / t
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let threads = args.first().and_then(|a| a.parse().ok()).unwrap_or(2);
    let quick = args.iter().any(|a| a == "quick");
    let only = args.get(1).filter(|a| *a != "quick").cloned();
    let run = |name: &str| only.as_deref().is_none_or(|o| o == name);
    if run("linear") {
        bench_linear(threads, quick);
    }
    if run("attention") {
        bench_attention(threads);
    }
    if run("model") {
        bench_model(threads, quick, false);
    }
    if only.as_deref() == Some("decode") {
        bench_model(threads, quick, true);
    }
}
