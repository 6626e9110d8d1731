//! The replication listener, `cluster.listen` (never the API port):
//! `POST /raft/{append,vote,pre-vote}` with postcard bodies, `POST
//! /raft/snapshot` (a stream of length-prefixed messages: `stream.rs`),
//! and `POST /raft/hello` (who is here: asked by a new replica before it
//! bootstraps, and by the primary before it adds a member).
//!
//! The port faces whatever network the replicas share, so it gives a
//! stranger nothing:
//!
//! - the accept loop is the API's (`listen.rs`): HTTP/1 only, a
//!   header timeout, a cap on connections (more wait in the kernel's
//!   backlog and cost no descriptor here), optionally TLS with client
//!   certificates;
//! - every request is authenticated from its headers before a byte of its
//!   body is read (`auth.rs`), and must be meant for this node and this
//!   incarnation of it (a replica whose spool directory was wiped lost its
//!   log and its vote, and may take part again only once removed and
//!   added back);
//! - bodies are then read within a bound of size and time, and must hash
//!   to what was signed;
//! - a vote or an append whose term no election could have reached is
//!   refused (openraft would store it, and then overflow the term on the
//!   next election);
//! - for the longest election timeout after it starts, a replica grants no
//!   vote: openraft keeps no vote lease across a restart, and a primary
//!   still counts on this replica's last acknowledgement for its leader
//!   lease (`tasks.rs`);
//! - one snapshot is received at a time, and an upload that stops making
//!   progress is dropped.
//!
//! Every answer is signed and names this node's incarnation and API URL,
//! which is how the primary learns them (`members.rs` pins them).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use openraft::async_runtime::WatchReceiver;
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use super::Raft;
use super::auth::{
    API_HEADER, AUTH_HEADER, AuthError, ClusterKey, FROM_HEADER, INCARNATION_HEADER, Nonces,
    RequestLine, StreamMac, TARGET_HEADER, Verified,
};
use super::store::{Snapshot, SnapshotData, SnapshotMeta};
use super::stream::Messages;
use super::types::{TypeConfig, Vote, WireAnswer, seq_of};
use crate::engine::replicated::{RaftLog, StreamError};

/// Bodies of votes, pre-votes and hellos are a few hundred bytes.
const SMALL_BODY_BYTES_MAX: usize = 64 << 10;
/// How long a request body may take to arrive: an append is due within a
/// heartbeat, so a body slower than this is not a peer's.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A snapshot upload that sends nothing for this long is dropped (the
/// primary sends a piece every few milliseconds while it reads its disk).
const SNAPSHOT_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a second upload waits for the first to finish.
const SNAPSHOT_QUEUE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a replica receiving a snapshot logs how far it got.
const SNAPSHOT_PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Messages buffered between the network and the thread writing packs.
const SNAPSHOT_MESSAGES_BUFFERED: usize = 64;
/// A term above this is refused outright: it is out of reach of any
/// election (one a millisecond for eight thousand years), and far enough
/// from `u64::MAX` that no `term + 1` overflows.
pub(crate) const TERM_CEILING: u64 = 1 << 48;
/// The most a request's term may exceed this replica's: an election adds
/// one, and pre-vote keeps a cut-off replica from counting up alone.
const TERM_JUMP_MAX: u64 = 1 << 20;

#[derive(Clone)]
struct ServerState {
    raft: Raft,
    log: RaftLog,
    key: ClusterKey,
    nonces: Arc<Nonces>,
    node_id: u64,
    incarnation: u64,
    api_url: Arc<str>,
    /// One snapshot received at a time.
    receiving: Arc<tokio::sync::Mutex<()>>,
    /// What `GET /v1/cluster` says of catching up by snapshot.
    progress: Arc<super::SnapshotProgress>,
    /// No vote is granted before this instant (see the module's docs).
    votes_from: Instant,
    /// The largest append body a peer sends.
    append_bytes_max: usize,
    /// Refusals of another level are logged once a minute, not per
    /// heartbeat.
    level_warned: Arc<Throttle>,
    /// Refused requests, logged once per sender per interval.
    refusals: Arc<RefusalLog>,
    /// The clock skew refusals found (`GET /v1/cluster`, `/readyz`).
    clocks: Arc<super::status::PeerClocks>,
}

