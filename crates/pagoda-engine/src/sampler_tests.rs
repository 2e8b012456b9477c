//! Sampler tests. Every transform is checked against a direct reference
//! written here from the definitions (f64 softmax, a full sort, explicit
//! counting), not against the sampler's own helpers.

use super::*;

fn params(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        ..Default::default()
    }
}

/// The distribution the definitions give: penalties are not involved here.
/// Softmax(l / T) in f64, then top-k, top-p, min-p on the full sort by
/// (probability desc, id asc), renormalized at the end.
fn reference_distribution(logits: &[f32], p: &SamplingParams) -> Vec<f64> {
    let scaled: Vec<f64> = logits
        .iter()
        .map(|&l| {
            if l.is_nan() {
                f64::NEG_INFINITY
            } else {
                l as f64 / p.temperature as f64
            }
        })
        .collect();
    let max = scaled.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let exp: Vec<f64> = scaled.iter().map(|&s| (s - max).exp()).collect();
    let sum: f64 = exp.iter().sum();
    let probs: Vec<f64> = exp.iter().map(|e| e / sum).collect();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| probs[b].partial_cmp(&probs[a]).unwrap().then(a.cmp(&b)));
    let mut keep = vec![true; logits.len()];
    if p.top_k > 0 {
        for &i in order.iter().skip(p.top_k) {
            keep[i] = false;
        }
    }
    if p.top_p < 1.0 {
        let kept_mass: f64 = (0..probs.len())
            .filter(|&i| keep[i])
            .map(|i| probs[i])
            .sum();
        let mut cum = 0.0;
        let mut done = false;
        for &i in &order {
            if !keep[i] {
                continue;
            }
            if done {
                keep[i] = false;
                continue;
            }
            cum += probs[i] / kept_mass;
            if cum >= p.top_p as f64 - 1e-12 {
                done = true;
            }
        }
    }
    let p_max = probs[order[0]];
    for i in 0..probs.len() {
        if probs[i] < p.min_p as f64 * p_max {
            keep[i] = false;
        }
    }
    let mass: f64 = (0..probs.len())
        .filter(|&i| keep[i])
        .map(|i| probs[i])
        .sum();
    (0..probs.len())
        .map(|i| if keep[i] { probs[i] / mass } else { 0.0 })
        .collect()
}

/// The sampler's processed distribution, read back through its logprobs.
fn sampler_distribution(logits: &[f32], p: &SamplingParams) -> Vec<f64> {
    let mut row = logits.to_vec();
    let mut rng = RequestRng::new(0);
    let out = sample_with_logprobs(&mut row, p, &[], &[], &mut rng, Some(logits.len()));
    let mut dist = vec![0.0; logits.len()];
    for (id, lp) in out.logprobs.unwrap().top {
        dist[id as usize] = (lp as f64).exp();
    }
    dist
}

fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol,
            "token {i}: got {g}, want {w}\n got {got:?}\nwant {want:?}"
        );
    }
}

/// Logits with distinct values and a spread of probabilities.
fn test_logits(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = RequestRng::new(seed);
    (0..n)
        .map(|_| (rng.next_f64() * 8.0 - 4.0) as f32)
        .collect()
}

#[test]
fn rng_matches_reference_vectors() {
    // SplitMix64 from seed 1234567: the published reference outputs.
    let mut s = 1234567u64;
    let got: Vec<u64> = (0..5).map(|_| splitmix64(&mut s)).collect();
    assert_eq!(
        got,
        [
            6457827717110365317,
            3203168211198807973,
            9817491932198370423,
            4593380528125082431,
            16408922859458223821
        ]
    );
    // xoshiro256** seeded with four SplitMix64 outputs (independent Python
    // implementation of Blackman & Vigna's reference C code).
    let mut r = RequestRng::new(42);
    let got: Vec<u64> = (0..4).map(|_| r.next_u64()).collect();
    assert_eq!(
        got,
        [
            1546998764402558742,
            6990951692964543102,
            12544586762248559009,
            17057574109182124193
        ]
    );
    let mut r = RequestRng::new(0);
    assert_eq!(r.next_u64(), 11091344671253066420);
    let x = RequestRng::new(7).next_f64();
    assert!((0.0..1.0).contains(&x));
}

