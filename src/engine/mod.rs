//! The engine: the one place that joins the journal and the state machine.
//!
//! Every write operation follows the same path:
//!
//! 1. lock the core, check the request against the state and *reserve* what
//!    it needs (a lease marked settling, a message marked pending);
//! 2. still under the lock, append the record to the journal, so records
//!    reach the journal in the order their reservations were made;
//! 3. release the lock and await the reply. The journal's writer thread
//!    writes, fsyncs, applies the record to the state machine and only then
//!    answers (see [`sink`]).
//!
//! A handler that is dropped at step 3 changes nothing: the record is applied
//! and acted on all the same. Reads (receive, renew, peek, stats) never touch
//! the journal: leases are memory only, and a restart drops them (spec §6).
//!
//! The engine also owns time: `now` comes from its [`Clock`], never runs
//! backwards, and a timer task turns expired leases and retention into
//! records.

pub mod compact;
pub mod error;
mod open;
pub mod rebuild;
pub mod settle;
pub mod sink;
pub mod token;

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{oneshot, watch};

pub use error::{ConflictKind, EngineError};
pub use sink::SendOutcome;
use sink::{Core, Op, Reply, Shared};
use token::{LeaseToken, Tokens};

use crate::journal::lock::DirLock;
use crate::journal::reader::SegmentReader;
use crate::journal::storage::{OsStorage, Storage};
use crate::journal::{Journal, JournalError, RecordLoc, SpoolIdentity};
use crate::spool::command::{IDS_PER_RECORD_MAX, decode_payload};
use crate::spool::queue::valid_queue_name;
use crate::spool::{
    Command, EnqueueMeta, MessageId, MessageView, Payload, QueueSettings, QueueStats, Record,
    SpoolError, SpoolState,
};
use crate::time::{Clock, Millis, SystemClock};

/// Most records the timer writes per tick, so one tick never holds the core
/// lock for long; the rest waits for the next tick.
const DUE_RECORDS_PER_TICK_MAX: usize = 4096;
/// Longest the timer sleeps when nothing is due.
const TIMER_IDLE_MAX: Duration = Duration::from_secs(1);
/// How much longer than its request timeout a delivery worker's lease lasts.
const WORKER_LEASE_SLACK_MS: u64 = 5_000;

/// Who leases: a pull consumer, or a push queue's delivery worker.
#[derive(Debug, Clone, Copy)]
enum Consumer {
    Pull,
    Worker { probe: bool },
}

/// Arrival events buffered for `tail` subscribers; one that falls further
/// behind skips ahead.
const ARRIVALS_BUFFERED_MAX: usize = 4096;
/// Most messages one receive may lease (spec §4: `max` ≤ 100).
pub const RECEIVE_BATCH_MAX: usize = 100;

/// How to open a spool.
#[derive(Clone)]
pub struct EngineOptions {
    pub dir: PathBuf,
    pub segment_bytes: u64,
    pub fsync: bool,
    pub storage: Arc<dyn Storage>,
    pub clock: Arc<dyn Clock>,
    /// Take the directory's `flock` (real file systems only).
    pub lock: bool,
    /// Rotate into zero-filled spare segments: cheaper fsyncs, at the cost
    /// of writing each segment's space twice.
    pub preallocate: bool,
    /// Bytes the journal may take on disk; sends are refused with
    /// `SpoolFull` while less than [`headroom_bytes`] is left.
    pub max_bytes: u64,
    /// Move damaged spans aside at start-up instead of refusing to start.
    pub quarantine_corruption: bool,
}

/// What a spool keeps free beyond its files, counting the active segment
/// at its full size: one segment for the next rotation (the preallocated
/// spare), one for compaction's output. With the active segment that is
/// three segments, so a config needs `max_bytes` ≥ 4 × `segment_bytes`:
/// then a spool whose messages are all settled (its other files compacted
/// away down to a small checkpoint) has room to send again.
pub fn headroom_bytes(segment_bytes: u64) -> u64 {
    2 * segment_bytes
}

impl EngineOptions {
    /// The real file system and clock.
    pub fn new(dir: impl Into<PathBuf>) -> EngineOptions {
        EngineOptions {
            dir: dir.into(),
            segment_bytes: 64 << 20,
            fsync: true,
            storage: Arc::new(OsStorage),
            clock: Arc::new(SystemClock),
            lock: true,
            preallocate: true,
            max_bytes: u64::MAX,
            quarantine_corruption: false,
        }
    }
}

