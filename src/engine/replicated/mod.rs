//! Replicated mode, the engine's side (docs/contract.md §9): the journal is
//! the Raft log and the spool is its state machine. `src/cluster/` drives
//! openraft through two doors:
//!
//! - the engine, for the primary's side: proposing what it decided,
//!   answering proposals, serving and stepping down (this file);
//! - a [`RaftLog`] (`log.rs`, `snapshot/`), for openraft's storage: the
//!   entries of the log, applying committed ones, snapshots.
//!
//! A write on the primary still starts at the one door (`write.rs`): the
//! core lock, the reservation, then the appender chosen at open, which
//! here encodes the record and hands it to the cluster's proposer instead
//! of the journal (a bounded queue: when it is full the write is refused,
//! which is the backpressure). Raft appends it (the journal's writer
//! writes and fsyncs it, on every replica, with group commit), commits it
//! on a majority, and the state machine applies it on every replica
//! through [`RaftLog::apply_committed`], once it is durable there. The
//! primary then answers the waiter ([`Engine::finish_proposal`]) with the
//! receipt of its own fsync: the primary is always among the replicas that
//! hold a record it acknowledged.
//!
//! Only the primary decides: it serves (`serving` holds its term) once the
//! barrier it proposed on election (an `Epoch` record carrying the term) is
//! applied, so that every record of earlier primaries is in its state
//! before it hands out an id or a lease. Leases live in its memory and
//! carry the term; stepping down drops them.

pub(crate) mod error;
pub(crate) mod log;
pub(crate) mod snapshot;

use std::collections::VecDeque;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use super::core::Reply;
use super::error::WriteError;
use super::sink::{self, Op};
use super::{Engine, EngineOptions, ReplayReport};
use crate::journal::format::check_record_body;
use crate::journal::{Durable, JournalError, RecordLoc};
use crate::spool::{Applied, Command, Payload, Record};
pub(crate) use error::{ReplicationError, StreamError};
pub(crate) use log::RaftLog;

/// Most proposals waiting for the proposer to hand them to Raft: beyond
/// that the replicas are slower than the writers, and a write is refused
/// (`503`) rather than queued without bound.
pub(crate) const PROPOSALS_QUEUED_MAX: usize = 16 << 10;

/// The engine's replicated-mode state.
pub(crate) struct Replication {
    /// Where each record of the live log is, with its term and kind.
    pub(super) index: Mutex<LogIndex>,
    /// Entries appended but not yet durable: Raft may read them back
    /// (to replicate them) before the writer placed them.
    pub(super) unwritten: Mutex<VecDeque<LogRecord>>,
    /// Sequence number of the last entry handed to the journal.
    pub(super) appended_seq: AtomicU64,
    /// The term this replica serves in as the primary; 0 when it does not.
    serving: AtomicU64,
    /// `serving`, for whoever waits on a change (the API opens after the
    /// config's queues are in place; push workers abandon attempts).
    serving_changes: tokio::sync::watch::Sender<u64>,
    /// The term whose barrier is being proposed; 0 when none.
    starting: AtomicU64,
    proposer: Mutex<Option<mpsc::Sender<Proposal>>>,
    /// True while a majority acknowledged this replica's leadership
    /// recently enough that no other primary can have been elected: a
    /// primary cut off (or frozen) stops leasing before a new one starts.
    quorum: std::sync::OnceLock<Box<dyn Fn() -> bool + Send + Sync>>,
    /// Asks openraft for a snapshot (its builder runs the compaction).
    pub(super) snapshot_trigger: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

/// The records of the live log: `(term, kind, location)` by sequence
/// number, from `first_seq` on. Everything before it is purged: covered by
/// a snapshot (the checkpoint), and `purged_term` is the term of record
/// `first_seq - 1`.
#[derive(Debug, Default)]
pub(super) struct LogIndex {
    pub(super) first_seq: u64,
    pub(super) purged_term: u64,
    pub(super) entries: VecDeque<(u64, u8, RecordLoc)>,
}

impl LogIndex {
    pub(super) fn get(&self, seq: u64) -> Option<(u64, u8, RecordLoc)> {
        let i = seq.checked_sub(self.first_seq)?;
        self.entries.get(usize::try_from(i).ok()?).copied()
    }

