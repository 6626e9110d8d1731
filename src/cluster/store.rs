//! openraft's storage traits over the engine: the journal is the Raft log
//! ([`LogStore`]), the spool its state machine ([`StateMachine`]).
//!
//! - A Raft entry is one journal record: its index is the record's
//!   sequence number − 1, its term the frame's term. Blank and membership
//!   entries are records too (`RAFT_BLANK`, `RAFT_MEMBERSHIP`), so the log
//!   has no holes.
//! - `append` hands entries to the journal's writer, which writes and
//!   fsyncs them with group commit and only then reports them flushed.
//! - `truncate_after` cuts the journal (`writer.rs`: later segments
//!   deleted, the cut segment replaced by its kept prefix).
//! - The vote is a file of its own, written atomically once every entry
//!   appended before it is durable (openraft's I/O ordering rule); the
//!   commit index is a small file written without fsync: losing it only
//!   means start-up applies less and Raft applies the rest.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use openraft::entry::RaftEntry;
use openraft::storage::{
    EntryResponder, IOFlushed, LogState, RaftLogReader, RaftLogStorage, RaftSnapshotBuilder,
    RaftStateMachine,
};
use openraft::{EntryPayload, OptionalSend};

use super::files::RaftFiles;
use super::types::{
    self, Entry, LogId, Peer, RecordData, StoredMembership, TypeConfig, Vote, index_of, seq_of,
};
use crate::engine::replicated::LogRecord;
use crate::engine::replicated::RaftLog;
use crate::engine::replicated::snapshot::{SnapshotInfo, StagedSnapshot};
use crate::journal::JournalError;
use crate::spool::record::kind;
use crate::spool::{Command, Record};

/// Most bytes one read of the log returns: an AppendEntries request must
/// reach a follower within a heartbeat interval.
const READ_BATCH_BYTES_MAX: usize = 4 << 20;

fn io_error(e: JournalError) -> io::Error {
    io::Error::other(e.to_string())
}

/// A record of the journal as a Raft entry.
fn to_entry(record: LogRecord) -> io::Result<Entry> {
    let log_id = LogId::new_term_index(record.term, index_of(record.seq));
    let payload = match record.kind {
        kind::RAFT_BLANK => EntryPayload::Blank,
        kind::RAFT_MEMBERSHIP => {
            let decoded = Record::decode(record.kind, &record.body).map_err(io::Error::other)?;
            let Command::RaftMembership { config } = decoded.command else {
                unreachable!("decoded by kind");
            };
            EntryPayload::Membership(decode_membership(&config)?.membership().clone())
        }
        kind => EntryPayload::Normal(RecordData {
            kind,
            body: record.body,
        }),
    };
    Ok(Entry::new(log_id, payload))
}

/// A Raft entry as a journal record.
fn to_record(entry: Entry) -> io::Result<LogRecord> {
    let seq = seq_of(entry.log_id.index());
    let term = entry.log_id.committed_leader_id().term;
    let (kind, body) = match entry.payload {
        EntryPayload::Normal(data) => (data.kind, data.body),
        EntryPayload::Blank => {
            let mut body = Vec::new();
            Record {
                at: 0,
                command: Command::RaftBlank,
            }
            .encode(None, &mut body);
            (kind::RAFT_BLANK, body)
        }
        EntryPayload::Membership(m) => {
            // The record carries its own log id: the spool keeps the newest
            // one applied, and a checkpoint (a snapshot) carries it.
            let stored = StoredMembership::new(Some(entry.log_id), m);
            let config = encode_membership(&stored)?;
            let mut body = Vec::new();
            Record {
                at: 0,
                command: Command::RaftMembership {
                    config: config.into(),
                },
            }
            .encode(None, &mut body);
            (kind::RAFT_MEMBERSHIP, body)
        }
    };
    Ok(LogRecord {
        seq,
        term,
        kind,
        body,
    })
}

/// The first byte of a membership record's body as written since members
/// carry their API URL; the first build's (`LegacyPeer`) starts with
/// postcard's `Option` tag, 0 or 1.
const MEMBERSHIP_V2: u8 = 2;

/// A member as the first replicated build wrote it (no API URL).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct LegacyPeer {
    raft_addr: String,
    incarnation: u64,
}

