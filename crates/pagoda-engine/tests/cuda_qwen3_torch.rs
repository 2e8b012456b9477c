//! A Qwen3-shaped model on the CUDA backend against PyTorch, and against
//! pagoda's CPU backend, on the same weights.
//!
//! scripts/gpu/make_qwen3.py builds a random Qwen3 with transformers (Qwen3-0.6B's
//! shape, transformers' own initialization, fixed seed), saves it
//! (bf16 safetensors) and writes reference.json: for 8 prompts, the last prompt
//! position's logits and 16 greedy tokens with each step's top-1 margin, all
//! computed in f32 from the saved bf16 weights, plus PyTorch's own bf16 error
//! as a yardstick. This test loads the saved directory through `open_model`,
//! prefills all prompts in one step and feeds PyTorch's tokens back batched,
//! on both backends:
//! - CUDA vs PyTorch: prompt logits within [`TOL`] (relative, L2), and every
//!   greedy token equal wherever PyTorch's relative top-1 margin exceeds
//!   [`TOL`] (near-ties are printed with their margin);
//! - CPU (f32 weights holding the same bf16 values) vs PyTorch: prompt logits
//!   within [`CPU_TOL`] and every greedy token equal outside near-ties;
//! - CUDA vs CPU: the logits of every step (prompt and 16 decode steps) within
//!   [`TOL`], and the greedy token equal wherever the CPU's margin exceeds it.
//!
//! All failures are listed together. The model directory is
//! $PAGODA_QWEN3_DIR (default /tmp/qwen3-small); when it is missing the test
//! prints a notice and passes; without CUDA only the CPU comparison runs.
#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::*;
use pagoda_kernels::cpu::{CpuBackend, CpuOptions, WeightDtype};
use pagoda_model::open::{open_model, OpenOptions};
use std::path::PathBuf;

/// CPU (f32 arithmetic) against PyTorch's f32: only summation order differs.
const CPU_TOL: f32 = 1e-3;

/// PyTorch's reference: prompts, forced tokens, prompt logits and margins.
struct Reference {
    device: String,
    bf16_errors: String,
    prompts: Vec<Vec<u32>>,
    outputs: Vec<Vec<u32>>,
    prompt_logits: Vec<Vec<f32>>,
    margins: Vec<Vec<f32>>,
}

impl Reference {
    fn load(path: &std::path::Path) -> Reference {
        let golden: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let entries = golden["prompts"].as_array().unwrap();
        Reference {
            device: golden["device"].as_str().unwrap_or("?").to_string(),
            bf16_errors: golden["torch_bf16_prompt_errors"]
                .as_str()
                .unwrap_or("?")
                .to_string(),
            prompts: entries.iter().map(|p| ids(&p["prompt_ids"])).collect(),
            outputs: entries.iter().map(|p| ids(&p["output_ids"])).collect(),
            prompt_logits: entries
                .iter()
                .map(|p| floats(&p["prompt_logits"]))
                .collect(),
            margins: entries.iter().map(|p| floats(&p["margins"])).collect(),
        }
    }

    fn steps(&self) -> usize {
        self.outputs[0].len()
    }
}