    fn last_seq(&self) -> u64 {
        self.first_seq + self.entries.len() as u64 - 1
    }
}

/// A record on its way to Raft, with the ticket the cluster hands back
/// once Raft has an answer for it.
pub(crate) struct Proposal {
    pub kind: u8,
    pub body: Vec<u8>,
    /// The term it was decided in: Raft must append it in that term or not
    /// at all (openraft's `with_leader`).
    pub term: u64,
    pub ticket: Ticket,
}

/// The waiter of a proposal, opaque outside the engine.
pub(crate) struct Ticket(Op);

/// One record of the Raft log as the cluster reads it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LogRecord {
    pub seq: u64,
    pub term: u64,
    pub kind: u8,
    pub body: Vec<u8>,
}

impl Replication {
    /// `purged`: `(seq, term)` of the last record before the live log.
    pub(super) fn new(purged: (u64, u64), live: Vec<(u64, u8, RecordLoc)>) -> Replication {
        let appended = purged.0 + live.len() as u64;
        Replication {
            index: Mutex::new(LogIndex {
                first_seq: purged.0 + 1,
                purged_term: purged.1,
                entries: live.into(),
            }),
            unwritten: Mutex::new(VecDeque::new()),
            appended_seq: AtomicU64::new(appended),
            serving: AtomicU64::new(0),
            serving_changes: tokio::sync::watch::Sender::new(0),
            starting: AtomicU64::new(0),
            proposer: Mutex::new(None),
            quorum: std::sync::OnceLock::new(),
            snapshot_trigger: std::sync::OnceLock::new(),
        }
    }
}

impl sink::PlacedLog for Replication {
    /// The writer placed entry `seq` (called by the sink, in order).
    fn placed(&self, seq: u64, term: u64, kind: u8, loc: RecordLoc) {
        let mut index = self.index();
        assert_eq!(
            seq,
            index.last_seq() + 1,
            "bug: Raft entry {seq} placed after {}",
            index.last_seq()
        );
        index.entries.push_back((term, kind, loc));
        drop(index);
        let mut unwritten = self.unwritten.lock().expect("bug: tail lock poisoned");
        while unwritten.front().is_some_and(|e| e.seq <= seq) {
            unwritten.pop_front();
        }
    }
}

impl Replication {
    /// Where proposals go: none while this replica is not the primary.
    fn proposer(&self) -> Result<mpsc::Sender<Proposal>, ReplicationError> {
        self.proposer
            .lock()
            .expect("bug: proposer lock poisoned")
            .clone()
            .ok_or(ReplicationError::NotPrimary)
    }

    pub(super) fn index(&self) -> std::sync::MutexGuard<'_, LogIndex> {
        self.index.lock().expect("bug: index lock poisoned")
    }

    /// `f` of entry `seq` while it waits to be written.
    fn unwritten_entry<T>(&self, seq: u64, f: impl FnOnce(&LogRecord) -> T) -> Option<T> {
        let unwritten = self.unwritten.lock().expect("bug: tail lock poisoned");
        let first = unwritten.front()?.seq;
        let i = usize::try_from(seq.checked_sub(first)?).ok()?;
        unwritten.get(i).map(f)
    }

    pub(super) fn serving_term(&self) -> u64 {
        self.serving.load(Ordering::Acquire)
    }

    /// The serving term, if a majority still follows this replica.
    fn serving_now(&self) -> u64 {
        let term = self.serving_term();
        if term != 0 && self.quorum.get().is_none_or(|fresh| fresh()) {
            term
        } else {
            0
        }
    }
}

/// An engine opened in replicated mode: the handle that the calls only a
/// replica has take (`Cluster::open` returns one; `Engine::replica` makes
/// one). Everything an engine does, it does too. Cheap to clone.
#[derive(Clone)]
pub struct Replica {
    engine: Engine,
    r: Arc<Replication>,
}

