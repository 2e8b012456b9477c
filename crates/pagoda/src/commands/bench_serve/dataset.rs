//! The workload of `pagoda bench serve`: prompts of random token ids and
//! their arrival times, all reproducible from one seed.
//!
//! - `random`: prompt lengths uniform in `[L*(1-X), L*(1+X)]` (at least 1),
//!   ids uniform in `[0, 10000)`;
//! - `shared-prefix`: the same, behind one prefix of `P` random ids that every
//!   prompt shares (the prompt is `P + len` tokens long).
//!
//! Arrivals follow a Poisson process at `rate` requests/s (exponential gaps
//! with mean `1/rate`); an infinite rate sends everything at time 0.
//! Costs: O(total prompt tokens) time and memory, done before the clock starts.

use anyhow::{bail, Result};
use pagoda_engine::sampler::RequestRng;

/// Token ids are drawn from `[0, VOCAB_LIMIT)` by default, a range most
/// served vocabularies cover (`--max-token-id` changes it).
pub const VOCAB_LIMIT: u32 = 10_000;

/// Which prompts to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DatasetKind {
    Random,
    SharedPrefix,
}

/// The shape of the workload.
#[derive(Debug, Clone)]
pub struct DatasetSpec {
    pub kind: DatasetKind,
    pub num_prompts: usize,
    pub input_len: usize,
    pub range_ratio: f64,
    /// Tokens every prompt starts with (`shared-prefix` only).
    pub shared_prefix_len: usize,
    pub seed: u64,
    /// Token ids are drawn from `[0, max_token_id)`.
    pub max_token_id: u32,
}

/// Uniform integer in `[lo, hi]`.
fn uniform(rng: &mut RequestRng, lo: usize, hi: usize) -> usize {
    lo + (rng.next_u64() % (hi - lo + 1) as u64) as usize
}

fn random_ids(rng: &mut RequestRng, n: usize, limit: u32) -> impl Iterator<Item = u32> + '_ {
    let limit = limit.max(1) as u64;
    (0..n).map(move |_| (rng.next_u64() % limit) as u32)
}

/// The inclusive range of unique (non-prefix) prompt lengths.
pub fn input_len_range(input_len: usize, range_ratio: f64) -> Result<(usize, usize)> {
    if !(0.0..1.0).contains(&range_ratio) {
        bail!("--range-ratio must be in [0, 1), got {range_ratio}");
    }
    if input_len == 0 {
        bail!("--input-len must be at least 1");
    }
    let lo = ((input_len as f64 * (1.0 - range_ratio)).ceil() as usize).max(1);
    let hi = ((input_len as f64 * (1.0 + range_ratio)).floor() as usize).max(lo);
    Ok((lo, hi))
}

/// The prompts, in the order they are sent.
pub fn build_prompts(spec: &DatasetSpec) -> Result<Vec<Vec<u32>>> {
    if spec.num_prompts == 0 {
        bail!("--num-prompts must be at least 1");
    }
    let (lo, hi) = input_len_range(spec.input_len, spec.range_ratio)?;
    let prefix_len = match spec.kind {
        DatasetKind::Random if spec.shared_prefix_len > 0 => {
            bail!("--shared-prefix-len needs --dataset shared-prefix")
        }
        DatasetKind::Random => 0,
        DatasetKind::SharedPrefix if spec.shared_prefix_len == 0 => {
            bail!("--dataset shared-prefix needs --shared-prefix-len of at least 1")
        }
        DatasetKind::SharedPrefix => spec.shared_prefix_len,
    };
    let mut rng = RequestRng::new(spec.seed);
    let prefix: Vec<u32> = random_ids(&mut rng, prefix_len, spec.max_token_id).collect();
    let mut prompts = Vec::with_capacity(spec.num_prompts);
    for _ in 0..spec.num_prompts {
        let len = uniform(&mut rng, lo, hi);
        let mut ids = Vec::with_capacity(prefix_len + len);
        ids.extend_from_slice(&prefix);
        ids.extend(random_ids(&mut rng, len, spec.max_token_id));
        prompts.push(ids);
    }
    Ok(prompts)
}

