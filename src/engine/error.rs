//! What each operation of the engine can answer besides success: one enum
//! per kind of operation (the redb pattern), each variant a case the caller
//! can act on. The HTTP layer maps every variant to a kind of the API
//! (`docs/contract.md` §4, errors) in one place (`api/error.rs`).

use crate::journal::JournalError;
use crate::journal::format::RecordTooLarge;

use super::rules::QueueRuleError;

/// Why a write did not become durable.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Nothing was written: the journal refused the write (rolled back
    /// after an I/O error, poisoned, or shutting down). Safe to retry.
    #[error("storage unavailable: {reason}")]
    Unavailable { reason: String },

    /// The record was handed to the disk but its fsync failed: it may or
    /// may not survive. Retry only with an idempotency key on a dedup queue.
    #[error("write accepted but its durability is unknown: {reason}")]
    Unconfirmed { reason: String },

    /// Replicated mode: this replica is not (or no longer) the serving
    /// primary, and nothing was appended. Safe to retry on the primary.
    #[error("not the primary: {reason}")]
    NotPrimary { reason: String },

    /// Replicated mode: the record went to Raft, and then this replica
    /// lost its leadership (or heard from no majority in time) before the
    /// record was known committed: it may or may not be applied.
    #[error("the primary lost its leadership before a majority confirmed the write: {reason}")]
    LeadershipLost { reason: String },

    /// The record is larger than the journal's record bound: nothing was
    /// written. The API's body bound keeps a request below it, so only a
    /// caller of the library that skips that bound sees this.
    #[error(transparent)]
    TooLarge(#[from] RecordTooLarge),

    /// What the state holds in memory, as accounted, and this record would
    /// pass `spool.max_memory`: nothing was written. Settling messages
    /// frees memory; retry later.
    #[error(
        "the spool's memory is full: {accounted_bytes} bytes accounted, a new message would pass \
         spool.max_memory = {max_memory}"
    )]
    MemoryFull {
        accounted_bytes: u64,
        max_memory: u64,
    },
}

/// A stored record could not be read back (an I/O error, or damage after
/// replay).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ReadError(#[from] pub JournalError);

/// What a send can answer.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("queue {queue} does not exist")]
    QueueNotFound { queue: String },

    /// Messages reach a failure queue only by failing.
    #[error("{queue} is a failure queue: messages arrive there only by failing")]
    FailureQueue { queue: String },

    /// An idempotency key on a queue without a dedup window would be
    /// ignored: refused instead.
    #[error("queue {queue} has no dedup window: an idempotency key would be ignored")]
    KeyWithoutWindow { queue: String },

    /// The journal is at `spool.max_bytes` less the headroom kept for
    /// acks, nacks and compaction: new messages wait until compaction
    /// frees space.
    #[error("spool is full: {journal_bytes} of {max_bytes} bytes in use")]
    SpoolFull { journal_bytes: u64, max_bytes: u64 },

    #[error(transparent)]
    Write(#[from] WriteError),
}

/// What publishing an event can answer.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// A field of the event is malformed.
    #[error("{field}: {problem}")]
    Invalid {
        field: &'static str,
        problem: String,
    },

    /// More queues subscribe to the type than `events.max_subscribers`.
    #[error(
        "type: {subscribers} queues subscribe to {event_type}, more than \
         events.max_subscribers = {max}"
    )]
    TooManySubscribers {
        event_type: String,
        subscribers: usize,
        max: usize,
    },

    /// The payload does not match its type's schema in the catalogue.
    #[error("payload: does not match the schema of event type {event_type} at {path:?}: {reason}")]
    SchemaMismatch {
        event_type: String,
        /// A JSON pointer into the payload ("" for the whole of it).
        path: String,
        reason: String,
    },

    /// The first event with this idempotency key is still being written.
    #[error("an event with this Idempotency-Key is still being written: ask again")]
    KeyInProgress,

    /// The key was used, inside the window, for an event with another type
    /// or body: a retry says the same, so this is a mistake.
    #[error(
        "this Idempotency-Key was used for another event (another type or body) inside \
         events.dedup_window: use a new key for a new event"
    )]
    KeyReused,

    #[error("spool is full: {journal_bytes} of {max_bytes} bytes in use")]
    SpoolFull { journal_bytes: u64, max_bytes: u64 },

    #[error(transparent)]
    Write(#[from] WriteError),
}