impl Deref for Replica {
    type Target = Engine;

    fn deref(&self) -> &Engine {
        &self.engine
    }
}

impl Engine {
    /// The replicated-mode handle on this engine; `None` on a single node.
    pub fn replica(&self) -> Option<Replica> {
        let r = self.inner.replication.clone()?;
        Some(Replica {
            engine: self.clone(),
            r,
        })
    }

    /// True in replicated mode.
    pub(crate) fn is_replicated(&self) -> bool {
        self.inner.replication.is_some()
    }

    /// True while this replica serves as the primary (always on a single
    /// node): elected, its barrier applied, and a majority heard from
    /// within the leader lease.
    pub fn is_serving(&self) -> bool {
        self.inner
            .replication
            .as_ref()
            .is_none_or(|r| r.serving_now() != 0)
    }

    /// The term this replica serves in (0: none), as it changes; `None`
    /// on a single node, which always serves.
    pub fn serving_changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        let r = self.inner.replication.as_ref()?;
        Some(r.serving_changes.subscribe())
    }

    /// Resolves once this replica no longer serves in the term it serves
    /// in now: it stepped down, or lost its majority (checked every
    /// 100 ms). Never on a single node.
    pub async fn until_stepped_down(&self) {
        let Some(mut changes) = self.serving_changes() else {
            return std::future::pending().await;
        };
        let term = *changes.borrow_and_update();
        while term != 0 && self.is_serving() && *changes.borrow() == term {
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                () = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
            }
        }
    }

    /// Waits until record `seq` is durable in this replica's journal.
    pub(super) async fn durable(&self, seq: u64) -> Result<Durable, JournalError> {
        let mut watch = self.inner.journal.durable_seq();
        if watch.wait_for(|&d| d >= seq).await.is_err() {
            return Err(JournalError::Closed);
        }
        self.inner
            .journal
            .durable_receipt(seq)
            .ok_or(JournalError::Closed)
    }

    /// The segment (as a record location's file) that holds the oldest
    /// record of the Raft log: compaction leaves it and every later one
    /// alone. `None` on a single node, or when the log is all purged.
    pub(super) fn purge_floor(&self) -> Option<u32> {
        let r = self.inner.replication.as_ref()?;
        let index = r.index();
        index.entries.front().map(|&(_, _, loc)| loc.file)
    }

    /// Whether node `id` was retired.
    pub(crate) fn node_retired(&self, id: u64) -> bool {
        self.core().spool.retired_nodes().contains(&id)
    }
}

impl Replica {
    /// Opens a spool in replicated mode: replays what the log holds, but
    /// applies only up to `committed` (what Raft knows is committed); the
    /// rest waits for Raft to commit it again.
    pub(crate) async fn open(
        mut options: EngineOptions,
        committed: u64,
    ) -> Result<(Replica, ReplayReport), JournalError> {
        options.replicated = Some(committed);
        let (engine, report) = Engine::open(options).await?;
        let replica = engine
            .replica()
            .expect("bug: an engine opened replicated has no replication");
        Ok((replica, report))
    }

    /// The Raft side's handle (openraft's log store and state machine).
    pub(crate) fn raft_log(&self) -> RaftLog {
        RaftLog {
            engine: self.engine.clone(),
            r: self.r.clone(),
        }
    }

    /// Sets the check of the leader lease (see [`Replication`]).
    pub(crate) fn set_quorum_check(&self, fresh: Box<dyn Fn() -> bool + Send + Sync>) {
        let _ = self.r.quorum.set(fresh);
    }

    /// Where proposals go from now on.
    pub(crate) fn attach_proposer(&self, tx: mpsc::Sender<Proposal>) {
        *self.r.proposer.lock().expect("bug: proposer lock poisoned") = Some(tx);
    }

