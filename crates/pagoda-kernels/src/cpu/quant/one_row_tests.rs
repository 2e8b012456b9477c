//! Tests of the one-x-row kernels ([`super::one_row_fn`] for the k-quants,
//! [`super::one_row_q8_fn`] for the 32-block formats): on every SIMD path,
//! against the row-by-row kernels ([`super::dot_fn`]) and the dequantized
//! weights, on odd weight-row counts and chunk boundaries; and an ignored
//! timing of the two at decode shapes.

use super::act::{quantize_q8, quantize_q8k, BlockQ8, BlockQ8K};
use super::tests::{dequant, random_blocks, Rng};
use super::{dot_fn, matmul, one_row_fn, one_row_q8_fn, row_bytes, Dot, DotOneRow, Isa};
use crate::GgmlType;

const TYPES: [GgmlType; 3] = [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];

/// The row-by-row kernel of `ty` on `isa` at one x row.
fn by_rows(ty: GgmlType, isa: Isa, w: &[u8], rb: usize, a: &[BlockQ8K], out: &mut [f32]) {
    let Some(Dot::Q8K(f)) = dot_fn(ty, isa) else {
        panic!("{ty:?} has a 256-block kernel on {isa:?}");
    };
    for (j, o) in out.iter_mut().enumerate() {
        // SAFETY: `f` runs here (dot_fn checked), the row is whole blocks.
        unsafe { f(&w[j * rb..(j + 1) * rb], a, 1, std::slice::from_mut(o)) };
    }
}

/// The Q4_K one-row kernel with per-register scales (the timing test's
/// comparison), checked alongside.
fn spread(ty: GgmlType, isa: Isa) -> Option<DotOneRow> {
    #[cfg(target_arch = "x86_64")]
    match (ty, isa) {
        (GgmlType::Q4_K, Isa::Avx2) => return Some(super::x86::avx2_one_row::q4_k_one_row_spread),
        (GgmlType::Q4_K, Isa::Avx512Vnni) => {
            return Some(super::x86::vnni_one_row::q4_k_one_row_spread)
        }
        _ => {}
    }
    let _ = (ty, isa);
    None
}

/// `matmul` at one x row (which takes the one-row kernels) on 1 and 2
/// threads against the f64 product of the dequantized weights `wf`, within
/// the rounding of activations quantized in blocks of `block`: half a step
/// per element.
fn matmul_near_dequantized(ty: GgmlType, isa: Isa, x: &[f32], w: &[u8], wf: &[f32], block: usize) {
    let k = x.len();
    let n = wf.len() / k;
    for threads in [1, 2] {
        let mut y = vec![f32::NAN; n];
        assert!(matmul(x, 1, k, ty, w, &mut y, threads, isa));
        for (j, g) in y.iter().enumerate() {
            let wr = &wf[j * k..(j + 1) * k];
            let e: f64 = x.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum();
            let mut bound = 1e-4;
            for (xb, wb) in x.chunks(block).zip(wr.chunks(block)) {
                let d = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
                bound += wb.iter().map(|v| v.abs() as f64).sum::<f64>() * d / 2.0;
            }
            assert!(
                (*g as f64 - e).abs() <= bound,
                "{ty:?} {isa:?} [{n}, {k}] {threads} threads row {j}: {g} vs {e}"
            );
        }
    }
}

#[test]
fn one_row_kernels_exist_exactly_on_the_simd_paths() {
    for ty in TYPES {
        assert!(one_row_fn(ty, Isa::Scalar).is_none());
        for isa in Isa::available() {
            assert_eq!(
                one_row_fn(ty, isa).is_some(),
                isa != Isa::Scalar,
                "{ty:?} {isa:?}"
            );
        }
    }
    assert!(one_row_fn(GgmlType::Q4_0, Isa::detect()).is_none());
}

