//! Why replicated mode could not take a record: its own error type, so
//! that the journal's (`JournalError`) speaks only of files.

use crate::engine::error::WriteError;
use crate::journal::JournalError;
use crate::journal::format::RecordTooLarge;

/// Why a proposal was not handed to Raft (nothing was appended).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplicationError {
    /// Only the serving primary proposes: this replica is not (or not yet,
    /// or no longer) serving, or its leader lease ran out.
    #[error("this replica does not serve as the primary now")]
    NotPrimary,
    /// More proposals wait for Raft than the proposer's queue holds: the
    /// replicas are slower than the writers (backpressure).
    #[error("{queued} writes already wait for replication; retry shortly")]
    Backlog { queued: usize },
    /// The proposer stopped: the replica is shutting down.
    #[error("replication has stopped (the replica is shutting down)")]
    Closed,
    /// The record is larger than the journal's record bound
    /// (`journal::format::check_record_body`).
    #[error(transparent)]
    TooLarge(#[from] RecordTooLarge),
}

impl From<ReplicationError> for WriteError {
    fn from(e: ReplicationError) -> WriteError {
        match e {
            ReplicationError::NotPrimary => WriteError::NotPrimary {
                reason: e.to_string(),
            },
            ReplicationError::Backlog { .. } | ReplicationError::Closed => {
                WriteError::Unavailable {
                    reason: e.to_string(),
                }
            }
            ReplicationError::TooLarge(e) => WriteError::TooLarge(e),
        }
    }
}

/// Why a snapshot stream from the primary broke off (the network, or a
/// stream that does not verify): not a file's fault.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StreamError {
    #[error("the snapshot stream broke off: {0}")]
    Broken(String),
    #[error(transparent)]
    Journal(#[from] JournalError),
}
