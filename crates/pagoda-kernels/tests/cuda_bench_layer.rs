//! Timings of one decoder layer's ops at the Llama-3.1-8B shape on the GPU
//! host (ignored by default; run with `--ignored --nocapture`): each GEMM
//! of the layer (`linear` for qkv and gate_up, `add_linear` into the f32
//! residual for o_proj and down) at 8,192, 256, 64 and 1 rows, with its
//! TFLOP/s and weight-read GB/s; the elementwise ops of an 8,192-token
//! step (add_rms_norm, rope, silu_mul, store_kv) with the bytes they move;
//! prefill attention over 8,192 tokens of 1,024-token prompts, and decode
//! attention at batch 256 with 1,000-token contexts (the KV read that
//! dominates a decode step). What a step of the nano-vllm workload spends,
//! op by op. The KV cache's element type comes from
//! `PAGODA_KV_CACHE_DTYPE` (auto, bf16 or fp8; default auto), so
//! scripts/gpu/fp8kv-bench.sh compares the caches. Medians of
//! timed repeats (host clock around a device synchronization, after a
//! warm-up), random inputs.
//!
//! Prefill attention is timed on both kernels, the grouped one (default)
//! and the tiled one, over the cache dtype asked for, and the two outputs
//! must agree (relative L2 error
//! below 1e-2; the tiled kernel is checked against the CPU backend by the
//! cuda_attention_prefill tests), so one run says whether the default
//! kernel is right and how fast each is. `prefill_attention_timings` runs
//! only that part, at the Llama-3.1-8B shape and at head_dim 64 and 256.
#![cfg(feature = "cuda")]

mod common;

#[allow(dead_code)]
const PORTABLE: bool = false;

use common::*;
use pagoda_kernels::cuda::testing::{gpu, rel_err_l2};
use pagoda_kernels::cuda::{AttentionKernel, CudaBackend, CudaKvCache, CudaStep, CudaTensor};
use pagoda_kernels::{
    AttentionParams, Backend, ForwardContext, HostData, HostTensor, KvCacheDtype, KvCacheShape,
    RopeStyle,
};

/// Median seconds of `reps` timed runs of `f`.
fn time(g: &CudaBackend, reps: usize, f: impl FnMut()) -> f64 {
    pagoda_kernels::cuda::testing::median_secs(g, reps, f)
}

fn weight(rng: &mut Rng, rows: usize, cols: usize) -> HostTensor {
    HostTensor {
        shape: vec![rows, cols],
        data: HostData::F32(rvec_f32(rng, rows * cols, 0.02)),
    }
}

/// The KV cache element type of the timings: `PAGODA_KV_CACHE_DTYPE`
/// (auto, bf16 or fp8; default auto).
fn env_kv_dtype() -> KvCacheDtype {
    std::env::var("PAGODA_KV_CACHE_DTYPE")
        .unwrap_or_else(|_| "auto".into())
        .parse()
        .expect("PAGODA_KV_CACHE_DTYPE")
}

