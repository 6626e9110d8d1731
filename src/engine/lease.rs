//! Leases: receives (a pull consumer's or a delivery worker's), and acks,
//! nacks and renewals of the leases they hand out. Leases live in memory
//! only; a restart drops them.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use super::error::{LeaseError, ReadError, SettleError};
use super::shared_reads::LARGE_RECORD_BYTES;
use super::token::LeaseToken;
use super::{Delivery, Engine, PushDelivery, RECEIVE_BATCH_MAX};
use crate::journal::format::FileId;
use crate::journal::storage::StorageFile;
use crate::journal::{JournalError, RecordLoc};
use crate::spool::DecodeError;
use crate::spool::record::decode_payload_of;
use crate::spool::state::leases::LEASE_BATCH_BYTES;
use crate::spool::{Command, Leased, MessageState, MessageView, Payload, SpoolError};
use crate::time::Millis;

/// How much longer than its request timeout a delivery worker's lease lasts.
const WORKER_LEASE_SLACK_MS: u64 = 5_000;

/// Who leases: a pull consumer, or a push queue's delivery worker.
#[derive(Debug, Clone, Copy)]
enum Consumer {
    Pull,
    Worker { probe: bool },
}

/// A file's handle taken under the core lock (or why it could not be
/// opened).
pub(super) type PinnedFile = Result<Arc<dyn StorageFile>, JournalError>;

/// A lease and the file its record is in, taken together under the core
/// lock.
type PinnedLease = (Leased, PinnedFile);

