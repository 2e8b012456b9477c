//! [`super::kgemm`] against the f64 product of the dequantized weights
//! (within the activation rounding bound, as in [`super::tests`]) and
//! against the block kernels on the portable path (the same 8-bit
//! activations and integer sums, so equal to f32 rounding), at row counts
//! around the tiles' and the dispatch's edges, on every path here; Q4_1
//! (32-blocks, its rows padded to whole groups) as well.

use super::tests::{cpu_seconds_per_call, dequant, random_blocks, Rng};
use super::*;

const K_QUANTS: [GgmlType; 3] = [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];
const TYPES: [GgmlType; 4] = [
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q4_1,
];
const ROWS: [usize; 6] = [1, 7, 32, 33, 100, 512];

/// The paths here that run the GEMM on `ty` (none without AVX2).
fn paths(ty: GgmlType) -> Vec<Isa> {
    Isa::available()
        .into_iter()
        .filter(|&isa| kgemm::handles(ty, isa))
        .collect()
}

#[test]
fn the_gemm_runs_where_it_says_and_only_on_k_quants_and_q4_1() {
    assert!(!kgemm::handles(GgmlType::Q4_K, Isa::Scalar));
    // Q4_1 on both SIMD paths, but never for prefill rows.
    for isa in [Isa::Avx2, Isa::Avx512Vnni] {
        assert_eq!(
            kgemm::handles(GgmlType::Q4_1, isa),
            cfg!(target_arch = "x86_64") && isa.is_available()
        );
    }
    for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni] {
        assert!(!kgemm::preferred(GgmlType::Q4_1, isa));
    }
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q3_K,
        GgmlType::IQ4_XS,
    ] {
        for isa in Isa::available() {
            assert!(!kgemm::handles(ty, isa), "{ty:?} {isa:?}");
            let mut y = [0f32; 1];
            assert!(!kgemm::matmul(
                &[0.0; 256],
                1,
                256,
                ty,
                &[0; 256],
                &mut y,
                1,
                isa
            ));
        }
    }
    for ty in K_QUANTS {
        for isa in paths(GgmlType::Q4_K) {
            assert!(kgemm::handles(ty, isa));
            assert!(kgemm::preferred(ty, isa));
        }
    }
    assert!(!kgemm::preferred(GgmlType::Q4_K, Isa::Scalar));
}

/// The backend's `linear` on kept k-quant blocks takes this GEMM from
/// `kgemm::min_rows` rows where it is preferred (batched decode steps) and
/// the block kernels below: its output equals the chosen kernel's bit for
/// bit on both sides of the switch.
#[test]
fn linear_switches_to_the_gemm_at_its_row_count() {
    use crate::cpu::matmul::{takes_kgemm, QUANT_MAX_ROWS};
    use crate::cpu::{CpuBackend, CpuOptions, WeightDtype};
    use crate::{Backend, HostData, HostTensor, QuantData};
    let opts = CpuOptions {
        threads: 2,
        weight_dtype: WeightDtype::F32,
    };
    let b = CpuBackend::new(opts).unwrap().with_quantized_weights(true);
    let mut rng = Rng(0x5EED);
    let (n, k) = (40, 512);
    let isa = Isa::detect();
    for ty in K_QUANTS {
        assert_eq!(kgemm::min_rows(ty, Isa::Avx512Vnni), 8);
    }
    assert_eq!(kgemm::min_rows(GgmlType::Q4_1, Isa::Avx512Vnni), 16);
    assert_eq!(kgemm::min_rows(GgmlType::Q4_K, Isa::Avx2), 17);
    assert_eq!(kgemm::min_rows(GgmlType::Q5_K, Isa::Avx2), 17);
    assert_eq!(
        kgemm::min_rows(GgmlType::Q6_K, Isa::Avx2),
        QUANT_MAX_ROWS + 1
    );
    for ty in TYPES {
        let min = kgemm::min_rows(ty, isa);
        assert!(min > 1 && min <= QUANT_MAX_ROWS + 1);
        let bytes = random_blocks(ty, n, k, &mut rng);
        let host = HostTensor {
            shape: vec![n, k],
            data: HostData::Quant(QuantData {
                ty,
                bytes: bytes.clone(),
            }),
        };
        let w = b.load_weight(host).unwrap();
        for rows in [min - 1, min, QUANT_MAX_ROWS] {
            let x: Vec<f32> = (0..rows * k).map(|_| rng.f()).collect();
            let got = b
                .linear(&b.tensor_from_host(rows, k, &x).unwrap(), &w, None)
                .unwrap();
            let mut want = vec![f32::NAN; rows * n];
            let gemm = takes_kgemm(ty, rows, isa);
            assert_eq!(gemm, rows >= min && kgemm::handles(ty, isa));
            if !gemm && rows > QUANT_MAX_ROWS {
                continue; // dequantized tiles, not the block kernels
            }
            if crate::cpu::matmul::takes_amx(ty, rows, k) {
                let v = b.load_weight(HostTensor {
                    shape: vec![n, k],
                    data: HostData::Quant(QuantData {
                        ty,
                        bytes: bytes.clone(),
                    }),
                });
                crate::cpu::amx::matmul(&x, rows, v.unwrap().view(), &mut want, 2);
            } else if gemm {
                assert!(kgemm::matmul(&x, rows, k, ty, &bytes, &mut want, 2, isa));
            } else {
                assert!(matmul(&x, rows, k, ty, &bytes, &mut want, 2, isa));
            }
            assert!(
                got.data()
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ty:?} {rows} rows (GEMM {gemm})"
            );
        }
    }
}

