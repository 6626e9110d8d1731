//! The engine's mutable state behind its one lock: the state machine, the
//! reservations and waiters that live beside it, and what compaction knows
//! of the files on disk.
//!
//! # Lock order
//!
//! A thread that holds more than one of the engine's locks took them in
//! this order, and never the other way:
//!
//! ```text
//! compacting  →  core  →  { journal pending, replication index and
//!                           unwritten, reader's file table }
//! ```
//!
//! `compacting` (engine/mod.rs) makes compactions and snapshot installs
//! one at a time; `core` (this file) is the state machine; the three on
//! the right are leaves: each is held for a few field updates and takes
//! no other lock (journal/writer/mod.rs `Shared::pending`,
//! engine/replicated/mod.rs `Replication::index` and `unwritten`,
//! journal/reader.rs). Smaller locks beside these (the vote, a proposer's
//! sender, metrics handles) are leaves too. No lock of these is held
//! across an `.await`: each is a `std::sync::Mutex`, and its guard is
//! dropped before the task can yield (clippy's `await_holding_lock` would
//! say so).
//!
//! # Blocking on runtime threads
//!
//! A tokio worker may not wait on the disk. An fsync, a file created,
//! renamed or removed, and a read of bytes that may not be in the page
//! cache run on a thread of their own (the journal's writer and applier,
//! the preallocator) or on the blocking pool (`spawn_blocking`), and the
//! task awaits the answer. Two kinds of I/O may run inline, because they
//! do not wait on the device: a `pread` of a record in the journal's
//! active segment or the one before it (written moments ago, so in the
//! page cache: engine/lease.rs `read_leased_off_runtime`), and reads of
//! small files at start-up, before the runtime serves anything. The core
//! lock is held only for memory work, never around I/O: a record's file
//! is pinned under it (engine/lease.rs `PinnedFile`) and read after.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, mpsc, oneshot, watch};

use super::error::{SendError, WriteError};
use crate::spool::queue::failed_queue_name;
use crate::spool::state::memory::record_cost;
use crate::spool::{Command, MessageId, Record, Spool};
use crate::time::Millis;

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

/// The mutable state, behind one mutex shared by handlers and the sink.
pub(super) struct Core {
    pub spool: Spool,
    /// The last `now` handed out: time never runs backwards for the spool,
    /// even if the wall clock does.
    pub last_now: Millis,
    /// Sends with a dedup key whose first send is still being written:
    /// later sends with the same key wait here and answer as it does.
    pub pending_dedup: HashMap<(String, u64), Vec<SendReply>>,
    /// Keys of events still being written, and since when: a repeat gets
    /// a `409` meanwhile (Svix answers the same).
    pub pending_events: HashMap<u64, Millis>,
    notifies: HashMap<String, Arc<Notify>>,
    /// While a batch of records is applied (`sink.rs`): the wake-ups it
    /// causes past the first [`WAKE_NOW_MAX`], held back until its writers
    /// have their answers. Woken first, a thousand receivers of a fan-out
    /// would queue on the runtime ahead of the task waiting to say `202`;
    /// the first few go at once, so that a push worker starts on a plain
    /// send as early as before.
    deferred: Option<Vec<Wake>>,
    /// Wake-ups of this batch sent at once so far.
    woken_now: usize,
    /// Push queues whose dispatcher runs (`src/delivery`): a wake-up of any
    /// other push queue goes to the delivery manager instead, which starts
    /// one. An idle push queue has no task at all.
    pub awake: HashSet<String>,
    /// Queues whose counters moved since the rates sampler last looked
    /// (`rates.rs`).
    pub active: HashSet<String>,
    /// Where those wake-ups go, once the delivery manager listens.
    pub push_wakeups: Option<mpsc::UnboundedSender<PushWake>>,
    /// What compaction needs to know of each log segment and pack, by the
    /// file id of a [`crate::journal::RecordLoc`]. A log segment appears
    /// once its first record is applied, so every segment below the
    /// highest one listed is fully applied.
    pub files: BTreeMap<u32, FileMeta>,
    /// The checkpoint on disk.
    pub checkpoint: Option<CheckpointOnDisk>,
    /// The next pack's id.
    pub next_pack_id: u64,
    /// Nominal size of a new (preallocated) segment.
    pub segment_bytes: u64,
}

/// The checkpoint on disk (in replicated mode also the Raft snapshot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CheckpointOnDisk {
    pub seq: u64,
    /// The term of record `seq` (0 outside replicated mode).
    pub term: u64,
    pub bytes: u64,
    /// The replica set as of `seq` (replicated mode).
    pub cluster_config: Option<Vec<u8>>,
}

