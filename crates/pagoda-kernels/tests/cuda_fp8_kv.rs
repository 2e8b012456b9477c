//! The FP8 E4M3 KV cache on CUDA against the CPU backend's FP8 cache (the
//! reference, through `fp8.rs`):
//! - the device conversions (`f2fp8` / `fp82f`) against `fp8.rs` on all 256
//!   codes and on random and edge floats (midpoints between codes, ±448 and
//!   past it, infinities, NaN, subnormals, tiny values), bit for bit;
//! - `store_kv` (both the 8-wide and the scalar kernel) writes exactly the
//!   CPU's bytes, with unit and other scales (saturating ones included),
//!   and `copy_blocks` moves them unchanged;
//! - attention over the FP8 cache: the split-K decode, the grouped prefill
//!   (the default) and the tiled one (prompts, cached prefixes, chunks,
//!   decode tokens mixed in; a long prompt over many key tiles) and the
//!   general kernel (head_dim 96), with windows and soft-caps, head_dim
//!   64/128/256, GQA groups 1, 2, 3, 4 and 8, padding rows; each case first asserts
//!   which kernel takes it. Relative L2 error below 2e-2 per row (the K/V
//!   values are the same on both sides; the GPU rounds q, P and the
//!   output to bf16).
//!
//! Without a CUDA device every test prints a notice and passes (fails where
//! PAGODA_REQUIRE_GPU=1 says a GPU must be present).
#![cfg(feature = "cuda")]

mod common;

#[allow(dead_code)]
const PORTABLE: bool = false;

use common::*;
use pagoda_core::{BlockCopy, BlockId};
use pagoda_kernels::cpu::{CpuBackend, WeightDtype};
use pagoda_kernels::cuda::testing::{fp8_codec, gpu_poisoned as gpu, rel_err_l2 as rel_err};
use pagoda_kernels::cuda::{AttentionKernel, CudaBackend};
use pagoda_kernels::fp8::{e4m3_to_f32, f32_to_e4m3};
use pagoda_kernels::{AttentionParams, Backend, KvCacheDtype, KvCacheShape};

fn fp8_gpu() -> Option<CudaBackend> {
    Some(gpu()?.with_kv_cache_dtype(KvCacheDtype::Fp8).unwrap())
}

fn fp8_cpu() -> CpuBackend {
    backend(2, WeightDtype::F32)
        .with_kv_cache_dtype(KvCacheDtype::Fp8)
        .unwrap()
}

#[test]
fn device_conversions_match_fp8_rs_bit_for_bit() {
    let Some(g) = gpu() else { return };
    let codes: Vec<u8> = (0..=255).collect();
    let mut x: Vec<f32> = Vec::new();
    // Every code's value, the midpoints between neighbours (ties to even),
    // and points a quarter in from each side.
    for c in 0u8..0x7e {
        let (lo, hi) = (e4m3_to_f32(c), e4m3_to_f32(c + 1));
        for f in [0.0, 0.25, 0.5, 0.75] {
            let v = lo + (hi - lo) * f;
            x.extend([v, -v]);
        }
    }
    x.extend([
        448.0,
        -448.0,
        449.0,
        464.0,
        479.9,
        480.0,
        -500.0,
        1e9,
        -1e30,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        0.0,
        -0.0,
        1e-9,
        -1e-9,
        1.0 / 1024.0,
        3.0 / 1024.0,
        1.0 / 64.0 - 1.0 / 4096.0,
        f32::MIN_POSITIVE,
        1e-40,
    ]);
    let mut rng = Rng::new(88);
    for _ in 0..20_000 {
        // uniform() is in [-1, 1): magnitudes from 2^-25 to 2^15.
        let e = (rng.uniform() * 20.0 - 5.0).exp2();
        x.push(rng.uniform() * e);
    }
    let (enc, dec) = fp8_codec(&g, &x, &codes).unwrap();
    for (i, &v) in x.iter().enumerate() {
        let want = f32_to_e4m3(v);
        // NaN's sign is not part of the contract: both NaN codes are NaN.
        if v.is_nan() {
            assert_eq!(enc[i] & 0x7f, 0x7f, "encode NaN gave {:#x}", enc[i]);
        } else {
            assert_eq!(enc[i], want, "encode {v:e} ({:#x})", v.to_bits());
        }
    }
    // fp82f, then the four-at-a-time decoder of the attention kernels.
    assert_eq!(dec.len(), 2 * codes.len());
    for (which, got) in [("fp82f", &dec[..256]), ("fp8x4_to_f32", &dec[256..])] {
        for c in 0..=255u8 {
            let (got, want) = (got[c as usize], e4m3_to_f32(c));
            if want.is_nan() {
                assert!(got.is_nan(), "{which}: decode {c:#x} gave {got}");
            } else {
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{which}: decode {c:#x}: {got} vs {want}"
                );
            }
        }
    }
}

