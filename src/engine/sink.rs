//! What happens to a record once the journal is done with it: apply
//! to the state machine and answer, or undo the reservation and report.
//!
//! This runs on the journal's writer or applier thread (one at a time), in
//! journal order, for every record, whether or not its caller is still
//! waiting: an HTTP client that hangs up never leaves a record that only a
//! restart brings to life.

use std::sync::Arc;

use super::core::{Arrival, Core, Reply, SendOutcome, SendReply, Shared};
use super::error::{SendError, WriteError};
use crate::journal::{BatchFailure, BatchSink, Durable, Placed, RecordLoc};
use crate::spool::queue::failed_queue_name;
use crate::spool::{Applied, Command, MessageId, Record};

/// One record of a single node: the record (for apply) and its waiter.
pub(super) struct Op {
    pub record: Record<'static>,
    pub reply: Reply,
}

/// What the journal holds between append and fsync.
pub(super) enum Entry {
    /// A single node's record: applied and answered once durable.
    Local(Op),
    /// Replicated mode: an entry of the Raft log. Once durable it is only
    /// placed (its location noted, `done` told); it is applied when Raft
    /// says it is committed (`replicated.rs`).
    Replicated(Replicated),
}

pub(crate) type FlushCallback = Box<dyn FnOnce(Result<(), std::io::Error>) + Send>;

pub(super) struct Replicated {
    pub seq: u64,
    pub term: u64,
    pub kind: u8,
    /// Told once this entry (and every one before it) is durable, or not.
    pub done: Option<FlushCallback>,
}

/// Replicated mode: the Raft log's index of where each entry landed, told
/// by the sink in log order (`replicated::Replication` implements it).
pub(super) trait PlacedLog: Send + Sync {
    fn placed(&self, seq: u64, term: u64, kind: u8, loc: RecordLoc);
}

pub(super) struct Sink {
    pub shared: Arc<Shared>,
    /// Replicated mode: where each entry of the Raft log landed.
    pub replication: Option<Arc<dyn PlacedLog>>,
}

impl BatchSink<Entry> for Sink {
    fn durable(&mut self, receipt: &Durable, batch: Vec<Placed<Entry>>) {
        crate::metrics::record_fsync(receipt.fsync_duration());
        let mut answers = Vec::with_capacity(batch.len());
        let mut flushed = Vec::new();
        let wakes = {
            let mut core = self.shared.core.lock().expect("core lock poisoned");
            core.defer_wakes();
            for placed in batch {
                let Op { record, reply } = match placed.entry {
                    Entry::Local(op) => op,
                    Entry::Replicated(r) => {
                        assert_eq!(r.seq, placed.seq, "bug: Raft entry placed out of order");
                        if let Some(replication) = &self.replication {
                            replication.placed(r.seq, r.term, r.kind, placed.loc);
                        }
                        core.note_file(placed.loc.file);
                        flushed.extend(r.done);
                        continue;
                    }
                };
                let applied = apply(&self.shared, &mut core, &record, placed.seq, placed.loc);
                let dedup_waiters = core.take_dedup_waiters(&reply, true);
                answers.push((reply, record, applied, dedup_waiters));
            }
            core.take_wakes()
        };
        for (reply, record, applied, dedup_waiters) in answers {
            answer(receipt, reply, &record, applied, dedup_waiters);
        }
        for wake in wakes {
            wake.run();
        }
        for done in flushed {
            done(Ok(()));
        }
    }

    fn failed(&mut self, failure: &BatchFailure, batch: Vec<Entry>) {
        let (make_error, poisoned): (fn(String) -> WriteError, bool) = match failure {
            BatchFailure::RolledBack(_) => (|reason| WriteError::Unavailable { reason }, false),
            BatchFailure::Unconfirmed(_) => (|reason| WriteError::Unconfirmed { reason }, true),
        };
        let reason = match failure {
            BatchFailure::RolledBack(e) | BatchFailure::Unconfirmed(e) => e.to_string(),
        };
        if poisoned {
            tracing::error!(error = %reason, "fsync failed: journal poisoned, no more writes");
            self.shared.poisoned.send_replace(true);
        } else {
            tracing::warn!(error = %reason, "journal write failed and was rolled back");
        }
        let mut ops = Vec::with_capacity(batch.len());
        for entry in batch {
            match entry {
                Entry::Local(op) => ops.push(op),
                Entry::Replicated(r) => {
                    if let Some(done) = r.done {
                        done(Err(std::io::Error::other(reason.clone())));
                    }
                    // Raft cannot go on past a hole in its log: stop, and
                    // let replay (and the other replicas) decide.
                    if !poisoned {
                        tracing::error!(error = %reason, "a Raft log write failed: stopping");
                        self.shared.poisoned.send_replace(true);
                    }
                }
            }
        }
        refuse(&self.shared, ops, make_error, &reason);
    }
}

