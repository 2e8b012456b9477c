//! What `pagoda bench serve` measures per request, and the summary line it
//! prints: throughput, and mean / p50 / p99 of TTFT, ITL, TPOT and E2E.
//!
//! Definitions (vLLM's `bench serve`): TTFT is the time from sending the
//! request to its first chunk with text; ITL is each gap between consecutive
//! text chunks; TPOT is `(e2e - ttft) / (output_tokens - 1)` per request with
//! more than one output token; E2E is send to the end of the stream.
//! Percentiles interpolate linearly between order statistics (numpy's
//! default). Throughputs count completed requests only, over the wall time
//! from the first send to the last completion.

use serde::Serialize;

/// One finished request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestResult {
    pub prompt_tokens: usize,
    /// From the stream's usage chunk.
    pub output_tokens: usize,
    pub ttft_s: f64,
    /// Gaps between consecutive text chunks.
    pub itl_s: Vec<f64>,
    pub e2e_s: f64,
}

/// The `p`-th percentile (0..=100) of `sorted` (ascending), interpolating
/// linearly between the two nearest ranks; `None` when empty.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let rank = (p.clamp(0.0, 100.0) / 100.0) * last as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// Mean, median and 99th percentile of one latency, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stats {
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
}

impl Stats {
    /// From samples in seconds; `None` when there are none.
    pub fn of_seconds(samples: &[f64]) -> Option<Stats> {
        let mut ms: Vec<f64> = samples.iter().map(|s| s * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        Some(Stats {
            mean: ms.iter().sum::<f64>() / ms.len().max(1) as f64,
            p50: percentile(&ms, 50.0)?,
            p99: percentile(&ms, 99.0)?,
        })
    }
}

/// The JSON line `pagoda bench serve` prints (latencies in ms; `null` when
/// no request produced a sample).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub completed: usize,
    pub failed: usize,
    pub duration_s: f64,
    pub total_input_tokens: usize,
    pub total_output_tokens: usize,
    pub request_throughput: f64,
    pub output_tok_per_s: f64,
    pub total_tok_per_s: f64,
    pub mean_ttft_ms: Option<f64>,
    pub p50_ttft_ms: Option<f64>,
    pub p99_ttft_ms: Option<f64>,
    pub mean_itl_ms: Option<f64>,
    pub p50_itl_ms: Option<f64>,
    pub p99_itl_ms: Option<f64>,
    pub mean_tpot_ms: Option<f64>,
    pub p50_tpot_ms: Option<f64>,
    pub p99_tpot_ms: Option<f64>,
    pub mean_e2e_ms: Option<f64>,
    pub p50_e2e_ms: Option<f64>,
    pub p99_e2e_ms: Option<f64>,
}

