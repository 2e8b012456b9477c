//! The accept loop: how many connections are served, what happens beyond
//! that, and the file-descriptor limit.
//!
//! Up to [`Limits::max_connections`] connections are served normally. Past
//! the cap, up to [`Limits::overflow`] more are accepted on a reserved path
//! that answers `GET /health` as usual and everything else with a 503 in
//! OpenAI's error shape (`Retry-After: 1`), one request per connection and a
//! short header deadline; past that, a connection gets a canned 503 and is
//! closed at once. So a full server answers quickly instead of hanging, and
//! `/health` keeps answering. The default cap stays below the process's
//! file-descriptor limit with headroom for the reserved path and the
//! process's own files; if `accept` fails anyway (EMFILE, ENFILE, ENOBUFS)
//! the loop backs off (doubling from 10 ms to 1 s) instead of spinning.

use crate::conn::{self, ConnOptions, Handler, Timeouts};
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Most connections served by default, whatever the fd limit.
pub const DEFAULT_MAX_CONNECTIONS_CEILING: usize = 8192;
/// Header deadline on the reserved path (or the configured one if shorter).
const OVERFLOW_HEADER_TIMEOUT: Duration = Duration::from_secs(2);
const MIN_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// How many connections the server holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Served normally.
    pub max_connections: usize,
    /// Accepted past the cap on the reserved path (`/health`, else 503).
    pub overflow: usize,
}

impl Limits {
    /// Limits under a soft fd limit of `fd_limit` (None: unlimited): an
    /// eighth of it (at least 64 fds, at most half) is kept free, half of
    /// that (at most 256) for the reserved path. `max_connections`, when
    /// given, replaces the derived cap.
    pub fn new(fd_limit: Option<u64>, max_connections: Option<usize>) -> Limits {
        let fds = fd_limit.map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
        let reserve = (fds / 8).max(64).min(fds / 2);
        let derived = (fds - reserve).min(DEFAULT_MAX_CONNECTIONS_CEILING);
        Limits {
            max_connections: max_connections.unwrap_or(derived).max(1),
            overflow: (reserve / 2).clamp(1, 256),
        }
    }
}

/// The process's soft limit on open files (None: unlimited or unknown).
pub fn fd_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        rustix::process::getrlimit(rustix::process::Resource::Nofile).current
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Raises the soft limit on open files to the hard limit (at most 2^20);
/// returns the soft limit now in force. Process-wide: call it once at start.
pub fn raise_fd_limit() -> io::Result<Option<u64>> {
    #[cfg(unix)]
    {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        let limit = getrlimit(Resource::Nofile);
        let target = limit.maximum.unwrap_or(1 << 20).min(1 << 20);
        if limit.current.is_some_and(|c| c < target) {
            setrlimit(
                Resource::Nofile,
                Rlimit {
                    current: Some(target),
                    maximum: limit.maximum,
                },
            )?;
        }
        Ok(fd_limit())
    }
    #[cfg(not(unix))]
    {
        Ok(None)
    }
}

/// The normal path: the router.
#[derive(Clone)]
struct Routes(Router);

impl Handler for Routes {
    fn handle(self, req: Request) -> impl Future<Output = Response> + Send + 'static {
        let mut router = self.0;
        async move {
            match tower_service::Service::call(&mut router, req).await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        }
    }
}

/// The reserved path past the cap: `/health` through the router, else 503.
#[derive(Clone)]
struct Overflow {
    routes: Routes,
    state: AppState,
}

impl Handler for Overflow {
    fn handle(self, req: Request) -> impl Future<Output = Response> + Send + 'static {
        let health = req.uri().path() == "/health"
            && (req.method() == Method::GET || req.method() == Method::HEAD);
        let Overflow { routes, state } = self;
        async move {
            if health {
                routes.handle(req).await
            } else {
                state.metrics.record_response(503);
                let mut response = too_many_connections().into_response();
                response.headers_mut().insert(
                    header::CONNECTION,
                    header::HeaderValue::from_static("close"),
                );
                response
            }
        }
    }
}

