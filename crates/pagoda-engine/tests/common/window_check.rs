//! Teacher-forced logprob comparisons that tell a sliding-window bug from
//! rounding: one token sequence fed to two runners (a prompt prefilled in
//! one step, then one token per decode step), and per position the
//! difference of the reference's top-1 logprob, and of its top-1 - top-2
//! margin, split by whether the query at that position lies inside the
//! local window (every key visible, the window cuts nothing) or beyond it.

use pagoda_core::{BlockId, RequestId, ScheduledSequence};
use pagoda_engine::context::build_forward_context;
use pagoda_engine::ModelRunner;
use pagoda_kernels::Backend;
use pagoda_model::ModelConfig;

use super::{with_kv_groups, BLOCK_SIZE};

/// `cfg` with its local layers' window set to `window` (a window past
/// every context makes the local layers attend over everything: the
/// calibration model; one more or less than the real one: a window bug).
pub fn with_window(cfg: &ModelConfig, window: usize) -> ModelConfig {
    let mut c = cfg.clone();
    c.sliding_window = Some(window);
    c
}

/// Feeds `seq[..prompt_len]` as one prefill step, then every later token
/// but the last one per decode step, and returns, per step, the query
/// position and the full logits (step `s` predicts `seq[prompt_len + s]`).
/// Pages: each group on its own range of the runner's cache.
pub fn forced_logits<B: Backend>(
    runner: &mut ModelRunner<B>,
    seq: &[u32],
    prompt_len: usize,
) -> Vec<(usize, Vec<f32>)> {
    assert!(prompt_len >= 1 && prompt_len < seq.len());
    let table: Vec<BlockId> = (0..seq.len().div_ceil(BLOCK_SIZE) as u32)
        .map(BlockId)
        .collect();
    let mut out = Vec::new();
    let mut context_len = 0;
    let mut input = &seq[..prompt_len];
    while context_len + input.len() < seq.len() {
        let s = ScheduledSequence::new(
            RequestId(0),
            input.to_vec(),
            context_len,
            table.clone(),
            true,
        );
        let mut ctx = build_forward_context(&[s], BLOCK_SIZE);
        with_kv_groups(runner, &mut ctx, table.len());
        let logits = runner.execute(&ctx).unwrap().into_logits().unwrap();
        context_len += input.len();
        out.push((context_len - 1, logits));
        input = &seq[context_len..context_len + 1];
    }
    out
}

/// Errors of one comparison, per position class.
#[derive(Debug, Default, Clone)]
pub struct WindowErrors {
    /// |Δ logprob of the reference's top-1| where the query sees every key.
    pub inside: Vec<f32>,
    /// The same where the window cuts keys off.
    pub beyond: Vec<f32>,
    /// |Δ (top-1 - top-2) logprob margin| (the reference's two tokens), all
    /// positions: how far rounding moves a greedy decision.
    pub margin: Vec<f32>,
}

fn log_softmax(v: &[f32]) -> Vec<f32> {
    let m = v.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let lse = m + v.iter().map(|&x| ((x - m) as f64).exp()).sum::<f64>().ln() as f32;
    v.iter().map(|&x| x - lse).collect()
}

fn top2(v: &[f32]) -> (usize, usize) {
    let (mut a, mut b) = (0, usize::MAX);
    for i in 1..v.len() {
        if v[i] > v[a] {
            b = a;
            a = i;
        } else if b == usize::MAX || v[i] > v[b] {
            b = i;
        }
    }
    (a, b)
}

impl WindowErrors {
    /// Adds the steps of `got` against `want` (the reference), queries at
    /// positions below `window` counted as inside.
    pub fn add(&mut self, got: &[(usize, Vec<f32>)], want: &[(usize, Vec<f32>)], window: usize) {
        assert_eq!(got.len(), want.len());
        for ((q, g), (q2, w)) in got.iter().zip(want) {
            assert_eq!(q, q2);
            let (g, w) = (log_softmax(g), log_softmax(w));
            let (a, b) = top2(&w);
            let d = (g[a] - w[a]).abs();
            let d = if d.is_nan() { f32::INFINITY } else { d };
            if *q < window {
                self.inside.push(d);
            } else {
                self.beyond.push(d);
            }
            let dm = ((g[a] - g[b]) - (w[a] - w[b])).abs();
            self.margin
                .push(if dm.is_nan() { f32::INFINITY } else { dm });
        }
    }

    /// One line: count, mean and max of each class.
    pub fn summary(&self) -> String {
        format!(
            "inside window: n {} mean {:.2e} max {:.2e}; beyond: n {} mean {:.2e} max {:.2e}; \
             top-2 margin: max {:.2e}",
            self.inside.len(),
            mean(&self.inside),
            max(&self.inside),
            self.beyond.len(),
            mean(&self.beyond),
            max(&self.beyond),
            max(&self.margin)
        )
    }
}

/// The rule that calls `windowed` (a backend against the reference on a
/// windowed model) rounding rather than a window bug: within 3x of what
/// `calibration` (the same comparison with a window past every context)
/// shows, on the mean and the max beyond the window and the mean inside,
/// plus small floors. Returns the verdict, the tolerance of the mean
/// beyond the window, and a line of numbers.
pub fn looks_like_rounding(
    windowed: &WindowErrors,
    calibration: &WindowErrors,
) -> (bool, f32, String) {
    let tol_mean = 3.0 * mean(&calibration.beyond) + 1e-3;
    let tol_max = 3.0 * max(&calibration.beyond) + 1e-2;
    let tol_inside = 3.0 * mean(&calibration.inside) + 1e-3;
    let ok = mean(&windowed.beyond) <= tol_mean
        && max(&windowed.beyond) <= tol_max
        && mean(&windowed.inside) <= tol_inside;
    let line = format!(
        "beyond-window mean {:.2e} (tolerance {tol_mean:.2e}), max {:.2e} ({tol_max:.2e}); \
         inside mean {:.2e} ({tol_inside:.2e})",
        mean(&windowed.beyond),
        max(&windowed.beyond),
        mean(&windowed.inside)
    );
    (ok, tol_mean, line)
}

pub fn mean(v: &[f32]) -> f32 {
    if v.is_empty() {
        return 0.0;
    }
    v.iter().sum::<f32>() / v.len() as f32
}

pub fn max(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |a, &b| a.max(b))
}