#[test]
fn qwen3_on_cuda_matches_pytorch_and_the_cpu() {
    let dir = PathBuf::from(
        std::env::var("PAGODA_QWEN3_DIR").unwrap_or_else(|_| "/tmp/qwen3-small".into()),
    );
    let reference = dir.join("reference.json");
    if !reference.is_file() {
        eprintln!(
            "notice: CUDA tests skipped: {} is missing (run scripts/gpu/make_qwen3.py)",
            reference.display()
        );
        return;
    }
    let golden = Reference::load(&reference);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let cpu = CpuBackend::new(CpuOptions {
        threads,
        weight_dtype: WeightDtype::F32,
    })
    .unwrap();
    let cpu_logits = trace(cpu, &dir, &golden);
    let mut failures = Vec::new();
    failures.extend(against_torch("cpu", &cpu_logits, &golden, CPU_TOL));

    if let Some(gpu) = gpu() {
        let gpu_logits = trace(gpu, &dir, &golden);
        failures.extend(against_torch("cuda", &gpu_logits, &golden, TOL));
        failures.extend(cuda_against_cpu(&gpu_logits, &cpu_logits, &golden));
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Every prompt prefilled in one step, then PyTorch's tokens fed back batched:
/// `logits[prompt][step]`, step 0 after the prompt.
fn trace<B: pagoda_kernels::Backend>(
    backend: B,
    dir: &std::path::Path,
    golden: &Reference,
) -> Vec<Vec<Vec<f32>>> {
    let files = open_model(&OpenOptions {
        model: Some(dir.to_path_buf()),
        config: None,
        dummy_weights: false,
        tokenizer: None,
    })
    .unwrap();
    let steps = golden.steps();
    let mut runner = runner(
        backend,
        &files.config,
        files.weights.as_ref(),
        blocks_needed(&golden.prompts, steps),
    );
    let forced: Vec<Vec<u32>> = golden
        .outputs
        .iter()
        .map(|o| o[..steps - 1].to_vec())
        .collect();
    forced_trace(&mut runner, &golden.prompts, &forced)
}

/// Prompt logits within `tol` of PyTorch's f32 ones; greedy tokens equal
/// wherever PyTorch's margin exceeds [`TOL`]. Returns the failures.
fn against_torch(
    backend: &str,
    got: &[Vec<Vec<f32>>],
    golden: &Reference,
    tol: f32,
) -> Vec<String> {
    let mut tally = Tally::default();
    let mut prompt_errs = Vec::new();
    for (i, prompt) in golden.prompts.iter().enumerate() {
        let what = format!("{backend} vs PyTorch, prompt {i} ({} tokens)", prompt.len());
        let want = &golden.prompt_logits[i];
        tally.check_logits(&what, &got[i][0], want, tol);
        prompt_errs.push(format!(
            "{:.2e}/{:.2e}",
            rel_err_l2(&got[i][0], want),
            rel_err(&got[i][0], want)
        ));
        let steps = got[i]
            .iter()
            .zip(&golden.outputs[i])
            .zip(&golden.margins[i]);
        for (s, ((logits, &token), &margin)) in steps.enumerate() {
            tally.check_token(&format!("{what}, step {s}"), logits, token, margin);
        }
    }
    eprintln!(
        "qwen3 {backend} vs PyTorch f32 ({}): prompt logits relative errors (L2/max-abs) {} \
         (bar {tol:.0e}; PyTorch's own bf16 run: {}); {} greedy steps, {} near-ties ({} tokens differ there)",
        golden.device,
        prompt_errs.join(" "),
        golden.bf16_errors,
        tally.steps,
        tally.near_ties,
        tally.excused_mismatches
    );
    tally.failures
}

/// Every step's logits on CUDA within [`TOL`] of the CPU's; greedy tokens
/// equal wherever the CPU's margin exceeds [`TOL`]. Returns the failures.
fn cuda_against_cpu(
    gpu: &[Vec<Vec<f32>>],
    cpu: &[Vec<Vec<f32>>],
    golden: &Reference,
) -> Vec<String> {
    let mut tally = Tally::default();
    for (i, prompt) in golden.prompts.iter().enumerate() {
        for s in 0..golden.steps() {
            let what = format!(
                "cuda vs cpu, prompt {i} ({} tokens), step {s}",
                prompt.len()
            );
            tally.check_logits(&what, &gpu[i][s], &cpu[i][s], TOL);
            let want = &cpu[i][s];
            tally.check_token(&what, &gpu[i][s], argmax(want), rel_margin(want));
        }
    }
    eprintln!(
        "qwen3 cuda vs cpu (same weights): {} steps, max logits relative error {:.3e} (L2; bar {TOL:.0e}), \
         {:.3e} (max-abs), {} near-ties ({} tokens differ there)",
        tally.steps,
        tally.max_rel_err,
        tally.max_abs_rel_err,
        tally.near_ties,
        tally.excused_mismatches
    );
    tally.failures
}
