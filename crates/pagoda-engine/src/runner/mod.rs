//! The model runner: owns a backend, a model and its paged KV cache, and turns
//! one step's [`ForwardContext`] into sampled tokens (device sampling) or
//! logits (host sampling).
//!
//! Invariants: the KV cache has one `B::KvCache` per slot of the model's
//! [`KvLayout`] (per layer unless the layout groups layers), each of the
//! same [`KvCacheShape`]; block ids in a context index those caches, and a
//! context carries one block table and slot mapping per KV cache group. Decode graphs
//! (see [`graphs`]) are captured against those caches, so resizing the cache
//! drops them.
//!
//! Per step: eager steps upload the metadata (with the sampling options)
//! once, queue the forward pass and either sample on the device (ids and
//! the small logprob results come back: the step's one sync) or copy the
//! logits back; decode steps that fit a captured graph replay it instead
//! (the graph holds the forward pass; sampling with any per-row options
//! runs after it, so penalties and logprobs never leave the graph path).

pub mod graphs;

use crate::{EngineError, Result};
use pagoda_core::BlockCopy;
use pagoda_kernels::{
    Backend, DeviceSamples, ForwardContext, KvCacheShape, RowOptions, SamplingOptions, SamplingRow,
    TokenMasks, MAX_LOGIT_ENTRIES, MAX_LOGPROBS,
};
use pagoda_model::arch::CausalLm;
use pagoda_model::{KvLayout, ModelConfig};
use std::collections::BTreeMap;

/// What one step produced.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutput {
    /// One sampled token per logits row (the context carried sampling rows).
    Tokens(Vec<u32>),
    /// What [`ModelRunner::execute_with`] sampled: tokens and logprobs.
    Samples(DeviceSamples),
    /// Row-major `[logits rows, vocab]` logits, for sampling on the host.
    Logits(Vec<f32>),
}

impl StepOutput {
    /// The logits, for a step run without sampling rows.
    pub fn into_logits(self) -> Result<Vec<f32>> {
        match self {
            StepOutput::Logits(l) => Ok(l),
            StepOutput::Tokens(_) | StepOutput::Samples(_) => Err(EngineError::Internal(
                "the step sampled on the device; no logits came back".into(),
            )),
        }
    }
}

/// Captured decode graphs by block-table width tier and padded batch size.
/// A step replays the narrowest tier its tables fit, so short contexts do
/// not pay for the longest one's table width (host padding, upload, and the
/// attention grid's partitions all scale with it).
struct DecodeGraphs<G> {
    /// Ascending by width; each tier holds one graph per ladder size.
    tiers: Vec<GraphTier<G>>,
    /// Positions the graphs may see (the rope table's rows).
    max_model_len: usize,
    /// Reused host buffer for the padded context.
    padded: ForwardContext,
}

struct GraphTier<G> {
    /// Block-table width every graph of the tier was captured with.
    width: usize,
    by_size: BTreeMap<usize, G>,
}

/// A model ready to run steps on backend `B`.
pub struct ModelRunner<B: Backend> {
    backend: B,
    model: Box<dyn CausalLm<B>>,
    kv: Vec<B::KvCache>,
    kv_shape: KvCacheShape,
    /// Where each layer's K/V lives (the model's).
    kv_layout: KvLayout,
    /// Each layer's FP8 KV scales `(k, v)` (empty: 1.0 everywhere), set
    /// again on every cache allocation.
    kv_scales: Vec<(f32, f32)>,
    graphs: Option<DecodeGraphs<B::Graph>>,
    /// Decode graph replays so far.
    graph_replays: u64,
}

