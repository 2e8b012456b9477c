//! Several quantized matrices times the same few x rows in one parallel
//! pass (a decode step's q, k and v projections).
//!
//! The x rows are quantized once per activation kind (32-blocks and/or
//! 256-blocks, whichever the matrices' types need), and the weight rows of
//! every matrix are cut into one list of tasks, so the matrices share one
//! fork-join instead of paying one each (at one decode row the small k and v
//! projections cost more in hand-over than in arithmetic). Each matrix keeps
//! its own type's dot product; outputs equal [`super::matmul`]'s bit for bit
//! (the same kernels on the same quantized activations).

use super::act::{self, BlockQ8, BlockQ8K};
use super::{dot_fn, one_row_fn, one_row_q8_fn, row_bytes, Dot, DotOneRow, Isa, ROWS_PER_CALL};
use crate::GgmlType;
use rayon::prelude::*;

/// One matrix of a [`matmul_many`] call: `y = x @ w^T`, `w` blocks of `ty`
/// with `k` columns, `y` `[rows, n]`.
pub struct Target<'a> {
    pub ty: GgmlType,
    pub w: &'a [u8],
    pub y: &'a mut [f32],
}

/// A matrix as the tasks see it: its kernel, weight rows and output.
struct Job<'a> {
    dot: Dot,
    /// The one-x-row kernel, taken when there is one and one x row (of
    /// 256-blocks for the k-quants, 32-blocks for the others).
    one_row: Option<DotOneRow>,
    one_row8: Option<DotOneRow<BlockQ8>>,
    w: &'a [u8],
    rb: usize,
    n: usize,
    y: *mut f32,
}

// SAFETY: the tasks of `matmul_many` write disjoint columns of each `y`.
unsafe impl Sync for Job<'_> {}