#[test]
#[ignore]
fn layer_timings_llama_8b() {
    let Some(g) = gpu() else { return };
    let dtype = env_kv_dtype();
    let g = g.with_kv_cache_dtype(dtype).unwrap();
    eprintln!("bench: 8b KV cache dtype {dtype}");
    let mut rng = Rng::new(3);
    let (hidden, inter, heads, kv_heads, hd) = (4096usize, 14336usize, 32usize, 8usize, 128usize);
    let qkv_out = (heads + 2 * kv_heads) * hd;
    // (name, out, in, adds into the residual)
    let gemms = [
        ("qkv", qkv_out, hidden, false),
        ("o_proj", hidden, heads * hd, true),
        ("gate_up", 2 * inter, hidden, false),
        ("down", hidden, inter, true),
    ];
    let ws: Vec<_> = gemms
        .iter()
        .map(|&(_, out, inn, _)| g.load_weight(weight(&mut rng, out, inn)).unwrap())
        .collect();
    for rows in [8192usize, 256, 64, 1] {
        let mut total = 0.0;
        for (i, &(name, out, inn, adds)) in gemms.iter().enumerate() {
            let x = g
                .tensor_from_host(rows, inn, &rvec_f32(&mut rng, rows * inn, 1.0))
                .unwrap();
            let reps = if rows >= 4096 { 10 } else { 50 };
            let secs = if adds {
                let mut r = g
                    .residual_from_host(rows, out, &vec![0.0; rows * out])
                    .unwrap();
                time(&g, reps, || g.add_linear(&mut r, &x, &ws[i], None).unwrap())
            } else {
                time(&g, reps, || {
                    let _ = g.linear(&x, &ws[i], None).unwrap();
                })
            };
            total += secs;
            let flops = 2.0 * rows as f64 * out as f64 * inn as f64;
            let wbytes = 2.0 * out as f64 * inn as f64;
            eprintln!(
                "bench: 8b {name:8} rows {rows:5}: {:.3} ms, {:.0} TFLOP/s, weights {:.0} GB/s{}",
                secs * 1e3,
                flops / secs / 1e12,
                wbytes / secs / 1e9,
                if adds {
                    " (add_linear, f32 residual)"
                } else {
                    ""
                }
            );
        }
        eprintln!("bench: 8b layer GEMMs rows {rows:5}: {:.3} ms", total * 1e3);
    }

    // Elementwise ops of an 8,192-token prefill step.
    let t = 8192usize;
    let norm_w = g
        .load_weight(HostTensor {
            shape: vec![hidden],
            data: HostData::F32(vec![1.0; hidden]),
        })
        .unwrap();
    let x = g
        .tensor_from_host(t, hidden, &rvec_f32(&mut rng, t * hidden, 1.0))
        .unwrap();
    let mut res = g
        .residual_from_host(t, hidden, &rvec_f32(&mut rng, t * hidden, 1.0))
        .unwrap();
    let secs = time(&g, 20, || {
        let _ = g.add_rms_norm(&mut res, &x, &norm_w, 1e-5).unwrap();
    });
    let bytes = t as f64 * hidden as f64 * (4.0 * 2.0 + 2.0 + 2.0);
    eprintln!(
        "bench: 8b add_rms_norm {t} rows: {:.3} ms, {:.0} GB/s",
        secs * 1e3,
        bytes / secs / 1e9
    );
    let gu = g
        .tensor_from_host(t, 2 * inter, &rvec_f32(&mut rng, t * 2 * inter, 1.0))
        .unwrap();
    let secs = time(&g, 20, || {
        let _ = g.silu_mul(&gu).unwrap();
    });
    let bytes = t as f64 * inter as f64 * 2.0 * 3.0;
    eprintln!(
        "bench: 8b silu_mul {t} rows: {:.3} ms, {:.0} GB/s",
        secs * 1e3,
        bytes / secs / 1e9
    );

    // Prefill attention and the ops that read the step: 8 prompts of 1,024.
    let seqs = vec![
        SeqSpec {
            context_len: 0,
            query_len: 1024
        };
        8
    ];
    let block = 16;
    let blocks = t / block + 16;
    let step = paged_step(&mut rng, &seqs, block, blocks, 0);
    let s = g.begin_step(&step.ctx).unwrap();
    let shape = KvCacheShape {
        num_blocks: blocks,
        block_size: block,
        num_kv_heads: kv_heads,
        head_dim: hd,
    };
    let mut cache = g.alloc_kv_cache(shape).unwrap();
    let table: Vec<f32> = (0..4096 * hd)
        .map(|i| {
            let (p, d) = (i / hd, i % hd);
            let half = hd / 2;
            let f = (p as f32) / 500000f32.powf((d % half) as f32 / half as f32);
            if d < half {
                f.cos()
            } else {
                f.sin()
            }
        })
        .collect();
    let cos_sin = g
        .load_table(HostTensor {
            shape: vec![4096, hd],
            data: HostData::F32(table),
        })
        .unwrap();
    let mut q = g
        .tensor_from_host(t, heads * hd, &rvec_f32(&mut rng, t * heads * hd, 1.0))
        .unwrap();
    let k = g
        .tensor_from_host(
            t,
            kv_heads * hd,
            &rvec_f32(&mut rng, t * kv_heads * hd, 1.0),
        )
        .unwrap();
    let v = g
        .tensor_from_host(
            t,
            kv_heads * hd,
            &rvec_f32(&mut rng, t * kv_heads * hd, 1.0),
        )
        .unwrap();
    let secs = time(&g, 20, || {
        g.rope(&mut q, &s, &cos_sin, hd, RopeStyle::Neox).unwrap();
    });
    eprintln!(
        "bench: 8b rope q {t} rows: {:.3} ms, {:.0} GB/s",
        secs * 1e3,
        (t * heads * hd * 4) as f64 / secs / 1e9
    );
    let secs = time(&g, 20, || g.store_kv(&k, &v, &mut cache, &s).unwrap());
    eprintln!(
        "bench: 8b store_kv {t} rows: {:.3} ms, {:.0} GB/s",
        secs * 1e3,
        (t * kv_heads * hd * 2 * 4) as f64 / secs / 1e9
    );
    let params = AttentionParams::causal(heads, kv_heads, hd);
    // Both kernels read either cache (the grouped one is the default).
    let label = format!("8b prefill attention 8 x 1024 tokens ({dtype} cache)");
    prefill_kernels(&g, &q, &cache, &s, &step.ctx, &params, &label);

    // Decode attention: 256 sequences of 1,000 cached tokens, one query each.
    let (batch, ctx_len) = (256usize, 1000usize);
    let seqs = vec![
        SeqSpec {
            context_len: ctx_len - 1,
            query_len: 1
        };
        batch
    ];
    let blocks = batch * ctx_len.div_ceil(block) + 1;
    let step = paged_step(&mut rng, &seqs, block, blocks, 0);
    let shape = KvCacheShape {
        num_blocks: blocks,
        ..shape
    };
    let mut cache = g.alloc_kv_cache(shape).unwrap();
    // Every slot random (8,192 slots per store).
    let chunk = 8192usize;
    let (k, v) = (
        rvec_f32(&mut rng, chunk * kv_heads * hd, 1.0),
        rvec_f32(&mut rng, chunk * kv_heads * hd, 1.0),
    );
    let mut fill = paged_step(
        &mut rng,
        &[SeqSpec {
            context_len: 0,
            query_len: chunk,
        }],
        block,
        chunk / block,
        0,
    )
    .ctx;
    for lo in (0..blocks * block).step_by(chunk) {
        for (i, sl) in fill.slot_mapping.iter_mut().enumerate() {
            *sl = if lo + i < blocks * block {
                (lo + i) as i64
            } else {
                -1
            };
        }
        store_step_kv(&g, &mut cache, &fill, &k, &v);
    }
    let q = g
        .tensor_from_host(
            batch,
            heads * hd,
            &rvec_f32(&mut rng, batch * heads * hd, 1.0),
        )
        .unwrap();
    let s = g.begin_step(&step.ctx).unwrap();
    let secs = time(&g, 20, || {
        let _ = g.attention(&q, &cache, &s, &params).unwrap();
    });
    let kv_bytes = g.kv_cache_bytes(KvCacheShape {
        num_blocks: 1,
        block_size: 1,
        ..shape
    }) * batch
        * ctx_len;
    eprintln!(
        "bench: 8b decode attention batch {batch} x {ctx_len} tokens ({dtype} cache): {:.3} ms \
         per layer, {:.2} ms per 32 layers, {:.0} GB/s of KV",
        secs * 1e3,
        secs * 32.0 * 1e3,
        kv_bytes as f64 / secs / 1e9
    );
}

