//! A process on a pseudo-terminal, for the CLI tests of what pagoda does on
//! a terminal: libc's `openpty`, the child in a session of its own with the
//! terminal as its controlling one (so `\x03` written to the master sends it
//! SIGINT), and a reader thread that keeps every byte with the reads that
//! brought them (streaming shows as many reads).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What the terminal showed so far.
#[derive(Default)]
struct Log {
    bytes: Vec<u8>,
    /// The end offset of each read, in order.
    read_ends: Vec<usize>,
    closed: bool,
}

pub struct PtyProcess {
    child: Child,
    master: File,
    log: Arc<(Mutex<Log>, Condvar)>,
}

fn cloexec(fd: i32) {
    // SAFETY: fcntl on a descriptor this process just opened.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        assert!(flags >= 0 && libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) == 0);
    }
}

impl PtyProcess {
    /// Runs `bin args` with stdin and stdout (and stderr when `stderr_too`;
    /// else it is discarded) on a new pseudo-terminal.
    pub fn spawn(bin: &str, args: &[&str], stderr_too: bool) -> PtyProcess {
        let (mut m, mut s) = (-1, -1);
        // SAFETY: openpty writes the two descriptors; no name, default
        // terminal settings (canonical input, echo, signals) and size.
        let rc = unsafe {
            libc::openpty(
                &mut m,
                &mut s,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        cloexec(m);
        cloexec(s);
        // SAFETY: both descriptors were just opened and are owned here.
        let (master, slave) = unsafe { (File::from_raw_fd(m), OwnedFd::from_raw_fd(s)) };
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()));
        if stderr_too {
            cmd.stderr(Stdio::from(slave));
        } else {
            cmd.stderr(Stdio::null());
            drop(slave);
        }
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        // The parent's copies of the terminal side go with `cmd`.
        drop(cmd);
        let log = Arc::new((Mutex::new(Log::default()), Condvar::new()));
        let (mut reader, shared) = (master.try_clone().unwrap(), log.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                // EIO once the child side is closed.
                let n = reader.read(&mut buf).unwrap_or(0);
                let (lock, cv) = &*shared;
                let mut log = lock.lock().unwrap();
                if n == 0 {
                    log.closed = true;
                    cv.notify_all();
                    return;
                }
                log.bytes.extend_from_slice(&buf[..n]);
                let end = log.bytes.len();
                log.read_ends.push(end);
                cv.notify_all();
            }
        });
        PtyProcess { child, master, log }
    }

    /// Types `text` (a line with its `\n`, or a control character).
    pub fn send(&mut self, text: &str) {
        self.master.write_all(text.as_bytes()).unwrap();
        self.master.flush().unwrap();
    }

    /// Waits until `needle` shows at or after byte `from`; returns its offset.
    #[track_caller]
    pub fn wait_for(&self, needle: &str, from: usize, timeout: Duration) -> usize {
        self.wait_until(timeout, &format!("{needle:?} after byte {from}"), |bytes| {
            find(bytes, needle.as_bytes(), from)
        })
    }

    /// Waits until at least `n` bytes follow byte `from`.
    #[track_caller]
    pub fn wait_for_bytes(&self, from: usize, n: usize, timeout: Duration) {
        self.wait_until(timeout, &format!("{n} bytes after byte {from}"), |bytes| {
            (bytes.len() >= from + n).then_some(())
        });
    }

    #[track_caller]
    fn wait_until<T>(&self, timeout: Duration, what: &str, test: impl Fn(&[u8]) -> Option<T>) -> T {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.log;
        let mut log = lock.lock().unwrap();
        loop {
            if let Some(t) = test(&log.bytes) {
                return t;
            }
            let now = Instant::now();
            if log.closed || now >= deadline {
                let why = if log.closed {
                    "the terminal closed"
                } else {
                    "timed out"
                };
                panic!(
                    "{why} waiting for {what}; the terminal showed:\n{}",
                    String::from_utf8_lossy(&log.bytes)
                );
            }
            log = cv.wait_timeout(log, deadline - now).unwrap().0;
        }
    }

    /// The bytes shown from `from` to `to`, with the terminal's `\r\n` as `\n`.
    pub fn text(&self, from: usize, to: usize) -> String {
        let log = self.log.0.lock().unwrap();
        String::from_utf8_lossy(&log.bytes[from..to]).replace("\r\n", "\n")
    }

    /// Everything shown so far.
    pub fn len(&self) -> usize {
        self.log.0.lock().unwrap().bytes.len()
    }

    /// How many reads brought bytes of `from..to`.
    pub fn reads_over(&self, from: usize, to: usize) -> usize {
        let log = self.log.0.lock().unwrap();
        let mut start = 0;
        let mut n = 0;
        for &end in &log.read_ends {
            if start < to && end > from {
                n += 1;
            }
            start = end;
        }
        n
    }

    /// Waits for the process to exit.
    #[track_caller]
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() >= deadline {
                let shown = self.text(0, self.len());
                panic!("the process did not exit; the terminal showed:\n{shown}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for PtyProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}
