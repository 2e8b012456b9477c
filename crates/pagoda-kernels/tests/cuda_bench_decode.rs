//! Decode step times of a dense layer stack on the GPU host (ignored by
//! default; run with `--ignored --nocapture`): the whole Llama-family
//! forward pass of a decode step (embedding, the first input norm; per layer
//! `linear3`, `qk_norm_rope_store_kv`, `attention`, o_proj `add_linear`,
//! `rms_norm`, `gate_up_silu`, down `add_linear`, the next norm; the logits
//! rows and the LM head; then device sampling), as the model code calls it,
//! captured into a CUDA graph and replayed, at batch 1 and 8 with
//! 1,000-token contexts, at the Qwen3-0.6B shape (28 layers, hidden 1024,
//! q/k norms, tied 151,936-row LM head) and the Llama-3.1-8B shape (32
//! layers, hidden 4096, 128,256-row LM head). Each configuration is one
//! line: small-row path (auto, warp, mma, cublas) x decode fusions (on,
//! off), with the median step time of timed replays (host clock around
//! the replay, which waits for the sampled tokens) and the weight-read
//! floor at 4.8 TB/s; the default configuration is also timed eagerly (no
//! graph), which shows the launch cost the graph hides.
//!
//! Each layer has its own weights and KV cache, so nothing stays in L2
//! across layers. Random weights and a zeroed cache: timings only
//! (correctness is cuda_decode_fusion's and cuda_gemv's job).
//!
//! # The kernels of a batch-1 decode step (Qwen3 / Llama, bf16 cache)
//!
//! Per step, in the graph: `gather_rows_bf16_f32` (embedding into the f32
//! residual), `rms_norm_f32` (the first layer's input norm); the layers;
//! `gather_rows_bf16` (the logits rows), the LM head (`gemv_bf16` at one
//! row; cuBLASLt from 2 rows for these heads, over 24 MiB). After the graph:
//! `sample_bf16` (plus `penalize_bf16` / `logprobs_bf16` where a request
//! asks), then the one download.
//!
//! Per layer, fusions on (the default) where the CUDA-core GEMV runs the
//! products (1 row; 2-4 rows of weights under 24 MiB), 8 launches:
//! 1. `gemv3_bf16`: q, k, v;
//! 2. `qk_norm_rope_store_{f32,bf16}_bf16`: Qwen3's q/k head norms (Llama:
//!    none), rope, and K/V into the cache;
//! 3. `paged_decode_attention_bf16_hd128_g{2,4}` (Qwen3-0.6B 16 over 8
//!    heads, Llama-3.1-8B 32 over 8), its partitions merged by its last
//!    block at small batches (else `paged_decode_reduce_bf16` after it);
//! 4. `gemv_bf16_acc_f32`: o_proj added into the residual;
//! 5. `rms_norm_f32`: the post-attention norm;
//! 6. `gemv_silu_bf16`: gate/up and SiLU;
//! 7. `gemv_bf16_acc_f32`: down added into the residual;
//! 8. `rms_norm_f32`: the next layer's input norm (the last layer's: the
//!    final norm).
//!
//! With `PAGODA_DECODE_FUSION=off`, 10: `qk_norm_rope_bf16` and
//! `store_kv_v8_bf16` for 2, `gemv_bf16` and `silu_mul_v8_bf16` for 6.
//! Where cuBLASLt runs the products (the 8B from 2 rows) each product is a
//! cuBLASLt GEMM (a `fill_u32` and an `add_bias_round_bf16` more with a
//! bias, three for q, k, v) and the SiLU stays separate; the tensor-core
//! GEMV (5-16 rows of small weights) likewise, q, k, v in one
//! `gemv_mma3_bf16`.
#![cfg(feature = "cuda")]

mod common;

#[allow(dead_code)]
const PORTABLE: bool = false;

use common::*;
use half::bf16;
use pagoda_kernels::cuda::testing::{gpu, median_secs};
use pagoda_kernels::cuda::SmallLinear;
use pagoda_kernels::cuda::{CudaBackend, CudaKvCache, CudaStep, CudaTensor, CudaWeight};
use pagoda_kernels::{
    AttentionParams, Backend, HostData, HostTensor, KvCacheShape, RopeStyle, SamplingRow,
};

/// A dense model's decode-relevant shape.
struct Shape {
    name: &'static str,
    layers: usize,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    inter: usize,
    vocab: usize,
    qk_norm: bool,
    tied: bool,
}

