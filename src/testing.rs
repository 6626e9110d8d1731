//! Internals that the crate's integration tests, benchmarks and fuzz
//! targets drive directly: the simulated file system, the journal's file
//! format and frame walker, the record codec, and pieces of the HTTP layer
//! that have properties of their own. Not a stable API: it moves with the
//! code it exposes.
//!
//! Only built with the `testing` feature (and for unit tests): the crate's
//! dev-dependency on itself turns it on for tests, benchmarks and
//! examples, `fuzz/Cargo.toml` asks for it, and the release binary is
//! built without it.

pub use crate::api::LONG_POLLS_MAX;
pub use crate::api::forward::resolve_path;
pub use crate::delivery::target::Destination;
pub use crate::engine::rebuild::repair;
pub use crate::engine::token::Tokens;
/// The named fail points (`src/failpoint.rs`) and how a test arms them.
pub mod fail_points {
    pub use crate::failpoint::{
        COMPACT_BEFORE_CHECKPOINT, COMPACT_BEFORE_SWAP, ENV, EXIT_CODE, HISTORY_DROPPED,
        RAFT_BEFORE_APPLY, SNAPSHOT_BEFORE_RESTART,
    };
}
/// The format version of the files this build writes, and the level of
/// format 2 it reads (`journal::format`): `tests/engine/fixture_table.rs`
/// fails while `tests/data` holds no spool of this pair.
pub const FORMAT_VERSION: u32 = crate::journal::format::FORMAT_VERSION;
pub const READS_LEVEL: u64 = crate::journal::format::READS_LEVEL;
pub use crate::journal::format::{
    FILE_HEADER_BYTES, FRAME_FLAG_BATCH_END, FRAME_HEADER_BYTES, FileId, FrameHeader,
    SegmentHeader, SpoolIdentity, segment_file_name,
};
pub use crate::journal::frames::{Piece, walk};
pub use crate::journal::scan::scan_dir;
pub use crate::journal::sim::{SimStorage, Tear};
pub use crate::journal::storage::Storage;
pub use crate::journal::{JournalError, RecordLoc, load_identity};
pub use crate::listen::FIRST_REQUEST_TIMEOUT;
pub use crate::spool::command::FailInfo;
pub use crate::spool::command::IDS_PER_RECORD_MAX;
pub use crate::spool::command::Record;
pub use crate::spool::record::{decode_attempts, decode_payload, kind};
pub use crate::spool::state::{DedupEntry, EventKeyEntry, MessageEntry, QueueEntry, QueueState};
pub use crate::tls::install_crypto_provider;

/// A plain `text/plain` message with `body`, sent now, without a dedup key.
pub fn text_message(body: impl Into<bytes::Bytes>) -> crate::engine::SendRequest {
    crate::engine::SendRequest {
        payload: crate::spool::Payload {
            content_type: "text/plain".into(),
            request: None,
            event: None,
            resent_from: None,
            trace: None,
            hops: 0,
            ordering_key: None,
            body: body.into(),
        },
        ..crate::engine::SendRequest::default()
    }
}

/// The headers of a replication request signed with `secret`, as node
/// `from` sends it to node `target` (`body`: `None` for a stream).
pub fn sign_cluster_request(
    secret: &str,
    from: u64,
    target: u64,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> Vec<(String, String)> {
    let now = u64::try_from(crate::time::wall_ms()).unwrap_or(0);
    sign_cluster_request_at(secret, (from, target), (method, path), body, now)
}

/// As [`sign_cluster_request`], signed as a sender whose wall clock says
/// `ms` (one that stepped).
pub fn sign_cluster_request_at(
    secret: &str,
    (from, target): (u64, u64),
    (method, path): (&str, &str),
    body: Option<&[u8]>,
    ms: u64,
) -> Vec<(String, String)> {
    use crate::cluster::auth;
    let line = auth::RequestLine {
        method,
        path,
        from,
        target,
        incarnation: 0,
    };
    let (value, _) = auth::ClusterKey::new(secret).sign_at(&line, body, ms);
    vec![
        (auth::AUTH_HEADER.into(), value),
        (auth::FROM_HEADER.into(), from.to_string()),
        (auth::TARGET_HEADER.into(), target.to_string()),
        (auth::INCARNATION_HEADER.into(), "0".into()),
        (
            crate::cluster::level::LEVEL_HEADER.into(),
            crate::cluster::level::own().to_string(),
        ),
    ]
}

/// The body of a vote request by `candidate` for `term`.
pub fn cluster_vote_request(term: u64, candidate: u64) -> Vec<u8> {
    use crate::cluster::types::{TypeConfig, Vote};
    let rpc = openraft::raft::VoteRequest::<TypeConfig>::new(Vote::new(term, candidate), None);
    postcard::to_allocvec(&rpc).expect("a vote request encodes")
}

/// The body of a heartbeat (an empty append) from `leader` in `term`.
pub fn cluster_heartbeat_request(term: u64, leader: u64) -> Vec<u8> {
    use crate::cluster::types::{TypeConfig, Vote};
    let rpc = openraft::raft::AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(term, leader),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    postcard::to_allocvec(&rpc).expect("an append encodes")
}

/// The first message of a snapshot upload from `leader` in `term`, of a
/// snapshot ending at (`last_term`, `last_index`).
pub fn cluster_snapshot_head(term: u64, leader: u64, last_term: u64, last_index: u64) -> Vec<u8> {
    use crate::cluster::store::SnapshotMeta;
    use crate::cluster::types::{LogId, Vote};
    let meta = SnapshotMeta {
        last_log_id: Some(LogId::new_term_index(last_term, last_index)),
        last_membership: Default::default(),
    };
    postcard::to_allocvec(&(Vote::new_committed(term, leader), &meta)).expect("a head encodes")
}

/// Replaces the vote stored in the spool directory `dir`.
pub fn write_raft_vote(dir: &std::path::Path, term: u64, node_id: u64) -> Result<(), JournalError> {
    let storage: std::sync::Arc<dyn Storage> =
        std::sync::Arc::new(crate::journal::storage::OsStorage);
    crate::cluster::files::write_vote(storage, dir, term, node_id)
}

/// An ordering key as memory and checkpoints keep it (`spool/state/queue/keys.rs`).
pub fn ordering_key_hash(key: &str) -> u64 {
    crate::spool::state::key_hash(key)
}
