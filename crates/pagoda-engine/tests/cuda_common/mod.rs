//! Helpers of the engine's CUDA end-to-end tests: the GPU (opened by
//! `pagoda_kernels::cuda::testing`, shared with the kernel tests), the plain
//! engine-test helpers of `common` (JSON readers, a runner on any backend),
//! finding the repository on a host where the build's paths do not exist, the
//! batched teacher-forced trace of `common/forced.rs`, the FP8 calibration of
//! `common/fp8_calibration.rs`, a tiny golden model with its prompts and
//! the greedy reference run on it, and the logits/greedy check with near-tie
//! excuses.

#![allow(dead_code)]

#[path = "../common/mod.rs"]
mod common;

#[allow(unused_imports)] // each test binary uses some of them
pub use common::{argmax, floats, ids, rel_err, runner, window_check, BLOCK_SIZE};
#[allow(unused_imports)]
pub use common::{forced::forced_trace, fp8_calibration};
use pagoda_engine::ModelRunner;
use pagoda_kernels::cuda::testing;
pub use pagoda_kernels::cuda::testing::gpu;
use pagoda_kernels::Backend;
use pagoda_model::loader::dummy::DummySource;
use pagoda_model::loader::hf_config::load_config_file;
use pagoda_model::ModelConfig;
use std::path::PathBuf;

/// Rounds to bf16 (nearest even), as the device stores logits.
pub fn bf(v: f32) -> f32 {
    if v.is_nan() {
        return v;
    }
    let u = v.to_bits();
    let r = u.wrapping_add(0x7fff + ((u >> 16) & 1));
    f32::from_bits(r & 0xffff_0000)
}

/// Appends one request's row to a device sampling batch as the engine
/// builds it: its filters and random draw (`seed`) to `sampling`, its
/// logprobs and, where it has penalties, its token history (`prompt` and
/// `outputs`) to `opts`.
pub fn push_sampling_row(
    sampling: &mut Vec<pagoda_kernels::SamplingRow>,
    opts: &mut pagoda_kernels::SamplingOptions,
    p: &pagoda_core::SamplingParams,
    seed: u64,
    (prompt, outputs): (&[u32], &[u32]),
    logprobs: Option<usize>,
) {
    sampling.push(pagoda_kernels::SamplingRow {
        temperature: p.temperature,
        top_k: p.top_k as u32,
        top_p: p.top_p,
        min_p: p.min_p,
        random: pagoda_engine::sampler::RequestRng::new(seed).next_u64(),
    });
    let mut row = pagoda_kernels::RowOptions {
        logprobs: logprobs.map(|n| n as u32),
        ..pagoda_kernels::RowOptions::NONE
    };
    if has_penalties(p) {
        let mut h = pagoda_engine::token_history::TokenHistory::from_prompt(prompt);
        h.sync(prompt, outputs);
        row.repetition_penalty = p.repetition_penalty;
        row.frequency_penalty = p.frequency_penalty;
        row.presence_penalty = p.presence_penalty;
        row.history_start = (opts.history.len() / 2) as u32;
        row.history_len = h.len() as u32;
        opts.history.extend_from_slice(h.pairs());
    }
    opts.rows.push(row);
}

/// Whether a request asks for any of the three penalties.
pub fn has_penalties(p: &pagoda_core::SamplingParams) -> bool {
    p.repetition_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0
}

/// Uniform in [0, 1), drawn from a SplitMix64 state.
pub fn unit(s: &mut u64) -> f32 {
    (pagoda_engine::sampler::splitmix64(s) >> 40) as f32 / (1u64 << 24) as f32
}

/// The bf16 tolerance: logits must agree within it (relative error of the
/// logit vectors, L2), and a differing greedy token is excused only where the
/// reference's relative top-1 margin is within it (a near-tie).
pub const TOL: f32 = 1e-2;

/// The repository root: the build's path, or the current directory where the
/// test binary was carried to another host (it runs from the repo root there).
pub fn repo_root() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    if built.join("tests/golden").is_dir() {
        built
    } else {
        std::env::current_dir().expect("current directory")
    }
}

/// Blocks needed to hold every sequence of a trace, each in its own range.
pub fn blocks_needed(prompts: &[Vec<u32>], steps: usize) -> usize {
    prompts
        .iter()
        .map(|p| (p.len() + steps + 1).div_ceil(BLOCK_SIZE))
        .sum::<usize>()
        // Room for every KV cache group of the tiny models (Gemma 3: 4).
        * 4
}

/// A tiny golden model (tests/golden/tiny-ARCH) with dummy weights: its
/// config, weights, golden prompts, and the blocks a trace of `steps` tokens
/// per prompt needs.
pub struct TinyGolden {
    pub cfg: ModelConfig,
    pub src: DummySource,
    pub prompts: Vec<Vec<u32>>,
    pub blocks: usize,
}

