//! The prefill attention kernels of the CUDA backend (steps whose longest
//! query is more than one token), each case run on both the grouped kernel
//! (`MmaPrefill`, the default) and the tiled one (`TiledPrefill`, forced
//! through `CudaBackend::force_tiled_prefill`), against the CPU backend on
//! the same bf16-rounded K/V/Q: prompts of 1..300 tokens around the tile
//! edges of both kernels (64 tokens per block for the tiled kernel; 128 or
//! 64 packed rows of query heads for the grouped one, so 128 / group tokens,
//! a token's heads split across two blocks when the group does not divide
//! 128), cached prefixes of 0..700 tokens (block-aligned or not), mixed
//! steps with decode sequences and slot -1 padding, GQA ratios 1/2/3/4/6/8,
//! head_dim 64, 128 and 256, block sizes 3/16/32, a 1500-token prompt after
//! a 500-token prefix, and a step whose `max_query_len` understates its
//! longest query. A second family checks the causal boundary exactly, with
//! no tolerance: changing the K/V of query token c must leave every row
//! before c bit-identical and change every row from c on.
//!
//! The output is NaN-poisoned first, so every element must be written; the
//! cache is poisoned before the prefix is stored (NaN on the GPU when the
//! step has no padding rows, else the same large finite garbage on both
//! backends), so a read of any slot the step did not store shows up. Failure
//! messages name the sequence, query index, 64-row tile, warp and head of the
//! worst rows. Without a CUDA device every test prints a notice and passes
//! (fails where PAGODA_REQUIRE_GPU=1 says a GPU must be present).
#![cfg(feature = "cuda")]

mod common;

#[allow(dead_code)]
const PORTABLE: bool = false;

use common::*;
use pagoda_kernels::cpu::{CpuBackend, CpuKvCache, WeightDtype};
use pagoda_kernels::cuda::testing::{gpu_poisoned as gpu, rel_err_l2 as rel_err};
use pagoda_kernels::cuda::{AttentionKernel, CudaBackend, CudaKvCache, CudaTensor, FAST_HEAD_DIMS};
use pagoda_kernels::{AttentionParams, Backend, ForwardContext, KvCacheShape};

struct Case {
    seqs: Vec<SeqSpec>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    pad: usize,
}

impl Case {
    fn new(
        seqs: Vec<SeqSpec>,
        (nh, nkv): (usize, usize),
        hd: usize,
        bs: usize,
        pad: usize,
    ) -> Self {
        Case {
            seqs,
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            block_size: bs,
            pad,
        }
    }

    fn params(&self) -> AttentionParams {
        AttentionParams {
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
            window: None,
            softcap: None,
            kv_group: 0,
        }
    }

    fn shape(&self) -> KvCacheShape {
        let needed: usize = self
            .seqs
            .iter()
            .map(|s| (s.context_len + s.query_len).div_ceil(self.block_size))
            .sum();
        KvCacheShape {
            num_blocks: needed + 3,
            block_size: self.block_size,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
        }
    }
}

/// Fills every slot of both caches before anything real is stored: NaN on
/// the GPU only (`nan`), else the same large finite values on both.
fn poison_caches(
    g: &CudaBackend,
    gc: &mut CudaKvCache,
    cpu: &CpuBackend,
    cc: &mut CpuKvCache,
    rng: &mut Rng,
    nan: bool,
) {
    let sh = gc.shape();
    let all = paged_step(
        rng,
        &[s(0, sh.num_blocks * sh.block_size)],
        sh.block_size,
        sh.num_blocks,
        0,
    );
    let n = all.ctx.num_tokens() * sh.num_kv_heads * sh.head_dim;
    if nan {
        let x = vec![f32::NAN; n];
        store_step_kv(g, gc, &all.ctx, &x, &x);
    } else {
        let (k, v) = (rvec(rng, n, 60.0), rvec(rng, n, 3000.0));
        store_step_kv(g, gc, &all.ctx, &k, &v);
        store_step_kv(cpu, cc, &all.ctx, &k, &v);
    }
}

