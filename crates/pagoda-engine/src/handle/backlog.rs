//! The unread outputs of one request's stream, shared by the engine thread
//! and the [`super::RequestStream`], and the pause/resume handshake over them.
//!
//! The thread counts an output in ([`Backlog::sent`]) before it sends it; the
//! stream counts it out ([`Backlog::read`]) as it hands it to its reader. When
//! `pause_at` or more wait unread, the thread pauses the request
//! ([`Backlog::try_pause`] sets the `paused` flag); the stream that brings
//! the count under `resume_below` (half of `pause_at`) takes the flag back and
//! asks the thread, over the command channel, to resume the request.
//!
//! Guarantee: each pause is undone exactly once and no resume is lost. Both
//! sides clear the flag with a swap, so only one of them can win it; and the
//! thread reads the count again after setting the flag, so a stream that
//! drained before it could see the flag leaves the resume to the thread.
//! All accesses are sequentially consistent (a few atomics per output).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Backlog {
    unread: AtomicUsize,
    /// Set by the thread when it pauses; taken by whoever resumes.
    paused: AtomicBool,
    pause_at: usize,
    resume_below: usize,
}

impl Backlog {
    /// `pause_at`: unread outputs that pause the request (at least 1);
    /// `None`: never.
    pub(crate) fn new(pause_at: Option<usize>) -> Self {
        let pause_at = pause_at.map_or(usize::MAX, |n| n.max(1));
        Backlog {
            unread: AtomicUsize::new(0),
            paused: AtomicBool::new(false),
            pause_at,
            resume_below: (pause_at / 2).max(1),
        }
    }

    /// The thread is about to send an output.
    pub(crate) fn sent(&self) {
        self.unread.fetch_add(1, SeqCst);
    }

    /// The stream handed out an output the thread counted in. `true`: the
    /// request was paused and the caller must ask the thread to resume it.
    pub(crate) fn read(&self) -> bool {
        let left = self.unread.fetch_sub(1, SeqCst).saturating_sub(1);
        left < self.resume_below && self.paused.swap(false, SeqCst)
    }

    /// The thread's check: whether the request must be paused now. `true`:
    /// the flag is set, the caller pauses the request, and a later
    /// [`Self::read`] (or [`Self::take_pause`]) undoes it.
    pub(crate) fn try_pause(&self) -> bool {
        if self.unread.load(SeqCst) < self.pause_at {
            return false;
        }
        self.paused.store(true, SeqCst);
        // The stream may have drained meanwhile without seeing the flag.
        !(self.unread.load(SeqCst) < self.resume_below && self.paused.swap(false, SeqCst))
    }

    /// The thread resumes on its own (e.g. a drain shutdown): takes the flag
    /// so the stream asks nothing more.
    pub(crate) fn take_pause(&self) {
        self.paused.store(false, SeqCst);
    }

    /// Outputs sent and not yet read.
    pub(crate) fn unread(&self) -> usize {
        self.unread.load(SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_at_the_mark_and_resumes_under_half() {
        let b = Backlog::new(Some(4));
        for _ in 0..3 {
            b.sent();
        }
        assert!(!b.try_pause(), "3 unread: below the mark");
        b.sent();
        assert!(b.try_pause());
        assert!(!b.read(), "3 unread: not under 2");
        assert!(!b.read(), "2 unread: not under 2");
        assert!(b.read(), "1 unread: resume");
        assert!(!b.read(), "resumed once only");
        assert_eq!(b.unread(), 0);
    }

    #[test]
    fn a_pause_taken_by_the_thread_asks_nothing_of_the_stream() {
        let b = Backlog::new(Some(2));
        b.sent();
        b.sent();
        assert!(b.try_pause());
        b.take_pause();
        assert!(!b.read());
        assert!(!b.read());
        assert!(!b.try_pause(), "nothing unread");
        let never = Backlog::new(None);
        for _ in 0..1000 {
            never.sent();
        }
        assert!(!never.try_pause());
        let tiny = Backlog::new(Some(0));
        tiny.sent();
        assert!(tiny.try_pause(), "at least 1");
        assert!(tiny.read(), "resumed with nothing unread");
    }
}
