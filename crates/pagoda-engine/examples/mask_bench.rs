//! Host-only replay of structured-output masks as the engine runs them (no
//! model): `REQUESTS` requests under one JSON schema join over the first
//! `--stagger` steps (as a prefill budget spreads a burst of arrivals),
//! and every step computes the masks of all live rows with the engine's
//! batch call (`MaskWorkers::spawn`, rows split by lexer family) and then
//! advances them past one token each with the engine's advance call
//! (`MaskWorkers::advance`). A request ends at its `max_tokens` (drawn in
//! `--min-out..=--max-out`), when its document is complete, or on EOS, and
//! is not replaced, so the run ramps down as the GPU workload does.
//!
//! Tokens are drawn as a model sampling under the mask would: a uniformly
//! random allowed token, except that with probability `--close-bias` the
//! draw is among the allowed tokens that hold a closing byte (`"`, `}`,
//! `]`, `,`), so strings and numbers end soon (0 keeps random-weight
//! behaviour: long strings rarely close).
//!
//! Prints, over the steps with constrained rows: the per-step wall time of
//! the masks on the pool (p50, p99, max) and of the advances; per-row
//! `compute_mask` and advance times (p50, p99, p99.9, max; wall, and CPU
//! time of the worker thread, which a busy host does not inflate), the
//! first mask of each request apart; the rows of the largest CPU times
//! with their text so far; and, from the per-row CPU times, the step
//! time that W workers would take with
//! the engine's static split by family (the slowest worker's sum) against
//! an ideal balance (the sum over W, or the slowest row if longer), so the
//! time on a host with more cores can be estimated from this one; and, with
//! the families the compiler actually assigned, the rows of the fullest
//! family per step against the mean, and the CPU of the costliest family.
//!
//! `cargo run --release -p pagoda-engine --example mask_bench -- SCHEMA
//! [--requests 256] [--threads N] [--families F] [--stagger 18] [--min-out 100]
//! [--max-out 1024] [--close-bias 0.0] [--seed 1] [--tokenizer JSON]`
//! (threads default to the engine's choice for a device backend, families
//! to `FAMILIES_PER_WORKER` per thread).

use pagoda_core::StructuredOutput;
use pagoda_engine::structured::{
    thread_cpu_secs, Advanced, GrammarCompiler, Guide, MaskWorkers, FAMILIES_PER_WORKER,
};
use pagoda_model::tokenizer::Tokenizer;
use std::sync::Arc;
use std::time::Instant;

fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn line(name: &str, unit: &str, v: &mut [f64]) {
    println!(
        "{name:<34} n {:>7}  p50 {:>8.3}  p99 {:>8.3}  p99.9 {:>8.3}  max {:>8.3} {unit}",
        v.len(),
        pct(v, 0.5),
        pct(v, 0.99),
        pct(v, 0.999),
        pct(v, 1.0)
    );
}

struct Args {
    schema: String,
    requests: usize,
    threads: usize,
    families: usize,
    stagger: usize,
    min_out: usize,
    max_out: usize,
    close_bias: f64,
    seed: u64,
    tokenizer: String,
}

fn parse() -> Result<Args, Box<dyn std::error::Error>> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        schema: String::new(),
        requests: 256,
        threads: pagoda_engine::structured::mask_threads_for(true)?,
        families: 0,
        stagger: 18,
        min_out: 100,
        max_out: 1024,
        close_bias: 0.0,
        seed: 1,
        tokenizer: "tests/golden/smollm2-tokenizer/tokenizer.json".into(),
    };
    while let Some(s) = it.next() {
        let mut val = || it.next().ok_or(format!("{s} needs a value"));
        match s.as_str() {
            "--requests" => a.requests = val()?.parse()?,
            "--threads" => a.threads = val()?.parse()?,
            "--families" => a.families = val()?.parse()?,
            "--stagger" => a.stagger = val()?.parse()?,
            "--min-out" => a.min_out = val()?.parse()?,
            "--max-out" => a.max_out = val()?.parse()?,
            "--close-bias" => a.close_bias = val()?.parse()?,
            "--seed" => a.seed = val()?.parse()?,
            "--tokenizer" => a.tokenizer = val()?,
            _ if a.schema.is_empty() && !s.starts_with("--") => a.schema = s,
            _ => return Err(format!("unknown argument {s}").into()),
        }
    }
    if a.schema.is_empty() {
        return Err(
            "usage: mask_bench SCHEMA [--requests N] [--threads N] [--stagger N] \
                    [--min-out N] [--max-out N] [--close-bias P] [--seed N] [--tokenizer JSON]"
                .into(),
        );
    }
    a.threads = a.threads.max(1);
    if a.families == 0 {
        a.families = a.threads * FAMILIES_PER_WORKER;
    }
    a.stagger = a.stagger.max(1);
    a.max_out = a.max_out.max(a.min_out).max(1);
    Ok(a)
}

