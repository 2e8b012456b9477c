//! FP8 weights of dense linear layers on the host, and the reference of
//! their arithmetic.
//!
//! An [`Fp8Matrix`] is a linear weight `[rows = out, cols = in]` as E4M3
//! codes (row-major) with one f32 scale per output channel (row): element
//! `(r, c)` is `e4m3_to_f32(codes[r * cols + c]) * scales[r]`. It comes
//! from an FP8 checkpoint as stored, or from a dense weight by
//! [`Fp8Matrix::quantize`]: per row, `scale = amax / 448` and each value is
//! encoded as `f32_to_e4m3(w / scale)` (round to nearest even, saturating).
//!
//! A linear layer with an FP8 weight quantizes its input the same way per
//! token (dynamic, one scale per row, [`quantize_row`]), multiplies the codes
//! with f32 accumulation and applies both scales to each output:
//! `y[t, o] = sx[t] * sw[o] * sum_c qx[t, c] * qw[o, c]`. The CPU backend
//! computes exactly that through dequantized values ([`quant_dequant_row`] on
//! the input, [`Fp8Matrix::dequantize`] on the weight), the reference the
//! CUDA kernels are tested against. All encoding goes through [`crate::fp8`].

use crate::fp8::{e4m3_to_f32, f32_to_e4m3, scale_for_amax};
use crate::{KernelError, Result};

/// A linear weight in E4M3 with one scale per output channel.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Matrix {
    pub rows: usize,
    pub cols: usize,
    /// `rows * cols` E4M3 codes, row-major.
    pub codes: Vec<u8>,
    /// One scale per row (output channel).
    pub scales: Vec<f32>,
}

impl Fp8Matrix {
    /// Checks that the codes and scales fit `[rows, cols]` and every scale
    /// is positive and finite (a checkpoint's values are user input).
    pub fn new(rows: usize, cols: usize, codes: Vec<u8>, scales: Vec<f32>) -> Result<Self> {
        if codes.len() != rows * cols || scales.len() != rows {
            return Err(KernelError::Shape {
                op: "fp8 weight",
                detail: format!(
                    "[{rows}, {cols}] needs {} codes and {rows} scales, got {} and {}",
                    rows * cols,
                    codes.len(),
                    scales.len()
                ),
            });
        }
        if let Some(s) = scales.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(KernelError::Unsupported(format!(
                "fp8 weight scale {s} (scales must be positive and finite)"
            )));
        }
        Ok(Fp8Matrix {
            rows,
            cols,
            codes,
            scales,
        })
    }

    /// Quantizes a row-major `[rows, cols]` f32 weight, one scale per row.
    pub fn quantize(rows: usize, cols: usize, w: &[f32]) -> Result<Self> {
        Self::quantize_from(rows, cols, w, |&v| v)
    }

    /// [`Self::quantize`] of a weight stored as `T`, widened to f32 one row
    /// at a time: rows in parallel (a layer's stacked experts are hundreds
    /// of millions of values), no f32 copy of the whole weight, and the
    /// finiteness check in the same pass. Each row's result does not
    /// depend on the others, so the codes are the same as quantizing the
    /// widened weight.
    pub fn quantize_from<T: Sync>(
        rows: usize,
        cols: usize,
        w: &[T],
        widen: impl Fn(&T) -> f32 + Sync,
    ) -> Result<Self> {
        if w.len() != rows * cols {
            return Err(KernelError::Shape {
                op: "fp8 quantize",
                detail: format!("{} values for [{rows}, {cols}]", w.len()),
            });
        }
        use rayon::prelude::*;
        let mut codes = vec![0u8; w.len()];
        let scales: Result<Vec<f32>> = w
            .par_chunks(cols.max(1))
            .zip(codes.par_chunks_mut(cols.max(1)))
            .map_init(
                || Vec::with_capacity(cols),
                |row, (src, dst)| {
                    row.clear();
                    row.extend(src.iter().map(&widen));
                    if let Some(v) = row.iter().find(|v| !v.is_finite()) {
                        return Err(KernelError::Unsupported(format!(
                            "fp8 quantization of a weight holding {v}"
                        )));
                    }
                    Ok(quantize_row(row, dst))
                },
            )
            .collect();
        let mut scales = scales?;
        scales.resize(rows, 1.0);
        Ok(Fp8Matrix {
            rows,
            cols,
            codes,
            scales,
        })
    }

    /// The weight's values (`code * scale`) as f32, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.codes.len());
        for (r, row) in self.codes.chunks(self.cols.max(1)).enumerate() {
            let s = self.scales[r];
            out.extend(row.iter().map(|&c| e4m3_to_f32(c) * s));
        }
        out
    }

    /// Stacks `other` under `self` (gate over up); the column counts must agree.
    pub fn concat_rows(mut self, other: Fp8Matrix) -> Result<Self> {
        if self.cols != other.cols {
            return Err(KernelError::Shape {
                op: "fp8 concat",
                detail: format!("{} columns over {}", self.cols, other.cols),
            });
        }
        self.rows += other.rows;
        self.codes.extend_from_slice(&other.codes);
        self.scales.extend_from_slice(&other.scales);
        Ok(self)
    }

    /// Splits into consecutive row ranges (a fused qkv into q, k and v);
    /// `None` when the counts do not add up to the row count.
    pub fn split_rows(self, rows: &[usize]) -> Option<Vec<Fp8Matrix>> {
        if rows.iter().sum::<usize>() != self.rows {
            return None;
        }
        let mut start = 0;
        Some(
            rows.iter()
                .map(|&r| {
                    let m = Fp8Matrix {
                        rows: r,
                        cols: self.cols,
                        codes: self.codes[start * self.cols..(start + r) * self.cols].to_vec(),
                        scales: self.scales[start..start + r].to_vec(),
                    };
                    start += r;
                    m
                })
                .collect(),
        )
    }
}

