//! The journal's error type.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong below the state machine.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// An operating-system call failed on `path`.
    #[error("i/o error on {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// Another process holds the spool directory's lock file.
    #[error(
        "spool directory {} is in use by another spoold process (lock file {} is held); \
         stop that process or point spool.dir elsewhere",
        dir.display(), lock.display()
    )]
    Locked { dir: PathBuf, lock: PathBuf },

    /// Segment files exist but the identity file that names their salt does
    /// not, so none of them can be verified.
    #[error(
        "{} holds journal segments but no readable spool.meta ({reason}); \
         the spool's identity is lost and its records cannot be verified",
        dir.display()
    )]
    BadMeta { dir: PathBuf, reason: String },

    /// A record failed its checksum (or framing) with valid records after it,
    /// a sealed segment is damaged, or segments are missing. Replay refuses
    /// to guess.
    #[error(
        "journal corruption in {} at offset {offset}: {reason} \
         (run `spoold journal verify --dir {}` for every damaged span)",
        file.display(), dir.display()
    )]
    Corrupt {
        dir: PathBuf,
        file: PathBuf,
        offset: u64,
        reason: String,
    },

    /// A record passed its checksum but its body does not decode: written by
    /// a newer spoold, or a bug.
    #[error("undecodable record in {} at offset {offset}: {reason}", file.display())]
    BadRecord {
        file: PathBuf,
        offset: u64,
        reason: String,
    },

    /// An earlier fsync failed; the journal takes no more writes until the
    /// process restarts and replay decides what is on disk.
    #[error("journal is poisoned by an earlier fsync failure; restart to recover")]
    Poisoned,

    /// The journal is shutting down.
    #[error("journal is closed")]
    Closed,

    /// A record's body is larger than the journal's record bound
    /// (`format::RECORD_BODY_MAX_BYTES`): replay would read it as damage.
    /// Refused before anything of it is written; the journal goes on.
    #[error(transparent)]
    RecordTooLarge(#[from] super::format::RecordTooLarge),
}

impl JournalError {
    pub fn io(path: impl Into<PathBuf>, source: io::Error) -> JournalError {
        JournalError::Io {
            path: path.into(),
            source,
        }
    }
}
