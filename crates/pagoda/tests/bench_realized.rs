//! `pagoda bench --save-realized`: a run under a JSON schema whose documents
//! close early writes each request's real token count, and replaying that
//! file unconstrained generates exactly those counts (the like-for-like
//! comparison of constrained and unconstrained throughput).

// Each test binary uses a part of the shared helpers.
#[allow(dead_code)]
mod common;

use common::{default_model, pagoda, workspace_root, Temp};
use serde_json::Value;

fn bench_json(args: &[&str]) -> Value {
    let out = pagoda(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().last().unwrap()).unwrap()
}

fn max_tokens(path: &str) -> Vec<u64> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["max_tokens"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

#[test]
fn realized_lengths_replay_unconstrained() {
    let model = default_model();
    let model = model.to_str().unwrap();
    let schema = workspace_root().join("tests/bench_schema.json");
    let drawn = Temp::new("drawn.jsonl");
    let realized = Temp::new("realized.jsonl");
    let common = [
        "bench",
        "--model",
        model,
        "--kv-cache-memory",
        "64MiB",
        "--num-seqs",
        "4",
        "--min-input",
        "16",
        "--max-input",
        "32",
    ];
    let mut args = common.to_vec();
    args.extend([
        "--min-output",
        "150",
        "--max-output",
        "200",
        "--json-schema",
        schema.to_str().unwrap(),
        "--save-workload",
        drawn.path(),
        "--save-realized",
        realized.path(),
    ]);
    let constrained = bench_json(&args);
    let (asked, got) = (max_tokens(drawn.path()), max_tokens(realized.path()));
    assert_eq!(asked.len(), 4);
    assert_eq!(got.len(), 4);
    assert!(
        asked.iter().zip(&got).all(|(a, g)| g <= a),
        "{asked:?} {got:?}"
    );
    assert!(
        got.iter().sum::<u64>() < asked.iter().sum::<u64>(),
        "the documents close early: {got:?}"
    );
    assert_eq!(
        constrained["output_tokens"].as_u64().unwrap(),
        got.iter().sum::<u64>()
    );
    // Unconstrained on the realized file: the same counts.
    let replay = bench_json(&[
        "bench",
        "--model",
        model,
        "--kv-cache-memory",
        "64MiB",
        "--workload",
        realized.path(),
    ]);
    assert_eq!(
        replay["output_tokens"].as_u64().unwrap(),
        got.iter().sum::<u64>()
    );
    assert!(replay["json_schema"].is_null());
}