fn too_many_connections() -> ApiError {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        kind: "server_overloaded",
        code: Some("too_many_connections"),
        retry_after: Some(1),
        ..ApiError::invalid("the server has too many open connections; retry later")
    }
}

/// A whole 503 response, written to connections past the reserved path.
fn canned_503() -> Vec<u8> {
    let body = too_many_connections().body_json();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Counts a connection while it lives.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// Takes one of `max` slots, if one is free.
    fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(count.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Accepts and serves until `shutdown` resolves, then stops accepting and
/// waits (at most `drain`) for the connections to finish.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    let timeouts = Timeouts::from_config(&state.config);
    let normal = ConnOptions {
        timeouts,
        keep_alive: true,
    };
    let reserved = ConnOptions {
        timeouts: Timeouts {
            header: timeouts.header.min(OVERFLOW_HEADER_TIMEOUT),
            ..timeouts
        },
        keep_alive: false,
    };
    let routes = Routes(crate::routes::router(state.clone()));
    let overflow = Overflow {
        routes: routes.clone(),
        state: state.clone(),
    };
    let canned = Arc::new(canned_503());
    let served = Arc::new(AtomicUsize::new(0));
    let spilled = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut backoff = MIN_BACKOFF;
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => {
                backoff = MIN_BACKOFF;
                tcp
            }
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of file descriptors or buffers: wait for some to free.
                tracing::warn!(error = %e, backoff_ms = backoff.as_millis() as u64, "cannot accept a connection");
                tokio::select! {
                    _ = &mut shutdown => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let stop = stop_rx.clone();
        if let Some(slot) = Slot::take(&served, limits.max_connections) {
            let routes = routes.clone();
            tokio::spawn(async move {
                conn::serve_connection(tcp, routes, normal, stop).await;
                drop(slot);
            });
        } else if let Some(slot) = Slot::take(&spilled, limits.overflow) {
            let overflow = overflow.clone();
            tokio::spawn(async move {
                conn::serve_connection(tcp, overflow, reserved, stop).await;
                drop(slot);
            });
        } else {
            state.metrics.record_response(503);
            refuse(tcp, &canned);
        }
    }
    drop(listener);
    tracing::info!("shutting down: no new connections; finishing requests in flight");
    let _ = stop_tx.send(true);
    drop(stop_rx);
    tokio::select! {
        _ = stop_tx.closed() => {}
        _ = tokio::time::sleep(drain) => {
            tracing::warn!(
                seconds = drain.as_secs_f64(),
                "requests still in flight after the shutdown timeout; stopping anyway"
            );
        }
    }
}

/// Writes the canned 503 if the socket takes it now, then closes.
fn refuse(tcp: TcpStream, canned: &[u8]) {
    let _ = tcp.try_write(canned);
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_leaves_headroom_below_the_fd_limit() {
        let l = Limits::new(Some(1024), None);
        assert_eq!(
            l,
            Limits {
                max_connections: 896,
                overflow: 64
            }
        );
        assert!(l.max_connections + l.overflow + 64 <= 1024);
        let l = Limits::new(Some(256), None);
        assert_eq!(
            l,
            Limits {
                max_connections: 192,
                overflow: 32
            }
        );
        let l = Limits::new(Some(100), None);
        assert_eq!(
            l,
            Limits {
                max_connections: 50,
                overflow: 25
            }
        );
        let l = Limits::new(Some(1 << 20), None);
        assert_eq!(l.max_connections, DEFAULT_MAX_CONNECTIONS_CEILING);
        assert_eq!(l.overflow, 256);
        assert_eq!(
            Limits::new(None, None).max_connections,
            DEFAULT_MAX_CONNECTIONS_CEILING
        );
        assert_eq!(Limits::new(Some(1024), Some(3)).max_connections, 3);
        assert_eq!(Limits::new(Some(1024), Some(0)).max_connections, 1);
    }

    #[test]
    fn canned_503_is_a_complete_response_with_openai_json() {
        let text = String::from_utf8(canned_503()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "too_many_connections");
    }
}
