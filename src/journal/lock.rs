//! The lock file that keeps two processes off one spool.

use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::error::JournalError;
use super::format::LOCK_FILE_NAME;

/// Holds an exclusive `flock` on `spool.lock` until dropped (or until the
/// process dies: the kernel releases it, so a `kill -9` leaves no stale lock).
#[derive(Debug)]
pub(crate) struct DirLock {
    _file: File,
}

impl DirLock {
    /// Takes the lock or fails at once (never waits) naming the holder's file.
    pub(crate) fn acquire(dir: &Path) -> Result<DirLock, JournalError> {
        let path = dir.join(LOCK_FILE_NAME);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| JournalError::io(&path, e))?;
        match file.try_lock() {
            Ok(()) => Ok(DirLock { _file: file }),
            Err(TryLockError::WouldBlock) => Err(JournalError::Locked {
                dir: dir.to_path_buf(),
                lock: path,
            }),
            Err(TryLockError::Error(e)) => Err(JournalError::io(&path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_fails_fast_with_a_clear_message() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        let err = DirLock::acquire(dir.path()).unwrap_err();
        assert!(matches!(err, JournalError::Locked { .. }));
        assert!(err.to_string().contains("in use by another spoold process"));
        drop(first);
        DirLock::acquire(dir.path()).expect("lock is free again");
    }
}