/// What start-up found.
#[derive(Debug, Clone)]
pub struct ReplayReport {
    pub records: u64,
    pub segments: usize,
    pub messages: usize,
    pub epoch: u64,
    /// Bytes of a torn final write that were truncated.
    pub torn_tail_bytes: Option<u64>,
    pub duration: Duration,
}

/// A message to send.
#[derive(Debug, Clone, Default)]
pub struct SendRequest {
    pub payload: Payload,
    pub delay_ms: u64,
    pub dedup_key: Option<String>,
}

/// A leased message with its payload.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub id: MessageId,
    pub token: String,
    pub expires_at: Millis,
    pub retry_count: u32,
    pub enqueued_at: Millis,
    pub payload: Payload,
    /// The message as a peek shows it (state `leased`).
    pub view: MessageView,
}

struct Inner {
    shared: Arc<Shared>,
    journal: Journal<Op>,
    reader: SegmentReader,
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    identity: SpoolIdentity,
    /// One compaction at a time.
    compacting: Mutex<()>,
    max_bytes: u64,
    segment_bytes: u64,
    clock: Arc<dyn Clock>,
    tokens: Tokens,
    epoch: u64,
    /// Held until [`Engine::close`] (or the last handle goes): another
    /// engine may open the directory once this one has stopped touching
    /// it, even while stray handles (a finishing compaction task) remain.
    lock: Mutex<Option<DirLock>>,
}