/// Step time of `w` workers: (one family per worker, the rows of a family
/// in turn; 4 families per worker, each family to the worker that frees
/// first, as work stealing hands them out; an ideal
/// balance: the sum over `w`, or the slowest row if longer).
fn simulate(rows: &[(usize, f64)], w: usize) -> (f64, f64, f64) {
    let f = w * 4;
    let (mut one, mut fams) = (vec![0.0; w], vec![0.0; f]);
    let (mut sum, mut max) = (0.0, 0.0f64);
    for &(req, t) in rows {
        // Requests take families round robin.
        one[req % w] += t;
        fams[req % f] += t;
        sum += t;
        max = max.max(t);
    }
    let mut free = vec![0.0f64; w];
    for t in fams {
        let k = (0..w)
            .min_by(|&a, &b| free[a].total_cmp(&free[b]))
            .unwrap_or(0);
        free[k] += t;
    }
    let top = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    (top(&one), top(&free), (sum / w as f64).max(max))
}

struct Request {
    guide: Option<Guide>,
    max_tokens: usize,
    generated: usize,
    text: Vec<u8>,
    masked_once: bool,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = parse()?;
    let c = StructuredOutput::JsonSchema(std::fs::read_to_string(&a.schema)?);
    let tok = Arc::new(Tokenizer::from_hf_file(&a.tokenizer)?);
    let bytes_of = tok.token_bytes()?;
    let vocab = 49152;
    let eos: Arc<[u32]> = Arc::from(vec![2u32]);
    let closing: Vec<bool> = (0..vocab)
        .map(|t| {
            bytes_of
                .get(t)
                .is_some_and(|b| b.iter().any(|c| b"\"}],".contains(c)))
        })
        .collect();
    let (t, cpu) = (Instant::now(), thread_cpu_secs());
    let compiler = GrammarCompiler::new(tok, vocab, &eos)?.with_families(a.families);
    let compiler_cpu_ms = (thread_cpu_secs() - cpu) * 1e3;
    println!(
        "schema {} requests {} threads {} families {} stagger {} out {}..={} close-bias {}",
        a.schema, a.requests, a.threads, a.families, a.stagger, a.min_out, a.max_out, a.close_bias
    );
    println!(
        "compiler: {:.1} ms ({compiler_cpu_ms:.1} ms CPU)",
        t.elapsed().as_secs_f64() * 1e3
    );
    let workers = MaskWorkers::new(a.threads)?;
    let mut rng = a.seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut reqs: Vec<Request> = (0..a.requests)
        .map(|_| Request {
            guide: None,
            max_tokens: a.min_out + (next() as usize) % (a.max_out - a.min_out + 1),
            generated: 0,
            text: Vec::new(),
            masked_once: false,
        })
        .collect();
    let mut compile_ms = Vec::new();
    let (mut step_ms, mut adv_step_ms, mut row_us, mut first_us, mut adv_us) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut row_cpu_us, mut first_cpu_us, mut sum_cpu_ms, mut adv_sum_ms) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut sim: Vec<(usize, [Vec<f64>; 3])> = [1usize, 2, 4, 8, 14, 16]
        .iter()
        .map(|&w| (w, Default::default()))
        .collect();
    let mut slow: Vec<(f64, usize, String)> = Vec::new();
    let (mut fam_rows, mut fam_ms) = (vec![0usize; a.families], vec![0f64; a.families]);
    let (mut fam_max_rows, mut fam_mean_rows, mut fam_max_ms) =
        (Vec::new(), Vec::new(), Vec::new());
    let (mut bits, mut done, mut tokens, mut step) = (Vec::new(), 0usize, 0usize, 0usize);
    let mut allowed = Vec::with_capacity(vocab);
    let mut closers = Vec::with_capacity(vocab);
    loop {
        for (i, r) in reqs.iter_mut().enumerate() {
            if step == i % a.stagger && r.generated == 0 && r.guide.is_none() {
                let t = Instant::now();
                r.guide = Some(compiler.compile(&c)?);
                compile_ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        let live: Vec<(usize, Guide)> = reqs
            .iter_mut()
            .enumerate()
            .filter_map(|(i, r)| r.guide.take().map(|g| (i, g)))
            .collect();
        if live.is_empty() {
            if step >= a.stagger {
                break;
            }
            step += 1;
            continue;
        }
        let words = live[0].1.mask_words();
        let job = workers.spawn(live, std::mem::take(&mut bits), words, eos.clone());
        let r = job.join().ok_or("a mask worker died")?;
        step_ms.push(r.elapsed.as_secs_f64() * 1e3);
        let rows: Vec<(usize, f64)> = r
            .guides
            .iter()
            .zip(&r.row_cpu_secs)
            .map(|((i, _), &s)| (*i, s as f64 * 1e3))
            .collect();
        sum_cpu_ms.push(rows.iter().map(|r| r.1).sum::<f64>());
        // The families as the compiler assigned them: rows and CPU of the
        // fullest / costliest one (one family per worker: that worker's).
        fam_rows.iter_mut().for_each(|n| *n = 0);
        fam_ms.iter_mut().for_each(|t| *t = 0.0);
        for ((_, g), &s) in r.guides.iter().zip(&r.row_cpu_secs) {
            if let (Some(n), Some(t)) = (fam_rows.get_mut(g.family()), fam_ms.get_mut(g.family())) {
                *n += 1;
                *t += s as f64 * 1e3;
            }
        }
        let most = fam_rows.iter().copied().max().unwrap_or(0);
        fam_max_rows.push(most as f64);
        fam_mean_rows.push(r.guides.len() as f64 / a.families as f64);
        fam_max_ms.push(fam_ms.iter().copied().fold(0.0, f64::max));
        for (w, v) in sim.iter_mut() {
            let (o, f, i) = simulate(&rows, *w);
            v[0].push(o);
            v[1].push(f);
            v[2].push(i);
        }
        // Draw each row's token under its mask.
        let mut work = Vec::with_capacity(r.guides.len());
        let mut order = Vec::with_capacity(r.guides.len());
        for (k, (i, g)) in r.guides.into_iter().enumerate() {
            let wall_us = r.row_secs[k] as f64 * 1e6;
            let us = r.row_cpu_secs[k] as f64 * 1e6;
            let req = &mut reqs[i];
            if req.masked_once {
                row_us.push(wall_us);
                row_cpu_us.push(us);
            } else {
                first_us.push(wall_us);
                first_cpu_us.push(us);
                req.masked_once = true;
            }
            if slow.len() < 12 || us > slow[0].0 {
                slow.push((us, i, String::from_utf8_lossy(&req.text).into_owned()));
                slow.sort_by(|x, y| x.0.total_cmp(&y.0));
                if slow.len() > 12 {
                    slow.remove(0);
                }
            }
            let mask = &r.bits[k * words..(k + 1) * words];
            allowed.clear();
            closers.clear();
            for t in 0..vocab as u32 {
                if mask[t as usize / 32] >> (t % 32) & 1 == 1 {
                    allowed.push(t);
                    if closing[t as usize] {
                        closers.push(t);
                    }
                }
            }
            let pool = if !closers.is_empty() && (next() % 1_000_000) as f64 / 1e6 < a.close_bias {
                &closers
            } else {
                &allowed
            };
            let t = pool[(next() % pool.len().max(1) as u64) as usize % pool.len().max(1)];
            tokens += 1;
            req.generated += 1;
            if let Some(b) = bytes_of.get(t as usize) {
                req.text.extend_from_slice(b);
            }
            // EOS or max_tokens: the scheduler finishes it, no advance.
            if eos.contains(&t) || req.generated >= req.max_tokens {
                done += 1;
                continue;
            }
            order.push(i);
            work.push((g, t, Advanced::Pending));
        }
        let mut secs = vec![0f32; work.len()];
        let t = Instant::now();
        workers.advance_timed(&mut work, &mut secs);
        adv_step_ms.push(t.elapsed().as_secs_f64() * 1e3);
        adv_us.extend(secs.iter().map(|&s| s as f64 * 1e6));
        adv_sum_ms.push(secs.iter().map(|&s| s as f64).sum::<f64>() * 1e3);
        for (i, (g, _, out)) in order.into_iter().zip(work) {
            if out == Advanced::Continues(true) {
                reqs[i].guide = Some(g);
            } else {
                done += 1;
            }
        }
        bits = r.bits;
        step += 1;
    }
    println!("steps {step} tokens {tokens} requests finished {done}");
    line("compile per request", "ms", &mut compile_ms);
    line("mask per step (pool wall)", "ms", &mut step_ms);
    line("advance per step (pool wall)", "ms", &mut adv_step_ms);
    line("mask per row, wall (not first)", "us", &mut row_us);
    line("mask per row, wall (first)", "us", &mut first_us);
    line("mask per row, CPU (not first)", "us", &mut row_cpu_us);
    line("mask per row, CPU (first)", "us", &mut first_cpu_us);
    line("mask per step, CPU of all rows", "ms", &mut sum_cpu_ms);
    line("advance per row, CPU", "us", &mut adv_us);
    line("advance per step, CPU of all rows", "ms", &mut adv_sum_ms);
    line("rows per step, fullest family", "rows", &mut fam_max_rows);
    line("rows per step, mean per family", "rows", &mut fam_mean_rows);
    line("mask per step, costliest family CPU", "ms", &mut fam_max_ms);
    println!("from the per-row CPU times, mask ms per step with W workers:");
    for (w, [one, fams, ideal]) in sim.iter_mut() {
        line(&format!("  W={w:<2} a family per worker"), "ms", one);
        line(&format!("  W={w:<2} 4 families per worker"), "ms", fams);
        line(&format!("  W={w:<2} ideal balance"), "ms", ideal);
    }
    println!("largest mask CPU times (us, request, text so far):");
    for (us, i, text) in slow.iter().rev() {
        let text: String = text
            .chars()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        println!("  {us:>9.1}  #{i:<4} {text:?}");
    }
    Ok(())
}