/// How often refused requests from one sender are logged.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);
/// Senders a [`RefusalLog`] tells apart; past it, it starts afresh (made-up
/// sender ids cannot grow it).
const REFUSAL_SENDERS_MAX: usize = 1024;

/// Refused replication requests, logged at most once per sender (`0`: one
/// that named none, or signed nothing) every [`REFUSAL_LOG_EVERY`], with how
/// many there were: a peer refused on every heartbeat, or a client without
/// the secret, wrote thousands of lines a second.
#[derive(Default)]
pub(crate) struct RefusalLog(
    // Per sender: when its last line was logged, and the refusals since.
    std::sync::Mutex<std::collections::HashMap<u64, (Option<Instant>, u64)>>,
);

impl RefusalLog {
    pub(crate) fn note(&self, from: u64, reason: &str) {
        let mut seen = self.0.lock().expect("bug: refusal log poisoned");
        if seen.len() >= REFUSAL_SENDERS_MAX && !seen.contains_key(&from) {
            seen.clear();
        }
        let now = Instant::now();
        let (last, since) = seen.entry(from).or_insert((None, 0));
        *since += 1;
        if last.is_none_or(|at| now.saturating_duration_since(at) >= REFUSAL_LOG_EVERY) {
            tracing::warn!(
                from,
                refused = *since,
                reason,
                "refused replication requests (one line per sender every {} s)",
                REFUSAL_LOG_EVERY.as_secs()
            );
            *last = Some(now);
            *since = 0;
        }
    }
}

/// At most one of something per period.
#[derive(Default)]
struct Throttle(std::sync::Mutex<Option<Instant>>);

impl Throttle {
    /// Whether this is the first time in `period`.
    fn first_in(&self, period: Duration) -> bool {
        let mut last = self.0.lock().expect("bug: throttle lock poisoned");
        if last.is_some_and(|at| at.elapsed() < period) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }
}

/// What the listener needs to know about this replica.
pub(crate) struct ServerConfig {
    pub node_id: u64,
    pub incarnation: u64,
    pub api_url: String,
    /// The longest election timeout: no vote before it passed.
    pub election_timeout: Duration,
    pub append_bytes_max: usize,
    pub progress: Arc<super::SnapshotProgress>,
    pub clocks: Arc<super::status::PeerClocks>,
}

/// What `POST /raft/hello` answers.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub(crate) struct Hello {
    pub node_id: u64,
    pub incarnation: u64,
    /// It holds a membership: it bootstrapped, or a primary reached it.
    pub initialized: bool,
    pub api_url: String,
}

/// The replication listener's routes.
pub(crate) fn router(raft: Raft, log: RaftLog, key: ClusterKey, config: ServerConfig) -> Router {
    let state = ServerState {
        raft,
        log,
        key,
        nonces: Arc::default(),
        node_id: config.node_id,
        incarnation: config.incarnation,
        api_url: config.api_url.into(),
        receiving: Arc::default(),
        progress: config.progress,
        votes_from: Instant::now() + config.election_timeout,
        append_bytes_max: config.append_bytes_max,
        level_warned: Arc::default(),
        refusals: Arc::default(),
        clocks: config.clocks,
    };
    Router::new()
        .route("/raft/hello", post(hello))
        .route("/raft/append", post(append))
        .route("/raft/vote", post(vote))
        .route("/raft/pre-vote", post(pre_vote))
        .route("/raft/snapshot", post(snapshot))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ))
        .with_state(state)
}