/// `(sequence, query index)` of every row of the step.
fn row_owners(ctx: &ForwardContext) -> Vec<(usize, usize)> {
    (0..ctx.num_seqs())
        .flat_map(|i| (0..ctx.query_len(i)).map(move |j| (i, j)))
        .collect()
}

/// Where query index `j` falls in the tiled kernel's tiling (the grouped
/// kernel's block is named in the failing row's head and group).
fn place(j: usize) -> String {
    format!("tile {} warp {} row {}", j / 64, (j % 64) / 16, j % 16)
}

/// NaN check, then per-row (< 2e-2) and total (< 1e-2) relative errors; a
/// failure lists the worst rows with their sequence, query index and head.
fn compare(what: &str, ctx: &ForwardContext, got: &[f32], want: &[f32], nh: usize, hd: usize) {
    let w = nh * hd;
    let owners = row_owners(ctx);
    assert_eq!(got.len(), owners.len() * w, "{what}: output length");
    if let Some(i) = got.iter().position(|x| !x.is_finite()) {
        let (sq, j) = owners[i / w];
        let bad = got.iter().filter(|x| !x.is_finite()).count();
        panic!(
            "{what}: {bad} non-finite outputs (unwritten, or an unstored slot was read); first at \
             row {} = seq {sq} query {j} ({}), head {}, dim {}: {}",
            i / w,
            place(j),
            (i % w) / hd,
            i % hd,
            got[i]
        );
    }
    let mut bad = Vec::new();
    for (r, &(sq, j)) in owners.iter().enumerate() {
        let e = rel_err(&got[r * w..(r + 1) * w], &want[r * w..(r + 1) * w]);
        if e >= 2e-2 {
            let (h, he) = (0..nh)
                .map(|h| {
                    let a = r * w + h * hd;
                    (h, rel_err(&got[a..a + hd], &want[a..a + hd]))
                })
                .fold((0, 0.0), |m, x| if x.1 > m.1 { x } else { m });
            bad.push((e, r, sq, j, h, he));
        }
    }
    if !bad.is_empty() {
        let n = bad.len();
        bad.sort_by(|a, b| b.0.total_cmp(&a.0));
        let list: Vec<String> = bad
            .iter()
            .take(8)
            .map(|&(e, r, sq, j, h, he)| {
                let a = r * w + h * hd;
                format!(
                    "row {r} = seq {sq} query {j} ({}): {e:.3e}, worst head {h} ({he:.3e}), \
                     got {:?} want {:?}",
                    place(j),
                    &got[a..a + 4],
                    &want[a..a + 4]
                )
            })
            .collect();
        panic!(
            "{what}: {n} of {} rows over 2e-2 relative error; worst:\n  {}",
            owners.len(),
            list.join("\n  ")
        );
    }
    let e = rel_err(got, want);
    assert!(e < 1e-2, "{what}: total relative error {e:.3e}");
}

/// The prefill kernels a case runs on: the grouped one (default) and the
/// tiled one, as `force_tiled_prefill` values.
const KERNELS: [(bool, AttentionKernel); 2] = [
    (false, AttentionKernel::MmaPrefill),
    (true, AttentionKernel::TiledPrefill),
];

