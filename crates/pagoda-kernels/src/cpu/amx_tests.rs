//! The AMX tile GEMM against f64 products of the same bf16-rounded operands
//! (so only the f32 summation differs) and against the unrounded f32
//! product (within the rounding of the two operands), for every block type,
//! at row counts around the tile size and weight rows around the blocks'.
//! On a machine without AMX the checks have nothing to run and say so.

use super::*;
use crate::cpu::quant::tests::{cpu_seconds_per_call, dequant, random_blocks, Rng, TYPES};
use crate::cpu::storage::ViewData;
use crate::GgmlType;

/// One output's references in f64: the dot of the bf16-rounded operands,
/// the exact dot, and the sum of the products' magnitudes (the tolerances'
/// scale).
struct Dots {
    rounded: f64,
    exact: f64,
    mag: f64,
}

fn dots(x: &[f32], w: &[f32]) -> Dots {
    let round = |v: f32| half::bf16::from_f32(v).to_f64();
    let mut d = Dots {
        rounded: 0.0,
        exact: 0.0,
        mag: 0.0,
    };
    for (&a, &b) in x.iter().zip(w) {
        let p = a as f64 * b as f64;
        d.rounded += round(a) * round(b);
        d.exact += p;
        d.mag += p.abs();
    }
    d
}

fn view(ty: GgmlType, bytes: &[u8], n: usize, k: usize) -> WeightView<'_> {
    WeightView {
        rows: n,
        cols: k,
        data: ViewData::Quant(ty, bytes),
    }
}

/// Whether the tile unit runs here (printed when not).
fn here() -> bool {
    let ok = available();
    if !ok {
        eprintln!("no AMX-BF16 here (or the tile data was refused): nothing to check");
    }
    ok
}

#[test]
fn tiles_match_products_of_the_rounded_operands() {
    if !here() {
        return;
    }
    let mut rng = Rng(0xA3A3);
    for ty in TYPES {
        let k = ty.block_size().max(32) * 2;
        // 1 and 33 weight rows: a padded tile pair; 70: several blocks
        // across the threads with a tail.
        for n in [1usize, 33, 70] {
            let bytes = random_blocks(ty, n, k, &mut rng);
            let wf = dequant(ty, &bytes, n * k);
            // Up to 64 rows k in slices (one odd tile, pairs, a lone last
            // tile); 97 (seven tiles) the whole k at once.
            for rows in [MIN_ROWS, 17, 32, 33, 50, 97] {
                let x: Vec<f32> = (0..rows * k)
                    .map(|i| rng.f() * (1 + i % 5) as f32)
                    .collect();
                let mut y = vec![f32::NAN; rows * n];
                matmul(&x, rows, view(ty, &bytes, n, k), &mut y, 2);
                for r in 0..rows {
                    for j in 0..n {
                        let (xr, wr) = (&x[r * k..(r + 1) * k], &wf[j * k..(j + 1) * k]);
                        let Dots {
                            rounded,
                            exact,
                            mag,
                        } = dots(xr, wr);
                        let got = y[r * n + j] as f64;
                        // f32 sums of k products: a few ulps of the magnitude.
                        assert!(
                            (got - rounded).abs() <= 1e-5 * mag + 1e-30,
                            "{ty:?} n {n} rows {rows} ({r}, {j}): {got} against {rounded}"
                        );
                        // Each operand off by at most 2^-9 of itself.
                        assert!(
                            (got - exact).abs() <= (2.0 / 512.0 + 1e-5) * mag + 1e-30,
                            "{ty:?} n {n} rows {rows} ({r}, {j}): {got} against {exact}"
                        );
                    }
                }
            }
        }
    }
}

/// Long k (many chunks a tile) at model-like widths, against the rounded
/// products: the chunk pointers advance right across the whole row.
#[test]
fn long_rows_and_wide_weights() {
    if !here() {
        return;
    }
    let mut rng = Rng(0xB4B4);
    for (ty, n, k) in [
        (GgmlType::Q4_K, 300, 2048),
        (GgmlType::Q4_1, 576, 1536),
        (GgmlType::Q8_0, 97, 4096),
    ] {
        let bytes = random_blocks(ty, n, k, &mut rng);
        let wf = dequant(ty, &bytes, n * k);
        let rows = 40;
        let x: Vec<f32> = (0..rows * k).map(|_| rng.f()).collect();
        let mut y = vec![f32::NAN; rows * n];
        matmul(&x, rows, view(ty, &bytes, n, k), &mut y, 2);
        for r in (0..rows).step_by(7) {
            for j in 0..n {
                let (xr, wr) = (&x[r * k..(r + 1) * k], &wf[j * k..(j + 1) * k]);
                let Dots { rounded, mag, .. } = dots(xr, wr);
                let got = y[r * n + j] as f64;
                assert!(
                    (got - rounded).abs() <= 1e-5 * mag + 1e-30,
                    "{ty:?} [{n}, {k}] ({r}, {j})"
                );
            }
        }
    }
}

