//! Memory of the CPU backend: activations, weights, KV cache and step metadata.
//!
//! - [`CpuTensor`]: a row-major `[rows, cols]` f32 buffer (`data.len() == rows * cols`).
//! - [`CpuWeight`]: a `[rows, cols]` weight in f32, f16 or bf16, or GGUF
//!   quantized blocks. Matrices and tables (2-D and up) are stored in the
//!   backend's [`WeightDtype`], or, when the backend keeps quantized weights
//!   and has kernels for the type ([`super::quant::supported`]), as the
//!   file's blocks (each row `cols / block_size` whole blocks); vectors (norm
//!   weights, biases) always in f32. Narrow storage cuts the bytes a decode
//!   step streams, which is what bounds its speed.
//! - [`CpuKvCache`] (in `kv_cache.rs`): one layer's paged K and V.
//! - [`CpuStep`]: a validated copy of the [`ForwardContext`]; building it is
//!   O(tokens + seqs + block table entries).

pub use super::kv_cache::CpuKvCache;
use crate::{ForwardContext, HostData, HostTensor, KernelError, QuantData, Result};
use half::{bf16, f16};

/// Storage dtype of weight matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightDtype {
    #[default]
    F32,
    F16,
    BF16,
}

/// An activation: row-major `[rows, cols]` f32.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuTensor {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) data: Vec<f32>,
}

impl CpuTensor {
    /// A tensor of `rows * cols` elements filled with `value`.
    pub(crate) fn filled(rows: usize, cols: usize, value: f32) -> Self {
        CpuTensor {
            rows,
            cols,
            data: vec![value; rows * cols],
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// A tensor whose every element the caller overwrites: NaN-filled in
    /// debug builds so that tests catch an element left unwritten.
    pub(crate) fn for_overwrite(rows: usize, cols: usize) -> Self {
        let fill = if cfg!(debug_assertions) {
            f32::NAN
        } else {
            0.0
        };
        Self::filled(rows, cols, fill)
    }

    /// The elements, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }
}

/// Element storage of a weight.
#[derive(Debug, Clone, PartialEq)]
pub enum WeightData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    /// GGUF blocks of a type [`super::quant`] has kernels for.
    Quant(QuantData),
}

/// A weight: `[rows, cols]` (a vector is one row).
#[derive(Debug, Clone, PartialEq)]
pub struct CpuWeight {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) data: WeightData,
    /// An FP8 linear weight (held dequantized, as f32): `linear` quantizes
    /// its input per token first (see [`crate::fp8_matrix`]).
    pub(crate) fp8_act: bool,
}

impl CpuWeight {
    /// Converts a host tensor: 2-D and up to `dtype`, vectors to f32;
    /// with `keep_quantized`, a matrix of quantized blocks that
    /// [`super::quant`] has kernels for stays as it is.
    pub(crate) fn from_host(
        w: HostTensor,
        dtype: WeightDtype,
        keep_quantized: bool,
    ) -> Result<Self> {
        let (rows, cols) = w.dims2();
        if w.data.len() != rows * cols {
            return Err(KernelError::Shape {
                op: "load_weight",
                detail: format!("shape {:?} but {} elements", w.shape, w.data.len()),
            });
        }
        let dtype = if w.shape.len() < 2 {
            WeightDtype::F32
        } else {
            dtype
        };
        if let HostData::Quant(q) = &w.data {
            let bs = q.ty.block_size();
            let whole = bs > 0 && cols.is_multiple_of(bs);
            if keep_quantized && w.shape.len() >= 2 && whole && super::quant::supported(q.ty) {
                let HostData::Quant(q) = w.data else {
                    unreachable!("matched above")
                };
                return Ok(CpuWeight {
                    rows,
                    cols,
                    data: WeightData::Quant(q),
                    fp8_act: false,
                });
            }
            if !q.ty.can_dequantize() {
                return Err(KernelError::Shape {
                    op: "load_weight",
                    detail: format!("cannot dequantize {} blocks", q.ty.name()),
                });
            }
        }
        let data = match (dtype, w.data) {
            (WeightDtype::F32, HostData::F32(v)) => WeightData::F32(v),
            (WeightDtype::F16, HostData::F16(v)) => WeightData::F16(v),
            (WeightDtype::BF16, HostData::BF16(v)) => WeightData::BF16(v),
            (WeightDtype::F32, d) => WeightData::F32(host_to_f32(d)),
            (WeightDtype::F16, d) => {
                WeightData::F16(host_to_f32(d).into_iter().map(f16::from_f32).collect())
            }
            (WeightDtype::BF16, d) => {
                WeightData::BF16(host_to_f32(d).into_iter().map(bf16::from_f32).collect())
            }
        };
        Ok(CpuWeight {
            rows,
            cols,
            data,
            fp8_act: false,
        })
    }