const QWEN3_0_6B: Shape = Shape {
    name: "qwen3-0.6b",
    layers: 28,
    hidden: 1024,
    heads: 16,
    kv_heads: 8,
    head_dim: 128,
    inter: 3072,
    vocab: 151_936,
    qk_norm: true,
    tied: true,
};

const LLAMA_8B: Shape = Shape {
    name: "llama-3.1-8b",
    layers: 32,
    hidden: 4096,
    heads: 32,
    kv_heads: 8,
    head_dim: 128,
    inter: 14336,
    vocab: 128_256,
    qk_norm: false,
    tied: false,
};

const CONTEXT: usize = 1000;
const BLOCK: usize = 16;

/// Random bf16 values of scale `s` (a cheap generator: only speed matters).
fn host(rng: &mut Rng, shape: Vec<usize>, s: f32) -> HostTensor {
    let n: usize = shape.iter().product();
    let mut state = rng.below(1 << 30) as u32 | 1;
    let data = (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            bf16::from_f32(s * ((state >> 8) as f32 / (1 << 24) as f32 - 0.5))
        })
        .collect();
    HostTensor {
        shape,
        data: HostData::BF16(data),
    }
}

struct Layer {
    in_norm: CudaWeight,
    q: CudaWeight,
    k: CudaWeight,
    v: CudaWeight,
    q_norm: Option<CudaWeight>,
    k_norm: Option<CudaWeight>,
    o: CudaWeight,
    post_norm: CudaWeight,
    gate_up: CudaWeight,
    down: CudaWeight,
}

struct Model {
    embed: CudaWeight,
    lm_head: Option<CudaWeight>,
    norm: CudaWeight,
    cos_sin: CudaWeight,
    layers: Vec<Layer>,
    params: AttentionParams,
    /// Bytes of weights one decode step reads.
    weight_bytes: usize,
}

fn model(g: &CudaBackend, s: &Shape) -> Model {
    let mut rng = Rng::new(5);
    let (h, hd) = (s.hidden, s.head_dim);
    let (qd, kvd) = (s.heads * hd, s.kv_heads * hd);
    // One layer's host weights, uploaded once per layer (distinct device
    // copies).
    let wq = host(&mut rng, vec![qd, h], 0.05);
    let wk = host(&mut rng, vec![kvd, h], 0.05);
    let wv = host(&mut rng, vec![kvd, h], 0.05);
    let wo = host(&mut rng, vec![h, qd], 0.05);
    let wgu = host(&mut rng, vec![2 * s.inter, h], 0.05);
    let wd = host(&mut rng, vec![h, s.inter], 0.05);
    let ones = |n: usize| HostTensor::f32(vec![n], vec![1.0; n]);
    let up = |t: &HostTensor| g.load_weight(t.clone()).unwrap();
    let layers = (0..s.layers)
        .map(|_| Layer {
            in_norm: up(&ones(h)),
            q: up(&wq),
            k: up(&wk),
            v: up(&wv),
            q_norm: s.qk_norm.then(|| up(&ones(hd))),
            k_norm: s.qk_norm.then(|| up(&ones(hd))),
            o: up(&wo),
            post_norm: up(&ones(h)),
            gate_up: up(&wgu),
            down: up(&wd),
        })
        .collect();
    let embed = up(&host(&mut rng, vec![s.vocab, h], 1.0));
    let lm_head = (!s.tied).then(|| up(&host(&mut rng, vec![s.vocab, h], 0.05)));
    let max_pos = 4096;
    let table: Vec<f32> = (0..max_pos * hd)
        .map(|i| {
            let (p, d) = (i / hd, i % hd);
            let half = hd / 2;
            let f = (p as f32) / 10000f32.powf((d % half) as f32 / half as f32);
            if d < half {
                f.cos()
            } else {
                f.sin()
            }
        })
        .collect();
    let cos_sin = g
        .load_table(HostTensor::f32(vec![max_pos, hd], table))
        .unwrap();
    let layer_bytes = 2 * h * (qd + 2 * kvd + qd + 3 * s.inter);
    Model {
        embed,
        lm_head,
        norm: up(&ones(h)),
        cos_sin,
        layers,
        params: AttentionParams::causal(s.heads, s.kv_heads, hd),
        weight_bytes: s.layers * layer_bytes + 2 * s.vocab * h,
    }
}