#[test]
fn penalties_match_a_direct_computation() {
    let vocab = 12;
    let logits: Vec<f32> = (0..vocab).map(|i| i as f32 * 0.7 - 3.0).collect();
    let prompt = [1u32, 2, 2, 9, 40]; // 40 is out of range: ignored
    let output = [2u32, 5, 5, 5, 9, 11];
    let p = SamplingParams {
        repetition_penalty: 1.3,
        frequency_penalty: 0.4,
        presence_penalty: 0.25,
        ..Default::default()
    };
    let mut got = logits.clone();
    apply_penalties(&mut got, &p, &prompt, &output);
    for t in 0..vocab {
        let mut want = logits[t];
        let in_prompt = prompt.contains(&(t as u32));
        let count = output.iter().filter(|&&o| o == t as u32).count();
        if in_prompt || count > 0 {
            want = if want > 0.0 { want / 1.3 } else { want * 1.3 };
        }
        want -= 0.4 * count as f32;
        if count > 0 {
            want -= 0.25;
        }
        assert_eq!(got[t], want, "token {t}");
    }
    // Neutral values change nothing.
    let mut same = logits.clone();
    apply_penalties(&mut same, &SamplingParams::default(), &prompt, &output);
    assert_eq!(same, logits);
}

#[test]
fn greedy_is_argmax_with_lowest_id_on_ties_and_skips_nan() {
    let mut rng = RequestRng::new(1);
    let g = SamplingParams::greedy(1);
    let mut row = vec![0.5, 2.0, f32::NAN, 2.0, -1.0];
    assert_eq!(sample(&mut row, &g, &[], &[], &mut rng).token, 1);
    let mut row = vec![f32::NAN, f32::NEG_INFINITY, -3.0];
    assert_eq!(sample(&mut row, &g, &[], &[], &mut rng).token, 2);
    // A repetition penalty can move the argmax.
    let p = SamplingParams {
        repetition_penalty: 2.0,
        ..SamplingParams::greedy(1)
    };
    let mut row = vec![1.0, 3.0, 2.0];
    assert_eq!(sample(&mut row, &p, &[1], &[], &mut rng).token, 2);
    // Tiny temperatures are greedy too.
    let mut row = vec![1.0, 3.0, 2.0];
    assert_eq!(sample(&mut row, &params(1e-7), &[], &[], &mut rng).token, 1);
}

