//! How far an FP8 model's logits may move under bf16-level differences,
//! measured on the CPU, so a backend comparison fails on a real bug and
//! passes on rounding.
//!
//! The CPU FP8 reference keeps f32 activations and f32 tables (embedding,
//! norms, biases, LM head); a bf16 device rounds each linear layer's input
//! to bf16 before quantizing it per token, and holds those tables in bf16.
//! Per-token FP8 quantization amplifies such differences: an input moved by
//! a relative `d` flips a fraction of about `d / q` of its codes (`q`, the
//! E4M3 step, about 1/12 of a value), each by a whole step, so the layer's
//! output moves by about `sqrt(d * q)`; the next FP8 layer takes that as
//! its `d`. From bf16's 2^-9 the difference reaches the FP8 error itself
//! within a few layers: two correct FP8 implementations differ by about
//! as much as either differs from the model without FP8.
//!
//! [`calibrate`] runs the reference and four twins of it that see what a
//! bf16 device sees ([`TWINS`]: the CPU backend's bf16 linear inputs,
//! [`Bf16Tables`], both), and the model without FP8. A checked trace
//! ([`Calibration::check`]) must stay, at every step, within
//! [`DRIFT_FACTOR`] times the largest drift of a twin up to that step (at
//! least [`FLOOR`]), and its mean error against the model without FP8
//! within [`ACCURACY_MARGIN`] of the largest of the reference's and the
//! twins': bf16-level differences only redraw the FP8 rounding noise, a
//! bug adds to it. [`Planted`] gives FP8 weights with a planted bug, for
//! showing what the check catches (golden_fp8.rs).

use super::forced::forced_trace;
use super::{ids, runner, BLOCK_SIZE};
use pagoda_kernels::cpu::{CpuBackend, CpuOptions, WeightDtype};
use pagoda_kernels::{Fp8Matrix, HostData, HostTensor};
use pagoda_model::loader::{TensorInfo, WeightSource};
use pagoda_model::ModelConfig;

/// A backend may drift from the reference this many times the reference's
/// own drift under bf16-level differences (at the same step or earlier).
pub const DRIFT_FACTOR: f32 = 2.0;
/// A backend's mean error against the model without FP8 may exceed the
/// largest of the reference's and its twins' by this fraction.
pub const ACCURACY_MARGIN: f32 = 0.08;
/// The bar never goes below this (relative L2): about what the same
/// bf16-level differences move these models by without FP8 (0.01-0.02).
pub const FLOOR: f32 = 0.02;

/// ‖got - want‖₂ / ‖want‖₂.
pub fn rel_l2(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "rel_l2: lengths differ");
    let (mut num, mut den) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt() as f32
}

/// `v` rounded to bf16 (nearest even; NaN stays NaN).
pub fn round_bf16(v: f32) -> f32 {
    if v.is_nan() {
        return v;
    }
    let u = v.to_bits();
    f32::from_bits(u.wrapping_add(0x7fff + ((u >> 16) & 1)) & 0xffff_0000)
}

/// The CPU FP8 reference backend; `bf16_inputs` rounds every linear
/// layer's input to bf16 first (the device's activations).
pub fn cpu_fp8(bf16_inputs: bool) -> CpuBackend {
    CpuBackend::new(CpuOptions {
        threads: 2,
        weight_dtype: WeightDtype::F32,
    })
    .unwrap()
    .with_fp8_weights(true)
    .with_bf16_linear_inputs(bf16_inputs)
}

/// A source whose tables (embedding, LM head, norm weights, biases: every
/// tensor that is not a linear layer's matrix) come rounded to bf16, as a
/// bf16 device holds them (`nearest`; else toward zero, a second
/// realization of the same-sized difference); linear matrices (quantized to
/// FP8 at load from their exact values, on every backend) and FP8 tensors
/// pass unchanged.
pub struct Bf16Tables<'a> {
    pub src: &'a dyn WeightSource,
    pub nearest: bool,
}

/// A tiny golden model (`tests/golden/tiny-{arch}` under `root`, the
/// repository as the calling test binary finds it) on its dummy weights,
/// with the golden prompts and their first `steps` greedy tokens to force.
pub struct GoldenCase {
    pub cfg: ModelConfig,
    pub src: pagoda_model::loader::dummy::DummySource,
    pub prompts: Vec<Vec<u32>>,
    pub forced: Vec<Vec<u32>>,
}

