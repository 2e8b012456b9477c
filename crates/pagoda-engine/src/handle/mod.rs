//! The engine on its own thread, and the handle that drives it.
//!
//! [`EngineHandle::spawn`] moves an [`LlmEngine`] onto a std thread named
//! `pagoda-engine` (see [`worker`] for its loop) and returns a handle that is
//! `Clone + Send + Sync` and has no backend type parameter, so an HTTP server
//! can keep it in its state and many tasks can submit at once.
//!
//! Commands go to the thread over one tokio unbounded mpsc channel; replies
//! come back over oneshot channels, and each request's outputs over its own
//! unbounded mpsc channel wrapped in a [`RequestStream`]. The engine thread
//! hands a step's outputs over in one batch to a `pagoda-fanout` thread,
//! which sends them on to the streams (see [`fanout`]). tokio's channels work
//! from async and blocking code alike and need no runtime on the engine side,
//! so the engine thread stays a plain loop and offline callers can use the
//! `blocking_*` methods without any runtime.
//!
//! The engine thread computes tokens only: each [`RequestStream`] decodes its
//! request's text and looks for its stop strings as its reader takes the
//! outputs ([`OutputText`], in the reader's task), so the outputs are the
//! ones [`LlmEngine::step`] gives offline. A stream that finds a stop string
//! ends there and tells the thread, which ends the request (tokens computed
//! meanwhile are dropped with the stream's channel).
//!
//! Invariants:
//! - a request is live on the engine thread exactly while its stream can still
//!   receive: dropping a [`RequestStream`] before its last output sends an
//!   abort, and the thread also aborts a request whose output channel it finds
//!   closed, so a client that goes away frees its KV blocks within a step;
//! - every stream ends: with an output carrying a `finish_reason`, with an
//!   `Err` item (a failed step, or [`ShutdownMode::Abort`]), or, after an
//!   explicit [`EngineHandle::abort`], by closing (`None`);
//! - the engine never blocks on a client: output channels are unbounded, and a
//!   request's outputs are bounded by its `max_tokens`;
//! - a client that stops reading stops costing compute: each stream shares an
//!   unread-output count with the thread (see [`backlog`]); once
//!   [`HandleOptions::pause_backlog`] outputs wait unread the thread pauses
//!   the request (no tokens computed, its KV blocks given back, its prefix
//!   kept in the prefix cache), and reading it down under half of that
//!   resumes it (the stream tells the thread). Its outputs are the same as
//!   if it had never paused. A [`ShutdownMode::Drain`] resumes every paused
//!   request and pauses no more, so that it ends.
//!
//! Costs: a submit or stats call is one channel round trip to the engine
//! thread, served between steps (so it waits for at most one step).

mod backlog;
mod fanout;
mod stats_log;
mod worker;

use backlog::Backlog;

use crate::engine::{EngineRequest, LlmEngine, RequestOutput};
use crate::output_text::OutputText;
use crate::{EngineError, Result};
use pagoda_core::{FinishReason, RequestId, SchedulerStats};
use pagoda_kernels::Backend;
use pagoda_model::tokenizer::Tokenizer;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use tokio::sync::{mpsc, oneshot};

/// One item of a [`RequestStream`]: an output, or the error that ended the
/// request (a failed step, or an engine shut down with [`ShutdownMode::Abort`]).
pub type StreamItem = Result<RequestOutput, EngineError>;

/// Settings of the engine thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleOptions {
    /// Refuse new requests with [`EngineError::Overloaded`] while this many
    /// (or more) requests wait to be scheduled. `None`: no limit.
    pub max_waiting: Option<usize>,
    /// While busy, log a status line (target `pagoda_engine::stats`: running,
    /// waiting, paused, tokens/s, KV usage, prefix hit rate) this often.
    /// `None`: never.
    pub log_interval: Option<std::time::Duration>,
    /// Pause a request while this many (or more; at least 1) of its outputs
    /// wait unread in its stream, and resume it once fewer than half do.
    /// `None`: never pause (outputs wait in memory, at most `max_tokens`).
    pub pause_backlog: Option<usize>,
}

