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
