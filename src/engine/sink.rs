//! What happens to a record once the journal is done with it: apply
//! to the state machine and answer, or undo the reservation and report.
//!
//! This runs on the journal's writer or applier thread (one at a time), in
//! journal order, for every record, whether or not its caller is still
//! waiting: an HTTP client that hangs up never leaves a record that only a
//! restart brings to life.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::core::{Arrival, Core, FileMeta, Shared};
use super::error::{SendError, WriteError};
use crate::journal::{BatchFailure, BatchSink, Durable, Placed};
use crate::spool::queue::failed_queue_name;
use crate::spool::{Applied, Command, MessageId, Record};

/// The engine's answer to a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendOutcome {
    pub id: MessageId,
    /// True when the idempotency key was seen inside the dedup window and
    /// nothing new was stored.
    pub deduplicated: bool,
}

pub(super) type SendReply = oneshot::Sender<Result<SendOutcome, SendError>>;

/// Who waits for a record, and for what.
pub(super) enum Reply {
    /// Records the engine writes on its own (expiries, the epoch).
    Nobody,
    /// A send; `dedup` names the pending dedup key it owns.
    Send {
        tx: SendReply,
        dedup: Option<(String, u64)>,
    },
    Done(oneshot::Sender<Result<(), WriteError>>),
    Count(oneshot::Sender<Result<u64, WriteError>>),
}

/// One journal entry: the record (for apply) and its waiter.
pub(super) struct Op {
    pub record: Record<'static>,
    pub reply: Reply,
}

pub(super) struct Sink {
    pub shared: Arc<Shared>,
}

impl BatchSink<Op> for Sink {
    fn durable(&mut self, receipt: &Durable, batch: Vec<Placed<Op>>) {
        crate::metrics::record_fsync(receipt.fsync_duration());
        let mut answers = Vec::with_capacity(batch.len());
        {
            let mut core = self.shared.core.lock().expect("core lock poisoned");
            for placed in batch {
                let Op { record, reply } = placed.entry;
                let applied = core.spool.apply(&record, placed.seq, placed.loc);
                if applied != Applied::Missing {
                    announce(&self.shared, &record.command);
                }
                if !core.files.contains_key(&placed.loc.file) {
                    let bytes = core.segment_bytes;
                    core.files.insert(placed.loc.file, FileMeta { bytes });
                }
                wake_after(&core, &record.command);
                let dedup_waiters = match &reply {
                    Reply::Send {
                        dedup: Some(key), ..
                    } => {
                        let waiters = core.pending_dedup.remove(key).unwrap_or_default();
                        for _ in &waiters {
                            core.spool.count_deduplicated(&key.0);
                        }
                        waiters
                    }
                    _ => Vec::new(),
                };
                answers.push((reply, record, applied, dedup_waiters));
            }
        }
        for (reply, record, applied, dedup_waiters) in answers {
            answer(receipt, reply, &record, applied, dedup_waiters);
        }
    }

    fn failed(&mut self, failure: &BatchFailure, batch: Vec<Op>) {
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
        let mut answers = Vec::with_capacity(batch.len());
        {
            let mut core = self.shared.core.lock().expect("core lock poisoned");
            for op in batch {
                core.release(&op.record);
                let waiters = match &op.reply {
                    Reply::Send {
                        dedup: Some(key), ..
                    } => core.pending_dedup.remove(key).unwrap_or_default(),
                    _ => Vec::new(),
                };
                answers.push((op.reply, waiters));
            }
        }
        for (reply, waiters) in answers {
            for w in waiters {
                let _ = w.send(Err(make_error(reason.clone()).into()));
            }
            match reply {
                Reply::Nobody => {}
                Reply::Send { tx, .. } => {
                    let _ = tx.send(Err(make_error(reason.clone()).into()));
                }
                Reply::Done(tx) => {
                    let _ = tx.send(Err(make_error(reason.clone())));
                }
                Reply::Count(tx) => {
                    let _ = tx.send(Err(make_error(reason.clone())));
                }
            }
        }
    }
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
fn wake_after(core: &Core, command: &Command<'_>) {
    match command {
        Command::Enqueue(meta) => core.wake_one(&meta.queue),
        Command::Retry { queue, .. } => core.wake_one(queue),
        Command::Fail { queue, .. } => core.wake_one(&failed_queue_name(queue)),
        Command::Redrive { queue, .. } => core.wake_all(queue),
        Command::QueuePause { name, .. } => core.wake_all(name),
        _ => {}
    }
}

/// Answers a durable record's waiter. Taking the receipt is the point: only
/// the journal's writer makes one, and only after the fsync.
fn answer(
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
