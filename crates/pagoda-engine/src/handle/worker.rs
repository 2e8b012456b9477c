//! The engine thread's loop.
//!
//! Idle (no unfinished request, or only paused ones): block on the command
//! channel, so an idle engine costs no CPU (a paused request comes back
//! through a `Resume` command from its stream). Busy: take every pending
//! command without blocking, abort requests whose output channel is closed,
//! run one [`LlmEngine::step`], queue each output for its request's stream,
//! pause each request that got one and now has
//! [`HandleOptions::pause_backlog`] outputs unread (O(batch): only requests
//! that got an output can have crossed the mark), and hand the step's outputs
//! over in one batch (see `fanout`).
//!
//! The engine runs with text decoding off ([`LlmEngine::set_detokenize`]):
//! outputs carry token ids and logprobs; each stream decodes its own text and
//! looks for its stop strings, and reports a stop string with a
//! `StopString` command, which ends the request here (counted as finished on
//! `stop`, its generated tokens counted up to the stop). A request with stop
//! strings that the engine ends is counted by the engine's reason and kept
//! in `settling` until its stream says how it ended: a stop string found
//! later moves it to `stop` (and its tokens past the stop out of the count);
//! a `Settled` command, or an abort from a stream dropped early, forgets it.
//!
//! A step that returns an error fails every request in flight with an
//! [`EngineError::StepFailed`] item (the scheduler does not say which requests
//! the failed step held, and a request whose step failed has no consistent
//! state to resume from), aborts them in the engine, logs the error, and the
//! loop goes on serving new requests. A step that panics, or an abort that
//! fails, leaves the engine in an unknown state: the streams get an error item
//! and the thread stops (later submissions get [`EngineError::Shutdown`]).
//!
//! While busy it logs a status line every [`HandleOptions::log_interval`]
//! (see `stats_log`).
//!
//! The loop ends when a shutdown was asked and no request is left, or when
//! every handle and stream is gone. The engine (and its KV cache) is dropped
//! before the shutdown callers are told.

use super::backlog::Backlog;
use super::fanout::{self, Outbox};
use super::stats_log::StatsLog;
use super::{Command, EngineCounters, EngineStats, HandleOptions, ShutdownMode, StreamItem};
use crate::engine::{EngineRequest, LlmEngine, RequestOutput};
use crate::{EngineError, Result};
use pagoda_core::{FinishReason, RequestId};
use pagoda_kernels::Backend;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use tokio::sync::{mpsc, oneshot};

/// Starts the thread named `pagoda-engine` that owns `engine`.
/// Starts the thread named `pagoda-engine` that owns `engine` (with text
/// decoding off), and its `pagoda-fanout` thread.
pub(super) fn spawn<B: Backend>(
    mut engine: LlmEngine<B>,
    commands: mpsc::UnboundedReceiver<Command>,
    options: HandleOptions,
) -> std::io::Result<JoinHandle<()>> {
    engine.set_detokenize(false);
    let (outbox, fanout) = fanout::spawn()?;
    std::thread::Builder::new()
        .name("pagoda-engine".into())
        .spawn(move || {
            let waiters = Worker::new(engine, commands, outbox, options).run();
            // Every output is in its stream before shutdown returns.
            let _ = fanout.join();
            for w in waiters {
                let _ = w.send(());
            }
        })
}

/// A request the thread is serving.
struct Live {
    output: mpsc::UnboundedSender<StreamItem>,
    /// Its unread outputs, shared with its stream.
    backlog: Arc<Backlog>,
    /// Paused in the engine for want of a reader.
    paused: bool,
    /// Produced a token already (its prompt is counted).
    started: bool,
    /// Tokens handed to its stream (outputs without one not counted).
    sent: usize,
    /// Its stream looks for stop strings (it may end it on one).
    stop_strings: bool,
}