    /// The reference form of an FP8 linear weight: its values
    /// (`code * scale`) in f32, with the input quantized per token by
    /// `linear`.
    pub(crate) fn from_fp8(m: &crate::Fp8Matrix) -> Self {
        CpuWeight {
            rows: m.rows,
            cols: m.cols,
            data: WeightData::F32(m.dequantize()),
            fp8_act: true,
        }
    }

    /// The reference form of a stacked FP8 expert weight: its values
    /// (`code * scale`) in f32; `moe_experts` takes its input as it is.
    pub(crate) fn from_fp8_experts(m: &crate::Fp8Matrix) -> Self {
        CpuWeight {
            rows: m.rows,
            cols: m.cols,
            data: WeightData::F32(m.dequantize()),
            fp8_act: false,
        }
    }

    /// Whether this is an FP8 linear weight (see [`Self::from_fp8`]).
    pub fn is_fp8(&self) -> bool {
        self.fp8_act
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Storage dtype; a quantized weight answers f32 (what its blocks
    /// dequantize to), and [`CpuWeight::quant_type`] says which blocks.
    pub fn dtype(&self) -> WeightDtype {
        match self.data {
            WeightData::F32(_) | WeightData::Quant(_) => WeightDtype::F32,
            WeightData::F16(_) => WeightDtype::F16,
            WeightData::BF16(_) => WeightDtype::BF16,
        }
    }

    /// The block type of a quantized weight.
    pub fn quant_type(&self) -> Option<crate::GgmlType> {
        match &self.data {
            WeightData::Quant(q) => Some(q.ty),
            _ => None,
        }
    }

    /// The blocks of a quantized weight, row after row.
    pub fn quant_bytes(&self) -> Option<&[u8]> {
        match &self.data {
            WeightData::Quant(q) => Some(&q.bytes),
            _ => None,
        }
    }

    /// Bytes of storage.
    pub fn bytes(&self) -> usize {
        match &self.data {
            WeightData::F32(v) => v.len() * 4,
            WeightData::F16(v) => v.len() * 2,
            WeightData::BF16(v) => v.len() * 2,
            WeightData::Quant(q) => q.bytes.len(),
        }
    }

    /// Writes row `r` as f32 into `out` (`out.len() == cols`).
    pub(crate) fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        self.view().rows_to_f32(r, r + 1, out)
    }

    /// Writes rows `r0..r1` as f32 into `out` (`out.len() == (r1 - r0) * cols`).
    pub(crate) fn rows_to_f32(&self, r0: usize, r1: usize, out: &mut [f32]) {
        self.view().rows_to_f32(r0, r1, out)
    }

    /// The whole weight as a [`WeightView`].
    pub(crate) fn view(&self) -> WeightView<'_> {
        self.view_rows(0, self.rows)
    }

