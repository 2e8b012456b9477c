//! The batched teacher-forced trace the backend comparisons run: every
//! prompt prefilled in one step, then one forced token per sequence per
//! decode step, keeping every step's logits.

use super::BLOCK_SIZE;
use pagoda_core::{BlockId, RequestId, ScheduledSequence};
use pagoda_engine::context::build_forward_context;
use pagoda_engine::ModelRunner;
use pagoda_kernels::Backend;

/// All `prompts` prefilled in one step, then `forced[i]` fed one token per
/// decode step, every sequence in every step (all `forced[i]` have the same
/// length). Returns `logits[seq][step]`; step 0 follows the prompt.
pub fn forced_trace<B: Backend>(
    runner: &mut ModelRunner<B>,
    prompts: &[Vec<u32>],
    forced: &[Vec<u32>],
) -> Vec<Vec<Vec<f32>>> {
    let steps = forced.first().map_or(0, |f| f.len());
    assert!(forced.iter().all(|f| f.len() == steps));
    let vocab = runner.config().vocab_size;
    let mut next = 0u32;
    let tables: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let n = (p.len() + steps + 1).div_ceil(BLOCK_SIZE) as u32;
            let t = (next..next + n).collect();
            next += n;
            t
        })
        .collect();
    let mut out: Vec<Vec<Vec<f32>>> = vec![Vec::new(); prompts.len()];
    for step in 0..=steps {
        let inputs: Vec<Vec<u32>> = (0..prompts.len())
            .map(|i| match step {
                0 => prompts[i].clone(),
                s => vec![forced[i][s - 1]],
            })
            .collect();
        let seqs: Vec<ScheduledSequence> = inputs
            .into_iter()
            .enumerate()
            .map(|(i, input)| {
                let context = if step == 0 {
                    0
                } else {
                    prompts[i].len() + step - 1
                };
                let table = tables[i].iter().map(|&b| BlockId(b)).collect();
                ScheduledSequence::new(RequestId(i as u64), input, context, table, true)
            })
            .collect();
        let mut ctx = build_forward_context(&seqs, BLOCK_SIZE);
        // Other KV cache groups (Gemma's local layers) on pages of their own.
        let groups = runner.kv_layout().num_groups();
        if groups > 1 {
            let stride = runner.kv_shape().num_blocks / groups;
            assert!(
                next as usize <= stride,
                "{next} pages per group, room for {stride}"
            );
            pagoda_engine::context::shifted_kv_groups(&mut ctx, groups - 1, stride);
        }
        let logits = runner.execute(&ctx).unwrap().into_logits().unwrap();
        assert_eq!(logits.len(), prompts.len() * vocab);
        for (i, row) in logits.chunks_exact(vocab).enumerate() {
            out[i].push(row.to_vec());
        }
    }
    out
}
