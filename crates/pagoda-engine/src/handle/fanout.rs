//! The hand-over from the engine thread to the request streams: one batch
//! per step, fanned out on a thread of its own.
//!
//! The engine thread puts each item for a stream into an [`Outbox`] (a
//! vector, no channel send, no wake) and [`Outbox::flush`]es it once per
//! loop turn: one message and at most one wake-up of the `pagoda-fanout`
//! thread, whatever the batch size. That thread sends each item to its
//! stream's channel (waking the reader's task), so the per-request sends and
//! wake-ups run beside the next step instead of inside the engine thread.
//!
//! Guarantees: items reach each stream in the order the engine thread put
//! them (one FIFO channel, batches delivered in order, items in order inside
//! a batch), errors included; dropping the [`Outbox`] flushes it, and the
//! fan-out thread ends once it has delivered everything and the outbox is
//! gone, so joining it means every item was handed over.

use super::StreamItem;
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;
use tokio::sync::mpsc;

/// One item for one stream (the sender is a clone of the stream's).
type Delivery = (mpsc::UnboundedSender<StreamItem>, StreamItem);

/// The engine thread's side: collects a batch, hands it over whole.
pub(super) struct Outbox {
    batch: Vec<Delivery>,
    to_fanout: std_mpsc::Sender<Vec<Delivery>>,
    /// Batches handed over so far.
    handovers: u64,
}

impl Outbox {
    /// Queues `item` for the stream behind `to`.
    pub(super) fn push(&mut self, to: &mpsc::UnboundedSender<StreamItem>, item: StreamItem) {
        self.batch.push((to.clone(), item));
    }

