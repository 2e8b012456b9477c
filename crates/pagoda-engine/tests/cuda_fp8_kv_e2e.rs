//! Whole tiny models with an FP8 KV cache on CUDA against the CPU backend's
//! FP8 cache (the same bf16-rounded weights, the cache through `fp8.rs`):
//! the CPU decodes each golden prompt greedily, the GPU runs all prompts
//! batched (one prefill step, then decode steps) fed the CPU's tokens;
//! every step's logits agree within the bf16 tolerance of these models
//! ([`TOL`], relative L2, as for the bf16 cache in cuda_e2e) and the greedy
//! token agrees wherever the CPU's top-1 margin exceeds it. Then the same
//! with per-layer scales other than 1, with prefill on the tiled kernel
//! (the fallback; the grouped one is the default), and the GPU's FP8 logits
//! against its own bf16-cache logits (the cache's error, bounded by
//! [`FP8_VS_BF16`]).
//!
//! Without a CUDA device every test prints a notice and passes (fails where
//! PAGODA_REQUIRE_GPU=1 says a GPU must be present).
#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::*;
use pagoda_kernels::cpu::{CpuBackend, CpuOptions, WeightDtype};
use pagoda_kernels::KvCacheDtype;

const NEW_TOKENS: usize = 12;
/// Three times cuda_e2e's bf16 tolerance of the tiny dummy-weight models:
/// an FP8 cache turns the small bf16-vs-f32 differences of K and V into
/// whole-code flips (one E4M3 step is 6-12% of a value), which these
/// chaotic random models amplify (measured on an H200: up to 0.10).
const TOL: f32 = 0.12;
/// How far the FP8 cache may move the GPU's logits from its bf16 cache
/// (measured: 0.10 on tiny Llama, 0.13 on tiny Gemma 2, whose CPU FP8 cache
/// is 0.17 from transformers' f32, see golden_tiny).
const FP8_VS_BF16: f32 = 0.16;

fn cpu_fp8() -> CpuBackend {
    CpuBackend::new(CpuOptions {
        threads: 2,
        weight_dtype: WeightDtype::BF16,
    })
    .unwrap()
    .with_kv_cache_dtype(KvCacheDtype::Fp8)
    .unwrap()
}

#[test]
fn tiny_models_with_an_fp8_cache_on_cuda_match_the_cpu() {
    let mut failures = Vec::new();
    // (arch, scales, prefill on the tiled kernel instead of the grouped one)
    for (arch, scales, tiled) in [
        ("llama", None, false),
        ("qwen3", None, false),
        ("gemma2", None, false),
        ("llama", Some((0.05f32, 0.02f32)), false),
        ("qwen2", Some((2.0, 0.5)), false),
        ("qwen3", None, true),
        ("gemma2", Some((0.5, 0.25)), true),
    ] {
        let Some(dev) = gpu() else { return };
        let dev = dev.with_kv_cache_dtype(KvCacheDtype::Fp8).unwrap();
        dev.force_tiled_prefill(tiled);
        let Some(bf16_dev) = gpu() else { return };
        let TinyGolden {
            cfg,
            src,
            prompts,
            blocks,
        } = tiny_golden(arch, NEW_TOKENS);
        let layers = cfg.num_hidden_layers;
        let set = |r: &mut pagoda_engine::ModelRunner<_>| {
            if let Some(s) = scales {
                r.set_kv_scales(vec![s; layers]).unwrap();
            }
        };

        // The CPU reference: each prompt alone, greedy.
        let mut cpu_runner = runner(cpu_fp8(), &cfg, &src, blocks);
        if let Some(s) = scales {
            cpu_runner.set_kv_scales(vec![s; layers]).unwrap();
        }
        let want = greedy_reference(&mut cpu_runner, &prompts, NEW_TOKENS);
        let (want_tokens, want_logits, forced) = (&want.tokens, &want.logits, &want.forced);
        // The GPU with the FP8 cache, and with its bf16 cache.
        let mut gpu_runner = runner(dev, &cfg, &src, blocks);
        assert!(gpu_runner.kv_cache_fp8());
        set(&mut gpu_runner);
        let got = forced_trace(&mut gpu_runner, &prompts, forced);
        let mut bf16_runner = runner(bf16_dev, &cfg, &src, blocks);
        let exact = forced_trace(&mut bf16_runner, &prompts, forced);

        let mut tally = Tally {
            near_tie_margin: TOL,
            ..Tally::default()
        };
        let mut worst_vs_bf16 = 0f32;
        for (i, p) in prompts.iter().enumerate() {
            for s in 0..NEW_TOKENS {
                let what = format!(
                    "tiny-{arch} scales {scales:?} tiled {tiled}, prompt {i} ({} tokens), step {s}",
                    p.len()
                );
                tally.check_logits(&what, &got[i][s], &want_logits[i][s], TOL);
                let margin = rel_margin(&want_logits[i][s]);
                tally.check_token(&what, &got[i][s], want_tokens[i][s], margin);
                worst_vs_bf16 = worst_vs_bf16.max(rel_err_l2(&got[i][s], &exact[i][s]));
            }
        }
        eprintln!(
            "tiny-{arch} FP8 cache (scales {scales:?}, tiled prefill {tiled}): max logits \
             error vs the CPU {:.3e}, vs the bf16 cache {worst_vs_bf16:.3e}",
            tally.max_rel_err
        );
        if worst_vs_bf16 >= FP8_VS_BF16 {
            failures.push(format!(
                "tiny-{arch} scales {scales:?} tiled {tiled}: FP8 vs bf16 cache {worst_vs_bf16:.3e}"
            ));
        }
        failures.extend(tally.failures);
    }
    assert!(
        failures.is_empty(),
        "FP8 KV cache on CUDA vs the CPU: {} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