#[test]
fn greedy_logprobs_are_the_log_softmax() {
    let logits = test_logits(50, 3);
    let mut row = logits.clone();
    let mut rng = RequestRng::new(0);
    let out = sample_with_logprobs(
        &mut row,
        &SamplingParams::greedy(1),
        &[],
        &[],
        &mut rng,
        Some(3),
    );
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + logits
            .iter()
            .map(|&l| (l as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let lp = out.logprobs.unwrap();
    assert!((lp.logprob as f64 - (logits[out.token as usize] as f64 - lse)).abs() < 1e-5);
    let mut order: Vec<usize> = (0..50).collect();
    order.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap());
    assert_eq!(out.token as usize, order[0]);
    assert_eq!(
        lp.top.iter().map(|e| e.0 as usize).collect::<Vec<_>>(),
        order[..3].to_vec()
    );
    for (id, v) in lp.top {
        assert!((v as f64 - (logits[id as usize] as f64 - lse)).abs() < 1e-5);
    }
}

#[test]
fn each_transform_matches_the_reference_distribution() {
    let logits = test_logits(300, 11);
    let cases = [
        SamplingParams {
            temperature: 1.0,
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.6,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.7,
            top_k: 5,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.0,
            top_k: 200,
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.8,
            top_p: 0.5,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.0,
            top_p: 0.95,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.0,
            min_p: 0.2,
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.9,
            top_k: 40,
            top_p: 0.7,
            min_p: 0.1,
            ..Default::default()
        },
    ];
    for p in &cases {
        let want = reference_distribution(&logits, p);
        let got = sampler_distribution(&logits, p);
        assert_close(&got, &want, 1e-5);
    }
}

#[test]
fn sampled_frequencies_match_the_probabilities() {
    let logits = vec![1.0, 0.2, -0.5, 2.0, 1.5, -1.0, 0.0, 0.7];
    let p = SamplingParams {
        temperature: 0.9,
        top_k: 6,
        min_p: 0.05,
        ..Default::default()
    };
    let want = reference_distribution(&logits, &p);
    let mut rng = RequestRng::new(2024);
    let draws = 200_000;
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..draws {
        let mut row = logits.clone();
        counts[sample(&mut row, &p, &[], &[], &mut rng).token as usize] += 1;
    }
    for (i, (&c, &q)) in counts.iter().zip(&want).enumerate() {
        let freq = c as f64 / draws as f64;
        let sigma = (q * (1.0 - q) / draws as f64).sqrt();
        assert!(
            (freq - q).abs() <= 5.0 * sigma + 1e-9,
            "token {i}: freq {freq}, p {q}"
        );
    }
    // The same holds on the dense path (no top-k), where draws walk ids in order.
    let p = params(1.0);
    let want = reference_distribution(&logits, &p);
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..draws {
        let mut row = logits.clone();
        counts[sample(&mut row, &p, &[], &[], &mut rng).token as usize] += 1;
    }
    for (&c, &q) in counts.iter().zip(&want) {
        let sigma = (q * (1.0 - q) / draws as f64).sqrt();
        assert!((c as f64 / draws as f64 - q).abs() <= 5.0 * sigma);
    }
}

#[test]
fn boundary_cases() {
    let logits = test_logits(40, 5);
    let argmax_ref = argmax(&logits);
    let draw = |p: &SamplingParams, row: &[f32], seed: u64| {
        let mut r = row.to_vec();
        sample(&mut r, p, &[], &[], &mut RequestRng::new(seed)).token
    };
    // k = 1 is greedy whatever the seed.
    for seed in 0..50 {
        assert_eq!(
            draw(
                &SamplingParams {
                    top_k: 1,
                    ..params(1.3)
                },
                &logits,
                seed
            ),
            argmax_ref
        );
    }
    // p = 1 and k > vocab are no-ops: same token as the unfiltered draw.
    for seed in 0..50 {
        let plain = draw(&params(1.0), &logits, seed);
        assert_eq!(
            draw(
                &SamplingParams {
                    top_p: 1.0,
                    ..params(1.0)
                },
                &logits,
                seed
            ),
            plain
        );
        assert_eq!(
            draw(
                &SamplingParams {
                    top_k: 1000,
                    ..params(1.0)
                },
                &logits,
                seed
            ),
            plain
        );
    }
    let full = reference_distribution(&logits, &params(1.0));
    let big_k = sampler_distribution(
        &logits,
        &SamplingParams {
            top_k: 41,
            ..params(1.0)
        },
    );
    assert_close(&big_k, &full, 1e-5);

    // All-equal logits: uniform; top-p 0.5 of 4 keeps the two lowest ids.
    let flat = vec![0.3f32; 4];
    assert_close(&sampler_distribution(&flat, &params(1.0)), &[0.25; 4], 1e-6);
    let half = sampler_distribution(
        &flat,
        &SamplingParams {
            top_p: 0.5,
            ..params(1.0)
        },
    );
    assert_close(&half, &[0.5, 0.5, 0.0, 0.0], 1e-6);
    let k2 = sampler_distribution(
        &flat,
        &SamplingParams {
            top_k: 2,
            ..params(1.0)
        },
    );
    assert_close(&k2, &[0.5, 0.5, 0.0, 0.0], 1e-6);
    // A tiny top-p keeps exactly one token.
    let one = sampler_distribution(
        &logits,
        &SamplingParams {
            top_p: 1e-6,
            ..params(1.0)
        },
    );
    assert_eq!(one.iter().filter(|&&q| q > 0.0).count(), 1);
    assert!((one[argmax_ref as usize] - 1.0).abs() < 1e-6);
    // min_p = 1 keeps only the most likely token(s).
    let m1 = sampler_distribution(
        &[1.0, 3.0, 3.0, 2.0],
        &SamplingParams {
            min_p: 1.0,
            ..params(1.0)
        },
    );
    assert_close(&m1, &[0.0, 0.5, 0.5, 0.0], 1e-6);

    // -inf and NaN logits are never drawn and leave no NaN behind.
    let masked = vec![f32::NEG_INFINITY, 0.0, f32::NAN, 1.0, f32::NEG_INFINITY];
    for seed in 0..200 {
        let mut row = masked.clone();
        let p = SamplingParams {
            top_p: 0.9,
            ..params(0.7)
        };
        let out = sample_with_logprobs(&mut row, &p, &[], &[], &mut RequestRng::new(seed), Some(5));
        assert!(out.token == 1 || out.token == 3, "drew {}", out.token);
        let lp = out.logprobs.unwrap();
        assert!(lp.logprob.is_finite());
        assert!(lp
            .top
            .iter()
            .all(|e| e.1.is_finite() && (e.0 == 1 || e.0 == 3)));
        let mut row = masked.clone();
        let t = sample(&mut row, &params(1.0), &[], &[], &mut RequestRng::new(seed)).token;
        assert!(t == 1 || t == 3);
    }
    // Nothing finite at all: no panic, a valid id.
    let mut row = vec![f32::NEG_INFINITY, f32::NAN];
    assert!(sample(&mut row, &params(1.0), &[], &[], &mut RequestRng::new(0)).token < 2);
    let mut empty: Vec<f32> = Vec::new();
    assert_eq!(
        sample(&mut empty, &params(1.0), &[], &[], &mut RequestRng::new(0)).token,
        0
    );
}

#[test]
fn top_by_weight_matches_a_full_sort_on_both_paths() {
    let mut rng = RequestRng::new(9);
    // Few distinct values, so ties are common.
    let w: Vec<f32> = (0..1000)
        .map(|_| (rng.next_u64() % 17) as f32 / 16.0)
        .collect();
    let mut reference: Vec<(u32, f32)> =
        w.iter().enumerate().map(|(i, &x)| (i as u32, x)).collect();
    reference.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap().then(a.0.cmp(&b.0)));
    for m in [1, 7, SMALL_K, SMALL_K + 1, 500, 1000] {
        assert_eq!(top_by_weight(&w, m), reference[..m].to_vec(), "m = {m}");
    }
}

