//! The engine side of push delivery: settling a worker's lease by the
//! outcome of its HTTP attempt, with the attempt recorded.

use crate::time::Millis;
use std::borrow::Cow;
use std::time::Duration;

use tokio::sync::oneshot;

use super::Engine;
use super::core::{Core, Reply};
use super::error::closed;
use super::error::{ReadError, SettleError, WriteError};
use super::lease::settle_error;
use super::notes as operational;
use super::token::LeaseToken;
use crate::spool::command::{ATTEMPTS_KEPT, AttemptInfo};
use crate::spool::queue::origin_queue_name;
use crate::spool::record::decode_attempts;
use crate::spool::state::{AttemptEffect, BreakerTurn};
use crate::spool::{Command, FailReason, MessageId, Record, Spool};

/// An open breaker's first probe comes this long after it opens; each
/// failed probe doubles the wait up to [`PROBE_INTERVAL_MAX`]
/// (`delivery/worker.rs` probes).
pub(crate) const PROBE_INTERVAL_FIRST: Duration = Duration::from_secs(5);
pub(crate) const PROBE_INTERVAL_MAX: Duration = Duration::from_secs(300);

/// What a delivery attempt means for its message (docs/contract.md §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// 2xx: ack.
    Delivered,
    /// Retryable: nack with this delay (to the failure queue once past
    /// `max_retries`).
    Retry { delay_ms: u64 },
    /// A permanent status: to the failure queue at once, retry count kept.
    Permanent { status: u16 },
    /// The breaker's probe failed: back in line after `delay_ms` without
    /// raising the retry count.
    ProbeFailed { delay_ms: u64 },
}

impl Engine {
    /// The last attempts of a message, oldest first (empty if never tried).
    pub fn attempts(&self, queue: &str, id: MessageId) -> Result<Vec<AttemptInfo>, ReadError> {
        let pinned = {
            let core = self.core();
            let base = origin_queue_name(queue);
            let Some((q, _)) = core.spool.find(base, id) else {
                return Ok(Vec::new());
            };
            match core.spool.attempts_loc(&q.name, id) {
                None => return Ok(Vec::new()),
                Some(loc) => (self.inner.reader.file(loc.file), loc),
            }
        };
        let (file, loc) = pinned;
        self.read_decoded(file, loc, "attempt record", |_, body| decode_attempts(body))
    }

    /// When the open circuit breaker of `queue` probes next; `None` while
    /// it is closed (or the queue is gone).
    pub fn breaker(&self, queue: &str) -> Option<Millis> {
        self.core()
            .spool
            .queue(queue)
            .and_then(|q| q.breaker.next_probe)
    }

    /// Opens a push queue's circuit breaker, moves its next probe, or
    /// closes it. Whoever waits on the queue looks again: its dispatcher
    /// and probe (`delivery/worker.rs`) wait for this, not for a timer.
    pub fn set_breaker(&self, queue: &str, next_probe: Option<Millis>) {
        let was_open = {
            let mut core = self.core();
            let was_open = (core.spool.queue(queue)).map(|q| q.breaker.next_probe.is_some());
            core.spool.set_breaker(queue, next_probe);
            core.wake_all(queue);
            was_open
        };
        if was_open.is_some_and(|was| was != next_probe.is_some()) {
            self.tell(operational::breaker(queue, next_probe, self.clock_ms()));
        }
    }

    /// What a push queue's dispatcher or probe waits on: woken when the
    /// queue's breaker changes, and when a message becomes visible. Take
    /// it (and enable its `notified()`) before looking at the state, so
    /// that no change falls between the look and the wait.
    pub(crate) fn queue_signal(&self, queue: &str) -> std::sync::Arc<tokio::sync::Notify> {
        self.core().notify_for(queue)
    }

    /// Settles a worker's lease by the outcome of `attempt`: reserves the
    /// message and appends the records, and says what becomes of the
    /// message once they are durable ([`SettleWait`]). The worker need not
    /// wait for that before its next attempt: until the records are
    /// durable the message is reserved (no one else can lease it), and if
    /// they fail the reservation is undone. A stale lease (expired, or the
    /// message was cancelled meanwhile) is `StaleLease`, and nothing is
    /// written.
    pub(crate) fn settle_delivery(
        &self,
        queue: &str,
        lease: LeaseToken,
        attempt: AttemptInfo,
        outcome: Outcome,
    ) -> Result<SettleWait, SettleError> {
        if lease.epoch != self.epoch() {
            return Err(SettleError::StaleLease);
        }
        let id = lease.id;
        let last_status = attempt.status;
        let attempts = self.attempts_to_record(queue, id, attempt, outcome)?;
        let (tx, rx) = oneshot::channel();
        let settled;
        let breaker;
        {
            let mut core = self.core();
            let now = self.now(&mut core);
            let q: Cow<'static, str> = Cow::Owned(queue.to_owned());
            let settle = reserve(&mut core.spool, queue, &lease, now, outcome, last_status)?;
            breaker = count_attempt(&mut core.spool, queue, outcome, now);
            settled = Settled::by(&settle);
            let settle = Record {
                at: now,
                command: settle,
            };
            let attempt_record = attempts.map(|attempts| Record {
                at: now,
                command: Command::Attempt {
                    queue: q,
                    id,
                    attempts,
                },
            });
            self.append_settle(&mut core, attempt_record, settle, tx)?;
        }
        if breaker == BreakerTurn::Opened {
            let next_probe = self.breaker(queue);
            self.tell(operational::breaker(queue, next_probe, self.clock_ms()));
        }
        Ok(SettleWait {
            settled,
            breaker,
            durable: rx,
        })
    }