fn refusal(status: StatusCode, reason: impl Into<String>) -> Response {
    let level = [(super::level::LEVEL_HEADER, super::level::own().to_string())];
    (status, level, reason.into()).into_response()
}

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.parse().ok()
}

/// Checks a request from its headers alone (the body is not read yet):
/// signed with the cluster's key, fresh, never seen, for this node and
/// this incarnation. The checked fields go on as a request extension.
async fn authenticate(State(s): State<ServerState>, mut request: Request, next: Next) -> Response {
    let headers = request.headers();
    let (from, target, meant) = (
        header_u64(headers, FROM_HEADER).unwrap_or(0),
        header_u64(headers, TARGET_HEADER).unwrap_or(0),
        header_u64(headers, INCARNATION_HEADER).unwrap_or(0),
    );
    let line = RequestLine {
        method: request.method().as_str(),
        path: request.uri().path(),
        from,
        target,
        incarnation: meant,
    };
    let value = headers
        .get(AUTH_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let verified = match s.key.verify(&line, value, &s.nonces) {
        Ok(verified) => verified,
        Err(e) => {
            s.refusals.note(from, &e.to_string());
            let text = format!("cluster authentication failed: {e}");
            if let AuthError::Stale { skew_ms, verified } = e {
                // Signed by the secret, but from a clock too far from
                // this one: said in an answer the sender can trust.
                s.clocks.skewed(from, skew_ms);
                return answer(&s, &verified, StatusCode::UNAUTHORIZED, text.into_bytes());
            }
            return refusal(StatusCode::UNAUTHORIZED, text);
        }
    };
    if target != s.node_id {
        return refusal(
            StatusCode::MISDIRECTED_REQUEST,
            format!("this is node {}, not {target}", s.node_id),
        );
    }
    if let Some(why) = super::level::mismatch(headers) {
        if s.level_warned.first_in(Duration::from_secs(60)) {
            tracing::warn!(from, reason = %why, "refused replication from another level");
        }
        return refusal(StatusCode::CONFLICT, why);
    }
    if meant != 0 && meant != s.incarnation {
        tracing::warn!(
            meant,
            incarnation = s.incarnation,
            "refused replication meant for an earlier incarnation of this node: \
             its spool directory is new; remove this node and add it back"
        );
        return refusal(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "node {} has a new spool directory (incarnation {:x}, not {meant:x}): \
                 remove it from the cluster and add it back",
                s.node_id, s.incarnation
            ),
        );
    }
    request.extensions_mut().insert(verified);
    next.run(request).await
}

/// A signed answer: `status` and `body`, with this node's incarnation and
/// API URL.
fn answer(s: &ServerState, v: &Verified, status: StatusCode, body: Vec<u8>) -> Response {
    let mac = s
        .key
        .sign_answer(&v.nonce, status.as_u16(), s.incarnation, &s.api_url, &body);
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(INCARNATION_HEADER, HeaderValue::from(s.incarnation));
    headers.insert(
        super::level::LEVEL_HEADER,
        HeaderValue::from(super::level::own()),
    );
    if let Ok(url) = HeaderValue::from_str(&s.api_url) {
        headers.insert(API_HEADER, url);
    }
    if let Ok(mac) = HeaderValue::from_str(&mac) {
        headers.insert(AUTH_HEADER, mac);
    }
    response
}

/// A Raft answer (or the reason there is none) as a signed postcard body.
fn reply<T: Serialize, E: std::fmt::Display>(
    s: &ServerState,
    v: &Verified,
    result: Result<T, E>,
) -> Response {
    let result: WireAnswer<T> = result.map_err(|e| e.to_string());
    match postcard::to_allocvec(&result) {
        Ok(bytes) => answer(s, v, StatusCode::OK, bytes),
        Err(e) => answer(
            s,
            v,
            StatusCode::INTERNAL_SERVER_ERROR,
            e.to_string().into_bytes(),
        ),
    }
}