/// The 32-block formats' one-row kernels (four weight rows a pass) do each
/// weight row's arithmetic in the row-by-row kernel's order, so they equal
/// it bit for bit, on odd row counts and from any start row; through
/// `matmul` at one x row (which takes them) the product stays near the
/// dequantized weights' on 1 and 2 threads.
#[test]
fn one_row_32_block_kernels_equal_the_row_kernels_bitwise() {
    use GgmlType as T;
    let mut rng = Rng(0x00B1_0C32);
    for ty in [T::Q4_0, T::Q4_1, T::Q5_0, T::Q5_1, T::Q8_0, T::IQ4_NL] {
        assert!(one_row_q8_fn(ty, Isa::Scalar).is_none());
        for (n, k) in [(1, 32), (6, 64), (13, 576), (37, 1536)] {
            let w = random_blocks(ty, n, k, &mut rng);
            let rb = row_bytes(ty, k);
            let x: Vec<f32> = (0..k).map(|_| rng.f()).collect();
            let mut a = vec![BlockQ8::default(); k / 32];
            quantize_q8(&x, &mut a);
            let wf = dequant(ty, &w, n * k);
            for isa in Isa::available() {
                let Some(f) = one_row_q8_fn(ty, isa) else {
                    assert_eq!(isa, Isa::Scalar, "{ty:?} has a one-row kernel on {isa:?}");
                    continue;
                };
                let Some(Dot::Q8(row)) = dot_fn(ty, isa) else {
                    panic!("{ty:?} has a 32-block kernel on {isa:?}");
                };
                let mut want = vec![0f32; n];
                for (j, o) in want.iter_mut().enumerate() {
                    // SAFETY: `row` runs here (dot_fn checked); whole blocks.
                    unsafe { row(&w[j * rb..(j + 1) * rb], &a, 1, std::slice::from_mut(o)) };
                }
                for j0 in [0, n / 2, n - 1] {
                    let mut got = vec![f32::NAN; n - j0];
                    // SAFETY: `f` runs here; rows j0..n are whole blocks.
                    unsafe { f(&w[j0 * rb..n * rb], rb, &a, &mut got) };
                    for (j, (g, e)) in got.iter().zip(&want[j0..]).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            e.to_bits(),
                            "{ty:?} {isa:?} [{n}, {k}] row {}",
                            j0 + j
                        );
                    }
                }
                matmul_near_dequantized(ty, isa, &x, &w, &wf, 32);
            }
        }
    }
}

/// Odd weight-row counts, every start row of a chunk, and 1 to 6 blocks per
/// row: the same integer sums as the row-by-row kernels, so equal up to the
/// f32 summation order; and the product through `matmul` at one x row stays
/// near the dequantized weights' on 1 and 2 threads.
#[test]
fn one_row_kernels_equal_the_row_kernels_on_odd_row_counts() {
    let mut rng = Rng(0x51ED_270B);
    for ty in TYPES {
        for (n, k) in [(1, 256), (7, 512), (13, 1536), (37, 768)] {
            let w = random_blocks(ty, n, k, &mut rng);
            let rb = row_bytes(ty, k);
            let x: Vec<f32> = (0..k).map(|_| rng.f()).collect();
            let mut a = vec![BlockQ8K::default(); k / 256];
            quantize_q8k(&x, &mut a);
            let wf = dequant(ty, &w, n * k);
            for isa in Isa::available() {
                let Some(f) = one_row_fn(ty, isa) else {
                    continue;
                };
                let mut want = vec![0f32; n];
                by_rows(ty, isa, &w, rb, &a, &mut want);
                for (j0, f) in [0, n / 2, n - 1]
                    .into_iter()
                    .flat_map(|j0| [f].into_iter().chain(spread(ty, isa)).map(move |f| (j0, f)))
                {
                    let mut got = vec![f32::NAN; n - j0];
                    // SAFETY: `f` runs here; rows j0..n are whole blocks.
                    unsafe { f(&w[j0 * rb..n * rb], rb, &a, &mut got) };
                    for (j, (g, e)) in got.iter().zip(&want[j0..]).enumerate() {
                        // The f32 rounding of the sums (i32 lanes past 2^24
                        // round on conversion), against the terms' magnitude.
                        let wr = &wf[(j0 + j) * k..(j0 + j + 1) * k];
                        let mag: f32 = x.iter().zip(wr).map(|(a, b)| (a * b).abs()).sum();
                        assert!(
                            (g - e).abs() <= 1e-6 * mag + 1e-5 * (1.0 + e.abs()),
                            "{ty:?} {isa:?} [{n}, {k}] row {}: {g} vs {e}",
                            j0 + j
                        );
                    }
                }
                matmul_near_dequantized(ty, isa, &x, &w, &wf, 256);
            }
        }
    }
}

