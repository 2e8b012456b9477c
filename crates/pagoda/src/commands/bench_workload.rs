//! Workload files of `pagoda bench`: one request per JSONL line,
//! `{"prompt_token_ids": [...], "max_tokens": N, "temperature": T}`
//! (temperature optional). `--save-workload` writes the draw a run uses and
//! `--workload` runs a saved one, so a peer engine can be measured on the
//! identical requests (the vLLM peer script reads the same format).
//!
//! Loading validates every line (ids within the vocabulary, max_tokens at
//! least 1, temperature finite and >= 0) and names the line of the first
//! error; nothing is run from a partly bad file.

use anyhow::{bail, Context, Result};
use pagoda_core::SamplingParams;
use pagoda_engine::EngineRequest;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    prompt_token_ids: Vec<u32>,
    max_tokens: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
}

/// Writes `requests` as a workload file.
pub fn save(path: &Path, requests: &[EngineRequest]) -> Result<()> {
    let file = std::fs::File::create(path)
        .with_context(|| format!("cannot create workload file {}", path.display()))?;
    let mut out = BufWriter::new(file);
    for r in requests {
        let line = Line {
            prompt_token_ids: r.prompt_token_ids.clone(),
            max_tokens: r.params.max_tokens,
            temperature: Some(r.params.temperature),
        };
        serde_json::to_writer(&mut out, &line)?;
        out.write_all(b"\n")?;
    }
    out.flush()
        .with_context(|| format!("cannot write workload file {}", path.display()))?;
    Ok(())
}

/// Reads a workload file into requests: ignore_eos, `default_temperature`
/// where a line has none, and request i seeded with `seed + i`.
pub fn load(
    path: &Path,
    vocab_size: usize,
    default_temperature: f32,
    seed: u64,
) -> Result<Vec<EngineRequest>> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot open workload file {}", path.display()))?;
    let mut requests = Vec::new();
    for (n, text) in BufReader::new(file).lines().enumerate() {
        let where_ = || format!("{} line {}", path.display(), n + 1);
        let text = text.with_context(where_)?;
        if text.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(&text).with_context(where_)?;
        if line.prompt_token_ids.is_empty() {
            bail!("{}: prompt_token_ids is empty", where_());
        }
        if let Some(&id) = line
            .prompt_token_ids
            .iter()
            .find(|&&id| id as usize >= vocab_size)
        {
            bail!(
                "{}: token id {id} is outside the vocabulary of {vocab_size}",
                where_()
            );
        }
        let params = SamplingParams {
            temperature: line.temperature.unwrap_or(default_temperature),
            max_tokens: line.max_tokens,
            ignore_eos: true,
            seed: Some(seed.wrapping_add(requests.len() as u64)),
            ..SamplingParams::default()
        };
        params
            .validate()
            .map_err(|e| anyhow::anyhow!("{}: {e}", where_()))?;
        requests.push(EngineRequest {
            prompt_token_ids: line.prompt_token_ids,
            params,
            logprobs: None,
        });
    }
    if requests.is_empty() {
        bail!("workload file {} has no requests", path.display());
    }
    Ok(requests)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch file of this test process, removed when dropped.
    struct Scratch(std::path::PathBuf);
    impl Scratch {
        fn new(name: &str) -> Self {
            let pid = std::process::id();
            Scratch(std::env::temp_dir().join(format!("pagoda-workload-{pid}-{name}.jsonl")))
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn request(ids: Vec<u32>, max_tokens: usize, temperature: f32) -> EngineRequest {
        EngineRequest {
            prompt_token_ids: ids,
            params: SamplingParams {
                temperature,
                max_tokens,
                ..SamplingParams::default()
            },
            logprobs: None,
        }
    }

    #[test]
    fn a_saved_workload_loads_back_identically() {
        let scratch = Scratch::new("roundtrip");
        let path = &scratch.0;
        let saved = vec![request(vec![1, 2, 3], 7, 0.6), request(vec![9], 1, 0.0)];
        save(path, &saved).unwrap();
        let loaded = load(path, 10, 1.0, 5).unwrap();
        assert_eq!(loaded.len(), 2);
        for (i, (a, b)) in saved.iter().zip(&loaded).enumerate() {
            assert_eq!(a.prompt_token_ids, b.prompt_token_ids);
            assert_eq!(a.params.max_tokens, b.params.max_tokens);
            assert_eq!(a.params.temperature, b.params.temperature);
            assert!(b.params.ignore_eos);
            assert_eq!(b.params.seed, Some(5 + i as u64));
        }
    }

    #[test]
    fn bad_lines_are_refused_with_their_line_number() {
        let scratch = Scratch::new("bad");
        let path = &scratch.0;
        let cases = [
            (
                "{\"prompt_token_ids\": [1, 99], \"max_tokens\": 4}",
                "outside the vocabulary",
            ),
            ("{\"prompt_token_ids\": [], \"max_tokens\": 4}", "empty"),
            (
                "{\"prompt_token_ids\": [1], \"max_tokens\": 0}",
                "max_tokens",
            ),
            (
                "{\"prompt_token_ids\": [1], \"max_tokens\": 2, \"temperature\": -1}",
                "temperature",
            ),
            (
                "{\"prompt_token_ids\": [1], \"max_tokens\": 2, \"top_q\": 1}",
                "top_q",
            ),
            ("not json", "line 2"),
        ];
        for (bad, expect) in cases {
            let text = format!("{{\"prompt_token_ids\": [1], \"max_tokens\": 2}}\n{bad}\n");
            std::fs::write(path, text).unwrap();
            let err = format!("{:#}", load(path, 10, 0.6, 0).unwrap_err());
            assert!(err.contains("line 2"), "{bad}: {err}");
            assert!(err.contains(expect), "{bad}: {err}");
        }
        std::fs::write(path, "\n").unwrap();
        assert!(load(path, 10, 0.6, 0).is_err());
    }
}