/// Builds the step (poisoned cache, stored prefix, stored step K/V) on both
/// backends, attends on the CPU and on each GPU prefill kernel (asserting
/// that the backend takes that kernel, unless head_dim has none), compares.
/// `claim_max_query_len` overrides the step's `max_query_len` (the kernel
/// must not trust it for the grid).
fn run_case_with(g: &CudaBackend, rng: &mut Rng, c: &Case, claim_max_query_len: Option<usize>) {
    let cpu = backend(2, WeightDtype::F32);
    let (nh, hd) = (c.num_heads, c.head_dim);
    let width = c.num_kv_heads * hd;
    let shape = c.shape();
    let mut gc = g.alloc_kv_cache(shape).unwrap();
    let mut cc = cpu.alloc_kv_cache(shape).unwrap();
    poison_caches(g, &mut gc, &cpu, &mut cc, rng, c.pad == 0);
    let mut step = paged_step(rng, &c.seqs, c.block_size, shape.num_blocks, c.pad);
    assert!(
        step.ctx.max_query_len > 1,
        "test case {:?} would not take the prefill path",
        c.seqs
    );

    let pre = prefix_step(&step, &c.seqs);
    let n = pre.num_tokens() * width;
    let (k, v) = (rvec(rng, n, 1.0), rvec(rng, n, 1.0));
    store_step_kv(g, &mut gc, &pre, &k, &v);
    store_step_kv(&cpu, &mut cc, &pre, &k, &v);

    let t = step.ctx.num_tokens();
    let (k, v) = (rvec(rng, t * width, 1.0), rvec(rng, t * width, 1.0));
    store_step_kv(g, &mut gc, &step.ctx, &k, &v);
    store_step_kv(&cpu, &mut cc, &step.ctx, &k, &v);
    if let Some(m) = claim_max_query_len {
        step.ctx.max_query_len = m;
    }

    // Scale 4 gives scores of std ~2.7: peaked enough that a wrong key shows.
    let q = rvec(rng, t * nh * hd, 4.0);
    let p = c.params();
    let gs = g.begin_step(&step.ctx).unwrap();
    let cs = cpu.begin_step(&step.ctx).unwrap();
    let gq = g.tensor_from_host(t, nh * hd, &q).unwrap();
    let cq = cpu.tensor_from_host(t, nh * hd, &q).unwrap();
    let co = cpu.attention(&cq, &cc, &cs, &p).unwrap();
    let fast = FAST_HEAD_DIMS.contains(&hd);
    for (tiled, kernel) in KERNELS {
        g.force_tiled_prefill(tiled);
        let took = g.attention_kernel_for(&step.ctx, &p);
        if fast && claim_max_query_len.is_none() {
            assert_eq!(took, kernel, "seqs {:?} hd {hd}", c.seqs);
        }
        let go = g.attention(&gq, &gc, &gs, &p).unwrap();
        let got = g.tensor_to_host(&go).unwrap();
        let what = format!(
            "prefill attention ({took:?}) seqs {:?} heads {nh}/{} hd {hd} bs {} pad {} \
             max_query_len {}",
            c.seqs, c.num_kv_heads, c.block_size, c.pad, step.ctx.max_query_len
        );
        compare(&what, &step.ctx, &got, co.data(), nh, hd);
    }
    g.force_tiled_prefill(false);
}

fn run_case(g: &CudaBackend, rng: &mut Rng, c: &Case) {
    run_case_with(g, rng, c, None);
}

const GQA: [(usize, usize); 4] = [(4, 4), (8, 4), (8, 2), (8, 1)];
const HEAD_DIMS: [usize; 3] = [64, 128, 256];

#[test]
fn prompts_around_tile_edges() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(101);
    let steps: [&[usize]; 4] = [
        &[63, 64, 65, 1],
        &[127, 128, 129],
        &[2, 15, 16, 17, 200],
        &[300],
    ];
    for gqa in GQA {
        for hd in HEAD_DIMS {
            for lens in steps {
                let seqs = lens.iter().map(|&q| s(0, q)).collect();
                run_case(&g, &mut rng, &Case::new(seqs, gqa, hd, 16, 0));
            }
        }
    }
}

#[test]
fn cached_prefixes() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(102);
    let steps = [
        vec![s(5, 60), s(16, 64), s(33, 65), s(100, 129)],
        vec![s(255, 2), s(64, 64), s(700, 37), s(511, 128)],
        vec![s(1, 300), s(129, 63), s(47, 190)],
    ];
    for (i, gqa) in GQA.iter().enumerate() {
        for hd in HEAD_DIMS {
            for (k, seqs) in steps.iter().enumerate() {
                let bs = [3, 16, 32][(i + k) % 3];
                run_case(&g, &mut rng, &Case::new(seqs.clone(), *gqa, hd, bs, 0));
            }
        }
    }
}