/// Wake-ups a batch of records sends before its answers (the rest after).
const WAKE_NOW_MAX: usize = 16;

/// A wake-up of receivers or of the delivery manager.
pub(super) enum Wake {
    One(Arc<Notify>),
    All(Arc<Notify>),
    Dispatcher(mpsc::UnboundedSender<PushWake>, String),
}

impl Wake {
    pub(super) fn run(self) {
        match self {
            Wake::One(n) => n.notify_one(),
            Wake::All(n) => n.notify_waiters(),
            Wake::Dispatcher(tx, queue) => {
                let _ = tx.send(PushWake::Work(queue));
            }
        }
    }
}

/// Compaction's view of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileMeta {
    pub bytes: u64,
}

impl Core {
    pub(super) fn new(spool: Spool, last_now: Millis, segment_bytes: u64) -> Core {
        Core {
            spool,
            last_now,
            pending_dedup: HashMap::new(),
            pending_events: HashMap::new(),
            notifies: HashMap::new(),
            deferred: None,
            woken_now: 0,
            awake: HashSet::new(),
            active: HashSet::new(),
            push_wakeups: None,
            files: BTreeMap::new(),
            checkpoint: None,
            next_pack_id: 1,
            segment_bytes,
        }
    }

    /// The notifier long-polling receivers of `queue` wait on.
    pub(super) fn notify_for(&mut self, queue: &str) -> Arc<Notify> {
        if let Some(n) = self.notifies.get(queue) {
            return n.clone();
        }
        self.notifies.entry(queue.to_owned()).or_default().clone()
    }

    /// How many receivers hold `queue`'s wake-up now (every one but the
    /// map's own handle): tests wait for a long poll before they send.
    #[cfg(feature = "testing")]
    pub(super) fn receivers_of(&self, queue: &str) -> usize {
        self.notifies
            .get(queue)
            .map_or(0, |n| Arc::strong_count(n) - 1)
    }

    /// Wakes one receiver of `queue`: one message became visible (or will at
    /// a new time), so one receiver has something to do; waking them all
    /// would send every idle push worker to the lock for nothing. A woken
    /// receiver that goes away passes the wake-up on (tokio's `Notify`).
    pub(super) fn wake_one(&mut self, queue: &str) {
        if let Some(n) = self.notifies.get(queue) {
            let wake = Wake::One(n.clone());
            self.wake(wake);
        }
        self.wake_dispatcher(queue);
    }

    /// Wakes every receiver of `queue`: many messages became visible.
    pub(super) fn wake_all(&mut self, queue: &str) {
        if let Some(n) = self.notifies.get(queue) {
            let wake = Wake::All(n.clone());
            self.wake(wake);
        }
        self.wake_dispatcher(queue);
    }

    /// A push queue without a running dispatcher gets one: the delivery
    /// manager is told (once: the queue counts as awake from here).
    fn wake_dispatcher(&mut self, queue: &str) {
        let Some(tx) = &self.push_wakeups else {
            return;
        };
        if self.awake.contains(queue)
            || !self
                .spool
                .queue(queue)
                .is_some_and(|q| q.settings.is_push())
        {
            return;
        }
        self.awake.insert(queue.to_owned());
        let wake = Wake::Dispatcher(tx.clone(), queue.to_owned());
        self.wake(wake);
    }

    fn wake(&mut self, wake: Wake) {
        match &mut self.deferred {
            Some(later) if self.woken_now >= WAKE_NOW_MAX => later.push(wake),
            Some(_) => {
                self.woken_now += 1;
                wake.run();
            }
            None => wake.run(),
        }
    }

    /// From here until [`Core::take_wakes`], wake-ups past the first
    /// [`WAKE_NOW_MAX`] wait.
    pub(super) fn defer_wakes(&mut self) {
        self.deferred.get_or_insert_with(Vec::new);
        self.woken_now = 0;
    }

    /// The wake-ups held back since [`Core::defer_wakes`], for the caller
    /// to run once the lock is released and its answers are sent. A late
    /// wake-up loses nothing: the state it announces is already applied,
    /// so a receiver that looks after the batch finds it; one that looked
    /// before registered its wait under the lock, and `notify_one` and
    /// `notify_waiters` still reach it (`notify_one` keeps a permit too).
    pub(super) fn take_wakes(&mut self) -> Vec<Wake> {
        self.deferred.take().unwrap_or_default()
    }

