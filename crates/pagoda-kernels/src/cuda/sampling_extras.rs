//! Device sampling of a step with its per-row options: penalties applied to
//! the logits rows that ask (`penalize_bf16`), the draw (`sample_bf16`),
//! then logprobs of the rows that ask (`logprobs_bf16`), and the prompt
//! logprobs of the logits rows after the sampling rows
//! (`prompt_logprobs_bf16`); the kernels are in
//! `kernels/sampling_extras.cu` and `kernels/sampling.cu`, whose headers give
//! the algorithms, and the semantics are [`crate::sampling_options`]'.
//!
//! Owns the packed form of [`SamplingOptions`] (7 ints per sampling row,
//! then the history pairs; uploaded with the step's metadata, or on its own
//! right after a graph's launch) and the one download of a step's results: the ids
//! of every row, then 42 ints per row asking for logprobs (logprob, count,
//! and up to 20 (id, logprob) pairs), then 43 per prompt row (logprob, rank,
//! count, pairs), in one device-to-host copy followed by the step's one wait
//! for the device.
//!
//! Invariants: launches depend on (rows, vocab) and on whether any row has
//! penalties or logprobs, never on other values; they run outside captured
//! graphs (after a replay, on the graph's own logits buffer), so options
//! never change what a graph holds. Penalties change the logits in place.
//! Scratch (`kept`, results) comes from the pool, sized by the row count
//! alone. The options' own upload grows with the penalized rows' histories:
//! at most `rows * (7 + 2 * min(vocab, max_model_len))` ints, which the
//! runner's profiling steps upload too, so the step arena has room for it.
//!
//! Costs per step: the host packs O(rows + history pairs) ints (the history
//! of penalized rows only: their distinct prompt + output tokens, which the
//! engine keeps incrementally, so packing is a copy); on the device, one
//! pass over each penalized row's history, and for each logprobs row 2 to 3
//! passes over its V logits plus one per top logprob asked.

use super::pool::DeviceBuf;
use super::storage::{CudaStep, CudaTensor, Span};
use super::{device_err, CudaBackend};
use crate::{
    DeviceSamples, KernelError, PromptRowLogprobs, Result, RowLogprobs, RowOptions,
    SamplingOptions, MAX_LOGPROBS,
};
use cudarc::driver::{CudaView, LaunchConfig};

/// Ints per row of packed options (the kernels' `SX_OPT_INTS`).
pub(crate) const OPT_INTS: usize = 7;
/// Ints of one logprobs result (the kernels' `SX_LP_INTS`).
pub(crate) const LP_INTS: usize = 2 + 2 * MAX_LOGPROBS;
/// Ints of one prompt-logprobs result (the kernels' `SX_PLP_INTS`).
pub(crate) const PLP_INTS: usize = 3 + 2 * MAX_LOGPROBS;
/// Threads per row of the penalty kernel (`SX_PEN_THREADS`).
const PEN_THREADS: u32 = 256;
/// Threads per row of the logprobs kernel (`SMP_THREADS`).
const LP_THREADS: u32 = 1024;

/// What the host keeps of a step's options to launch and read back.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct OptionsInfo {
    /// Whether options were given at all (else no options span exists).
    pub present: bool,
    pub any_penalties: bool,
    /// Sampling rows asking for logprobs, in slot order (= row order).
    pub lp_rows: Vec<usize>,
    /// Prompt-logprobs rows after the sampling rows.
    pub prompt_rows: usize,
}

impl OptionsInfo {
    /// Checks `opts` against `rows` sampling rows and records what the
    /// launch and the read-back need.
    pub fn new(opts: &SamplingOptions, rows: usize) -> Result<Self> {
        opts.validate(rows).map_err(|detail| KernelError::Shape {
            op: "sampling options",
            detail,
        })?;
        Ok(OptionsInfo {
            present: !opts.is_empty(),
            any_penalties: opts.any_penalties(),
            lp_rows: opts
                .rows
                .iter()
                .enumerate()
                .filter(|(_, r)| r.logprobs.is_some())
                .map(|(i, _)| i)
                .collect(),
            prompt_rows: opts.prompt_rows.len(),
        })
    }
}

