//! The accept loop: hyper's HTTP/1 server with the limits a local spool
//! needs from day one, and graceful shutdown.
//!
//! A connection is *open* from its accept, and *active* once it holds one
//! of the listener's slots, which it needs to be served:
//!
//! - It must send its first byte within [`FIRST_BYTE_TIMEOUT`] of
//!   connecting, and the whole head of its first request (after the TLS
//!   handshake, on a TLS listener) within [`FIRST_REQUEST_TIMEOUT`], and
//!   takes a slot only then: idle connections, and ones that send a byte
//!   and stall, cost a socket for a few seconds, never a slot (stalled
//!   ones held slots for ten seconds and kept a keyed send waiting seven).
//!   Later requests' headers must be complete within
//!   [`HEADER_READ_TIMEOUT`] (bodies have [`crate::api::BODY_READ_TIMEOUT`]).
//! - At most [`CONNECTIONS_MAX`] are active, and at most
//!   [`CONNECTIONS_PER_CLIENT_MAX`] of them from one client, so that one
//!   neighbour cannot take every slot; a connection waits (in this
//!   process) until its client and the listener have a slot free. A
//!   client is an address, and every loopback address is one client
//!   (`127.0.0.2` and `127.0.0.3` are the same host as `127.0.0.1`).
//! - At most [`OPEN_MAX`] are open, [`OPEN_PER_CLIENT_MAX`] from one
//!   address; past that a connection is closed at once.
//! - A probe (`GET /healthz`, `GET /readyz`, told by its request line)
//!   that finds no slot free is answered at once by the listener's
//!   `probes` router on one of [`PROBES_MAX`] spare connections, one
//!   request each, so that a kubelet's probe passes while the slots are
//!   taken.
//! - At most [`HEADERS_MAX`] headers and [`HEADER_BYTES_MAX`] bytes of them.
//! - On shutdown the listener closes at once; open connections finish the
//!   request in flight (idle keep-alive ones close) within the grace period.
//!
//! The replication listener (`cluster/listener.rs`) is served by the same loop
//! with tighter [`Limits`] and optionally TLS: a port that faces the
//! network gets no more trust than the API.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// From accepting a connection to its first byte.
pub(crate) const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(2);
/// From a connection's first byte to the end of its first request's head
/// (its TLS handshake included): it takes no slot before.
pub const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
pub(crate) const HEADERS_MAX: usize = 100;
pub(crate) const HEADER_BYTES_MAX: usize = 64 << 10;
pub(crate) const CONNECTIONS_MAX: usize = 4096;
pub(crate) const CONNECTIONS_PER_CLIENT_MAX: usize = CONNECTIONS_MAX / 2;
pub(crate) const OPEN_MAX: usize = 4 * CONNECTIONS_MAX;
pub(crate) const OPEN_PER_CLIENT_MAX: usize = OPEN_MAX / 2;
/// Probes answered at once while no slot is free.
pub(crate) const PROBES_MAX: usize = 64;
/// The whole life of a probe's spare connection.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What one listener allows.
pub(crate) struct Limits {
    /// Active connections, and of those from one client address.
    pub connections_max: usize,
    pub per_client_max: usize,
    /// Open connections (active, waiting for a slot, or for a first byte),
    /// and of those from one client address.
    pub open_max: usize,
    pub open_per_client_max: usize,
    /// From a request's first byte to the end of its headers (later
    /// requests of a connection).
    pub header_read_timeout: Duration,
    /// From the connection's first byte to the end of its first request's
    /// head, TLS handshake included: it holds no slot before.
    pub first_request_timeout: Duration,
    /// TLS on every connection, when set.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Answers a probe that finds no slot free (plain HTTP only).
    pub probes: Option<Router>,
}

impl Limits {
    /// The API's (and the probe listener's).
    pub(crate) fn api(probes: Router) -> Limits {
        Limits {
            connections_max: CONNECTIONS_MAX,
            per_client_max: CONNECTIONS_PER_CLIENT_MAX,
            open_max: OPEN_MAX,
            open_per_client_max: OPEN_PER_CLIENT_MAX,
            header_read_timeout: HEADER_READ_TIMEOUT,
            first_request_timeout: FIRST_REQUEST_TIMEOUT,
            tls: None,
            probes: Some(probes),
        }
    }
}

