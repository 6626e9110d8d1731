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
//! network gets no more trust than the API. There, besides:
//!
//! - a first request must name its sender with a signature the cluster's
//!   secret made ([`Limits::admit`]), or it is answered `401` at once and
//!   never holds a slot; slots are counted per signed sender, not per
//!   address (peers on one host are told apart), so that someone without
//!   the secret cannot take a peer's share;
//! - past the open cap, the oldest connection that holds no slot yet is
//!   closed to make room ([`Limits::evict_pending`]), so that connections
//!   held open by someone without the secret cannot keep a peer out;
//! - a connection waits at most [`Limits::slot_wait_max`] for a slot.
//!
//! On every listener a connection that waits for a slot is read ahead (up
//! to [`READ_AHEAD_MAX`] bytes), so that a client that leaves while it
//! waits is noticed and its socket closed: unread, a peer's close went
//! unheard and the socket stayed in CLOSE-WAIT, holding its place.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
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
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot, watch};

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
/// Bytes read from a connection while it waits for a slot (beyond its
/// first request's head): enough to notice its client leave.
pub(crate) const READ_AHEAD_MAX: usize = 64 << 10;
/// How long a new connection past the open cap waits for the one evicted
/// to make room to go.
const EVICT_WAIT: Duration = Duration::from_millis(100);

/// Tells the sender of a first request from its head: `Ok(id)` for a
/// sender it may serve, counted as `id`; `Err(why)` for one answered
/// `401` with `why` and closed.
pub(crate) type Admit = Arc<dyn Fn(&[u8]) -> Result<u64, String> + Send + Sync>;

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
    /// When set, only first requests it names a sender for are served, and
    /// `per_client_max` counts per sender rather than per address.
    pub admit: Option<Admit>,
    /// Longest a connection waits for a slot (`None`: until one is free).
    pub slot_wait_max: Option<Duration>,
    /// Past `open_max`, close the oldest connection that holds no slot yet
    /// rather than the new one.
    pub evict_pending: bool,
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
            admit: None,
            slot_wait_max: None,
            evict_pending: false,
        }
    }
}

/// Who a connection counts for: its address (every loopback address one),
/// or the sender its listener's `admit` named.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Client {
    Addr(IpAddr),
    Sender(u64),
}

impl Client {
    fn of(ip: IpAddr) -> Client {
        Client::Addr(client_of(ip))
    }
}

/// Counts per client, each bounded: a semaphore per client that has a
/// connection, dropped with its last one.
struct PerClient {
    max: usize,
    clients: Mutex<HashMap<Client, Arc<Semaphore>>>,
}

/// One connection's share of a [`PerClient`].
struct ClientPermit {
    _permit: OwnedSemaphorePermit,
    client: Client,
    of: Arc<PerClient>,
}

impl PerClient {
    fn new(max: usize) -> Arc<PerClient> {
        Arc::new(PerClient {
            max,
            clients: Mutex::default(),
        })
    }

    fn semaphore(&self, client: Client) -> Arc<Semaphore> {
        let mut clients = self.clients.lock().expect("per-client counts poisoned");
        clients
            .entry(client)
            .or_insert_with(|| Arc::new(Semaphore::new(self.max)))
            .clone()
    }

    fn try_take(self: &Arc<Self>, client: Client) -> Option<ClientPermit> {
        let permit = self.semaphore(client).try_acquire_owned().ok()?;
        Some(ClientPermit {
            _permit: permit,
            client,
            of: self.clone(),
        })
    }

    async fn take(self: &Arc<Self>, client: Client) -> ClientPermit {
        let permit = self
            .semaphore(client)
            .acquire_owned()
            .await
            .expect("semaphore never closes");
        ClientPermit {
            _permit: permit,
            client,
            of: self.clone(),
        }
    }
}

/// The connections that hold no slot yet, oldest first, each with the
/// sender that closes it: what [`Limits::evict_pending`] evicts.
#[derive(Default)]
struct Pending {
    next: AtomicU64,
    waiting: Mutex<BTreeMap<u64, oneshot::Sender<()>>>,
}

/// A connection's place in [`Pending`], given up when dropped.
struct PendingPlace<'a> {
    seq: u64,
    of: &'a Pending,
}

impl Pending {
    /// Enters a connection: its place, and what fires when it is evicted.
    fn enter(&self) -> (PendingPlace<'_>, oneshot::Receiver<()>) {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting
            .lock()
            .expect("pending connections poisoned")
            .insert(seq, tx);
        (PendingPlace { seq, of: self }, rx)
    }