#[test]
fn gemm_matches_dequantized_weights_and_the_block_kernels() {
    let mut rng = Rng(0xC0FFEE);
    // Odd n: tiles of one weight row and a short last panel; K of one
    // slice and of several (2304: two VNNI slices; 8448: three AVX2 ones
    // and five VNNI ones, the later ones summed into the output), and of an
    // odd number of 256-groups (768, 2304, 8448: the VNNI layout pads them
    // to pairs).
    // Q4_1 also at a K of no whole groups (576: two and a quarter).
    let shapes = TYPES
        .iter()
        .flat_map(|&ty| [(37, 768, ty), (9, 1536, ty), (6, 2304, ty), (3, 8448, ty)])
        .chain([(37, 576, GgmlType::Q4_1), (5, 32, GgmlType::Q4_1)]);
    for (n, k, ty) in shapes {
        let w = random_blocks(ty, n, k, &mut rng);
        let wf = dequant(ty, &w, n * k);
        for rows in ROWS {
            let x: Vec<f32> = (0..rows * k)
                .map(|i| rng.f() * (1 + i % 7) as f32)
                .collect();
            let mut blocks = vec![0f32; rows * n];
            assert!(matmul(&x, rows, k, ty, &w, &mut blocks, 2, Isa::Scalar));
            for isa in paths(ty) {
                let mut got = vec![f32::NAN; rows * n];
                assert!(kgemm::matmul(&x, rows, k, ty, &w, &mut got, 2, isa));
                for (i, (&g, &b)) in got.iter().zip(&blocks).enumerate() {
                    let (r, j) = (i / n, i % n);
                    let (xr, wr) = (&x[r * k..(r + 1) * k], &wf[j * k..(j + 1) * k]);
                    let want: f64 = xr.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let mag: f64 = xr.iter().zip(wr).map(|(&a, &b)| (a * b).abs() as f64).sum();
                    let mut bound = 1e-5 * mag + 1e-6;
                    for (xb, wb) in xr.chunks(256).zip(wr.chunks(256)) {
                        let d = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
                        let wsum: f64 = wb.iter().map(|v| v.abs() as f64).sum();
                        bound += wsum * d / 2.0;
                    }
                    assert!(
                        (g as f64 - want).abs() <= bound,
                        "{ty:?} {isa:?} rows {rows} [{r}, {j}]: {g} vs {want} (bound {bound})"
                    );
                    // Same quantized activations and integer sums as the
                    // block kernels: only f32 rounding differs.
                    assert!(
                        ((g - b) as f64).abs() <= 2e-5 * mag + 1e-6,
                        "{ty:?} {isa:?} rows {rows} [{r}, {j}]: {g} vs blocks {b}"
                    );
                }
            }
        }
    }
}

/// Weights at the extremes of their ranges (all quants and scales at their
/// largest) still sum without integer overflow or 16-bit saturation.
#[test]
fn gemm_handles_extreme_quants() {
    let (n, k, rows) = (3, 4096, 5);
    for ty in TYPES {
        let mut w = vec![0xFFu8; n * row_bytes(ty, k)];
        for block in w.chunks_exact_mut(ty.type_size()) {
            let one = half::f16::from_f32(0.001).to_bits().to_le_bytes();
            let halves: &[usize] = if ty == GgmlType::Q6_K {
                &[208]
            } else {
                &[0, 2]
            };
            for &o in halves {
                block[o..o + 2].copy_from_slice(&one);
            }
            if ty == GgmlType::Q6_K {
                // The most negative signed scale.
                block[192..208].fill(0x80);
            }
        }
        let wf = dequant(ty, &w, n * k);
        // Even rows all 3 (the largest sums), odd rows alternating in sign.
        let x: Vec<f32> = (0..rows * k)
            .map(|i| {
                if (i / k) % 2 == 0 || i % 2 == 0 {
                    3.0
                } else {
                    -3.0
                }
            })
            .collect();
        for isa in paths(ty) {
            let mut got = vec![0f32; rows * n];
            assert!(kgemm::matmul(&x, rows, k, ty, &w, &mut got, 1, isa));
            for (i, &g) in got.iter().enumerate() {
                let (r, j) = (i / n, i % n);
                let want: f64 = x[r * k..(r + 1) * k]
                    .iter()
                    .zip(&wf[j * k..(j + 1) * k])
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum();
                let mag: f64 = wf[j * k..(j + 1) * k]
                    .iter()
                    .map(|v| 3.0 * v.abs() as f64)
                    .sum();
                assert!(
                    (g as f64 - want).abs() <= 1e-5 * mag + 1e-4,
                    "{ty:?} {isa:?}: {g} vs {want}"
                );
            }
        }
    }
}