struct Case {
    seqs: Vec<SeqSpec>,
    heads: (usize, usize),
    head_dim: usize,
    block_size: usize,
    pad: usize,
    window: Option<usize>,
    softcap: Option<f32>,
    /// (k_scale, v_scale).
    scales: (f32, f32),
    /// Spread of the stored K/V values (past 448 * scale they saturate).
    spread: f32,
}

/// Stores the case on both backends (bytes compared exactly), copies a
/// block on both, attends on both and compares.
fn run_case(g: &CudaBackend, cpu: &CpuBackend, rng: &mut Rng, c: &Case, expect: AttentionKernel) {
    let what = format!(
        "seqs {:?} heads {:?} hd {} bs {} pad {} window {:?} softcap {:?} scales {:?}",
        c.seqs
            .iter()
            .map(|q| (q.context_len, q.query_len))
            .collect::<Vec<_>>(),
        c.heads,
        c.head_dim,
        c.block_size,
        c.pad,
        c.window,
        c.softcap,
        c.scales
    );
    let ((nh, nkv), hd, bs) = (c.heads, c.head_dim, c.block_size);
    let width = nkv * hd;
    let needed: usize = c
        .seqs
        .iter()
        .map(|q| (q.context_len + q.query_len).div_ceil(bs))
        .sum();
    let shape = KvCacheShape {
        num_blocks: needed + 3,
        block_size: bs,
        num_kv_heads: nkv,
        head_dim: hd,
    };
    let mut gc = g.alloc_kv_cache(shape).unwrap();
    let mut cc = cpu.alloc_kv_cache(shape).unwrap();
    assert!(gc.is_fp8() && cc.is_fp8());
    assert_eq!(g.kv_cache_bytes(shape), 2 * shape.elements());
    g.set_kv_scales(&mut gc, c.scales.0, c.scales.1).unwrap();
    cpu.set_kv_scales(&mut cc, c.scales.0, c.scales.1).unwrap();
    let step = paged_step(rng, &c.seqs, bs, shape.num_blocks, c.pad);
    let p = AttentionParams {
        num_heads: nh,
        num_kv_heads: nkv,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        window: c.window,
        softcap: c.softcap,
        kv_group: 0,
    };
    let kernel = g.attention_kernel_for(&step.ctx, &p);
    assert_eq!(kernel, expect, "{what}: attention takes {kernel:?}");

    // The cached prefixes, then the step's own K/V (padding rows: slot -1).
    let pre = prefix_step(&step, &c.seqs);
    for ctx in [&pre, &step.ctx] {
        let n = ctx.num_tokens() * width;
        let (k, v) = (rvec(rng, n, c.spread), rvec(rng, n, c.spread));
        store_step_kv(g, &mut gc, ctx, &k, &v);
        store_step_kv(cpu, &mut cc, ctx, &k, &v);
    }
    let (gk, gv) = g.kv_cache_bytes_to_host(&gc).unwrap();
    let (ck, cv) = cc.fp8_bytes().unwrap();
    let first_diff = |a: &[u8], b: &[u8]| a.iter().zip(b).position(|(x, y)| x != y);
    assert_eq!(first_diff(&gk, ck), None, "{what}: K bytes differ");
    assert_eq!(first_diff(&gv, cv), None, "{what}: V bytes differ");
    let (kf, _) = g.kv_cache_to_host(&gc).unwrap();
    assert_eq!(kf, &cc.k()[..], "{what}: dequantized K");

    // Copy-on-write of part of a block into the spare last block.
    let copy = [BlockCopy {
        src: BlockId(step.tables[0][0]),
        dst: BlockId((shape.num_blocks - 1) as u32),
        num_tokens: bs.min(c.seqs[0].context_len + c.seqs[0].query_len),
    }];
    g.copy_blocks(&mut gc, &copy).unwrap();
    cpu.copy_blocks(&mut cc, &copy).unwrap();
    let (gk, gv) = g.kv_cache_bytes_to_host(&gc).unwrap();
    let (ck, cv) = cc.fp8_bytes().unwrap();
    assert_eq!(first_diff(&gk, ck), None, "{what}: K bytes after copy");
    assert_eq!(first_diff(&gv, cv), None, "{what}: V bytes after copy");

    let t = step.ctx.num_tokens();
    let q = rvec(
        rng,
        t * nh * hd,
        if c.softcap.is_some() { 6.0 } else { 2.0 } / c.spread.max(1.0),
    );
    let gs = g.begin_step(&step.ctx).unwrap();
    let cs = cpu.begin_step(&step.ctx).unwrap();
    let go = g
        .attention(&g.tensor_from_host(t, nh * hd, &q).unwrap(), &gc, &gs, &p)
        .unwrap_or_else(|e| panic!("{what}: attention failed: {e}"));
    let co = cpu
        .attention(&cpu.tensor_from_host(t, nh * hd, &q).unwrap(), &cc, &cs, &p)
        .unwrap();
    let got = g.tensor_to_host(&go).unwrap();
    let want = co.data();
    let w = nh * hd;
    assert!(
        got.iter().all(|x| x.is_finite()),
        "{what} ({kernel:?}): non-finite outputs"
    );
    for r in 0..t - c.pad {
        let e = rel_err(&got[r * w..(r + 1) * w], &want[r * w..(r + 1) * w]);
        assert!(
            e < 2e-2,
            "{what} ({kernel:?}): row {r} relative error {e:.3e}; got[..4] {:?} want[..4] {:?}",
            &got[r * w..r * w + 4],
            &want[r * w..r * w + 4]
        );
    }
}