    /// Drops `queue`'s notifier if nobody waits on it (a push queue going
    /// to sleep: 100 000 idle endpoints keep no notifier each).
    pub(super) fn forget_notify(&mut self, queue: &str) {
        if self
            .notifies
            .get(queue)
            .is_some_and(|n| Arc::strong_count(n) == 1)
        {
            self.notifies.remove(queue);
        }
    }

    /// A queue was created, changed or deleted: the delivery manager
    /// restarts (or stops) its dispatcher.
    pub(super) fn queue_changed(&self, queue: &str) {
        if let Some(tx) = &self.push_wakeups {
            let _ = tx.send(PushWake::Changed(queue.to_owned()));
        }
    }

    /// Notes the queues whose counters `command` moves, for the dashboard's
    /// rates (`rates.rs`).
    pub(super) fn note_active(&mut self, command: &Command<'_>) {
        let mut note = |queue: &str| {
            if !self.active.contains(queue) {
                self.active.insert(queue.to_owned());
            }
        };
        match command {
            Command::Enqueue(meta) => note(&meta.queue),
            Command::Event(meta) => meta.deliveries.iter().for_each(|(q, _)| note(q)),
            Command::Resend { queue, .. }
            | Command::Ack { queue, .. }
            | Command::Retry { queue, .. }
            | Command::Fail { queue, .. } => note(queue),
            _ => {}
        }
    }

    /// Compaction learns of a file once a record in it is applied.
    pub(super) fn note_file(&mut self, file: u32) {
        if !self.files.contains_key(&file) {
            let bytes = self.segment_bytes;
            self.files.insert(file, FileMeta { bytes });
        }
    }

    /// The sends waiting on the dedup key that `reply`'s send owns (none
    /// for other replies), taken out; `answered` counts them as
    /// deduplicated (the first send was stored).
    pub(super) fn take_dedup_waiters(&mut self, reply: &Reply, answered: bool) -> Vec<SendReply> {
        let Reply::Send {
            dedup: Some(key), ..
        } = reply
        else {
            return Vec::new();
        };
        let waiters = self.pending_dedup.remove(key).unwrap_or_default();
        if answered {
            for _ in &waiters {
                self.spool.count_deduplicated(&key.0);
            }
        }
        waiters
    }

    /// Undoes what the engine reserved before appending `record`.
    pub(super) fn release(&mut self, record: &Record<'_>) {
        match &record.command {
            Command::Ack { queue, id }
            | Command::Retry { queue, id, .. }
            | Command::Fail { queue, id, .. }
            | Command::Expire { queue, id }
            | Command::Cancel { queue, id } => {
                self.spool.release(queue, *id);
                self.wake_one(queue);
            }
            Command::Redrive { queue, ids } => {
                let failed = failed_queue_name(queue);
                for id in ids {
                    self.spool.release(&failed, *id);
                }
                self.wake_all(&failed);
            }
            Command::Event(meta) => {
                if let Some(hash) = meta.dedup_hash {
                    self.pending_events.remove(&hash);
                }
            }
            _ => {}
        }
    }
}

/// What the engine tells the delivery manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushWake {
    /// A push queue without a dispatcher has work.
    Work(String),
    /// A queue's settings changed, or it was created or deleted.
    Changed(String),
}

/// State shared by the engine handle and the sink.
pub(super) struct Shared {
    pub core: Mutex<Core>,
    /// Flips to true when an fsync failed; `main` exits non-zero on it.
    pub poisoned: watch::Sender<bool>,
    /// Every message as it arrives in a queue (sent, failed into a failure
    /// queue, redriven), for `tail`. Slow subscribers miss events rather than
    /// hold memory.
    pub arrivals: tokio::sync::broadcast::Sender<Arrival>,
    /// What records appended but not yet applied will add to the state's
    /// memory (`spool::state::memory::record_cost`).
    pub in_flight_memory: AtomicU64,
    /// What spoold tells about itself, on its way to the operational
    /// events' publisher (`operational.rs`).
    pub notes: super::notes::Notes,
}

impl Shared {
    /// `record` was applied or refused: it is in flight no more. (A record
    /// another primary appended was never counted here: the count stays at
    /// zero rather than below.)
    pub(super) fn memory_landed(&self, record: &Record<'_>) {
        let cost = record_cost(&record.command);
        if cost > 0 {
            let _ = self
                .in_flight_memory
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_sub(cost))
                });
        }
    }
}

/// A message that just arrived in `queue`.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub queue: String,
    pub id: MessageId,
}