/// Unread outputs that pause a request by default.
pub const DEFAULT_PAUSE_BACKLOG: usize = 32;

impl Default for HandleOptions {
    fn default() -> Self {
        HandleOptions {
            max_waiting: None,
            log_interval: None,
            pause_backlog: Some(DEFAULT_PAUSE_BACKLOG),
        }
    }
}

/// What [`EngineHandle::shutdown`] does with requests in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownMode {
    /// Stop accepting, run every request in flight to its end, then stop.
    Drain,
    /// Stop accepting, end every request in flight with
    /// [`EngineError::Shutdown`], then stop.
    Abort,
}

/// Counters of the engine thread since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// Steps run (including failed ones).
    pub num_steps: u64,
    /// Steps that returned an error; their requests failed.
    pub num_failed_steps: u64,
    /// Requests admitted.
    pub num_requests_admitted: u64,
    /// Submissions refused (invalid, too long, overloaded, shutting down).
    pub num_requests_rejected: u64,
    /// Requests that ended on EOS, a stop token or a stop string.
    pub num_finished_stop: u64,
    /// Requests that ended on `max_tokens` or `max_model_len`.
    pub num_finished_length: u64,
    /// Requests aborted (by the client, a dropped stream, or shutdown).
    pub num_aborted: u64,
    /// Requests ended by a failed step.
    pub num_failed: u64,
    /// Prompt tokens of requests that produced their first token.
    pub prompt_tokens: u64,
    /// Of those, tokens whose KV came from the prefix cache.
    pub cached_prompt_tokens: u64,
    /// Tokens generated (one per output; of a request its stream ended on a
    /// stop string, those up to the stop).
    pub generation_tokens: u64,
    /// Batches of outputs handed from the engine thread to the streams: at
    /// most one per step (plus one per burst of errors outside a step).
    pub num_handovers: u64,
}

impl EngineCounters {
    /// Requests that ended for `reason`.
    pub fn num_finished(&self, reason: FinishReason) -> u64 {
        match reason {
            FinishReason::Stop => self.num_finished_stop,
            FinishReason::Length => self.num_finished_length,
            FinishReason::Abort => self.num_aborted,
        }
    }
}

/// A snapshot of the engine: the scheduler's gauges and counters plus the
/// engine thread's own.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineStats {
    pub scheduler: SchedulerStats,
    pub counters: EngineCounters,
    /// Requests whose stream is still open on the engine thread.
    pub num_in_flight: usize,
    /// Of those, requests paused because their stream is not read
    /// (also in `scheduler.num_paused`).
    pub num_paused: usize,
}

type SubmitReply = oneshot::Receiver<Result<RequestId>>;
type OutputReceiver = mpsc::UnboundedReceiver<StreamItem>;
/// A stream's side of a submission: its outputs, their unread count, and its
/// text state (where there is a tokenizer).
type StreamEnd = (OutputReceiver, Arc<Backlog>, Option<OutputText>);

/// What the handle asks of the engine thread.
pub(crate) enum Command {
    Submit {
        /// Boxed: the request (its sampling parameters) dwarfs the other
        /// commands.
        request: Box<EngineRequest>,
        output: mpsc::UnboundedSender<StreamItem>,
        backlog: Arc<Backlog>,
        reply: oneshot::Sender<Result<RequestId>>,
    },
    Abort(RequestId),
    /// The stream found a stop string in its `num_outputs`-th output: the
    /// request ended there (whether or not the engine ended it since).
    StopString {
        id: RequestId,
        num_outputs: usize,
    },
    /// The stream of a request with stop strings read the engine's last
    /// output without finding one: the engine's count of it stands.
    Settled(RequestId),
    /// The stream of a paused request was read down: resume it.
    Resume(RequestId),
    Stats(oneshot::Sender<EngineStats>),
    Shutdown {
        mode: ShutdownMode,
        done: oneshot::Sender<()>,
    },
}

/// A cheap, cloneable handle to an engine running on its own thread.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::UnboundedSender<Command>,
    /// [`HandleOptions::pause_backlog`], for each stream's [`Backlog`].
    pause_backlog: Option<usize>,
    /// The engine's tokenizer, for each stream's text.
    tokenizer: Option<Arc<Tokenizer>>,
    /// Taken by the first [`EngineHandle::shutdown`] to join the thread.
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("closed", &self.commands.is_closed())
            .finish()
    }
}

