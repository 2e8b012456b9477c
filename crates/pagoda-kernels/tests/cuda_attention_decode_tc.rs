//! The split-K decode attention over FP8 and bf16 caches against the CPU
//! backend, above all the tensor-core FP8 kernel
//! (`paged_decode_attention_fp8_tc_hd*`, the default over an FP8 cache):
//! head_dim 64, 128 and 256; GQA groups 1, 2, 3 (masked), 4 and 8; cached
//! contexts of 0, 1, 14, 15, 510, 511, 512, 999, 1000 and 4099 tokens in
//! one batch (sequence lengths 1 .. 4100: one, two and nine partitions of
//! 512, and the edges of both); no window, a 33-token and a 700-token
//! window (one and two partitions of the window), soft-cap 30 alone and
//! with the 700-token window; FP8 scales of 1 and others (saturating
//! spreads included); block sizes 16, 5 and 32; a padding row. Every case
//! first asserts which partition kernel the backend runs, then runs with
//! the partition its shape gets and with each of 64, 128, 256 and 512
//! tokens (`CudaBackend::set_decode_partition`), each with the partitions
//! merged by the partition kernel's last block (below 512 tokens; 512-token
//! partitions always take the second launch) and by the second launch
//! (`CudaBackend::set_separate_decode_merge`), which must agree to 1e-3
//! (the runs reuse the backend's merge counters, so a counter left
//! non-zero would break the next run). Over an FP8
//! cache the CUDA-core kernel (`CudaBackend::force_core_decode`) runs the
//! same case too, and the two GPU outputs must agree closely. One test
//! feeds q values far outside f16's range (1e5 and 1e-6, with the scale
//! making up for them), which the tensor-core kernel's power-of-two
//! rescaling of q must absorb.
//!
//! Outputs are NaN-poisoned first, so every element must be written.
//! Tolerance: relative L2 error below 2e-2 per (row, head) against the CPU
//! (the GPU rounds the output to bf16 and, on tensor cores, the
//! probabilities to f16), below 1e-2 between the two GPU kernels.
//! Without a CUDA device every test prints a notice and passes (fails
//! where PAGODA_REQUIRE_GPU=1 says a GPU must be present).
#![cfg(feature = "cuda")]

mod common;

#[allow(dead_code)]
const PORTABLE: bool = false;

use common::*;
use pagoda_kernels::cpu::{CpuBackend, WeightDtype};
use pagoda_kernels::cuda::testing::{gpu_poisoned as gpu, rel_err_l2 as rel_err};
use pagoda_kernels::cuda::{AttentionKernel, CudaBackend};
use pagoda_kernels::{AttentionParams, Backend, KvCacheDtype, KvCacheShape};

/// Cached tokens before the step (sequence lengths one more).
const LENS: [usize; 10] = [0, 1, 14, 15, 510, 511, 512, 999, 1000, 4099];

struct Case {
    fp8: bool,
    heads: (usize, usize),
    head_dim: usize,
    block_size: usize,
    window: Option<usize>,
    softcap: Option<f32>,
    /// (k_scale, v_scale) of an FP8 cache.
    scales: (f32, f32),
    /// Spread of the stored K/V values.
    spread: f32,
    /// Range of q's entries, and the factor on the usual 1 / sqrt(head_dim).
    q_range: f32,
    scale_mul: f32,
}

fn backends(fp8: bool) -> Option<(CudaBackend, CpuBackend)> {
    // Auto: bf16 on the GPU, f32 on the CPU (the stored values are bf16).
    let dtype = if fp8 {
        KvCacheDtype::Fp8
    } else {
        KvCacheDtype::Auto
    };
    let g = gpu()?.with_kv_cache_dtype(dtype).unwrap();
    let cpu = backend(2, WeightDtype::F32)
        .with_kv_cache_dtype(dtype)
        .unwrap();
    Some((g, cpu))
}

/// Worst per-(row, head) relative error of `got` against `want` over the
/// first `rows` rows, with where it is.
fn worst(got: &[f32], want: &[f32], rows: usize, nh: usize, hd: usize) -> (f64, usize, usize) {
    let mut w = (0.0f64, 0, 0);
    for r in 0..rows {
        for h in 0..nh {
            let at = (r * nh + h) * hd;
            let e = rel_err(&got[at..at + hd], &want[at..at + hd]);
            if e > w.0 || e.is_nan() {
                w = (e, r, h);
            }
        }
    }
    w
}

