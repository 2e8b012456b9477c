//! Timings of the small-row linear paths on the GPU host (ignored by
//! default; run with `--ignored --nocapture`): every linear layer of a
//! decode step at the Llama-3.1-8B and Qwen3-30B-A3B shapes (qkv, o_proj
//! and down into the f32 residual, gate_up, the MoE router, the LM head) at
//! 1, 2, 4, 8 and 16 rows, on the tensor-core GEMV (new), the CUDA-core
//! GEMV (old, up to 8 rows) and cuBLASLt, with the weight-read GB/s, and the
//! sum over one layer's products (qkv counted as one product); then q, k
//! and v as three launches against one `linear3` launch. "old" is what the backend ran before the
//! tensor-core GEMV: the CUDA-core GEMV up to 8 rows, cuBLASLt above.
//!
//! Each timed sample queues 20 products and waits once (so launch and
//! synchronization costs are spread out as in a captured graph), cycling
//! through copies of the weight that together exceed the L2 cache, so every
//! product reads its weight from memory as a decode step does. Medians of
//! timed samples after a warm-up; random inputs. Correctness is
//! cuda_gemv's job.
#![cfg(feature = "cuda")]

mod common;

#[allow(dead_code)]
const PORTABLE: bool = false;

use common::*;
use pagoda_kernels::cuda::testing::{gpu, median_secs};
use pagoda_kernels::cuda::{CudaBackend, SmallLinear};
use pagoda_kernels::{Backend, HostData, HostTensor};

/// Products per timed sample.
const BURST: usize = 20;
/// Weight copies of a shape hold at least this many bytes (over L2).
const MIN_BYTES: usize = 256 << 20;