pub fn tiny_golden(arch: &str, steps: usize) -> TinyGolden {
    let dir = repo_root().join(format!("tests/golden/tiny-{arch}"));
    let cfg = load_config_file(&dir.join("config.json")).unwrap();
    let src = DummySource::new(&cfg).unwrap();
    let golden: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("golden.json")).unwrap()).unwrap();
    let prompts: Vec<Vec<u32>> = golden["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| ids(&p["prompt_ids"]))
        .collect();
    let blocks = blocks_needed(&prompts, steps);
    TinyGolden {
        cfg,
        src,
        prompts,
        blocks,
    }
}

/// The reference side of a teacher-forced comparison: each prompt decoded
/// alone and greedily for `steps` tokens on `runner`. Returns per prompt the
/// tokens, the logits each was picked from, and the `steps - 1` tokens to
/// feed the other side ([`forced_trace`]) so its steps line up.
pub fn greedy_reference<B: Backend>(
    runner: &mut ModelRunner<B>,
    prompts: &[Vec<u32>],
    steps: usize,
) -> GreedyReference {
    let mut out = GreedyReference::default();
    for p in prompts {
        let mut tokens: Vec<u32> = Vec::new();
        // Re-running the trace with one more forced token each time keeps
        // this simple; the tiny models make it cheap.
        for _ in 0..steps {
            let t = forced_trace(runner, std::slice::from_ref(p), &[tokens.clone()]);
            tokens.push(argmax(t[0].last().unwrap()));
        }
        let forced = tokens[..steps - 1].to_vec();
        let t = forced_trace(
            runner,
            std::slice::from_ref(p),
            std::slice::from_ref(&forced),
        );
        out.tokens.push(tokens);
        out.logits.push(t.into_iter().next().unwrap());
        out.forced.push(forced);
    }
    out
}

#[derive(Default)]
pub struct GreedyReference {
    pub tokens: Vec<Vec<u32>>,
    pub logits: Vec<Vec<Vec<f32>>>,
    pub forced: Vec<Vec<u32>>,
}

/// ‖got - want‖₂ / ‖want‖₂ (the measure the op tests use).
pub fn rel_err_l2(got: &[f32], want: &[f32]) -> f32 {
    testing::rel_err_l2(got, want) as f32
}

/// (top-1 - top-2) / max |v|: how far the greedy pick is from a tie, on the
/// scale `rel_err` measures errors in.
pub fn rel_margin(v: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in v {
        if x > a {
            b = a;
            a = x;
        } else if x > b {
            b = x;
        }
    }
    let scale = v.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    (a - b) / scale
}

/// Tally of a comparison: every check runs, failures are collected and
/// [`Tally::finish`] reports them all at once (one GPU run shows everything).
#[derive(Debug)]
pub struct Tally {
    /// Reference margins at or below this are near-ties ([`TOL`] by default).
    pub near_tie_margin: f32,
    pub steps: usize,
    /// Largest ‖got - want‖₂ / ‖want‖₂.
    pub max_rel_err: f32,
    /// Largest max |got - want| / max |want| (reported).
    pub max_abs_rel_err: f32,
    pub near_ties: usize,
    pub excused_mismatches: usize,
    pub failures: Vec<String>,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            near_tie_margin: TOL,
            steps: 0,
            max_rel_err: 0.0,
            max_abs_rel_err: 0.0,
            near_ties: 0,
            excused_mismatches: 0,
            failures: Vec::new(),
        }
    }
}

impl Tally {
    /// Checks one greedy step: `got` must pick `want_token` unless the
    /// reference's relative margin is within `near_tie_margin` (printed as
    /// excused).
    pub fn check_token(&mut self, what: &str, got: &[f32], want_token: u32, want_margin: f32) {
        self.steps += 1;
        let got_token = argmax(got);
        if want_margin <= self.near_tie_margin {
            self.near_ties += 1;
            if got_token != want_token {
                self.excused_mismatches += 1;
            }
            eprintln!(
                "near-tie excused: {what}: reference top-1 margin {want_margin:.2e} (want {want_token}, got {got_token})"
            );
            return;
        }
        if got_token != want_token {
            self.failures.push(format!(
                "{what}: greedy token {got_token} differs from {want_token} with a reference top-1 margin of {want_margin:.3e}"
            ));
        }
    }

    /// Checks logits within `tol` (relative, in the L2 norm; the max-abs
    /// error over max |want| is recorded too). NaN fails at once.
    pub fn check_logits(&mut self, what: &str, got: &[f32], want: &[f32], tol: f32) {
        if let Some(i) = got.iter().position(|v| !v.is_finite()) {
            panic!("{what}: logit {i} is {}", got[i]);
        }
        let e = rel_err_l2(got, want);
        let abs = rel_err(got, want);
        self.max_rel_err = self.max_rel_err.max(e);
        self.max_abs_rel_err = self.max_abs_rel_err.max(abs);
        if e >= tol {
            self.failures.push(format!(
                "{what}: logits relative error {e:.3e} over {tol:.3e} (L2; max-abs {abs:.3e})"
            ));
        }
    }

    /// Panics listing every failure, if any.
    pub fn finish(&self, what: &str) {
        assert!(
            self.failures.is_empty(),
            "{what}: {} failures:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}
