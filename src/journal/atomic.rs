//! The one way spoold puts a whole new file in place: write it under a
//! temporary name, fsync it, rename it to its final name, fsync the
//! directory. At every moment the final name holds either nothing (or the
//! old file) or the complete new one; start-up sweeps the temporary files a
//! crash leaves behind (`*.tmp`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::JournalError;
use super::storage::{Storage, StorageFile};

/// How far [`write_atomically`] got before it failed.
#[derive(Debug)]
pub(crate) enum AtomicWriteError {
    /// Nothing changed under the final name (the temp file is removed, or
    /// swept at the next start).
    NotInstalled(JournalError),
    /// The rename happened but the directory fsync failed: whether the new
    /// name survives a crash is unknown. Callers that keep state about the
    /// file must treat this as fatal.
    InDoubt(JournalError),
}

impl AtomicWriteError {
    pub(crate) fn into_inner(self) -> JournalError {
        match self {
            AtomicWriteError::NotInstalled(e) | AtomicWriteError::InDoubt(e) => e,
        }
    }
}

/// The temporary name of `name` while it is being written.
pub(crate) fn temp_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.tmp"))
}

/// Writes `dir/name` atomically; `fill` writes the content into the
/// temporary file. Returns the new file's open handle.
pub(crate) fn write_atomically(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    name: &str,
    fill: impl FnOnce(&dyn StorageFile) -> std::io::Result<()>,
) -> Result<Arc<dyn StorageFile>, AtomicWriteError> {
    let tmp = temp_path(dir, name);
    let path = dir.join(name);
    let _ = storage.remove(&tmp);
    let file = storage
        .create(&tmp)
        .map_err(|e| AtomicWriteError::NotInstalled(JournalError::io(&tmp, e)))?;
    if let Err(e) = fill(file.as_ref())
        .and_then(|()| file.sync_data())
        .and_then(|()| storage.rename(&tmp, &path))
    {
        let _ = storage.remove(&tmp);
        return Err(AtomicWriteError::NotInstalled(JournalError::io(&path, e)));
    }
    storage
        .sync_dir(dir)
        .map_err(|e| AtomicWriteError::InDoubt(JournalError::io(dir, e)))?;
    Ok(file)
}

/// Removes files and makes their removal durable with one directory fsync.
pub(crate) fn remove_files(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    names: &[String],
) -> Result<(), JournalError> {
    if names.is_empty() {
        return Ok(());
    }
    for name in names {
        let path = dir.join(name);
        match storage.remove(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(JournalError::io(&path, e)),
        }
    }
    storage.sync_dir(dir).map_err(|e| JournalError::io(dir, e))
}

/// Makes a directory's own entry durable in its parent (a new spool
/// directory, before anything in it is acknowledged).
pub(crate) fn sync_parent(storage: &Arc<dyn Storage>, dir: &Path) -> Result<(), JournalError> {
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    storage
        .sync_dir(parent)
        .map_err(|e| JournalError::io(parent, e))
}