    /// Raft committed and applied a proposal of this replica as record
    /// `seq` with outcome `applied`: answer its waiter, with the receipt of
    /// this replica's own fsync. Applying waited for that fsync already
    /// ([`RaftLog::apply_committed`]), so this does not wait again.
    pub(crate) fn finish_proposal(&self, ticket: Ticket, seq: u64, applied: Applied) {
        let Some(receipt) = self.inner.journal.durable_receipt(seq) else {
            // Only a journal that closed meanwhile forgets what it fsynced.
            self.fail_proposal(ticket, "the spool is shutting down".into(), true);
            return;
        };
        let Op { record, reply } = ticket.0;
        let dedup_waiters = self.core().take_dedup_waiters(&reply, true);
        sink::answer(&receipt, reply, &record, applied, dedup_waiters);
    }

    /// Raft did not commit a proposal, or cannot say: undo its reservation
    /// and answer `operation_unconfirmed` (`unconfirmed`) or `unavailable`.
    pub(crate) fn fail_proposal(&self, ticket: Ticket, reason: String, unconfirmed: bool) {
        let make_error: fn(String) -> WriteError = if unconfirmed {
            |reason| WriteError::LeadershipLost { reason }
        } else {
            |reason| WriteError::NotPrimary { reason }
        };
        sink::refuse(&self.inner.shared, vec![ticket.0], make_error, &reason);
    }

    /// This replica was elected primary in `term`: propose the barrier and
    /// serve once it is applied (every record of earlier terms is then in
    /// the state, so ids and leases start above them).
    pub(crate) async fn start_serving(&self, term: u64) -> Result<(), WriteError> {
        let r = &self.r;
        r.starting.store(term, Ordering::Release);
        let (tx, rx) = oneshot::channel();
        {
            let mut core = self.core();
            let at = self.now(&mut core);
            let record = Record {
                at,
                command: Command::Epoch { epoch: term },
            };
            r.propose(record, None, Reply::Done(tx), term)?;
        }
        rx.await.map_err(|_| super::error::closed())??;
        let mut core = self.core();
        if r.starting.load(Ordering::Acquire) != term {
            return Err(WriteError::NotPrimary {
                reason: "stepped down before serving".into(),
            });
        }
        core.spool.drop_leases();
        r.serving.store(term, Ordering::Release);
        drop(core);
        r.serving_changes.send_replace(term);
        tracing::info!(term, "serving as the primary");
        Ok(())
    }

    /// This replica is no longer the primary: stop deciding at once and
    /// forget every lease (their messages are visible on the new primary,
    /// retry counts unchanged).
    pub(crate) fn stop_serving(&self) {
        let r = &self.r;
        let was = r.serving.swap(0, Ordering::AcqRel);
        r.starting.store(0, Ordering::Release);
        r.serving_changes.send_replace(0);
        let mut core = self.core();
        core.spool.drop_leases();
        drop(core);
        if was != 0 {
            tracing::warn!(term = was, "stepped down: no longer the primary");
        }
    }

    /// Records that node `id` left the replica set for good (on the
    /// primary, before the change that removes it): a later add of the same
    /// id is refused, on any primary, after any compaction.
    pub(crate) async fn retire_node(&self, id: u64) -> Result<(), WriteError> {
        self.write_done(|_, _| Ok(Command::RetireNode { id })).await
    }
}