impl EngineHandle {
    /// Starts the engine thread with default options.
    pub fn spawn<B: Backend>(engine: LlmEngine<B>) -> Result<Self> {
        Self::spawn_with(engine, HandleOptions::default())
    }

    /// Starts the engine thread. Fails only if the OS refuses a thread.
    pub fn spawn_with<B: Backend>(engine: LlmEngine<B>, options: HandleOptions) -> Result<Self> {
        let (commands, rx) = mpsc::unbounded_channel();
        let tokenizer = engine.tokenizer().cloned();
        let thread = worker::spawn(engine, rx, options)
            .map_err(|e| EngineError::Internal(format!("cannot start the engine thread: {e}")))?;
        Ok(EngineHandle {
            commands,
            pause_backlog: options.pause_backlog,
            tokenizer,
            thread: Arc::new(Mutex::new(Some(thread))),
        })
    }

    /// Queues a request. Refusals (invalid parameters, a prompt too long for
    /// the model or the KV cache, [`EngineError::Overloaded`],
    /// [`EngineError::Shutdown`]) come back here; the outputs come through the
    /// returned stream. Dropping this future before it resolves aborts the
    /// request.
    pub async fn submit(&self, request: EngineRequest) -> Result<RequestStream> {
        let (reply, outputs) = self.send_submit(request)?;
        let id = reply.await.map_err(|_| EngineError::Shutdown)??;
        Ok(self.stream(id, outputs))
    }

    /// [`Self::submit`] for code outside an async runtime (panics inside one).
    pub fn blocking_submit(&self, request: EngineRequest) -> Result<RequestStream> {
        let (reply, outputs) = self.send_submit(request)?;
        let id = reply.blocking_recv().map_err(|_| EngineError::Shutdown)??;
        Ok(self.stream(id, outputs))
    }

    /// Aborts a request; its stream closes. Unknown or finished ids are ignored.
    pub fn abort(&self, id: RequestId) {
        let _ = self.commands.send(Command::Abort(id));
    }

    /// A snapshot of the engine, taken between steps.
    pub async fn stats(&self) -> Result<EngineStats> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Stats(reply))?;
        rx.await.map_err(|_| EngineError::Shutdown)
    }

    /// [`Self::stats`] for code outside an async runtime (panics inside one).
    pub fn blocking_stats(&self) -> Result<EngineStats> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Stats(reply))?;
        rx.blocking_recv().map_err(|_| EngineError::Shutdown)
    }

    /// Stops the engine (for every clone of this handle) and joins its thread.
    /// New submissions are refused at once; requests in flight finish or are
    /// aborted according to `mode`. The final join is a short blocking call:
    /// the thread has released the engine when it is reached.
    pub async fn shutdown(self, mode: ShutdownMode) -> Result<()> {
        let (done, rx) = oneshot::channel();
        // An engine already gone is as good as stopped.
        let _ = self.commands.send(Command::Shutdown { mode, done });
        let _ = rx.await;
        self.join()
    }

    /// [`Self::shutdown`] for code outside an async runtime (panics inside one).
    pub fn blocking_shutdown(self, mode: ShutdownMode) -> Result<()> {
        let (done, rx) = oneshot::channel();
        let _ = self.commands.send(Command::Shutdown { mode, done });
        let _ = rx.blocking_recv();
        self.join()
    }

    /// Whether the engine thread has stopped taking commands.
    pub fn is_closed(&self) -> bool {
        self.commands.is_closed()
    }

    fn join(&self) -> Result<()> {
        let thread = match self.thread.lock() {
            Ok(mut t) => t.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        match thread {
            // Another clone joined it already.
            None => Ok(()),
            Some(t) => t
                .join()
                .map_err(|_| EngineError::Internal("the engine thread panicked".into())),
        }
    }

    fn send(&self, command: Command) -> Result<()> {
        self.commands
            .send(command)
            .map_err(|_| EngineError::Shutdown)
    }

    /// Sends a submission; returns where its reply and its outputs arrive.
    fn send_submit(&self, request: EngineRequest) -> Result<(SubmitReply, StreamEnd)> {
        let text = match &self.tokenizer {
            Some(t) => Some(OutputText::new(
                t.clone(),
                &request.params,
                &request.prompt_token_ids,
            )?),
            None => None,
        };
        let (output, outputs) = mpsc::unbounded_channel();
        let (reply, rx) = oneshot::channel();
        let backlog = Arc::new(Backlog::new(self.pause_backlog));
        self.send(Command::Submit {
            request: Box::new(request),
            output,
            backlog: backlog.clone(),
            reply,
        })?;
        Ok((rx, (outputs, backlog, text)))
    }

    fn stream(&self, id: RequestId, (outputs, backlog, text): StreamEnd) -> RequestStream {
        RequestStream {
            request_id: id,
            outputs,
            backlog,
            text,
            num_read: 0,
            commands: self.commands.clone(),
            ended: false,
        }
    }
}