/// A replica set as a membership record's (or a checkpoint's) bytes.
fn encode_membership(stored: &StoredMembership) -> io::Result<Vec<u8>> {
    let mut config = vec![MEMBERSHIP_V2];
    config.extend(postcard::to_allocvec(stored).map_err(io::Error::other)?);
    Ok(config)
}

/// A membership record's (or a checkpoint's) replica set, in either
/// layout.
fn decode_membership(config: &[u8]) -> io::Result<StoredMembership> {
    if let Some((&MEMBERSHIP_V2, rest)) = config.split_first() {
        return postcard::from_bytes(rest).map_err(io::Error::other);
    }
    type Legacy = openraft::StoredMembership<
        <types::Entry as openraft::entry::RaftEntry>::CommittedLeaderId,
        u64,
        LegacyPeer,
    >;
    let legacy: Legacy = postcard::from_bytes(config).map_err(io::Error::other)?;
    let nodes: std::collections::BTreeMap<u64, Peer> = legacy
        .membership()
        .nodes()
        .map(|(id, p)| {
            let peer = Peer {
                raft_addr: p.raft_addr.clone(),
                incarnation: p.incarnation,
                api_url: String::new(),
            };
            (*id, peer)
        })
        .collect();
    let membership =
        openraft::Membership::new(legacy.membership().get_joint_config().clone(), nodes)
            .map_err(io::Error::other)?;
    Ok(StoredMembership::new(*legacy.log_id(), membership))
}

/// The Raft log: the engine's journal, plus the vote and commit files.
#[derive(Clone)]
pub(crate) struct LogStore {
    log: RaftLog,
    files: Arc<RaftFiles>,
    vote: Arc<Mutex<Option<Vote>>>,
}

impl LogStore {
    pub(crate) fn new(log: RaftLog, files: Arc<RaftFiles>, vote: Option<Vote>) -> LogStore {
        LogStore {
            log,
            files,
            vote: Arc::new(Mutex::new(vote)),
        }
    }
}

impl LogStore {
    /// Entries of `range` (Raft indexes), stopping after `bytes_max` bytes
    /// of bodies (but never before the first).
    fn read_range<RB: RangeBounds<u64>>(
        &self,
        range: RB,
        bytes_max: usize,
    ) -> io::Result<Vec<Entry>> {
        let (first, last, _) = self.log.bounds();
        // In sequence numbers: [start, end).
        let start = match range.start_bound() {
            Bound::Included(&i) => seq_of(i),
            Bound::Excluded(&i) => seq_of(i).saturating_add(1),
            Bound::Unbounded => 1,
        }
        .max(first);
        let end = match range.end_bound() {
            Bound::Included(&i) => seq_of(i).saturating_add(1),
            Bound::Excluded(&i) => seq_of(i),
            Bound::Unbounded => u64::MAX,
        }
        .min(last + 1);
        let mut entries = Vec::new();
        let mut bytes = 0;
        for seq in start..end {
            let record = self.log.read(seq).map_err(io_error)?.ok_or_else(|| {
                io::Error::other(format!("record {seq} of the Raft log is missing"))
            })?;
            bytes += record.body.len();
            entries.push(to_entry(record)?);
            if bytes >= bytes_max {
                break;
            }
        }
        Ok(entries)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    /// Every entry of `range` that the log holds (the state machine applies
    /// from here: a prefix would skip records).
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        self.read_range(range, usize::MAX)
    }