impl GoldenCase {
    pub fn load(root: &std::path::Path, arch: &str, steps: usize) -> Self {
        let dir = root.join(format!("tests/golden/tiny-{arch}"));
        let cfg = pagoda_model::loader::hf_config::load_config_file(&dir.join("config.json"))
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        let text = std::fs::read_to_string(dir.join("golden.json"))
            .unwrap_or_else(|e| panic!("{arch}: golden.json: {e}"));
        let golden: serde_json::Value = serde_json::from_str(&text).unwrap();
        let src = pagoda_model::loader::dummy::DummySource::new(&cfg).unwrap();
        let (prompts, forced) = golden_inputs(&golden, steps);
        GoldenCase {
            cfg,
            src,
            prompts,
            forced,
        }
    }

    /// The teacher-forced trace of the case, with KV blocks for all of it.
    pub fn trace(&self) -> Trace<'_> {
        let steps = self.forced.first().map_or(0, Vec::len);
        Trace {
            prompts: &self.prompts,
            forced: &self.forced,
            blocks: blocks_for(&self.prompts, steps),
        }
    }
}

/// Whether `name` is a table a device holds in bf16 rather than a linear
/// layer's matrix (a mixture-of-experts router and shared-expert gate are
/// tables: they stay out of FP8).
pub fn is_table(name: &str, t: &HostTensor) -> bool {
    t.shape.len() < 2
        || name.contains("embed_tokens")
        || name.starts_with("lm_head")
        || name.ends_with(".gate.weight")
        || name.contains("shared_expert_gate")
}

impl WeightSource for Bf16Tables<'_> {
    fn tensor_infos(&self) -> Vec<TensorInfo> {
        self.src.tensor_infos()
    }
    fn get(&self, name: &str) -> pagoda_model::Result<HostTensor> {
        let mut t = self.src.get(name)?;
        if is_table(name, &t) {
            if let HostData::F32(v) = &mut t.data {
                for x in v.iter_mut() {
                    *x = if self.nearest {
                        round_bf16(*x)
                    } else {
                        f32::from_bits(x.to_bits() & 0xffff_0000)
                    };
                }
            }
        }
        Ok(t)
    }
    fn contains(&self, name: &str) -> bool {
        self.src.contains(name)
    }
    fn get_fp8(&self, name: &str) -> pagoda_model::Result<Option<Fp8Matrix>> {
        self.src.get_fp8(name)
    }
}

/// A bug planted in the FP8 weights a [`Planted`] source gives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bug {
    /// Each output channel of every FP8 matrix takes its neighbour's scale
    /// (an off-by-one channel index).
    NeighbourScale,
    /// One output channel of one layer's down projection takes its
    /// neighbour's scale.
    OneChannelScale,
    /// Every bias added twice.
    DoubleBias,
}

/// `inner` with its linear matrices quantized at read time and `bug`
/// planted.
pub struct Planted<'a> {
    pub inner: &'a dyn WeightSource,
    pub bug: Bug,
}

impl WeightSource for Planted<'_> {
    fn tensor_infos(&self) -> Vec<TensorInfo> {
        self.inner.tensor_infos()
    }
    fn get(&self, name: &str) -> pagoda_model::Result<HostTensor> {
        let mut t = self.inner.get(name)?;
        if self.bug == Bug::DoubleBias && name.ends_with(".bias") {
            if let HostData::F32(v) = &mut t.data {
                v.iter_mut().for_each(|x| *x *= 2.0);
            }
        }
        Ok(t)
    }
    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name)
    }
    fn get_fp8(&self, name: &str) -> pagoda_model::Result<Option<Fp8Matrix>> {
        if let Some(m) = self.inner.get_fp8(name)? {
            return Ok(Some(m));
        }
        let t = self.inner.get(name)?;
        if is_table(name, &t) || self.bug == Bug::DoubleBias {
            return Ok(None);
        }
        let (rows, cols) = t.dims2();
        let mut m = Fp8Matrix::quantize(rows, cols, &t.to_f32_vec()).unwrap();
        let shifted = |m: &Fp8Matrix, r: usize| m.scales[(r + 1) % m.rows];
        match self.bug {
            Bug::NeighbourScale => {
                m.scales = (0..rows).map(|r| shifted(&m, r)).collect();
            }
            Bug::OneChannelScale if name == "model.layers.0.mlp.down_proj.weight" => {
                m.scales[0] = shifted(&m, 0);
            }
            _ => {}
        }
        Ok(Some(m))
    }
}