    /// The attempts to record beside a settle: the message's last ones
    /// with `attempt` added, at most [`ATTEMPTS_KEPT`]. `None` for a
    /// delivered message of a queue that keeps no history.
    fn attempts_to_record(
        &self,
        queue: &str,
        id: MessageId,
        attempt: AttemptInfo,
        outcome: Outcome,
    ) -> Result<Option<Vec<AttemptInfo>>, SettleError> {
        // A delivered message's attempts are kept only by a queue that
        // keeps its history (they are shown with it); else they go with it.
        let keeps_history = self
            .core()
            .spool
            .queue(queue)
            .is_some_and(|q| q.settings.history_retention_ms > 0);
        if outcome == Outcome::Delivered && !keeps_history {
            return Ok(None);
        }
        let mut attempts = self.attempts(queue, id)?;
        attempts.push(attempt);
        if attempts.len() > ATTEMPTS_KEPT {
            attempts.drain(..attempts.len() - ATTEMPTS_KEPT);
        }
        Ok(Some(attempts))
    }

    /// Appends a settle's records under the lock, its attempts (if any)
    /// first; if either is refused, the message's reservation is undone.
    fn append_settle(
        &self,
        core: &mut Core,
        attempt_record: Option<Record<'static>>,
        settle: Record<'static>,
        tx: oneshot::Sender<Result<(), WriteError>>,
    ) -> Result<(), SettleError> {
        let undo = settle.clone();
        let appended = match attempt_record {
            Some(r) => self.append(core, r, None, Reply::Nobody),
            None => Ok(()),
        }
        .and_then(|()| self.append(core, settle, None, Reply::Done(tx)));
        if let Err(e) = appended {
            core.release(&undo);
            return Err(e.into());
        }
        Ok(())
    }
}

/// Reserves the message of `lease` and says the command that settles it:
/// a nack for a retryable outcome (the state machine decides whether past
/// `max_retries` it goes to the failure queue), else an ack, a fail or a
/// retry that keeps the retry count.
fn reserve(
    spool: &mut Spool,
    queue: &str,
    lease: &LeaseToken,
    now: Millis,
    outcome: Outcome,
    last_status: Option<u16>,
) -> Result<Command<'static>, SettleError> {
    let id = lease.id;
    if let Outcome::Retry { delay_ms } = outcome {
        return spool
            .reserve_nack(queue, id, lease.serial, now, delay_ms, last_status)
            .map_err(|e| settle_error(queue, e));
    }
    spool
        .reserve_settle(queue, id, lease.serial, now)
        .map_err(|e| settle_error(queue, e))?;
    let retry_count = retry_count(spool, queue, id);
    let queue: Cow<'static, str> = Cow::Owned(queue.to_owned());
    Ok(match outcome {
        Outcome::Delivered => Command::Ack { queue, id },
        Outcome::Permanent { status } => Command::Fail {
            queue,
            id,
            reason: FailReason::PermanentStatus,
            last_status: Some(status),
            retry_count,
        },
        Outcome::ProbeFailed { delay_ms } => Command::Retry {
            queue,
            id,
            visible_at: now + delay_ms as i64,
            retry_count,
        },
        Outcome::Retry { .. } => unreachable!("handled above"),
    })
}

/// Counts an attempt: as a delivery, for the queue's counters, and as an
/// attempt for its circuit breaker, which it may open or close.
fn count_attempt(spool: &mut Spool, queue: &str, outcome: Outcome, now: Millis) -> BreakerTurn {
    spool.count_delivery(queue, outcome == Outcome::Delivered);
    spool.count_attempt(
        queue,
        outcome.effect(),
        now + PROBE_INTERVAL_FIRST.as_millis() as i64,
    )
}

impl Outcome {
    /// What the attempt counts as for the queue's circuit breaker.
    fn effect(self) -> AttemptEffect {
        match self {
            Outcome::Delivered => AttemptEffect::Delivered,
            Outcome::Permanent { .. } => AttemptEffect::Permanent,
            Outcome::Retry { .. } => AttemptEffect::Retryable { probe: false },
            Outcome::ProbeFailed { .. } => AttemptEffect::Retryable { probe: true },
        }
    }
}

/// A settle whose records are appended: what it does to the message, once
/// they are durable.
#[derive(Debug)]
pub(crate) struct SettleWait {
    pub settled: Settled,
    /// What the attempt did to the queue's breaker.
    pub breaker: BreakerTurn,
    durable: oneshot::Receiver<Result<(), WriteError>>,
}

impl SettleWait {
    /// Waits until the records are durable (or refused).
    pub(crate) async fn durable(self) -> Result<Settled, SettleError> {
        self.durable.await.map_err(|_| closed())??;
        Ok(self.settled)
    }
}

/// What a settled delivery did to its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Acked: gone for good.
    Delivered,
    /// Back in line, to be tried again.
    Retried,
    /// Moved to the failure queue (a permanent status, or its last retry).
    Failed,
}

impl Settled {
    /// What `settle`, the command that settles a delivery, does to its
    /// message.
    fn by(settle: &Command<'_>) -> Settled {
        match settle {
            Command::Ack { .. } => Settled::Delivered,
            Command::Fail { .. } => Settled::Failed,
            _ => Settled::Retried,
        }
    }
}

fn retry_count(spool: &crate::spool::Spool, queue: &str, id: MessageId) -> u32 {
    spool.find(queue, id).map_or(0, |(_, m)| m.retry_count)
}
