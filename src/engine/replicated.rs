//! Replicated mode, the engine's side (docs/contract.md §9): the journal is
//! the Raft log and the spool is its state machine. `src/cluster/` drives
//! openraft; this file is the small interface it drives the engine through.
//!
//! A write on the primary still starts at the one door (`write.rs`): the
//! core lock, the reservation, then [`Engine::append`], which here encodes
//! the record and hands it to the cluster's proposer instead of the
//! journal. Raft appends it (the journal's writer writes and fsyncs it,
//! on every replica, with group commit), commits it on a majority, and
//! the state machine applies it on every replica through
//! [`Engine::apply_committed`]. The primary then answers the waiter
//! ([`Engine::finish_proposal`]) with a durable receipt from its own
//! journal: the primary is always among the replicas that hold a record
//! it acknowledged.
//!
//! Only the primary decides: it serves (`serving` holds its term) once the
//! barrier it proposed on election (an `Epoch` record carrying the term) is
//! applied, so that every record of earlier primaries is in its state
//! before it hands out an id or a lease. Leases live in its memory and
//! carry the term; stepping down drops them.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{mpsc, oneshot};

use super::Engine;
use super::error::WriteError;
use super::sink::{self, Entry, FlushCallback, Op, Replicated, Reply};
use crate::journal::{Control, Durable, JournalError, RecordLoc, Truncate};
use crate::spool::{Applied, Command, Payload, Record};

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
    proposer: Mutex<Option<mpsc::UnboundedSender<Proposal>>>,
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

    /// The writer placed entry `seq` (called by the sink, in order).
    pub(super) fn placed(&self, seq: u64, term: u64, kind: u8, loc: RecordLoc) {
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

impl Engine {
    pub(super) fn replication(&self) -> &Replication {
        self.inner
            .replication
            .as_deref()
            .expect("bug: replicated-mode call on a single node")
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

    /// Sets the check of the leader lease (see [`Replication`]).
    pub(crate) fn set_quorum_check(&self, fresh: Box<dyn Fn() -> bool + Send + Sync>) {
        let _ = self.replication().quorum.set(fresh);
    }

    /// Where proposals go from now on.
    pub(crate) fn attach_proposer(&self, tx: mpsc::UnboundedSender<Proposal>) {
        *self
            .replication()
            .proposer
            .lock()
            .expect("bug: proposer lock poisoned") = Some(tx);
    }

    /// Hands a record decided under the core lock to the proposer (the
    /// replicated half of [`Engine::append`]). `term` 0 means "the term
    /// this replica serves in".
    pub(super) fn propose(
        &self,
        record: Record<'static>,
        payload: Option<&Payload>,
        reply: Reply,
        term: u64,
    ) -> Result<(), JournalError> {
        let r = self.replication();
        let term = match term {
            0 => r.serving_now(),
            t => t,
        };
        if term == 0 {
            return Err(JournalError::NotPrimary);
        }
        let mut body = Vec::new();
        record.encode(payload, &mut body);
        let proposal = Proposal {
            kind: record.kind(),
            body,
            term,
            ticket: Ticket(Op { record, reply }),
        };
        let tx = r
            .proposer
            .lock()
            .expect("bug: proposer lock poisoned")
            .clone()
            .ok_or(JournalError::NotPrimary)?;
        tx.send(proposal).map_err(|_| JournalError::Closed)
    }

    /// Raft committed and applied a proposal of this replica as record
    /// `seq` with outcome `applied`: answer its waiter, with the receipt of
    /// this replica's own fsync.
    pub(crate) async fn finish_proposal(&self, ticket: Ticket, seq: u64, applied: Applied) {
        let receipt = match self.durable(seq).await {
            Ok(receipt) => receipt,
            Err(e) => {
                self.fail_proposal(ticket, e.to_string(), true);
                return;
            }
        };
        let Op { record, reply } = ticket.0;
        let dedup_waiters = self.core().take_dedup_waiters(&reply, true);
        sink::answer(&receipt, reply, &record, applied, dedup_waiters);
    }

    /// Raft did not commit a proposal, or cannot say: undo its reservation
    /// and answer `operation_unconfirmed` (`unconfirmed`) or `unavailable`.
    pub(crate) fn fail_proposal(&self, ticket: Ticket, reason: String, unconfirmed: bool) {
        let make_error: fn(String) -> WriteError = if unconfirmed {
            |reason| WriteError::Unconfirmed { reason }
        } else {
            |reason| WriteError::Unavailable { reason }
        };
        sink::refuse(&self.inner.shared, vec![ticket.0], make_error, &reason);
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

    /// Appends Raft entries (`(seq, term, kind, body)`, contiguous, right
    /// after the last one appended) to the journal; `done` is told once all
    /// of them are durable.
    pub(crate) fn append_log(
        &self,
        entries: Vec<LogRecord>,
        done: FlushCallback,
    ) -> Result<(), JournalError> {
        let r = self.replication();
        let Some(last) = entries.last().map(|e| e.seq) else {
            done(Ok(()));
            return Ok(());
        };
        let first = r.appended_seq.load(Ordering::Acquire) + 1;
        for (expected, e) in (first..).zip(&entries) {
            assert_eq!(
                e.seq,
                expected,
                "bug: Raft appended {} after {}",
                e.seq,
                expected - 1
            );
        }
        let mut done = Some(done);
        let n = entries.len();
        let records = entries.iter().enumerate().map(|(i, e)| {
            (
                e.kind,
                e.term,
                Entry::Replicated(Replicated {
                    seq: e.seq,
                    term: e.term,
                    kind: e.kind,
                    done: if i + 1 == n { done.take() } else { None },
                }),
            )
        });
        // The bodies are copied into the writer's buffer in the order of
        // the entries; the tail keeps them until they are written.
        let mut bodies = entries.iter().map(|e| &e.body);
        // Into the tail first: once appended, the sink may place an entry
        // (and take it out of the tail) at any moment.
        let mut unwritten = r.unwritten.lock().expect("bug: tail lock poisoned");
        let result = self.inner.journal.append_terms(records, |_, buf| {
            buf.extend_from_slice(bodies.next().expect("one body per entry"));
        });
        if result.is_ok() {
            r.appended_seq.store(last, Ordering::Release);
            unwritten.extend(entries);
        }
        result
    }

    /// Cuts the log after record `keep_seq`: the entries after it were
    /// never committed (Raft replaces a follower's conflicting suffix).
    pub(crate) async fn truncate_log(&self, keep_seq: u64) -> Result<(), JournalError> {
        let r = self.replication();
        let appended = r.appended_seq.load(Ordering::Acquire);
        if keep_seq >= appended {
            return Ok(());
        }
        self.durable(appended).await?;
        let (cut, last_kept) = {
            let index = r.index();
            let cut = index
                .get(keep_seq + 1)
                .ok_or(JournalError::Closed)
                .map(|(_, _, loc)| loc)?;
            (cut, index.get(keep_seq).map(|(_, _, loc)| loc))
        };
        let (tx, rx) = oneshot::channel();
        self.inner.journal.control(Control::Truncate(Truncate {
            keep_seq,
            cut,
            last_kept,
            done: tx,
        }))?;
        rx.await.map_err(|_| JournalError::Closed)??;
        let mut index = r.index();
        let keep = (keep_seq + 1).saturating_sub(index.first_seq) as usize;
        index.entries.truncate(keep);
        drop(index);
        r.appended_seq.store(keep_seq, Ordering::Release);
        Ok(())
    }

    /// Waits until everything appended so far is durable (the vote must
    /// never reach the disk before log entries appended ahead of it).
    pub(crate) async fn flush_log(&self) -> Result<(), JournalError> {
        let appended = self.replication().appended_seq.load(Ordering::Acquire);
        self.durable(appended).await.map(|_| ())
    }

    /// `(first, last)` sequence numbers of the live log and the term of
    /// the last one; `last < first` when it is empty (`last` is then the
    /// last purged record, 0 if none).
    pub(crate) fn log_bounds(&self) -> (u64, u64, Option<u64>) {
        let r = self.replication();
        let appended = r.appended_seq.load(Ordering::Acquire);
        let first = r.index().first_seq;
        (first, appended, self.log_term(appended))
    }

    /// `(seq, term)` of the last purged record, if any.
    pub(crate) fn log_purged(&self) -> Option<(u64, u64)> {
        let index = self.replication().index();
        (index.first_seq > 1).then(|| (index.first_seq - 1, index.purged_term))
    }

    /// The term of record `seq`, if the live log holds it or it is the
    /// last purged one.
    pub(crate) fn log_term(&self, seq: u64) -> Option<u64> {
        let r = self.replication();
        // The tail first: the sink places an entry in the index before it
        // leaves the tail, so one of the two always has it.
        if let Some(e) = r.unwritten_entry(seq, |e| e.term) {
            return Some(e);
        }
        let index = r.index();
        if seq > 0 && seq + 1 == index.first_seq {
            return Some(index.purged_term);
        }
        index.get(seq).map(|(term, _, _)| term)
    }

    /// Forgets the log up to record `seq` (of `term`): a snapshot covers
    /// it, and openraft will never read it again. Compaction may then
    /// delete the segments that hold only such records.
    pub(crate) fn purge_log(&self, seq: u64, term: u64) {
        let r = self.replication();
        let mut index = r.index();
        if seq < index.first_seq {
            return;
        }
        let n = usize::try_from(seq + 1 - index.first_seq)
            .unwrap_or(usize::MAX)
            .min(index.entries.len());
        index.entries.drain(..n);
        index.first_seq = seq + 1;
        index.purged_term = term;
        r.appended_seq.fetch_max(seq, Ordering::AcqRel);
    }

    /// The segment (as a record location's file) that holds the oldest
    /// record of the Raft log: compaction leaves it and every later one
    /// alone. `None` on a single node, or when the log is all purged.
    pub(super) fn purge_floor(&self) -> Option<u32> {
        let r = self.inner.replication.as_ref()?;
        let index = r.index();
        index.entries.front().map(|&(_, _, loc)| loc.file)
    }

    /// Reads record `seq` of the live log back (from memory while it is not
    /// yet written).
    pub(crate) fn read_log(&self, seq: u64) -> Result<Option<LogRecord>, JournalError> {
        let r = self.replication();
        // The tail first: the sink places an entry in the index before it
        // leaves the tail, so one of the two always has it.
        let unwritten = r.unwritten_entry(seq, LogRecord::clone);
        if unwritten.is_some() {
            return Ok(unwritten);
        }
        let placed = r.index().get(seq);
        let Some((term, kind, loc)) = placed else {
            return Ok(None);
        };
        let file = self.inner.reader.file(loc.file)?;
        let body = self.inner.reader.read_body_from(&file, loc)?;
        Ok(Some(LogRecord {
            seq,
            term,
            kind,
            body,
        }))
    }

    /// Applies committed record `seq` (on every replica, in log order) once
    /// it is durable here, and wakes whoever waits for what it changed.
    pub(crate) async fn apply_committed(
        &self,
        seq: u64,
        kind: u8,
        body: &[u8],
    ) -> Result<Applied, JournalError> {
        self.durable(seq).await?;
        let loc = {
            let index = self.replication().index();
            index.get(seq).map(|(_, _, loc)| loc)
        };
        let loc = loc.ok_or_else(|| JournalError::BadRecord {
            file: self.inner.dir.clone(),
            offset: 0,
            reason: format!("committed record {seq} is not in the log"),
        })?;
        let record = Record::decode(kind, body).map_err(|e| JournalError::BadRecord {
            file: self.inner.dir.clone(),
            offset: u64::from(loc.offset),
            reason: e.to_string(),
        })?;
        let mut core = self.core();
        core.last_now = core.last_now.max(record.at);
        Ok(sink::apply(
            &self.inner.shared,
            &mut core,
            &record,
            seq,
            loc,
        ))
    }

    /// This replica was elected primary in `term`: propose the barrier and
    /// serve once it is applied (every record of earlier terms is then in
    /// the state, so ids and leases start above them).
    pub(crate) async fn start_serving(&self, term: u64) -> Result<(), WriteError> {
        let r = self.replication();
        r.starting.store(term, Ordering::Release);
        let (tx, rx) = oneshot::channel();
        {
            let mut core = self.core();
            let at = self.now(&mut core);
            let record = Record {
                at,
                command: Command::Epoch { epoch: term },
            };
            self.propose(record, None, Reply::Done(tx), term)
                .map_err(super::write::unavailable)?;
        }
        rx.await.map_err(|_| super::write::closed())??;
        let mut core = self.core();
        if r.starting.load(Ordering::Acquire) != term {
            return Err(WriteError::Unavailable {
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
        let r = self.replication();
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

    /// Whether node `id` was retired.
    pub(crate) fn node_retired(&self, id: u64) -> bool {
        self.core().spool.retired_nodes().contains(&id)
    }

    /// The spool's last applied record and the replica set as of it.
    pub(crate) fn applied_with_cluster_config(&self) -> (u64, Option<Vec<u8>>) {
        let core = self.core();
        let config = core.spool.cluster_config().map(<[u8]>::to_vec);
        (core.spool.applied_seq(), config)
    }
}

/// What tests of replicated mode without openraft need.
#[cfg(test)]
pub(crate) mod testing {
    use tokio::sync::{mpsc, oneshot};

    use super::{Engine, LogRecord};
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

    /// A Raft of one: each proposal is appended in `term`, then committed
    /// and applied at once.
    pub(crate) fn raft_of_one(engine: &Engine, term: u64) {
        let (tx, mut rx) = mpsc::unbounded_channel::<super::Proposal>();
        engine.attach_proposer(tx);
        let e = engine.clone();
        tokio::spawn(async move {
            while let Some(p) = rx.recv().await {
                let seq = e.log_bounds().1 + 1;
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
                e.append_log(vec![record], done).unwrap();
                assert!(done_rx.await.unwrap());
                let applied = e.apply_committed(seq, p.kind, &p.body).await.unwrap();
                e.finish_proposal(p.ticket, seq, applied).await;
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

    async fn append(engine: &Engine, seqs: std::ops::RangeInclusive<u64>, term: u64) {
        let records = seqs.map(|s| entry(s, term, 4 << 10)).collect();
        let (tx, rx) = oneshot::channel();
        engine
            .append_log(
                records,
                Box::new(move |r| {
                    let _ = tx.send(r.is_ok());
                }),
            )
            .unwrap();
        assert!(rx.await.unwrap(), "the entries became durable");
    }

    /// The term of every record of the log, in order (and each body whole).
    fn terms(engine: &Engine) -> Vec<u64> {
        let (first, last, _) = engine.log_bounds();
        (first..=last)
            .map(|seq| {
                let r = engine.read_log(seq).unwrap().expect("no hole");
                assert_eq!(r, entry(seq, r.term, 4 << 10), "record {seq} intact");
                r.term
            })
            .collect()
    }

    #[tokio::test]
    async fn a_truncated_suffix_never_comes_back_and_the_kept_prefix_stays() {
        for cut in [0, 1, 15, 16, 39] {
            let sim = SimStorage::new();
            let (engine, _) = Engine::open(options(&sim)).await.unwrap();
            // Forty 4 KiB records in batches of five: three 64 KiB
            // segments, the cut falling inside one or on a boundary.
            for first in (1..=40).step_by(5) {
                append(&engine, first..=first + 4, 1).await;
            }
            engine.truncate_log(cut).await.unwrap();
            append(&engine, cut + 1..=cut + 5, 2).await;
            let mut expected = vec![1; cut as usize];
            expected.extend([2; 5]);
            assert_eq!(terms(&engine), expected, "cut after {cut}");

            // Power lost right after: what was answered durable is there,
            // and nothing of the old suffix.
            sim.crash(Tear::DropUnsynced);
            drop(engine);
            let (engine, _) = Engine::open(options(&sim)).await.unwrap();
            assert_eq!(terms(&engine), expected, "cut after {cut}, replayed");
            // The log goes on from there.
            append(&engine, cut + 6..=cut + 6, 3).await;
            engine.close();
        }
    }
}
