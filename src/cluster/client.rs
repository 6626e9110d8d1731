//! The replication client: openraft's `RaftNetworkFactory` and
//! `RaftNetworkV2` over HTTP/1 to each peer's replication listener
//! (`server.rs`). Requests are signed and answers checked (`auth.rs`); an
//! answer whose signature fails is no answer. A peer's incarnation and
//! API URL are learnt only from its signed answers, and the membership is
//! where they are kept (`members.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use openraft::error::{NetworkError, RPCError, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::auth::{
    API_HEADER, AUTH_HEADER, ClusterKey, FROM_HEADER, INCARNATION_HEADER, RequestLine, StreamMac,
    TARGET_HEADER,
};
use super::server::Hello;
use super::store::{Snapshot, SnapshotData};
use super::stream::put_message;
use super::types::{Peer, TypeConfig, Vote, WireAnswer};
use crate::engine::replicated::RaftLog;

/// How long a replica waits for a peer's `hello`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Bytes gathered into one piece of a streamed snapshot body.
const SNAPSHOT_PIECE_BYTES: usize = 256 << 10;

/// What a peer's signed answers said about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Learned {
    pub incarnation: u64,
    pub api_url: String,
}

/// Makes a client per peer; they share one connection pool.
#[derive(Clone)]
pub(crate) struct Network {
    client: reqwest::Client,
    /// `http` or `https` (`cluster.tls`).
    scheme: &'static str,
    key: ClusterKey,
    node_id: u64,
    /// What each peer's signed answers said.
    learned: Arc<Mutex<BTreeMap<u64, Learned>>>,
    /// The incarnation the membership pins for each member, as of now:
    /// openraft keeps a peer's client across membership changes, so a
    /// client reads this rather than the one it was made with.
    pinned: Arc<Mutex<BTreeMap<u64, u64>>>,
    /// The peers whose last answer said this replica's level
    /// (`level.rs`): only these are sent records or a snapshot. A build
    /// before levels ignores the header, so the level must be heard before
    /// anything it cannot read is sent, not only refused after; a failed
    /// request forgets it (the peer may come back as another build).
    same_level: Arc<Mutex<BTreeSet<u64>>>,
    /// Clock skew with peers, as their signed refusals said it.
    clocks: Arc<super::status::PeerClocks>,
}

impl Network {
    /// `client`: plain HTTP/1, or with the cluster's TLS (`src/tls.rs`).
    pub(crate) fn new(
        client: reqwest::Client,
        tls: bool,
        key: ClusterKey,
        node_id: u64,
    ) -> Network {
        Network {
            client,
            scheme: if tls { "https" } else { "http" },
            key,
            node_id,
            learned: Arc::default(),
            pinned: Arc::default(),
            same_level: Arc::default(),
            clocks: Arc::default(),
        }
    }