/// Seconds after the start at which each of `n` requests is sent: a Poisson
/// process at `rate` requests/s, or all at 0 when `rate` is infinite.
pub fn arrival_times(n: usize, rate: f64, seed: u64) -> Vec<f64> {
    if rate.is_infinite() {
        return vec![0.0; n];
    }
    // A stream apart from the prompts' so that changing the rate keeps them.
    let mut rng = RequestRng::new(seed ^ 0x5EED_A11A_0000_0001);
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            // 1 - U is in (0, 1], so the log is finite.
            t += -(1.0 - rng.next_f64()).ln() / rate;
            t
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: DatasetKind, n: usize, len: usize, ratio: f64, prefix: usize) -> DatasetSpec {
        DatasetSpec {
            kind,
            num_prompts: n,
            input_len: len,
            range_ratio: ratio,
            shared_prefix_len: prefix,
            seed: 7,
            max_token_id: VOCAB_LIMIT,
        }
    }

    #[test]
    fn token_ids_stay_below_the_limit() {
        let s = DatasetSpec {
            max_token_id: 100,
            ..spec(DatasetKind::SharedPrefix, 4, 300, 0.0, 50)
        };
        let prompts = build_prompts(&s).unwrap();
        assert!(prompts.iter().flatten().all(|&t| t < 100));
        assert!(prompts.iter().flatten().any(|&t| t >= 90));
    }

    #[test]
    fn random_lengths_stay_in_range_and_cover_it() {
        let prompts = build_prompts(&spec(DatasetKind::Random, 2000, 100, 0.25, 0)).unwrap();
        assert_eq!(prompts.len(), 2000);
        let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
        assert!(lens.iter().all(|&l| (75..=125).contains(&l)), "{lens:?}");
        // Both ends are reached and the mean sits near the middle.
        assert!(lens.contains(&75) && lens.contains(&125));
        let mean = lens.iter().sum::<usize>() as f64 / lens.len() as f64;
        assert!((mean - 100.0).abs() < 2.0, "mean {mean}");
        assert!(prompts.iter().flatten().all(|&id| id < VOCAB_LIMIT));
    }

    #[test]
    fn zero_ratio_gives_exact_lengths_and_distinct_prompts() {
        let prompts = build_prompts(&spec(DatasetKind::Random, 8, 32, 0.0, 0)).unwrap();
        assert!(prompts.iter().all(|p| p.len() == 32));
        for i in 0..prompts.len() {
            for j in i + 1..prompts.len() {
                assert_ne!(prompts[i], prompts[j]);
            }
        }
    }

    #[test]
    fn ids_are_roughly_uniform() {
        let prompts = build_prompts(&spec(DatasetKind::Random, 100, 1000, 0.0, 0)).unwrap();
        let mut buckets = [0usize; 10];
        for &id in prompts.iter().flatten() {
            buckets[(id / 1000) as usize] += 1;
        }
        // 100,000 draws, 10,000 expected per bucket; sd is about 95.
        assert!(
            buckets.iter().all(|&b| (9_500..=10_500).contains(&b)),
            "{buckets:?}"
        );
    }

    #[test]
    fn shared_prefix_is_common_and_suffixes_differ() {
        let prompts = build_prompts(&spec(DatasetKind::SharedPrefix, 6, 20, 0.0, 50)).unwrap();
        assert!(prompts.iter().all(|p| p.len() == 70));
        let prefix = &prompts[0][..50];
        assert!(prompts.iter().all(|p| &p[..50] == prefix));
        assert!(prompts.windows(2).all(|w| w[0][50..] != w[1][50..]));
    }

    #[test]
    fn same_seed_same_workload() {
        let s = spec(DatasetKind::Random, 5, 40, 0.5, 0);
        assert_eq!(build_prompts(&s).unwrap(), build_prompts(&s).unwrap());
        let other = DatasetSpec {
            seed: 8,
            ..s.clone()
        };
        assert_ne!(build_prompts(&s).unwrap(), build_prompts(&other).unwrap());
    }

    #[test]
    fn bad_specs_are_refused() {
        assert!(build_prompts(&spec(DatasetKind::Random, 0, 10, 0.0, 0)).is_err());
        assert!(build_prompts(&spec(DatasetKind::Random, 1, 0, 0.0, 0)).is_err());
        assert!(build_prompts(&spec(DatasetKind::Random, 1, 10, 1.0, 0)).is_err());
        assert!(build_prompts(&spec(DatasetKind::Random, 1, 10, -0.1, 0)).is_err());
        assert!(build_prompts(&spec(DatasetKind::Random, 1, 10, 0.0, 5)).is_err());
        assert!(build_prompts(&spec(DatasetKind::SharedPrefix, 1, 10, 0.0, 0)).is_err());
    }

    #[test]
    fn length_range_rounds_inward_and_never_reaches_zero() {
        assert_eq!(input_len_range(128, 0.0).unwrap(), (128, 128));
        assert_eq!(input_len_range(10, 0.25).unwrap(), (8, 12));
        assert_eq!(input_len_range(1, 0.9).unwrap(), (1, 1));
    }

    #[test]
    fn poisson_arrivals_have_the_requested_rate() {
        let n = 20_000;
        let rate = 4.0;
        let t = arrival_times(n, rate, 3);
        assert!(t.windows(2).all(|w| w[0] <= w[1]));
        let gaps: Vec<f64> = std::iter::once(t[0])
            .chain(t.windows(2).map(|w| w[1] - w[0]))
            .collect();
        let mean = gaps.iter().sum::<f64>() / n as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / n as f64;
        // Exponential(rate): mean 1/rate = 0.25, variance 1/rate^2 = 0.0625.
        assert!((mean - 0.25).abs() < 0.01, "mean {mean}");
        assert!((var - 0.0625).abs() < 0.006, "variance {var}");
        assert_eq!(arrival_times(3, f64::INFINITY, 3), vec![0.0; 3]);
    }
}