fn run_case(g: &CudaBackend, cpu: &CpuBackend, rng: &mut Rng, c: &Case) {
    let ((nh, nkv), hd, bs) = (c.heads, c.head_dim, c.block_size);
    let what = format!(
        "{} cache heads {nh}/{nkv} hd {hd} bs {bs} window {:?} softcap {:?} scales {:?} \
         spread {} q_range {} scale x{}",
        if c.fp8 { "fp8" } else { "bf16" },
        c.window,
        c.softcap,
        c.scales,
        c.spread,
        c.q_range,
        c.scale_mul
    );
    let seqs: Vec<SeqSpec> = LENS.iter().map(|&l| s(l, 1)).collect();
    let needed: usize = seqs.iter().map(|q| (q.context_len + 1).div_ceil(bs)).sum();
    let shape = KvCacheShape {
        num_blocks: needed + 2,
        block_size: bs,
        num_kv_heads: nkv,
        head_dim: hd,
    };
    let mut gc = g.alloc_kv_cache(shape).unwrap();
    let mut cc = cpu.alloc_kv_cache(shape).unwrap();
    assert_eq!(gc.is_fp8(), c.fp8, "{what}");
    if c.fp8 {
        g.set_kv_scales(&mut gc, c.scales.0, c.scales.1).unwrap();
        cpu.set_kv_scales(&mut cc, c.scales.0, c.scales.1).unwrap();
    }
    let step = paged_step(rng, &seqs, bs, shape.num_blocks, 1);
    let p = AttentionParams {
        num_heads: nh,
        num_kv_heads: nkv,
        head_dim: hd,
        scale: c.scale_mul / (hd as f32).sqrt(),
        window: c.window,
        softcap: c.softcap,
        kv_group: 0,
    };
    assert_eq!(
        g.attention_kernel_for(&step.ctx, &p),
        AttentionKernel::SplitKDecode,
        "{what}"
    );
    let want_kernel = if c.fp8 {
        format!("paged_decode_attention_fp8_tc_hd{hd}")
    } else {
        let inst = (nh / nkv).next_power_of_two();
        format!("paged_decode_attention_bf16_hd{hd}_g{inst}")
    };
    assert_eq!(
        g.decode_kernel_for(&p),
        Some(want_kernel.as_str()),
        "{what}"
    );

    let width = nkv * hd;
    let pre = prefix_step(&step, &seqs);
    for ctx in [&pre, &step.ctx] {
        let n = ctx.num_tokens() * width;
        let (k, v) = (rvec(rng, n, c.spread), rvec(rng, n, c.spread));
        store_step_kv(g, &mut gc, ctx, &k, &v);
        store_step_kv(cpu, &mut cc, ctx, &k, &v);
    }

    let t = step.ctx.num_tokens();
    let q = rvec(rng, t * nh * hd, c.q_range);
    let gs = g.begin_step(&step.ctx).unwrap();
    let cs = cpu.begin_step(&step.ctx).unwrap();
    let gq = g.tensor_from_host(t, nh * hd, &q).unwrap();
    let want = cpu
        .attention(&cpu.tensor_from_host(t, nh * hd, &q).unwrap(), &cc, &cs, &p)
        .unwrap()
        .data()
        .to_vec();
    let rows = t - 1; // the padding row's output is unspecified
    let mut outs = Vec::new();
    let mut merged: Option<(String, Vec<f32>)> = None;
    for cores in if c.fp8 {
        vec![false, true]
    } else {
        vec![false]
    } {
        g.force_core_decode(cores);
        // The shape's own partition first, then every size the kernels take.
        for (part, separate) in [None, Some(64), Some(128), Some(256), Some(512)]
            .into_iter()
            .flat_map(|p| [(p, false), (p, true)])
        {
            g.set_decode_partition(part).unwrap();
            g.set_separate_decode_merge(separate);
            let kernel = g.decode_kernel_for(&p).unwrap_or("none");
            let kernel = format!(
                "{kernel}, partition {}, merged {}",
                g.decode_partition_for(&step.ctx, &p, t),
                if separate {
                    "apart"
                } else {
                    "in the last block"
                }
            );
            let out = g
                .attention(&gq, &gc, &gs, &p)
                .unwrap_or_else(|e| panic!("{what} ({kernel}): attention failed: {e}"));
            let got = g
                .tensor_to_host(&out)
                .unwrap_or_else(|e| panic!("{what} ({kernel}): kernel fault or download: {e}"));
            let w = nh * hd;
            if let Some(i) = got[..rows * w].iter().position(|x| !x.is_finite()) {
                panic!(
                    "{what} ({kernel}): output {i} = {} (row {} with context {}, head {}; \
                     unwritten?)",
                    got[i],
                    i / w,
                    LENS[i / w],
                    (i / hd) % nh
                );
            }
            let (e, r, h) = worst(&got, &want, rows, nh, hd);
            let at = (r * nh + h) * hd;
            assert!(
                e < 2e-2,
                "{what} ({kernel}): row {r} (context {}) head {h}: relative error {e:.3e}; \
                 got[..4] {:?} want[..4] {:?}",
                LENS[r],
                &got[at..at + 4],
                &want[at..at + 4]
            );
            if separate {
                let (fused_kernel, fused) = merged.take().expect("the fused run came first");
                let (e, r, h) = worst(&got, &fused, rows, nh, hd);
                assert!(
                    e < 1e-3,
                    "{what}: {fused_kernel} and {kernel} differ at row {r} (context {}) head \
                     {h}: relative error {e:.3e}",
                    LENS[r]
                );
            } else {
                merged = Some((kernel.clone(), got.clone()));
            }
            if part.is_none() && !separate {
                outs.push((kernel, got));
            }
        }
        g.set_decode_partition(None).unwrap();
        g.set_separate_decode_merge(false);
    }
    g.force_core_decode(false);
    if let [(ka, a), (kb, b)] = &outs[..] {
        let (e, r, h) = worst(a, b, rows, nh, hd);
        assert!(
            e < 1e-2,
            "{what}: {ka} and {kb} differ at row {r} (context {}) head {h}: relative \
             error {e:.3e}",
            LENS[r]
        );
    }
}