/// Reads a whole body: at most `limit` bytes, within the read timeout,
/// hashing to what the signature says.
async fn read_body(body: Body, limit: usize, v: &Verified) -> Result<Bytes, (StatusCode, String)> {
    let Some(expected) = v.body_sha256 else {
        return Err((StatusCode::BAD_REQUEST, "only a snapshot streams".into()));
    };
    let limited = http_body_util::Limited::new(body, limit);
    let bytes = match tokio::time::timeout(BODY_READ_TIMEOUT, limited.collect()).await {
        Err(_) => {
            return Err((
                StatusCode::REQUEST_TIMEOUT,
                "the body came too slowly".into(),
            ));
        }
        Ok(Err(e)) => {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("unreadable body (at most {limit} bytes): {e}"),
            ));
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    if <[u8; 32]>::from(Sha256::digest(&bytes)) != expected {
        return Err((
            StatusCode::BAD_REQUEST,
            "the body is not the one signed".into(),
        ));
    }
    Ok(bytes)
}

/// A Raft message from its body.
fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, (StatusCode, String)> {
    postcard::from_bytes(body).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            format!("undecodable Raft message: {e}"),
        )
    })
}

/// Refuses a term no election could have reached, given this replica's.
fn plausible(s: &ServerState, term: u64, what: &str) -> Result<(), (StatusCode, String)> {
    let local = s.raft.metrics().borrow_watched().current_term;
    if term >= TERM_CEILING || term > local.saturating_add(TERM_JUMP_MAX) {
        tracing::warn!(
            term,
            local,
            what,
            "refused a Raft message with an implausible term"
        );
        return Err((
            StatusCode::BAD_REQUEST,
            format!(
                "{what} for term {term}, which no election reaches (this replica is in term {local})"
            ),
        ));
    }
    Ok(())
}

/// One Raft call: its body read and checked, decoded, handed to openraft,
/// answered; or the refusal.
async fn serve<Q, A, E, F>(
    s: ServerState,
    v: Verified,
    body: Body,
    limit: usize,
    call: F,
) -> Response
where
    Q: DeserializeOwned,
    A: Serialize,
    E: std::fmt::Display,
    F: AsyncFnOnce(&ServerState, Q) -> Result<Result<A, E>, (StatusCode, String)>,
{
    let result = async {
        let bytes = read_body(body, limit, &v).await?;
        call(&s, decode(&bytes)?).await
    }
    .await;
    match result {
        Ok(result) => reply(&s, &v, result),
        Err((status, reason)) => answer(&s, &v, status, reason.into_bytes()),
    }
}

type Extension = axum::Extension<Verified>;

async fn hello(
    State(s): State<ServerState>,
    axum::Extension(v): Extension,
    body: Body,
) -> Response {
    if let Err((status, reason)) = read_body(body, SMALL_BODY_BYTES_MAX, &v).await {
        return answer(&s, &v, status, reason.into_bytes());
    }
    let initialized = s.raft.is_initialized().await.unwrap_or(false);
    let hello = Hello {
        node_id: s.node_id,
        incarnation: s.incarnation,
        initialized,
        api_url: s.api_url.to_string(),
    };
    reply(&s, &v, Ok::<_, String>(hello))
}

async fn append(
    State(s): State<ServerState>,
    axum::Extension(v): Extension,
    body: Body,
) -> Response {
    let limit = s.append_bytes_max;
    serve(
        s,
        v,
        body,
        limit,
        async |s: &ServerState, rpc: AppendEntriesRequest<TypeConfig>| {
            let term = rpc.vote.leader_id().term;
            plausible(s, term, "an append")?;
            let later = |t: u64| t > term;
            if rpc
                .prev_log_id
                .is_some_and(|l| later(l.committed_leader_id().term))
                || rpc
                    .entries
                    .iter()
                    .any(|e| later(e.log_id.committed_leader_id().term))
            {
                return Err((
                    StatusCode::BAD_REQUEST,
                    format!("an append of term {term} carries entries of later terms"),
                ));
            }
            Ok(s.raft.append_entries(rpc).await)
        },
    )
    .await
}

