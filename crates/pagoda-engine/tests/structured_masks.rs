//! Structured-output masks without a model (SmolLM2's tokenizer): guides
//! that share a lexer per family (one compiler, rows masked and advanced
//! on the mask workers, a family's rows on one worker) give, step by step,
//! the same masks and the same advance outcomes as guides compiled alone
//! (a lexer each, nothing shared), along pseudo-random walks through
//! the nested bench schema.

mod common;

use common::repo_root;
use pagoda_core::StructuredOutput;
use pagoda_engine::structured::{Advanced, GrammarCompiler, Guide, MaskWorkers};
use pagoda_model::tokenizer::Tokenizer;
use std::sync::Arc;

const VOCAB: usize = 49152;

fn allowed(mask: &[u32]) -> Vec<u32> {
    (0..VOCAB as u32)
        .filter(|&t| mask[t as usize / 32] >> (t % 32) & 1 == 1)
        .collect()
}

#[test]
fn shared_lexer_families_give_the_masks_of_guides_compiled_alone() {
    let tok = Arc::new(
        Tokenizer::from_hf_file(repo_root().join("tests/golden/smollm2-tokenizer/tokenizer.json"))
            .unwrap(),
    );
    let schema = std::fs::read_to_string(repo_root().join("tests/bench_schema.json")).unwrap();
    let c = StructuredOutput::JsonSchema(schema);
    let eos: Arc<[u32]> = Arc::from(vec![2u32]);
    // At least 16 rows: the workers' pool path of advancing.
    let rows = 20;
    let shared = GrammarCompiler::new(tok.clone(), VOCAB, &eos)
        .unwrap()
        .with_families(2);
    // One family per row: nothing shared.
    let alone = GrammarCompiler::new(tok, VOCAB, &eos)
        .unwrap()
        .with_families(rows);
    let workers = MaskWorkers::new(2).unwrap();
    let mut guides: Vec<Option<(Guide, Guide)>> = (0..rows)
        .map(|_| Some((shared.compile(&c).unwrap(), alone.compile(&c).unwrap())))
        .collect();
    let fams: Vec<usize> = guides.iter().flatten().map(|(g, _)| g.family()).collect();
    assert_eq!(fams, (0..rows).map(|i| i % 2).collect::<Vec<_>>());
    let alone_fams: Vec<usize> = guides.iter().flatten().map(|(_, a)| a.family()).collect();
    assert_eq!(alone_fams, (0..rows).collect::<Vec<_>>());
    let mut rng = 0x2545f4914f6cdd1du64;
    let mut steps_checked = 0;
    // The mask buffer goes back into the next step uncleared, as the
    // engine's does.
    let mut bits = Vec::new();
    for _ in 0..40 {
        let live: Vec<(usize, (Guide, Guide))> = guides
            .iter_mut()
            .enumerate()
            .filter_map(|(i, g)| g.take().map(|g| (i, g)))
            .collect();
        if live.is_empty() {
            break;
        }
        let (ids, pairs): (Vec<usize>, Vec<(Guide, Guide)>) = live.into_iter().unzip();
        let (fam, mut alone): (Vec<Guide>, Vec<Guide>) = pairs.into_iter().unzip();
        let words = fam[0].mask_words();
        let job = workers.spawn(
            ids.iter().copied().zip(fam).collect(),
            std::mem::take(&mut bits),
            words,
            eos.clone(),
        );
        let r = job.join().unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(r.row_cpu_secs.len(), r.guides.len());
        let mut to_advance = Vec::new();
        bits = r.bits.clone();
        for (k, ((i, g), a)) in r.guides.into_iter().zip(alone.iter_mut()).enumerate() {
            let mut want = vec![0u32; words];
            a.fill_mask(&mut want, &eos).unwrap();
            let got = &r.bits[k * words..(k + 1) * words];
            assert_eq!(got, &want[..], "row {i}: the masks differ");
            let ok = allowed(got);
            assert!(!ok.is_empty());
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let t = ok[(rng % ok.len() as u64) as usize];
            to_advance.push((i, t, g));
            steps_checked += 1;
        }
        let mut work = Vec::new();
        let mut order = Vec::new();
        for (i, t, g) in to_advance {
            order.push(i);
            work.push((g, t, Advanced::Pending));
        }
        // Enough rows for the pool path as well as the serial one; every
        // row timed but the last.
        let mut secs = vec![-1f32; work.len().saturating_sub(1)];
        workers.advance_timed(&mut work, &mut secs);
        assert!(secs.iter().all(|&s| s >= 0.0), "{secs:?}");
        for ((i, (g, t, got)), mut a) in order.into_iter().zip(work).zip(alone) {
            let want = match a.advance(t) {
                Ok(()) => Advanced::Continues(!a.is_finished()),
                Err(e) => Advanced::Broken(e),
            };
            assert_eq!(got, want, "row {i}: the advances differ");
            if got == Advanced::Continues(true) && t != 2 {
                guides[i] = Some((g, a));
            }
        }
    }
    assert!(steps_checked > 300, "{steps_checked}");
}