impl Replication {
    /// Hands a record decided under the core lock to the proposer (the
    /// replicated half of `Engine::append`). `term` 0 means "the term
    /// this replica serves in".
    pub(in crate::engine) fn propose(
        &self,
        record: Record<'static>,
        payload: Option<&Payload>,
        reply: Reply,
        term: u64,
    ) -> Result<(), ReplicationError> {
        let term = match term {
            0 => self.serving_now(),
            t => t,
        };
        if term == 0 {
            return Err(ReplicationError::NotPrimary);
        }
        let mut body = Vec::new();
        record.encode(payload, &mut body);
        check_record_body(body.len())?;
        let proposal = Proposal {
            kind: record.kind(),
            body,
            term,
            ticket: Ticket(Op { record, reply }),
        };
        let tx = self.proposer()?;
        tx.try_send(proposal).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => ReplicationError::Backlog {
                queued: PROPOSALS_QUEUED_MAX,
            },
            mpsc::error::TrySendError::Closed(_) => ReplicationError::Closed,
        })
    }

    /// Hands several records decided under the core lock to the proposer,
    /// all or none: each is encoded and checked, and room for all of them
    /// is reserved in the proposer's queue, before the first goes. (One at
    /// a time, a purge of more than 65 536 ids whose later record met a
    /// full queue was refused as if nothing had been proposed, while its
    /// first records committed.)
    pub(in crate::engine) fn propose_all(&self, ops: Vec<Op>) -> Result<(), ReplicationError> {
        let term = self.serving_now();
        if term == 0 {
            return Err(ReplicationError::NotPrimary);
        }
        let mut proposals = Vec::with_capacity(ops.len());
        for op in ops {
            let mut body = Vec::new();
            op.record.encode(None, &mut body);
            check_record_body(body.len())?;
            proposals.push(Proposal {
                kind: op.record.kind(),
                body,
                term,
                ticket: Ticket(op),
            });
        }
        let tx = self.proposer()?;
        let permits = tx.try_reserve_many(proposals.len()).map_err(|e| match e {
            mpsc::error::TrySendError::Full(()) => ReplicationError::Backlog {
                queued: PROPOSALS_QUEUED_MAX,
            },
            mpsc::error::TrySendError::Closed(()) => ReplicationError::Closed,
        })?;
        for (permit, proposal) in permits.zip(proposals) {
            permit.send(proposal);
        }
        Ok(())
    }
}

/// What tests of replicated mode without openraft need.
#[cfg(test)]
pub(crate) mod testing {
    use tokio::sync::{mpsc, oneshot};

    use super::{Engine, LogRecord, Replica};
    use crate::engine::EngineOptions;
    use crate::journal::sim::SimStorage;

    /// A replicated-mode engine on `sim` with segments of `segment_bytes`,
    /// applying at open what the log holds up to `apply_up_to`.
    pub(crate) fn options(sim: &SimStorage, segment_bytes: u64, apply_up_to: u64) -> EngineOptions {
        let mut o = EngineOptions::new("/spool");
        o.storage = std::sync::Arc::new(sim.clone());
        o.clock = std::sync::Arc::new(crate::time::ManualClock::new(1_800_000_000_000));
        o.lock = false;
        o.preallocate = false;
        o.segment_bytes = segment_bytes;
        o.replicated = Some(apply_up_to);
        o
    }

    /// Opens a replicated-mode engine with `options` (of [`options`]).
    pub(crate) async fn open(options: EngineOptions) -> Replica {
        let (engine, _) = Engine::open(options).await.unwrap();
        engine.replica().expect("replicated options")
    }