impl Summary {
    /// Summarizes the completed `results` of a run that took `duration_s`.
    pub fn new(results: &[RequestResult], failed: usize, duration_s: f64) -> Summary {
        let input: usize = results.iter().map(|r| r.prompt_tokens).sum();
        let output: usize = results.iter().map(|r| r.output_tokens).sum();
        let ttft: Vec<f64> = results.iter().map(|r| r.ttft_s).collect();
        let itl: Vec<f64> = results
            .iter()
            .flat_map(|r| r.itl_s.iter().copied())
            .collect();
        let tpot: Vec<f64> = results
            .iter()
            .filter(|r| r.output_tokens > 1)
            .map(|r| (r.e2e_s - r.ttft_s) / (r.output_tokens - 1) as f64)
            .collect();
        let e2e: Vec<f64> = results.iter().map(|r| r.e2e_s).collect();
        let per_s = |x: f64| {
            if duration_s > 0.0 {
                x / duration_s
            } else {
                0.0
            }
        };
        let [ttft, itl, tpot, e2e] = [&ttft, &itl, &tpot, &e2e].map(|s| Stats::of_seconds(s));
        Summary {
            completed: results.len(),
            failed,
            duration_s,
            total_input_tokens: input,
            total_output_tokens: output,
            request_throughput: per_s(results.len() as f64),
            output_tok_per_s: per_s(output as f64),
            total_tok_per_s: per_s((input + output) as f64),
            mean_ttft_ms: ttft.map(|s| s.mean),
            p50_ttft_ms: ttft.map(|s| s.p50),
            p99_ttft_ms: ttft.map(|s| s.p99),
            mean_itl_ms: itl.map(|s| s.mean),
            p50_itl_ms: itl.map(|s| s.p50),
            p99_itl_ms: itl.map(|s| s.p99),
            mean_tpot_ms: tpot.map(|s| s.mean),
            p50_tpot_ms: tpot.map(|s| s.p50),
            p99_tpot_ms: tpot.map(|s| s.p99),
            mean_e2e_ms: e2e.map(|s| s.mean),
            p50_e2e_ms: e2e.map(|s| s.p50),
            p99_e2e_ms: e2e.map(|s| s.p99),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn percentiles_match_numpy_linear_interpolation() {
        // Reference: numpy.percentile(x, q) with the default "linear" method.
        let x = [1.0, 2.0, 3.0, 4.0];
        assert!(close(percentile(&x, 50.0).unwrap(), 2.5));
        assert!(close(percentile(&x, 99.0).unwrap(), 3.97));
        assert!(close(percentile(&x, 25.0).unwrap(), 1.75));
        assert!(close(percentile(&x, 0.0).unwrap(), 1.0));
        assert!(close(percentile(&x, 100.0).unwrap(), 4.0));
        let y = [10.0, 20.0, 40.0, 80.0, 160.0];
        assert!(close(percentile(&y, 50.0).unwrap(), 40.0));
        assert!(close(percentile(&y, 90.0).unwrap(), 128.0));
        assert!(close(percentile(&y, 99.0).unwrap(), 156.8));
        assert_eq!(percentile(&[7.5], 99.0), Some(7.5));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn percentiles_agree_with_sorting_by_rank() {
        // For 101 values 0..=100 (shuffled, then sorted), the p-th percentile
        // is exactly p.
        let mut v: Vec<f64> = (0..=100).map(|i| ((i * 37) % 101) as f64).collect();
        v.sort_by(f64::total_cmp);
        for p in [0.0, 1.0, 50.0, 73.0, 99.0, 100.0] {
            assert!(close(percentile(&v, p).unwrap(), p));
        }
    }

    #[test]
    fn summary_of_two_requests() {
        let a = RequestResult {
            prompt_tokens: 10,
            output_tokens: 3,
            ttft_s: 0.100,
            itl_s: vec![0.020, 0.030],
            e2e_s: 0.150,
        };
        let b = RequestResult {
            prompt_tokens: 20,
            output_tokens: 1,
            ttft_s: 0.300,
            itl_s: vec![],
            e2e_s: 0.300,
        };
        let s = Summary::new(&[a, b], 1, 2.0);
        assert_eq!((s.completed, s.failed), (2, 1));
        assert_eq!((s.total_input_tokens, s.total_output_tokens), (30, 4));
        assert!(close(s.request_throughput, 1.0));
        assert!(close(s.output_tok_per_s, 2.0));
        assert!(close(s.total_tok_per_s, 17.0));
        assert!(close(s.mean_ttft_ms.unwrap(), 200.0));
        assert!(close(s.p50_ttft_ms.unwrap(), 200.0));
        assert!(close(s.p99_ttft_ms.unwrap(), 298.0));
        assert!(close(s.mean_itl_ms.unwrap(), 25.0));
        // Only `a` has a TPOT: (150 - 100) / 2 = 25 ms.
        assert!(close(s.p50_tpot_ms.unwrap(), 25.0));
        assert!(close(s.mean_e2e_ms.unwrap(), 225.0));
    }

    #[test]
    fn empty_run_has_no_latencies() {
        let s = Summary::new(&[], 3, 1.0);
        assert_eq!((s.completed, s.failed, s.total_output_tokens), (0, 3, 0));
        assert!(s.mean_ttft_ms.is_none() && s.p99_e2e_ms.is_none());
        let json = serde_json::to_value(&s).unwrap();
        assert!(json["p50_itl_ms"].is_null());
    }
}