    /// A prefix of `[start, end)` of at most about 4 MiB: replication
    /// sends it in one AppendEntries, which must arrive within a heartbeat.
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> io::Result<Vec<Entry>> {
        self.read_range(start..end, READ_BATCH_BYTES_MAX)
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        Ok(*self.vote.lock().expect("bug: vote lock poisoned"))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> io::Result<LogState<TypeConfig>> {
        let (first, last, last_term) = self.log.bounds();
        let last_purged_log_id = self
            .log
            .purged()
            .map(|(seq, term)| LogId::new_term_index(term, index_of(seq)));
        let last_log_id = match last_term {
            Some(term) if last >= first => Some(LogId::new_term_index(term, index_of(last))),
            _ => last_purged_log_id,
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        // A vote must never be durable ahead of the entries appended
        // before it (openraft's I/O ordering rule).
        self.log.flush().await.map_err(io_error)?;
        // Its file is written, fsynced and renamed: on the blocking pool,
        // as engine/core.rs's blocking rule says.
        let (files, to_save) = (self.files.clone(), *vote);
        match tokio::task::spawn_blocking(move || files.save_vote(&to_save)).await {
            Ok(saved) => saved.map_err(io_error)?,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
        *self.vote.lock().expect("bug: vote lock poisoned") = Some(*vote);
        Ok(())
    }

    /// One `pwrite` to a file kept open, without an fsync (a lost commit
    /// pointer is learned again from the primary), so it runs inline.
    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        self.files
            .save_committed(committed.as_ref())
            .map_err(io_error)
    }

    /// The saved commit pointer, but never beyond the log's last entry:
    /// a follower learns that an entry is committed before its own copy is
    /// durable (openraft commits up to what it *accepted*), so a `kill -9`
    /// or a failed write can leave the pointer ahead of the log. The
    /// entries up to the log's end are committed (a committed index is
    /// never cut, and they came from the primary that committed it); the
    /// rest come again from the primary.
    async fn read_committed(&mut self) -> io::Result<Option<LogId>> {
        let committed = self.files.committed();
        let last = self.get_log_state().await?.last_log_id;
        Ok(committed.min(last))
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let records = entries
            .into_iter()
            .map(to_record)
            .collect::<io::Result<Vec<_>>>()?;
        self.log
            .append(
                records,
                Box::new(move |result| callback.io_completed(result)),
            )
            .map_err(io_error)
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        let keep_seq = last_log_id.map_or(0, |id| seq_of(id.index()));
        self.log.truncate(keep_seq).await.map_err(io_error)
    }

    /// Nothing to persist: the entries up to `log_id` are in a checkpoint,
    /// and after a restart the log starts right after the newest one (so
    /// the purge point never goes back). The segments that held them are
    /// deleted by the next compaction.
    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        self.log
            .purge(seq_of(log_id.index()), log_id.committed_leader_id().term);
        Ok(())
    }
}

/// The state machine: the engine's spool.
pub(crate) struct StateMachine {
    log: RaftLog,
}

impl StateMachine {
    pub(crate) fn new(log: RaftLog) -> StateMachine {
        StateMachine { log }
    }
}

/// The snapshot of a replica: a checkpoint
/// ([`crate::engine::replicated::snapshot`]).
pub(crate) enum SnapshotData {
    /// This replica's own checkpoint of record `seq`: read from disk when
    /// it is sent (`client.rs`).
    Local { log: RaftLog, seq: u64 },
    /// A checkpoint received from the primary, its records staged.
    Received(Box<StagedSnapshot>),
}

impl std::fmt::Debug for SnapshotData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotData::Local { seq, .. } => write!(f, "local checkpoint {seq}"),
            SnapshotData::Received(staged) => write!(f, "received {staged:?}"),
        }
    }
}

pub(crate) type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotData>;
pub(crate) type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;

/// openraft's view of a checkpoint.
fn snapshot_meta(info: &SnapshotInfo) -> io::Result<SnapshotMeta> {
    let last_membership = match &info.cluster_config {
        Some(config) => decode_membership(config)?,
        None => StoredMembership::default(),
    };
    Ok(SnapshotMeta {
        last_log_id: (info.seq > 0).then(|| LogId::new_term_index(info.term, index_of(info.seq))),
        last_membership,
    })
}

