//! Helpers for the CLI tests: running the built `pagoda` binary, checking a
//! clean failure (non-zero exit, named cause, no panic), temp paths removed
//! on drop, and locating the default model and golden files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn default_model() -> PathBuf {
    let p = workspace_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-default-model.sh",
        p.display()
    );
    p
}

/// A path in the temp directory, removed (file or directory) on drop.
pub struct Temp(pub PathBuf);

impl Temp {
    pub fn new(name: &str) -> Temp {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        Temp(std::env::temp_dir().join(format!(
            "pagoda-cli-errors-{}-{n}-{name}",
            std::process::id()
        )))
    }

    pub fn file(name: &str, bytes: &[u8]) -> Temp {
        let t = Temp::new(name);
        std::fs::write(&t.0, bytes).unwrap();
        t
    }

    /// A directory holding `files` (name, contents).
    pub fn dir(name: &str, files: &[(&str, &[u8])]) -> Temp {
        let t = Temp::new(name);
        std::fs::create_dir(&t.0).unwrap();
        for (f, bytes) in files {
            std::fs::write(t.0.join(f), bytes).unwrap();
        }
        t
    }

    pub fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = if self.0.is_dir() {
            std::fs::remove_dir_all(&self.0)
        } else {
            std::fs::remove_file(&self.0)
        };
    }
}

pub fn pagoda(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pagoda"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

/// Runs `args`, checks that it succeeds (showing stderr where not) and
/// parses its stdout as one JSON value.
#[track_caller]
pub fn succeeds_with_json(args: &[&str]) -> serde_json::Value {
    let out = pagoda(args);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Runs `args` and checks for a clean failure whose stderr names every phrase.
#[track_caller]
pub fn fails_with(args: &[&str], phrases: &[&str]) -> String {
    let out = pagoda(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "{args:?} succeeded; stderr: {stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "{args:?} panicked: {stderr}"
    );
    for p in phrases {
        assert!(stderr.contains(p), "{args:?}: stderr lacks {p:?}: {stderr}");
    }
    stderr
}

/// Same as [`fails_with`] and, for errors pagoda reports itself (not clap's
/// usage errors), exactly one line starting with "error: " and no cause
/// printed twice.
#[track_caller]
pub fn fails_with_one_line(args: &[&str], phrases: &[&str]) -> String {
    let stderr = fails_with(args, phrases);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?}: not one line: {stderr}");
    assert!(lines[0].starts_with("error: "), "{args:?}: {stderr}");
    let parts: Vec<&str> = lines[0].split(": ").collect();
    for w in parts.windows(2) {
        assert_ne!(w[0], w[1], "{args:?}: a cause is printed twice: {stderr}");
    }
    stderr
}

pub fn info(model: &str) -> Vec<&str> {
    vec!["info", "--model", model]
}

/// The offset of the first occurrence of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{:?} not found", String::from_utf8_lossy(needle)))
}

/// A GGUF string as stored: u64 length, then the bytes.
pub fn gguf_string(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}
