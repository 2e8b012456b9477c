//! Ctrl-C for `pagoda chat`: while an answer streams it only raises a flag
//! (the chat loop aborts that request between engine steps and goes back to
//! its prompt); anywhere else it leaves the process at once, with status 0.
//!
//! SIGINT is taken over by tokio's signal handling (already used by
//! `serve`) on a small thread of its own, so the engine and the line
//! reading stay plain blocking code. Once [`CtrlC::install`] returns, the
//! default action (killing the process mid-write) no longer applies.

use anyhow::{Context, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The chat loop's side of the handler.
pub struct CtrlC {
    /// An answer is streaming: Ctrl-C stops it instead of leaving.
    answering: Arc<AtomicBool>,
    /// Ctrl-C was pressed during the current answer.
    pressed: Arc<AtomicBool>,
}

impl CtrlC {
    /// Starts listening for SIGINT; the process is at its prompt.
    pub fn install() -> Result<CtrlC> {
        let answering = Arc::new(AtomicBool::new(false));
        let pressed = Arc::new(AtomicBool::new(false));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the signal runtime")?;
        let mut signal = {
            let _guard = runtime.enter();
            Signal::new().context("cannot listen for Ctrl-C")?
        };
        let (a, p) = (answering.clone(), pressed.clone());
        std::thread::Builder::new()
            .name("pagoda-ctrl-c".into())
            .spawn(move || {
                runtime.block_on(async move {
                    while signal.recv().await {
                        if a.load(Ordering::SeqCst) {
                            p.store(true, Ordering::SeqCst);
                        } else {
                            // At the prompt: leave on a fresh line.
                            eprintln!();
                            std::process::exit(0);
                        }
                    }
                })
            })
            .context("cannot start the Ctrl-C thread")?;
        Ok(CtrlC { answering, pressed })
    }

    /// An answer starts streaming: Ctrl-C now stops it.
    pub fn answering(&self) {
        self.pressed.store(false, Ordering::SeqCst);
        self.answering.store(true, Ordering::SeqCst);
    }

    /// Back at the prompt: Ctrl-C now leaves.
    pub fn at_prompt(&self) {
        self.answering.store(false, Ordering::SeqCst);
        self.pressed.store(false, Ordering::SeqCst);
    }

    /// Whether Ctrl-C was pressed during the current answer.
    pub fn pressed(&self) -> bool {
        self.pressed.load(Ordering::SeqCst)
    }
}

/// SIGINT, registered when made (not on first poll).
#[cfg(unix)]
struct Signal(tokio::signal::unix::Signal);

#[cfg(unix)]
impl Signal {
    fn new() -> std::io::Result<Signal> {
        use tokio::signal::unix::{signal, SignalKind};
        signal(SignalKind::interrupt()).map(Signal)
    }

    /// The next SIGINT; false once no more can come.
    async fn recv(&mut self) -> bool {
        self.0.recv().await.is_some()
    }
}

#[cfg(not(unix))]
struct Signal;

#[cfg(not(unix))]
impl Signal {
    fn new() -> std::io::Result<Signal> {
        Ok(Signal)
    }

    async fn recv(&mut self) -> bool {
        tokio::signal::ctrl_c().await.is_ok()
    }
}