    /// Closes the oldest connection that holds no slot: whether there was
    /// one.
    fn evict_oldest(&self) -> bool {
        let oldest = self
            .waiting
            .lock()
            .expect("pending connections poisoned")
            .pop_first();
        oldest.is_some_and(|(_, tx)| tx.send(()).is_ok())
    }
}

impl Drop for PendingPlace<'_> {
    fn drop(&mut self) {
        self.of
            .waiting
            .lock()
            .expect("pending connections poisoned")
            .remove(&self.seq);
    }
}

impl Drop for ClientPermit {
    fn drop(&mut self) {
        let mut clients = self.of.clients.lock().expect("per-client counts poisoned");
        // This permit goes back after this returns: the client's last one
        // leaves `max - 1` available and only the map's reference.
        if let Some(s) = clients.get(&self.client)
            && Arc::strong_count(s) == 1
            && s.available_permits() + 1 == self.of.max
        {
            clients.remove(&self.client);
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
    open: Arc<Semaphore>,
    open_per_client: Arc<PerClient>,
    pending: Pending,
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
    let (stop, stopping) = watch::channel(false);
    let shared = Shared::new(router, limits, stopping);
    let graceful = GracefulShutdown::new();
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
        spawn_connection(&shared, &graceful, stream, peer.ip());
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

impl Shared {
    /// What the connections of a listener with `limits` share: hyper's
    /// builders (the probes' answers one request each), the slots and
    /// the open connections counted, `stopping` to tell them of a stop.
    fn new(router: Router, limits: Limits, stopping: watch::Receiver<bool>) -> Arc<Shared> {
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
        Arc::new(Shared {
            builder,
            probe_builder,
            slots: Arc::new(Semaphore::new(limits.connections_max)),
            per_client: PerClient::new(limits.per_client_max),
            spare: Arc::new(Semaphore::new(PROBES_MAX)),
            open: Arc::new(Semaphore::new(limits.open_max)),
            open_per_client: PerClient::new(limits.open_per_client_max),
            pending: Pending::default(),
            router,
            stopping,
            limits,
        })
    }
}

/// Takes an accepted connection from `ip`: closed at once past the open
/// limits (unless the listener evicts), else served on a task of its own.
fn spawn_connection(
    shared: &Arc<Shared>,
    graceful: &GracefulShutdown,
    stream: TcpStream,
    ip: IpAddr,
) {
    // Past the open limits: closed at once, or (evicting) given the
    // place of the oldest connection that holds no slot.
    let open = shared.open.clone().try_acquire_owned().ok();
    let client = shared.open_per_client.try_take(Client::of(ip));
    if (open.is_none() || client.is_none()) && !shared.limits.evict_pending {
        return;
    }
    let _ = stream.set_nodelay(true);
    let (shared, watcher) = (shared.clone(), graceful.watcher());
    tokio::spawn(async move {
        let held = match (open, client) {
            (Some(open), Some(client)) => (open, client),
            (open, client) => match make_room(&shared, ip, open, client).await {
                Some(held) => held,
                None => return,
            },
        };
        connection(&shared, stream, ip, watcher).await;
        drop(held);
    });
}

/// A new connection past the open cap on a listener that evicts: the
/// oldest connection that holds no slot is closed, and this one takes its
/// place (`None`: none went within [`EVICT_WAIT`]). `open` and `client`:
/// the permits it already has.
async fn make_room(
    shared: &Shared,
    ip: IpAddr,
    open: Option<OwnedSemaphorePermit>,
    client: Option<ClientPermit>,
) -> Option<(OwnedSemaphorePermit, ClientPermit)> {
    if shared.pending.evict_oldest() {
        crate::metrics::limit_reached(crate::metrics::Limit::Evicted);
    }
    tokio::time::timeout(EVICT_WAIT, async {
        let open = match open {
            Some(open) => open,
            None => shared
                .open
                .clone()
                .acquire_owned()
                .await
                .expect("semaphore never closes"),
        };
        let client = match client {
            Some(client) => client,
            None => shared.open_per_client.take(Client::of(ip)).await,
        };
        (open, client)
    })
    .await
    .ok()
}

/// Reads what `io`'s client sends while it waits for a slot, into its
/// prefix (hyper reads it first), up to [`READ_AHEAD_MAX`] bytes beyond
/// the head: returns once the client closed or failed, never while it is
/// there.
async fn read_ahead(io: &mut Rewind<Box<dyn Io>>) {
    let limit = io.prefix.len() + READ_AHEAD_MAX;
    let mut chunk = [0u8; 4096];
    while io.prefix.len() < limit {
        match io.inner.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => io.prefix.extend_from_slice(&chunk[..n]),
        }
    }
    std::future::pending().await
}

/// Answers a first request whose sender the listener's `admit` refused:
/// `401` with `why`, and the connection closed.
async fn refuse(mut io: Rewind<Box<dyn Io>>, why: &str) {
    crate::metrics::limit_reached(crate::metrics::Limit::Unsigned);
    let answer = format!(
        "HTTP/1.1 401 Unauthorized\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{why}",
        why.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        use tokio::io::AsyncWriteExt;
        let _ = io.inner.write_all(answer.as_bytes()).await;
        let _ = io.inner.shutdown().await;
    })
    .await;
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
    let (place, mut evicted) = shared.pending.enter();
    let mut stopping = shared.stopping.clone();
    let Some(mut io) = first_request(shared, stream, &mut stopping, &mut evicted).await else {
        return;
    };
    let client = match &shared.limits.admit {
        None => Client::of(ip),
        Some(admit) => match admit(&io.prefix) {
            Ok(sender) => Client::Sender(sender),
            Err(why) => return refuse(io, &why).await,
        },
    };
    let immediate = shared.per_client.try_take(client).and_then(|client| {
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
                return answer_probe(shared, probes, io, spare).await;
            }
            crate::metrics::limit_reached(crate::metrics::Limit::Connections);
            match wait_for_slot(shared, client, &mut io, &mut stopping, &mut evicted).await {
                Some(held) => held,
                None => return,
            }
        }
    };
    drop(place);
    let service = TowerToHyperService::new(shared.router.clone());
    let served = graceful
        .watch(shared.builder.serve_connection(TokioIo::new(io), service))
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "connection ended with an error");
    }
    drop(held);
}

