//! The on-disk table of tuned cuBLASLt algorithms, and the tuning switch.
//!
//! [`super::blaslt_tune`] times several of cuBLASLt's heuristic candidates
//! for each GEMM plan (output features `m`, row bucket `n`, inner `k`,
//! mode: bf16 or FP8 operands, the FP8 scaling, the output) and keeps the
//! fastest. This module owns what survives a
//! restart: a text file under `$XDG_CACHE_HOME/pagoda/gemm/` (or
//! `~/.cache/pagoda/gemm/`), one per GPU name and cuBLASLt version, whose
//! first line repeats that key (plus the workspace size and a format
//! version, which the choice also depends on) and whose other lines are
//! `m n k mode` and the algorithm's eight 64-bit words in hex (cuBLASLt
//! documents `cublasLtMatmulAlgo_t` as trivially serializable for the same
//! library version). A file with another first line is ignored as a whole,
//! a malformed line alone; an algorithm read back is checked by cuBLASLt
//! (`cublasLtMatmulAlgoCheck`) before use, so a stale or damaged file
//! costs a re-timing, never a wrong GEMM. Writes go through a temporary
//! name, so a reader never sees half a file; failures to write are ignored
//! (the cache is an optimization).
//!
//! `PAGODA_GEMM_TUNING`: `on` (cached choices, else timed),
//! `off` (the default: cuBLASLt's first heuristic choice, no file read or written) or
//! `refresh` (time every plan again and rewrite the file's entries).

use crate::{KernelError, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The environment variable that picks the [`GemmTuning`] mode.
pub const GEMM_TUNING_ENV: &str = "PAGODA_GEMM_TUNING";

/// Format version of the cache file (part of its first line).
const FORMAT: u32 = 1;

/// How the CUDA backend picks each GEMM plan's cuBLASLt algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GemmTuning {
    /// cuBLASLt's first heuristic result, as chosen without timing (the
    /// default: on an H200 the timed choices were 5-16% faster at 64-256
    /// rows but up to 14% slower at 2,048-8,192 rows than at warm-up).
    #[default]
    Off,
    /// A cached choice where the disk cache has one, else the fastest of
    /// several heuristic candidates timed on the device (while warming up).
    On,
    /// Like `On`, but every plan is timed again (the cache is rewritten).
    Refresh,
}

impl GemmTuning {
    /// Parses `off`, `on` or `refresh` (also `0`/`false`, `1`/`true`).
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "0" | "false" | "no" => Ok(GemmTuning::Off),
            "on" | "1" | "true" | "yes" => Ok(GemmTuning::On),
            "" => Ok(GemmTuning::Off),
            "refresh" => Ok(GemmTuning::Refresh),
            other => Err(KernelError::Unsupported(format!(
                "{GEMM_TUNING_ENV}={other:?} (expected off, on or refresh)"
            ))),
        }
    }

    /// The mode `PAGODA_GEMM_TUNING` asks for (`Off` when unset).
    pub fn from_env() -> Result<Self> {
        match std::env::var(GEMM_TUNING_ENV) {
            Ok(v) => Self::parse(&v),
            Err(std::env::VarError::NotPresent) => Ok(GemmTuning::Off),
            Err(e) => Err(KernelError::Unsupported(format!("{GEMM_TUNING_ENV}: {e}"))),
        }
    }
}

/// A plan's identity: output features, row bucket, inner size and the
/// mode's tag (see `Mode::tag` in `blaslt.rs`; a tag not in [`MODE_TAGS`]
/// makes its line malformed).
pub(crate) type AlgoKey = (u64, u64, u64, &'static str);

/// The mode tags a key may carry (operands, FP8 scaling, output).
pub(crate) const MODE_TAGS: [&str; 6] = [
    "bf16",
    "acc_f32",
    "fp8_outer",
    "fp8_outer_acc_f32",
    "fp8_unit_f32",
    "fp8_unit_acc_f32",
];

/// An algorithm's opaque words (`cublasLtMatmulAlgo_t::data`).
pub(crate) type AlgoWords = [u64; 8];

/// The first line of a cache file for this GPU and library.
pub(crate) fn header(gpu: &str, lt_version: usize, workspace: usize) -> String {
    let gpu: String = gpu
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    format!(
        "# pagoda gemm algorithms v{FORMAT}; gpu {}; cublaslt {lt_version}; workspace {workspace}",
        gpu.trim()
    )
}

/// Where the table of this GPU and library lives (`None` without a home).
pub(crate) fn cache_file(gpu: &str, lt_version: usize) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let name: String = gpu
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    Some(base.join("pagoda").join("gemm").join(format!(
        "{}-cublaslt{lt_version}.txt",
        name.trim_matches('-')
    )))
}