/// Causal attention FLOPs of a step of `(context, query)` prompt chunks:
/// QK^T and PV over the keys each query sees.
fn causal_flops(seqs: &[SeqSpec], p: &AttentionParams) -> f64 {
    let pairs: f64 = seqs
        .iter()
        .map(|q| {
            (0..q.query_len)
                .map(|j| {
                    let keys = q.context_len + j + 1;
                    p.window.map_or(keys, |w| keys.min(w)) as f64
                })
                .sum::<f64>()
        })
        .sum();
    4.0 * p.num_heads as f64 * p.head_dim as f64 * pairs
}

/// Times prefill attention on the grouped and the tiled kernel and checks
/// that their outputs agree; prints both timings with TFLOP/s (causal FLOPs,
/// see [`causal_flops`]).
fn prefill_kernels(
    g: &CudaBackend,
    q: &CudaTensor,
    cache: &CudaKvCache,
    s: &CudaStep,
    ctx: &ForwardContext,
    p: &AttentionParams,
    label: &str,
) {
    let seqs: Vec<SeqSpec> = (0..ctx.num_seqs())
        .map(|i| SeqSpec {
            context_len: ctx.context_lens[i] as usize,
            query_len: ctx.query_len(i),
        })
        .collect();
    let flops = causal_flops(&seqs, p);
    let mut outs = Vec::new();
    for (tiled, kernel) in [
        (false, AttentionKernel::MmaPrefill),
        (true, AttentionKernel::TiledPrefill),
    ] {
        g.force_tiled_prefill(tiled);
        assert_eq!(g.attention_kernel_for(ctx, p), kernel, "{label}");
        let secs = time(g, 10, || {
            let _ = g.attention(q, cache, s, p).unwrap();
        });
        eprintln!(
            "bench: {label} {kernel:?}: {:.3} ms, {:.0} TFLOP/s",
            secs * 1e3,
            flops / secs / 1e12
        );
        outs.push(
            g.tensor_to_host(&g.attention(q, cache, s, p).unwrap())
                .unwrap(),
        );
    }
    g.force_tiled_prefill(false);
    assert!(
        outs[0].iter().all(|x| x.is_finite()),
        "{label}: non-finite output of the grouped kernel"
    );
    let e = rel_err_l2(&outs[0], &outs[1]);
    eprintln!("bench: {label}: grouped vs tiled relative L2 error {e:.2e}");
    assert!(
        e < 1e-2,
        "{label}: grouped and tiled kernels disagree ({e:.3e})"
    );
}