/// The deferred pipe (the engine waits for nothing): every outcome comes
/// with the join, for rows that go on (their next mask), rows whose
/// grammar the token completes and rows whose token the grammar rejects
/// (both: only EOS allowed next, every guide handed back), under and over
/// the 16 rows the old order advances on the calling thread.
#[test]
fn a_deferred_pipe_reports_complete_and_broken_rows_at_the_join() {
    let tok = Arc::new(
        Tokenizer::from_hf_file(repo_root().join("tests/golden/smollm2-tokenizer/tokenizer.json"))
            .unwrap(),
    );
    let eos: Arc<[u32]> = Arc::from(vec![2u32]);
    let compiler = GrammarCompiler::new(tok.clone(), VOCAB, &eos).unwrap();
    let workers = MaskWorkers::new(2).unwrap();
    let c = StructuredOutput::Choice(vec!["yes".into(), "yesterday".into()]);
    let id = |s: &str| {
        let ids = tok.encode(s, false).unwrap();
        assert_eq!(ids.len(), 1, "{s:?} is not one token");
        ids[0]
    };
    let (yes, no) = (id("yes"), id("no"));
    for n in [3usize, 20] {
        // Row i: "yes" then more ("yesterday" goes on) for i % 3 == 0;
        // "yes" alone: a choice still open; "no": rejected.
        let rows: Vec<(usize, Guide, u32)> = (0..n)
            .map(|i| {
                (
                    i,
                    compiler.compile(&c).unwrap(),
                    if i % 3 == 2 { no } else { yes },
                )
            })
            .collect();
        let words = rows[0].1.mask_words();
        let r = workers
            .pipe(rows, Vec::new(), words, eos.clone(), true)
            .join()
            .unwrap();
        assert_eq!(r.guides.len(), n);
        for (i, ((k, _), a)) in r.guides.iter().zip(&r.outcomes).enumerate() {
            assert_eq!(*k, i, "guides come back in order");
            assert!(r.masked[i]);
            let mask = allowed(&r.bits[i * words..(i + 1) * words]);
            if i % 3 == 2 {
                assert!(matches!(a, Advanced::Broken(_)), "row {i}: {a:?}");
                assert_eq!(mask, vec![2], "row {i}");
            } else {
                // "yes" may end the choice or go on to "yesterday": EOS
                // and more are allowed.
                assert_eq!(*a, Advanced::Continues(true), "row {i}");
                assert!(mask.contains(&2) && mask.len() > 1, "row {i}");
            }
        }
    }
    // A grammar the token completes: only EOS after it.
    let only = StructuredOutput::Choice(vec!["yes".into()]);
    let rows = vec![(0usize, compiler.compile(&only).unwrap(), yes)];
    let words = rows[0].1.mask_words();
    let r = workers
        .pipe(rows, Vec::new(), words, eos.clone(), true)
        .join()
        .unwrap();
    assert_eq!(r.outcomes, vec![Advanced::Continues(false)]);
    assert_eq!(allowed(&r.bits[..words]), vec![2]);
}

