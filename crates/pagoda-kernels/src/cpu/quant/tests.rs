//! The block kernels against dequantize-then-f32 products, on every path
//! this machine runs (each forced explicitly), on random blocks.
//!
//! Tolerances: activations are rounded to multiples of `d = max|x| / 127`
//! per block (32 or 256 values), an error of at most `d / 2` per element, so
//! `|y - y_ref| <= sum_i |w_i| d(i) / 2` plus f32 rounding. With activations
//! that are already such multiples the quantization is exact and the check
//! is to f32 rounding only.

use super::*;
use crate::cpu::{CpuBackend, CpuOptions, WeightDtype};
use crate::{Backend, HostData, HostTensor, QuantData};

pub(crate) const TYPES: [GgmlType; 12] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

/// xorshift64*: deterministic test data without a dependency.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }

    /// Uniform in [-1, 1).
    pub(crate) fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Byte offsets of the f16 scales (and minimums) in a block of `ty`.
fn half_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => unreachable!("not a tested type"),
    }
}

/// `rows` rows of `k` columns of random blocks with finite, modest scales.
pub(crate) fn random_blocks(ty: GgmlType, rows: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let mut b: Vec<u8> = (0..rows * row_bytes(ty, k))
        .map(|_| rng.next() as u8)
        .collect();
    for block in b.chunks_exact_mut(ty.type_size()) {
        for &o in half_fields(ty) {
            let v = half::f16::from_f32(rng.f() * 0.05).to_bits().to_le_bytes();
            block[o..o + 2].copy_from_slice(&v);
        }
    }
    b
}

/// Process CPU seconds per call of `f` (all threads, so a loaded machine
/// does not count against it), over at least `min_s` CPU seconds and two
/// calls: the timing tests' clock.
pub(crate) fn cpu_seconds_per_call(min_s: f64, f: &mut dyn FnMut()) -> f64 {
    let cpu = || {
        let s = std::fs::read_to_string("/proc/self/stat").unwrap();
        let f: Vec<f64> = s[s.rfind(')').unwrap() + 2..]
            .split(' ')
            .map(|v| v.parse().unwrap_or(0.0))
            .collect();
        (f[11] + f[12]) / 100.0
    };
    let c = cpu();
    let mut calls = 0;
    while cpu() - c < min_s || calls < 2 {
        f();
        calls += 1;
    }
    (cpu() - c) / calls as f64
}

pub(crate) fn dequant(ty: GgmlType, b: &[u8], elements: usize) -> Vec<f32> {
    let mut out = vec![0f32; elements];
    pagoda_gguf::dequant::dequantize_into(ty, b, &mut out).unwrap();
    out
}

/// For every type and path: `matmul` against the f64 product of the
/// dequantized weights, within the bound of the activation rounding.
fn check(exact_activations: bool, row_counts: &[usize]) {
    let mut rng = Rng(0x9E3779B97F4A7C15);
    let (n, k) = (37, 512);
    for ty in TYPES {
        let w = random_blocks(ty, n, k, &mut rng);
        let wf = dequant(ty, &w, n * k);
        let qb = if ty.block_size() == 256 { 256 } else { 32 };
        for &rows in row_counts {
            let x: Vec<f32> = if exact_activations {
                // Multiples of a per-block scale with one |q| = 127 per block.
                (0..rows * k)
                    .map(|i| {
                        let q = if i % qb == 5 {
                            127.0
                        } else {
                            (rng.f() * 127.0).round()
                        };
                        q * 0.01 * (1 + (i / qb) % 3) as f32
                    })
                    .collect()
            } else {
                (0..rows * k)
                    .map(|i| rng.f() * (1 + i % 7) as f32)
                    .collect()
            };
            let mut want = Vec::new();
            let mut bound = Vec::new();
            for r in 0..rows {
                for j in 0..n {
                    let (xr, wr) = (&x[r * k..(r + 1) * k], &wf[j * k..(j + 1) * k]);
                    let y: f64 = xr.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let mag: f64 = xr.iter().zip(wr).map(|(&a, &b)| (a * b).abs() as f64).sum();
                    let mut e = 1e-5 * mag + 1e-6;
                    if !exact_activations {
                        for (xb, wb) in xr.chunks(qb).zip(wr.chunks(qb)) {
                            let d = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
                            let wsum: f64 = wb.iter().map(|v| v.abs() as f64).sum();
                            e += wsum * d / 2.0;
                        }
                    }
                    want.push(y);
                    bound.push(e);
                }
            }
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; n * rows];
                assert!(matmul(&x, rows, k, ty, &w, &mut got, 2, isa));
                for (i, (&g, (&y, &e))) in got.iter().zip(want.iter().zip(&bound)).enumerate() {
                    assert!(
                        (g as f64 - y).abs() <= e,
                        "{ty:?} {isa:?} rows {rows} out {i}: {g} vs {y} (bound {e})"
                    );
                }
            }
        }
    }
}