/// Prefill attention alone on both kernels: the Llama-3.1-8B shape (8
/// prompts of 1,024, 32 heads over 8, head_dim 128), a 2,048-token chunk
/// after a 6,000-token prefix at that shape, head_dim 64 (32 heads over 8),
/// and Gemma 2 9B's head_dim 256 (16 over 8, window 4,096, soft-cap 50).
#[test]
#[ignore]
fn prefill_attention_timings() {
    let Some(g) = gpu() else { return };
    let dtype = env_kv_dtype();
    let g = g.with_kv_cache_dtype(dtype).unwrap();
    let mut rng = Rng::new(4);
    let s = |context_len, query_len| SeqSpec {
        context_len,
        query_len,
    };
    for (label, seqs, (heads, kv_heads, hd), window, softcap) in [
        (
            "8b prefill attention 8 x 1024 tokens",
            vec![s(0, 1024); 8],
            (32, 8, 128),
            None,
            None,
        ),
        (
            "8b prefill chunk 2048 after 6000",
            vec![s(6000, 2048)],
            (32, 8, 128),
            None,
            None,
        ),
        (
            "hd64 prefill attention 8 x 1024 tokens",
            vec![s(0, 1024); 8],
            (32, 8, 64),
            None,
            None,
        ),
        (
            "gemma2-9b prefill attention 4 x 2048 tokens",
            vec![s(0, 2048); 4],
            (16, 8, 256),
            Some(4096),
            Some(50.0),
        ),
    ] {
        let block = 16;
        let tokens: usize = seqs.iter().map(|q| q.context_len + q.query_len).sum();
        let blocks = tokens / block + seqs.len() + 1;
        let step = paged_step(&mut rng, &seqs, block, blocks, 0);
        let shape = KvCacheShape {
            num_blocks: blocks,
            block_size: block,
            num_kv_heads: kv_heads,
            head_dim: hd,
        };
        let mut cache = g.alloc_kv_cache(shape).unwrap();
        // The cached prefixes, then the step's own K/V.
        let pre = prefix_step(&step, &seqs);
        let width = kv_heads * hd;
        for ctx in [&pre, &step.ctx] {
            let n = ctx.num_tokens() * width;
            let (k, v) = (rvec_f32(&mut rng, n, 1.0), rvec_f32(&mut rng, n, 1.0));
            store_step_kv(&g, &mut cache, ctx, &k, &v);
        }
        let t = step.ctx.num_tokens();
        let q = g
            .tensor_from_host(t, heads * hd, &rvec_f32(&mut rng, t * heads * hd, 1.0))
            .unwrap();
        let st = g.begin_step(&step.ctx).unwrap();
        let p = AttentionParams {
            window,
            softcap,
            ..AttentionParams::causal(heads, kv_heads, hd)
        };
        let label = format!("{label} ({dtype} cache)");
        prefill_kernels(&g, &q, &cache, &st, &step.ctx, &p, &label);
    }
}