/// Appends the prompt rows of `opts` as (token, n) pairs; returns their span.
pub(crate) fn pack_prompt_rows(opts: &SamplingOptions, packed: &mut Vec<i32>) -> Span {
    let span = Span {
        start: packed.len(),
        len: 2 * opts.prompt_rows.len(),
    };
    for p in &opts.prompt_rows {
        // Ids past i32 are outside any vocabulary: the kernel scores -inf.
        packed.extend([p.token.min(i32::MAX as u32) as i32, p.n as i32]);
    }
    packed.push(0);
    span
}

/// Appends `opts` (validated for `rows` sampling rows) to `packed`, rows
/// past its end padded with no options; returns the options and history
/// spans. A trailing element keeps both spans inside the buffer.
pub(crate) fn pack_options(
    opts: &SamplingOptions,
    rows: usize,
    packed: &mut Vec<i32>,
) -> (Span, Span) {
    let options = Span {
        start: packed.len(),
        len: rows * OPT_INTS,
    };
    let mut slot = 0i32;
    let pad = rows.saturating_sub(opts.rows.len());
    for r in opts
        .rows
        .iter()
        .chain(std::iter::repeat_n(&RowOptions::NONE, pad))
    {
        let (n, s) = match r.logprobs {
            Some(n) => {
                slot += 1;
                (n.min(MAX_LOGPROBS as u32) as i32, slot - 1)
            }
            None => (-1, 0),
        };
        packed.extend([
            r.repetition_penalty.to_bits() as i32,
            r.frequency_penalty.to_bits() as i32,
            r.presence_penalty.to_bits() as i32,
            r.history_start as i32,
            r.history_len as i32,
            n,
            s,
        ]);
    }
    let history = Span {
        start: packed.len(),
        len: opts.history.len(),
    };
    // Counts and ids below 2^31 (validated: the history fits in 32 bits).
    packed.extend(opts.history.iter().map(|&v| v.min(i32::MAX as u32) as i32));
    packed.push(0);
    (options, history)
}

fn shape_err(detail: String) -> KernelError {
    KernelError::Shape {
        op: "sample",
        detail,
    }
}

/// Samples every row of `logits` with `step`'s sampling rows and the
/// options in `opts` (device views of the packed options and history, with
/// their host summary), and brings the results back: one download, one wait.
pub(crate) fn sample_rows(
    b: &CudaBackend,
    logits: &CudaTensor,
    step: &CudaStep,
    opts: Option<(CudaView<'_, i32>, CudaView<'_, i32>)>,
    info: &OptionsInfo,
) -> Result<DeviceSamples> {
    // The sampling rows lead; the prompt-logprobs rows follow them.
    let (rows, vocab) = (step.ctx.sampling.len(), logits.cols);
    if info.present != opts.is_some() {
        return Err(shape_err("sampling options without their upload".into()));
    }
    let n_prompt = info.prompt_rows;
    if logits.rows != rows + n_prompt {
        return Err(shape_err(format!(
            "{} logits rows for {rows} sampling and {n_prompt} prompt rows",
            logits.rows
        )));
    }
    let n_lp = info.lp_rows.len();
    let lp_end = rows + n_lp * LP_INTS;
    let total = lp_end + n_prompt * PLP_INTS;
    // Room for every row's logprobs whenever any row asks, so the buffer's
    // size depends on the row count alone (two sizes per batch size).
    let room = if n_lp > 0 { rows * (1 + LP_INTS) } else { rows };
    let mut out = b.alloc_i32(room.max(total))?;
    // Two u64 per row: the kept prefix's length and mass.
    let mut kept = b.alloc_i32(4 * rows.max(1))?;
    if let Some((o, h)) = &opts {
        if info.any_penalties {
            launch_penalties(b, logits, rows, o, h)?;
        }
    }
    super::sampling::launch_sample(b, logits, step, &mut out, &mut kept)?;
    if let (Some((o, _)), true) = (&opts, n_lp > 0) {
        launch_logprobs(b, logits, rows, step, o, &kept, &mut out)?;
    }
    if n_prompt > 0 {
        launch_prompt_logprobs(b, logits, rows, step, lp_end, &mut out)?;
    }
    let mut host = vec![0i32; total.max(1)];
    if total > 0 {
        b.dev
            .stream
            .memcpy_dtoh(&out.slice(..total), &mut host[..total])
            .map_err(|e| device_err("sample download", e))?;
    }
    b.synchronize()?;
    let mut samples = read_results(&host, rows, vocab, &info.lp_rows);
    samples.prompt = read_prompt_results(&host[lp_end..total], vocab);
    Ok(samples)
}