    /// A Raft of one: each proposal is appended in `term`, then committed
    /// and applied at once.
    pub(crate) fn raft_of_one(engine: &Replica, term: u64) {
        let (tx, mut rx) = mpsc::channel::<super::Proposal>(super::PROPOSALS_QUEUED_MAX);
        engine.attach_proposer(tx);
        let e = engine.clone();
        let log = engine.raft_log();
        tokio::spawn(async move {
            while let Some(p) = rx.recv().await {
                let seq = log.bounds().1 + 1;
                let (done_tx, done_rx) = oneshot::channel();
                let record = LogRecord {
                    seq,
                    term,
                    kind: p.kind,
                    body: p.body.clone(),
                };
                let done = Box::new(move |r: std::io::Result<()>| {
                    let _ = done_tx.send(r.is_ok());
                });
                log.append(vec![record], done).unwrap();
                assert!(done_rx.await.unwrap());
                let applied = log.apply_committed(seq, p.kind, &p.body).await.unwrap();
                e.finish_proposal(p.ticket, seq, applied);
            }
        });
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::engine::EngineOptions;
    use crate::journal::sim::{SimStorage, Tear};
    use crate::spool::record::kind;

    fn options(sim: &SimStorage) -> EngineOptions {
        testing::options(sim, 64 << 10, 0)
    }

    /// An entry of `bytes` (a membership record: never applied here).
    fn entry(seq: u64, term: u64, bytes: usize) -> LogRecord {
        let mut body = Vec::new();
        Record {
            at: 0,
            command: Command::RaftMembership {
                config: vec![seq as u8; bytes].into(),
            },
        }
        .encode(None, &mut body);
        LogRecord {
            seq,
            term,
            kind: kind::RAFT_MEMBERSHIP,
            body,
        }
    }

    async fn append(engine: &Replica, seqs: std::ops::RangeInclusive<u64>, term: u64) {
        let records = seqs.map(|s| entry(s, term, 4 << 10)).collect();
        let (tx, rx) = oneshot::channel();
        engine
            .raft_log()
            .append(
                records,
                Box::new(move |r| {
                    let _ = tx.send(r.is_ok());
                }),
            )
            .unwrap();
        assert!(rx.await.unwrap(), "the entries became durable");
    }

    /// The term of every record of the log, in order (and each body whole).
    fn terms(engine: &Replica) -> Vec<u64> {
        let (first, last, _) = engine.raft_log().bounds();
        (first..=last)
            .map(|seq| {
                let r = engine.raft_log().read(seq).unwrap().expect("no hole");
                assert_eq!(r, entry(seq, r.term, 4 << 10), "record {seq} intact");
                r.term
            })
            .collect()
    }

    #[tokio::test]
    async fn a_purge_of_several_records_is_proposed_all_or_none() {
        use crate::spool::command::IDS_PER_RECORD_MAX;
        let sim = SimStorage::new();
        let mut o = options(&sim);
        o.segment_bytes = 8 << 20;
        o.fsync = false;
        let engine = testing::open(o).await;
        testing::raft_of_one(&engine, 1);
        engine.start_serving(1).await.unwrap();
        engine
            .upsert_queue("q", Default::default(), crate::engine::Origin::Api)
            .await
            .unwrap();
        let n = IDS_PER_RECORD_MAX + 1;
        for chunk in (0..n).collect::<Vec<_>>().chunks(1024) {
            let sends = chunk
                .iter()
                .map(|_| engine.send("q", crate::testing::text_message("")));
            for sent in futures_util::future::join_all(sends).await {
                sent.unwrap();
            }
        }
        // A proposer with room for one record: the purge needs two.
        let (tx, mut rx) = mpsc::channel(1);
        engine.attach_proposer(tx);
        let refused = engine
            .purge("q", &Default::default(), usize::MAX, false)
            .await;
        assert!(refused.is_err(), "{refused:?}");
        assert!(rx.try_recv().is_err(), "nothing was proposed");
        // Nothing stays reserved: every message may be picked again.
        let again = engine
            .purge("q", &Default::default(), usize::MAX, true)
            .await
            .unwrap();
        assert_eq!(again.done, n as u64);
        engine.close();
    }

    #[tokio::test]
    async fn a_truncated_suffix_never_comes_back_and_the_kept_prefix_stays() {
        for cut in [0, 1, 15, 16, 39] {
            let sim = SimStorage::new();
            let engine = testing::open(options(&sim)).await;
            // Forty 4 KiB records in batches of five: three 64 KiB
            // segments, the cut falling inside one or on a boundary.
            for first in (1..=40).step_by(5) {
                append(&engine, first..=first + 4, 1).await;
            }
            engine.raft_log().truncate(cut).await.unwrap();
            append(&engine, cut + 1..=cut + 5, 2).await;
            let mut expected = vec![1; cut as usize];
            expected.extend([2; 5]);
            assert_eq!(terms(&engine), expected, "cut after {cut}");

            // Power lost right after: what was answered durable is there,
            // and nothing of the old suffix.
            sim.crash(Tear::DropUnsynced);
            drop(engine);
            let engine = testing::open(options(&sim)).await;
            assert_eq!(terms(&engine), expected, "cut after {cut}, replayed");
            // The log goes on from there.
            append(&engine, cut + 6..=cut + 6, 3).await;
            engine.close();
        }
    }
}