const SCALES: [((f32, f32), f32); 3] =
    [((1.0, 1.0), 1.0), ((0.05, 0.3), 30.0), ((4.0, 0.5), 600.0)];
const VARIANTS: [(Option<usize>, Option<f32>); 4] = [
    (None, None),
    (Some(33), None),
    (None, Some(30.0)),
    (Some(700), Some(50.0)),
];
const GQA: [(usize, usize); 6] = [(4, 4), (8, 2), (8, 1), (6, 2), (16, 2), (4, 2)];

#[test]
fn decode_over_an_fp8_cache_matches_the_cpu() {
    let Some(g) = fp8_gpu() else { return };
    let cpu = fp8_cpu();
    let mut rng = Rng::new(401);
    let mut i = 0;
    for hd in [64, 128, 256] {
        for (window, softcap) in VARIANTS {
            for (scales, spread) in SCALES {
                let lens = [0, 15, 16, 600, 1100, 2100];
                let c = Case {
                    seqs: lens.iter().map(|&l| s(l, 1)).collect(),
                    heads: GQA[i % GQA.len()],
                    head_dim: hd,
                    block_size: [16, 5, 32][i % 3],
                    pad: i % 3,
                    window,
                    softcap,
                    scales,
                    spread,
                };
                run_case(&g, &cpu, &mut rng, &c, AttentionKernel::SplitKDecode);
                i += 1;
            }
        }
    }
}

#[test]
fn prefill_and_chunks_over_an_fp8_cache_match_the_cpu() {
    let Some(g) = fp8_gpu() else { return };
    let cpu = fp8_cpu();
    let mut rng = Rng::new(402);
    let mut i = 0;
    for hd in [64, 128, 256] {
        for (window, softcap) in VARIANTS {
            for (scales, spread) in SCALES {
                // A prompt, a decode token, chunks after cached prefixes.
                let c = Case {
                    seqs: vec![s(0, 70), s(40, 1), s(129, 100), s(1500, 65)],
                    heads: GQA[i % GQA.len()],
                    head_dim: hd,
                    block_size: [16, 3, 32][i % 3],
                    pad: if i % 4 == 3 { 2 } else { 0 },
                    window,
                    softcap,
                    scales,
                    spread,
                };
                // The grouped kernel (the default), then the tiled one.
                for (tiled, kernel) in [
                    (false, AttentionKernel::MmaPrefill),
                    (true, AttentionKernel::TiledPrefill),
                ] {
                    g.force_tiled_prefill(tiled);
                    run_case(&g, &cpu, &mut rng, &c, kernel);
                }
                g.force_tiled_prefill(false);
                i += 1;
            }
        }
    }
}