/// What a receive (or a worker's lease) can answer.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("queue {queue} does not exist")]
    QueueNotFound { queue: String },

    /// A receive on a push queue: its own workers consume it.
    #[error("{queue} is a push queue: its own workers consume it")]
    NotPullQueue { queue: String },

    /// A worker's lease on a queue without a destination.
    #[error("{queue} has no destination")]
    NotPushQueue { queue: String },

    /// Replicated mode: leases are handed out by the primary only.
    #[error("this replica is not serving as the primary")]
    NotPrimary,
}

/// What settling a lease (ack, nack, renew, a worker's outcome) can answer.
#[derive(Debug, thiserror::Error)]
pub enum SettleError {
    /// A token this spool never issued.
    #[error("malformed lease token")]
    BadToken,

    /// A genuine token whose lease expired, was settled, or predates a
    /// restart.
    #[error("lease is no longer valid (expired, settled, cancelled or from before a restart)")]
    StaleLease,

    #[error("queue {queue} does not exist")]
    QueueNotFound { queue: String },

    #[error(transparent)]
    Read(#[from] ReadError),

    #[error(transparent)]
    Write(#[from] WriteError),
}

/// What an operation on one message (get, cancel, its payload or
/// attempts) can answer.
#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    #[error("queue {queue} does not exist")]
    QueueNotFound { queue: String },

    #[error("message {id} does not exist in queue {queue}")]
    MessageNotFound { queue: String, id: String },

    /// Reason, status or time filters on a queue that holds no dead
    /// letters.
    #[error(
        "{queue} is not a failure queue: only dead letters have a reason, a last status and a failure time"
    )]
    NotAFailureQueue { queue: String },

    /// "Retry now" of a message that does not wait: it is visible, leased
    /// (its consumer or delivery holds it) or a dead letter.
    #[error(
        "message {id} of {queue} is {state}, not waiting: only a delayed message can be retried now"
    )]
    NotDelayed {
        queue: String,
        id: String,
        state: &'static str,
    },

    #[error(transparent)]
    Read(#[from] ReadError),

    #[error(transparent)]
    Write(#[from] WriteError),
}

/// What an operation on a queue (create, change, delete, pause, purge,
/// redrive, stats) can answer.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("queue {queue} does not exist")]
    NotFound { queue: String },

    /// A setting out of bounds, a destination the policy refuses, a file
    /// named over the API.
    #[error(transparent)]
    Rule(#[from] QueueRuleError),

    /// As many queues as `server.max_queues` exist (failure queues not
    /// counted): delete one first.
    #[error(
        "there are {max} queues, as many as server.max_queues allows (failure queues not \
         counted): delete one first"
    )]
    LimitReached { max: usize },

    /// The config file defines the queue: change it there.
    #[error("{queue} is defined in the config file; change it there")]
    ManagedByConfig { queue: String },

    /// A failure queue is created, changed and deleted with its queue; it
    /// has no failure queue of its own to redrive from.
    #[error("{queue} is a failure queue: it is {what} with its queue")]
    FailureQueue { queue: String, what: &'static str },

    /// Reason, status or time filters name a queue that holds no dead
    /// letters.
    #[error(
        "{queue} is not a failure queue: only dead letters have a reason, a last status and a failure time"
    )]
    NotAFailureQueue { queue: String },

    /// Signing is for a push queue's deliveries.
    #[error("{queue} has no destination: its deliveries are not signed")]
    NotPushQueue { queue: String },

    #[error(transparent)]
    Write(#[from] WriteError),
}

/// The journal stopped before it answered: it is shutting down.
pub(in crate::engine) fn closed() -> WriteError {
    WriteError::Unavailable {
        reason: "the spool is shutting down".into(),
    }
}