/// A handle on an open spool. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    fn core(&self) -> MutexGuard<'_, Core> {
        self.inner.shared.core.lock().expect("core lock poisoned")
    }

    /// The spool's `now`: the clock, but never earlier than a `now` already
    /// handed out.
    fn now(&self, core: &mut Core) -> Millis {
        core.last_now = core.last_now.max(self.inner.clock.now_ms());
        core.last_now
    }

    pub fn epoch(&self) -> u64 {
        self.inner.epoch
    }

    pub fn tokens(&self) -> &Tokens {
        &self.inner.tokens
    }

    /// Every message as it arrives in a queue, for `tail`.
    pub fn arrivals(&self) -> tokio::sync::broadcast::Receiver<sink::Arrival> {
        self.inner.shared.arrivals.subscribe()
    }

    /// Fires once the journal is poisoned by a failed fsync.
    pub fn poisoned(&self) -> watch::Receiver<bool> {
        self.inner.shared.poisoned.subscribe()
    }

    pub fn is_poisoned(&self) -> bool {
        self.inner.journal.is_poisoned()
    }

    /// Bytes of all segment files.
    pub fn journal_bytes(&self) -> u64 {
        self.inner.journal.disk_bytes()
    }

    /// The configured limit on [`Engine::journal_bytes`].
    pub fn max_bytes(&self) -> u64 {
        self.inner.max_bytes
    }

    /// True while new messages are refused for want of space: the files
    /// (the active segment counted at its full size) and the headroom would
    /// not fit in `max_bytes`.
    pub fn is_full(&self) -> bool {
        let seg = self.inner.segment_bytes;
        let active_growth = seg.saturating_sub(self.inner.journal.active_file_bytes());
        self.journal_bytes()
            .saturating_add(active_growth)
            .saturating_add(headroom_bytes(seg))
            > self.inner.max_bytes
    }

    /// The journal writer's counters (batches = fsyncs, records).
    pub fn journal_stats(&self) -> crate::journal::WriterStats {
        self.inner.journal.stats()
    }

    /// Appends under the core lock (the guard proves it is held).
    fn append(
        &self,
        _core: &Core,
        record: Record<'static>,
        payload: Option<&Payload>,
        reply: Reply,
    ) -> Result<(), JournalError> {
        let kind = record.kind();
        self.inner
            .journal
            .append(kind, Op { record, reply }, |op, buf| {
                op.record.encode(payload, buf)
            })
    }

    /// Sends a message: `Ok` only after the fsync that covers it.
    pub async fn send(
        &self,
        queue: &str,
        request: SendRequest,
    ) -> Result<SendOutcome, EngineError> {
        let (tx, rx) = oneshot::channel();
        let submitted = self.submit_send(queue, &request, tx)?;
        // The body is in the journal's buffer now: free the caller's copy
        // (often a slice of the connection's read buffer, which can then be
        // reused for the next request) before waiting for the fsync.
        drop(request);
        match submitted {
            Some(done) => Ok(done),
            None => rx.await.map_err(|_| closed())?,
        }
    }

    /// The locked part of a send. `Some` when the dedup window answers at
    /// once; `None` when the answer will arrive on `tx`.
    fn submit_send(
        &self,
        queue: &str,
        request: &SendRequest,
        tx: sink::SendReply,
    ) -> Result<Option<SendOutcome>, EngineError> {
        if self.is_full() {
            return Err(EngineError::SpoolFull {
                journal_bytes: self.journal_bytes(),
                max_bytes: self.inner.max_bytes,
            });
        }
        let mut core = self.core();
        let now = self.now(&mut core);
        let q = core
            .spool
            .queue(queue)
            .ok_or_else(|| queue_not_found(queue))?;
        if q.is_failure_queue() {
            return Err(EngineError::Conflict {
                kind: ConflictKind::FailureQueue,
                message: format!(
                    "{queue} is a failure queue: messages arrive there only by failing"
                ),
            });
        }
        let window_ms = q.settings.dedup_window_ms;
        let dedup = match &request.dedup_key {
            None => None,
            Some(_) if window_ms == 0 => {
                return Err(EngineError::BadRequest(format!(
                    "queue {queue} has no dedup window: an idempotency key would be ignored"
                )));
            }
            Some(key) => {
                let hash = self.inner.tokens.dedup_hash(queue, key);
                if let Some(id) = core.spool.dedup_lookup(queue, hash, now) {
                    core.spool.count_deduplicated(queue);
                    return Ok(Some(SendOutcome {
                        id,
                        deduplicated: true,
                    }));
                }
                let pending_key = (queue.to_owned(), hash);
                if let Some(waiters) = core.pending_dedup.get_mut(&pending_key) {
                    // The first send with this key is still being written:
                    // answer as it does.
                    waiters.push(tx);
                    return Ok(None);
                }
                core.pending_dedup.insert(pending_key.clone(), Vec::new());
                Some((pending_key, hash))
            }
        };
        let id = core.spool.allocate_id();
        let record = Record {
            at: now,
            command: Command::Enqueue(EnqueueMeta {
                id,
                queue: Cow::Owned(queue.to_owned()),
                visible_at: now + request.delay_ms as i64,
                dedup_hash: dedup.as_ref().map(|d| d.1),
            }),
        };
        let reply = Reply::Send {
            tx,
            dedup: dedup.as_ref().map(|d| d.0.clone()),
        };
        if let Err(e) = self.append(&core, record, Some(&request.payload), reply) {
            if let Some((key, _)) = dedup {
                core.pending_dedup.remove(&key);
            }
            return Err(unavailable(e));
        }
        Ok(None)
    }

    /// Leases up to `max` messages of a pull queue, waiting up to `wait` for
    /// the first one.
    pub async fn receive(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, EngineError> {
        self.lease_inner(queue, max, wait, Consumer::Pull).await
    }

    /// Leases one message of a push queue for a delivery worker, for the
    /// queue's `timeout` + 5 s, waiting up to `wait`. With `probe`, an open
    /// circuit breaker does not stop it (the breaker's probe).
    pub async fn lease_for_delivery(
        &self,
        queue: &str,
        wait: Duration,
        probe: bool,
    ) -> Result<Option<Delivery>, EngineError> {
        let mut got = self
            .lease_inner(queue, 1, wait, Consumer::Worker { probe })
            .await?;
        Ok(got.pop())
    }

    async fn lease_inner(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
        consumer: Consumer,
    ) -> Result<Vec<Delivery>, EngineError> {
        let deadline = tokio::time::Instant::now() + wait;
        let max = max.clamp(1, RECEIVE_BATCH_MAX);
        loop {
            let notify = self.core().notify_for(queue);
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (leased, next_visible) = {
                let mut core = self.core();
                let now = self.now(&mut core);
                let q = core
                    .spool
                    .queue(queue)
                    .ok_or_else(|| queue_not_found(queue))?;
                let (lease_ms, probe) = match consumer {
                    Consumer::Pull if q.settings.is_push() => {
                        return Err(EngineError::Conflict {
                            kind: ConflictKind::NotPullQueue,
                            message: format!("{queue} is a push queue: its own workers consume it"),
                        });
                    }
                    Consumer::Pull => (q.settings.lease_timeout_ms, false),
                    Consumer::Worker { .. } if !q.settings.is_push() => {
                        return Err(EngineError::Conflict {
                            kind: ConflictKind::NotPushQueue,
                            message: format!("{queue} has no destination"),
                        });
                    }
                    // The worker's lease outlasts its request, so it cannot
                    // lapse mid-request (spec §3).
                    Consumer::Worker { probe } => {
                        (q.settings.timeout_ms + WORKER_LEASE_SLACK_MS, probe)
                    }
                };
                let leased = core
                    .spool
                    .lease(queue, now, lease_ms, max, probe)
                    .map_err(|e| spool_error(queue, e))?;
                // Take each record's file under the lock: compaction swaps
                // files and locations under it too.
                let pinned: Vec<_> = leased
                    .into_iter()
                    .map(|l| (l, self.inner.reader.file(l.message.loc.file)))
                    .collect();
                let next = core.spool.next_visible_at(queue, now).map(|t| t - now);
                (pinned, next)
            };
            if !leased.is_empty() {
                return Ok(self.deliveries(queue, leased));
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

    fn deliveries(
        &self,
        queue: &str,
        leased: Vec<(crate::spool::Leased, PinnedFile)>,
    ) -> Vec<Delivery> {
        leased
            .into_iter()
            .filter_map(|(l, file)| match self.read_pinned(file, l.message.loc) {
                Ok(payload) => Some(Delivery {
                    id: l.id,
                    token: self.inner.tokens.encode(LeaseToken {
                        epoch: self.inner.epoch,
                        id: l.id,
                        serial: l.serial,
                    }),
                    expires_at: l.expires_at,
                    retry_count: l.message.retry_count,
                    enqueued_at: l.message.enqueued_at,
                    payload,
                    view: MessageView {
                        id: l.id,
                        state: crate::spool::MessageState::Leased,
                        message: l.message,
                        failure: l.failure,
                    },
                }),
                Err(e) => {
                    // The spool's fault, not the message's: back in line
                    // at once with its retry count unchanged. Damage that
                    // happened after replay takes the process down, so
                    // that replay (and `on_corruption`) decides.
                    tracing::error!(queue, error = %e, "cannot read a leased message's record");
                    self.core().spool.return_lease(queue, l.id, l.serial);
                    if matches!(e, EngineError::Journal(JournalError::Corrupt { .. })) {
                        self.fatal(format!("a stored record is damaged: {e}"));
                    }
                    None
                }
            })
            .collect()
    }

    /// Reads the stored payload of a message that is here now.
    pub fn payload(&self, queue: &str, id: MessageId) -> Result<Payload, EngineError> {
        let (file, loc) = {
            let core = self.core();
            let (_, m) = core
                .spool
                .find(
                    queue
                        .strip_suffix(crate::spool::queue::FAILED_SUFFIX)
                        .unwrap_or(queue),
                    id,
                )
                .ok_or_else(|| self.message_error(queue, id, SpoolError::MessageNotFound))?;
            (self.inner.reader.file(m.loc.file), m.loc)
        };
        self.read_pinned(file, loc)
    }

    fn read_pinned(&self, file: PinnedFile, loc: RecordLoc) -> Result<Payload, EngineError> {
        let body = self.inner.reader.read_body_from(&file?, loc)?;
        decode_payload(&body).map_err(|e| {
            EngineError::Journal(JournalError::BadRecord {
                file: self
                    .inner
                    .dir
                    .join(crate::journal::format::FileId::from_loc(loc.file).file_name()),
                offset: u64::from(loc.offset),
                reason: e.to_string(),
            })
        })
    }

    fn lease_of(&self, token: &str) -> Result<LeaseToken, EngineError> {
        let lease = self
            .inner
            .tokens
            .decode(token)
            .ok_or(EngineError::BadToken)?;
        if lease.epoch != self.inner.epoch {
            return Err(EngineError::StaleLease);
        }
        Ok(lease)
    }

    /// Acks a lease: `Ok` once the removal is durable.
    pub async fn ack(&self, queue: &str, token: &str) -> Result<(), EngineError> {
        let lease = self.lease_of(token)?;
        self.write_done(|core, now| {
            core.spool
                .reserve_settle(queue, lease.id, lease.serial, now)
                .map_err(|e| spool_error(queue, e))?;
            Ok(Command::Ack {
                queue: Cow::Owned(queue.to_owned()),
                id: lease.id,
            })
        })
        .await
    }

    /// Nacks a lease: visible again after `delay_ms`, or to the failure queue
    /// once past `max_retries`.
    pub async fn nack(&self, queue: &str, token: &str, delay_ms: u64) -> Result<(), EngineError> {
        let lease = self.lease_of(token)?;
        self.write_done(|core, now| {
            core.spool
                .reserve_nack(queue, lease.id, lease.serial, now, delay_ms)
                .map_err(|e| spool_error(queue, e))
        })
        .await
    }

    /// Extends a lease to now + the queue's current lease timeout. Memory
    /// only: a restart drops leases anyway.
    pub fn renew(&self, queue: &str, token: &str) -> Result<Millis, EngineError> {
        let lease = self.lease_of(token)?;
        let mut core = self.core();
        let now = self.now(&mut core);
        core.spool
            .renew(queue, lease.id, lease.serial, now)
            .map_err(|e| spool_error(queue, e))
    }

    /// Cancels one message; a live lease on it becomes stale.
    pub async fn cancel(&self, queue: &str, id: MessageId) -> Result<(), EngineError> {
        self.write_done(|core, _| {
            core.spool
                .reserve_message(queue, id)
                .map_err(|e| self.message_error(queue, id, e))?;
            Ok(Command::Cancel {
                queue: Cow::Owned(queue.to_owned()),
                id,
            })
        })
        .await
    }

    /// Removes every message of a queue; returns how many.
    pub async fn purge(&self, queue: &str) -> Result<u64, EngineError> {
        self.write_counts(|core, _| {
            let ids = core
                .spool
                .message_ids(queue)
                .ok_or_else(|| queue_not_found(queue))?;
            Ok(split_ids(ids)
                .map(|ids| Command::Purge {
                    queue: Cow::Owned(queue.to_owned()),
                    ids,
                })
                .collect())
        })
        .await
    }

    /// Moves up to `max` messages (or just `ids`) from `queue.failed` back to
    /// `queue`, retry counts reset. With `dry_run`, only counts them.
    pub async fn redrive(
        &self,
        queue: &str,
        max: usize,
        ids: Option<&[MessageId]>,
        dry_run: bool,
    ) -> Result<u64, EngineError> {
        if dry_run {
            let mut core = self.core();
            return core
                .spool
                .redrive_candidates(queue, max, ids, false)
                .map(|v| v.len() as u64)
                .map_err(|e| spool_error(queue, e));
        }
        self.write_counts(|core, _| {
            let picked = core
                .spool
                .redrive_candidates(queue, max, ids, true)
                .map_err(|e| spool_error(queue, e))?;
            Ok(split_ids(picked)
                .map(|ids| Command::Redrive {
                    queue: Cow::Owned(queue.to_owned()),
                    ids,
                })
                .collect())
        })
        .await
    }

    /// Creates or replaces a queue's settings. Returns true if it was
    /// created.
    pub async fn upsert_queue(
        &self,
        name: &str,
        settings: QueueSettings,
        managed_by_config: bool,
    ) -> Result<bool, EngineError> {
        if !valid_queue_name(name) {
            return Err(EngineError::BadRequest(format!(
                "invalid queue name {name:?}: use 1 to 128 of [A-Za-z0-9_-]"
            )));
        }
        let created = self.core().spool.queue(name).is_none();
        self.write_done(|_, _| {
            Ok(Command::QueueUpsert {
                name: Cow::Owned(name.to_owned()),
                settings: Box::new(settings),
                managed_by_config,
            })
        })
        .await?;
        Ok(created)
    }

    /// Deletes a queue, its failure queue and their messages.
    pub async fn delete_queue(&self, name: &str) -> Result<(), EngineError> {
        self.write_done(|core, _| {
            let q = core
                .spool
                .queue(name)
                .ok_or_else(|| queue_not_found(name))?;
            if q.is_failure_queue() {
                return Err(EngineError::Conflict {
                    kind: ConflictKind::FailureQueue,
                    message: format!("{name} is a failure queue: it is deleted with its queue"),
                });
            }
            Ok(Command::QueueDelete {
                name: Cow::Owned(name.to_owned()),
            })
        })
        .await
    }

    /// Stops or restarts handing out leases of a queue.
    pub async fn set_paused(&self, name: &str, paused: bool) -> Result<(), EngineError> {
        self.write_done(|core, _| {
            core.spool
                .queue(name)
                .ok_or_else(|| queue_not_found(name))?;
            Ok(Command::QueuePause {
                name: Cow::Owned(name.to_owned()),
                paused,
            })
        })
        .await
    }

    async fn write_done(
        &self,
        decide: impl FnOnce(&mut Core, Millis) -> Result<Command<'static>, EngineError>,
    ) -> Result<(), EngineError> {
        let (tx, rx) = oneshot::channel();
        self.write(decide, Reply::Done(tx))?;
        rx.await.map_err(|_| closed())?
    }

    /// Decides several commands under the core lock and appends them as
    /// one batch (one write, one fsync: all or none); answers the sum of
    /// their counts.
    async fn write_counts(
        &self,
        decide: impl FnOnce(&mut Core, Millis) -> Result<Vec<Command<'static>>, EngineError>,
    ) -> Result<u64, EngineError> {
        let mut waiting = Vec::new();
        {
            let mut core = self.core();
            let now = self.now(&mut core);
            let records: Vec<Record<'static>> = decide(&mut core, now)?
                .into_iter()
                .map(|command| Record { at: now, command })
                .collect();
            let undo = records.clone();
            let ops = records.into_iter().map(|record| {
                let (tx, rx) = oneshot::channel();
                waiting.push(rx);
                (
                    record.kind(),
                    Op {
                        record,
                        reply: Reply::Count(tx),
                    },
                )
            });
            if let Err(e) = self
                .inner
                .journal
                .append_many(ops, |op, buf| op.record.encode(None, buf))
            {
                for record in &undo {
                    core.release(record);
                }
                return Err(unavailable(e));
            }
        }
        let mut total = 0;
        for rx in waiting {
            total += rx.await.map_err(|_| closed())??;
        }
        Ok(total)
    }

    /// Decides a command under the core lock and appends it; undoes the
    /// reservation if the journal refuses.
    fn write(
        &self,
        decide: impl FnOnce(&mut Core, Millis) -> Result<Command<'static>, EngineError>,
        reply: Reply,
    ) -> Result<(), EngineError> {
        let mut core = self.core();
        let now = self.now(&mut core);
        let command = decide(&mut core, now)?;
        let record = Record { at: now, command };
        let undo = record.clone();
        if let Err(e) = self.append(&core, record, None, reply) {
            core.release(&undo);
            return Err(unavailable(e));
        }
        Ok(())
    }

    /// Turns everything due now (expired leases, retention) into records
    /// and waits until they are durable and applied. Returns how many
    /// records it wrote.
    pub async fn run_due(&self) -> usize {
        let mut waiting = Vec::new();
        {
            let mut core = self.core();
            let now = self.now(&mut core);
            for command in core.spool.due(now, DUE_RECORDS_PER_TICK_MAX) {
                let record = Record { at: now, command };
                let undo = record.clone();
                let (tx, rx) = oneshot::channel();
                match self.append(&core, record, None, Reply::Done(tx)) {
                    Ok(()) => waiting.push(rx),
                    Err(_) => core.release(&undo),
                }
            }
        }
        let mut written = 0;
        for rx in waiting {
            if let Ok(Ok(())) = rx.await {
                written += 1;
            }
        }
        written
    }

    /// Runs [`Engine::run_due`] until the engine is dropped everywhere else.
    pub fn spawn_timer(&self) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let engine = Engine { inner };
                if engine.is_poisoned() || engine.inner.journal.is_closed() {
                    // Nothing due can be written any more.
                    return;
                }
                let written = engine.run_due().await;
                let sleep = if written >= DUE_RECORDS_PER_TICK_MAX {
                    Duration::from_millis(1)
                } else {
                    let mut core = engine.core();
                    let now = engine.now(&mut core);
                    core.spool
                        .next_deadline(now)
                        .map(|t| Duration::from_millis((t - now).clamp(1, 1000) as u64))
                        .unwrap_or(TIMER_IDLE_MAX)
                };
                drop(engine);
                tokio::time::sleep(sleep).await;
            }
        })
    }

    pub fn stats(&self, queue: &str) -> Result<QueueStats, EngineError> {
        let mut core = self.core();
        let now = self.now(&mut core);
        core.spool
            .stats(queue, now)
            .ok_or_else(|| queue_not_found(queue))
    }

    /// Whether `queue` has a destination (without copying its settings).
    pub fn is_push_queue(&self, queue: &str) -> Result<bool, EngineError> {
        let core = self.core();
        let q = core
            .spool
            .queue(queue)
            .ok_or_else(|| queue_not_found(queue))?;
        Ok(q.settings.is_push())
    }

    pub fn queue_settings(&self, queue: &str) -> Result<(QueueSettings, bool), EngineError> {
        let core = self.core();
        let q = core
            .spool
            .queue(queue)
            .ok_or_else(|| queue_not_found(queue))?;
        Ok((q.settings.clone(), q.managed_by_config))
    }

    /// Messages in a queue and its failure queue.
    pub fn message_count(&self, queue: &str) -> usize {
        let core = self.core();
        let count = |name: &str| core.spool.queue(name).map_or(0, |q| q.len());
        count(queue) + count(&crate::spool::queue::failed_queue_name(queue))
    }

    pub fn queue_names(&self) -> Vec<String> {
        self.core().spool.queue_names()
    }

    pub fn peek(
        &self,
        queue: &str,
        after: Option<MessageId>,
        limit: usize,
    ) -> Result<Vec<MessageView>, EngineError> {
        let mut core = self.core();
        let now = self.now(&mut core);
        core.spool
            .peek(queue, after, limit, now)
            .map_err(|e| spool_error(queue, e))
    }

    pub fn get(&self, queue: &str, id: MessageId) -> Result<MessageView, EngineError> {
        let mut core = self.core();
        let now = self.now(&mut core);
        core.spool
            .get(queue, id, now)
            .map_err(|e| self.message_error(queue, id, e))
    }

    /// Every message of every queue (tests and tools).
    pub fn all_messages(&self) -> Vec<(String, MessageId, crate::spool::state::Message)> {
        self.core().spool.all_messages()
    }

    /// The state without leases, as a checkpoint would hold it (tests and
    /// tools compare it across crashes and replays).
    pub fn state(&self) -> SpoolState {
        self.core().spool.state()
    }

    /// Test hook: while on, durable records wait before they are applied
    /// (see `journal::writer`), so a test can run compaction while records
    /// are on disk but not yet in the state.
    pub fn hold_apply(&self, on: bool) {
        self.inner.journal.hold_apply(on);
    }

    /// Sequence number of the last record applied.
    pub fn applied_seq(&self) -> u64 {
        self.core().spool.applied_seq()
    }

    /// Flushes what is pending and stops the journal's threads, waits for a
    /// compaction in progress (none starts afterwards), and releases the
    /// directory lock. Later writes answer `Unavailable`.
    pub fn close(&self) {
        self.inner.journal.close();
        let _no_compaction = self
            .inner
            .compacting
            .lock()
            .expect("compaction lock poisoned");
        drop(self.inner.lock.lock().expect("lock poisoned").take());
    }

    fn message_error(&self, queue: &str, id: MessageId, e: SpoolError) -> EngineError {
        match e {
            SpoolError::MessageNotFound => EngineError::MessageNotFound {
                queue: queue.to_owned(),
                id: self.inner.tokens.format_id(id),
            },
            other => spool_error(queue, other),
        }
    }
}

