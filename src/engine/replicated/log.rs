//! The Raft side's handle on the engine: the journal as openraft's log
//! store and the spool as its state machine (`cluster/store.rs` drives
//! it). A [`RaftLog`] reads and writes entries of the Raft log, applies
//! committed ones, and takes and installs snapshots (`snapshot/`); the
//! primary's side (proposals, serving, stepping down) is on the
//! [`Replica`](super::Replica) (`mod.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::oneshot;

use super::{LogRecord, Replication};
use crate::engine::Engine;
use crate::engine::sink::{self, Entry, FlushCallback, Replicated};
use crate::journal::{Control, JournalError, Truncate};
use crate::spool::{Applied, Record};

/// The Raft log and state machine of a replica. Cheap to clone.
#[derive(Clone)]
pub(crate) struct RaftLog {
    pub(super) engine: Engine,
    pub(super) r: Arc<Replication>,
}

impl RaftLog {
    /// Appends Raft entries (`(seq, term, kind, body)`, contiguous, right
    /// after the last one appended) to the journal; `done` is told once all
    /// of them are durable.
    pub(crate) fn append(
        &self,
        entries: Vec<LogRecord>,
        done: FlushCallback,
    ) -> Result<(), JournalError> {
        let r = &self.r;
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
        let result = self.engine.inner.journal.append_terms(records, |_, buf| {
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
    pub(crate) async fn truncate(&self, keep_seq: u64) -> Result<(), JournalError> {
        let r = &self.r;
        let appended = r.appended_seq.load(Ordering::Acquire);
        if keep_seq >= appended {
            return Ok(());
        }
        self.engine.durable(appended).await?;
        let (cut, last_kept) = {
            let index = r.index();
            let cut = index
                .get(keep_seq + 1)
                .ok_or(JournalError::Closed)
                .map(|(_, _, loc)| loc)?;
            (cut, index.get(keep_seq).map(|(_, _, loc)| loc))
        };
        let (tx, rx) = oneshot::channel();
        self.engine
            .inner
            .journal
            .control(Control::Truncate(Truncate {
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
    pub(crate) async fn flush(&self) -> Result<(), JournalError> {
        let appended = self.r.appended_seq.load(Ordering::Acquire);
        self.engine.durable(appended).await.map(|_| ())
    }

    /// `(first, last)` sequence numbers of the live log and the term of
    /// the last one; `last < first` when it is empty (`last` is then the
    /// last purged record, 0 if none).
    pub(crate) fn bounds(&self) -> (u64, u64, Option<u64>) {
        let r = &self.r;
        let appended = r.appended_seq.load(Ordering::Acquire);
        let first = r.index().first_seq;
        (first, appended, self.term(appended))
    }

    /// `(seq, term)` of the last purged record, if any.
    pub(crate) fn purged(&self) -> Option<(u64, u64)> {
        let index = self.r.index();
        (index.first_seq > 1).then(|| (index.first_seq - 1, index.purged_term))
    }

    /// The term of record `seq`, if the live log holds it or it is the
    /// last purged one.
    pub(crate) fn term(&self, seq: u64) -> Option<u64> {
        let r = &self.r;
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
    pub(crate) fn purge(&self, seq: u64, term: u64) {
        let r = &self.r;
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

    /// Reads record `seq` of the live log back (from memory while it is not
    /// yet written).
    pub(crate) fn read(&self, seq: u64) -> Result<Option<LogRecord>, JournalError> {
        let r = &self.r;
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
        let file = self.engine.inner.reader.file(loc.file)?;
        let body = self.engine.inner.reader.read_body_from(&file, loc)?;
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
        self.engine.durable(seq).await?;
        let loc = {
            let index = self.r.index();
            index.get(seq).map(|(_, _, loc)| loc)
        };
        let loc = loc.ok_or_else(|| JournalError::BadRecord {
            file: self.engine.inner.dir.clone(),
            offset: 0,
            reason: format!("committed record {seq} is not in the log"),
        })?;
        let record = Record::decode(kind, body).map_err(|e| JournalError::BadRecord {
            file: self.engine.inner.dir.clone(),
            offset: u64::from(loc.offset),
            reason: e.to_string(),
        })?;
        crate::failpoint::hit(crate::failpoint::RAFT_BEFORE_APPLY);
        // The primary's stamp: this replica's time runs on from it (never
        // frozen behind it) should it become the primary.
        self.engine.inner.clock.not_before(record.at);
        let mut core = self.engine.core();
        core.last_now = core.last_now.max(record.at);
        Ok(sink::apply(
            &self.engine.inner.shared,
            &mut core,
            &record,
            seq,
            loc,
        ))
    }

    /// The spool's last applied record and the replica set as of it.
    pub(crate) fn applied_with_cluster_config(&self) -> (u64, Option<Vec<u8>>) {
        let core = self.engine.core();
        let config = core.spool.cluster_config().map(<[u8]>::to_vec);
        (core.spool.applied_seq(), config)
    }
}
