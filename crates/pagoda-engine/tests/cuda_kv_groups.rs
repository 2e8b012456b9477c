//! KV cache groups on CUDA (tiny Gemma 3 and Gemma 2, dummy weights): long
//! prompts past the local window and the 64-key read tile, batched with
//! chunked prefill, decoded through captured graphs. With the local groups'
//! passed blocks released the GPU gives the same greedy tokens as with
//! every block kept (bit for bit), and holds fewer pages.
//!
//! Against the CPU backend (bf16 weights, the same engine and schedule) the
//! test first decides whether the GPU's sliding-window attention is right,
//! by teacher forcing: the CPU's own sequences (prompt + greedy output) are
//! fed to both backends (a prompt prefilled in one step, then one token per
//! decode step; and from the first token on, all decode), and per position
//! it measures |GPU - CPU| of the logprob of the CPU's top-1 token,
//! separately where the query sees every key (inside the window) and where
//! the window cuts keys (beyond it). The same is measured on the same model
//! with a window past every context (the calibration: bf16 noise with
//! nothing cut), and on the CPU between the real window and one key more
//! (what an off-by-one window bug does). It asserts that the windowed
//! error is within 3x the calibration's (plus a small floor) and that the
//! off-by-one signal is clear of that tolerance (else the test could not
//! tell). Then greedy tokens are compared: a GPU token may differ from the
//! CPU's (and the request is not compared further) only where the CPU's
//! top-1 - top-2 logprob margin is below twice the largest margin error
//! the teacher forcing measured (at least 0.1).
//!
//! Without a CUDA device every test prints a notice and passes (fails where
//! PAGODA_REQUIRE_GPU=1 says a GPU must be present).
#![cfg(feature = "cuda")]

mod cuda_common;

use std::collections::HashMap;

use cuda_common::*;
use pagoda_core::{RequestId, SamplingParams, SchedulerConfig};
use pagoda_engine::{EngineRequest, LlmEngine};
use pagoda_kernels::cpu::{CpuBackend, CpuOptions, WeightDtype};
use pagoda_kernels::Backend;
use pagoda_model::loader::dummy::DummySource;
use pagoda_model::loader::hf_config::load_config_file;
use pagoda_model::ModelConfig;

const MAX_MODEL_LEN: usize = 256;
const NUM_BLOCKS: usize = 400;

fn config(arch: &str) -> ModelConfig {
    load_config_file(&repo_root().join(format!("tests/golden/tiny-{arch}/config.json"))).unwrap()
}

fn engine<B: Backend>(b: B, cfg: &ModelConfig, release: bool, graphs: bool) -> LlmEngine<B> {
    let src = DummySource::new(cfg).unwrap();
    let mut r = runner(b, cfg, &src, NUM_BLOCKS);
    assert!(r.kv_layout().num_groups() > 1);
    if graphs {
        r.capture_decode_graphs(8, MAX_MODEL_LEN).unwrap();
    }
    let sched = SchedulerConfig {
        block_size: BLOCK_SIZE,
        num_blocks: NUM_BLOCKS,
        max_num_batched_tokens: 40,
        max_num_seqs: 8,
        max_model_len: MAX_MODEL_LEN,
        enable_prefix_caching: false,
    };
    LlmEngine::with_window_release(r, None, sched, release).unwrap()
}

/// The teacher-forced steps of every `(sequence, prompt length)` on `b`.
fn forced<B: Backend>(
    b: B,
    cfg: &ModelConfig,
    seqs: &[(Vec<u32>, usize)],
) -> Vec<(usize, Vec<f32>)> {
    let src = DummySource::new(cfg).unwrap();
    let mut r = runner(b, cfg, &src, NUM_BLOCKS);
    let mut out = Vec::new();
    for (seq, prompt_len) in seqs {
        out.extend(window_check::forced_logits(&mut r, seq, *prompt_len));
    }
    out
}

fn cpu() -> CpuBackend {
    CpuBackend::new(CpuOptions {
        threads: 2,
        weight_dtype: WeightDtype::BF16,
    })
    .unwrap()
}

