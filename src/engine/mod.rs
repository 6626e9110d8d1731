//! The engine: the one place that joins the journal and the state machine,
//! and the one owner of the rules (`rules.rs`): every layer above it
//! (the API, the config loader, the delivery workers) only translates.
//!
//! Every write operation follows the same path (`write.rs`):
//!
//! 1. lock the core, check the request against the state and *reserve* what
//!    it needs (a lease marked settling, a message marked pending);
//! 2. still under the lock, append the record to the journal, so records
//!    reach the journal in the order their reservations were made;
//! 3. release the lock and await the reply. The journal's writer thread
//!    writes, fsyncs, applies the record to the state machine and only then
//!    answers (`sink.rs`).
//!
//! A handler that is dropped at step 3 changes nothing: the record is applied
//! and acted on all the same. Reads (receive, renew, peek, stats) never touch
//! the journal: leases are memory only, and a restart drops them.
//!
//! The engine also owns time: `now` comes from its [`Clock`], never runs
//! backwards, and a timer task (`timer.rs`) turns expired leases and
//! retention into records.
//!
//! The files: `open.rs` (start-up), `send.rs`, `lease.rs` (receive and
//! settling leases), `messages.rs`, `events.rs` (fan-out), `queues.rs`, `settle.rs` (a delivery
//! worker's outcome), `timer.rs`, `compact.rs`, `rebuild.rs` (upgrade and
//! repair), `core.rs` (the state behind the lock), `sink.rs` (apply and
//! answer), `write.rs`, `rules.rs`, `token.rs`, `error.rs`.

mod awake;
pub(crate) mod catalogue;
mod checkpoint;
pub(crate) mod compact;
mod core;
pub(crate) mod error;
mod events;
pub(crate) mod guard;
mod history;
mod lease;
mod log;
mod messages;
mod notes;
mod open;
pub(crate) mod operational;
mod queues;
pub mod rates;
pub(crate) mod rebuild;
mod replay;
pub(crate) mod replicated;
pub use replicated::Replica;
pub(crate) mod rules;
mod secrets;
mod send;
pub(crate) mod settle;
mod shared_reads;
mod sink;
mod timer;
pub(crate) mod token;
mod write;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

pub use self::awake::PushWake;
pub use self::core::Arrival;
use self::core::{Core, Shared};
pub use catalogue::{CatalogueError, EventTypeDef};
pub use core::SendOutcome;
pub use error::{
    EventError, LeaseError, MessageError, QueueError, ReadError, SendError, SettleError, WriteError,
};
pub use events::{EventOutcome, EventRequest, Publisher};
pub use history::{HISTORY_SCAN_MAX, HistoryItem, HistoryPage, HistoryQuery};
pub use log::{LogItem, LogPage, LogQuery};
pub use queues::{BulkOutcome, QueueOwner};
pub use rules::{Origin, Policy};
pub use secrets::Rotation;
use sink::Entry;
use token::Tokens;

use crate::journal::lock::DirLock;
use crate::journal::reader::SegmentReader;
use crate::journal::storage::{OsStorage, Storage};
use crate::journal::{Journal, SpoolIdentity};
use crate::spool::{MessageId, MessageView, Payload, SpoolState};
use crate::time::{Clock, Millis, SteadyClock};

/// Arrival events buffered for `tail` subscribers; one that falls further
/// behind skips ahead.
const ARRIVALS_BUFFERED_MAX: usize = 4096;
/// Most messages one receive may lease (docs/contract.md §4: `max` ≤ 100).
pub(crate) const RECEIVE_BATCH_MAX: usize = 100;

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
    /// `SpoolFull` while less than `headroom_bytes` (two segments) is left.
    pub max_bytes: u64,
    /// Bytes the state may hold in memory, as accounted
    /// (`spool/state/memory.rs`); sends and events that would pass it are
    /// refused with `MemoryFull`.
    pub max_memory: u64,
    /// Move damaged spans aside at start-up instead of refusing to start.
    pub quarantine_corruption: bool,
    /// What the server allows any queue (destinations).
    pub policy: Policy,
    /// Replicated mode (`src/cluster/`): the journal is a Raft log, and
    /// start-up applies its records only up to this sequence number (the
    /// last one known committed); the rest waits for Raft. `None`: a
    /// single node.
    pub replicated: Option<u64>,
    /// The identity (salt, token key) a new spool gets, and an existing one
    /// must have; `None`: a random one. Replicated mode: the cluster's, so
    /// that every replica shows the same ids and checks the same tokens.
    pub identity: Option<crate::journal::SpoolIdentity>,
}

/// The most often the state digest is computed.
const DIGEST_EVERY: Duration = Duration::from_secs(1);

