//! Helpers shared by the CUDA test binaries of this crate and of
//! pagoda-engine (the backend itself never calls them): opening the device
//! for a test, the relative L2 error the op and model comparisons
//! measure, the one-token-per-row step the sampling tests run, the
//! median timing of the kernel timing binaries, the device's FP8
//! conversions on given values ([`fp8_codec`]) and the FP8 GEMM's
//! rescaling epilogue on given values ([`fp8_rescale`]).
//!
//! A machine without CUDA skips the CUDA tests with a notice, unless the
//! environment variable [`REQUIRE_GPU_ENV`] is set (to anything but empty or
//! `0`; scripts/gpu-run.sh sets it): then the missing device fails the test,
//! so a broken device setup never reads as a passing run. Any other failure
//! to start the backend always fails the test.

use super::{CudaBackend, CudaOptions};
use crate::{Backend, ForwardContext, SamplingRow};

/// The environment variable saying a GPU must be present.
pub const REQUIRE_GPU_ENV: &str = "PAGODA_REQUIRE_GPU";

/// The GPU backend, or `None` (with a notice) where there is no CUDA and no
/// GPU is required. Panics (failing the test) where the backend fails to
/// start for any other reason, or where a GPU is required.
pub fn gpu() -> Option<CudaBackend> {
    let required = std::env::var(REQUIRE_GPU_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
    match CudaBackend::new(CudaOptions::default()) {
        Ok(b) => {
            eprintln!("notice: CUDA tests run on {}", b.name());
            Some(b)
        }
        Err(e) => {
            let e = e.to_string();
            match skip_or_fail(&e, required) {
                Ok(()) => {
                    eprintln!("notice: CUDA tests skipped: {e}");
                    None
                }
                Err(why) => panic!("{why}"),
            }
        }
    }
}

/// [`gpu`] with every fresh output filled with NaN before an op writes it,
/// so an element left unwritten fails the comparison.
pub fn gpu_poisoned() -> Option<CudaBackend> {
    let b = gpu()?;
    b.set_poison_outputs(true);
    Some(b)
}

/// Whether a backend start that failed with `error` skips the tests
/// (`Ok`) or fails them (`Err`, saying why): only a machine without CUDA
/// skips, and only where no GPU is `required`.
pub fn skip_or_fail(error: &str, required: bool) -> Result<(), String> {
    if !error.contains("CUDA is not available") {
        return Err(format!("CUDA backend failed to start: {error}"));
    }
    if required {
        return Err(format!(
            "{REQUIRE_GPU_ENV} is set but no GPU could be used: {error}"
        ));
    }
    Ok(())
}

/// ‖got − want‖₂ / ‖want‖₂, in f64.
pub fn rel_err_l2(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "rel_err_l2: lengths differ");
    let (mut num, mut den) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

/// A step of `sampling.len()` one-token sequences, each row sampled (block
/// 0, nothing stored): what the sampling tests feed the sampler.
pub fn sampling_step(sampling: Vec<SamplingRow>) -> ForwardContext {
    let n = sampling.len();
    let ctx = ForwardContext {
        input_ids: vec![0; n],
        positions: vec![0; n],
        cu_seqlens_q: (0..=n as u32).collect(),
        cu_seqlens_k: (0..=n as u32).collect(),
        seq_lens: vec![1; n],
        context_lens: vec![0; n],
        slot_mapping: vec![-1; n],
        block_tables: vec![0; n],
        max_blocks_per_seq: 1,
        block_size: 16,
        max_query_len: 1,
        max_seq_len: 1,
        num_prefills: n,
        num_prefill_tokens: n,
        num_decode_tokens: 0,
        logits_indices: (0..n as u32).collect(),
        sampling,
        ..Default::default()
    };
    assert_eq!(ctx.validate(), Ok(()), "a consistent test step");
    ctx
}

/// Median seconds of `reps` runs of `f` (after one warm-up run), each
/// ended by a device synchronization: the kernel timing binaries' clock.
pub fn median_secs(g: &CudaBackend, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    g.synchronize().expect("device synchronization");
    let mut v: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let t = std::time::Instant::now();
            f();
            g.synchronize().expect("device synchronization");
            t.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The device's FP8 E4M3 conversions (`f2fp8`, `fp82f` and `fp8x4_to_f32`
/// of the kernels' prelude): each of `x` encoded, and each of `codes`
/// decoded twice, `fp82f`'s values then `fp8x4_to_f32`'s (`2 * codes.len()`
/// values; waits for the device).
pub fn fp8_codec(g: &CudaBackend, x: &[f32], codes: &[u8]) -> crate::Result<(Vec<u8>, Vec<f32>)> {
    let op = "fp8_codec";
    let (n, m) = (x.len(), codes.len());
    let too_big = |v: usize| crate::KernelError::Shape {
        op,
        detail: format!("{v} values do not fit in 32 bits"),
    };
    let (ni, mi) = (
        i32::try_from(n).map_err(|_| too_big(n))?,
        i32::try_from(m).map_err(|_| too_big(m))?,
    );
    let xd = g.upload(x.to_vec(), op)?;
    let cd = g.upload(codes.to_vec(), op)?;
    let mut enc = g.upload(vec![0u8; n], op)?;
    let mut dec = g.upload(vec![0f32; 2 * m], op)?;
    let mut l = g.dev.launch(op)?;
    l.arg(&xd)
        .out(&mut enc)
        .arg(&ni)
        .arg(&cd)
        .out(&mut dec)
        .arg(&mi);
    l.run(super::ops::elems_cfg(n.max(m)))?;
    Ok((g.download_raw(&enc, n)?, g.download_raw(&dec, 2 * m)?))
}

/// The rescaling epilogue of the unit-scaled FP8 GEMM on given values
/// (waits for the device): `acc` `[rows, cols]` raw sums, `sx` one scale a
/// row, `sw` one a column, `bias` (rounded to bf16 on upload). Without
/// `residual`: `fp8_rescale_bf16`'s bf16 output (as f32); with it: the f32
/// residual after `fp8_rescale_acc_f32` added into it.
pub fn fp8_rescale(
    g: &CudaBackend,
    acc: &[f32],
    sx: &[f32],
    sw: &[f32],
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
) -> crate::Result<Vec<f32>> {
    use super::ops::Dest;
    let op = "fp8_rescale";
    let (rows, cols) = (sx.len(), sw.len());
    let n = rows * cols;
    if acc.len() != n || residual.is_some_and(|r| r.len() != n) {
        return Err(crate::KernelError::Shape {
            op,
            detail: format!("values for [{rows}, {cols}]"),
        });
    }
    let acc_d = g.upload(acc.to_vec(), op)?;
    let sx_d = g.upload(sx.to_vec(), op)?;
    let sw_d = g.upload(sw.to_vec(), op)?;
    let bias_d = match bias {
        Some(b) => Some(g.upload(b.iter().map(|&v| half::bf16::from_f32(v)).collect(), op)?),
        None => None,
    };
    let rescale =
        |y| super::fp8_linear::rescale(g, y, &acc_d, &sx_d, &sw_d, bias_d.as_ref(), rows, cols);
    match residual {
        Some(r) => {
            let mut y = g.upload(r.to_vec(), op)?;
            rescale(Dest::AccF32(&mut y))?;
            g.download_raw(&y, n)
        }
        None => {
            let mut y = g.upload(vec![half::bf16::from_bits(0x7fc0); n], op)?;
            rescale(Dest::Bf16(&mut y))?;
            g.download(&y, n)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_missing_cuda_skips_and_only_when_not_required() {
        let absent = "device error: CUDA is not available: cannot open libcuda";
        assert!(skip_or_fail(absent, false).is_ok());
        let err = skip_or_fail(absent, true).unwrap_err();
        assert!(err.contains(REQUIRE_GPU_ENV), "{err}");
        assert!(skip_or_fail("device error: out of memory", false).is_err());
        assert!(skip_or_fail("device error: out of memory", true).is_err());
    }

    #[test]
    fn rel_err_l2_is_relative() {
        assert_eq!(rel_err_l2(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        let e = rel_err_l2(&[3.0, 0.0], &[4.0, 0.0]);
        assert!((e - 0.25).abs() < 1e-12);
    }
}