const VARIANTS: [(Option<usize>, Option<f32>); 5] = [
    (None, None),
    (Some(33), None),
    (Some(700), None),
    (None, Some(30.0)),
    (Some(700), Some(30.0)),
];
/// (num_heads, num_kv_heads): groups 1, 2, 3, 4 and 8.
const GQA: [(usize, usize); 5] = [(2, 2), (4, 2), (6, 2), (8, 2), (16, 2)];
const SCALES: [((f32, f32), f32); 3] =
    [((1.0, 1.0), 1.0), ((0.05, 0.3), 30.0), ((4.0, 0.5), 600.0)];

fn sweep(fp8: bool, seed: u64) {
    let Some((g, cpu)) = backends(fp8) else {
        return;
    };
    let mut rng = Rng::new(seed);
    let mut i = 0;
    for hd in [64, 128, 256] {
        for heads in GQA {
            for (window, softcap) in VARIANTS {
                let (scales, spread) = if fp8 {
                    SCALES[i % SCALES.len()]
                } else {
                    ((1.0, 1.0), 1.0)
                };
                let q_range = if softcap.is_some() { 6.0 } else { 2.0 } / spread.max(1.0);
                let c = Case {
                    fp8,
                    heads,
                    head_dim: hd,
                    block_size: [16, 5, 32][i % 3],
                    window,
                    softcap,
                    scales,
                    spread,
                    q_range,
                    scale_mul: 1.0,
                };
                run_case(&g, &cpu, &mut rng, &c);
                i += 1;
            }
        }
    }
}

#[test]
fn decode_over_an_fp8_cache_on_tensor_cores_matches_the_cpu() {
    sweep(true, 811);
}

#[test]
fn decode_over_a_bf16_cache_matches_the_cpu() {
    sweep(false, 812);
}

/// q entries of 1e5 (past f16's 65,504) and of 1e-6 (below its normal
/// range), the attention scale making up for them: the same scores as q of
/// about 2, so the result must match the CPU as closely as then.
#[test]
fn q_outside_the_f16_range_is_rescaled() {
    let Some((g, cpu)) = backends(true) else {
        return;
    };
    let mut rng = Rng::new(813);
    for hd in [64, 128, 256] {
        for (q_range, scale_mul) in [(1e5f32, 2e-5f32), (1e-6, 2e6)] {
            let c = Case {
                fp8: true,
                heads: (8, 2),
                head_dim: hd,
                block_size: 16,
                window: None,
                softcap: None,
                scales: (0.05, 0.3),
                spread: 30.0,
                q_range,
                scale_mul: scale_mul / 30.0,
            };
            run_case(&g, &cpu, &mut rng, &c);
        }
    }
}