/// The engine's state on its thread.
struct Worker<B: Backend> {
    engine: LlmEngine<B>,
    commands: mpsc::UnboundedReceiver<Command>,
    max_waiting: Option<usize>,
    live: HashMap<RequestId, Live>,
    /// Requests with stop strings the engine ended, until their streams
    /// confirm: the reason counted and the outputs sent.
    settling: HashMap<RequestId, (FinishReason, usize)>,
    /// Live requests paused now.
    num_paused: usize,
    /// False once a drain shutdown was asked: requests then run to their end.
    pausing: bool,
    counters: EngineCounters,
    /// False once a shutdown was asked.
    accepting: bool,
    /// Every sender of the command channel is gone.
    commands_closed: bool,
    /// Told when the thread has stopped.
    shutdown_waiters: Vec<oneshot::Sender<()>>,
    /// The periodic status line.
    stats_log: StatsLog,
    /// Items for the streams, handed over once per loop turn.
    outbox: Outbox,
}

/// The engine can no longer be trusted; the loop must stop.
struct Fatal(String);

impl<B: Backend> Worker<B> {
    fn new(
        engine: LlmEngine<B>,
        commands: mpsc::UnboundedReceiver<Command>,
        outbox: Outbox,
        options: HandleOptions,
    ) -> Self {
        Worker {
            engine,
            commands,
            max_waiting: options.max_waiting,
            live: HashMap::new(),
            settling: HashMap::new(),
            num_paused: 0,
            pausing: true,
            counters: EngineCounters::default(),
            accepting: true,
            commands_closed: false,
            shutdown_waiters: Vec::new(),
            stats_log: StatsLog::new(options.log_interval),
            outbox,
        }
    }

    /// Runs until stopped; returns who to tell, after the engine is dropped.
    fn run(mut self) -> Vec<oneshot::Sender<()>> {
        tracing::debug!("engine thread started");
        if let Err(Fatal(message)) = self.serve() {
            tracing::error!(%message, "engine thread stopping");
            let error = || EngineError::StepFailed(message.clone());
            for (_, live) in self.live.drain() {
                self.outbox.push(&live.output, Err(error()));
                self.counters.num_failed += 1;
            }
            self.outbox.flush();
        }
        tracing::debug!(counters = ?self.counters, "engine thread stopped");
        std::mem::take(&mut self.shutdown_waiters)
    }

    fn serve(&mut self) -> Result<(), Fatal> {
        loop {
            self.outbox.flush();
            if !self.engine.has_schedulable_requests() {
                let idle = !self.engine.has_unfinished_requests();
                if idle && (!self.accepting || self.commands_closed) {
                    return Ok(());
                }
                // Nothing to compute: wait for a submission, a resume, an
                // abort or a shutdown. (Closed: every stream is gone.)
                match self.commands.blocking_recv() {
                    Some(command) => self.handle(command)?,
                    None => return Ok(()),
                }
                if idle {
                    // Busy again: the status line's window starts now.
                    self.stats_log.restart(&self.counters, &self.engine.stats());
                }
            }
            self.take_commands()?;
            let closed: Vec<RequestId> = self
                .live
                .iter()
                .filter(|(_, l)| l.output.is_closed())
                .map(|(&id, _)| id)
                .collect();
            if !closed.is_empty() {
                // A stream that ended on a stop string said so before it
                // closed: take that first, so it is not counted an abort.
                self.take_commands()?;
                for id in closed {
                    self.abort(id)?;
                }
            }
            if self.engine.has_schedulable_requests() {
                self.step()?;
            }
            if self.stats_log.due() {
                let sched = self.engine.stats();
                self.stats_log.take(&self.counters, &sched).log();
            }
        }
    }