/// Timing at Qwen2.5-1.5B shapes against the dequantized tiles (f32 GEMM
/// plus the per-call dequantization): `cargo test --release -p
/// pagoda-kernels --lib kgemm_timing -- --ignored --nocapture`.
/// `KGEMM_ROWS=N` sets the x rows (512), `KGEMM_SHAPES=q4:N:K,q6:N:K,...`
/// the weight shapes (Q4_K or Q6_K, `n` by `k`).
#[test]
#[ignore]
fn kgemm_timing() {
    use crate::cpu::{CpuBackend, CpuOptions, WeightDtype};
    use crate::{Backend, HostData, HostTensor, QuantData};
    let opts = CpuOptions {
        threads: 2,
        weight_dtype: WeightDtype::F32,
    };
    let quant = CpuBackend::new(opts).unwrap().with_quantized_weights(true);
    let dense = CpuBackend::new(opts).unwrap();
    let mut rng = Rng(5);
    let rows: usize = std::env::var("KGEMM_ROWS").map_or(512, |v| v.parse().unwrap());
    let mut shapes = vec![
        (GgmlType::Q4_K, 1536, 1536),
        (GgmlType::Q4_K, 8960, 1536),
        (GgmlType::Q6_K, 1536, 8960),
        (GgmlType::Q4_K, 1536, 8960),
    ];
    if let Ok(v) = std::env::var("KGEMM_SHAPES") {
        shapes = v
            .split(',')
            .map(|s| {
                let f: Vec<&str> = s.split(':').collect();
                let ty = if f[0] == "q6" {
                    GgmlType::Q6_K
                } else {
                    GgmlType::Q4_K
                };
                (ty, f[1].parse().unwrap(), f[2].parse().unwrap())
            })
            .collect();
    }
    for (ty, n, k) in shapes {
        let bytes = random_blocks(ty, n, k, &mut rng);
        let host = HostTensor {
            shape: vec![n, k],
            data: HostData::Quant(QuantData {
                ty,
                bytes: bytes.clone(),
            }),
        };
        let (wq, wd) = (
            quant.load_weight(host.clone()).unwrap(),
            dense.load_weight(host).unwrap(),
        );
        let x: Vec<f32> = (0..rows * k).map(|_| rng.f()).collect();
        let xt = quant.tensor_from_host(rows, k, &x).unwrap();
        let time = |f: &mut dyn FnMut()| cpu_seconds_per_call(1.0, f);
        let tk = time(&mut || {
            std::hint::black_box(quant.linear(&xt, &wq, None).unwrap());
        });
        // The f32 side only with KGEMM_F32=1 (it is slow and steady).
        let tg = if std::env::var_os("KGEMM_F32").is_some() {
            time(&mut || {
                std::hint::black_box(dense.linear(&xt, &wd, None).unwrap());
            })
        } else {
            f64::NAN
        };
        let mut y = vec![0f32; rows * n];
        let ta = time(&mut || {
            kgemm::matmul(&x, rows, k, ty, &bytes, &mut y, 2, Isa::Avx2);
        });
        let mut buf = vec![0f32; n * k];
        let tw = time(&mut || dequantize(ty, &bytes, &mut buf));
        let gf = |t: f64| 2.0 * (rows * n * k) as f64 / t / 1e9;
        println!(
            "{ty:?} [{n}, {k}] x {rows}: kgemm {:.2} cpu-ms ({:.0} GFLOP per cpu-s), on AVX2 {:.0}; f32 gemm {:.2} cpu-ms ({:.0}) + dequant {:.2} cpu-ms",
            tk * 1e3, gf(tk), gf(ta), tg * 1e3, gf(tg), tw * 1e3
        );
    }
}