/// Counts per client address, each bounded: a semaphore per address that
/// has a connection, dropped with its last one.
struct PerClient {
    max: usize,
    clients: Mutex<HashMap<IpAddr, Arc<Semaphore>>>,
}

/// One connection's share of a [`PerClient`].
struct ClientPermit {
    _permit: OwnedSemaphorePermit,
    ip: IpAddr,
    of: Arc<PerClient>,
}

impl PerClient {
    fn new(max: usize) -> Arc<PerClient> {
        Arc::new(PerClient {
            max,
            clients: Mutex::default(),
        })
    }

    fn semaphore(&self, ip: IpAddr) -> Arc<Semaphore> {
        let ip = client_of(ip);
        let mut clients = self.clients.lock().expect("per-client counts poisoned");
        clients
            .entry(ip)
            .or_insert_with(|| Arc::new(Semaphore::new(self.max)))
            .clone()
    }

    fn try_take(self: &Arc<Self>, ip: IpAddr) -> Option<ClientPermit> {
        let ip = client_of(ip);
        let permit = self.semaphore(ip).try_acquire_owned().ok()?;
        Some(ClientPermit {
            _permit: permit,
            ip,
            of: self.clone(),
        })
    }

    async fn take(self: &Arc<Self>, ip: IpAddr) -> ClientPermit {
        let ip = client_of(ip);
        let permit = self
            .semaphore(ip)
            .acquire_owned()
            .await
            .expect("semaphore never closes");
        ClientPermit {
            _permit: permit,
            ip,
            of: self.clone(),
        }
    }
}

impl Drop for ClientPermit {
    fn drop(&mut self) {
        let mut clients = self.of.clients.lock().expect("per-client counts poisoned");
        // This permit goes back after this returns: the address's last one
        // leaves `max - 1` available and only the map's reference.
        if let Some(s) = clients.get(&self.ip)
            && Arc::strong_count(s) == 1
            && s.available_permits() + 1 == self.of.max
        {
            clients.remove(&self.ip);
        }
    }
}

/// The client a connection from `ip` counts for: every loopback address is
/// the one host, and an IPv4 address mapped into IPv6 is that address.
fn client_of(ip: IpAddr) -> IpAddr {
    let ip = ip.to_canonical();
    if ip.is_loopback() {
        IpAddr::from([127, 0, 0, 1])
    } else {
        ip
    }
}

/// Waits up to `timeout` for the first byte of `stream`: false if none
/// came (or the client left).
async fn first_byte(stream: &TcpStream, timeout: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(timeout, stream.peek(&mut byte)).await,
        Ok(Ok(n)) if n > 0
    )
}

/// Whether a request's head is a probe's.
fn is_probe(head: &[u8]) -> bool {
    head.starts_with(b"GET /healthz ") || head.starts_with(b"GET /readyz ")
}

/// Reads from `io` until what came holds a request's whole head (the empty
/// line that ends it), the client stops, or more than the headers may
/// take came (hyper then refuses it). What was read, body bytes included.
async fn read_head(io: &mut (impl AsyncRead + Unpin)) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = io.read(&mut chunk).await?;
        if n == 0 {
            return Ok(head);
        }
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        if head[from..].windows(4).any(|w| w == b"\r\n\r\n") || head.len() > HEADER_BYTES_MAX {
            return Ok(head);
        }
    }
}