    /// Handles every pending command without blocking.
    fn take_commands(&mut self) -> Result<(), Fatal> {
        loop {
            match self.commands.try_recv() {
                Ok(command) => self.handle(command)?,
                Err(mpsc::error::TryRecvError::Empty) => return Ok(()),
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.commands_closed = true;
                    return Ok(());
                }
            }
        }
    }

    fn handle(&mut self, command: Command) -> Result<(), Fatal> {
        match command {
            Command::Submit {
                request,
                output,
                backlog,
                reply,
            } => match self.admit(*request, output, backlog) {
                Ok(id) => {
                    if reply.send(Ok(id)).is_err() {
                        // The submitter went away before it heard back.
                        self.abort(id)?;
                    }
                }
                Err(e) => {
                    self.counters.num_requests_rejected += 1;
                    let _ = reply.send(Err(e));
                }
            },
            Command::Abort(id) => self.abort(id)?,
            Command::StopString { id, num_outputs } => self.stop_string(id, num_outputs)?,
            Command::Settled(id) => {
                self.settling.remove(&id);
            }
            Command::Resume(id) => self.resume(id)?,
            Command::Stats(reply) => {
                let _ = reply.send(EngineStats {
                    scheduler: self.engine.stats(),
                    counters: EngineCounters {
                        num_handovers: self.outbox.handovers(),
                        ..self.counters
                    },
                    num_in_flight: self.live.len(),
                    num_paused: self.num_paused,
                });
            }
            Command::Shutdown { mode, done } => {
                tracing::info!(?mode, in_flight = self.live.len(), "engine shutting down");
                self.accepting = false;
                self.shutdown_waiters.push(done);
                if mode == ShutdownMode::Drain && self.pausing {
                    // Every request must end, read or not.
                    self.pausing = false;
                    let paused: Vec<RequestId> = self
                        .live
                        .iter()
                        .filter(|(_, l)| l.paused)
                        .map(|(&id, _)| id)
                        .collect();
                    for id in paused {
                        if let Some(live) = self.live.get(&id) {
                            live.backlog.take_pause();
                        }
                        self.resume(id)?;
                    }
                }
                if mode == ShutdownMode::Abort {
                    let ids: Vec<RequestId> = self.live.keys().copied().collect();
                    for id in ids {
                        if let Some(live) = self.live.get(&id) {
                            self.outbox.push(&live.output, Err(EngineError::Shutdown));
                        }
                        self.abort(id)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn admit(
        &mut self,
        request: EngineRequest,
        output: mpsc::UnboundedSender<StreamItem>,
        backlog: Arc<Backlog>,
    ) -> Result<RequestId> {
        if !self.accepting {
            return Err(EngineError::Shutdown);
        }
        if let Some(max_waiting) = self.max_waiting {
            let num_waiting = self.engine.stats().num_waiting;
            if num_waiting >= max_waiting {
                return Err(EngineError::Overloaded {
                    num_waiting,
                    max_waiting,
                });
            }
        }
        let stop_strings = !request.params.stop.is_empty() && self.engine.tokenizer().is_some();
        let id = self.engine.add_request(request)?;
        self.live.insert(
            id,
            Live {
                output,
                backlog,
                paused: false,
                started: false,
                sent: 0,
                stop_strings,
            },
        );
        self.counters.num_requests_admitted += 1;
        Ok(id)
    }

    /// Drops a live request from the engine; unknown ids are ignored.
    fn abort(&mut self, id: RequestId) -> Result<(), Fatal> {
        self.settling.remove(&id);
        if self.remove(id).is_none() {
            return Ok(());
        }
        self.counters.num_aborted += 1;
        self.engine
            .abort(id)
            .map_err(|e| Fatal(format!("aborting request {id} failed: {e}")))
    }

    /// Its stream found a stop string in its `num_outputs`-th output: ends
    /// the request, or recounts it if the engine ended it meanwhile.
    fn stop_string(&mut self, id: RequestId, num_outputs: usize) -> Result<(), Fatal> {
        let sent = match (self.remove(id), self.settling.remove(&id)) {
            (Some(live), _) => {
                self.engine.finish_on_stop_string(id).map_err(|e| {
                    Fatal(format!(
                        "ending request {id} on its stop string failed: {e}"
                    ))
                })?;
                live.sent
            }
            (None, Some((counted, sent))) => {
                let c = &mut self.counters;
                match counted {
                    FinishReason::Stop => c.num_finished_stop -= 1,
                    FinishReason::Length => c.num_finished_length -= 1,
                    FinishReason::Abort => c.num_aborted -= 1,
                }
                sent
            }
            (None, None) => return Ok(()),
        };
        self.counters.num_finished_stop += 1;
        let unread = sent.saturating_sub(num_outputs) as u64;
        self.counters.generation_tokens = self.counters.generation_tokens.saturating_sub(unread);
        Ok(())
    }

    /// Takes a request off the live set (keeping the paused count true).
    fn remove(&mut self, id: RequestId) -> Option<Live> {
        let live = self.live.remove(&id)?;
        if live.paused {
            self.num_paused -= 1;
        }
        Some(live)
    }

    /// Pauses live request `id` if its stream has too much unread.
    fn maybe_pause(&mut self, id: RequestId) -> Result<(), Fatal> {
        let Some(live) = self.live.get_mut(&id) else {
            return Ok(());
        };
        if !self.pausing || live.paused || !live.backlog.try_pause() {
            return Ok(());
        }
        live.paused = true;
        self.num_paused += 1;
        tracing::debug!(request = %id, unread = live.backlog.unread(), "stream not read; pausing");
        self.engine
            .pause(id)
            .map_err(|e| Fatal(format!("pausing request {id} failed: {e}")))
    }

    /// Resumes live request `id` if paused; unknown ids are ignored.
    fn resume(&mut self, id: RequestId) -> Result<(), Fatal> {
        let Some(live) = self.live.get_mut(&id) else {
            return Ok(());
        };
        if !live.paused {
            return Ok(());
        }
        live.paused = false;
        self.num_paused -= 1;
        tracing::debug!(request = %id, "stream read again; resuming");
        self.engine
            .resume(id)
            .map_err(|e| Fatal(format!("resuming request {id} failed: {e}")))
    }

    fn step(&mut self) -> Result<(), Fatal> {
        self.counters.num_steps += 1;
        let result = catch_unwind(AssertUnwindSafe(|| self.engine.step()));
        match result {
            Ok(Ok(outputs)) => self.deliver(outputs),
            Ok(Err(e)) => {
                self.counters.num_failed_steps += 1;
                let message = e.to_string();
                // The step's own requests fail; the others go on. Where the
                // failure came before any request was scheduled, every
                // request in flight fails (nothing says which are sound).
                let ids: Vec<RequestId> = match self.engine.last_step_requests() {
                    [] => self.live.keys().copied().collect(),
                    step => step.to_vec(),
                };
                tracing::error!(
                    error = %message,
                    failed = ids.len(),
                    in_flight = self.live.len(),
                    "engine step failed; failing its requests"
                );
                for id in ids {
                    if let Some(live) = self.remove(id) {
                        let error = Err(EngineError::StepFailed(message.clone()));
                        self.outbox.push(&live.output, error);
                        self.counters.num_failed += 1;
                    }
                    self.engine
                        .abort(id)
                        .map_err(|e| Fatal(format!("after a failed step ({message}), {e}")))?;
                }
                Ok(())
            }
            Err(panic) => {
                self.counters.num_failed_steps += 1;
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(Fatal(format!("engine step panicked: {what}")))
            }
        }
    }

    fn deliver(&mut self, outputs: Vec<RequestOutput>) -> Result<(), Fatal> {
        for out in outputs {
            let id = out.request_id;
            let Some(live) = self.live.get_mut(&id) else {
                continue;
            };
            if !live.started {
                live.started = true;
                self.counters.prompt_tokens += out.num_prompt_tokens as u64;
                self.counters.cached_prompt_tokens += out.num_cached_tokens as u64;
            }
            self.counters.generation_tokens += u64::from(!out.no_token);
            let finish = out.finish_reason;
            live.backlog.sent();
            live.sent += usize::from(!out.no_token);
            self.outbox.push(&live.output, Ok(out));
            match finish {
                Some(reason) => {
                    if let Some(live) = self.remove(id).filter(|l| l.stop_strings) {
                        self.settling.insert(id, (reason, live.sent));
                    }
                    match reason {
                        FinishReason::Stop => self.counters.num_finished_stop += 1,
                        FinishReason::Length => self.counters.num_finished_length += 1,
                        FinishReason::Abort => self.counters.num_aborted += 1,
                    }
                }
                // A closed stream is aborted at the next turn, after the
                // commands (its stop string, if it found one).
                None => self.maybe_pause(id)?,
            }
        }
        Ok(())
    }
}
