//! Replication traffic between replicas, on `cluster.listen` (never the
//! API port): `POST /raft/{append,vote,pre-vote}` with postcard bodies,
//! and `POST /raft/snapshot`, a streamed body of length-prefixed messages
//! (the snapshot's header, then the engine's stream of a checkpoint and
//! its records: `engine/snapshot.rs`).
//!
//! Every request carries a proof of the cluster secret (an HMAC of a fixed
//! label under it, so the secret itself never crosses the network), the
//! node id it is meant for and the incarnation the membership knows that
//! node by; a request without the proof is refused and logged, one meant
//! for another node is refused (a peer that points at the wrong address
//! must not vote here), and so is one meant for an earlier incarnation of
//! this node (its spool directory was wiped: it lost its log and its vote,
//! and may take part again only once removed and added back). Every answer
//! names this node's incarnation, which is how the primary learns the
//! incarnations of the members of a bootstrap (`mod.rs` pins them).
//!
//! `POST /raft/hello` answers who is here (node id, incarnation, whether
//! it belongs to a cluster yet): asked by a new replica before it
//! bootstraps, and by the primary before it adds a member.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hmac::{Hmac, KeyInit, Mac};
use openraft::error::{NetworkError, RPCError, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::Sha256;

use super::Raft;
use super::store::{Snapshot, SnapshotData, SnapshotMeta};
use super::types::{Peer, TypeConfig, Vote, seq_of};
use crate::engine::Engine;
use crate::journal::JournalError;

const AUTH_HEADER: &str = "spooler-cluster-auth";
const TARGET_HEADER: &str = "spooler-cluster-target";
/// `<node id> <api url>` of the sender: how followers learn where the
/// primary's API is (a leader sends to every follower each heartbeat).
const FROM_HEADER: &str = "spooler-cluster-from";
/// The incarnation a request is meant for (0: any), and the one an answer
/// comes from.
const INCARNATION_HEADER: &str = "spooler-cluster-incarnation";
/// A body larger than this is not a Raft message spoold sends.
const RAFT_BODY_MAX_BYTES: usize = 64 << 20;

/// The proof of the cluster secret every replication request carries.
pub(crate) fn auth_token(secret: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
    mac.update(b"spoold cluster v1");
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The identity every replica of a cluster shares (docs/replication.md):
/// the salt of message ids and the key of lease tokens, so that ids and
/// tokens mean the same on every primary. Derived from the secret.
pub(crate) fn cluster_identity(secret: &str) -> crate::journal::SpoolIdentity {
    let derive = |label: &[u8]| {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
        mac.update(label);
        let bytes: [u8; 32] = mac.finalize().into_bytes().into();
        bytes
    };
    let salt = derive(b"spoold cluster salt v1");
    crate::journal::SpoolIdentity {
        // Never zero, as for a single node's (journal/format.rs).
        salt: u64::from_le_bytes(salt[..8].try_into().expect("8 bytes")) | 1,
        token_key: derive(b"spoold cluster token key v1"),
    }
}

/// Constant-time comparison: no early exit on the first differing byte.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[derive(Clone)]
struct ServerState {
    raft: Raft,
    engine: Engine,
    /// One snapshot received at a time.
    receiving: Arc<tokio::sync::Mutex<()>>,
    node_id: u64,
    incarnation: u64,
    auth: Arc<str>,
    api_urls: Arc<Mutex<BTreeMap<u64, String>>>,
}

/// What `POST /raft/hello` answers.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub(crate) struct Hello {
    pub node_id: u64,
    pub incarnation: u64,
    /// It holds a membership: it bootstrapped, or a primary reached it.
    pub initialized: bool,
}

/// The replication listener's routes.
pub(crate) fn router(
    raft: Raft,
    engine: Engine,
    (node_id, incarnation): (u64, u64),
    auth: Arc<str>,
    api_urls: Arc<Mutex<BTreeMap<u64, String>>>,
) -> Router {
    let state = ServerState {
        raft,
        engine,
        receiving: Arc::default(),
        node_id,
        incarnation,
        auth,
        api_urls,
    };
    let named = axum::http::HeaderValue::from(incarnation);
    Router::new()
        .route("/raft/hello", post(hello))
        .route("/raft/append", post(append))
        .route("/raft/vote", post(vote))
        .route("/raft/pre-vote", post(pre_vote))
        .layer(axum::extract::DefaultBodyLimit::max(RAFT_BODY_MAX_BYTES))
        // A snapshot is as large as the spool; it is read as it arrives.
        .route(
            "/raft/snapshot",
            post(snapshot).layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .with_state(state)
        .layer(axum::middleware::map_response(move |mut r: Response| {
            r.headers_mut().insert(INCARNATION_HEADER, named.clone());
            std::future::ready(r)
        }))
}

/// Refuses a request without the secret's proof, or meant for another
/// node: the refusal, or `None` to go on.
fn refuse(state: &ServerState, headers: &HeaderMap) -> Option<Response> {
    let given = headers
        .get(AUTH_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if !same(given, state.auth.as_bytes()) {
        tracing::warn!("refused a replication request without the cluster secret");
        return Some((StatusCode::UNAUTHORIZED, "cluster secret required").into_response());
    }
    let target = headers
        .get(TARGET_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if target != Some(state.node_id) {
        return Some(
            (
                StatusCode::MISDIRECTED_REQUEST,
                format!("this is node {}, not {target:?}", state.node_id),
            )
                .into_response(),
        );
    }
    let meant = headers
        .get(INCARNATION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    if meant != 0 && meant != state.incarnation {
        tracing::warn!(
            meant,
            incarnation = state.incarnation,
            "refused replication meant for an earlier incarnation of this node: \
             its spool directory is new; remove this node and add it back"
        );
        return Some(
            (
                StatusCode::MISDIRECTED_REQUEST,
                format!(
                    "node {} has a new spool directory (incarnation {:x}, not {meant:x}): \
                     remove it from the cluster and add it back",
                    state.node_id, state.incarnation
                ),
            )
                .into_response(),
        );
    }
    let from = headers.get(FROM_HEADER).and_then(|v| v.to_str().ok());
    if let Some((id, url)) = from.and_then(|v| v.split_once(' '))
        && let Ok(id) = id.parse::<u64>()
    {
        let mut urls = state.api_urls.lock().expect("bug: api url lock poisoned");
        if urls.get(&id).is_none_or(|known| known != url) {
            urls.insert(id, url.to_owned());
        }
    }
    None
}

/// A Raft message from its body, or the `400` that refuses it.
fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, Box<Response>> {
    postcard::from_bytes(body).map_err(|e| {
        Box::new(
            (
                StatusCode::BAD_REQUEST,
                format!("undecodable Raft message: {e}"),
            )
                .into_response(),
        )
    })
}

/// A Raft answer (or the reason there is none) as a postcard body.
fn reply<T: Serialize, E: std::fmt::Display>(result: Result<T, E>) -> Response {
    let result = result.map_err(|e| e.to_string());
    match postcard::to_allocvec(&result) {
        Ok(bytes) => bytes.into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// One Raft call: checked, decoded, handed to openraft, answered.
async fn serve<Q, A, E, F>(s: ServerState, headers: HeaderMap, body: Bytes, call: F) -> Response
where
    Q: DeserializeOwned,
    A: Serialize,
    E: std::fmt::Display,
    F: AsyncFnOnce(Raft, Q) -> Result<A, E>,
{
    if let Some(refused) = refuse(&s, &headers) {
        return refused;
    }
    match decode(&body) {
        Ok(rpc) => reply(call(s.raft, rpc).await),
        Err(bad) => *bad,
    }
}

async fn hello(State(s): State<ServerState>, headers: HeaderMap) -> Response {
    if let Some(refused) = refuse(&s, &headers) {
        return refused;
    }
    let initialized = s.raft.is_initialized().await.unwrap_or(false);
    reply(Ok::<_, String>(Hello {
        node_id: s.node_id,
        incarnation: s.incarnation,
        initialized,
    }))
}

async fn append(State(s): State<ServerState>, headers: HeaderMap, body: Bytes) -> Response {
    serve(
        s,
        headers,
        body,
        async |raft: Raft, rpc: AppendEntriesRequest<TypeConfig>| raft.append_entries(rpc).await,
    )
    .await
}

async fn vote(State(s): State<ServerState>, headers: HeaderMap, body: Bytes) -> Response {
    serve(
        s,
        headers,
        body,
        async |raft: Raft, rpc: VoteRequest<TypeConfig>| raft.vote(rpc).await,
    )
    .await
}

async fn pre_vote(State(s): State<ServerState>, headers: HeaderMap, body: Bytes) -> Response {
    serve(
        s,
        headers,
        body,
        async |raft: Raft, rpc: VoteRequest<TypeConfig>| raft.pre_vote(rpc).await,
    )
    .await
}

/// Receives a snapshot: the messages are handed, as they arrive, to the
/// engine on a blocking thread, which writes the records into packs; then
/// openraft installs it.
async fn snapshot(State(s): State<ServerState>, headers: HeaderMap, body: Body) -> Response {
    if let Some(refused) = refuse(&s, &headers) {
        return refused;
    }
    let _one_at_a_time = s.receiving.lock().await;
    let mut messages = Messages::new(body.into_data_stream());
    let head = match messages.next().await {
        Some(Ok(head)) => head,
        Some(Err(e)) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
        None => return (StatusCode::BAD_REQUEST, "an empty snapshot").into_response(),
    };
    let (vote, meta): (Vote, SnapshotMeta) = match decode(&head) {
        Ok(head) => head,
        Err(bad) => return *bad,
    };
    let Some(last) = meta.last_log_id else {
        return (StatusCode::BAD_REQUEST, "a snapshot of nothing").into_response();
    };
    let (seq, term) = (seq_of(last.index()), last.committed_leader_id().term);
    tracing::info!(seq, term, "receiving a snapshot from the primary");
    let started = std::time::Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::channel(SNAPSHOT_MESSAGES_BUFFERED);
    let engine = s.engine.clone();
    let receiving = tokio::task::spawn_blocking(move || {
        let arriving = std::iter::from_fn(|| rx.blocking_recv());
        engine.receive_snapshot(seq, term, arriving)
    });
    let _receiving = crate::metrics::SnapshotReceiving::start();
    let (mut bytes, mut messages_in, mut reported) = (0u64, 0u64, std::time::Instant::now());
    while let Some(m) = messages.next().await {
        let len = m.as_ref().map_or(0, |m| m.len() as u64);
        bytes += len;
        messages_in += 1;
        crate::metrics::record_snapshot_bytes(len);
        if reported.elapsed() >= SNAPSHOT_PROGRESS_EVERY {
            reported = std::time::Instant::now();
            tracing::info!(
                seq,
                mib = bytes >> 20,
                messages = messages_in,
                seconds = started.elapsed().as_secs(),
                "catching up by snapshot: received so far"
            );
        }
        let m = m.map_err(|e| JournalError::io("snapshot stream", e));
        if tx.send(m).await.is_err() {
            break;
        }
    }
    drop(tx);
    let staged = match receiving.await {
        Ok(Ok(staged)) => staged,
        Ok(Err(e)) => {
            tracing::warn!(seq, error = %e, "a snapshot from the primary failed");
            return (StatusCode::BAD_REQUEST, e.to_string()).into_response();
        }
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    tracing::info!(
        seq,
        bytes,
        seconds = started.elapsed().as_secs_f64(),
        "received a snapshot; installing it"
    );
    let snapshot = Snapshot {
        meta,
        snapshot: SnapshotData::Received(Box::new(staged)),
    };
    let installed = s.raft.install_full_snapshot(vote, snapshot).await;
    if installed.is_ok() {
        crate::metrics::record_snapshot_installed();
    }
    reply(installed)
}

/// How often a replica receiving a snapshot logs how far it got.
const SNAPSHOT_PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Messages buffered between the network and the thread writing packs.
const SNAPSHOT_MESSAGES_BUFFERED: usize = 64;
/// Bytes gathered into one piece of a streamed snapshot body.
const SNAPSHOT_PIECE_BYTES: usize = 256 << 10;

/// Length-prefixed messages (`u32` little-endian, then the bytes) read
/// from a stream of byte pieces.
struct Messages<S> {
    pieces: S,
    buf: Vec<u8>,
    /// Where the next message starts in `buf`.
    start: usize,
    done: bool,
}

impl<S, E> Messages<S>
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    fn new(pieces: S) -> Self {
        Messages {
            pieces,
            buf: Vec::new(),
            start: 0,
            done: false,
        }
    }

    async fn next(&mut self) -> Option<std::io::Result<Vec<u8>>> {
        use futures_util::StreamExt;
        loop {
            let rest = &self.buf[self.start..];
            if rest.len() >= 4 {
                let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
                if len > RAFT_BODY_MAX_BYTES {
                    return Some(Err(self.fail(format!("a snapshot message of {len} bytes"))));
                }
                if rest.len() >= 4 + len {
                    let m = rest[4..4 + len].to_vec();
                    self.start += 4 + len;
                    return Some(Ok(m));
                }
            }
            if self.done {
                return (self.start < self.buf.len())
                    .then(|| Err(self.fail("the snapshot stream was cut short".into())));
            }
            // What is left of the pieces so far moves to the front once,
            // before the next piece is added.
            self.buf.drain(..self.start);
            self.start = 0;
            match self.pieces.next().await {
                Some(Ok(piece)) => self.buf.extend_from_slice(&piece),
                Some(Err(e)) => return Some(Err(self.fail(e.to_string()))),
                None => self.done = true,
            }
        }
    }

    /// Ends the stream with an error: every later call returns `None`.
    fn fail(&mut self, reason: String) -> std::io::Error {
        self.done = true;
        self.buf.clear();
        self.start = 0;
        std::io::Error::other(reason)
    }
}

/// Appends `m` with its length prefix.
fn put_message(out: &mut Vec<u8>, m: &[u8]) {
    out.extend_from_slice(
        &u32::try_from(m.len())
            .expect("messages stay small")
            .to_le_bytes(),
    );
    out.extend_from_slice(m);
}

/// How long a replica waits for a peer's `hello`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

/// Makes a client per peer; they share one connection pool.
#[derive(Clone)]
pub(crate) struct Network {
    client: reqwest::Client,
    auth: Arc<str>,
    from: Arc<str>,
    /// The incarnation each peer's answers named.
    learned: Arc<Mutex<BTreeMap<u64, u64>>>,
    /// The incarnation the membership pins for each member, as of now:
    /// openraft keeps a peer's client across membership changes, so a
    /// client reads this rather than the one it was made with.
    pinned: Arc<Mutex<BTreeMap<u64, u64>>>,
}

impl Network {
    pub(crate) fn new(auth: Arc<str>, node_id: u64, api_url: String) -> Network {
        crate::delivery::client::install_crypto_provider();
        let client = reqwest::Client::builder()
            .http1_only()
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true)
            .build()
            .expect("a plain HTTP client builds");
        Network {
            client,
            auth,
            from: format!("{node_id} {api_url}").into(),
            learned: Arc::default(),
            pinned: Arc::default(),
        }
    }

    pub(crate) fn pinned(&self) -> BTreeMap<u64, u64> {
        self.pinned
            .lock()
            .expect("bug: pinned lock poisoned")
            .clone()
    }

    /// The incarnations the membership in force pins (`members.rs`).
    pub(crate) fn set_pinned(&self, pinned: BTreeMap<u64, u64>) {
        let mut now = self.pinned.lock().expect("bug: pinned lock poisoned");
        if *now != pinned {
            *now = pinned;
        }
    }

    /// The incarnation `node`'s answers named, if it answered.
    pub(crate) fn learned(&self, node: u64) -> Option<u64> {
        self.learned
            .lock()
            .expect("bug: learned lock poisoned")
            .get(&node)
            .copied()
    }

    /// Asks the replica at `addr` who it is, as node `target`.
    pub(crate) async fn hello(&self, target: u64, addr: &str) -> Result<Hello, String> {
        let peer = self.client_for(
            target,
            &Peer {
                raft_addr: addr.to_owned(),
                incarnation: 0,
            },
        );
        let option = RPCOption::new(HELLO_TIMEOUT);
        peer.call("hello", &(), &option)
            .await
            .map_err(|e| e.to_string())
    }

    fn client_for(&self, target: u64, node: &Peer) -> PeerClient {
        PeerClient {
            client: self.client.clone(),
            auth: self.auth.clone(),
            from: self.from.clone(),
            learned: self.learned.clone(),
            pinned: self.pinned.clone(),
            base: format!("http://{}", node.raft_addr),
            target,
            incarnation: node.incarnation,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &Peer) -> PeerClient {
        self.client_for(target, node)
    }
}

/// Talks to one peer.
pub(crate) struct PeerClient {
    client: reqwest::Client,
    auth: Arc<str>,
    from: Arc<str>,
    learned: Arc<Mutex<BTreeMap<u64, u64>>>,
    pinned: Arc<Mutex<BTreeMap<u64, u64>>>,
    base: String,
    target: u64,
    /// The incarnation the membership knew the peer by when this client
    /// was made (0: not pinned).
    incarnation: u64,
}

impl PeerClient {
    /// `POST /raft/{path}` to the peer, with the cluster's headers.
    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.client
            .post(format!("{}/raft/{path}", self.base))
            .header(AUTH_HEADER, &*self.auth)
            .header(TARGET_HEADER, self.target.to_string())
            .header(FROM_HEADER, &*self.from)
            .header(INCARNATION_HEADER, self.incarnation())
    }

    /// The incarnation the peer is known by now.
    fn incarnation(&self) -> u64 {
        self.pinned
            .lock()
            .expect("bug: pinned lock poisoned")
            .get(&self.target)
            .copied()
            .unwrap_or(self.incarnation)
    }

    /// Notes the incarnation a successful answer came from.
    fn learn(&self, response: &reqwest::Response) {
        let named = response
            .headers()
            .get(INCARNATION_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(incarnation) = named {
            let mut learned = self.learned.lock().expect("bug: learned lock poisoned");
            if learned.get(&self.target) != Some(&incarnation) {
                learned.insert(self.target, incarnation);
            }
        }
    }

    async fn call<Q: Serialize, A: DeserializeOwned>(
        &self,
        path: &str,
        rpc: &Q,
        option: &RPCOption,
    ) -> Result<A, RPCError<TypeConfig>> {
        let body =
            postcard::to_allocvec(rpc).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let sent = self
            .post(path)
            .timeout(option.hard_ttl())
            .body(body)
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            Err(e) if e.is_connect() => return Err(RPCError::Unreachable(Unreachable::new(&e))),
            Err(e) => return Err(RPCError::Network(NetworkError::new(&e))),
        };
        let status = response.status();
        if status.is_success() {
            self.learn(&response);
        }
        let bytes = response
            .bytes()
            .await
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let e =
                std::io::Error::other(format!("peer {} answered {status}: {text}", self.target));
            return Err(RPCError::Unreachable(Unreachable::new(&e)));
        }
        let result: Result<A, String> =
            postcard::from_bytes(&bytes).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::Network(NetworkError::new(&std::io::Error::other(e))))
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("append", &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("vote", &rpc, &option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("pre-vote", &rpc, &option).await
    }

    /// Streams this replica's checkpoint: a blocking thread reads the
    /// messages from disk into pieces of about 256 KiB, which the request
    /// body sends as they come (bounded memory whatever the spool's size).
    /// No deadline but `cancel`: a large spool takes as long as it takes.
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl std::future::Future<Output = openraft::error::ReplicationClosed>
        + openraft::OptionalSend
        + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let unreachable = |e: &dyn std::fmt::Display| {
            StreamingError::Unreachable(Unreachable::new(&std::io::Error::other(e.to_string())))
        };
        let SnapshotData::Local { engine, seq } = snapshot.snapshot else {
            return Err(unreachable(&"only a replica's own checkpoint is sent"));
        };
        let head = postcard::to_allocvec(&(vote, &snapshot.meta)).map_err(|e| unreachable(&e))?;
        let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
        let target = self.target;
        tokio::task::spawn_blocking(move || {
            let mut piece = Vec::with_capacity(SNAPSHOT_PIECE_BYTES);
            put_message(&mut piece, &head);
            let source = match engine.snapshot_source(seq) {
                Ok(source) => source,
                Err(e) => {
                    let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
                    return;
                }
            };
            tracing::info!(seq, target, "sending a snapshot");
            for m in source {
                match m {
                    Ok(m) => put_message(&mut piece, &m),
                    Err(e) => {
                        let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
                        return;
                    }
                }
                if piece.len() >= SNAPSHOT_PIECE_BYTES {
                    let full =
                        std::mem::replace(&mut piece, Vec::with_capacity(SNAPSHOT_PIECE_BYTES));
                    if tx.blocking_send(Ok(full.into())).is_err() {
                        return;
                    }
                }
            }
            let _ = tx.blocking_send(Ok(piece.into()));
        });
        let body = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|piece| (piece, rx))
        });
        let sent = self
            .post("snapshot")
            .body(reqwest::Body::wrap_stream(body))
            .send();
        let response = tokio::select! {
            response = sent => response.map_err(|e| unreachable(&e))?,
            closed = cancel => return Err(StreamingError::Closed(closed)),
        };
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| unreachable(&e))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes);
            return Err(unreachable(&format!(
                "peer {} answered {status}: {text}",
                self.target
            )));
        }
        let result: Result<SnapshotResponse<TypeConfig>, String> =
            postcard::from_bytes(&bytes).map_err(|e| unreachable(&e))?;
        result.map_err(|e| unreachable(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages come out whole and in order however the body is cut into
    /// pieces; a body cut inside a message is an error, not a message.
    #[tokio::test]
    async fn messages_survive_any_cut_of_the_body() {
        let sent: Vec<Vec<u8>> = (0..200u32)
            .map(|i| vec![i as u8; (i as usize * 37) % 3000])
            .collect();
        let mut body = Vec::new();
        for m in &sent {
            put_message(&mut body, m);
        }
        for piece in [1, 3, 4, 5, 999, 4096, body.len()] {
            let pieces: Vec<Result<Bytes, std::io::Error>> = body
                .chunks(piece)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            let mut messages = Messages::new(futures_util::stream::iter(pieces));
            let mut got = Vec::new();
            while let Some(m) = messages.next().await {
                got.push(m.unwrap());
            }
            assert_eq!(got, sent, "pieces of {piece} bytes");
        }
        let cut: Vec<Result<Bytes, std::io::Error>> =
            vec![Ok(Bytes::copy_from_slice(&body[..body.len() - 1]))];
        let mut messages = Messages::new(futures_util::stream::iter(cut));
        let mut got = Vec::new();
        while let Some(m) = messages.next().await {
            got.push(m);
        }
        assert_eq!(
            got.len(),
            sent.len(),
            "the messages before the cut, then one error"
        );
        assert!(
            got.last().unwrap().is_err(),
            "a message cut short is an error"
        );
    }
}
