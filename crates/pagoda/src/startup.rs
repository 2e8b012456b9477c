//! The start-up report: where the seconds from opening the device to a
//! ready engine went, phase by phase (device and kernels, weights read or
//! generated, weights converted and uploaded, profiling steps, KV cache
//! allocation, graph capture, engine start), logged at info level once the
//! engine is built and kept for `pagoda bench`'s JSON.
//!
//! Guarantees: phases keep the order they were added in; `total` is the
//! wall time from the report's creation to its [`StartupReport::finish`],
//! so time no phase names shows as `other` (total minus the top-level
//! phases). Sub-phases (a name with a `.`, e.g. `device.kernels_compile`)
//! detail a top-level phase and are not counted twice.

use pagoda_kernels::{Fp8Matrix, HostTensor};
use pagoda_model::loader::{TensorInfo, WeightSource};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Phase times of one engine start.
#[derive(Debug, Clone)]
pub struct StartupReport {
    started: Instant,
    phases: Vec<(String, f64)>,
    total: Option<f64>,
}

/// The report of the last engine built in this process.
static LAST: Mutex<Option<StartupReport>> = Mutex::new(None);

impl StartupReport {
    /// A report whose clock starts now.
    pub fn start() -> Self {
        StartupReport {
            started: Instant::now(),
            phases: Vec::new(),
            total: None,
        }
    }

    /// Adds `secs` to phase `name` (created at the end when new).
    pub fn add(&mut self, name: &str, secs: f64) {
        match self.phases.iter_mut().find(|(n, _)| n == name) {
            Some((_, s)) => *s += secs,
            None => self.phases.push((name.to_string(), secs)),
        }
    }

    /// Puts phase `name` first and adds its seconds to the total: time
    /// spent before the report's clock started (opening the model files).
    pub fn prepend(&mut self, name: &str, secs: f64) {
        self.phases.insert(0, (name.to_string(), secs));
        self.total = Some(self.total() + secs);
    }

    /// Runs `f` as phase `name`.
    pub fn time<T>(&mut self, name: &str, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        self.add(name, t.elapsed().as_secs_f64());
        out
    }

    /// Seconds of phase `name`, if it ran.
    #[cfg(test)]
    pub fn get(&self, name: &str) -> Option<f64> {
        self.phases.iter().find(|(n, _)| n == name).map(|(_, s)| *s)
    }

    /// Stops the clock, logs the report at info level and keeps it as the
    /// process's last one ([`last`]).
    pub fn finish(mut self) -> StartupReport {
        let total = self.started.elapsed().as_secs_f64();
        let named: f64 = self.top_level().map(|(_, s)| s).sum();
        self.total = Some(total);
        if total - named > 0.0005 {
            self.phases.push(("other".to_string(), total - named));
        }
        tracing::info!("start-up: {}", self.line());
        if let Ok(mut last) = LAST.lock() {
            *last = Some(self.clone());
        }
        self
    }

    fn top_level(&self) -> impl Iterator<Item = (&str, f64)> {
        self.phases
            .iter()
            .filter(|(n, _)| !n.contains('.'))
            .map(|(n, s)| (n.as_str(), *s))
    }

    /// Total wall seconds (so far, before `finish`).
    pub fn total(&self) -> f64 {
        self.total
            .unwrap_or_else(|| self.started.elapsed().as_secs_f64())
    }

    /// One line: each phase's seconds, then the total.
    pub fn line(&self) -> String {
        let mut parts: Vec<String> = self
            .phases
            .iter()
            .map(|(n, s)| format!("{n} {s:.2} s"))
            .collect();
        parts.push(format!("total {:.2} s", self.total()));
        parts.join(", ")
    }

    /// `{phase: seconds, ..., "total": seconds}` (milliseconds precision).
    pub fn to_json(&self) -> serde_json::Value {
        let round = |s: f64| (s * 1000.0).round() / 1000.0;
        let mut m = serde_json::Map::new();
        for (n, s) in &self.phases {
            m.insert(n.clone(), round(*s).into());
        }
        m.insert("total".into(), round(self.total()).into());
        serde_json::Value::Object(m)
    }
}