/// Wall time per block (the least of many alternating trials, so that
/// other processes' time slices drop out) of the one-row kernels against
/// the row-by-row ones and each other, one thread, on weights far larger
/// than the caches (streamed, as in decode) and on weights that stay in L2:
/// `cargo test --release -p pagoda-kernels --lib one_row_timing --
/// --ignored --nocapture`.
#[test]
#[ignore]
#[cfg(target_arch = "x86_64")]
fn one_row_timing() {
    use super::x86::{avx2_one_row as avx2, vnni_one_row as vnni};
    use std::time::Instant;
    type K = DotOneRow;
    let mut rng = Rng(77);
    let isa = Isa::detect();
    let (packed, spread, q6): (K, K, K) = match isa {
        Isa::Avx512Vnni => (
            vnni::q4_k_one_row,
            vnni::q4_k_one_row_spread,
            vnni::q6_k_one_row,
        ),
        Isa::Avx2 => (
            avx2::q4_k_one_row,
            avx2::q4_k_one_row_spread,
            avx2::q6_k_one_row,
        ),
        Isa::Scalar => return,
    };
    println!("{isa:?}");
    for (ty, n, k) in [
        (GgmlType::Q4_K, 8960, 1536),
        (GgmlType::Q4_K, 1536, 8960),
        (GgmlType::Q4_K, 128, 1536),
        (GgmlType::Q6_K, 1536, 8960),
        (GgmlType::Q6_K, 128, 1536),
    ] {
        let variants: Vec<(&str, Option<K>)> = match ty {
            GgmlType::Q4_K => vec![
                ("row by row", None),
                ("one-row, packed scales", Some(packed)),
                ("one-row, spread scales", Some(spread)),
            ],
            _ => vec![("row by row", None), ("one-row", Some(q6))],
        };
        let rb = row_bytes(ty, k);
        // Past the 32 MiB L3, several copies taken in turn (as a decode
        // step's layers are); a small matrix is one copy that stays in L2.
        let copies = if n * rb > 1 << 20 {
            (96 << 20) / (n * rb) + 1
        } else {
            1
        };
        let ws: Vec<Vec<u8>> = (0..copies)
            .map(|_| random_blocks(ty, n, k, &mut rng))
            .collect();
        let x: Vec<f32> = (0..k).map(|_| rng.f()).collect();
        let mut a = vec![BlockQ8K::default(); k / 256];
        quantize_q8k(&x, &mut a);
        let mut y = vec![0f32; n];
        let blocks = (n * k / 256) as f64;
        // About 4 MiB of weights per trial.
        let per = (1 << 22) / (n * rb) + 1;
        let mut best = vec![f64::INFINITY; variants.len()];
        let mut c = 0;
        for _ in 0..30 {
            for (v, (_, f)) in variants.iter().enumerate() {
                let t = Instant::now();
                for _ in 0..per {
                    c = (c + 1) % copies;
                    match f {
                        None => by_rows(ty, isa, &ws[c], rb, &a, &mut y),
                        // SAFETY: `isa` is this machine's; each copy is `n` rows of whole blocks.
                        Some(f) => unsafe { f(&ws[c], rb, &a, &mut y) },
                    }
                }
                best[v] = best[v].min(t.elapsed().as_secs_f64() / per as f64);
            }
        }
        let line: Vec<String> = variants
            .iter()
            .zip(&best)
            .map(|((name, _), t)| {
                let gbs = (n * rb) as f64 / t / 1e9;
                format!("{name} {:.2} ns/block ({gbs:.1} GB/s)", t / blocks * 1e9)
            })
            .collect();
        println!("{ty:?} [{n}, {k}]: {}", line.join(", "));
    }
}