/// What a spool keeps free beyond its files, counting the active segment
/// at its full size: one segment for the next rotation (the preallocated
/// spare), one for compaction's output. With the active segment that is
/// three segments, so a config needs `max_bytes` ≥ 4 × `segment_bytes`:
/// then a spool whose messages are all settled (its other files compacted
/// away down to a small checkpoint) has room to send again.
pub(crate) fn headroom_bytes(segment_bytes: u64) -> u64 {
    2 * segment_bytes
}

impl EngineOptions {
    /// The real file system and the steady clock (`src/time.rs`).
    pub fn new(dir: impl Into<PathBuf>) -> EngineOptions {
        EngineOptions {
            dir: dir.into(),
            segment_bytes: 64 << 20,
            fsync: true,
            storage: Arc::new(OsStorage),
            clock: Arc::new(SteadyClock::new()),
            lock: true,
            preallocate: true,
            max_bytes: u64::MAX,
            max_memory: u64::MAX,
            quarantine_corruption: false,
            policy: Policy::default(),
            replicated: None,
            identity: None,
        }
    }
}

/// What start-up found.
#[derive(Debug, Clone)]
pub struct ReplayReport {
    /// Records applied after the checkpoint.
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

/// A message leased to a push queue's worker: the lease as the engine
/// issued it, typed (a worker's lease never leaves the process, so there
/// is no token to sign and check again), and what to send.
#[derive(Debug)]
pub(crate) struct PushDelivery {
    pub lease: token::LeaseToken,
    pub retry_count: u32,
    pub enqueued_at: Millis,
    pub payload: Payload,
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
    journal: Journal<Entry>,
    /// Where decided records go (`write.rs`).
    appender: write::Appender,
    /// Replicated mode only.
    replication: Option<Arc<replicated::Replication>>,
    reader: SegmentReader,
    /// The payloads of the last large records read (events with many
    /// deliveries), decoded once for all of them.
    shared_reads: shared_reads::SharedReads,
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    identity: SpoolIdentity,
    /// One compaction at a time.
    compacting: Mutex<()>,
    max_bytes: u64,
    /// What the state may hold in memory, as accounted.
    max_memory: u64,
    /// The last state digest: when it was computed, its applied record,
    /// its hex (`Engine::state_digest`).
    digest: Mutex<Option<(std::time::Instant, u64, String)>>,
    segment_bytes: u64,
    clock: Arc<dyn Clock>,
    tokens: Tokens,
    epoch: u64,
    policy: Policy,
    /// The dashboard's per-second counts (`rates.rs`).
    rates: rates::Rates,
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
        // A panic while holding the lock is a bug: nothing may go on with
        // state it may have left half-changed.
        self.inner
            .shared
            .core
            .lock()
            .expect("bug: core lock poisoned")
    }

    /// The engine's clock (the system's, or what a test injected), in ms
    /// since the Unix epoch: what delivery stamps attempts and signatures
    /// with.
    pub fn clock_ms(&self) -> Millis {
        self.inner.clock.now_ms()
    }

    /// How far the host's wall clock has stepped from the engine's steady
    /// clock (`src/time.rs`): 0 when they agree within a second.
    pub fn clock_step_ms(&self) -> i64 {
        // A reading compares the two clocks afresh.
        self.inner.clock.now_ms();
        self.inner.clock.step_ms()
    }

    /// The spool's `now`: the clock, but never earlier than a `now` already
    /// handed out.
    fn now(&self, core: &mut Core) -> Millis {
        core.last_now = core.last_now.max(self.inner.clock.now_ms());
        core.last_now
    }

    /// The epoch lease tokens carry: on a single node, one more than the
    /// last start's; in replicated mode, the term this replica serves in
    /// (0 while it is not the primary).
    pub fn epoch(&self) -> u64 {
        match &self.inner.replication {
            Some(r) => r.serving_term(),
            None => self.inner.epoch,
        }
    }

    pub fn tokens(&self) -> &Tokens {
        &self.inner.tokens
    }

    /// Every message as it arrives in a queue, for `tail`.
    pub fn arrivals(&self) -> tokio::sync::broadcast::Receiver<Arrival> {
        self.inner.shared.arrivals.subscribe()
    }

    /// Fires once the journal is poisoned (a failed fsync, or an I/O error
    /// after compaction's point of no return).
    pub fn poisoned(&self) -> watch::Receiver<bool> {
        self.inner.shared.poisoned.subscribe()
    }

    pub fn is_poisoned(&self) -> bool {
        self.inner.journal.is_poisoned()
    }

    /// Bytes of the journal's files.
    pub fn journal_bytes(&self) -> u64 {
        self.inner.journal.disk_bytes()
    }