    /// Clock skew with peers, shared with the replication listener.
    pub(crate) fn clocks(&self) -> Arc<super::status::PeerClocks> {
        self.clocks.clone()
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

    /// What `node`'s signed answers said, if it answered.
    pub(crate) fn learned(&self, node: u64) -> Option<Learned> {
        self.learned
            .lock()
            .expect("bug: learned lock poisoned")
            .get(&node)
            .cloned()
    }

    /// Asks the replica at `addr` who it is, as node `target`.
    pub(crate) async fn hello(
        &self,
        target: u64,
        addr: &str,
    ) -> Result<Hello, RPCError<TypeConfig>> {
        let peer = self.client_for(
            target,
            &Peer {
                raft_addr: addr.to_owned(),
                ..Peer::default()
            },
        );
        let option = RPCOption::new(HELLO_TIMEOUT);
        peer.call("hello", &(), &option).await
    }

    fn client_for(&self, target: u64, node: &Peer) -> PeerClient {
        PeerClient {
            network: self.clone(),
            base: format!("{}://{}", self.scheme, node.raft_addr),
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
    network: Network,
    base: String,
    target: u64,
    /// The incarnation the membership knew the peer by when this client
    /// was made (0: not pinned).
    incarnation: u64,
}

/// How long a request of `len` bytes may take: openraft's deadline (a
/// heartbeat interval for an append), plus time for the bytes themselves
/// at a slow 4 MB/s. A large append (up to about 4 MiB of records,
/// `store.rs`) is signed, sent, checked and written within a heartbeat on
/// a fast machine but not on a loaded one, and one that always times out
/// is sent again, identical, for ever: the follower never catches up.
fn ttl(option: &RPCOption, len: usize) -> Duration {
    option.hard_ttl() + Duration::from_micros(len as u64 / 4)
}

/// Why an answer is not one: the peer is taken as unreachable (openraft
/// backs off).
fn unreachable(e: impl std::fmt::Display) -> Unreachable<TypeConfig> {
    Unreachable::new(&std::io::Error::other(e.to_string()))
}

impl PeerClient {
    /// `POST /raft/{path}`, signed (`body`: `None` for a stream); the nonce
    /// the answer must be signed for.
    fn post(&self, path: &str, body: Option<&[u8]>) -> (reqwest::RequestBuilder, [u8; 16]) {
        let path = format!("/raft/{path}");
        let incarnation = self.incarnation();
        let line = RequestLine {
            method: "POST",
            path: &path,
            from: self.network.node_id,
            target: self.target,
            incarnation,
        };
        let (auth, nonce) = self.network.key.sign(&line, body);
        let request = self
            .network
            .client
            .post(format!("{}{path}", self.base))
            .header(AUTH_HEADER, auth)
            .header(TARGET_HEADER, self.target.to_string())
            .header(FROM_HEADER, self.network.node_id.to_string())
            .header(INCARNATION_HEADER, incarnation)
            .header(super::level::LEVEL_HEADER, super::level::own());
        (request, nonce)
    }

    /// The incarnation the peer is known by now.
    fn incarnation(&self) -> u64 {
        self.network
            .pinned
            .lock()
            .expect("bug: pinned lock poisoned")
            .get(&self.target)
            .copied()
            .unwrap_or(self.incarnation)
    }

    /// Reads an answer and checks its signature: its body if it holds, and
    /// what it says of the peer is noted.
    async fn checked(
        &self,
        response: reqwest::Response,
        nonce: &[u8; 16],
    ) -> Result<(reqwest::StatusCode, Bytes), Unreachable<TypeConfig>> {
        let status = response.status();
        let headers = response.headers().clone();
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let (mac, incarnation, api_url) = (
            header(AUTH_HEADER),
            header(INCARNATION_HEADER).and_then(|v| v.parse::<u64>().ok()),
            header(API_HEADER).unwrap_or_default(),
        );
        let level = super::level::mismatch(&headers);
        self.heard_level(level.is_none());
        let bytes = response.bytes().await.map_err(unreachable)?;
        // What an unsigned answer said is not passed on: `POST
        // /v1/cluster/members` would let a key holder read any address.
        let (Some(mac), Some(incarnation)) = (mac, incarnation) else {
            return Err(unreachable(format!(
                "peer {} answered without the cluster's signature: it is not a spoold \
                 that holds this cluster's secret",
                self.target
            )));
        };
        if let Some(why) = level {
            return Err(unreachable(format!("peer {}: {why}", self.target)));
        }
        let key = &self.network.key;
        if !key.verify_answer(nonce, status.as_u16(), (incarnation, api_url), &bytes, mac) {
            return Err(unreachable(format!(
                "peer {}'s answer is not signed with the cluster's secret",
                self.target
            )));
        }
        let mut known = self
            .network
            .learned
            .lock()
            .expect("bug: learned lock poisoned");
        let same = known
            .get(&self.target)
            .is_some_and(|l| l.incarnation == incarnation && l.api_url == api_url);
        if !same {
            let learned = Learned {
                incarnation,
                api_url: api_url.to_owned(),
            };
            known.insert(self.target, learned);
        }
        drop(known);
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            if let Some(skew_ms) = super::auth::skew_in(&text) {
                self.network.clocks.skewed(self.target, skew_ms);
            }
            return Err(unreachable(format!(
                "peer {} answered {status}: {text}",
                self.target
            )));
        }
        Ok((status, bytes))
    }

    /// Notes whether the peer's last answer said this replica's level.
    fn heard_level(&self, same: bool) {
        let mut peers = self
            .network
            .same_level
            .lock()
            .expect("bug: level lock poisoned");
        if same {
            peers.insert(self.target);
        } else {
            peers.remove(&self.target);
        }
    }

    /// Before records or a snapshot go to the peer: unless its last answer
    /// said this replica's level, a `hello` (which carries nothing a build
    /// could misread) must say it first.
    async fn same_level_first(&self, option: &RPCOption) -> Result<(), Unreachable<TypeConfig>> {
        let known = self
            .network
            .same_level
            .lock()
            .expect("bug: level lock poisoned")
            .contains(&self.target);
        if known {
            return Ok(());
        }
        match self.call::<_, Hello>("hello", &(), option).await {
            Ok(_) => Ok(()),
            Err(RPCError::Unreachable(e)) => Err(e),
            Err(e) => Err(unreachable(e)),
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
        let (request, nonce) = self.post(path, Some(&body));
        let sent = request
            .timeout(ttl(option, body.len()))
            .body(body)
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            Err(e) => {
                self.heard_level(false);
                return Err(if e.is_connect() {
                    RPCError::Unreachable(Unreachable::new(&e))
                } else {
                    RPCError::Network(NetworkError::new(&e))
                });
            }
        };
        let (_, bytes) = self
            .checked(response, &nonce)
            .await
            .map_err(RPCError::Unreachable)?;
        let result: WireAnswer<A> =
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
        if !rpc.entries.is_empty() {
            self.same_level_first(&option)
                .await
                .map_err(RPCError::Unreachable)?;
        }
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
    /// body sends as they come (bounded memory whatever the spool's size),
    /// and ends the stream with its MAC. No deadline but `cancel`: a large
    /// spool takes as long as it takes (the receiver drops an upload that
    /// stalls).
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl std::future::Future<Output = openraft::error::ReplicationClosed>
        + openraft::OptionalSend
        + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let failed = |e: &dyn std::fmt::Display| StreamingError::Unreachable(unreachable(e));
        let SnapshotData::Local { log, seq } = snapshot.snapshot else {
            return Err(failed(&"only a replica's own checkpoint is sent"));
        };
        self.same_level_first(&RPCOption::new(HELLO_TIMEOUT))
            .await
            .map_err(StreamingError::Unreachable)?;
        let head = postcard::to_allocvec(&(vote, &snapshot.meta)).map_err(|e| failed(&e))?;
        let (request, nonce) = self.post("snapshot", None);
        let mac = self.network.key.stream_mac(&nonce);
        let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
        let target = self.target;
        tokio::task::spawn_blocking(move || stream_checkpoint(&log, seq, target, &head, mac, &tx));
        let body = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|piece| (piece, rx))
        });
        let sent = request.body(reqwest::Body::wrap_stream(body)).send();
        let response = tokio::select! {
            response = sent => response.map_err(|e| failed(&e))?,
            closed = cancel => return Err(StreamingError::Closed(closed)),
        };
        let (_, bytes) = self
            .checked(response, &nonce)
            .await
            .map_err(StreamingError::Unreachable)?;
        let result: WireAnswer<SnapshotResponse<TypeConfig>> =
            postcard::from_bytes(&bytes).map_err(|e| failed(&e))?;
        result.map_err(|e| failed(&e))
    }
}