#[test]
fn mixed_prompts_decodes_and_padding() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(103);
    let seqs = vec![
        s(0, 23),
        s(40, 1),
        s(64, 12),
        s(700, 1),
        s(5, 1),
        s(0, 1),
        s(129, 40),
        s(17, 65),
    ];
    for (gqa, bs, pad) in [
        ((4, 1), 16, 3),
        ((8, 2), 32, 1),
        ((16, 2), 3, 5),
        ((4, 4), 16, 2),
    ] {
        for hd in HEAD_DIMS {
            run_case(&g, &mut rng, &Case::new(seqs.clone(), gqa, hd, bs, pad));
        }
    }
}

/// The grouped kernel's packed rows: groups that do not divide a block's
/// 128 (or 64) rows, so a token's heads straddle two blocks (3, 6), and
/// groups that do (1, 2, 4, 8, 16), at prompt lengths around 128 / group
/// tokens and after cached prefixes that put the diagonal mid-tile.
#[test]
fn query_groups_across_packed_row_tiles() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(109);
    for (k, gqa) in [(6, 2), (12, 2), (6, 1), (8, 8), (16, 8), (32, 8), (16, 1)]
        .into_iter()
        .enumerate()
    {
        let group = gqa.0 / gqa.1;
        let per_block = 128usize.div_ceil(group);
        for hd in HEAD_DIMS {
            let seqs = vec![
                s(0, per_block),
                s(0, per_block + 1),
                s(13, per_block.saturating_sub(1).max(2)),
                s(70, 2 * per_block + 3),
                s(0, 1),
                s(200, 64 / group + 5),
            ];
            let bs = [16, 3, 32][k % 3];
            run_case(&g, &mut rng, &Case::new(seqs, gqa, hd, bs, k % 2));
        }
    }
}

#[test]
fn block_sizes_3_16_32() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(104);
    for bs in [3, 16, 32] {
        for hd in HEAD_DIMS {
            let seqs = vec![s(0, 97), s(31, 33), s(200, 70)];
            run_case(&g, &mut rng, &Case::new(seqs, (8, 2), hd, bs, 0));
        }
    }
}

#[test]
fn long_prompt_after_long_prefix() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(105);
    run_case(
        &g,
        &mut rng,
        &Case::new(vec![s(500, 1500)], (8, 1), 128, 16, 0),
    );
    run_case(
        &g,
        &mut rng,
        &Case::new(vec![s(500, 1500)], (2, 2), 64, 32, 0),
    );
    run_case(
        &g,
        &mut rng,
        &Case::new(vec![s(300, 700), s(0, 33)], (8, 4), 256, 16, 0),
    );
    // The Llama-3.1-8B attention shape (32 heads over 8, head_dim 128).
    run_case(
        &g,
        &mut rng,
        &Case::new(
            vec![s(0, 1024), s(0, 1000), s(24, 1000)],
            (32, 8),
            128,
            16,
            0,
        ),
    );
}

#[test]
fn understated_max_query_len_still_writes_every_row() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(106);
    for hd in HEAD_DIMS {
        let c = Case::new(vec![s(3, 130), s(0, 2), s(10, 70)], (4, 2), hd, 16, 0);
        run_case_with(&g, &mut rng, &c, Some(2));
    }
}

#[test]
fn other_head_dims_fall_back_to_the_simple_kernel() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(107);
    let c = Case::new(vec![s(9, 70), s(0, 3)], (4, 2), 96, 16, 0);
    run_case(&g, &mut rng, &c);
}

/// Attention output of the step after storing `k`/`v` as its K/V.
fn attend(
    g: &CudaBackend,
    gc: &mut CudaKvCache,
    step: &ForwardContext,
    k: &[f32],
    v: &[f32],
    q: &CudaTensor,
    p: &AttentionParams,
) -> Vec<f32> {
    store_step_kv(g, gc, step, k, v);
    let gs = g.begin_step(step).unwrap();
    let o = g.attention(q, gc, &gs, p).unwrap();
    g.tensor_to_host(&o).unwrap()
}