    /// The rules the engine checks changes against (from the config).
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// The configured limit on [`Engine::journal_bytes`].
    pub fn max_bytes(&self) -> u64 {
        self.inner.max_bytes
    }

    /// True while new messages are refused for want of space: the files
    /// (the active segment counted at its full size) and the headroom would
    /// not fit in `max_bytes`.
    pub fn is_full(&self) -> bool {
        self.is_full_for(0)
    }

    /// [`Engine::is_full`] for a write of `incoming` bytes: one larger than
    /// the active segment has left starts a segment of its own, so it
    /// counts in full (without this a 200 MiB body was taken when 2 MiB
    /// were left, and the journal passed `max_bytes` by the record bound).
    pub(crate) fn is_full_for(&self, incoming: u64) -> bool {
        let active_growth = self
            .inner
            .segment_bytes
            .saturating_sub(self.inner.journal.active_file_bytes());
        let own_segment = if incoming > active_growth {
            incoming
        } else {
            0
        };
        self.disk_accounted().saturating_add(own_segment) > self.inner.max_bytes
    }

    /// The journal's bytes as `max_bytes` counts them: the files, the
    /// active segment at its full size, and the headroom. New messages are
    /// refused once it would pass `max_bytes` (`spoold.spool.near_full`
    /// warns at 90 %, `operational.rs`).
    pub fn disk_accounted(&self) -> u64 {
        let seg = self.inner.segment_bytes;
        let active_growth = seg.saturating_sub(self.inner.journal.active_file_bytes());
        self.journal_bytes()
            .saturating_add(active_growth)
            .saturating_add(headroom_bytes(seg))
    }

    /// What the state holds in memory as accounted (with what records in
    /// flight will add), and its bound.
    pub fn memory(&self) -> (u64, u64) {
        let accounted = self.core().spool.memory_bytes()
            + self.inner.shared.in_flight_memory.load(Ordering::Relaxed);
        (accounted, self.inner.max_memory)
    }

    /// Refuses `record` when what it adds would take the state's memory,
    /// as accounted, past `max_memory`; call it under the core lock
    /// (`core`), before appending.
    fn check_memory(
        &self,
        core: &Core,
        record: &crate::spool::Record<'_>,
    ) -> Result<(), error::WriteError> {
        let cost = crate::spool::state::memory::record_cost(&record.command);
        if cost == 0 {
            return Ok(());
        }
        let accounted =
            core.spool.memory_bytes() + self.inner.shared.in_flight_memory.load(Ordering::Relaxed);
        if accounted.saturating_add(cost) > self.inner.max_memory {
            crate::metrics::limit_reached(crate::metrics::Limit::Memory);
            return Err(error::WriteError::MemoryFull {
                accounted_bytes: accounted,
                max_memory: self.inner.max_memory,
            });
        }
        Ok(())
    }

    /// What a destination may reach (`guard.rs`): deliveries check every
    /// address they connect to with it.
    pub(crate) fn guard(&self) -> &guard::Guard {
        &self.inner.policy.guard
    }

    /// The journal writer's counters (batches = fsyncs, records).
    pub fn journal_stats(&self) -> crate::journal::WriterStats {
        self.inner.journal.stats()
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

    /// The last applied record and a SHA-256 (hex) of the replicated state
    /// as of it (`Spool::state_digest`): replicas compare them.
    ///
    /// Hashing the state holds the core lock for as long as it takes (four
    /// clients asking in a loop kept sends waiting a second each), so one
    /// is computed at most every [`DIGEST_EVERY`]: an ask within that
    /// time gets the last one, which says the applied record it is of.
    /// Blocking: call it off the runtime.
    pub fn state_digest(&self) -> (u64, String) {
        let mut last = self.inner.digest.lock().expect("bug: digest lock poisoned");
        if let Some((at, seq, hex)) = &*last
            && at.elapsed() < DIGEST_EVERY
        {
            return (*seq, hex.clone());
        }
        let (seq, hash) = {
            let mut core = self.core();
            let now = self.now(&mut core);
            let window = self.inner.policy.event_dedup_window_ms;
            (
                core.spool.applied_seq(),
                core.spool.state_digest(now, window),
            )
        };
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        *last = Some((std::time::Instant::now(), seq, hex.clone()));
        (seq, hex)
    }

    /// Test hook: while on, durable records wait before they are applied
    /// (see `journal::writer`), so a test can run compaction while records
    /// are on disk but not yet in the state. Only with the `testing`
    /// feature, which the release binary is built without.
    #[cfg(any(test, feature = "testing"))]
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
            .expect("bug: compaction lock poisoned");
        drop(self.inner.lock.lock().expect("bug: lock poisoned").take());
    }
}