/// Decides, from teacher forcing the CPU's sequences (see the module
/// docs), whether the GPU's windowed attention is right; asserts it and
/// returns the top-1 margin below which a greedy token may flip.
fn window_verdict(arch: &str, cfg: &ModelConfig, cpu_run: &[(Vec<u32>, Vec<f32>)]) -> f32 {
    use window_check::{max, mean, with_window, WindowErrors};
    let w = cfg.sliding_window.expect("a local window");
    let prompts = [prompt(1, 180), prompt(2, 150), prompt(3, 9)];
    // Each request's prompt prefilled, then its output decoded; and the
    // short-prompt request all decode from its first token (queries
    // inside the window too).
    let mut seqs: Vec<(Vec<u32>, usize)> = prompts
        .iter()
        .zip(cpu_run)
        .map(|(p, (out, _))| (p.iter().chain(out).copied().collect(), p.len()))
        .collect();
    seqs.push((seqs[2].0.clone(), 1));
    let Some(dev) = gpu() else {
        return f32::INFINITY;
    };
    let gpu_w = forced(dev, cfg, &seqs);
    let cpu_w = forced(cpu(), cfg, &seqs);
    let calib = with_window(cfg, 4096);
    let Some(dev) = gpu() else {
        return f32::INFINITY;
    };
    let gpu_c = forced(dev, &calib, &seqs);
    let cpu_c = forced(cpu(), &calib, &seqs);
    let cpu_bug = forced(cpu(), &with_window(cfg, w + 1), &seqs);
    let mut windowed = WindowErrors::default();
    windowed.add(&gpu_w, &cpu_w, w);
    let mut noise = WindowErrors::default();
    noise.add(&gpu_c, &cpu_c, w);
    let mut bug = WindowErrors::default();
    bug.add(&cpu_bug, &cpu_w, w);
    eprintln!(
        "{arch} window {w}, GPU vs CPU:                    {}",
        windowed.summary()
    );
    eprintln!(
        "{arch} no window (calibration), GPU vs CPU:   {}",
        noise.summary()
    );
    eprintln!(
        "{arch} window {} vs {w} (a bug), CPU vs CPU:      {}",
        w + 1,
        bug.summary()
    );
    let (verdict, tol_mean, line) = window_check::looks_like_rounding(&windowed, &noise);
    eprintln!(
        "{arch} verdict: {} ({line}; an off-by-one window gives {:.2e})",
        if verdict {
            "bf16 noise, no window bug"
        } else {
            "WINDOW BUG on CUDA"
        },
        mean(&bug.beyond)
    );
    // The tolerance is already three times the windowless noise; an
    // off-by-one must clear it (on an H200, tiny Gemma 3's does 6x, tiny
    // Gemma 2's, whose soft-capping mutes a one-key change, 1.8x).
    assert!(
        mean(&bug.beyond) > tol_mean,
        "{arch}: an off-by-one window ({:.2e}) is not clear of the noise tolerance \
         ({tol_mean:.2e}): this test cannot tell a window bug from rounding",
        mean(&bug.beyond)
    );
    assert!(
        verdict,
        "{arch}: the GPU's windowed logprobs are off by more than bf16 noise explains \
         (see the lines above): a sliding-window bug on CUDA"
    );
    (2.0 * max(&windowed.margin).max(max(&noise.margin))).max(0.1)
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) % 500 + 3)
        .collect()
}

/// Per request: its tokens and each token's (top-1 - top-2) logprob margin.
fn run<B: Backend>(e: &mut LlmEngine<B>, peak: &mut usize) -> Vec<(Vec<u32>, Vec<f32>)> {
    let wave = [
        (prompt(1, 180), 40),
        (prompt(2, 150), 60),
        (prompt(3, 9), 120),
    ];
    let mut order: Vec<RequestId> = Vec::new();
    for (p, n) in &wave {
        let params = SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(*n)
        };
        order.push(
            e.add_request(EngineRequest {
                prompt_token_ids: p.clone(),
                params,
                logprobs: Some(2),
            })
            .unwrap(),
        );
    }
    let mut got: HashMap<RequestId, (Vec<u32>, Vec<f32>)> = HashMap::new();
    while e.has_unfinished_requests() {
        for out in e.step().unwrap() {
            let lp = out.logprobs.unwrap();
            let margin = match lp.top.as_slice() {
                [(_, a), (_, b), ..] => a - b,
                _ => f32::INFINITY,
            };
            let entry = got.entry(out.request_id).or_default();
            entry.0.push(out.token_id);
            entry.1.push(margin);
        }
        *peak = (*peak).max(e.stats().num_blocks_used);
    }
    order.iter().map(|id| got.remove(id).unwrap()).collect()
}

#[test]
fn released_local_blocks_on_cuda_match_kept_blocks_and_the_cpu() {
    for arch in ["gemma3", "gemma2"] {
        let cfg = config(arch);
        let Some(dev) = gpu() else { return };
        let mut released = engine(dev, &cfg, true, true);
        let mut peak = 0;
        let got = run(&mut released, &mut peak);
        assert!(released.runner().graph_replays() > 0, "{arch}: graphs ran");
        let Some(dev) = gpu() else { return };
        let mut kept = engine(dev, &cfg, false, true);
        let mut peak_kept = 0;
        let want = run(&mut kept, &mut peak_kept);
        assert!(peak < peak_kept, "{arch}: {peak} vs {peak_kept} pages");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.0, w.0, "{arch} request {i}: released vs kept on CUDA");
        }
        let mut cpu_engine = engine(cpu(), &cfg, true, false);
        let mut cpu_peak = 0;
        let cpu_run = run(&mut cpu_engine, &mut cpu_peak);
        assert_eq!(cpu_peak, peak, "{arch}: the same schedule");
        let tie = window_verdict(arch, &cfg, &cpu_run);
        let mut compared = 0;
        for (i, (g, c)) in got.iter().zip(&cpu_run).enumerate() {
            for (j, ((&gt, &ct), &margin)) in g.0.iter().zip(&c.0).zip(&c.1).enumerate() {
                if gt != ct {
                    eprintln!(
                        "{arch} request {i} token {j}: GPU {gt} vs CPU {ct}, CPU margin {margin:.3} \
                         (near-tie bound {tie:.3})"
                    );
                    assert!(
                        margin < tie,
                        "{arch} request {i} token {j}: GPU {gt} vs CPU {ct}, CPU margin {margin} \
                         not below the measured near-tie bound {tie}"
                    );
                    break;
                }
                compared += 1;
            }
        }
        // The greedy runs stop at each request's first (excused) near-tie
        // flip, which on tiny Gemma 3 comes within 8-16 tokens (an H200 run
        // compared 34); the teacher-forced check above covers every
        // position, so this only guards against a vacuous comparison.
        assert!(compared >= 24, "{arch}: only {compared} tokens compared");
    }
}
