//! The accept loop: hyper's HTTP/1 server with the limits a local spool
//! needs from day one, and graceful shutdown.
//!
//! - A client must finish sending its request headers within
//!   [`HEADER_READ_TIMEOUT`] (bodies have [`super::BODY_READ_TIMEOUT`]), so a
//!   slow client cannot hold a connection forever.
//! - At most [`HEADERS_MAX`] headers and [`HEADER_BYTES_MAX`] bytes of them.
//! - At most [`CONNECTIONS_MAX`] connections at once; more wait in the
//!   kernel's backlog instead of costing memory here.
//! - On shutdown the listener closes at once; open connections finish the
//!   request in flight (idle keep-alive ones close) within the grace period.
//!
//! The replication listener (`cluster/mod.rs`) is served by the same loop
//! with tighter [`Limits`] and optionally TLS: a port that faces the
//! network gets no more trust than the API.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
pub(crate) const HEADERS_MAX: usize = 100;
pub(crate) const HEADER_BYTES_MAX: usize = 64 << 10;
pub(crate) const CONNECTIONS_MAX: usize = 4096;

/// What one listener allows.
pub(crate) struct Limits {
    pub connections_max: usize,
    /// From the connection's start (and the TLS handshake's) to the end
    /// of a request's headers.
    pub header_read_timeout: Duration,
    /// TLS on every connection, when set.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Limits {
    /// The API's.
    pub(crate) fn api() -> Limits {
        Limits {
            connections_max: CONNECTIONS_MAX,
            header_read_timeout: HEADER_READ_TIMEOUT,
            tls: None,
        }
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, then gives open
/// connections up to `grace` to finish.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
    limits: Limits,
) {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_headers(HEADERS_MAX)
        .max_header_size(HEADER_BYTES_MAX)
        .max_buf_size(HEADER_BYTES_MAX.max(8192));
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.connections_max));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("semaphore never closes"),
            () = &mut shutdown => break,
        };
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off a little.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let Some(tls) = &limits.tls else {
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                drop(permit);
            });
            continue;
        };
        // The handshake has the header timeout too, so a peer that never
        // finishes it cannot hold a slot.
        let (tls, builder, watcher) = (tls.clone(), builder.clone(), graceful.watcher());
        let handshake_timeout = limits.header_read_timeout;
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(handshake_timeout, tls.accept(stream)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let conn = watcher.watch(builder.serve_connection(TokioIo::new(stream), service));
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            grace_ms = grace.as_millis() as u64,
            "connections still open after the grace period"
        );
    }
}
