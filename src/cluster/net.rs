//! Replication traffic between replicas, on `cluster.listen` (never the
//! API port): `POST /raft/{append,vote,pre-vote}` with postcard bodies.
//!
//! Every request carries a proof of the cluster secret (an HMAC of a fixed
//! label under it, so the secret itself never crosses the network) and the
//! node id it is meant for; a request without the proof is refused and
//! logged, one meant for another node is refused (a peer that points at
//! the wrong address must not vote here).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
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
use super::types::{Peer, TypeConfig, Vote};

const AUTH_HEADER: &str = "spooler-cluster-auth";
const TARGET_HEADER: &str = "spooler-cluster-target";
/// `<node id> <api url>` of the sender: how followers learn where the
/// primary's API is (a leader sends to every follower each heartbeat).
const FROM_HEADER: &str = "spooler-cluster-from";
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
    node_id: u64,
    auth: Arc<str>,
    api_urls: Arc<Mutex<BTreeMap<u64, String>>>,
}

/// The replication listener's routes.
pub(crate) fn router(
    raft: Raft,
    node_id: u64,
    auth: Arc<str>,
    api_urls: Arc<Mutex<BTreeMap<u64, String>>>,
) -> Router {
    let state = ServerState {
        raft,
        node_id,
        auth,
        api_urls,
    };
    Router::new()
        .route("/raft/append", post(append))
        .route("/raft/vote", post(vote))
        .route("/raft/pre-vote", post(pre_vote))
        .layer(axum::extract::DefaultBodyLimit::max(RAFT_BODY_MAX_BYTES))
        .with_state(state)
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

/// Makes a client per peer; they share one connection pool.
#[derive(Clone)]
pub(crate) struct Network {
    client: reqwest::Client,
    auth: Arc<str>,
    from: Arc<str>,
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
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &Peer) -> PeerClient {
        PeerClient {
            client: self.client.clone(),
            auth: self.auth.clone(),
            from: self.from.clone(),
            base: format!("http://{}", node.raft_addr),
            target,
        }
    }
}

/// Talks to one peer.
pub(crate) struct PeerClient {
    client: reqwest::Client,
    auth: Arc<str>,
    from: Arc<str>,
    base: String,
    target: u64,
}

impl PeerClient {
    async fn call<Q: Serialize, A: DeserializeOwned>(
        &self,
        path: &str,
        rpc: &Q,
        option: &RPCOption,
    ) -> Result<A, RPCError<TypeConfig>> {
        let body =
            postcard::to_allocvec(rpc).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let sent = self
            .client
            .post(format!("{}/raft/{path}", self.base))
            .header(AUTH_HEADER, &*self.auth)
            .header(TARGET_HEADER, self.target.to_string())
            .header(FROM_HEADER, &*self.from)
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
    type SnapshotData = ();

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

    async fn full_snapshot(
        &mut self,
        _vote: Vote,
        _snapshot: openraft::alias::SnapshotOf<TypeConfig, ()>,
        _cancel: impl std::future::Future<Output = openraft::error::ReplicationClosed>
        + openraft::OptionalSend
        + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let e =
            std::io::Error::other("snapshots are not sent yet: every replica keeps the whole log");
        Err(StreamingError::Unreachable(Unreachable::new(&e)))
    }
}