/// The outputs of one request, in order. Dropping it before the request ends
/// aborts the request.
pub struct RequestStream {
    request_id: RequestId,
    outputs: OutputReceiver,
    /// Counted down as outputs are handed out; may ask for a resume.
    backlog: Arc<Backlog>,
    /// Decodes the text and finds the stop strings (none without a
    /// tokenizer: outputs carry no text).
    text: Option<OutputText>,
    /// Outputs received so far.
    num_read: usize,
    commands: mpsc::UnboundedSender<Command>,
    /// Seen a last output, an error, or the end of the channel.
    ended: bool,
}

impl std::fmt::Debug for RequestStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestStream")
            .field("request_id", &self.request_id)
            .field("ended", &self.ended)
            .finish()
    }
}

impl RequestStream {
    pub fn request_id(&self) -> RequestId {
        self.request_id
    }

    /// The next output; `None` once the request has ended.
    pub async fn next(&mut self) -> Option<StreamItem> {
        if self.ended {
            return None;
        }
        let item = self.outputs.recv().await;
        self.observe(item)
    }

    /// [`Self::next`] for code outside an async runtime (panics inside one).
    pub fn blocking_next(&mut self) -> Option<StreamItem> {
        if self.ended {
            return None;
        }
        let item = self.outputs.blocking_recv();
        self.observe(item)
    }

    /// Whether the request has ended (last output, error, or closed stream).
    pub fn is_finished(&self) -> bool {
        self.ended
    }

    /// Accounts for a received item and decodes its text.
    fn observe(&mut self, item: Option<StreamItem>) -> Option<StreamItem> {
        let item = match item {
            Some(Ok(out)) => Some(self.take_output(out)),
            other => other,
        };
        self.ended = match &item {
            None | Some(Err(_)) => true,
            Some(Ok(out)) => out.finish_reason.is_some(),
        };
        item
    }

    /// Counts out an output and decodes its text; a stop string ends the
    /// request in the engine, a decoding error aborts it.
    fn take_output(&mut self, mut out: RequestOutput) -> StreamItem {
        self.num_read += 1;
        let ends = out.finish_reason.is_some();
        if self.backlog.read() && !ends {
            // The engine may be gone; then there is nothing to resume.
            let _ = self.commands.send(Command::Resume(self.request_id));
        }
        let Some(text) = self.text.as_mut() else {
            return Ok(out);
        };
        // The engine may be gone below; then there is nothing to end.
        match text.apply(&mut out) {
            Ok(false) if ends && text.has_stop_strings() => {
                let _ = self.commands.send(Command::Settled(self.request_id));
                Ok(out)
            }
            Ok(true) => {
                let _ = self.commands.send(Command::StopString {
                    id: self.request_id,
                    num_outputs: self.num_read,
                });
                Ok(out)
            }
            Ok(false) => Ok(out),
            Err(e) => {
                if !ends {
                    let _ = self.commands.send(Command::Abort(self.request_id));
                }
                Err(e)
            }
        }
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.ended {
            // The engine may be gone already; then there is nothing to free.
            let _ = self.commands.send(Command::Abort(self.request_id));
        }
    }
}