impl Engine {
    /// Leases up to `max` messages of a pull queue, waiting up to `wait` for
    /// the first one.
    pub async fn receive(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, LeaseError> {
        let leased = self.lease_inner(queue, max, wait, Consumer::Pull).await?;
        Ok(leased
            .into_iter()
            .map(|(l, payload)| Delivery {
                id: l.id,
                token: self.inner.tokens.encode(self.lease_token(&l)),
                expires_at: l.expires_at,
                retry_count: l.message.retry_count,
                enqueued_at: l.message.enqueued_at,
                payload,
                view: MessageView {
                    id: l.id,
                    state: MessageState::Leased,
                    message: l.message,
                    failure: l.failure,
                },
            })
            .collect())
    }

    /// Leases up to `max` messages of a push queue for delivery, each for
    /// the queue's `timeout` + 5 s, waiting up to `wait` for the first.
    /// With `probe`, an open circuit breaker does not stop it (the
    /// breaker's probe).
    pub(crate) async fn lease_for_delivery(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
        probe: bool,
    ) -> Result<Vec<PushDelivery>, LeaseError> {
        let leased = self
            .lease_inner(queue, max, wait, Consumer::Worker { probe })
            .await?;
        Ok(leased
            .into_iter()
            .map(|(l, payload)| PushDelivery {
                lease: self.lease_token(&l),
                retry_count: l.message.retry_count,
                enqueued_at: l.message.enqueued_at,
                payload,
            })
            .collect())
    }

    /// How long until `queue`'s next delayed (or backed-off) message
    /// becomes visible, if it has one.
    pub(crate) fn next_visible_in(&self, queue: &str) -> Option<Duration> {
        let mut core = self.core();
        let now = self.now(&mut core);
        let next = core.spool.next_visible_at(queue, now)?;
        Some(Duration::from_millis((next - now).max(1) as u64))
    }

    /// What a lease handed out now names.
    fn lease_token(&self, l: &Leased) -> LeaseToken {
        LeaseToken {
            epoch: self.epoch(),
            id: l.id,
            serial: l.serial,
        }
    }

    /// How many long polls (or worker leases) wait on `queue` now.
    #[cfg(feature = "testing")]
    pub fn receivers_waiting(&self, queue: &str) -> usize {
        self.core().receivers_of(queue)
    }

    async fn lease_inner(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
        consumer: Consumer,
    ) -> Result<Vec<(Leased, Payload)>, LeaseError> {
        let deadline = tokio::time::Instant::now() + wait;
        let max = max.clamp(1, RECEIVE_BATCH_MAX);
        loop {
            let notify = self.core().notify_for(queue);
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (leased, next_visible) = self.take_leases(queue, max, consumer)?;
            if !leased.is_empty() {
                return Ok(self.read_leased_off_runtime(queue, leased).await);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            let mut until = deadline;
            if let Some(ms) = next_visible {
                until = until.min(now + Duration::from_millis(ms.max(1) as u64));
            }
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// Leases up to `max` of `queue`'s visible messages under the core
    /// lock, with each record's file pinned, and says how long until the
    /// next one becomes visible.
    fn take_leases(
        &self,
        queue: &str,
        max: usize,
        consumer: Consumer,
    ) -> Result<(Vec<PinnedLease>, Option<Millis>), LeaseError> {
        let not_found = || LeaseError::QueueNotFound {
            queue: queue.to_owned(),
        };
        let mut core = self.core();
        // Under the lock that the lease is taken under: a primary whose
        // leader lease ran out between a check and the lease could hand
        // out what a new primary already acked.
        if !self.is_serving() {
            return Err(LeaseError::NotPrimary);
        }
        let now = self.now(&mut core);
        let q = core.spool.queue(queue).ok_or_else(not_found)?;
        let (lease_ms, probe) = match consumer {
            Consumer::Pull if q.settings.is_push() => {
                return Err(LeaseError::NotPullQueue {
                    queue: queue.to_owned(),
                });
            }
            Consumer::Pull => (q.settings.lease_timeout_ms, false),
            Consumer::Worker { .. } if !q.settings.is_push() => {
                return Err(LeaseError::NotPushQueue {
                    queue: queue.to_owned(),
                });
            }
            // The worker's lease outlasts its request, so it cannot lapse
            // mid-request (docs/contract.md §3).
            Consumer::Worker { probe } => (q.settings.timeout_ms + WORKER_LEASE_SLACK_MS, probe),
        };
        let leased = core
            .spool
            .lease(queue, now, lease_ms, max, probe)
            .map_err(|_| not_found())?;
        let bytes: u64 = leased.iter().map(|l| u64::from(l.message.loc.len)).sum();
        if leased.len() < max && bytes >= LEASE_BATCH_BYTES {
            crate::metrics::limit_reached(crate::metrics::Limit::LeaseBytes);
        }
        // Take each record's file under the lock: compaction swaps files
        // and locations under it too.
        let pinned: Vec<_> = leased
            .into_iter()
            .map(|l| (l, self.inner.reader.file(l.message.loc.file)))
            .collect();
        let next = core.spool.next_visible_at(queue, now).map(|t| t - now);
        Ok((pinned, next))
    }

    /// Reads the leased records' payloads where the blocking rule of
    /// `engine/core.rs` says: inline when every record is in the journal's
    /// active segment or the one before it (written moments ago, so in the
    /// page cache), else on the blocking pool so that a cold read waits
    /// there and not on a runtime worker.
    async fn read_leased_off_runtime(
        &self,
        queue: &str,
        leased: Vec<PinnedLease>,
    ) -> Vec<(Leased, Payload)> {
        let active = self.inner.journal.active_segment();
        let recent = |l: &Leased| match FileId::from_loc(l.message.loc.file) {
            FileId::Segment(id) => id + 1 >= active,
            FileId::Pack(_) => false,
        };
        if leased.iter().all(|(l, _)| recent(l)) {
            return self.read_leased(queue, leased);
        }
        let (engine, queue) = (self.clone(), queue.to_owned());
        match tokio::task::spawn_blocking(move || engine.read_leased(&queue, leased)).await {
            Ok(read) => read,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    /// The payloads of what was leased; a message whose record cannot be
    /// read goes back in line.
    fn read_leased(
        &self,
        queue: &str,
        leased: Vec<(Leased, PinnedFile)>,
    ) -> Vec<(Leased, Payload)> {
        leased
            .into_iter()
            .filter_map(|(l, file)| match self.read_pinned(file, l.message.loc) {
                Ok(payload) => Some((l, payload)),
                Err(e) => {
                    // The spool's fault, not the message's: back in line
                    // at once with its retry count unchanged. Damage that
                    // happened after replay takes the process down, so
                    // that replay (and `on_corruption`) decides.
                    tracing::error!(queue, error = %e, "cannot read a leased message's record");
                    self.core().spool.return_lease(queue, l.id, l.serial);
                    if matches!(e, ReadError(JournalError::Corrupt { .. })) {
                        self.fatal(format!("a stored record is damaged: {e}"));
                    }
                    None
                }
            })
            .collect()
    }

    /// Reads a payload through a handle taken under the core lock; a
    /// large event record's once for all its deliveries
    /// (`shared_reads.rs`).
    pub(super) fn read_pinned(
        &self,
        file: PinnedFile,
        loc: RecordLoc,
    ) -> Result<Payload, ReadError> {
        if loc.len < LARGE_RECORD_BYTES {
            return self.read_decoded(file, loc, "enqueue record", decode_payload_of);
        }
        let file = file?;
        if let Some(payload) = self.inner.shared_reads.get(&file, loc) {
            return Ok(payload);
        }
        let mut event = false;
        let payload =
            self.read_decoded(Ok(file.clone()), loc, "enqueue record", |kind, body| {
                event = kind == crate::spool::record::kind::EVENT;
                decode_payload_of(kind, body)
            })?;
        if event {
            self.inner.shared_reads.keep(&file, loc, &payload);
        }
        Ok(payload)
    }

    /// Reads the record at `loc` through a handle taken under the core
    /// lock and decodes its body; a body that does not decode is a bad
    /// record at that file and offset.
    pub(super) fn read_decoded<T>(
        &self,
        file: PinnedFile,
        loc: RecordLoc,
        what: &str,
        decode: impl FnOnce(u8, &[u8]) -> Result<T, DecodeError>,
    ) -> Result<T, ReadError> {
        let decoded = self.inner.reader.with_record_from(&file?, loc, decode)?;
        decoded.map_err(|e| {
            ReadError(JournalError::BadRecord {
                file: self
                    .inner
                    .dir
                    .join(crate::journal::format::FileId::from_loc(loc.file).file_name()),
                offset: u64::from(loc.offset),
                reason: format!("{what}: {e}"),
            })
        })
    }

    /// The lease a token names, if this process issued it.
    pub(super) fn lease_of(&self, token: &str) -> Result<LeaseToken, SettleError> {
        let lease = self
            .inner
            .tokens
            .decode(token)
            .ok_or(SettleError::BadToken)?;
        if lease.epoch != self.epoch() {
            return Err(SettleError::StaleLease);
        }
        Ok(lease)
    }

    /// Acks a lease: `Ok` once the removal is durable.
    pub async fn ack(&self, queue: &str, token: &str) -> Result<(), SettleError> {
        let lease = self.lease_of(token)?;
        self.write_done(|core, now| {
            core.spool
                .reserve_settle(queue, lease.id, lease.serial, now)
                .map_err(|e| settle_error(queue, e))?;
            Ok(Command::Ack {
                queue: Cow::Owned(queue.to_owned()),
                id: lease.id,
            })
        })
        .await
    }

    /// Nacks a lease: visible again after `delay_ms`, or to the failure queue
    /// once past `max_retries`.
    pub async fn nack(&self, queue: &str, token: &str, delay_ms: u64) -> Result<(), SettleError> {
        let lease = self.lease_of(token)?;
        self.write_done(|core, now| {
            core.spool
                .reserve_nack(queue, lease.id, lease.serial, now, delay_ms, None)
                .map_err(|e| settle_error(queue, e))
        })
        .await
    }

    /// Extends a lease to now + the queue's current lease timeout. Memory
    /// only: a restart drops leases anyway.
    pub fn renew(&self, queue: &str, token: &str) -> Result<Millis, SettleError> {
        let lease = self.lease_of(token)?;
        let mut core = self.core();
        if !self.is_serving() {
            return Err(SettleError::Write(super::error::WriteError::NotPrimary {
                reason: "leases are renewed by the serving primary only".into(),
            }));
        }
        let now = self.now(&mut core);
        core.spool
            .renew(queue, lease.id, lease.serial, now)
            .map_err(|e| settle_error(queue, e))
    }
}

/// A reservation of a lease refused by the state machine.
pub(super) fn settle_error(queue: &str, e: SpoolError) -> SettleError {
    match e {
        SpoolError::QueueNotFound => SettleError::QueueNotFound {
            queue: queue.to_owned(),
        },
        SpoolError::MessageNotFound | SpoolError::StaleLease => SettleError::StaleLease,
    }
}