/// (name, out, in, adds into the f32 residual, counts toward the layer)
type Op = (&'static str, usize, usize, bool, bool);

fn bench_shape(g: &CudaBackend, model: &str, ops: &[Op]) {
    let mut rng = Rng::new(9);
    let rows_list = [1usize, 2, 4, 8, 16];
    // Per path, per row count: the layer's sum.
    let mut layer = [[0f64; 5]; 3];
    for &(name, out, inn, adds, in_layer) in ops {
        let bytes = 2 * out * inn;
        let copies = MIN_BYTES.div_ceil(bytes).clamp(1, 512);
        let host = rvec_f32(&mut rng, out * inn, 0.02);
        let ws: Vec<_> = (0..copies)
            .map(|_| {
                g.load_weight(HostTensor {
                    shape: vec![out, inn],
                    data: HostData::F32(host.clone()),
                })
                .unwrap()
            })
            .collect();
        for (ri, &rows) in rows_list.iter().enumerate() {
            let x = g
                .tensor_from_host(rows, inn, &rvec_f32(&mut rng, rows * inn, 1.0))
                .unwrap();
            let mut r = g
                .residual_from_host(rows, out, &vec![0.0; rows * out])
                .unwrap();
            let mut line = format!("bench: {model} {name:8} rows {rows:2}:");
            let mut secs_of = [f64::NAN; 3];
            for (pi, path) in [SmallLinear::Mma, SmallLinear::Warp, SmallLinear::Cublas]
                .into_iter()
                .enumerate()
            {
                if path == SmallLinear::Warp && rows > 8 {
                    continue;
                }
                g.set_small_linear(path);
                let mut next = 0usize;
                let secs = median_secs(g, 15, || {
                    for _ in 0..BURST {
                        let w = &ws[next % copies];
                        next += 1;
                        if adds {
                            g.add_linear(&mut r, &x, w, None).unwrap();
                        } else {
                            let _ = g.linear(&x, w, None).unwrap();
                        }
                    }
                }) / BURST as f64;
                secs_of[pi] = secs;
                if in_layer {
                    layer[pi][ri] += secs;
                }
                line += &format!(
                    " {:?} {:.1} us ({:.0} GB/s)",
                    path,
                    secs * 1e6,
                    bytes as f64 / secs / 1e9
                );
            }
            let old = if rows <= 8 { secs_of[1] } else { secs_of[2] };
            line += &format!(" | new vs old {:.2}x", old / secs_of[0]);
            eprintln!("{line}{}", if adds { " (add_linear)" } else { "" });
        }
    }
    for (ri, &rows) in rows_list.iter().enumerate() {
        let old = if rows <= 8 {
            layer[1][ri]
        } else {
            layer[2][ri]
        };
        eprintln!(
            "bench: {model} layer products rows {rows:2}: new {:.1} us, old {:.1} us, cuBLAS {:.1} us",
            layer[0][ri] * 1e6,
            old * 1e6,
            layer[2][ri] * 1e6
        );
    }
    g.set_small_linear(SmallLinear::from_env().unwrap());
}

/// q, k and v as three `linear`s on the old path, three on the tensor-core
/// GEMV, and one `linear3` launch.
fn bench_qkv(g: &CudaBackend, model: &str, dims: [usize; 3], inner: usize) {
    let mut rng = Rng::new(10);
    let bytes: usize = dims.iter().map(|n| 2 * n * inner).sum();
    let copies = MIN_BYTES.div_ceil(bytes).clamp(1, 512);
    let ws: Vec<Vec<_>> = (0..copies)
        .map(|_| {
            dims.iter()
                .map(|&n| {
                    g.load_weight(HostTensor {
                        shape: vec![n, inner],
                        data: HostData::F32(rvec_f32(&mut rng, n * inner, 0.02)),
                    })
                    .unwrap()
                })
                .collect()
        })
        .collect();
    for rows in [1usize, 2, 4, 8, 16] {
        let x = g
            .tensor_from_host(rows, inner, &rvec_f32(&mut rng, rows * inner, 1.0))
            .unwrap();
        let time = |path: SmallLinear, fused: bool| {
            g.set_small_linear(path);
            let mut next = 0usize;
            median_secs(g, 15, || {
                for _ in 0..BURST {
                    let w = &ws[next % copies];
                    next += 1;
                    if fused {
                        let _ = g.linear3(&x, [&w[0], &w[1], &w[2]], [None; 3]).unwrap();
                    } else {
                        for wi in w {
                            let _ = g.linear(&x, wi, None).unwrap();
                        }
                    }
                }
            }) / BURST as f64
        };
        let old_path = if rows <= 8 {
            SmallLinear::Warp
        } else {
            SmallLinear::Cublas
        };
        let old = time(old_path, false);
        let three = time(SmallLinear::Mma, false);
        let one = time(SmallLinear::Mma, true);
        eprintln!(
            "bench: {model} qkv {dims:?} x {inner} rows {rows:2}: old 3 launches {:.1} us, \
             mma 3 launches {:.1} us, linear3 1 launch {:.1} us ({:.0} GB/s) | new vs old {:.2}x",
            old * 1e6,
            three * 1e6,
            one * 1e6,
            bytes as f64 / one / 1e9,
            old / one
        );
    }
    g.set_small_linear(SmallLinear::from_env().unwrap());
}

#[test]
#[ignore]
fn small_row_linear_timings() {
    let Some(g) = gpu() else { return };
    let copy = g.measure_copy_bandwidth(1 << 30, 10).unwrap();
    eprintln!("bench: copy bandwidth {:.0} GB/s", copy / 1e9);
    // Llama-3.1-8B: hidden 4096, 32 / 8 heads of 128, intermediate 14336.
    bench_shape(
        &g,
        "8b",
        &[
            ("qkv", 6144, 4096, false, true),
            ("o_proj", 4096, 4096, true, true),
            ("gate_up", 28672, 4096, false, true),
            ("down", 4096, 14336, true, true),
            ("lm_head", 128256, 4096, false, false),
        ],
    );
    bench_qkv(&g, "8b", [4096, 1024, 1024], 4096);
    // Qwen3-30B-A3B: hidden 2048, 32 / 4 heads of 128, 128 experts.
    bench_shape(
        &g,
        "30b-a3b",
        &[
            ("qkv", 5120, 2048, false, true),
            ("o_proj", 2048, 4096, true, true),
            ("router", 128, 2048, false, true),
            ("lm_head", 151936, 2048, false, false),
        ],
    );
    bench_qkv(&g, "30b-a3b", [4096, 512, 512], 2048);
}
