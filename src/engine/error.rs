//! The engine's error type: what an operation can answer besides success.
//! The HTTP layer maps each variant to one of the spec's error kinds.

use crate::journal::JournalError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("queue {queue} does not exist")]
    QueueNotFound { queue: String },

    #[error("message {id} does not exist in queue {queue}")]
    MessageNotFound { queue: String, id: String },

    /// A genuine token whose lease expired, was settled, or predates a
    /// restart.
    #[error("lease is no longer valid (expired, settled, cancelled or from before a restart)")]
    StaleLease,

    /// A token this spool never issued.
    #[error("malformed lease token")]
    BadToken,

    #[error("{0}")]
    BadRequest(String),

    /// The operation is not allowed on this queue (a send to a failure
    /// queue, a receive on a push queue, …).
    #[error("{message}")]
    Conflict { kind: ConflictKind, message: String },

    /// Nothing was written: the journal refused the write (rolled back after
    /// an I/O error, poisoned, or shutting down). Safe to retry.
    #[error("storage unavailable: {reason}")]
    Unavailable { reason: String },

    /// The record was handed to the disk but its fsync failed: it may or may
    /// not survive. Retry only with an idempotency key on a dedup queue.
    #[error("write accepted but its durability is unknown: {reason}")]
    Unconfirmed { reason: String },

    /// The journal is at `spool.max_bytes` less the headroom kept for acks,
    /// nacks and compaction: new messages wait until compaction frees space.
    #[error("spool is full: {journal_bytes} of {max_bytes} bytes in use")]
    SpoolFull { journal_bytes: u64, max_bytes: u64 },

    /// Reading a stored record failed.
    #[error(transparent)]
    Journal(#[from] JournalError),
}

/// Which 409 a [`EngineError::Conflict`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConflictKind {
    NotPullQueue,
    NotPushQueue,
    ManagedByConfig,
    FailureQueue,
}
