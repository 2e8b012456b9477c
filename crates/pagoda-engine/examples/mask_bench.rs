//! Micro-benchmark of structured-output masks alone (no model): `rows`
//! requests under one JSON schema, staggered so that they stand at varied
//! positions of their documents, each step computing every row's mask on
//! the engine's mask workers and then advancing every row by a random
//! allowed token (a finished document starts over with a fresh guide).
//! Prints the per-row mask time (median, p99, max), the per-step wall time
//! of the masks on the pool (median, p99) and of the advances, and the
//! compile time of one request.
//!
//! `cargo run --release -p pagoda-engine --example mask_bench -- SCHEMA
//! [ROWS] [STEPS] [THREADS] [TOKENIZER_JSON]` (defaults: 256 rows, 200
//! steps, the engine's thread count, SmolLM2's tokenizer).

use pagoda_core::StructuredOutput;
use pagoda_engine::structured::{GrammarCompiler, Guide, MaskWorkers};
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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let schema_path = args
        .get(1)
        .ok_or("usage: mask_bench SCHEMA [ROWS] [STEPS] [THREADS] [TOKENIZER]")?;
    let rows: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(256);
    let steps: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(200);
    let threads: usize = match args.get(4) {
        Some(s) => s.parse()?,
        None => pagoda_engine::structured::mask_threads(),
    };
    let tok_path = args
        .get(5)
        .cloned()
        .unwrap_or_else(|| "tests/golden/smollm2-tokenizer/tokenizer.json".into());
    let schema = std::fs::read_to_string(schema_path)?;
    let c = StructuredOutput::JsonSchema(schema);
    let tok = Arc::new(Tokenizer::from_hf_file(&tok_path)?);
    let words_of = tok.token_bytes()?;
    // Each row's output so far, to show where slow masks happen.
    let mut text: Vec<Vec<u8>> = vec![Vec::new(); rows];
    let mut slow = 0usize;
    let vocab = 49152;
    let eos: Arc<[u32]> = Arc::from(vec![2u32]);
    let t = Instant::now();
    let compiler = GrammarCompiler::new(tok, vocab, &eos)?;
    println!("compiler: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let mut compile_ms = Vec::new();
    let new_guide = |compile_ms: &mut Vec<f64>| -> Result<Guide, Box<dyn std::error::Error>> {
        let t = Instant::now();
        let g = compiler.compile(&c)?;
        compile_ms.push(t.elapsed().as_secs_f64() * 1e3);
        Ok(g)
    };
    let workers = MaskWorkers::new(threads)?;
    let mut guides: Vec<Option<Guide>> = (0..rows).map(|_| None).collect();
    let mut rng = 0x9e3779b97f4a7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut step_ms, mut advance_ms, mut row_us) = (Vec::new(), Vec::new(), Vec::new());
    // Per step, the rows' mask times added up (the work, whatever the pool).
    let mut sum_ms = Vec::new();
    let mut bits = Vec::new();
    let mut docs = 0usize;
    for step in 0..steps {
        // Row i joins at step i % 32: positions stay varied.
        for (i, g) in guides.iter_mut().enumerate() {
            if g.is_none() && step >= i % 32 {
                *g = Some(new_guide(&mut compile_ms)?);
            }
        }
        let live: Vec<(usize, Guide)> = guides
            .iter_mut()
            .enumerate()
            .filter_map(|(i, g)| g.take().map(|g| (i, g)))
            .collect();
        if live.is_empty() {
            continue;
        }
        let words = live[0].1.mask_words();
        let job = workers.spawn(live, std::mem::take(&mut bits), words, eos.clone());
        let r = job.join().ok_or("a mask worker died")?;
        step_ms.push(r.elapsed.as_secs_f64() * 1e3);
        row_us.extend(r.row_secs.iter().map(|&s| s as f64 * 1e6));
        sum_ms.push(r.row_secs.iter().map(|&s| s as f64).sum::<f64>() * 1e3);
        let mut adv = 0.0;
        for (k, (i, mut g)) in r.guides.into_iter().enumerate() {
            if r.row_secs[k] > 2e-3 && slow < 40 {
                slow += 1;
                println!(
                    "slow mask {:.1} ms after {:?}",
                    r.row_secs[k] * 1e3,
                    String::from_utf8_lossy(&text[i])
                );
            }
            let mask = &r.bits[k * words..(k + 1) * words];
            let allowed: Vec<u32> = (0..vocab as u32)
                .filter(|&t| mask[t as usize / 32] >> (t % 32) & 1 == 1)
                .collect();
            let tok = allowed[(next() % allowed.len() as u64) as usize];
            let t = Instant::now();
            let broke = eos.contains(&tok) || g.advance(tok).is_err();
            adv += t.elapsed().as_secs_f64() * 1e3;
            if let Some(w) = words_of.get(tok as usize) {
                text[i].extend_from_slice(w);
            }
            if broke || g.is_finished() {
                text[i].clear();
                docs += 1;
                continue;
            }
            guides[i] = Some(g);
        }
        advance_ms.push(adv);
        bits = r.bits;
    }
    println!(
        "rows {rows} steps {steps} threads {threads} documents finished {docs}\n\
         compile ms/request: median {:.2} p99 {:.2}\n\
         mask us/row: median {:.1} p99 {:.1} max {:.1}\n\
         mask ms/step (pool wall): median {:.2} p99 {:.2} max {:.2}\n\
         mask ms/step (rows added up): median {:.2} p99 {:.2}\n\
         advance ms/step (serial): median {:.2} p99 {:.2}",
        pct(&mut compile_ms, 0.5),
        pct(&mut compile_ms, 0.99),
        pct(&mut row_us, 0.5),
        pct(&mut row_us, 0.99),
        pct(&mut row_us, 1.0),
        pct(&mut step_ms, 0.5),
        pct(&mut step_ms, 0.99),
        pct(&mut step_ms, 1.0),
        pct(&mut sum_ms, 0.5),
        pct(&mut sum_ms, 0.99),
        pct(&mut advance_ms, 0.5),
        pct(&mut advance_ms, 0.99),
    );
    Ok(())
}