    /// Hands the queued items over as one batch (nothing when empty).
    pub(super) fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let capacity = self.batch.capacity();
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(capacity));
        self.handovers += 1;
        // The fan-out thread lives as long as the outbox; if it died, the
        // streams see their channels close.
        let _ = self.to_fanout.send(batch);
    }

    /// Batches handed over so far.
    pub(super) fn handovers(&self) -> u64 {
        self.handovers
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Starts the `pagoda-fanout` thread; returns the outbox that feeds it and
/// the thread, which ends after the outbox is dropped and drained.
pub(super) fn spawn() -> std::io::Result<(Outbox, JoinHandle<()>)> {
    let (to_fanout, batches) = std_mpsc::channel::<Vec<Delivery>>();
    let thread = std::thread::Builder::new()
        .name("pagoda-fanout".into())
        .spawn(move || {
            while let Ok(batch) = batches.recv() {
                for (to, item) in batch {
                    // A stream dropped meanwhile: the engine thread sees its
                    // channel closed and aborts the request.
                    let _ = to.send(item);
                }
            }
        })?;
    let outbox = Outbox {
        batch: Vec::new(),
        to_fanout,
        handovers: 0,
    };
    Ok((outbox, thread))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::RequestOutput;
    use pagoda_core::RequestId;

    fn output(id: u64, token: u32) -> StreamItem {
        Ok(RequestOutput {
            request_id: RequestId(id),
            token_id: token,
            logprobs: None,
            text_delta: String::new(),
            finish_reason: None,
            no_token: false,
            stop_token: false,
            num_prompt_tokens: 1,
            num_output_tokens: token as usize,
            num_cached_tokens: 0,
            prompt_logprobs: None,
        })
    }

    #[test]
    fn batches_reach_every_stream_in_order() {
        let (mut outbox, thread) = spawn().unwrap();
        let streams: Vec<_> = (0..8).map(|_| mpsc::unbounded_channel()).collect();
        for step in 1..=5u32 {
            for (tx, _) in &streams {
                outbox.push(tx, output(0, step));
            }
            outbox.flush();
        }
        outbox.flush();
        assert_eq!(outbox.handovers(), 5, "one hand-over per flush with items");
        drop(outbox);
        thread.join().unwrap();
        for (tx, mut rx) in streams {
            drop(tx);
            let tokens: Vec<u32> = std::iter::from_fn(|| rx.blocking_recv())
                .map(|item| item.unwrap().token_id)
                .collect();
            assert_eq!(tokens, [1, 2, 3, 4, 5]);
        }
    }

    #[test]
    fn dropping_the_outbox_delivers_what_it_held() {
        let (mut outbox, thread) = spawn().unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        outbox.push(&tx, output(1, 7));
        outbox.push(&tx, Err(crate::EngineError::Shutdown));
        drop(tx);
        drop(outbox);
        thread.join().unwrap();
        assert_eq!(rx.blocking_recv().unwrap().unwrap().token_id, 7);
        assert!(matches!(
            rx.blocking_recv(),
            Some(Err(crate::EngineError::Shutdown))
        ));
        assert!(
            rx.blocking_recv().is_none(),
            "the last sender was the batch's"
        );
    }
}

/// The engine thread's time per step for 256 streams whose readers wait on
/// other threads: text decoded and one channel send per request (the old
/// hand-over) against one batch into the outbox. Run with
/// `cargo test --release -p pagoda-engine --lib handover_cost -- --ignored --nocapture`.
#[cfg(test)]
mod measure {
    use super::*;
    use crate::engine::RequestOutput;
    use crate::output_text::OutputText;
    use pagoda_core::{RequestId, SamplingParams};
    use pagoda_model::tokenizer::Tokenizer;
    use std::sync::Arc;
    use std::time::Instant;

    const STREAMS: usize = 256;
    const STEPS: usize = 200;

    fn out(i: usize, step: usize) -> RequestOutput {
        RequestOutput {
            request_id: RequestId(i as u64),
            token_id: (300 + (i * 7 + step * 13) % 20000) as u32,
            logprobs: None,
            text_delta: String::new(),
            finish_reason: None,
            no_token: false,
            stop_token: false,
            num_prompt_tokens: 4,
            num_output_tokens: step + 1,
            num_cached_tokens: 0,
            prompt_logprobs: None,
        }
    }

    /// Readers on their own threads; returns the senders and the joins.
    fn readers() -> (
        Vec<mpsc::UnboundedSender<StreamItem>>,
        Vec<std::thread::JoinHandle<usize>>,
    ) {
        (0..STREAMS)
            .map(|_| {
                let (tx, mut rx) = mpsc::unbounded_channel::<StreamItem>();
                let t = std::thread::spawn(move || {
                    let mut n = 0;
                    while rx.blocking_recv().is_some() {
                        n += 1;
                    }
                    n
                });
                (tx, t)
            })
            .unzip()
    }

    #[test]
    #[ignore = "a measurement, not a check"]
    fn handover_cost() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let tok = Arc::new(
            Tokenizer::from_hf_file(root.join("tests/golden/smollm2-tokenizer/tokenizer.json"))
                .unwrap(),
        );
        let params = SamplingParams {
            stop: vec!["\n\nUser:".into()],
            ..SamplingParams::greedy(STEPS)
        };
        // Old: text and one send per request on the engine thread.
        let (txs, joins) = readers();
        let mut texts: Vec<OutputText> = (0..STREAMS)
            .map(|_| OutputText::new(tok.clone(), &params, &[1, 2, 3, 4]).unwrap())
            .collect();
        let t = Instant::now();
        for step in 0..STEPS {
            for (i, (tx, text)) in txs.iter().zip(&mut texts).enumerate() {
                let mut o = out(i, step);
                text.apply(&mut o).unwrap();
                let _ = tx.send(Ok(o));
            }
        }
        let old = t.elapsed().as_secs_f64() / STEPS as f64;
        drop(txs);
        let n: usize = joins.into_iter().map(|j| j.join().unwrap()).sum();
        assert_eq!(n, STREAMS * STEPS);
        // New: one batch per step.
        let (txs, joins) = readers();
        let (mut outbox, fan) = spawn().unwrap();
        let t = Instant::now();
        for step in 0..STEPS {
            for (i, tx) in txs.iter().enumerate() {
                outbox.push(tx, Ok(out(i, step)));
            }
            outbox.flush();
        }
        let new = t.elapsed().as_secs_f64() / STEPS as f64;
        drop(outbox);
        fan.join().unwrap();
        drop(txs);
        let n: usize = joins.into_iter().map(|j| j.join().unwrap()).sum();
        assert_eq!(n, STREAMS * STEPS);
        println!(
            "engine-thread time per step, {STREAMS} streams: text + a send each {:.1} us, \
             one batch {:.1} us",
            old * 1e6,
            new * 1e6
        );
    }
}