/// A long prompt and a long chunk after a cached prefix on the grouped
/// kernel: many key tiles through both raw-byte stages, the causal diagonal
/// in many blocks, windows whose edge falls inside a tile; the step's two
/// leading decodes go to the split-K kernel within the same call.
#[test]
fn long_prefill_over_an_fp8_cache_matches_the_cpu() {
    let Some(g) = fp8_gpu() else { return };
    let cpu = fp8_cpu();
    let mut rng = Rng::new(404);
    for (k, hd) in [64, 128, 256].into_iter().enumerate() {
        for (window, softcap) in [(None, None), (Some(300), Some(30.0))] {
            let (scales, spread) = SCALES[k % SCALES.len()];
            let c = Case {
                seqs: vec![s(50, 1), s(2000, 1), s(0, 700), s(900, 333)],
                heads: [(32, 8), (8, 1), (16, 8)][k],
                head_dim: hd,
                block_size: 16,
                pad: 0,
                window,
                softcap,
                scales,
                spread,
            };
            run_case(&g, &cpu, &mut rng, &c, AttentionKernel::MmaPrefill);
        }
    }
}

/// head_dim 96 and decode groups past 8 take the general kernel.
#[test]
fn the_general_kernel_over_an_fp8_cache_matches_the_cpu() {
    let Some(g) = fp8_gpu() else { return };
    let cpu = fp8_cpu();
    let mut rng = Rng::new(403);
    for (k, (window, softcap)) in VARIANTS.into_iter().enumerate() {
        let (scales, spread) = SCALES[k % SCALES.len()];
        for (heads, hd, seqs) in [
            ((8, 2), 96, vec![s(0, 40), s(300, 1), s(77, 20)]),
            ((8, 2), 96, vec![s(300, 1), s(5, 1)]),
            ((32, 2), 128, vec![s(900, 1), s(0, 1)]),
        ] {
            let c = Case {
                seqs,
                heads,
                head_dim: hd,
                block_size: 16,
                pad: 1,
                window,
                softcap,
                scales,
                spread,
            };
            run_case(&g, &cpu, &mut rng, &c, AttentionKernel::General);
        }
    }
}

/// Scales live in a device buffer: changing them needs no new launch
/// arguments, and a bf16 cache refuses scales other than 1.
#[test]
fn scales_change_in_place_and_bf16_caches_refuse_them() {
    let Some(g) = gpu() else { return };
    let shape = KvCacheShape {
        num_blocks: 2,
        block_size: 16,
        num_kv_heads: 1,
        head_dim: 64,
    };
    let mut bc = g.alloc_kv_cache(shape).unwrap();
    assert!(!bc.is_fp8());
    assert_eq!(g.kv_cache_bytes(shape), 4 * shape.elements());
    assert!(g.set_kv_scales(&mut bc, 1.0, 1.0).is_ok());
    assert!(g.set_kv_scales(&mut bc, 0.5, 1.0).is_err());
    let g = g.with_kv_cache_dtype(KvCacheDtype::Fp8).unwrap();
    let mut fc = g.alloc_kv_cache(shape).unwrap();
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert!(g.set_kv_scales(&mut fc, bad, 1.0).is_err());
    }
    let ctx = paged_step(&mut Rng::new(9), &[s(0, 4)], 16, 2, 0).ctx;
    let k = vec![1.0f32; 4 * 64];
    g.set_kv_scales(&mut fc, 0.5, 2.0).unwrap();
    store_step_kv(&g, &mut fc, &ctx, &k, &k);
    g.set_kv_scales(&mut fc, 1.0, 1.0).unwrap();
    let (kb, vb) = g.kv_cache_bytes_to_host(&fc).unwrap();
    let slot = ctx.slot_mapping[0] as usize * 64;
    assert_eq!(kb[slot], f32_to_e4m3(2.0));
    assert_eq!(vb[slot], f32_to_e4m3(0.5));
}