/// The report of the last engine built in this process, if any.
pub fn last() -> Option<StartupReport> {
    LAST.lock().ok().and_then(|l| l.clone())
}

/// A weight source that counts the time spent inside it (reading,
/// dequantizing or generating tensors), so the rest of a model build is
/// the backend's conversion and upload.
pub struct TimedSource<'a> {
    inner: &'a dyn WeightSource,
    nanos: AtomicU64,
}

impl<'a> TimedSource<'a> {
    pub fn new(inner: &'a dyn WeightSource) -> Self {
        TimedSource {
            inner,
            nanos: AtomicU64::new(0),
        }
    }

    /// Seconds spent in the source so far.
    pub fn secs(&self) -> f64 {
        self.nanos.load(Ordering::Relaxed) as f64 * 1e-9
    }

    fn timed<T>(&self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        let ns = t.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.nanos.fetch_add(ns, Ordering::Relaxed);
        out
    }
}

impl WeightSource for TimedSource<'_> {
    fn tensor_infos(&self) -> Vec<TensorInfo> {
        self.timed(|| self.inner.tensor_infos())
    }
    fn get(&self, name: &str) -> pagoda_model::Result<HostTensor> {
        self.timed(|| self.inner.get(name))
    }
    fn get_stored(&self, name: &str) -> pagoda_model::Result<HostTensor> {
        self.timed(|| self.inner.get_stored(name))
    }
    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name)
    }
    fn get_fp8(&self, name: &str) -> pagoda_model::Result<Option<Fp8Matrix>> {
        self.timed(|| self.inner.get_fp8(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_add_up_and_other_takes_the_rest() {
        let mut r = StartupReport::start();
        r.add("weights_read", 0.25);
        r.add("weights_read", 0.25);
        r.add("device", 0.1);
        r.add("device.kernels_compile", 0.08);
        let x = r.time("graphs", || 7);
        assert_eq!(x, 7);
        std::thread::sleep(std::time::Duration::from_millis(5));
        let r = r.finish();
        assert_eq!(r.get("weights_read"), Some(0.5));
        let total = r.total();
        assert!(total >= 0.005);
        // Sub-phases are not counted twice: top-level phases plus `other`
        // make the total (other clamps at zero when phases exceed it).
        let top: f64 = r.top_level().map(|(_, s)| s).sum();
        if r.get("other").is_some() {
            assert!((top - total).abs() < 1e-9, "{top} vs {total}");
        }
        let j = r.to_json();
        assert_eq!(j["weights_read"], 0.5);
        assert_eq!(j["device.kernels_compile"], 0.08);
        assert!(j["total"].as_f64().unwrap() >= 0.005);
        let line = r.line();
        assert!(
            line.starts_with("weights_read 0.50 s, device 0.10 s"),
            "{line}"
        );
        assert!(line.ends_with(" s") && line.contains("total "), "{line}");
        assert!(last().is_some());
        let mut r = r;
        r.prepend("open", 1.0);
        assert!((r.total() - total - 1.0).abs() < 1e-9);
        assert!(r.line().starts_with("open 1.00 s, weights_read"));
    }

    #[test]
    fn timed_source_answers_as_its_source_and_counts_its_time() {
        use pagoda_model::loader::dummy::DummySource;
        let cfg = pagoda_model::loader::hf_config::parse_hf_config(
            r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 100,
                "max_position_embeddings": 128, "rms_norm_eps": 1e-5}"#,
            None,
        )
        .unwrap();
        let src = DummySource::new(&cfg).unwrap();
        let timed = TimedSource::new(&src);
        let name = "model.embed_tokens.weight";
        assert!(timed.contains(name));
        let a = timed.get(name).unwrap();
        let b = src.get(name).unwrap();
        assert_eq!(a.shape, b.shape);
        assert_eq!(a.to_f32_vec(), b.to_f32_vec());
        assert!(timed.secs() > 0.0);
        assert!(timed.get("no.such.tensor").is_err());
    }
}