/// Refuses a vote within the quiet time after this replica started.
fn quiet(s: &ServerState) -> Result<(), (StatusCode, String)> {
    let now = Instant::now();
    if now < s.votes_from {
        return Err((
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "started {} ms too recently to vote (a primary may still count on its last answer)",
                (s.votes_from - now).as_millis()
            ),
        ));
    }
    Ok(())
}

async fn vote(State(s): State<ServerState>, axum::Extension(v): Extension, body: Body) -> Response {
    serve(
        s,
        v,
        body,
        SMALL_BODY_BYTES_MAX,
        async |s: &ServerState, rpc: VoteRequest<TypeConfig>| {
            plausible(s, rpc.vote.leader_id().term, "a vote")?;
            quiet(s)?;
            Ok(s.raft.vote(rpc).await)
        },
    )
    .await
}

async fn pre_vote(
    State(s): State<ServerState>,
    axum::Extension(v): Extension,
    body: Body,
) -> Response {
    serve(
        s,
        v,
        body,
        SMALL_BODY_BYTES_MAX,
        async |s: &ServerState, rpc: VoteRequest<TypeConfig>| {
            plausible(s, rpc.vote.leader_id().term, "a pre-vote")?;
            quiet(s)?;
            Ok(s.raft.pre_vote(rpc).await)
        },
    )
    .await
}

/// Receives a snapshot: the messages are handed, as they arrive, to the
/// engine on a blocking thread, which writes the records into packs; the
/// last message is the stream's MAC, checked before anything is installed;
/// then openraft installs it.
async fn snapshot(
    State(s): State<ServerState>,
    axum::Extension(v): Extension,
    body: Body,
) -> Response {
    if v.body_sha256.is_some() {
        return answer(
            &s,
            &v,
            StatusCode::BAD_REQUEST,
            b"a snapshot streams".to_vec(),
        );
    }
    let Ok(_one_at_a_time) = tokio::time::timeout(SNAPSHOT_QUEUE_TIMEOUT, s.receiving.lock()).await
    else {
        return answer(
            &s,
            &v,
            StatusCode::SERVICE_UNAVAILABLE,
            b"another snapshot is being received".to_vec(),
        );
    };
    match receive(&s, &v, body).await {
        Ok((vote, snapshot)) => {
            let installed = s.raft.install_full_snapshot(vote, snapshot).await;
            if installed.is_ok() {
                crate::metrics::record_snapshot_installed();
                s.progress.installed.fetch_add(1, Ordering::Relaxed);
            }
            reply(&s, &v, installed)
        }
        Err((status, reason)) => {
            tracing::warn!(%reason, "a snapshot from the primary failed");
            answer(&s, &v, status, reason.into_bytes())
        }
    }
}

/// The next message of an upload, or the reason it ended: none for
/// [`SNAPSHOT_IDLE_TIMEOUT`] is a stalled upload.
async fn next_message<S, E>(
    messages: &mut Messages<S>,
) -> Result<Option<Vec<u8>>, (StatusCode, String)>
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    match tokio::time::timeout(SNAPSHOT_IDLE_TIMEOUT, messages.next()).await {
        Err(_) => Err((
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the upload stalled for {} s",
                SNAPSHOT_IDLE_TIMEOUT.as_secs()
            ),
        )),
        Ok(None) => Ok(None),
        Ok(Some(Err(e))) => Err((StatusCode::BAD_REQUEST, e.to_string())),
        Ok(Some(Ok(m))) => Ok(Some(m)),
    }
}

/// What [`pass_on`] has passed to the snapshot's writer so far, and the
/// message it holds back.
#[derive(Default)]
struct Passed {
    bytes: u64,
    count: u64,
    held: Option<Vec<u8>>,
}

