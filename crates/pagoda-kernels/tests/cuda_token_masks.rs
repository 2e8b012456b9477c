//! Structured-output token masks on the CUDA backend against the host's
//! rule (a disallowed token's logit becomes -inf, the others are kept bit
//! for bit): random bf16 logits, masks on some rows (first, last, a middle
//! one; a vocabulary not a multiple of 32), applied with
//! `apply_token_masks`, downloaded and compared element by element; then
//! greedy device sampling of the masked rows picks the best allowed token;
//! and masks applied back to back with no wait between them (the uploads
//! run on a stream of their own and reuse one device buffer, grown on the
//! way) each reach their own rows.
//!
//! Without a CUDA device every test prints a notice and passes (fails where
//! PAGODA_REQUIRE_GPU=1).
#![cfg(feature = "cuda")]

mod common;

/// The shared helpers ask which CPU kernels a binary tests; none here.
const PORTABLE: bool = false;

use common::{rvec, Rng};
use pagoda_kernels::cuda::testing::{gpu_poisoned as gpu, sampling_step};
use pagoda_kernels::{Backend, SamplingRow, TokenMasks};

#[test]
fn masks_set_exactly_the_disallowed_logits_to_minus_infinity() {
    let Some(g) = gpu() else { return };
    let (rows, vocab) = (5usize, 1000usize);
    let words = vocab.div_ceil(32);
    let mut rng = Rng::new(7);
    let logits = rvec(&mut rng, rows * vocab, 4.0);
    let masked_rows = [0u32, 2, 4];
    let mut bits = Vec::new();
    for (k, _) in masked_rows.iter().enumerate() {
        for w in 0..words {
            // Row 2 allows a single token; the others random halves.
            bits.push(if k == 1 {
                u32::from(w == 10) << 3
            } else {
                rng.next_u64() as u32
            });
        }
    }
    let masks = TokenMasks {
        words,
        rows: masked_rows.to_vec(),
        bits,
    };
    let t = g.tensor_from_host(rows, vocab, &logits).unwrap();
    g.apply_token_masks(&t, &masks).unwrap();
    let got = g.tensor_to_host(&t).unwrap();
    let want = masked(&logits, vocab, &masks);
    same(&got, &want, vocab);
    // Greedy sampling on the masked rows: row 2 can only give token 323.
    let step = g
        .begin_step(&sampling_step(vec![SamplingRow::GREEDY; rows]))
        .unwrap();
    let ids = g.sample(&t, &step).unwrap();
    assert_eq!(ids[2], 10 * 32 + 3);
    for (r, &id) in ids.iter().enumerate() {
        let row = &want[r * vocab..(r + 1) * vocab];
        assert!(
            row[id as usize].is_finite(),
            "row {r} sampled a masked token"
        );
    }
}

/// `logits` (`[rows, vocab]`) with the host's rule applied.
fn masked(logits: &[f32], vocab: usize, masks: &TokenMasks) -> Vec<f32> {
    let mut want = logits.to_vec();
    for (k, &r) in masks.rows.iter().enumerate() {
        let m = &masks.bits[k * masks.words..(k + 1) * masks.words];
        for tok in 0..vocab {
            if m[tok / 32] >> (tok % 32) & 1 == 0 {
                want[r as usize * vocab + tok] = f32::NEG_INFINITY;
            }
        }
    }
    want
}

fn same(got: &[f32], want: &[f32], vocab: usize) {
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(a == b, "element {i} (row {}): got {a}, want {b}", i / vocab);
    }
}

#[test]
fn masks_applied_back_to_back_each_reach_their_rows() {
    let Some(g) = gpu() else { return };
    let vocab = 151_936usize;
    let words = vocab.div_ceil(32);
    let mut rng = Rng::new(11);
    // Growing row counts, so that the device buffer is replaced on the way.
    let shapes = [4usize, 4, 64, 9, 256, 256, 3, 256];
    let mut cases = Vec::new();
    for &rows in &shapes {
        let logits = rvec(&mut rng, rows * vocab, 4.0);
        let masked_rows: Vec<u32> = (0..rows as u32).filter(|r| r % 3 != 1).collect();
        let bits = (0..masked_rows.len() * words)
            .map(|_| rng.next_u64() as u32 & rng.next_u64() as u32)
            .collect();
        let masks = TokenMasks {
            words,
            rows: masked_rows,
            bits,
        };
        let t = g.tensor_from_host(rows, vocab, &logits).unwrap();
        cases.push((t, logits, masks));
    }
    // Queued one after the other, nothing read back between them.
    for (t, _, masks) in &cases {
        g.apply_token_masks(t, masks).unwrap();
    }
    for (k, (t, logits, masks)) in cases.iter().enumerate() {
        let got = g.tensor_to_host(t).unwrap();
        let want = masked(logits, vocab, masks);
        assert_eq!(got.len(), want.len(), "case {k}");
        same(&got, &want, vocab);
    }
}