/// Waits for a connection's first byte, its TLS handshake (on a TLS
/// listener) and its first request's head, each in its time: `None` when
/// one does not come, or the listener stops or evicts the connection.
async fn first_request(
    shared: &Shared,
    stream: TcpStream,
    stopping: &mut watch::Receiver<bool>,
    evicted: &mut oneshot::Receiver<()>,
) -> Option<Rewind<Box<dyn Io>>> {
    tokio::select! {
        first = first_byte(&stream, FIRST_BYTE_TIMEOUT) => if !first { return None },
        _ = stopping.wait_for(|s| *s) => return None,
        _ = &mut *evicted => return None,
    }
    let read_first = async {
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
    tokio::select! {
        io = tokio::time::timeout(shared.limits.first_request_timeout, read_first) => match io {
            Ok(Some(io)) if !io.prefix.is_empty() => Some(io),
            Ok(_) => None,
            Err(_) => {
                crate::metrics::limit_reached(crate::metrics::Limit::FirstRequest);
                None
            }
        },
        _ = stopping.wait_for(|s| *s) => None,
        _ = &mut *evicted => None,
    }
}

/// Answers a probe that found no slot free on a `spare` connection: one
/// request, within [`PROBE_TIMEOUT`].
async fn answer_probe(
    shared: &Shared,
    probes: &Router,
    io: Rewind<Box<dyn Io>>,
    spare: OwnedSemaphorePermit,
) {
    let service = TowerToHyperService::new(probes.clone());
    let conn = shared
        .probe_builder
        .serve_connection(TokioIo::new(io), service);
    let _ = tokio::time::timeout(PROBE_TIMEOUT, conn).await;
    drop(spare);
}

/// Waits for `client`'s slot, then the listener's, reading ahead on `io`
/// to notice the client leave: `None` when it leaves, or a stop, an
/// eviction or the listener's longest wait ends the wait.
async fn wait_for_slot(
    shared: &Shared,
    client: Client,
    io: &mut Rewind<Box<dyn Io>>,
    stopping: &mut watch::Receiver<bool>,
    evicted: &mut oneshot::Receiver<()>,
) -> Option<(OwnedSemaphorePermit, ClientPermit)> {
    let wait = async {
        let client = shared.per_client.take(client).await;
        let slot = shared
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("semaphore never closes");
        (slot, client)
    };
    let longest = async {
        match shared.limits.slot_wait_max {
            Some(max) => tokio::time::sleep(max).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        held = wait => Some(held),
        () = read_ahead(io) => None,
        () = longest => {
            crate::metrics::limit_reached(crate::metrics::Limit::SlotWait);
            None
        }
        _ = stopping.wait_for(|s| *s) => None,
        _ = &mut *evicted => None,
    }
}
