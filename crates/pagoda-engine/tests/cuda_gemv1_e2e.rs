//! The batch-1 GEMV path (`PAGODA_GEMV1`, `CudaBackend::set_gemv1`) end to
//! end: the tiny dense golden models of the Llama family (Llama, Llama with
//! attention biases, Qwen2 with q/k/v biases, Qwen3 with q/k norms; dummy
//! weights) decode each golden prompt alone (every decode step one row, so
//! every product takes the batch-1 kernels), teacher-forced on the CPU's
//! greedy tokens, with the batch-1 GEMV off, on and on with the norm fused
//! at every size (`all`). Every step's logits must agree with the CPU
//! backend holding the same bf16 weights within the models' bf16 tolerance
//! (as cuda_e2e holds the batched GPU run to), the greedy token wherever
//! the CPU's top-1 margin exceeds it, and each mode's logits must agree
//! with the old kernels' (off) within the same tolerance.
//!
//! Without a CUDA device or driver the test prints a notice and passes
//! (fails where PAGODA_REQUIRE_GPU=1 says a GPU must be present).
#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::*;
use pagoda_kernels::cpu::{CpuBackend, CpuOptions, WeightDtype};
use pagoda_kernels::cuda::Gemv1;

const NEW_TOKENS: usize = 12;

/// The bf16 tolerance of the tiny dummy-weight models (cuda_e2e's
/// `TINY_TOL`, which says where it comes from).
const TINY_TOL: f32 = 4e-2;

fn cpu() -> CpuBackend {
    CpuBackend::new(CpuOptions {
        threads: 2,
        weight_dtype: WeightDtype::BF16,
    })
    .unwrap()
}

#[test]
fn tiny_dense_models_at_batch_1_match_on_every_gemv1_mode() {
    let mut failures = Vec::new();
    for arch in ["llama", "llama-attnbias", "qwen2", "qwen3"] {
        let g = tiny_golden(arch, NEW_TOKENS);
        let mut cpu_runner = runner(cpu(), &g.cfg, &g.src, g.blocks);
        let want = greedy_reference(&mut cpu_runner, &g.prompts, NEW_TOKENS);
        // Per mode, per prompt, per step: the logits.
        let mut runs: Vec<Vec<Vec<Vec<f32>>>> = Vec::new();
        for mode in [Gemv1::Off, Gemv1::On, Gemv1::All] {
            let Some(dev) = gpu() else { return };
            dev.set_gemv1(mode);
            assert_eq!(dev.gemv1(), mode);
            let mut r = runner(dev, &g.cfg, &g.src, g.blocks);
            let got: Vec<Vec<Vec<f32>>> = g
                .prompts
                .iter()
                .zip(&want.forced)
                .map(|(p, f)| {
                    let t = forced_trace(&mut r, std::slice::from_ref(p), std::slice::from_ref(f));
                    t.into_iter().next().unwrap()
                })
                .collect();
            let mut tally = Tally {
                near_tie_margin: TINY_TOL,
                ..Tally::default()
            };
            for (i, p) in g.prompts.iter().enumerate() {
                for s in 0..NEW_TOKENS {
                    let what = format!(
                        "tiny-{arch} gemv1 {mode:?}, prompt {i} ({} tokens) alone, step {s}",
                        p.len()
                    );
                    tally.check_logits(&what, &got[i][s], &want.logits[i][s], TINY_TOL);
                    let margin = rel_margin(&want.logits[i][s]);
                    tally.check_token(&what, &got[i][s], want.tokens[i][s], margin);
                    if let Some(old) = runs.first() {
                        let e = rel_err_l2(&got[i][s], &old[i][s]);
                        if e.is_nan() || e >= TINY_TOL {
                            failures.push(format!("{what}: {e:.3e} from gemv1 off"));
                        }
                    }
                }
            }
            eprintln!(
                "tiny-{arch} at batch 1, gemv1 {mode:?}: {} steps, max logits relative error {:.3e} (L2; bar {TINY_TOL:.0e}), {} near-ties",
                tally.steps, tally.max_rel_err, tally.near_ties
            );
            failures.extend(tally.failures);
            runs.push(got);
        }
    }
    assert!(
        failures.is_empty(),
        "tiny models at batch 1 on CUDA: {} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