/// What a connection read before hyper, handed back to it first.
struct Rewind<T> {
    prefix: Vec<u8>,
    read: usize,
    inner: T,
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.read < self.prefix.len() {
            let n = buf.remaining().min(self.prefix.len() - self.read);
            let at = self.read;
            buf.put_slice(&self.prefix[at..at + n]);
            self.read += n;
            if self.read == self.prefix.len() {
                self.prefix = Vec::new();
                self.read = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A connection's byte stream: plain TCP or TLS over it.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// What every connection task of one listener shares.
struct Shared {
    builder: http1::Builder,
    probe_builder: http1::Builder,
    slots: Arc<Semaphore>,
    per_client: Arc<PerClient>,
    spare: Arc<Semaphore>,
    limits: Limits,
    router: Router,
    stopping: watch::Receiver<bool>,
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
    let mut probe_builder = builder.clone();
    probe_builder
        .header_read_timeout(PROBE_TIMEOUT)
        .keep_alive(false);
    let (stop, stopping) = watch::channel(false);
    let shared = Arc::new(Shared {
        builder,
        probe_builder,
        slots: Arc::new(Semaphore::new(limits.connections_max)),
        per_client: PerClient::new(limits.per_client_max),
        spare: Arc::new(Semaphore::new(PROBES_MAX)),
        router,
        stopping,
        limits,
    });
    let graceful = GracefulShutdown::new();
    let open = Arc::new(Semaphore::new(shared.limits.open_max));
    let open_per_client = PerClient::new(shared.limits.open_per_client_max);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
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
        // Past the open limits: closed at once.
        let Ok(open_permit) = open.clone().try_acquire_owned() else {
            continue;
        };
        let Some(client_open) = open_per_client.try_take(peer.ip()) else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (shared, watcher) = (shared.clone(), graceful.watcher());
        tokio::spawn(async move {
            connection(&shared, stream, peer.ip(), watcher).await;
            drop((open_permit, client_open));
        });
    }
    drop(listener);
    // Connections still waiting for a first byte or a slot end now; those
    // being served finish their request in flight.
    stop.send_replace(true);
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

/// Serves one accepted connection: waits for its first byte, its TLS
/// handshake and its first request's head, then for a slot (a probe that
/// finds none is answered on a spare one), then serves.
async fn connection(
    shared: &Shared,
    stream: TcpStream,
    ip: IpAddr,
    graceful: hyper_util::server::graceful::Watcher,
) {
    let mut stopping = shared.stopping.clone();
    tokio::select! {
        first = first_byte(&stream, FIRST_BYTE_TIMEOUT) => if !first { return },
        _ = stopping.wait_for(|s| *s) => return,
    }
    let first_request = async {
        let mut io: Box<dyn Io> = match &shared.limits.tls {
            None => Box::new(stream),
            Some(tls) => match tls.accept(stream).await {
                Ok(stream) => Box::new(stream),
                Err(e) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    return None;
                }
            },
        };
        let head = read_head(&mut io).await.ok()?;
        Some(Rewind {
            prefix: head,
            read: 0,
            inner: io,
        })
    };
    let io = tokio::select! {
        io = tokio::time::timeout(shared.limits.first_request_timeout, first_request) => match io {
            Ok(Some(io)) if !io.prefix.is_empty() => io,
            Ok(_) => return,
            Err(_) => {
                crate::metrics::limit_reached(crate::metrics::Limit::FirstRequest);
                return;
            }
        },
        _ = stopping.wait_for(|s| *s) => return,
    };
    let immediate = shared.per_client.try_take(ip).and_then(|client| {
        let slot = shared.slots.clone().try_acquire_owned().ok()?;
        Some((slot, client))
    });
    let held = match immediate {
        Some(held) => held,
        None => {
            if let Some(probes) = &shared.limits.probes
                && is_probe(&io.prefix)
                && let Ok(spare) = shared.spare.clone().try_acquire_owned()
            {
                let service = TowerToHyperService::new(probes.clone());
                let conn = shared
                    .probe_builder
                    .serve_connection(TokioIo::new(io), service);
                let _ = tokio::time::timeout(PROBE_TIMEOUT, conn).await;
                drop(spare);
                return;
            }
            crate::metrics::limit_reached(crate::metrics::Limit::Connections);
            // Wait for this client's slot, then the listener's; a stop
            // ends the wait.
            let wait = async {
                let client = shared.per_client.take(ip).await;
                let slot = shared
                    .slots
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("semaphore never closes");
                (slot, client)
            };
            tokio::select! {
                held = wait => held,
                _ = stopping.wait_for(|s| *s) => return,
            }
        }
    };
    let service = TowerToHyperService::new(shared.router.clone());
    let served = graceful
        .watch(shared.builder.serve_connection(TokioIo::new(io), service))
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "connection ended with an error");
    }
    drop(held);
}
