//! The CUDA backend's fused `qk_norm_rope` (one launch) against the four
//! ops it replaces on the same backend (`head_rms_norm` on q and k, `rope`
//! on q and k): the same bits, and against the CPU backend's
//! `qk_norm_rope` within bf16 accuracy. Decode steps of 1..=16 rows and a
//! mixed prefill step; Qwen3-30B-A3B's heads (32 q, 4 kv, head_dim 128),
//! head_dim 64 with partial rotary (rd 32), head_dim 256; both rope
//! styles; with and without the norms; f32 and bf16 cos/sin tables; and a
//! position past the table refused. Outputs of fresh tensors are
//! NaN-poisoned, so an element left unwritten fails.
//!
//! Without a CUDA device every test prints a notice and passes (fails where
//! PAGODA_REQUIRE_GPU=1 says a GPU must be present).
#![cfg(feature = "cuda")]

mod common;

#[allow(dead_code)]
const PORTABLE: bool = false;

use common::*;
use pagoda_kernels::cpu::WeightDtype;
use pagoda_kernels::cuda::testing::{gpu_poisoned as gpu, rel_err_l2};
use pagoda_kernels::{Backend, HostData, HostTensor, RopeStyle};

/// A cos/sin table of `max_pos` rows for rotary width `rd` (theta 10000).
fn table(max_pos: usize, rd: usize) -> Vec<f32> {
    let mut t = Vec::with_capacity(max_pos * rd);
    for p in 0..max_pos {
        let ang: Vec<f32> = (0..rd / 2)
            .map(|i| p as f32 / 10000f32.powf(2.0 * i as f32 / rd as f32))
            .collect();
        t.extend(ang.iter().map(|a| a.cos()));
        t.extend(ang.iter().map(|a| a.sin()));
    }
    t
}

#[test]
fn fused_qk_norm_rope_equals_the_four_ops() {
    let Some(g) = gpu() else { return };
    let c = backend(2, WeightDtype::F32);
    let mut rng = Rng::new(41);
    let mut steps: Vec<Vec<SeqSpec>> = (1..=16)
        .map(|n| (0..n).map(|i| s(3 + 7 * i, 1)).collect())
        .collect();
    steps.push(vec![s(0, 13), s(37, 1), s(16, 5)]);
    // (q heads, k heads, head_dim, rotary dims)
    let shapes = [(32, 4, 128, 128), (3, 1, 64, 32), (2, 2, 256, 256)];
    let max_pos = 160;
    for seqs in &steps {
        let ps = paged_step(&mut rng, seqs, 16, 64, 0);
        let (gs, cs) = (
            g.begin_step(&ps.ctx).unwrap(),
            c.begin_step(&ps.ctx).unwrap(),
        );
        let t = ps.ctx.num_tokens();
        for &(qh, kh, hd, rd) in &shapes {
            let host = HostTensor::f32(vec![max_pos, rd], table(max_pos, rd));
            // load_table keeps f32; a bf16 table through load_weight.
            let tables = [
                (g.load_table(host.clone()).unwrap(), "f32"),
                (g.load_weight(host.clone()).unwrap(), "bf16"),
            ];
            let ct = c.load_table(host.clone()).unwrap();
            let qn = rvec(&mut rng, hd, 2.0);
            let kn = rvec(&mut rng, hd, 2.0);
            let w = |v: &[f32]| HostTensor {
                shape: vec![hd],
                data: HostData::F32(v.to_vec()),
            };
            let (gqn, gkn) = (
                g.load_weight(w(&qn)).unwrap(),
                g.load_weight(w(&kn)).unwrap(),
            );
            let (cqn, ckn) = (
                c.load_weight(w(&qn)).unwrap(),
                c.load_weight(w(&kn)).unwrap(),
            );
            for (gt, tname) in &tables {
                for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
                    for with_norm in [true, false] {
                        let what = format!(
                            "rows {t} q/k heads {qh}/{kh} hd {hd} rd {rd} {style:?} \
                             norm {with_norm} table {tname}"
                        );
                        let q = rvec(&mut rng, t * qh * hd, 3.0);
                        let k = rvec(&mut rng, t * kh * hd, 3.0);
                        // Fused.
                        let mut fq = g.tensor_from_host(t, qh * hd, &q).unwrap();
                        let mut fk = g.tensor_from_host(t, kh * hd, &k).unwrap();
                        let gnorms = with_norm.then_some((&gqn, &gkn));
                        g.qk_norm_rope(&mut fq, &mut fk, gnorms, 1e-6, &gs, gt, hd, style)
                            .unwrap();
                        // The four ops.
                        let mut uq = g.tensor_from_host(t, qh * hd, &q).unwrap();
                        let mut uk = g.tensor_from_host(t, kh * hd, &k).unwrap();
                        if with_norm {
                            g.head_rms_norm(&mut uq, &gqn, hd, 1e-6).unwrap();
                            g.head_rms_norm(&mut uk, &gkn, hd, 1e-6).unwrap();
                        }
                        g.rope(&mut uq, &gs, gt, hd, style).unwrap();
                        g.rope(&mut uk, &gs, gt, hd, style).unwrap();
                        let (fq, fk) = (
                            g.tensor_to_host(&fq).unwrap(),
                            g.tensor_to_host(&fk).unwrap(),
                        );
                        let same = |a: &[f32], b: &[f32]| {
                            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
                        };
                        assert!(
                            same(&fq, &g.tensor_to_host(&uq).unwrap()),
                            "{what}: q differs"
                        );
                        assert!(
                            same(&fk, &g.tensor_to_host(&uk).unwrap()),
                            "{what}: k differs"
                        );
                        // The CPU's op.
                        let mut cq = c.tensor_from_host(t, qh * hd, &q).unwrap();
                        let mut ck = c.tensor_from_host(t, kh * hd, &k).unwrap();
                        let cnorms = with_norm.then_some((&cqn, &ckn));
                        c.qk_norm_rope(&mut cq, &mut ck, cnorms, 1e-6, &cs, &ct, hd, style)
                            .unwrap();
                        for (name, got, want) in [("q", &fq, cq.data()), ("k", &fk, ck.data())] {
                            assert!(
                                got.iter().all(|v| v.is_finite()),
                                "{what}: {name} not finite"
                            );
                            let e = rel_err_l2(got, want);
                            assert!(e < 1e-2, "{what}: {name} vs CPU {e:.3e}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn fused_qk_norm_rope_refuses_positions_past_the_table() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(42);
    let ps = paged_step(&mut rng, &[s(40, 1)], 16, 8, 0);
    let gs = g.begin_step(&ps.ctx).unwrap();
    let host = HostTensor::f32(vec![8, 64], table(8, 64));
    let gt = g.load_table(host).unwrap();
    let mut q = g.tensor_from_host(1, 64, &[0.5; 64]).unwrap();
    let mut k = g.tensor_from_host(1, 64, &[0.5; 64]).unwrap();
    assert!(g
        .qk_norm_rope(&mut q, &mut k, None, 1e-6, &gs, &gt, 64, RopeStyle::Neox)
        .is_err());
    // q with a row count other than the step's.
    let mut q2 = g.tensor_from_host(2, 64, &[0.5; 128]).unwrap();
    let mut rng = Rng::new(43);
    let ps = paged_step(&mut rng, &[s(3, 1)], 16, 8, 0);
    let gs = g.begin_step(&ps.ctx).unwrap();
    assert!(g
        .qk_norm_rope(&mut q2, &mut k, None, 1e-6, &gs, &gt, 64, RopeStyle::Neox)
        .is_err());
}