impl<B: Backend> ModelRunner<B> {
    /// Allocates `num_blocks` KV pages of `block_size` tokens for every
    /// slot of the model's [`KvLayout`] (every layer, for one group).
    pub fn new(
        backend: B,
        model: Box<dyn CausalLm<B>>,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Self> {
        let cfg = model.config();
        let kv_shape = KvCacheShape {
            num_blocks,
            block_size,
            num_kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim(),
        };
        let kv_layout = model.kv_layout();
        let kv = (0..kv_layout.num_slots)
            .map(|_| backend.alloc_kv_cache(kv_shape))
            .collect::<pagoda_kernels::Result<Vec<_>>>()?;
        Ok(ModelRunner {
            backend,
            model,
            kv,
            kv_shape,
            kv_layout,
            kv_scales: Vec::new(),
            graphs: None,
            graph_replays: 0,
        })
    }

    /// Replaces the KV cache with one of `num_blocks` blocks (contents lost;
    /// captured graphs are dropped, since they point at the old cache).
    pub fn resize_kv_cache(&mut self, num_blocks: usize) -> Result<()> {
        self.graphs = None;
        self.kv.clear();
        self.kv_shape.num_blocks = num_blocks;
        self.kv = (0..self.kv_layout.num_slots)
            .map(|_| self.backend.alloc_kv_cache(self.kv_shape))
            .collect::<pagoda_kernels::Result<Vec<_>>>()?;
        self.apply_kv_scales()
    }

    /// Sets each layer's FP8 KV cache scales `(k_scale, v_scale)` (one pair
    /// per layer; a checkpoint's `k_scale` / `v_scale`), kept for every
    /// later cache allocation. A cache that is not FP8 ignores them (as
    /// vLLM does), since its values are stored unscaled.
    pub fn set_kv_scales(&mut self, scales: Vec<(f32, f32)>) -> Result<()> {
        let layout = &self.kv_layout;
        if scales.len() != layout.num_layers() {
            return Err(pagoda_kernels::KernelError::Shape {
                op: "set_kv_scales",
                detail: format!(
                    "{} scale pairs for {} layers",
                    scales.len(),
                    layout.num_layers()
                ),
            }
            .into());
        }
        // One pair per slot cache: the layers sharing a slot must agree.
        let mut per_slot: Vec<Option<(f32, f32)>> = vec![None; layout.num_slots];
        for (l, &pair) in scales.iter().enumerate() {
            match per_slot[layout.slot[l]] {
                Some(p) if p != pair => {
                    return Err(EngineError::Internal(format!(
                        "layer {l}'s KV scales {pair:?} differ from those of a layer sharing its \
                         KV cache slot ({p:?}); FP8 KV scales must agree within a slot"
                    )))
                }
                _ => per_slot[layout.slot[l]] = Some(pair),
            }
        }
        self.kv_scales = per_slot
            .into_iter()
            .map(|p| p.unwrap_or((1.0, 1.0)))
            .collect();
        self.apply_kv_scales()
    }

    /// Where each layer's K/V lives: the KV cache groups the scheduler
    /// keeps one block table each for.
    pub fn kv_layout(&self) -> &KvLayout {
        &self.kv_layout
    }

    fn apply_kv_scales(&mut self) -> Result<()> {
        if !self.backend.kv_cache_fp8() {
            return Ok(());
        }
        for (cache, &(k, v)) in self.kv.iter_mut().zip(&self.kv_scales) {
            self.backend.set_kv_scales(cache, k, v)?;
        }
        Ok(())
    }

    /// Whether the KV cache holds FP8 bytes.
    pub fn kv_cache_fp8(&self) -> bool {
        self.backend.kv_cache_fp8()
    }

    /// Whether steps may carry sampling rows ([`ForwardContext::sampling`]).
    pub fn samples_on_device(&self) -> bool {
        self.backend.samples_on_device()
    }

    /// Start-up on a device, before the KV cache is sized: runs the
    /// profiling steps ([`Self::profile_peak_memory`]) on the current cache
    /// (one block is enough), drops that cache, and freezes the backend's
    /// step memory. Returns the bytes reserved for steps (`None` where the
    /// backend reserves none: it does not sample on a device). Then call
    /// [`Self::resize_kv_cache`] with what memory is left.
    pub fn reserve_step_memory(
        &mut self,
        max_tokens: usize,
        max_seqs: usize,
        max_model_len: usize,
    ) -> Result<Option<usize>> {
        if !self.samples_on_device() {
            return Ok(None);
        }
        self.profile_peak_memory(max_tokens, max_seqs, max_model_len)?;
        self.resize_kv_cache(0)?;
        Ok(self.backend.freeze_step_memory()?)
    }

    /// Runs, with dummy inputs that store nothing, the steps that bring the
    /// backend's step memory to its peak, so that it can be frozen (see
    /// [`Backend::freeze_step_memory`]) and the KV cache sized from what
    /// is left: the largest prompt step (`max_tokens` tokens over up to
    /// `max_seqs` sequences, each sampled), the largest decode step
    /// (`max_seqs` sequences of one token), both with block tables wide
    /// enough for `max_model_len`, and one prompt step per row count the
    /// backend warms up ([`Backend::warmup_row_counts`]: on CUDA the GEMM
    /// plan buckets, so every plan and library kernel exists before serving).
    pub fn profile_peak_memory(
        &mut self,
        max_tokens: usize,
        max_seqs: usize,
        max_model_len: usize,
    ) -> Result<()> {
        let max_tokens = max_tokens.max(1);
        let max_seqs = max_seqs.max(1);
        let width = max_model_len.max(1).div_ceil(self.kv_shape.block_size);
        let mut shapes = vec![(max_tokens, max_seqs), (max_seqs, max_seqs)];
        for n in self.backend.warmup_row_counts(max_tokens) {
            shapes.push((n, n.min(max_seqs)));
        }
        let vocab = self.model.config().vocab_size;
        for (i, (tokens, seqs)) in shapes.into_iter().enumerate() {
            // The two largest steps carry the longest penalty histories and
            // an allow-all token mask on every row, so the backend's mask
            // buffer reaches its largest size here, not while serving.
            let (mut ctx, opts) = self.dummy_step(tokens, seqs, width, max_model_len, i < 2);
            ctx.fill_unused_kv_groups(self.kv_layout.num_groups() - 1);
            let rows = if i < 2 { ctx.sampling.len() } else { 0 };
            let words = vocab.div_ceil(32);
            self.execute_masked(&ctx, &opts, &mut || {
                Ok(TokenMasks {
                    words,
                    rows: (0..rows as u32).collect(),
                    bits: vec![u32::MAX; rows * words],
                })
            })?;
        }
        Ok(())
    }

    /// A step of `tokens` prompt tokens spread evenly over `seqs` sequences
    /// (each at most `max_model_len` long, each sampled), block tables
    /// `width` wide and all pointing at block 0, storing nothing; every row
    /// asks for logprobs and a penalty, over a history of every token it
    /// could hold, and for the most logit adjustments a row may have, when
    /// `longest_histories`.
    fn dummy_step(
        &self,
        tokens: usize,
        seqs: usize,
        width: usize,
        max_model_len: usize,
        longest_histories: bool,
    ) -> (ForwardContext, SamplingOptions) {
        let seqs = seqs.clamp(1, tokens.max(1));
        let per_seq = tokens.max(1).div_ceil(seqs).min(max_model_len.max(1));
        let mut ctx = ForwardContext {
            block_size: self.kv_shape.block_size,
            max_blocks_per_seq: width,
            ..Default::default()
        };
        ctx.cu_seqlens_q.push(0);
        ctx.cu_seqlens_k.push(0);
        let mut left = tokens.max(1);
        for i in 0..seqs {
            let q = per_seq.min(left);
            if q == 0 {
                break;
            }
            left -= q;
            ctx.input_ids.extend(std::iter::repeat_n(0, q));
            ctx.positions.extend(0..q as u32);
            ctx.slot_mapping.extend(std::iter::repeat_n(-1, q));
            ctx.block_tables.extend(std::iter::repeat_n(0, width));
            ctx.cu_seqlens_q.push(ctx.cu_seqlens_q[i] + q as u32);
            ctx.cu_seqlens_k.push(ctx.cu_seqlens_k[i] + q as u32);
            ctx.seq_lens.push(q as u32);
            ctx.context_lens.push(0);
            ctx.logits_indices.push(ctx.cu_seqlens_q[i + 1] - 1);
            ctx.max_query_len = ctx.max_query_len.max(q);
            ctx.max_seq_len = ctx.max_seq_len.max(q);
            if q == 1 {
                ctx.num_decode_tokens += 1;
            } else {
                ctx.num_prefills += 1;
                ctx.num_prefill_tokens += q;
            }
        }
        let mut opts = SamplingOptions::default();
        if self.samples_on_device() {
            let rows = ctx.logits_indices.len();
            ctx.sampling = vec![
                SamplingRow {
                    temperature: 1.0,
                    top_k: 50,
                    top_p: 0.9,
                    min_p: 0.0,
                    random: 1,
                };
                rows
            ];
            // Every row with the largest logprobs request and a penalty over
            // the longest history a sequence can have (every token distinct),
            // so the sampling scratch and the options' upload reach their
            // peak too.
            let pairs = if longest_histories {
                max_model_len.min(self.model.config().vocab_size).max(1)
            } else {
                1
            };
            opts.history = (0..rows * pairs)
                .flat_map(|i| [(i % pairs) as u32, 1])
                .collect();
            opts.rows = (0..rows)
                .map(|r| RowOptions {
                    presence_penalty: 0.5,
                    history_start: (r * pairs) as u32,
                    history_len: pairs as u32,
                    logprobs: Some(MAX_LOGPROBS as u32),
                    ..RowOptions::NONE
                })
                .collect();
            // The most logit adjustments a row can have, likewise.
            let vocab = self.model.config().vocab_size;
            let n = if longest_histories {
                MAX_LOGIT_ENTRIES.min(vocab)
            } else {
                1
            };
            let entries: Vec<(u32, f32)> = (0..n as u32).map(|t| (t, 0.0)).collect();
            let allowed: Vec<u32> = (0..n as u32).collect();
            for _ in 0..rows {
                opts.adjust.push_row(&entries, Some(&allowed));
            }
        }
        (ctx, opts)
    }

    /// Captures decode graphs for every ladder size up to `max_batch` in
    /// each table-width tier of [`graphs::tiers`], for sequences of up to
    /// `max_model_len` tokens. Returns how many were captured; 0 where the
    /// backend has no graphs.
    pub fn capture_decode_graphs(
        &mut self,
        max_batch: usize,
        max_model_len: usize,
    ) -> Result<usize> {
        let tiers = graphs::tiers(max_model_len);
        self.capture_decode_graphs_in_tiers(max_batch, max_model_len, &tiers)
    }

    /// [`Self::capture_decode_graphs`] with the tiers' context lengths in
    /// tokens given (the last must be `max_model_len`).
    pub fn capture_decode_graphs_in_tiers(
        &mut self,
        max_batch: usize,
        max_model_len: usize,
        tier_tokens: &[usize],
    ) -> Result<usize> {
        self.graphs = None;
        if !self.backend.supports_graphs() || !self.backend.samples_on_device() || max_batch == 0 {
            return Ok(0);
        }
        if tier_tokens.last() != Some(&max_model_len) || !tier_tokens.is_sorted() {
            return Err(EngineError::Internal(format!(
                "graph tiers {tier_tokens:?} must ascend to max_model_len {max_model_len}"
            )));
        }
        let block_size = self.kv_shape.block_size;
        let empty = ForwardContext {
            block_size,
            max_blocks_per_seq: 1,
            extra_kv_groups: self.kv_layout.num_groups() - 1,
            ..Default::default()
        };
        let mut dummy = ForwardContext::default();
        let mut tiers: Vec<GraphTier<B::Graph>> = Vec::new();
        // Widest first: its eager warm-up runs load the libraries' kernels
        // and touch the largest buffers outside any capture.
        for (t, &tokens) in tier_tokens.iter().enumerate().rev() {
            let width = tokens.div_ceil(block_size).max(1);
            if tiers.iter().any(|tier| tier.width == width) {
                continue;
            }
            let widest = t + 1 == tier_tokens.len();
            let mut by_size = BTreeMap::new();
            for size in graphs::ladder(max_batch).into_iter().rev() {
                // All rows are padding: they read block 0 and store nothing.
                graphs::pad_decode(&empty, size, width, &mut dummy);
                if widest {
                    self.execute(&dummy)?;
                }
                let step = self.backend.begin_step(&dummy)?;
                let (backend, model, kv) = (&self.backend, &self.model, &mut self.kv);
                let graph = backend.capture_graph(step, &mut |s| {
                    model.forward(backend, s, kv).map_err(|e| match e {
                        pagoda_model::ModelError::Kernel(k) => k,
                        other => pagoda_kernels::KernelError::Device(other.to_string()),
                    })
                })?;
                by_size.insert(size, graph);
            }
            tiers.push(GraphTier { width, by_size });
        }
        tiers.reverse();
        let n = tiers.iter().map(|t| t.by_size.len()).sum();
        self.graphs = Some(DecodeGraphs {
            tiers,
            max_model_len,
            padded: ForwardContext::default(),
        });
        Ok(n)
    }

    /// Block-table widths of the captured graph tiers, ascending.
    pub fn graph_widths(&self) -> Vec<usize> {
        self.graphs
            .as_ref()
            .map(|g| g.tiers.iter().map(|t| t.width).collect())
            .unwrap_or_default()
    }

    /// How many steps replayed a decode graph so far.
    pub fn graph_replays(&self) -> u64 {
        self.graph_replays
    }

    /// Batch sizes with a captured decode graph, ascending.
    pub fn graph_batch_sizes(&self) -> Vec<usize> {
        self.graphs
            .as_ref()
            .and_then(|g| g.tiers.last())
            .map(|t| t.by_size.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Bytes one KV page takes (one block of every slot of `cfg`'s
    /// [`KvLayout`]: of every layer, for one group) on `backend`.
    pub fn kv_bytes_per_block(backend: &B, cfg: &ModelConfig, block_size: usize) -> usize {
        let one = KvCacheShape {
            num_blocks: 1,
            block_size,
            num_kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim(),
        };
        backend.kv_cache_bytes(one) * KvLayout::for_config(cfg, true).num_slots
    }

    /// Bytes of the KV cache as allocated (every block of every slot).
    pub fn kv_cache_bytes(&self) -> usize {
        Self::kv_bytes_per_block(&self.backend, self.model.config(), self.kv_shape.block_size)
            * self.kv_shape.num_blocks
    }

    pub fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn backend_name(&self) -> String {
        self.backend.name()
    }

    pub fn kv_shape(&self) -> KvCacheShape {
        self.kv_shape
    }

    /// Copies the leading slots of shared blocks into private ones, every layer.
    pub fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<()> {
        for cache in &mut self.kv {
            self.backend.copy_blocks(cache, copies)?;
        }
        Ok(())
    }

    /// Runs one step. With sampling rows in `ctx` (only where
    /// [`Self::samples_on_device`]) returns the sampled tokens, else the
    /// logits of `ctx.logits_indices`, row-major `[rows, vocab]`.
    pub fn execute(&mut self, ctx: &ForwardContext) -> Result<StepOutput> {
        Ok(match self.execute_with(ctx, &SamplingOptions::default())? {
            StepOutput::Samples(s) => StepOutput::Tokens(s.tokens),
            other => other,
        })
    }

    /// [`Self::execute`] with per-row sampling options (penalties,
    /// logprobs; empty for none): a step with sampling rows returns
    /// [`StepOutput::Samples`], one token (and logprobs where asked) per row.
    pub fn execute_with(
        &mut self,
        ctx: &ForwardContext,
        opts: &SamplingOptions,
    ) -> Result<StepOutput> {
        self.execute_masked(ctx, opts, &mut || Ok(TokenMasks::default()))
    }

    /// [`Self::execute_with`] whose device sampling applies token masks
    /// (structured outputs): `masks` is called once, after the forward pass
    /// is queued and before the sampling, so that the host computes them
    /// while the device runs; a step without sampling rows never calls it.
    pub fn execute_masked(
        &mut self,
        ctx: &ForwardContext,
        opts: &SamplingOptions,
        masks: &mut dyn FnMut() -> pagoda_kernels::Result<TokenMasks>,
    ) -> Result<StepOutput> {
        if ctx.block_size != self.kv_shape.block_size {
            return Err(EngineError::Internal(
                "step block size differs from the cache's".into(),
            ));
        }
        debug_assert_eq!(ctx.validate(), Ok(()));
        if ctx.extra_kv_groups + 1 != self.kv_layout.num_groups() {
            return Err(EngineError::Internal(format!(
                "a step with {} KV cache groups for a model of {}",
                ctx.extra_kv_groups + 1,
                self.kv_layout.num_groups()
            )));
        }
        // Prompt-logprobs rows are scored with the sampling, on the device.
        let sample = !ctx.sampling.is_empty() || !opts.prompt_rows.is_empty();
        if !sample && !opts.is_empty() {
            return Err(EngineError::Internal(
                "sampling options for a step sampled on the host".into(),
            ));
        }
        if ctx.logits_indices.is_empty() && ctx.num_tokens() == 0 {
            return Ok(if sample {
                StepOutput::Samples(DeviceSamples::default())
            } else {
                StepOutput::Logits(Vec::new())
            });
        }
        if sample && opts.prompt_rows.is_empty() {
            if let Some(samples) = self.replay_decode_graph(ctx, opts, masks)? {
                return Ok(StepOutput::Samples(samples));
            }
        }
        let step = self.backend.begin_step_with(ctx, opts)?;
        let (backend, model, kv) = (&self.backend, &self.model, &mut self.kv);
        let logits = backend.scope(|| model.forward(backend, &step, kv))?;
        Ok(if sample {
            let m = masks()?;
            m.validate(ctx.sampling.len(), model.config().vocab_size)
                .map_err(EngineError::Internal)?;
            backend.apply_token_masks(&logits, &m)?;
            StepOutput::Samples(backend.sample_full(&logits, &step)?)
        } else {
            StepOutput::Logits(backend.tensor_to_host(&logits)?)
        })
    }

    /// Replays the decode graph `ctx` fits, if any (`None`: run eagerly).
    fn replay_decode_graph(
        &mut self,
        ctx: &ForwardContext,
        opts: &SamplingOptions,
        masks: &mut dyn FnMut() -> pagoda_kernels::Result<TokenMasks>,
    ) -> Result<Option<DeviceSamples>> {
        let Some(g) = self.graphs.as_mut() else {
            return Ok(None);
        };
        if !graphs::is_graph_decode(ctx) {
            return Ok(None);
        }
        let Some(tier) = g
            .tiers
            .iter_mut()
            .find(|t| t.width >= ctx.max_blocks_per_seq)
        else {
            return Ok(None);
        };
        let n = ctx.num_seqs();
        let Some((&size, graph)) = tier.by_size.range_mut(n..).next() else {
            return Ok(None);
        };
        // The graph's ops checked ranges at capture only: check the values.
        let vocab = self.model.config().vocab_size;
        let blocks = self.kv_shape.num_blocks as u32;
        if ctx.input_ids.iter().any(|&t| t as usize >= vocab)
            || ctx.positions.iter().any(|&p| p as usize >= g.max_model_len)
            || ctx.block_tables.iter().any(|&b| b >= blocks)
            || ctx.group_block_tables.iter().any(|&b| b >= blocks)
        {
            return Ok(None);
        }
        graphs::pad_decode(ctx, size, tier.width, &mut g.padded);
        // Padding rows have no options (the backend pads them).
        let mut samples = self
            .backend
            .replay_graph_masked(graph, &g.padded, opts, masks)?;
        samples.tokens.truncate(n);
        samples.logprobs.truncate(n);
        self.graph_replays += 1;
        Ok(Some(samples))
    }
}