/// Reads checkpoint `seq` of `log` and sends it to `tx` as the snapshot
/// stream's body, in pieces of [`SNAPSHOT_PIECE_BYTES`]: the `head`
/// message, every message of the checkpoint, and the stream's MAC over
/// them. Runs on the blocking pool (it reads files). A read error ends the
/// body with that error; a closed body ends it quietly.
fn stream_checkpoint(
    log: &RaftLog,
    seq: u64,
    target: u64,
    head: &[u8],
    mut mac: StreamMac,
    tx: &tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
) {
    let failed = |e: &dyn std::fmt::Display| {
        let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
    };
    let mut piece = Vec::with_capacity(SNAPSHOT_PIECE_BYTES);
    mac.update(head);
    put_message(&mut piece, head);
    let source = match log.snapshot_source(seq) {
        Ok(source) => source,
        Err(e) => return failed(&e),
    };
    tracing::info!(seq, target, "sending a snapshot");
    for m in source {
        match m {
            Ok(m) => {
                mac.update(&m);
                put_message(&mut piece, &m);
            }
            Err(e) => return failed(&e),
        }
        if piece.len() >= SNAPSHOT_PIECE_BYTES {
            let full = std::mem::replace(&mut piece, Vec::with_capacity(SNAPSHOT_PIECE_BYTES));
            if tx.blocking_send(Ok(full.into())).is_err() {
                return;
            }
        }
    }
    put_message(&mut piece, &mac.finish());
    let _ = tx.blocking_send(Ok(piece.into()));
}
