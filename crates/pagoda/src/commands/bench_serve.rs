//! `pagoda bench serve`: a load generator for a running OpenAI-compatible
//! server (pagoda's or any other), in the manner of vLLM's `bench serve`.
//!
//! It builds `--num-prompts` prompts of random token ids ([`dataset`]),
//! sends them as streamed `POST /v1/completions` with Poisson arrivals at
//! `--request-rate` (or all at once for `inf`), at most `--max-concurrency`
//! in flight, and prints one JSON line of throughput and latency percentiles
//! ([`metrics::Summary`]). Requests wait for a concurrency slot after their
//! arrival time, and their clock starts when they are sent.
//!
//! Exit status: 0 when at least one request completed; otherwise an error
//! naming the first failure (after the JSON line).

mod client;
mod dataset;
mod metrics;

use anyhow::{bail, Context, Result};
use clap::Args;
use client::RequestConfig;
use dataset::{arrival_times, build_prompts, DatasetKind, DatasetSpec};
use metrics::Summary;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

#[derive(Args, Debug)]
pub struct BenchServeArgs {
    /// Base URL of the server (the requests go to URL/v1/completions).
    #[arg(long, default_value = "http://127.0.0.1:8000", value_name = "URL")]
    pub url: String,
    /// Number of requests to send.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub num_prompts: usize,
    /// Requests per second (Poisson arrivals), or `inf` to send all at once.
    #[arg(long, default_value = "inf", value_name = "R", value_parser = parse_rate)]
    pub request_rate: f64,
    /// Most requests in flight at once (default: no limit).
    #[arg(long, value_name = "C")]
    pub max_concurrency: Option<usize>,
    /// Prompts: `random`, or `shared-prefix` (`--shared-prefix-len` common
    /// tokens in front of each random prompt).
    #[arg(long, value_enum, default_value_t = DatasetKind::Random)]
    pub dataset: DatasetKind,
    /// Prompt length in tokens (not counting a shared prefix).
    #[arg(long, default_value_t = 1024, value_name = "L")]
    pub input_len: usize,
    /// Tokens generated per request (`max_tokens`, with `ignore_eos`).
    #[arg(long, default_value_t = 128, value_name = "O")]
    pub output_len: usize,
    /// Prompt lengths are uniform in [L*(1-X), L*(1+X)].
    #[arg(long, default_value_t = 0.0, value_name = "X")]
    pub range_ratio: f64,
    /// Length of the prefix every prompt shares (`--dataset shared-prefix`).
    #[arg(long, default_value_t = 0, value_name = "P")]
    pub shared_prefix_len: usize,
    /// Seed of the prompts and the arrival times.
    #[arg(long, default_value_t = 0, value_name = "S")]
    pub seed: u64,
    /// Prompt token ids are drawn from [0, N); lower it for models with a
    /// smaller vocabulary.
    #[arg(long, default_value_t = dataset::VOCAB_LIMIT, value_name = "N")]
    pub max_token_id: u32,
    /// Model name to send (default: none; pagoda serves its one model).
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Sampling temperature of every request (0: greedy).
    #[arg(long, default_value_t = 0.0, value_name = "T")]
    pub temperature: f32,
}

/// `inf` or a positive number of requests per second.
fn parse_rate(s: &str) -> Result<f64, String> {
    if s.eq_ignore_ascii_case("inf") {
        return Ok(f64::INFINITY);
    }
    match s.parse::<f64>() {
        Ok(r) if r > 0.0 => Ok(r),
        _ => Err(format!("expected `inf` or a positive number, got {s:?}")),
    }
}

pub fn run(args: BenchServeArgs) -> Result<()> {
    if args.output_len == 0 {
        bail!("--output-len must be at least 1");
    }
    if args.max_concurrency == Some(0) {
        bail!("--max-concurrency must be at least 1");
    }
    let prompts = build_prompts(&DatasetSpec {
        kind: args.dataset,
        num_prompts: args.num_prompts,
        input_len: args.input_len,
        range_ratio: args.range_ratio,
        shared_prefix_len: args.shared_prefix_len,
        seed: args.seed,
        max_token_id: args.max_token_id,
    })?;
    let arrivals = arrival_times(prompts.len(), args.request_rate, args.seed);
    let base = args.url.trim_end_matches('/');
    let base = base.strip_suffix("/v1").unwrap_or(base);
    let config = RequestConfig {
        endpoint: format!("{base}/v1/completions"),
        model: args.model.clone(),
        api_key: args.api_key.clone(),
        max_tokens: args.output_len,
        temperature: args.temperature,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("pagoda-bench")
        .build()
        .context("cannot start the async runtime")?;
    let (summary, first_error) =
        runtime.block_on(drive(prompts, arrivals, config, args.max_concurrency))?;
    println!("{}", serde_json::to_string(&summary)?);
    if summary.completed == 0 {
        bail!(
            "all {} requests failed; the first: {}",
            summary.failed,
            first_error.unwrap_or_default()
        );
    }
    if let Some(e) = first_error {
        eprintln!(
            "warning: {} requests failed; the first: {e}",
            summary.failed
        );
    }
    Ok(())
}

/// Sends every prompt at its arrival time and gathers the results.
async fn drive(
    prompts: Vec<Vec<u32>>,
    arrivals: Vec<f64>,
    config: RequestConfig,
    max_concurrency: Option<usize>,
) -> Result<(Summary, Option<String>)> {
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .context("cannot build the HTTP client")?;
    let config = Arc::new(config);
    let slots = Arc::new(Semaphore::new(
        max_concurrency.unwrap_or(Semaphore::MAX_PERMITS),
    ));
    let pb = crate::progress::bar(prompts.len() as u64, "requests", false);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(prompts.len());
    for (prompt, at) in prompts.into_iter().zip(arrivals) {
        tokio::time::sleep_until((started + Duration::from_secs_f64(at)).into()).await;
        let (client, config, slots, pb) =
            (client.clone(), config.clone(), slots.clone(), pb.clone());
        tasks.push(tokio::spawn(async move {
            let _slot = slots.acquire_owned().await.map_err(|e| e.to_string())?;
            let result = client::send(&client, &config, &prompt).await;
            pb.inc(1);
            result
        }));
    }
    let mut results = Vec::with_capacity(tasks.len());
    let mut failed = 0;
    let mut first_error = None;
    for task in tasks {
        match task.await {
            Ok(Ok(r)) => results.push(r),
            Ok(Err(e)) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(format!("request task failed: {e}"));
            }
        }
    }
    let duration = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    Ok((Summary::new(&results, failed, duration), first_error))
}

#[cfg(test)]
mod tests {
    use super::parse_rate;

    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate("inf"), Ok(f64::INFINITY));
        assert_eq!(parse_rate("2.5"), Ok(2.5));
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("-1").is_err());
        assert!(parse_rate("fast").is_err());
    }
}