#[test]
fn top_p_over_a_large_vocab_grows_its_candidate_set() {
    // A flat-ish distribution over 5000 tokens needs many rounds.
    let logits = test_logits(5000, 21);
    for top_p in [0.3f32, 0.9, 0.999] {
        let p = SamplingParams {
            top_p,
            ..params(1.0)
        };
        assert_close(
            &sampler_distribution(&logits, &p),
            &reference_distribution(&logits, &p),
            1e-6,
        );
    }
}

/// Deterministic per-step logits of request `r`, independent of batching.
fn step_logits(r: u64, step: usize, vocab: usize) -> Vec<f32> {
    test_logits(vocab, r * 1000 + step as u64)
}

#[test]
fn a_seeded_request_draws_the_same_tokens_in_any_batch() {
    let vocab = 64;
    let steps = 30;
    let p = SamplingParams {
        top_k: 20,
        top_p: 0.9,
        ..params(1.1)
    };
    let dense = params(0.8);
    let alone = |seed: u64| -> Vec<u32> {
        let mut rng = RequestRng::new(seed);
        let mut out = Vec::new();
        for step in 0..steps {
            let mut row = step_logits(seed, step, vocab);
            out.push(sample(&mut row, &p, &[], &out, &mut rng).token);
        }
        out
    };
    let want_a = alone(7);
    let want_b = alone(8);
    assert_ne!(want_a, want_b);

    // Interleaved with other requests, in a different order each step, and
    // through the parallel batch entry point.
    let seeds = [7u64, 8, 9];
    let mut rngs: Vec<RequestRng> = seeds.iter().map(|&s| RequestRng::new(s)).collect();
    let mut outs: Vec<Vec<u32>> = vec![Vec::new(); 3];
    let prompts: Vec<Vec<u32>> = vec![Vec::new(); 3];
    for step in 0..steps {
        let mut order: Vec<usize> = vec![0, 1, 2];
        order.rotate_left(step % 3);
        if step % 2 == 1 {
            order.pop(); // request `order[2]` sits this step out...
        }
        let mut logits: Vec<f32> = Vec::new();
        for &i in &order {
            logits.extend(step_logits(seeds[i], outs[i].len(), vocab));
        }
        let mut rng_refs: Vec<&mut RequestRng> = rngs.iter_mut().collect();
        let mut picked: Vec<(usize, &mut RequestRng)> = Vec::new();
        for (i, r) in rng_refs.drain(..).enumerate() {
            if order.contains(&i) {
                picked.push((i, r));
            }
        }
        picked.sort_by_key(|(i, _)| order.iter().position(|o| o == i));
        let snapshot: Vec<Vec<u32>> = outs.clone();
        let mut seqs: Vec<SeqSampling<'_>> = picked
            .into_iter()
            .map(|(i, rng)| SeqSampling {
                params: if i == 2 { &dense } else { &p },
                prompt_token_ids: &prompts[i],
                output_token_ids: &snapshot[i],
                rng,
                num_logprobs: if i == 1 { Some(2) } else { None },
            })
            .collect();
        let results = sample_batch(&mut logits, vocab, &mut seqs);
        for (&i, r) in order.iter().zip(results) {
            outs[i].push(r.token);
        }
    }
    // ...so requests advance at different rates; compare what each produced.
    assert_eq!(outs[0][..], want_a[..outs[0].len()]);
    assert_eq!(outs[1][..], want_b[..outs[1].len()]);
    assert!(outs[0].len() >= steps / 2 && outs[1].len() >= steps / 2);
}