/// Parses the prompt-logprobs results (`PLP_INTS` ints each).
fn read_prompt_results(host: &[i32], vocab: usize) -> Vec<PromptRowLogprobs> {
    host.chunks_exact(PLP_INTS)
        .map(|r| {
            let count = (r[2].max(0) as usize).min(MAX_LOGPROBS);
            PromptRowLogprobs {
                logprob: f32::from_bits(r[0] as u32),
                rank: r[1].max(1) as u32,
                top: r[3..3 + 2 * count]
                    .chunks_exact(2)
                    .filter(|p| (p[0] as usize) < vocab)
                    .map(|p| (p[0] as u32, f32::from_bits(p[1] as u32)))
                    .collect(),
            }
        })
        .collect()
}

/// Parses the downloaded ids and logprob results.
fn read_results(host: &[i32], rows: usize, vocab: usize, lp_rows: &[usize]) -> DeviceSamples {
    let tokens = host[..rows].iter().map(|&t| t as u32).collect();
    let mut logprobs = Vec::new();
    if !lp_rows.is_empty() {
        logprobs.resize(rows, None);
        for (slot, &row) in lp_rows.iter().enumerate() {
            let r = &host[rows + slot * LP_INTS..rows + (slot + 1) * LP_INTS];
            let count = (r[1].max(0) as usize).min(MAX_LOGPROBS);
            let top = r[2..2 + 2 * count]
                .chunks_exact(2)
                .filter(|p| (p[0] as usize) < vocab)
                .map(|p| (p[0] as u32, f32::from_bits(p[1] as u32)))
                .collect();
            if let Some(e) = logprobs.get_mut(row) {
                *e = Some(RowLogprobs {
                    logprob: f32::from_bits(r[0] as u32),
                    top,
                });
            }
        }
    }
    DeviceSamples {
        tokens,
        logprobs,
        prompt: Vec::new(),
    }
}

fn grid(rows: usize) -> Result<u32> {
    u32::try_from(rows)
        .ok()
        .filter(|&r| r < i32::MAX as u32 / OPT_INTS as u32)
        .ok_or_else(|| shape_err(format!("{rows} rows")))
}

