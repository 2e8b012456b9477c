//! What a loaded model costs in memory: the model file's size, the KV
//! cache's bytes and this process's resident memory once both are in place,
//! with the overhead over file + KV cache (`pagoda info --load`, and the
//! `pagoda bench single` JSON).
//!
//! Resident memory is the host's (`VmRSS`, Linux only; elsewhere `None`):
//! on the CPU it holds the weights and the KV cache, on CUDA only what the
//! host keeps.

use pagoda_engine::LlmEngine;
use pagoda_kernels::Backend;
use serde::Serialize;
use std::path::Path;

const MIB: f64 = 1024.0 * 1024.0;

/// Resident memory of this process in MiB (`VmRSS` of /proc/self/status).
pub fn rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Sizes of a loaded model, in MiB.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LoadedMemory {
    /// The model file (a GGUF file, or a directory's safetensors); `None`
    /// for dummy weights.
    pub file_mib: Option<f64>,
    /// The KV cache as allocated.
    pub kv_cache_mib: f64,
    /// Resident memory once the model is loaded and the KV cache allocated
    /// (on the CPU the cache is allocated zeroed: its pages become resident
    /// as steps first write them, so this counts the weights and runtime).
    pub rss_after_load_mib: Option<f64>,
    /// `rss_after_load / (file + kv cache) - 1`, where both are known.
    pub over_file_and_kv: Option<f64>,
}

impl LoadedMemory {
    /// Reads the figures of `engine`, just built from `model` (call it before
    /// any step runs, so activations are not counted).
    pub fn of<B: Backend>(engine: &LlmEngine<B>, model: Option<&Path>) -> LoadedMemory {
        let kv_bytes = engine.runner().kv_cache_bytes();
        let file_mib = model.and_then(model_file_bytes).map(|b| b as f64 / MIB);
        let kv_cache_mib = kv_bytes as f64 / MIB;
        let rss_after_load_mib = rss_mib();
        let over_file_and_kv = match (file_mib, rss_after_load_mib) {
            (Some(f), Some(r)) if f + kv_cache_mib > 0.0 => Some(r / (f + kv_cache_mib) - 1.0),
            _ => None,
        };
        LoadedMemory {
            file_mib,
            kv_cache_mib,
            rss_after_load_mib,
            over_file_and_kv,
        }
    }

    /// The text lines of `pagoda info --load`.
    pub fn describe(&self, backend: &str) -> String {
        let mib = |v: Option<f64>| v.map_or("unknown".to_string(), |v| format!("{v:.1} MiB"));
        let mut s = format!("loaded on:            {backend}\n");
        s += &format!("model file:           {}\n", mib(self.file_mib));
        s += &format!("kv cache:             {:.1} MiB\n", self.kv_cache_mib);
        s += &format!(
            "resident after load:  {}{}\n",
            mib(self.rss_after_load_mib),
            self.over_file_and_kv.map_or(String::new(), |o| format!(
                " (file + kv cache {:+.1}%)",
                100.0 * o
            ))
        );
        s
    }
}

/// Bytes of the model's weight files: a file's own size, or a directory's
/// `*.safetensors` files together.
fn model_file_bytes(path: &Path) -> Option<u64> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.is_file() {
        return Some(meta.len());
    }
    let mut total = 0;
    for entry in std::fs::read_dir(path).ok()? {
        let p = entry.ok()?.path();
        if p.extension().and_then(|e| e.to_str()) == Some("safetensors") {
            total += std::fs::metadata(&p).ok()?.len();
        }
    }
    Some(total)
}