/// A segment's file handle taken under the core lock (or why it could not
/// be opened).
type PinnedFile = Result<Arc<dyn crate::journal::storage::StorageFile>, JournalError>;

/// Ids in records of at most [`IDS_PER_RECORD_MAX`] (none: one empty
/// record, so that the operation still answers through the journal).
fn split_ids(ids: Vec<MessageId>) -> impl Iterator<Item = Vec<MessageId>> {
    let n = ids.len().div_ceil(IDS_PER_RECORD_MAX).max(1);
    let mut ids = ids.into_iter();
    (0..n).map(move |_| ids.by_ref().take(IDS_PER_RECORD_MAX).collect())
}

fn queue_not_found(queue: &str) -> EngineError {
    EngineError::QueueNotFound {
        queue: queue.to_owned(),
    }
}

fn spool_error(queue: &str, e: SpoolError) -> EngineError {
    match e {
        SpoolError::QueueNotFound => queue_not_found(queue),
        SpoolError::MessageNotFound => EngineError::MessageNotFound {
            queue: queue.to_owned(),
            id: String::new(),
        },
        SpoolError::StaleLease => EngineError::StaleLease,
    }
}

fn unavailable(e: JournalError) -> EngineError {
    EngineError::Unavailable {
        reason: e.to_string(),
    }
}

fn closed() -> EngineError {
    EngineError::Unavailable {
        reason: "the spool is shutting down".into(),
    }
}