/// Many requests under one schema (past 64 rows) spread evenly over the
/// families, one per worker, and get, step by step, the same masks as all
/// of them in one family on one worker (the split changes no mask), for
/// two schemas along pseudo-random walks.
#[test]
fn one_schema_split_over_families_gives_the_single_worker_masks() {
    let tok = Arc::new(
        Tokenizer::from_hf_file(repo_root().join("tests/golden/smollm2-tokenizer/tokenizer.json"))
            .unwrap(),
    );
    let eos: Arc<[u32]> = Arc::from(vec![2u32]);
    let (rows, families) = (96usize, 14usize);
    let split = GrammarCompiler::new(tok.clone(), VOCAB, &eos)
        .unwrap()
        .with_families(families);
    let single = GrammarCompiler::new(tok, VOCAB, &eos)
        .unwrap()
        .with_families(1);
    let (many, one) = (MaskWorkers::new(4).unwrap(), MaskWorkers::new(1).unwrap());
    for (schema, seed) in [
        ("tests/bench_schema.json", 0x9e3779b97f4a7c15u64),
        ("scripts/gpu/long_text_schema.json", 0x2545f4914f6cdd1d),
    ] {
        let c = StructuredOutput::JsonSchema(
            std::fs::read_to_string(repo_root().join(schema)).unwrap(),
        );
        let mut guides: Vec<Option<(Guide, Guide)>> = (0..rows)
            .map(|_| Some((split.compile(&c).unwrap(), single.compile(&c).unwrap())))
            .collect();
        let mut per_family = vec![0usize; families];
        for (g, s) in guides.iter().flatten() {
            per_family[g.family()] += 1;
            assert_eq!(s.family(), 0);
        }
        let (lo, hi) = (per_family.iter().min(), per_family.iter().max());
        assert!(hi.unwrap() - lo.unwrap() <= 1, "{schema}: {per_family:?}");
        let mut rng = seed;
        let mut checked = 0;
        for _ in 0..10 {
            let live: Vec<(usize, (Guide, Guide))> = guides
                .iter_mut()
                .enumerate()
                .filter_map(|(i, g)| g.take().map(|g| (i, g)))
                .collect();
            if live.is_empty() {
                break;
            }
            let (ids, pairs): (Vec<usize>, Vec<(Guide, Guide)>) = live.into_iter().unzip();
            let (a, b): (Vec<Guide>, Vec<Guide>) = pairs.into_iter().unzip();
            let words = a[0].mask_words();
            let ja = many.spawn(
                ids.iter().copied().zip(a).collect(),
                Vec::new(),
                words,
                eos.clone(),
            );
            let jb = one.spawn(
                ids.iter().copied().zip(b).collect(),
                Vec::new(),
                words,
                eos.clone(),
            );
            let (ra, rb) = (ja.join().unwrap(), jb.join().unwrap());
            assert!(ra.errors.is_empty() && rb.errors.is_empty());
            assert_eq!(ra.bits, rb.bits, "{schema}: the masks differ");
            let mut work_a = Vec::new();
            let mut work_b = Vec::new();
            for (k, ((_, ga), (_, gb))) in ra.guides.into_iter().zip(rb.guides).enumerate() {
                let ok = allowed(&ra.bits[k * words..(k + 1) * words]);
                assert!(!ok.is_empty());
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let t = ok[(rng % ok.len() as u64) as usize];
                work_a.push((ga, t, Advanced::Pending));
                work_b.push((gb, t, Advanced::Pending));
                checked += 1;
            }
            many.advance(&mut work_a);
            one.advance(&mut work_b);
            for (k, ((ga, t, oa), (gb, _, ob))) in work_a.into_iter().zip(work_b).enumerate() {
                assert_eq!(oa, ob, "{schema}: the advances differ");
                if oa == Advanced::Continues(true) && t != 2 {
                    guides[ids[k]] = Some((ga, gb));
                }
            }
        }
        assert!(checked > 500, "{schema}: {checked}");
    }
}
