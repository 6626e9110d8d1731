//! The journal: bytes on disk.
//!
//! A spool directory holds `spool.meta` (the spool's identity: salt and token
//! key), `spool.lock`, log segments `<id>.seg` (records in sequence order),
//! packs `<id>.pack` (payload records compaction copied out of older files)
//! and the newest checkpoint `<seq>.ckpt` (the state as of record `seq`).
//! Every record is framed with its length, a CRC32C that mixes in the
//! spool's salt, a sequence number that grows by one per record, and where
//! it sits in its group-commit batch. The exact layout is in [`format`] and
//! `docs/journal-format.md`.
//!
//! The journal knows nothing of queues or leases: a record is a kind byte and
//! a body, a checkpoint a list of chunks. It offers:
//!
//! - [`writer::Journal`]: group commit on a dedicated thread (see its docs);
//! - [`scan::scan_dir`]: the newest checkpoint, every valid record in order,
//!   and every damaged span;
//! - [`reader::SegmentReader`]: one record read back by location;
//! - [`files`]: writing packs and checkpoints, and deleting what they replace.
//!
//! All I/O goes through [`storage::Storage`], so tests run the same code on
//! `sim::SimStorage`, which loses unsynced bytes, tears writes and fails
//! fsyncs on demand (compiled only for tests and the `testing` feature).

pub(crate) mod atomic;
pub(crate) mod error;
pub(crate) mod files;
pub(crate) mod format;
pub(crate) mod frames;
pub(crate) mod lock;
pub(crate) mod prealloc;
pub(crate) mod reader;
pub(crate) mod scan;
#[cfg(any(test, feature = "testing"))]
pub(crate) mod sim;
pub(crate) mod storage;
pub(crate) mod v1;
pub(crate) mod writer;

use std::path::Path;
use std::sync::Arc;

pub use error::JournalError;
pub use format::RecordLoc;
pub(crate) use format::SpoolIdentity;
pub(crate) use writer::{
    BatchFailure, BatchSink, Control, Durable, Journal, Placed, Truncate, WriterOptions,
    WriterStats,
};

use format::{META_BYTES, META_FILE_NAME, segment_file_name};
use scan::ScanSummary;
use storage::Storage;
use writer::WriterStart;

/// Reads the spool's identity, creating it when the directory holds no
/// journal yet and `create` is set.
pub fn load_identity(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    create: bool,
) -> Result<Option<SpoolIdentity>, JournalError> {
    load_identity_or(storage, dir, create, SpoolIdentity::generate)
}

/// [`load_identity`], with the identity a new spool gets from `fresh`
/// (replicated mode: the cluster's).
pub(crate) fn load_identity_or(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    create: bool,
    fresh: impl FnOnce() -> SpoolIdentity,
) -> Result<Option<SpoolIdentity>, JournalError> {
    let path = dir.join(META_FILE_NAME);
    let has_files = !scan::list_files(storage.as_ref(), dir)?.is_empty();
    match storage.open(&path) {
        Ok(file) => {
            let mut bytes = Vec::with_capacity(META_BYTES);
            file.read_all(&mut bytes)
                .map_err(|e| JournalError::io(&path, e))?;
            match SpoolIdentity::decode(&bytes) {
                Some(identity) => Ok(Some(identity)),
                None if !has_files && bytes.len() < META_BYTES && create => {
                    // A creation that died before its rename was synced can
                    // leave nothing else behind; start over.
                    write_identity(storage, dir, fresh()).map(Some)
                }
                None => Err(JournalError::BadMeta {
                    dir: dir.to_path_buf(),
                    reason: "spool.meta is damaged".into(),
                }),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if has_files {
                Err(JournalError::BadMeta {
                    dir: dir.to_path_buf(),
                    reason: "spool.meta is missing".into(),
                })
            } else if create {
                write_identity(storage, dir, fresh()).map(Some)
            } else {
                Ok(None)
            }
        }
        Err(e) => Err(JournalError::io(&path, e)),
    }
}

fn write_identity(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    identity: SpoolIdentity,
) -> Result<SpoolIdentity, JournalError> {
    atomic::write_atomically(storage, dir, META_FILE_NAME, |file| {
        file.write_all_at(&identity.encode(), 0)
    })
    .map_err(atomic::AtomicWriteError::into_inner)?;
    Ok(identity)
}

/// Makes the end of the journal writable after a scan: clears a torn tail
/// and removes a last segment whose creation never finished. Returns where
/// the writer starts; `next_segment_id` is used when the directory holds no
/// log segment at all (an upgrade or repair rebuilt it from a checkpoint).
/// Call only when the scan found no [`scan::Problem`].
pub(crate) fn prepare_tail(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    summary: &ScanSummary,
    next_segment_id: u64,
) -> Result<WriterStart, JournalError> {
    let next_seq = summary.last_seq + 1;
    let disk_bytes = summary.file_bytes - summary.last_segment_len;
    if let Some(id) = summary.torn_last_header {
        atomic::remove_files(storage, dir, &[segment_file_name(id)])?;
        return Ok(WriterStart {
            segment_id: id,
            end_offset: 0,
            file_len: 0,
            next_seq,
            disk_bytes,
        });
    }
    let Some(last) = summary.segments.last() else {
        return Ok(WriterStart {
            segment_id: next_segment_id.max(1),
            end_offset: 0,
            file_len: 0,
            next_seq,
            disk_bytes: summary.file_bytes,
        });
    };
    if summary.last_segment_next_seq < next_seq {
        // Replicated mode: a snapshot installed from the primary put the
        // checkpoint past the end of the log, whose records it all covers.
        // The log goes on in a segment of its own.
        return Ok(WriterStart {
            segment_id: next_segment_id.max(last.id + 1),
            end_offset: 0,
            file_len: 0,
            next_seq,
            disk_bytes: summary.file_bytes,
        });
    }
    let path = dir.join(segment_file_name(last.id));
    let mut file_len = summary.last_segment_len;
    if let Some(torn) = summary.torn_tail {
        // Truncate a torn write at the end of the file; zero one that is
        // followed by preallocated space, keeping the space. Either way it
        // is made durable before anything new is written after it.
        let file = storage
            .open(&path)
            .map_err(|e| JournalError::io(&path, e))?;
        let torn_end = torn.offset + torn.len_bytes;
        let cleared = if torn_end >= file_len {
            file_len = torn.offset;
            file.set_len(torn.offset)
        } else {
            file.write_all_at(&vec![0u8; torn.len_bytes as usize], torn.offset)
        };
        cleared
            .and_then(|()| file.sync_data())
            .map_err(|e| JournalError::io(&path, e))?;
    }
    Ok(WriterStart {
        segment_id: last.id,
        end_offset: summary.last_segment_end,
        file_len,
        next_seq: next_seq.max(last.first_seq),
        disk_bytes: disk_bytes + file_len,
    })
}