#[test]
fn unseeded_requests_take_their_seed_from_the_engine_stream() {
    let mut source = RequestRng::new(5);
    let mut copy = source.clone();
    let drawn = RequestRng::for_request(None, &mut source);
    assert_eq!(drawn, RequestRng::new(copy.next_u64()));
    let seeded = RequestRng::for_request(Some(3), &mut source);
    assert_eq!(seeded, RequestRng::new(3));
    assert_eq!(
        source, copy,
        "a seeded request draws nothing from the engine"
    );
}

#[test]
fn logit_rules_come_first_and_bind_every_draw() {
    use crate::logit_rules::LogitRules;
    // Bias before repetition penalty: (1 + 1) / 2 = 1, not 1 / 2 + 1.
    let p = SamplingParams {
        logit_bias: vec![(0, 1.0)],
        repetition_penalty: 2.0,
        ..params(0.0)
    };
    let rules = LogitRules::new(&p, &[3], None, 4).unwrap().unwrap();
    let mut row = vec![1.0f32, 0.0, 0.0, 0.0];
    let mut scratch = Vec::new();
    apply_logit_rules(&mut row, &rules, &[], &mut scratch);
    apply_penalties(&mut row, &p, &[0], &[]);
    assert_eq!(row[0], 1.0);
    // Allowed tokens and min_tokens bans: no draw ever leaves the set.
    let p = SamplingParams {
        allowed_token_ids: Some(vec![1, 3, 5]),
        min_tokens: 2,
        ..params(1.0)
    };
    let rules = LogitRules::new(&p, &[3], None, 8).unwrap().unwrap();
    let logits = [5.0f32, 0.0, 4.0, 9.0, 4.0, -1.0, 6.0, 2.0];
    let mut rng = RequestRng::new(9);
    for step in 0..200 {
        let output = vec![1u32; step % 3];
        let mut row = logits.to_vec();
        apply_logit_rules(&mut row, &rules, &output, &mut scratch);
        let out = sample_with_logprobs(&mut row, &p, &[], &output, &mut rng, Some(2));
        let allowed: &[u32] = if output.len() < 2 {
            &[1, 5]
        } else {
            &[1, 3, 5]
        };
        assert!(allowed.contains(&out.token), "step {step}: {}", out.token);
        let lp = out.logprobs.unwrap();
        assert!(lp.top.iter().all(|(t, _)| allowed.contains(t)), "{lp:?}");
    }
}