/// Passes each message of a snapshot's upload on to its writer once the
/// next one arrived: the last one is the stream's MAC, not a message of the
/// snapshot, and stays in `passed.held`. Logs progress every
/// [`SNAPSHOT_PROGRESS_EVERY`]. Ends when the upload does, or early if the
/// writer stopped taking messages (its own error says why).
async fn pass_on<S, E>(
    s: &ServerState,
    seq: u64,
    started: Instant,
    messages: &mut Messages<S>,
    mac: &mut StreamMac,
    tx: &tokio::sync::mpsc::Sender<Result<Vec<u8>, StreamError>>,
    passed: &mut Passed,
) -> Result<(), (StatusCode, String)>
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut reported = Instant::now();
    while let Some(m) = next_message(messages).await? {
        let Some(previous) = passed.held.replace(m) else {
            continue;
        };
        let len = previous.len() as u64;
        passed.bytes += len;
        passed.count += 1;
        crate::metrics::record_snapshot_bytes(len);
        s.progress
            .received_bytes
            .store(passed.bytes, Ordering::Relaxed);
        if reported.elapsed() >= SNAPSHOT_PROGRESS_EVERY {
            reported = Instant::now();
            tracing::info!(
                seq,
                mib = passed.bytes >> 20,
                messages = passed.count,
                seconds = started.elapsed().as_secs(),
                "catching up by snapshot: received so far"
            );
        }
        mac.update(&previous);
        if tx.send(Ok(previous)).await.is_err() {
            break;
        }
    }
    Ok(())
}

async fn receive(
    s: &ServerState,
    v: &Verified,
    body: Body,
) -> Result<(Vote, Snapshot), (StatusCode, String)> {
    let mut mac = s.key.stream_mac(&v.nonce);
    let mut messages = Messages::new(StreamExt::boxed(body.into_data_stream()));
    let head = next_message(&mut messages)
        .await?
        .ok_or((StatusCode::BAD_REQUEST, "an empty snapshot".into()))?;
    mac.update(&head);
    let (vote, meta): (Vote, SnapshotMeta) = decode(&head)?;
    plausible(s, vote.leader_id().term, "a snapshot")?;
    let last = meta
        .last_log_id
        .ok_or((StatusCode::BAD_REQUEST, "a snapshot of nothing".into()))?;
    let (seq, term) = (seq_of(last.index()), last.committed_leader_id().term);
    tracing::info!(seq, term, "receiving a snapshot from the primary");
    let started = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::channel(SNAPSHOT_MESSAGES_BUFFERED);
    let log = s.log.clone();
    let writing = tokio::task::spawn_blocking(move || {
        let arriving = std::iter::from_fn(|| rx.blocking_recv());
        log.receive_snapshot(seq, term, arriving)
    });
    let _receiving = crate::metrics::SnapshotReceiving::start();
    let _progress = s.progress.start();
    let mut passed = Passed::default();
    let ended = pass_on(s, seq, started, &mut messages, &mut mac, &tx, &mut passed).await;
    let ended = ended.and_then(|()| match passed.held.take() {
        Some(last) if mac.verify(&last) => Ok(()),
        _ => Err((
            StatusCode::UNAUTHORIZED,
            "the snapshot stream does not end with its signature".into(),
        )),
    });
    if let Err((_, reason)) = &ended {
        let _ = tx.send(Err(StreamError::Broken(reason.clone()))).await;
    }
    drop(tx);
    let staged = match writing.await {
        Ok(Ok(staged)) => staged,
        Ok(Err(e)) => {
            ended?;
            return Err((StatusCode::BAD_REQUEST, e.to_string()));
        }
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    ended?;
    tracing::info!(
        seq,
        bytes = passed.bytes,
        seconds = started.elapsed().as_secs_f64(),
        "received a snapshot; installing it"
    );
    Ok((
        vote,
        Snapshot {
            meta,
            snapshot: SnapshotData::Received(Box::new(staged)),
        },
    ))
}