/// The bf16-device twins of the reference the calibration runs: (whether
/// linear inputs are rounded to bf16, whether tables are, nearest or toward
/// zero). Four realizations of the same-sized difference; [`HELD_OUT`] is
/// a fifth, kept out to stand in for a device in the CPU tests.
pub const TWINS: [(bool, Option<bool>); 4] = [
    (true, None),
    (false, Some(true)),
    (false, Some(false)),
    (true, Some(true)),
];
/// The twin the CPU tests check against the calibration as a device would be.
pub const HELD_OUT: (bool, Option<bool>) = (true, Some(false));

/// The trace of the CPU FP8 reference on `src` as twin `twin` sees it.
pub fn twin_trace(
    cfg: &ModelConfig,
    src: &dyn WeightSource,
    twin: (bool, Option<bool>),
    trace: &Trace<'_>,
) -> Logits {
    let (inputs, tables) = twin;
    let b = cpu_fp8(inputs);
    match tables {
        None => trace.run(b, cfg, src),
        Some(nearest) => trace.run(b, cfg, &Bf16Tables { src, nearest }),
    }
}

/// The golden prompts of `golden` (a golden.json) and `steps` tokens to
/// force after each: its greedy output where it has one, else token 3.
pub fn golden_inputs(golden: &serde_json::Value, steps: usize) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let entries = golden["prompts"].as_array().expect("golden prompts");
    let prompts = entries.iter().map(|p| ids(&p["prompt_ids"])).collect();
    let forced = entries
        .iter()
        .map(|p| match p.get("output_ids") {
            Some(o) => ids(o)[..steps].to_vec(),
            None => vec![3; steps],
        })
        .collect();
    (prompts, forced)
}

/// KV blocks for a trace of `steps` tokens after `prompts`, each sequence
/// on pages of its own.
pub fn blocks_for(prompts: &[Vec<u32>], steps: usize) -> usize {
    prompts
        .iter()
        .map(|p| (p.len() + steps + 1).div_ceil(BLOCK_SIZE))
        .sum::<usize>()
        + 4
}

/// `logits[prompt][step]`.
pub type Logits = Vec<Vec<Vec<f32>>>;

/// A batched teacher-forced trace: the prompts, the tokens forced after
/// them, and the KV blocks it needs.
pub struct Trace<'a> {
    pub prompts: &'a [Vec<u32>],
    pub forced: &'a [Vec<u32>],
    pub blocks: usize,
}

impl Trace<'_> {
    pub fn run<B: pagoda_kernels::Backend>(
        &self,
        b: B,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
    ) -> Logits {
        forced_trace(
            &mut runner(b, cfg, src, self.blocks),
            self.prompts,
            self.forced,
        )
    }
}

/// The reference, the exact model, and the chaos level of one model and
/// trace, measured on the CPU.
pub struct Calibration {
    /// The CPU FP8 reference.
    pub reference: Logits,
    /// The same model without FP8 (f32 weights and activations), when given.
    pub exact: Option<Logits>,
    /// `drift[step]`: the largest relative L2 distance, over the prompts
    /// and the [`TWINS`], between the reference and a twin.
    pub drift: Vec<f32>,
    /// The largest mean error against `exact` (over prompts and steps) of
    /// the reference and its twins: the FP8 error of a correct
    /// implementation seeing bf16-level differences.
    pub accuracy: Option<f32>,
}