impl StateMachine {
    fn snapshot_of(&self, info: &SnapshotInfo) -> io::Result<Snapshot> {
        Ok(Snapshot {
            meta: snapshot_meta(info)?,
            snapshot: SnapshotData::Local {
                log: self.log.clone(),
                seq: info.seq,
            },
        })
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotData;

    /// Compacts, writing a checkpoint of the last applied record.
    async fn build_snapshot(&mut self) -> io::Result<Snapshot> {
        let log = self.log.clone();
        let info = tokio::task::spawn_blocking(move || log.build_snapshot())
            .await
            .map_err(io::Error::other)?
            .map_err(io_error)?;
        tracing::debug!(seq = info.seq, "built a snapshot");
        self.snapshot_of(&info)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = StateMachine;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        let (applied, config) = self.log.applied_with_cluster_config();
        let membership = match config {
            Some(config) => decode_membership(&config)?,
            None => StoredMembership::default(),
        };
        if applied == 0 {
            return Ok((None, membership));
        }
        let term = self.log.term(applied).ok_or_else(|| {
            io::Error::other(format!("applied record {applied} is not in the log"))
        })?;
        Ok((
            Some(LogId::new_term_index(term, index_of(applied))),
            membership,
        ))
    }

    async fn apply<S>(&mut self, mut entries: S) -> io::Result<()>
    where
        S: futures_util::Stream<Item = io::Result<EntryResponder<TypeConfig>>>
            + Unpin
            + OptionalSend,
    {
        while let Some(next) = entries.next().await {
            let (entry, responder) = next?;
            let record = to_record(entry)?;
            let applied = self
                .log
                .apply_committed(record.seq, record.kind, &record.body)
                .await
                .map_err(io_error)?;
            if let Some(responder) = responder {
                responder.send(applied);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        StateMachine {
            log: self.log.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> io::Result<()> {
        let SnapshotData::Received(staged) = snapshot else {
            // openraft installs a stored snapshot only when it is ahead of
            // the state, which a checkpoint never is here.
            return Err(io::Error::other("a local checkpoint is never installed"));
        };
        let expected = meta
            .last_log_id
            .map(|id| (seq_of(id.index()), id.committed_leader_id().term));
        if expected != Some((staged.seq, staged.term)) {
            return Err(io::Error::other(format!(
                "the snapshot's records are of {:?}, its meta says {expected:?}",
                (staged.seq, staged.term)
            )));
        }
        self.log.install_snapshot(*staged).await.map_err(io_error)
    }

    async fn get_current_snapshot(&mut self) -> io::Result<Option<Snapshot>> {
        match self.log.current_snapshot() {
            Some(info) => self.snapshot_of(&info).map(Some),
            None => Ok(None),
        }
    }
}

/// The golden bytes of both layouts of a membership record (kind 16;
/// `src/spool/golden_tests/` says what golden bytes are for): the
/// first layout as 139ec3c wrote it, read only; the second as today's
/// encoder writes it, both ways. The bytes are openraft's serde layout
/// under postcard, so an upgrade of openraft that changes them fails
/// here.
#[cfg(test)]
mod golden {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::spool::golden_tests::{RECORDS, entry_text, parse};

    /// A replica set of three on `host` (ports 7381 to 7383): each
    /// member's incarnation and API URL, stored at `log_id`.
    fn replica_set(log_id: (u64, u64), host: &str, peers: [(u64, &str); 3]) -> StoredMembership {
        let nodes: BTreeMap<u64, Peer> = (1..=3)
            .zip(peers)
            .map(|(id, (incarnation, api_url))| {
                let peer = Peer {
                    raft_addr: format!("{host}:{}", 7380 + id),
                    incarnation,
                    api_url: api_url.into(),
                };
                (id, peer)
            })
            .collect();
        let voters = vec![BTreeSet::from([1, 2, 3])];
        let membership = openraft::Membership::new(voters, nodes).expect("a membership");
        StoredMembership::new(Some(LogId::new_term_index(log_id.0, log_id.1)), membership)
    }

    #[test]
    fn both_membership_layouts_read_their_golden_bytes() {
        let file = parse(RECORDS);
        // The replica sets after the primary pinned its members, as the
        // records of the cluster fixtures hold them.
        let v1 = replica_set(
            (2, 3),
            "127.38.0.1",
            [
                (0x9bf9_9950_f561_5083, ""),
                (0xfd2f_8a38_3653_f257, ""),
                (0xd7c2_5fb3_98f3_6299, ""),
            ],
        );
        let v2 = replica_set(
            (2, 2),
            "127.38.0.2",
            [
                (0x1ae4_88b9_c36c_3569, "http://127.0.0.1:39913"),
                (0x040a_390e_f5a9_c48d, "http://127.0.0.1:60897"),
                (0x8810_36c2_a3a7_86db, "http://127.0.0.1:52561"),
            ],
        );
        let written = encode_membership(&v2).unwrap();
        let record = Record {
            at: 0,
            command: Command::RaftMembership {
                config: written.as_slice().into(),
            },
        };
        let mut body = Vec::new();
        record.encode(None, &mut body);
        let what = "raft membership (16): the byte 2, then the replica set with API URLs \
                    (tests/data/v2-cluster-membership-v2, replica 1, record 3)";
        let Some((kind::RAFT_MEMBERSHIP, golden)) = file.get("raft-membership-v2") else {
            let entry = entry_text("raft-membership-v2", what, kind::RAFT_MEMBERSHIP, &body);
            panic!("missing from tests/data/golden/records.txt:\n\n{entry}");
        };
        assert_eq!(*golden, body, "today's encoder writes other bytes");
        for (name, expected) in [("raft-membership-v1", v1), ("raft-membership-v2", v2)] {
            let (kind, bytes) = &file[name];
            let Command::RaftMembership { config } = Record::decode(*kind, bytes).unwrap().command
            else {
                panic!("{name} is not a membership record");
            };
            assert_eq!(decode_membership(&config).unwrap(), expected, "{name}");
        }
    }
}

/// openraft's storage conformance suite (`openraft::testing::log::Suite`,
/// shipped with the pinned version) over [`LogStore`] and
/// [`StateMachine`] on one engine, as a replica runs them. The cases that
/// cannot fit this design are listed in [`suite::UNFIT`] with the reason,
/// and docs/replication.md says the same.
#[cfg(test)]
mod suite {
    use std::panic::AssertUnwindSafe;
    use std::path::Path;
    use std::time::Duration;

    use futures_util::FutureExt;
    use openraft::StorageError;
    use openraft::testing::log::{StoreBuilder, Suite};
    use openraft::type_config::TypeConfigExt;

    use super::*;
    use crate::engine::Replica;
    use crate::engine::replicated::testing;
    use crate::journal::sim::SimStorage;

    /// A fresh replica's log and state machine: a replicated-mode engine
    /// on simulated storage (the engine is the guard that keeps it open).
    struct Builder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachine, Replica> for Builder {
        async fn build(
            &self,
        ) -> Result<(Replica, LogStore, StateMachine), StorageError<TypeConfig>> {
            let broken = |e: String| StorageError::read(TypeConfig::err_from_string(e));
            let sim = SimStorage::new();
            let (engine, _) = Replica::open(testing::options(&sim, 1 << 20, 0), 0)
                .await
                .map_err(|e| broken(e.to_string()))?;
            let (files, vote) = RaftFiles::open(Arc::new(sim), Path::new("/spool"))
                .map_err(|e| broken(e.to_string()))?;
            let log = LogStore::new(engine.raft_log(), Arc::new(files), vote);
            let sm = StateMachine::new(engine.raft_log());
            Ok((engine, log, sm))
        }
    }

    type S = Suite<TypeConfig, LogStore, StateMachine, Builder, Replica>;

    /// Longest a case may run (each takes milliseconds when it fits).
    const CASE_TIME_MAX: Duration = Duration::from_secs(5);

    /// Runs one case on a fresh store: `Err` with what failed.
    async fn run<F, Fut>(case: F) -> Result<(), String>
    where
        F: FnOnce(LogStore, StateMachine) -> Fut,
        Fut: std::future::Future<Output = io::Result<()>>,
    {
        let (_engine, log, sm) = Builder.build().await.map_err(|e| e.to_string())?;
        let ran = tokio::time::timeout(
            CASE_TIME_MAX,
            AssertUnwindSafe(case(log, sm)).catch_unwind(),
        );
        match ran.await {
            Err(_) => Err(format!("did not end within {CASE_TIME_MAX:?}")),
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(e.to_string()),
            Ok(Err(panic)) => Err(panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default()),
        }
    }

    macro_rules! cases {
        ($($name:ident),* $(,)?) => {
            vec![$((stringify!($name), run(S::$name).boxed())),*]
        };
    }

    /// The cases that cannot fit, and why. Every other case of the suite
    /// runs in [`openraft_storage_suite`].
    ///
    /// - The spool is the state machine of its own journal: a record is
    ///   applied from the log, so an entry the log does not hold cannot
    ///   be applied (applying waits for its record to be durable), and a
    ///   snapshot is a checkpoint of the journal. openraft applies only
    ///   entries it read from the log, and builds snapshots of what it
    ///   applied, so it never asks for this; these cases apply to a bare
    ///   state machine.
    /// - The journal holds one contiguous run of records, from index 0 or
    ///   from the checkpoint a snapshot installed: an append must follow
    ///   the last entry (`bug: Raft appended …`). openraft appends after
    ///   the last entry, after a truncation, or after installing a
    ///   snapshot (which starts the log again); these cases write logs
    ///   with holes, or apply entries that skip some.
    pub(super) const UNFIT: &[(&str, &str)] = &[
        ("last_membership_in_log", BARE_STATE_MACHINE),
        ("get_membership_from_empty_log_and_sm", BARE_STATE_MACHINE),
        (
            "get_membership_from_log_le_sm_last_applied",
            BARE_STATE_MACHINE,
        ),
        (
            "get_membership_from_log_gt_sm_last_applied_1",
            BARE_STATE_MACHINE,
        ),
        (
            "get_membership_from_log_gt_sm_last_applied_2",
            BARE_STATE_MACHINE,
        ),
        (
            "get_initial_state_membership_from_empty_log_and_sm",
            BARE_STATE_MACHINE,
        ),
        (
            "get_initial_state_membership_from_sm_inlog_is_smaller",
            BARE_STATE_MACHINE,
        ),
        (
            "get_initial_state_membership_from_log_insm_is_smaller",
            BARE_STATE_MACHINE,
        ),
        ("get_initial_state_log_ids", BARE_STATE_MACHINE),
        ("last_id_in_log", BARE_STATE_MACHINE),
        ("last_applied_state", BARE_STATE_MACHINE),
        ("snapshot_meta", BARE_STATE_MACHINE),
        ("snapshot_meta_optional", BARE_STATE_MACHINE),
        ("apply_single", BARE_STATE_MACHINE),
        ("apply_multiple", BARE_STATE_MACHINE),
        ("transfer_snapshot", BARE_STATE_MACHINE),
        ("last_membership_in_log_multi_step", LOG_WITH_HOLES),
        ("get_membership_from_log_and_empty_sm", LOG_WITH_HOLES),
        ("get_initial_state_with_state", LOG_WITH_HOLES),
        ("get_initial_state_last_log_gt_sm", LOG_WITH_HOLES),
        ("get_initial_state_last_log_lt_sm", LOG_WITH_HOLES),
        ("get_initial_state_inverted_log_order", LOG_WITH_HOLES),
        ("get_initial_state_conflict_at_same_index", LOG_WITH_HOLES),
        ("get_initial_state_re_apply_committed", LOG_WITH_HOLES),
    ];
    const BARE_STATE_MACHINE: &str = "applies entries the log does not hold";
    const LOG_WITH_HOLES: &str = "writes a log with holes, or applies past one";

    #[tokio::test]
    async fn openraft_storage_suite() {
        let cases = cases![
            last_membership_in_log_initial,
            get_membership_initial,
            get_initial_state_without_init,
            save_vote,
            get_log_entries,
            limited_get_log_entries,
            leader_bounded_stream,
            entries_stream,
            try_get_log_entry,
            log_reader_reads_new_entries,
            initial_logs,
            get_log_state,
            get_log_id,
            purge_logs_upto_0,
            purge_logs_upto_5,
            purge_logs_upto_20,
            delete_logs_after_11,
            delete_logs_after_5,
            delete_logs_after_0,
            delete_logs_after_none,
            append_to_log,
        ];
        // The suite has 45 cases (`Suite::test_store`): each runs here or
        // is listed as unfit.
        assert_eq!(cases.len() + UNFIT.len(), 45);
        let mut failed = Vec::new();
        for (name, case) in cases {
            assert!(
                !UNFIT.iter().any(|(n, _)| *n == name),
                "{name} is listed unfit"
            );
            if let Err(e) = case.await {
                failed.push(format!("{name}: {e}"));
            }
        }
        assert!(
            failed.is_empty(),
            "openraft's storage suite failed: {failed:#?}"
        );
    }
}