/// The entries of a cache file's text; empty when its first line is not
/// `header`. Malformed lines are skipped.
pub(crate) fn parse(text: &str, header: &str) -> HashMap<AlgoKey, AlgoWords> {
    let mut lines = text.lines();
    if lines.next().map(str::trim_end) != Some(header) {
        return HashMap::new();
    }
    lines.filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<(AlgoKey, AlgoWords)> {
    let mut f = line.split_ascii_whitespace();
    let m = f.next()?.parse().ok()?;
    let n = f.next()?.parse().ok()?;
    let k = f.next()?.parse().ok()?;
    let tag = f.next()?;
    let tag = *MODE_TAGS.iter().find(|t| **t == tag)?;
    let mut words = [0u64; 8];
    for w in &mut words {
        *w = u64::from_str_radix(f.next()?, 16).ok()?;
    }
    if f.next().is_some() {
        return None;
    }
    Some(((m, n, k, tag), words))
}

/// The text of a cache file: `header`, then one line per entry in key order.
pub(crate) fn format(header: &str, entries: &HashMap<AlgoKey, AlgoWords>) -> String {
    let sorted: BTreeMap<_, _> = entries.iter().collect();
    let mut s = String::with_capacity(64 + sorted.len() * 180);
    s.push_str(header);
    s.push('\n');
    for ((m, n, k, tag), words) in sorted {
        s.push_str(&std::format!("{m} {n} {k} {tag}"));
        for w in words {
            s.push_str(&std::format!(" {w:016x}"));
        }
        s.push('\n');
    }
    s
}

/// Reads a cache file (empty when missing, unreadable or of another key).
pub(crate) fn load(path: &Path, header: &str) -> HashMap<AlgoKey, AlgoWords> {
    std::fs::read_to_string(path)
        .map(|t| parse(&t, header))
        .unwrap_or_default()
}

/// Writes a cache file through a temporary name; `false` where it failed.
pub(crate) fn store(path: &Path, text: &str) -> bool {
    let Some(dir) = path.parent() else {
        return false;
    };
    if std::fs::create_dir_all(dir).is_err() {
        return false;
    }
    let tmp = path.with_extension(std::format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, text).is_ok() {
        if std::fs::rename(&tmp, path).is_ok() {
            return true;
        }
        let _ = std::fs::remove_file(&tmp);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> HashMap<AlgoKey, AlgoWords> {
        let mut e = HashMap::new();
        e.insert((6144, 256, 4096, "bf16"), [1, 2, 3, 4, 5, 6, 7, u64::MAX]);
        e.insert((4096, 256, 4096, "acc_f32"), [0; 8]);
        e.insert((28672, 8192, 4096, "fp8_outer_acc_f32"), [0xdead_beef; 8]);
        e.insert((28672, 1168, 4096, "fp8_unit_f32"), [7; 8]);
        e
    }

    #[test]
    fn a_cache_file_round_trips() {
        let h = header("NVIDIA H200", 130_100, 32 << 20);
        let text = format(&h, &sample());
        assert!(text.starts_with(&h));
        assert_eq!(text.lines().count(), 5);
        assert_eq!(parse(&text, &h), sample());
        // Key order, so equal tables give equal files.
        assert_eq!(format(&h, &parse(&text, &h)), text);
    }

    #[test]
    fn another_gpu_library_or_workspace_reads_as_empty() {
        let h = header("NVIDIA H200", 130_100, 32 << 20);
        let text = format(&h, &sample());
        for other in [
            header("NVIDIA H100 80GB HBM3", 130_100, 32 << 20),
            header("NVIDIA H200", 130_200, 32 << 20),
            header("NVIDIA H200", 130_100, 4 << 20),
        ] {
            assert!(parse(&text, &other).is_empty(), "{other}");
        }
        assert!(parse("", &h).is_empty());
    }

    #[test]
    fn malformed_lines_are_skipped_alone() {
        let h = header("gpu", 1, 2);
        let good = "4096 256 4096 bf16 0 0 0 0 0 0 0 1";
        let text = [
            h.as_str(),
            good,
            "4096 256 4096 bf16 0 0 0 0 0 0 0",     // seven words
            "4096 256 4096 bf16 0 0 0 0 0 0 0 1 2", // nine words
            "4096 256 4096 int8 0 0 0 0 0 0 0 1",   // unknown mode
            "4096 256 4096 fp8 0 0 0 0 0 0 0 1",    // FP8 without its scaling
            "4096 x 4096 bf16 0 0 0 0 0 0 0 1",     // not a number
            "4096 512 4096 bf16 0 0 0 0 0 0 0 zz",  // not hex
            "",
            "garbage",
        ]
        .join("\n");
        let got = parse(&text, &h);
        assert_eq!(got.len(), 1);
        assert_eq!(got[&(4096, 256, 4096, "bf16")], [0, 0, 0, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn store_and_load_through_a_file() {
        let dir =
            std::env::temp_dir().join(std::format!("pagoda-gemm-cache-{}", std::process::id()));
        let path = dir.join("sub").join("t.txt");
        let h = header("gpu", 7, 8);
        assert!(store(&path, &format(&h, &sample())));
        assert_eq!(load(&path, &h), sample());
        assert!(load(&dir.join("missing.txt"), &h).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn cache_file_names_are_plain() {
        let p = cache_file("NVIDIA H200 (SXM) / x", 130_100);
        if let Some(p) = p {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            assert_eq!(name, "NVIDIA-H200--SXM----x-cublaslt130100.txt");
            assert!(p.parent().unwrap().ends_with("pagoda/gemm"));
        }
    }

    #[test]
    fn tuning_modes_parse() {
        assert_eq!(GemmTuning::parse("off").unwrap(), GemmTuning::Off);
        assert_eq!(GemmTuning::parse(" OFF ").unwrap(), GemmTuning::Off);
        assert_eq!(GemmTuning::parse("0").unwrap(), GemmTuning::Off);
        assert_eq!(GemmTuning::parse("on").unwrap(), GemmTuning::On);
        assert_eq!(GemmTuning::parse("").unwrap(), GemmTuning::Off);
        assert_eq!(GemmTuning::parse("refresh").unwrap(), GemmTuning::Refresh);
        let e = GemmTuning::parse("fast").unwrap_err().to_string();
        assert!(e.contains(GEMM_TUNING_ENV) && e.contains("fast"), "{e}");
    }
}