/// Quantizes a dense host matrix for `--quantization fp8`; GGUF blocks
/// are refused (they are already quantized: pagoda does not quantize
/// twice), as is anything that is not a 2-D matrix.
pub fn quantize_host(w: &crate::HostTensor) -> Result<Fp8Matrix> {
    if let crate::HostData::Quant(q) = &w.data {
        return Err(KernelError::Unsupported(format!(
            "FP8 weights from {} blocks: --quantization fp8 takes unquantized (f32/f16/bf16) \
             weights or an FP8 checkpoint",
            q.ty.name()
        )));
    }
    if w.shape.len() != 2 || w.numel() != w.data.len() {
        return Err(KernelError::Shape {
            op: "fp8 quantize",
            detail: format!("a linear weight must be a matrix, got shape {:?}", w.shape),
        });
    }
    let (rows, cols) = (w.shape[0], w.shape[1]);
    match &w.data {
        crate::HostData::F32(v) => Fp8Matrix::quantize(rows, cols, v),
        crate::HostData::F16(v) => Fp8Matrix::quantize_from(rows, cols, v, |x| x.to_f32()),
        crate::HostData::BF16(v) => Fp8Matrix::quantize_from(rows, cols, v, |x| x.to_f32()),
        crate::HostData::Quant(_) => unreachable!("refused above"),
    }
}

/// Encodes one row with its own scale (`amax / 448`, 1 for an all-zero
/// row) into `codes`; returns the scale.
pub fn quantize_row(x: &[f32], codes: &mut [u8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let s = scale_for_amax(amax);
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = f32_to_e4m3(v / s);
    }
    s
}