/// `t.y = x @ t.w^T` for every target (`x` is `[rows, k]`). Returns false,
/// computing nothing, when some type has no kernel on `isa`; shapes are
/// asserted (the caller checked them).
pub fn matmul_many(
    x: &[f32],
    rows: usize,
    k: usize,
    targets: &mut [Target<'_>],
    threads: usize,
    isa: Isa,
) -> bool {
    assert!(rows > 0 && x.len() == rows * k);
    let mut jobs = Vec::with_capacity(targets.len());
    for t in targets.iter_mut() {
        let Some(dot) = dot_fn(t.ty, isa) else {
            return false;
        };
        let rb = row_bytes(t.ty, k);
        assert!(k.is_multiple_of(t.ty.block_size()) && t.y.len().is_multiple_of(rows));
        let n = t.y.len() / rows;
        assert!(t.w.len() >= n * rb);
        jobs.push(Job {
            dot,
            one_row: one_row_fn(t.ty, isa).filter(|_| rows == 1),
            one_row8: one_row_q8_fn(t.ty, isa).filter(|_| rows == 1),
            w: t.w,
            rb,
            n,
            y: t.y.as_mut_ptr(),
        });
    }
    let need8 = jobs.iter().any(|j| matches!(j.dot, Dot::Q8(_)));
    let need8k = jobs.iter().any(|j| matches!(j.dot, Dot::Q8K(_)));
    let mut a8 = Vec::new();
    if need8 {
        a8.resize(x.len() / 32, BlockQ8::default());
        act::quantize_q8(x, &mut a8);
    }
    let mut a8k = Vec::new();
    if need8k {
        a8k.resize(x.len() / 256, BlockQ8K::default());
        act::quantize_q8k(x, &mut a8k);
    }
    // Tasks of about 32 KiB of weights, at least 8 per thread in all.
    let total: usize = jobs.iter().map(|j| j.n).sum();
    let by_tasks = total.div_ceil(threads.max(1) * 8).max(4);
    let mut tasks = Vec::new();
    for (m, j) in jobs.iter().enumerate() {
        let chunk = (32 * 1024 / j.rb.max(1)).max(4).min(by_tasks);
        for j0 in (0..j.n).step_by(chunk) {
            tasks.push((m, j0, (j0 + chunk).min(j.n)));
        }
    }
    let (jobs, a8, a8k) = (&jobs, &a8[..], &a8k[..]);
    tasks.into_par_iter().for_each(|(m, j0, j1)| {
        let job = &jobs[m];
        // SAFETY: `dot` came from `dot_fn` and the one-row kernels from
        // `one_row_fn` / `one_row_q8_fn` (paths this machine runs), the rows
        // hold whole blocks, and this task alone writes columns j0..j1 (with
        // one x row, `y[j0..j1]`).
        unsafe {
            let w = &job.w[j0 * job.rb..j1 * job.rb];
            let y = || std::slice::from_raw_parts_mut(job.y.add(j0), j1 - j0);
            match (job.dot, job.one_row, job.one_row8) {
                (Dot::Q8K(_), Some(f), _) => f(w, job.rb, a8k, y()),
                (Dot::Q8(_), _, Some(f)) => f(w, job.rb, a8, y()),
                (Dot::Q8(f), _, None) => rows_into(job, f, a8, rows, j0, j1),
                (Dot::Q8K(f), None, _) => rows_into(job, f, a8k, rows, j0, j1),
            }
        }
    });
    true
}

/// Columns `j0..j1` of `job.y`: weight row `j` dotted with every x row.
///
/// # Safety
/// `f` runs on this machine; `job.w` holds `n` rows of `rb` bytes of whole
/// blocks; no other thread touches columns `j0..j1` of `job.y` meanwhile.
unsafe fn rows_into<A>(
    job: &Job<'_>,
    f: unsafe fn(&[u8], &[A], usize, &mut [f32]),
    a: &[A],
    rows: usize,
    j0: usize,
    j1: usize,
) {
    let nb = a.len() / rows;
    let mut tmp = [0f32; ROWS_PER_CALL];
    for j in j0..j1 {
        let wrow = &job.w[j * job.rb..(j + 1) * job.rb];
        for r0 in (0..rows).step_by(ROWS_PER_CALL) {
            let g = (rows - r0).min(ROWS_PER_CALL);
            f(wrow, &a[r0 * nb..(r0 + g) * nb], g, &mut tmp[..g]);
            for (r, v) in tmp[..g].iter().enumerate() {
                *job.y.add((r0 + r) * job.n + j) = *v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::matmul;
    use super::*;

    /// Deterministic bytes (xorshift) with finite f16 scales written where
    /// each type keeps them.
    fn blocks(ty: GgmlType, rows: usize, k: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut b: Vec<u8> = (0..rows * row_bytes(ty, k)).map(|_| next() as u8).collect();
        let halves: &[usize] = match ty {
            GgmlType::Q4_1 => &[0, 2],
            GgmlType::Q8_0 => &[0],
            GgmlType::Q4_K => &[0, 2],
            GgmlType::Q6_K => &[208],
            _ => unreachable!("not a tested type"),
        };
        for block in b.chunks_exact_mut(ty.type_size()) {
            for &o in halves {
                let v = (next() % 1000) as f32 / 20000.0 - 0.025;
                block[o..o + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
            }
        }
        b
    }

    fn dequant(ty: GgmlType, b: &[u8], elements: usize) -> Vec<f32> {
        let mut out = vec![0f32; elements];
        pagoda_gguf::dequant::dequantize_into(ty, b, &mut out).unwrap();
        out
    }

    /// Mixed types in one call (32-block and 256-block activations) equal
    /// one `matmul` per matrix bit for bit, on every path and row count, and
    /// stay near the f64 product of the dequantized weights.
    #[test]
    fn many_matrices_equal_one_matmul_each_and_the_dequantized_product() {
        let k = 512;
        let shapes = [
            (GgmlType::Q4_1, 96),
            (GgmlType::Q8_0, 40),
            (GgmlType::Q4_K, 33),
            (GgmlType::Q6_K, 7),
        ];
        let ws: Vec<Vec<u8>> = shapes
            .iter()
            .enumerate()
            .map(|(i, &(ty, n))| blocks(ty, n, k, 0x9E37_79B9 + i as u64))
            .collect();
        for isa in Isa::available() {
            for rows in [1, 3, 9] {
                let x: Vec<f32> = (0..rows * k)
                    .map(|i| ((i * 7919 % 1013) as f32 / 506.0 - 1.0) * 0.7)
                    .collect();
                let mut ys: Vec<Vec<f32>> = shapes
                    .iter()
                    .map(|&(_, n)| vec![f32::NAN; rows * n])
                    .collect();
                let mut targets: Vec<Target<'_>> = shapes
                    .iter()
                    .zip(&ws)
                    .zip(ys.iter_mut())
                    .map(|((&(ty, _), w), y)| Target { ty, w, y })
                    .collect();
                assert!(matmul_many(&x, rows, k, &mut targets, 2, isa));
                for (((ty, n), w), y) in shapes.iter().zip(&ws).zip(&ys) {
                    let mut want = vec![0f32; rows * n];
                    assert!(matmul(&x, rows, k, *ty, w, &mut want, 2, isa));
                    assert_eq!(
                        y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{ty:?} on {isa:?}, {rows} rows"
                    );
                    let wf = dequant(*ty, w, n * k);
                    for r in 0..rows {
                        for j in 0..*n {
                            let (xr, wr) = (&x[r * k..(r + 1) * k], &wf[j * k..(j + 1) * k]);
                            let exact: f64 =
                                xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                            // Activations rounded to 1/254 of their block's
                            // largest magnitude (at most 0.7 here).
                            let bound: f64 =
                                wr.iter().map(|b| b.abs() as f64).sum::<f64>() * 0.7 / 254.0 + 1e-4;
                            let got = y[r * n + j] as f64;
                            assert!(
                                (got - exact).abs() <= bound,
                                "{ty:?} on {isa:?}: row {r} col {j}: {got} vs {exact} (bound {bound})"
                            );
                        }
                    }
                }
            }
        }
    }

    /// A type without a kernel makes the whole call decline, writing nothing.
    #[test]
    fn a_type_without_a_kernel_declines_the_call() {
        let k = 64;
        let w = blocks(GgmlType::Q4_1, 2, k, 1);
        let f16 = vec![0u8; 2 * k * 2];
        let (mut y1, mut y2) = (vec![7f32; 2], vec![7f32; 2]);
        let mut targets = [
            Target {
                ty: GgmlType::Q4_1,
                w: &w,
                y: &mut y1,
            },
            Target {
                ty: GgmlType::F16,
                w: &f16,
                y: &mut y2,
            },
        ];
        let x = vec![0.5f32; k];
        assert!(!matmul_many(&x, 1, k, &mut targets, 2, Isa::detect()));
        assert_eq!((y1, y2), (vec![7f32; 2], vec![7f32; 2]));
    }

    /// The backend's `linear3` on kept blocks (with biases) equals three
    /// `linear` calls bit for bit, at decode sizes and past the block
    /// kernels' row limit; dense weights take the three-call path.
    #[test]
    fn backend_linear3_equals_three_linear_calls() {
        use crate::cpu::{CpuBackend, CpuOptions, WeightDtype};
        use crate::{Backend, HostData, HostTensor, QuantData};
        let opts = CpuOptions {
            threads: 2,
            weight_dtype: WeightDtype::F32,
        };
        let k = 256;
        let shapes = [
            (GgmlType::Q4_1, 64),
            (GgmlType::Q4_K, 16),
            (GgmlType::Q6_K, 16),
        ];
        for keep in [true, false] {
            let b = CpuBackend::new(opts).unwrap().with_quantized_weights(keep);
            let ws: Vec<_> = shapes
                .iter()
                .enumerate()
                .map(|(i, &(ty, n))| {
                    let bytes = blocks(ty, n, k, 77 + i as u64);
                    let host = HostTensor {
                        shape: vec![n, k],
                        data: HostData::Quant(QuantData { ty, bytes }),
                    };
                    b.load_weight(host).unwrap()
                })
                .collect();
            let bs: Vec<_> = shapes
                .iter()
                .map(|&(_, n)| {
                    let v = (0..n).map(|j| j as f32 * 0.01 - 0.1).collect();
                    b.load_weight(HostTensor::f32(vec![n], v)).unwrap()
                })
                .collect();
            for rows in [1, 4, 24, 40] {
                let x: Vec<f32> = (0..rows * k)
                    .map(|i| ((i % 97) as f32 - 48.0) / 64.0)
                    .collect();
                let x = b.tensor_from_host(rows, k, &x).unwrap();
                let got = b
                    .linear3(
                        &x,
                        [&ws[0], &ws[1], &ws[2]],
                        [Some(&bs[0]), None, Some(&bs[2])],
                    )
                    .unwrap();
                let want = [
                    b.linear(&x, &ws[0], Some(&bs[0])).unwrap(),
                    b.linear(&x, &ws[1], None).unwrap(),
                    b.linear(&x, &ws[2], Some(&bs[2])).unwrap(),
                ];
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!((g.rows, g.cols), (w.rows, w.cols));
                    assert!(
                        g.data()
                            .iter()
                            .zip(w.data())
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "keep {keep}, {rows} rows"
                    );
                }
            }
        }
    }
}