/// CPU time of the block kernels ([`super::matmul`]) against this GEMM at
/// decode row counts (1 to 32 x rows; Qwen2.5-1.5B shapes, and
/// SmolLM2-135M's for Q4_1), for choosing
/// where batched decode steps switch over. Run with `cargo test --release
/// -p pagoda-kernels --lib decode_rows_timing -- --ignored --nocapture`.
#[test]
#[ignore]
fn decode_rows_timing() {
    let mut rng = Rng(6);
    let time = |f: &mut dyn FnMut()| cpu_seconds_per_call(0.5, f);
    let isa = Isa::detect();
    for (ty, n, k) in [
        (GgmlType::Q4_K, 8960, 1536),
        (GgmlType::Q6_K, 1536, 8960),
        (GgmlType::Q4_K, 1536, 8960),
        (GgmlType::Q5_K, 8960, 1536),
        (GgmlType::Q4_1, 1536, 576),
        (GgmlType::Q4_1, 576, 1536),
    ] {
        let bytes = random_blocks(ty, n, k, &mut rng);
        for rows in [1, 4, 8, 12, 16, 24, 32] {
            let x: Vec<f32> = (0..rows * k).map(|_| rng.f()).collect();
            let mut y = vec![0f32; rows * n];
            let tb = time(&mut || {
                super::matmul(&x, rows, k, ty, &bytes, &mut y, 2, isa);
            });
            let tk = time(&mut || {
                kgemm::matmul(&x, rows, k, ty, &bytes, &mut y, 2, isa);
            });
            println!(
                "{ty:?} [{n}, {k}] x {rows} on {isa:?}: blocks {:.3} cpu-ms, kgemm {:.3} cpu-ms",
                tb * 1e3,
                tk * 1e3
            );
        }
    }
}

/// The products alone (panel and activations prepared once), one thread,
/// best of many calls, in G integer MACs a second, with the time to
/// prepare the panel: the AVX2 tiles and, where the CPU has it, the VNNI
/// ones (their paired layout). `cargo test --release -p pagoda-kernels
/// --lib products_timing -- --ignored --nocapture` (`KGEMM_ROWS`, 32 by
/// default; `KGEMM_SLICE`, each path's own K slice by default).
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn products_timing() {
    use kgemm::x86::{prepare_acts, prepare_panel, Acts, Layout, Panel, SharedOut};
    let mut rng = Rng(7);
    let rows: usize = std::env::var("KGEMM_ROWS").map_or(32, |v| v.parse().unwrap());
    let best = |f: &mut dyn FnMut()| {
        (0..60)
            .map(|_| {
                let t = std::time::Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::MAX, f64::min)
    };
    for (ty, cols, k) in [
        (GgmlType::Q4_K, 128, 1536),
        (GgmlType::Q4_K, 32, 8960),
        (GgmlType::Q6_K, 32, 8960),
    ] {
        let bytes = random_blocks(ty, cols, k, &mut rng);
        let x: Vec<f32> = (0..rows * k).map(|_| rng.f()).collect();
        let mut y = vec![0f32; rows * cols];
        let out = SharedOut(y.as_mut_ptr());
        let macs = (rows * cols * k) as f64;
        print!("{ty:?} {rows} x [{cols}, {k}]:");
        for isa in [Isa::Avx2, Isa::Avx512Vnni] {
            if !isa.is_available() {
                continue;
            }
            let layout = Layout::new(ty, k, isa == Isa::Avx512Vnni);
            let (mut acts, mut panel) = (Acts::default(), Panel::default());
            prepare_acts(&x, rows, k, ty, layout, &mut acts);
            let slice = std::env::var("KGEMM_SLICE")
                .map_or(kgemm::x86::slice(layout.paired), |v| v.parse().unwrap());
            let per_slice = slice / (8 * layout.sub);
            let (kp, sub) = (layout.kp, layout.sub);
            // SAFETY: `isa` is available; `acts` and `panel` are prepared
            // for `rows` and `cols` rows in `layout`.
            unsafe {
                let tp = best(&mut || prepare_panel(ty, &bytes, cols, k, layout, &mut panel));
                let tm = best(&mut || {
                    if isa == Isa::Avx2 {
                        super::kgemm_avx2::multiply(
                            ty,
                            &acts,
                            &panel,
                            rows,
                            (0, cols),
                            cols,
                            kp,
                            sub,
                            per_slice,
                            &out,
                        )
                    } else {
                        super::kgemm_vnni::multiply(
                            &acts,
                            &panel,
                            rows,
                            (0, cols),
                            cols,
                            kp,
                            sub,
                            per_slice,
                            &out,
                        )
                    }
                });
                print!(
                    " {isa:?} panel {:.1} us, products {:.1} G/s;",
                    tp * 1e6,
                    macs / tm / 1e9
                );
            }
        }
        println!();
    }
}