/// Runs the CPU FP8 reference on `src`, its [`TWINS`], and (with
/// `exact_src`) the model without FP8, over `trace`.
pub fn calibrate(
    cfg: &ModelConfig,
    src: &dyn WeightSource,
    exact_src: Option<&dyn WeightSource>,
    trace: &Trace<'_>,
) -> Calibration {
    let reference = trace.run(cpu_fp8(false), cfg, src);
    let exact = exact_src.map(|e| {
        let b = CpuBackend::new(CpuOptions {
            threads: 2,
            weight_dtype: WeightDtype::F32,
        })
        .unwrap();
        trace.run(b, cfg, e)
    });
    let mut drift = vec![0f32; reference.first().map_or(0, |r| r.len())];
    let mut accuracy = exact.as_ref().map(|e| mean_error(&reference, e));
    for twin in TWINS {
        let t = twin_trace(cfg, src, twin, trace);
        for (d, e) in drift.iter_mut().zip(step_errors(&t, &reference)) {
            *d = d.max(e);
        }
        if let (Some(a), Some(e)) = (accuracy.as_mut(), exact.as_ref()) {
            *a = a.max(mean_error(&t, e));
        }
    }
    Calibration {
        reference,
        exact,
        drift,
        accuracy,
    }
}

/// `err[step]`: the largest relative L2 error over the prompts at each
/// step (a NaN counts as infinite).
pub fn step_errors(got: &Logits, want: &Logits) -> Vec<f32> {
    assert_eq!(got.len(), want.len(), "prompts");
    let steps = want.first().map_or(0, |w| w.len());
    (0..steps)
        .map(|s| {
            got.iter()
                .zip(want)
                .map(|(g, w)| {
                    assert_eq!(g.len(), w.len(), "steps");
                    let e = rel_l2(&g[s], &w[s]);
                    if e.is_nan() {
                        f32::INFINITY
                    } else {
                        e
                    }
                })
                .fold(0f32, f32::max)
        })
        .collect()
}

/// The mean relative L2 error over every prompt and step.
pub fn mean_error(got: &Logits, want: &Logits) -> f32 {
    let errs: Vec<f32> = got
        .iter()
        .zip(want)
        .flat_map(|(g, w)| g.iter().zip(w).map(|(a, b)| rel_l2(a, b)))
        .collect();
    let m = errs.iter().sum::<f32>() / errs.len().max(1) as f32;
    if m.is_nan() {
        f32::INFINITY
    } else {
        m
    }
}

/// The outcome of checking a trace against a [`Calibration`].
pub struct Verdict {
    /// One line per step, then the accuracy line.
    pub report: String,
    pub pass: bool,
    /// The worst step's error over its bar.
    pub drift_ratio: f32,
    /// The mean error against the exact model over its bar.
    pub accuracy_ratio: Option<f32>,
}

impl Calibration {
    /// The per-step bar: [`DRIFT_FACTOR`] times the largest calibrated
    /// drift up to that step, at least [`FLOOR`].
    pub fn bar(&self) -> Vec<f32> {
        let mut worst = 0f32;
        self.drift
            .iter()
            .map(|&d| {
                worst = worst.max(d);
                (DRIFT_FACTOR * worst).max(FLOOR)
            })
            .collect()
    }

    /// Checks `got` (another implementation of the same FP8 model on the
    /// same trace): every step within [`Calibration::bar`] of the
    /// reference, and its mean error against the exact model within
    /// `1 + ACCURACY_MARGIN` times [`Calibration::accuracy`].
    pub fn check(&self, got: &Logits) -> Verdict {
        let err = step_errors(got, &self.reference);
        let bar = self.bar();
        let mut pass = true;
        let mut drift_ratio = 0f32;
        let mut lines = Vec::new();
        for (s, ((&e, &d), &b)) in err.iter().zip(&self.drift).zip(&bar).enumerate() {
            pass &= e <= b;
            drift_ratio = drift_ratio.max(e / b);
            lines.push(format!(
                "  step {s}: vs reference {e:.4} (calibrated drift {d:.4}, bar {b:.4}){}",
                if e <= b { "" } else { "  OVER" }
            ));
        }
        let mut accuracy_ratio = None;
        if let (Some(exact), Some(acc)) = (&self.exact, self.accuracy) {
            let m = mean_error(got, exact);
            let b = acc * (1.0 + ACCURACY_MARGIN);
            pass &= m <= b;
            accuracy_ratio = Some(m / b);
            lines.push(format!(
                "  mean error vs the model without FP8 {m:.4} (reference and twins up to {acc:.4}, \
                 bar {b:.4}){}",
                if m <= b { "" } else { "  OVER" }
            ));
        }
        Verdict {
            report: lines.join("\n"),
            pass,
            drift_ratio,
            accuracy_ratio,
        }
    }
}