#[test]
fn every_path_matches_dequantized_weights_with_exact_activations() {
    check(true, &[1, 3, 6, 11]);
}

#[test]
fn every_path_stays_within_the_activation_rounding_bound() {
    check(false, &[1, 3, 6, 11]);
}

/// Batched-decode and short-prefill row counts: past the 8-row groups, the
/// 16 rows the kernels once stopped at, and the 64 rows of one kernel call.
#[test]
fn every_path_matches_dequantized_weights_from_17_to_100_rows() {
    check(true, &[16, 17, 24, 31, 33, 40, 63, 64, 65, 100]);
    check(false, &[17, 40, 64, 65]);
}

#[test]
fn simd_paths_agree_with_the_portable_one() {
    let mut rng = Rng(12345);
    let (n, k) = (19, 768);
    for ty in TYPES {
        let w = random_blocks(ty, n, k, &mut rng);
        let x: Vec<f32> = (0..2 * k).map(|_| rng.f()).collect();
        let mut base = vec![0f32; n * 2];
        assert!(matmul(&x, 2, k, ty, &w, &mut base, 1, Isa::Scalar));
        for isa in Isa::available() {
            let mut got = vec![0f32; n * 2];
            assert!(matmul(&x, 2, k, ty, &w, &mut got, 1, isa));
            for (g, b) in got.iter().zip(&base) {
                // Same integer sums; only the order of f32 additions differs.
                assert!(
                    (g - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{ty:?} {isa:?}: {g} vs {b}"
                );
            }
        }
    }
}

#[test]
fn detected_path_is_available_and_unknown_types_have_no_kernel() {
    assert!(Isa::detect().is_available());
    assert!(Isa::available().contains(&Isa::Scalar));
    assert!(!supported(GgmlType::IQ2_XXS));
    let mut out = [0f32; 1];
    assert!(!matmul(
        &[0.0; 256],
        1,
        256,
        GgmlType::IQ2_XXS,
        &[0; 66],
        &mut out,
        1,
        Isa::Scalar
    ));
}

/// The backend's `linear` on kept blocks (decode rows through the block
/// kernels, prefill rows through the k-quant GEMM or dequantized tiles)
/// against the same blocks dequantized at load.
#[test]
fn backend_linear_on_kept_blocks_matches_the_dequantizing_backend() {
    let mut rng = Rng(777);
    let opts = CpuOptions {
        threads: 2,
        weight_dtype: WeightDtype::F32,
    };
    let quant = CpuBackend::new(opts).unwrap().with_quantized_weights(true);
    let dense = CpuBackend::new(opts).unwrap();
    let (n, k) = (48, 256);
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q6_K,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
    ] {
        let bytes = random_blocks(ty, n, k, &mut rng);
        let host = HostTensor {
            shape: vec![n, k],
            data: HostData::Quant(QuantData { ty, bytes }),
        };
        let wq = quant.load_weight(host.clone()).unwrap();
        let wd = dense.load_weight(host).unwrap();
        assert_eq!(wq.quant_type(), Some(ty));
        assert_eq!(wd.quant_type(), None);
        assert_eq!(wq.bytes(), row_bytes(ty, k) * n);
        let bias = HostTensor::f32(vec![n], (0..n).map(|_| rng.f()).collect());
        let (bq, bd) = (
            quant.load_weight(bias.clone()).unwrap(),
            dense.load_weight(bias).unwrap(),
        );
        for rows in [1, 5, 40, 100] {
            let x: Vec<f32> = (0..rows * k).map(|_| rng.f()).collect();
            let xq = quant.tensor_from_host(rows, k, &x).unwrap();
            let yq = quant.linear(&xq, &wq, Some(&bq)).unwrap();
            let yd = dense.linear(&xq, &wd, Some(&bd)).unwrap();
            let wf = wd.to_f32_vec();
            for (i, (a, b)) in yq.data().iter().zip(yd.data()).enumerate() {
                let (r, j) = (i / n, i % n);
                let wsum: f32 = wf[j * k..(j + 1) * k].iter().map(|v| v.abs()).sum();
                // |x| < 1: activation rounding errs by at most 1/254 per element.
                // Both the block kernels and the k-quant GEMM (prefill rows)
                // take 8-bit activations.
                let blocks = rows <= crate::cpu::matmul::QUANT_MAX_ROWS
                    || kgemm::preferred(ty, Isa::detect());
                // The AMX tiles round both operands to bf16 (2^-9 each).
                let tol = if crate::cpu::matmul::takes_amx(ty, rows, k) {
                    wsum / 256.0 + 1e-4
                } else if blocks {
                    wsum / 254.0 + 1e-4
                } else {
                    1e-4
                };
                assert!(
                    (a - b).abs() <= tol,
                    "{ty:?} rows {rows} [{r}, {j}]: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn blocks_without_a_dequantizer_are_an_error() {
    let b = CpuBackend::new(CpuOptions::default()).unwrap();
    let host = HostTensor {
        shape: vec![1, 256],
        data: HostData::Quant(QuantData {
            ty: GgmlType::IQ2_XXS,
            bytes: vec![0; 66],
        }),
    };
    assert!(b.load_weight(host.clone()).is_err());
    assert!(b.with_quantized_weights(true).load_weight(host).is_err());
}

/// The portable k-quant kernels share each unpacked block across up to 8 x
/// rows: same integer sums and same f32 operations as the one-row reference
/// functions, so equal to them exactly, for every group size.
#[test]
fn portable_multi_row_k_quants_equal_the_one_row_functions() {
    type One = fn(&[u8], &[act::BlockQ8K]) -> f32;
    type Rows = fn(&[u8], &[act::BlockQ8K], usize, &mut [f32]);
    let kinds: [(GgmlType, One, Rows); 5] = [
        (GgmlType::Q2_K, scalar::q2_k, scalar::rows::q2_k),
        (GgmlType::Q3_K, scalar::q3_k, scalar::rows::q3_k),
        (GgmlType::Q4_K, scalar::q4_k, scalar::rows::q4_k),
        (GgmlType::Q5_K, scalar::q5_k, scalar::rows::q5_k),
        (GgmlType::Q6_K, scalar::q6_k, scalar::rows::q6_k),
    ];
    let mut rng = Rng(4242);
    let k = 768;
    for (ty, one, rows_fn) in kinds {
        let w = random_blocks(ty, 1, k, &mut rng);
        for rows in [1, 7, 8, 13] {
            let x: Vec<f32> = (0..rows * k).map(|_| rng.f()).collect();
            let mut a = vec![act::BlockQ8K::default(); rows * k / 256];
            act::quantize_q8k(&x, &mut a);
            let mut got = vec![f32::NAN; rows];
            rows_fn(&w, &a, rows, &mut got);
            for (r, g) in got.iter().enumerate() {
                let want = one(&w, &a[r * 3..(r + 1) * 3]);
                assert_eq!(g.to_bits(), want.to_bits(), "{ty:?} rows {rows} row {r}");
            }
        }
    }
}

/// Widening blocks to f32 on every path equals the portable dequantizers
/// bit for bit (same f32 operations in the same order).
#[test]
fn simd_widening_equals_the_portable_dequantizers() {
    let mut rng = Rng(99);
    for ty in TYPES {
        let k = 512;
        let w = random_blocks(ty, 3, k, &mut rng);
        let want = dequant(ty, &w, 3 * k);
        for isa in Isa::available() {
            let mut got = vec![f32::NAN; 3 * k];
            dequantize_on(ty, &w, &mut got, isa);
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), e.to_bits(), "{ty:?} {isa:?} element {i}");
            }
        }
    }
}

/// Blocks widened straight to bf16 ([`super::widen_bf16`]) are the portable
/// dequantizers' f32 rounded to nearest even, bit for bit; the types it
/// lacks write nothing and say so.
#[test]
fn bf16_widening_is_the_rounded_dequantizer() {
    use super::widen_bf16;
    let mut rng = Rng(4242);
    let mut ran = 0;
    for ty in TYPES {
        let k = 512;
        let w = random_blocks(ty, 3, k, &mut rng);
        // Rows 1..3, the second half of each (past the first block), at a
        // stride longer than the piece.
        let (bs, stride) = (ty.block_size(), k + 40);
        let (k0, len) = if bs < k { (k / 2, k / 2) } else { (0, k) };
        let mut got = vec![0xFFFFu16; 2 * stride];
        let w_rows = (1, 2);
        if !widen_bf16::handles(ty) {
            assert!(!widen_bf16::rows(
                ty,
                &w,
                k,
                w_rows,
                (k0, len),
                &mut got,
                stride
            ));
            assert!(got.iter().all(|&g| g == 0xFFFF), "{ty:?} wrote");
            continue;
        }
        assert!(widen_bf16::rows(
            ty,
            &w,
            k,
            w_rows,
            (k0, len),
            &mut got,
            stride
        ));
        let want = dequant(ty, &w, 3 * k);
        for i in 0..2 {
            for j in 0..stride {
                let g = got[i * stride + j];
                if j >= len {
                    assert_eq!(g, 0xFFFF, "{ty:?} wrote past the piece");
                    continue;
                }
                let e = half::bf16::from_f32(want[(1 + i) * k + k0 + j]).to_bits();
                assert_eq!(g, e, "{ty:?} row {} element {}", 1 + i, k0 + j);
            }
        }
        ran += 1;
    }
    if ran == 0 {
        eprintln!("no AVX512-BF16 here: the bf16 widening has nothing to check");
    }
}

/// The SIMD activation quantizer gives the portable one's values (no value
/// of random data lies exactly halfway between two integers).
#[test]
fn simd_activation_quantization_matches_the_portable_rounding() {
    let mut rng = Rng(31337);
    let x: Vec<f32> = (0..4 * 256).map(|i| rng.f() * (1 + i % 5) as f32).collect();
    let mut got = vec![act::BlockQ8K::default(); 4];
    act::quantize_q8k(&x, &mut got);
    for (b, xs) in got.iter().zip(x.chunks_exact(256)) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(b.d, amax / 127.0);
        for (q, v) in b.q.iter().zip(xs) {
            let want = (v / b.d).round().clamp(-127.0, 127.0) as i8;
            assert!(
                (*q as i32 - want as i32).abs() <= 1,
                "{v} -> {q}, want {want}"
            );
            assert!((*q as f32 * b.d - v).abs() <= b.d * 0.5001);
        }
        for (s, q) in b.bsums.iter().zip(b.q.chunks_exact(16)) {
            assert_eq!(*s, q.iter().map(|&v| v as i16).sum::<i16>());
        }
    }
}

/// The word-wide Q4_K / Q5_K scale decoding of the SIMD kernels reads the
/// same scales and minimums as the portable per-sub-block one, for random
/// and all-ones scale bytes.
#[cfg(target_arch = "x86_64")]
#[test]
fn word_wide_k4_scales_equal_the_portable_decoding() {
    let mut rng = Rng(777);
    let mut cases: Vec<[u8; 12]> = vec![[0xFF; 12], [0; 12], [0xC0; 12], [0x3F; 12]];
    for _ in 0..200 {
        let mut b = [0u8; 12];
        b.iter_mut().for_each(|v| *v = rng.next() as u8);
        cases.push(b);
    }
    for b in cases {
        // SAFETY: reads the 12 bytes of `b` only.
        let (sc, m) = unsafe { super::x86::k4_scales_mins(b.as_ptr()) };
        for j in 0..8 {
            let (ws, wm) = scalar::scale_min_k4(j, &b);
            assert_eq!(((sc >> (8 * j)) & 0xFF) as i32, ws, "scale {j} of {b:?}");
            assert_eq!(((m >> (8 * j)) & 0xFF) as i32, wm, "minimum {j} of {b:?}");
        }
    }
}