/// Undoes the reservations of records that were not written (or whose
/// outcome is unknown) and answers their waiters with `make_error`.
pub(super) fn refuse(
    shared: &Shared,
    ops: Vec<Op>,
    make_error: fn(String) -> WriteError,
    reason: &str,
) {
    let mut answers = Vec::with_capacity(ops.len());
    {
        let mut core = shared.core.lock().expect("core lock poisoned");
        for op in ops {
            shared.memory_landed(&op.record);
            core.release(&op.record);
            let waiters = core.take_dedup_waiters(&op.reply, false);
            answers.push((op.reply, waiters));
        }
    }
    for (reply, waiters) in answers {
        for w in waiters {
            let _ = w.send(Err(make_error(reason.to_owned()).into()));
        }
        match reply {
            Reply::Nobody => {}
            Reply::Send { tx, .. } => {
                let _ = tx.send(Err(make_error(reason.to_owned()).into()));
            }
            Reply::Done(tx) => {
                let _ = tx.send(Err(make_error(reason.to_owned())));
            }
            Reply::Count(tx) => {
                let _ = tx.send(Err(make_error(reason.to_owned())));
            }
        }
    }
}

/// Applies one durable record (committed, in replicated mode) and tells
/// whoever waits for what it changed: `tail` subscribers, receivers.
pub(super) fn apply(
    shared: &Shared,
    core: &mut Core,
    record: &Record<'_>,
    seq: u64,
    loc: RecordLoc,
) -> Applied {
    let applied = core.spool.apply(record, seq, loc);
    shared.memory_landed(record);
    if let Command::Event(meta) = &record.command
        && let Some(hash) = meta.dedup_hash
    {
        core.pending_events.remove(&hash);
    }
    if applied != Applied::Missing {
        announce(shared, &record.command);
        if let Some(note) = super::notes::of_command(&record.command, record.at) {
            shared.notes.tell(note);
        }
    }
    core.note_file(loc.file);
    core.note_active(&record.command);
    wake_after(core, &record.command);
    applied
}

/// Tells `tail` subscribers what arrived where.
fn announce(shared: &Shared, command: &Command<'_>) {
    if shared.arrivals.receiver_count() == 0 {
        return;
    }
    let send = |queue: String, id: MessageId| {
        let _ = shared.arrivals.send(Arrival { queue, id });
    };
    match command {
        Command::Enqueue(meta) => send(meta.queue.to_string(), meta.id),
        Command::Resend { queue, id, .. } => send(queue.to_string(), *id),
        Command::Event(meta) => {
            for (queue, id) in &meta.deliveries {
                send(queue.to_string(), *id);
            }
        }
        Command::Fail { queue, id, .. } => send(failed_queue_name(queue), *id),
        Command::Redrive { queue, ids } => {
            for id in ids {
                send(queue.to_string(), *id);
            }
        }
        _ => {}
    }
}

/// Wakes the receivers of whichever queue just gained a visible message.
fn wake_after(core: &mut Core, command: &Command<'_>) {
    match command {
        Command::Enqueue(meta) => core.wake_one(&meta.queue),
        Command::Resend { queue, .. } => core.wake_one(queue),
        Command::Event(meta) => {
            for (queue, _) in &meta.deliveries {
                core.wake_one(queue);
            }
        }
        Command::Retry { queue, .. } => core.wake_one(queue),
        Command::Fail { queue, .. } => core.wake_one(&failed_queue_name(queue)),
        Command::Redrive { queue, .. } => core.wake_all(queue),
        Command::QueuePause { name, .. } => core.wake_all(name),
        Command::QueueUpsert { name, .. } | Command::QueueDelete { name } => {
            core.queue_changed(name)
        }
        _ => {}
    }
}

/// Answers a durable record's waiter. Taking the receipt is the point: only
/// the journal's writer makes one, and only after the fsync.
pub(super) fn answer(
    _durable: &Durable,
    reply: Reply,
    record: &Record<'_>,
    applied: Applied,
    dedup_waiters: Vec<SendReply>,
) {
    match reply {
        Reply::Nobody => {}
        Reply::Send { tx, .. } => {
            let Command::Enqueue(meta) = &record.command else {
                panic!("bug: send reply on a non-enqueue record");
            };
            let result = match applied {
                Applied::Missing => Err(SendError::QueueNotFound {
                    queue: meta.queue.to_string(),
                }),
                _ => Ok(SendOutcome {
                    id: meta.id,
                    deduplicated: false,
                }),
            };
            for w in dedup_waiters {
                let _ = w.send(match &result {
                    Ok(o) => Ok(SendOutcome {
                        deduplicated: true,
                        ..*o
                    }),
                    Err(_) => Err(SendError::QueueNotFound {
                        queue: meta.queue.to_string(),
                    }),
                });
            }
            let _ = tx.send(result);
        }
        Reply::Done(tx) => {
            let _ = tx.send(Ok(()));
        }
        Reply::Count(tx) => {
            let n = match applied {
                Applied::Count(n) => n,
                _ => 0,
            };
            let _ = tx.send(Ok(n));
        }
    }
}