    /// Rows `r0..r1` as a [`WeightView`] (`r0 <= r1 <= rows`), without
    /// copying: rows of a weight are independent in every storage (a
    /// quantized row is whole blocks).
    pub(crate) fn view_rows(&self, r0: usize, r1: usize) -> WeightView<'_> {
        let range = r0 * self.cols..r1 * self.cols;
        let data = match &self.data {
            WeightData::F32(v) => ViewData::F32(&v[range]),
            WeightData::F16(v) => ViewData::F16(&v[range]),
            WeightData::BF16(v) => ViewData::BF16(&v[range]),
            WeightData::Quant(q) => {
                let rb = super::quant::row_bytes(q.ty, self.cols);
                ViewData::Quant(q.ty, &q.bytes[r0 * rb..r1 * rb])
            }
        };
        WeightView {
            rows: r1 - r0,
            cols: self.cols,
            data,
        }
    }

    /// The elements when stored as f32 (vectors always are).
    pub(crate) fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            WeightData::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The elements as f32, converting if stored narrower.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        self.rows_to_f32(0, self.rows, &mut out);
        out
    }
}

/// Borrowed rows of a [`CpuWeight`]: what the linear kernels read, so that
/// they run on a whole weight or on a range of its rows alike (the experts
/// of a stacked mixture-of-experts weight).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WeightView<'a> {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) data: ViewData<'a>,
}

/// The elements of a [`WeightView`], row-major.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ViewData<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    /// Whole rows of blocks of one type.
    Quant(crate::GgmlType, &'a [u8]),
}

impl WeightView<'_> {
    /// Writes rows `r0..r1` of the view as f32 into `out`.
    pub(crate) fn rows_to_f32(&self, r0: usize, r1: usize, out: &mut [f32]) {
        let range = r0 * self.cols..r1 * self.cols;
        match self.data {
            ViewData::F32(v) => out.copy_from_slice(&v[range]),
            ViewData::F16(v) => super::convert::f16_to_f32(&v[range], out),
            ViewData::BF16(v) => super::convert::bf16_to_f32(&v[range], out),
            ViewData::Quant(ty, bytes) => {
                let rb = super::quant::row_bytes(ty, self.cols);
                super::quant::dequantize(ty, &bytes[r0 * rb..r1 * rb], out);
            }
        }
    }

    /// Writes row `r` of the view as f32 into `out`.
    pub(crate) fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        self.rows_to_f32(r, r + 1, out)
    }
}

fn host_to_f32(d: HostData) -> Vec<f32> {
    match d {
        HostData::F32(v) => v,
        HostData::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
        HostData::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
        d @ HostData::Quant(_) => HostTensor {
            shape: vec![d.len()],
            data: d,
        }
        .into_f32_vec(),
    }
}

/// The batch metadata of one forward pass, validated.
#[derive(Debug, Clone)]
pub struct CpuStep {
    pub(crate) ctx: ForwardContext,
}

impl CpuStep {
    pub(crate) fn new(ctx: &ForwardContext) -> Result<Self> {
        let shape_err = |detail: &str| KernelError::Shape {
            op: "begin_step",
            detail: detail.to_string(),
        };
        // `validate` subtracts neighbouring prefix sums: check their order first.
        let n = ctx.num_seqs();
        if ctx.cu_seqlens_q.len() != n + 1 || ctx.cu_seqlens_k.len() != n + 1 {
            return Err(shape_err("cu_seqlens_q/k must have num_seqs + 1 entries"));
        }
        let sorted = |v: &[u32]| v.windows(2).all(|w| w[0] <= w[1]);
        if !sorted(&ctx.cu_seqlens_q) || !sorted(&ctx.cu_seqlens_k) {
            return Err(shape_err("cu_seqlens_q/k must be non-decreasing"));
        }
        if ctx.block_size == 0 {
            return Err(shape_err("block_size must be positive"));
        }
        if ctx.context_lens.iter().any(|&c| c > u32::MAX / 2) {
            return Err(shape_err("context_len out of range"));
        }
        ctx.validate().map_err(|detail| KernelError::Shape {
            op: "begin_step",
            detail,
        })?;
        Ok(CpuStep { ctx: ctx.clone() })
    }

    /// The context this step was built from.
    pub fn context(&self) -> &ForwardContext {
        &self.ctx
    }
}
