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

/// Serves `router` on `listener` until `shutdown` resolves, then gives open
/// connections up to `grace` to finish.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_headers(HEADERS_MAX)
        .max_header_size(HEADER_BYTES_MAX)
        .max_buf_size(HEADER_BYTES_MAX.max(8192));
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(CONNECTIONS_MAX));
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
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
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