/// Replaces each value of `x` by its FP8 quantize-dequantize with the row's
/// dynamic scale: what an FP8 linear layer sees of its input row.
pub fn quant_dequant_row(x: &mut [f32]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let s = scale_for_amax(amax);
    for v in x.iter_mut() {
        *v = e4m3_to_f32(f32_to_e4m3(*v / s)) * s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantize_round_trips_within_the_e4m3_step() {
        let (rows, cols) = (5, 37);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.001 * (1 + i / cols) as f32)
            .collect();
        let m = Fp8Matrix::quantize(rows, cols, &w).unwrap();
        let d = m.dequantize();
        for r in 0..rows {
            let amax = w[r * cols..][..cols]
                .iter()
                .fold(0f32, |a, v| a.max(v.abs()));
            assert_eq!(m.scales[r], amax / 448.0);
            // The row's largest value maps onto the largest code.
            assert!(m.codes[r * cols..][..cols]
                .iter()
                .any(|&c| c & 0x7f == 0x7e));
            for c in 0..cols {
                let (a, b) = (w[r * cols + c], d[r * cols + c]);
                // 3 mantissa bits: relative error at most 1/16 above the
                // subnormal range, absolute 2^-10 * scale below it.
                assert!(
                    (a - b).abs() <= a.abs() / 16.0 + m.scales[r] / 1024.0,
                    "{a} {b}"
                );
            }
        }
        let zero = Fp8Matrix::quantize(1, 4, &[0.0; 4]).unwrap();
        assert_eq!(zero.scales, vec![1.0]);
        assert!(Fp8Matrix::quantize(1, 2, &[1.0, f32::NAN]).is_err());
    }

    #[test]
    fn quantizing_bf16_and_f16_weights_equals_quantizing_them_widened() {
        let vals: Vec<f32> = (0..7 * 33)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let want = Fp8Matrix::quantize(7, 33, &vals).unwrap();
        let bf: Vec<half::bf16> = vals.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let widened: Vec<f32> = bf.iter().map(|v| v.to_f32()).collect();
        let t = crate::HostTensor {
            shape: vec![7, 33],
            data: crate::HostData::BF16(bf),
        };
        assert_eq!(
            quantize_host(&t).unwrap(),
            Fp8Matrix::quantize(7, 33, &widened).unwrap()
        );
        let h: Vec<half::f16> = vals.iter().map(|&v| half::f16::from_f32(v)).collect();
        let widened: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
        let t = crate::HostTensor {
            shape: vec![7, 33],
            data: crate::HostData::F16(h),
        };
        assert_eq!(
            quantize_host(&t).unwrap(),
            Fp8Matrix::quantize(7, 33, &widened).unwrap()
        );
        assert_eq!(want.scales.len(), 7);
        // A non-finite value anywhere is refused, in any storage type.
        let mut bad = vals.clone();
        bad[5 * 33 + 2] = f32::INFINITY;
        assert!(Fp8Matrix::quantize(7, 33, &bad).is_err());
        let bad: Vec<half::bf16> = bad.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let t = crate::HostTensor {
            shape: vec![7, 33],
            data: crate::HostData::BF16(bad),
        };
        assert!(quantize_host(&t).is_err());
        // Empty rows keep scale 1.
        let m = Fp8Matrix::quantize(3, 0, &[]).unwrap();
        assert_eq!(m.scales, vec![1.0; 3]);
    }

    #[test]
    fn split_and_concat_are_inverse() {
        let w: Vec<f32> = (0..6 * 4).map(|i| i as f32 - 11.0).collect();
        let m = Fp8Matrix::quantize(6, 4, &w).unwrap();
        let parts = m.clone().split_rows(&[3, 2, 1]).unwrap();
        assert_eq!(parts[1].rows, 2);
        assert_eq!(parts[1].scales, m.scales[3..5]);
        let back = parts
            .into_iter()
            .reduce(|a, b| a.concat_rows(b).unwrap())
            .unwrap();
        assert_eq!(back, m);
        assert!(m.clone().split_rows(&[3, 2]).is_none());
    }

    #[test]
    fn new_refuses_bad_scales_and_lengths() {
        assert!(Fp8Matrix::new(2, 2, vec![0; 4], vec![1.0, 0.0]).is_err());
        assert!(Fp8Matrix::new(2, 2, vec![0; 3], vec![1.0, 1.0]).is_err());
        assert!(Fp8Matrix::new(2, 2, vec![0; 4], vec![1.0, 2.0]).is_ok());
    }

    #[test]
    fn quant_dequant_row_keeps_the_amax_and_zero_rows() {
        let mut x = vec![0.3, -2.0, 1.1, 0.0];
        quant_dequant_row(&mut x);
        assert!((x[1] + 2.0).abs() < 1e-6);
        assert_eq!(x[3], 0.0);
        assert!((x[0] - 0.3).abs() < 0.3 / 16.0);
        let mut z = vec![0.0; 3];
        quant_dequant_row(&mut z);
        assert_eq!(z, vec![0.0; 3]);
    }
}
