//! One HTTP/1.1 connection, served by hyper with the server's timeouts.
//!
//! A watchdog beside hyper's connection future closes the connection when
//! its deadline passes:
//! - a fresh connection has [`ServerConfig::header_read_timeout`] from
//!   accept to send its first request's head;
//! - a kept-alive connection may stay idle for
//!   [`ServerConfig::keep_alive_timeout`] after a response; from the first
//!   byte of its next request it has `header_read_timeout` for the head;
//! - while a request is being handled there is no connection deadline; the
//!   body has [`ServerConfig::body_read_timeout`] from the end of the head
//!   ([`BodyDeadline`], enforced where the body is read: 408 and close).
//!
//! (hyper's own `header_read_timeout` also runs while a kept-alive
//! connection is idle, with the same duration, so it cannot give a long
//! keep-alive with a short header deadline; hence the watchdog.)
//!
//! On the shutdown signal the connection finishes the request in flight and
//! closes (hyper's graceful shutdown); idle connections close at once.
//! Costs: one short uncontended lock per socket read and per request.

use crate::ServerConfig;
use axum::body::Body;
use axum::body::Bytes;
use axum::extract::Request;
use axum::response::Response;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// When the request's body must have arrived (a request extension).
#[derive(Debug, Clone, Copy)]
pub struct BodyDeadline(pub Instant);

/// The timeouts of one connection.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub header: Duration,
    pub body: Duration,
    pub keep_alive: Duration,
}

impl Timeouts {
    pub fn from_config(config: &ServerConfig) -> Self {
        Timeouts {
            header: config.header_read_timeout,
            body: config.body_read_timeout,
            keep_alive: config.keep_alive_timeout,
        }
    }
}

/// Where the connection is in its request cycle.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for a request's first byte (fresh: since accept).
    Waiting { deadline: Instant, fresh: bool },
    /// Reading a request head.
    Head { deadline: Instant },
    /// Handling request number `n` (until its response body ends).
    Busy { n: u64 },
}

/// The watchdog's view of the connection, updated by the IO, the service
/// and the response body.
struct Clock {
    phase: Mutex<(Phase, u64)>,
    changed: Notify,
    timeouts: Timeouts,
}

impl Clock {
    fn new(timeouts: Timeouts) -> Arc<Self> {
        Arc::new(Clock {
            phase: Mutex::new((
                Phase::Waiting {
                    deadline: Instant::now() + timeouts.header,
                    fresh: true,
                },
                0,
            )),
            changed: Notify::new(),
            timeouts,
        })
    }

    fn with<R>(&self, f: impl FnOnce(&mut (Phase, u64)) -> R) -> R {
        // A panic while holding this lock cannot leave it inconsistent.
        let mut guard = self.phase.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// Bytes arrived: a waiting connection starts reading a head.
    fn on_bytes(&self) {
        let started = self.with(|(phase, _)| match *phase {
            Phase::Waiting { deadline, fresh } => {
                let deadline = if fresh {
                    deadline
                } else {
                    Instant::now() + self.timeouts.header
                };
                *phase = Phase::Head { deadline };
                true
            }
            _ => false,
        });
        if started {
            self.changed.notify_one();
        }
    }

    /// A request's head was parsed; returns its number.
    fn on_request(&self) -> u64 {
        self.with(|(phase, count)| {
            *count += 1;
            *phase = Phase::Busy { n: *count };
            *count
        })
    }

    /// Request `n`'s response was sent (or dropped): the connection idles.
    fn on_response_done(&self, n: u64) {
        let idle = self.with(|(phase, _)| match *phase {
            Phase::Busy { n: current } if current == n => {
                *phase = Phase::Waiting {
                    deadline: Instant::now() + self.timeouts.keep_alive,
                    fresh: false,
                };
                true
            }
            _ => false,
        });
        if idle {
            self.changed.notify_one();
        }
    }

    fn deadline(&self) -> Option<Instant> {
        self.with(|(phase, _)| match *phase {
            Phase::Waiting { deadline, .. } | Phase::Head { deadline } => Some(deadline),
            Phase::Busy { .. } => None,
        })
    }
}

/// The socket, telling the clock when bytes arrive.
struct TimedStream {
    tcp: TcpStream,
    clock: Arc<Clock>,
}

impl AsyncRead for TimedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.clock.on_bytes();
        }
        result
    }
}

impl AsyncWrite for TimedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// Tells the clock that a response ended, when it ends or is dropped.
struct ResponseDone {
    clock: Arc<Clock>,
    n: u64,
}

impl Drop for ResponseDone {
    fn drop(&mut self) {
        self.clock.on_response_done(self.n);
    }
}

/// A response body that reports its end to the clock.
pub struct TrackedBody {
    inner: Body,
    done: Option<ResponseDone>,
}

impl HttpBody for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            self.done.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What answers a connection's requests (cloned per request).
pub trait Handler: Clone + Send + 'static {
    fn handle(self, req: Request) -> impl Future<Output = Response> + Send + 'static;
}

/// How a connection is served.
#[derive(Debug, Clone, Copy)]
pub struct ConnOptions {
    pub timeouts: Timeouts,
    /// Keep the connection open between requests.
    pub keep_alive: bool,
}

/// Serves `tcp` until the client leaves, a deadline passes, or (after
/// `stop` turns true) the request in flight is done.
pub async fn serve_connection<H: Handler>(
    tcp: TcpStream,
    handler: H,
    options: ConnOptions,
    mut stop: watch::Receiver<bool>,
) {
    let clock = Clock::new(options.timeouts);
    let io = TokioIo::new(TimedStream {
        tcp,
        clock: clock.clone(),
    });
    let service_clock = clock.clone();
    let body_timeout = options.timeouts.body;
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let n = service_clock.on_request();
        let mut req = req.map(Body::new);
        req.extensions_mut()
            .insert(BodyDeadline(Instant::now() + body_timeout));
        let response = handler.clone().handle(req);
        let done = ResponseDone {
            clock: service_clock.clone(),
            n,
        };
        async move {
            let response = response.await;
            Ok::<_, Infallible>(response.map(|inner| TrackedBody {
                inner,
                done: Some(done),
            }))
        }
    });
    let mut conn = pin!(hyper::server::conn::http1::Builder::new()
        .keep_alive(options.keep_alive)
        .serve_connection(io, service));
    let mut stopping = false;
    loop {
        let deadline = clock.deadline();
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            _ = clock.changed.notified() => {}
            _ = sleep_until(deadline) => {
                if clock.deadline().is_some_and(|d| d <= Instant::now()) {
                    tracing::debug!("closing a connection: no request within its deadline");
                    return;
                }
            }
            // A dropped sender (the server is gone) also stops.
            _ = stop.wait_for(|s| *s), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