/// Changing the K/V of query token c of a sequence must leave its rows
/// j < c (and every other sequence) bit-identical and change rows j >= c:
/// masked keys contribute exact zeros, so this holds with no tolerance and
/// pins the causal boundary (and the kernel's determinism) exactly.
#[test]
fn causal_boundary_is_exact() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(108);
    for ((hd, bs), (tiled, kernel)) in [(64, 16), (128, 3), (256, 16)]
        .into_iter()
        .flat_map(|x| KERNELS.map(|k| (x, k)))
    {
        g.force_tiled_prefill(tiled);
        let c = Case::new(vec![s(0, 130), s(37, 70), s(100, 65)], (4, 2), hd, bs, 0);
        let (nh, width) = (c.num_heads, c.num_kv_heads * hd);
        let shape = c.shape();
        let mut gc = g.alloc_kv_cache(shape).unwrap();
        let step = paged_step(&mut rng, &c.seqs, bs, shape.num_blocks, 0);
        let pre = prefix_step(&step, &c.seqs);
        let n = pre.num_tokens() * width;
        store_step_kv(
            &g,
            &mut gc,
            &pre,
            &rvec(&mut rng, n, 1.0),
            &rvec(&mut rng, n, 1.0),
        );
        let t = step.ctx.num_tokens();
        let (k, v) = (
            rvec(&mut rng, t * width, 1.0),
            rvec(&mut rng, t * width, 1.0),
        );
        let q = g
            .tensor_from_host(t, nh * hd, &rvec(&mut rng, t * nh * hd, 4.0))
            .unwrap();
        let p = c.params();
        assert_eq!(g.attention_kernel_for(&step.ctx, &p), kernel);
        let base = attend(&g, &mut gc, &step.ctx, &k, &v, &q, &p);
        let again = attend(&g, &mut gc, &step.ctx, &k, &v, &q, &p);
        let what = format!(
            "causal check ({kernel:?}) seqs {:?} hd {hd} bs {bs}",
            c.seqs
        );
        if let Some(i) = (0..base.len()).find(|&i| base[i].to_bits() != again[i].to_bits()) {
            panic!("{what}: two identical runs differ at element {i} (a race?)");
        }
        let owners = row_owners(&step.ctx);
        let w = nh * hd;
        for changed in [0usize, 1, 15, 16, 63, 64, 65, 69, 129] {
            // Change token `changed` of every sequence long enough.
            let (mut k2, mut v2) = (k.clone(), v.clone());
            for (r, &(_, j)) in owners.iter().enumerate() {
                if j == changed {
                    for x in &mut k2[r * width..(r + 1) * width] {
                        *x = -*x;
                    }
                    for x in &mut v2[r * width..(r + 1) * width] {
                        *x = half::bf16::from_f32(*x * -4.0 + 1.0).to_f32();
                    }
                }
            }
            let out = attend(&g, &mut gc, &step.ctx, &k2, &v2, &q, &p);
            for (r, &(sq, j)) in owners.iter().enumerate() {
                let (a, b) = (&base[r * w..(r + 1) * w], &out[r * w..(r + 1) * w]);
                let sees = j >= changed && step.ctx.query_len(sq) > changed;
                if sees {
                    // Every head of the row itself must move; later rows at all.
                    let heads_moved = (0..nh)
                        .filter(|h| a[h * hd..(h + 1) * hd] != b[h * hd..(h + 1) * hd])
                        .count();
                    let need = if j == changed { nh } else { 1 };
                    assert!(
                        heads_moved >= need,
                        "{what}: changing query token {changed}'s K/V moved only {heads_moved} \
                         heads of seq {sq} query {j} ({}), which sees it (its own key dropped, \
                         or the mask is one key too strict?)",
                        place(j)
                    );
                } else if let Some(d) = (0..w).find(|&d| a[d] != b[d]) {
                    panic!(
                        "{what}: changing query token {changed}'s K/V changed seq {sq} query {j} \
                         ({}) head {} dim {}: {} -> {} (a future key leaks through the mask, or \
                         another sequence's keys are read)",
                        place(j),
                        d / hd,
                        d % hd,
                        a[d],
                        b[d]
                    );
                }
            }
        }
    }
}