/// The backend's `linear` takes the tiles from `MIN_ROWS` rows (bias
/// added after) and the other kernels below.
#[test]
fn linear_takes_the_tiles_from_min_rows() {
    use crate::cpu::{CpuBackend, CpuOptions, WeightDtype};
    use crate::{Backend, HostData, HostTensor, QuantData};
    if !here() {
        return;
    }
    let b = CpuBackend::new(CpuOptions {
        threads: 2,
        weight_dtype: WeightDtype::F32,
    })
    .unwrap()
    .with_quantized_weights(true);
    let mut rng = Rng(0xC5C5);
    let (ty, n, k) = (GgmlType::Q4_1, 48, 256);
    let bytes = random_blocks(ty, n, k, &mut rng);
    let w = b
        .load_weight(HostTensor {
            shape: vec![n, k],
            data: HostData::Quant(QuantData {
                ty,
                bytes: bytes.clone(),
            }),
        })
        .unwrap();
    let bias_v: Vec<f32> = (0..n).map(|_| rng.f()).collect();
    let bias = b
        .load_weight(HostTensor {
            shape: vec![n],
            data: HostData::F32(bias_v.clone()),
        })
        .unwrap();
    for rows in [MIN_ROWS - 1, MIN_ROWS, 64] {
        let x: Vec<f32> = (0..rows * k).map(|_| rng.f()).collect();
        let got = b
            .linear(&b.tensor_from_host(rows, k, &x).unwrap(), &w, Some(&bias))
            .unwrap();
        assert_eq!(crate::cpu::matmul::takes_amx(ty, rows, k), rows >= MIN_ROWS);
        if rows < MIN_ROWS {
            continue;
        }
        let mut tiles = vec![0f32; rows * n];
        matmul(&x, rows, view(ty, &bytes, n, k), &mut tiles, 2);
        let same = got
            .data()
            .iter()
            .enumerate()
            .all(|(i, v)| v.to_bits() == (tiles[i] + bias_v[i % n]).to_bits());
        assert!(same, "{rows} rows");
    }
}

/// CPU time of the tiles against the path `linear` takes without them, at
/// decode and prefill row counts (Qwen2.5-1.5B and SmolLM2-135M shapes):
/// `cargo test --release -p pagoda-kernels --lib amx_timing -- --ignored
/// --nocapture` (`AMX_ROWS=16,32` sets the row counts).
#[test]
#[ignore]
fn amx_timing() {
    use crate::cpu::quant::{self, kgemm, Isa};
    if !here() {
        return;
    }
    let time = |f: &mut dyn FnMut()| cpu_seconds_per_call(0.5, f);
    let rows_list: Vec<usize> = std::env::var("AMX_ROWS").map_or(vec![16, 24, 32, 64, 512], |v| {
        v.split(',').map(|r| r.parse().unwrap()).collect()
    });
    let isa = Isa::detect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let mut rng = Rng(7);
    for (ty, n, k) in [
        (GgmlType::Q4_K, 8960, 1536),
        (GgmlType::Q6_K, 1536, 8960),
        (GgmlType::Q4_K, 1536, 1536),
        (GgmlType::Q4_1, 1536, 576),
        (GgmlType::Q4_1, 576, 1536),
        (GgmlType::Q8_0, 49152, 576),
    ] {
        let bytes = random_blocks(ty, n, k, &mut rng);
        for &rows in &rows_list {
            let x: Vec<f32> = (0..rows * k).map(|_| rng.f()).collect();
            let mut y = vec![0f32; rows * n];
            pool.install(|| {
                let ta = time(&mut || matmul(&x, rows, view(ty, &bytes, n, k), &mut y, 2));
                // The path these rows take without the tiles.
                let (name, tb) = if crate::cpu::matmul::takes_kgemm(ty, rows, isa) {
                    ("kgemm", time(&mut || {
                        kgemm::matmul(&x, rows, k, ty, &bytes, &mut y, 2, isa);
                    }))
                } else if rows <= crate::cpu::matmul::QUANT_MAX_ROWS {
                    ("blocks", time(&mut || {
                        quant::matmul(&x, rows, k, ty, &bytes, &mut y, 2, isa);
                    }))
                } else {
                    ("f32 tiles", f64::NAN)
                };
                let gf = |t: f64| 2.0 * (rows * n * k) as f64 / t / 1e9;
                println!(
                    "{ty:?} [{n}, {k}] x {rows}: amx {:.3} cpu-ms ({:.0} GFLOP per cpu-s), {name} {:.3} cpu-ms ({:.0})",
                    ta * 1e3, gf(ta), tb * 1e3, gf(tb)
                );
            });
        }
    }
}