/// The decode forward pass of `llama.rs`, on the backend's ops.
fn forward(
    g: &CudaBackend,
    m: &Model,
    caches: &mut [CudaKvCache],
    st: &CudaStep,
) -> pagoda_kernels::Result<CudaTensor> {
    let eps = 1e-6;
    let hd = m.params.head_dim;
    let mut x = g.embedding(st, &m.embed)?;
    let mut h = g.rms_norm(&x, &m.layers[0].in_norm, eps)?;
    for (i, (l, cache)) in m.layers.iter().zip(caches.iter_mut()).enumerate() {
        let [mut q, mut k, v] = g.linear3(&h, [&l.q, &l.k, &l.v], [None; 3])?;
        let norms = l.q_norm.as_ref().zip(l.k_norm.as_ref());
        g.qk_norm_rope_store_kv(
            &mut q,
            &mut k,
            &v,
            norms,
            eps,
            st,
            &m.cos_sin,
            hd,
            RopeStyle::Neox,
            cache,
        )?;
        let a = g.attention(&q, cache, st, &m.params)?;
        g.add_linear(&mut x, &a, &l.o, None)?;
        let hm = g.rms_norm(&x, &l.post_norm, eps)?;
        let act = g.gate_up_silu(&hm, &l.gate_up)?;
        g.add_linear(&mut x, &act, &l.down, None)?;
        let next = m.layers.get(i + 1).map_or(&m.norm, |l| &l.in_norm);
        h = g.rms_norm(&x, next, eps)?;
    }
    let last = g.gather_logits_rows(&h, st)?;
    g.linear(&last, m.lm_head.as_ref().unwrap_or(&m.embed), None)
}

fn bench_shape(s: &Shape) {
    let Some(g) = gpu() else { return };
    let m = model(&g, s);
    let floor = m.weight_bytes as f64 / 4.8e12;
    eprintln!(
        "bench: decode {}: {} layers, {:.2} GB of weights a step, floor {:.3} ms at 4.8 TB/s",
        s.name,
        s.layers,
        m.weight_bytes as f64 / 1e9,
        floor * 1e3
    );
    let mut rng = Rng::new(6);
    for batch in [1usize, 8] {
        let seqs = vec![
            SeqSpec {
                context_len: CONTEXT - 1,
                query_len: 1
            };
            batch
        ];
        let blocks = batch * CONTEXT.div_ceil(BLOCK) + 1;
        let mut step = paged_step(&mut rng, &seqs, BLOCK, blocks, 0);
        step.ctx.sampling = vec![SamplingRow::GREEDY; batch];
        let ctx = step.ctx;
        let shape = KvCacheShape {
            num_blocks: blocks,
            block_size: BLOCK,
            num_kv_heads: s.kv_heads,
            head_dim: s.head_dim,
        };
        let mut caches: Vec<_> = (0..s.layers)
            .map(|_| g.alloc_kv_cache(shape).unwrap())
            .collect();
        let configs = [
            SmallLinear::Auto,
            SmallLinear::Warp,
            SmallLinear::Mma,
            SmallLinear::Cublas,
        ];
        for path in configs {
            for fused in [true, false] {
                g.set_small_linear(path);
                g.set_decode_fusion(fused);
                // Eager first: warms the pool and the GEMM plans.
                let st = g.begin_step(&ctx).unwrap();
                let eager = median_secs(&g, 5, || {
                    let logits = forward(&g, &m, &mut caches, &st).unwrap();
                    g.sample(&logits, &st).unwrap();
                });
                let st = g.begin_step(&ctx).unwrap();
                let mut graph = g
                    .capture_graph(st, &mut |st| forward(&g, &m, &mut caches, st))
                    .unwrap();
                for _ in 0..3 {
                    g.replay_graph(&mut graph, &ctx).unwrap();
                }
                let mut v: Vec<f64> = (0..50)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        g.replay_graph(&mut graph, &ctx).unwrap();
                        t.elapsed().as_secs_f64()
                    })
                    .collect();
                v.sort_by(f64::total_cmp);
                let secs = v[v.len() / 2];
                eprintln!(
                    "bench: decode {} batch {batch} small-linear {:6} fusion {:3}: \
                     graph {:.3} ms/step ({:.1} us/layer, {:.2}x the floor), eager {:.3} ms",
                    s.name,
                    format!("{path:?}").to_lowercase(),
                    if fused { "on" } else { "off" },
                    secs * 1e3,
                    secs * 1e6 / s.layers as f64,
                    secs / floor,
                    eager * 1e3,
                );
            }
        }
    }
    g.set_small_linear(SmallLinear::from_env().unwrap());
    g.set_decode_fusion(true);
}

#[test]
#[ignore]
fn decode_step_qwen3_0_6b() {
    bench_shape(&QWEN3_0_6B);
}

#[test]
#[ignore]
fn decode_step_llama_8b() {
    bench_shape(&LLAMA_8B);
}