/// Applies the penalties of every row that has some, in place.
fn launch_penalties(
    b: &CudaBackend,
    logits: &CudaTensor,
    rows: usize,
    opts: &CudaView<'_, i32>,
    hist: &CudaView<'_, i32>,
) -> Result<()> {
    if opts.len() != rows * OPT_INTS {
        return Err(shape_err(format!(
            "{} option ints for {rows} rows",
            opts.len()
        )));
    }
    if rows == 0 {
        return Ok(());
    }
    let v = logits.cols as i32;
    let mut l = b.dev.launch("penalize_bf16")?;
    l.arg(logits.bf16("penalize")?).arg(opts).arg(hist).arg(&v);
    let cfg = LaunchConfig {
        grid_dim: (grid(rows)?, 1, 1),
        block_dim: (PEN_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // In bounds: each row's history range lies inside `hist` (validated when
    // packed); the kernel writes only logits of tokens below `vocab`.
    l.run(cfg)?;
    Ok(())
}

/// Writes the logprob results of every row asking after the ids in `out`.
fn launch_logprobs(
    b: &CudaBackend,
    logits: &CudaTensor,
    rows: usize,
    step: &CudaStep,
    opts: &CudaView<'_, i32>,
    kept: &DeviceBuf<i32>,
    out: &mut DeviceBuf<i32>,
) -> Result<()> {
    if opts.len() != rows * OPT_INTS {
        return Err(shape_err(format!(
            "{} option ints for {rows} rows",
            opts.len()
        )));
    }
    if rows == 0 {
        return Ok(());
    }
    let (r, v) = (rows as i32, logits.cols as i32);
    let sampling = step.view(step.layout.sampling);
    let mut l = b.dev.launch("logprobs_bf16")?;
    l.out(&mut *out)
        .arg(logits.bf16("logprobs")?)
        .arg(&sampling)
        .arg(opts)
        .arg(kept)
        .arg(&r)
        .arg(&v);
    let cfg = LaunchConfig {
        grid_dim: (grid(rows)?, 1, 1),
        block_dim: (LP_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // In bounds: `out` holds the ids and one result per logprobs slot (sized
    // from the same options), `kept` two u64 per row, the sampling span six
    // ints per row (checked by the sample launch).
    l.run(cfg)?;
    Ok(())
}

/// Writes the prompt-logprobs results of the logits rows after the `rows`
/// sampling rows into `out` from int `at` on.
fn launch_prompt_logprobs(
    b: &CudaBackend,
    logits: &CudaTensor,
    rows: usize,
    step: &CudaStep,
    at: usize,
    out: &mut DeviceBuf<i32>,
) -> Result<()> {
    let n = logits.rows - rows;
    let span = step.layout.prompt;
    if span.len != 2 * n || out.len() < at + n * PLP_INTS {
        return Err(shape_err(format!(
            "{n} prompt rows, {} packed ints, {} result ints",
            span.len,
            out.len()
        )));
    }
    let first = i32::try_from(rows).map_err(|_| shape_err(format!("{rows} rows")))?;
    let (at, v) = (at as i32, logits.cols as i32);
    let targets = step.view(span);
    let mut l = b.dev.launch("prompt_logprobs_bf16")?;
    l.out(&mut *out)
        .arg(&at)
        .arg(logits.bf16("prompt logprobs")?)
        .arg(&first)
        .arg(&targets)
        .arg(&v);
    let cfg = LaunchConfig {
        grid_dim: (grid(n)?, 1, 1),
        block_dim: (LP_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // In bounds: block `r` reads logits row `first + r` (< logits.rows, the
    // tensor's), two ints of `targets` (2n, checked) and writes PLP_INTS ints
    // at `at + r * PLP_INTS` (inside `out`, checked).
    l.run(cfg)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_numbers_logprob_slots_in_row_order() {
        let mut o = SamplingOptions {
            rows: vec![RowOptions::NONE; 3],
            history: vec![4, 0, 9, 2],
            ..Default::default()
        };
        o.rows[0].logprobs = Some(5);
        o.rows[1].repetition_penalty = 1.5;
        o.rows[1].history_len = 2;
        o.rows[2].logprobs = Some(0);
        let mut packed = vec![7];
        let (op, h) = pack_options(&o, 4, &mut packed);
        assert_eq!(op, Span { start: 1, len: 28 });
        assert_eq!(h, Span { start: 29, len: 4 });
        assert_eq!(packed.len(), 34);
        // The padding row: no penalties, no logprobs.
        assert_eq!(packed[1 + 21], 1.0f32.to_bits() as i32);
        assert_eq!(&packed[1 + 21 + 5..1 + 21 + 7], &[-1, 0]);
        assert_eq!(&packed[1 + 5..1 + 7], &[5, 0]);
        assert_eq!(packed[1 + 7], 1.5f32.to_bits() as i32);
        assert_eq!(&packed[1 + 7 + 3..1 + 7 + 7], &[0, 2, -1, 0]);
        assert_eq!(&packed[1 + 14 + 5..1 + 14 + 7], &[0, 1]);
        assert_eq!(&packed[29..33], &[4, 0, 9, 2]);
        let info = OptionsInfo::new(&o, 3).unwrap();
        assert_eq!(info.lp_rows, vec![0, 2]);
        assert!(info.any_penalties && info.present);
    }

    #[test]
    fn results_parse_per_row() {
        let rows = 3;
        let mut host = vec![11, 12, 13];
        let mut r = vec![0i32; LP_INTS];
        r[0] = (-0.5f32).to_bits() as i32;
        r[1] = 2;
        r[2..6].copy_from_slice(&[
            12,
            (-0.25f32).to_bits() as i32,
            3,
            (-1.0f32).to_bits() as i32,
        ]);
        host.extend(&r);
        let s = read_results(&host, rows, 100, &[1]);
        assert_eq!(s.tokens, vec![11, 12, 13]);
        assert_eq!(s.logprobs.len(), 3);
        assert!(s.logprobs[0].is_none() && s.logprobs[2].is_none());
        let lp = s.logprobs[1].as_ref().unwrap();
        assert_eq!(lp.logprob, -0.5);
        assert_eq!(lp.top, vec![(12, -0.25), (3, -1.0)]);
    }
}
