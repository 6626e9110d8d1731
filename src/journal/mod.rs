//! The journal: bytes on disk.
//!
//! A spool directory holds `spool.meta` (the spool's identity: salt and token
//! key), `spool.lock`, and segment files `<id as 16 hex digits>.seg`. Each
//! segment starts with a header and holds framed records; each frame carries
//! its length, a CRC32C that mixes in the spool's salt, and a sequence number
//! that grows by one per record across the whole journal. The exact layout is
//! in [`format`] and `docs/journal-format.md`.
//!
//! The journal knows nothing of queues or leases: a record is a kind byte and
//! a body. It offers three things:
//!
//! - [`writer::Journal`]: group commit on a dedicated thread (see its docs);
//! - [`scan::scan_dir`]: every valid record in order, and every damaged span;
//! - [`reader::SegmentReader`]: one record read back by location.
//!
//! All I/O goes through [`storage::Storage`], so tests run the same code on
//! [`sim::SimStorage`], which loses unsynced bytes, tears writes and fails
//! fsyncs on demand.

pub mod compact;
pub mod error;
pub mod format;
pub mod lock;
pub mod prealloc;
pub mod reader;
pub mod repair;
pub mod scan;
pub mod sim;
pub mod storage;
pub mod writer;

use std::path::Path;
use std::sync::Arc;

pub use error::JournalError;
pub use format::SpoolIdentity;
pub use writer::{
    BatchFailure, BatchSink, Durable, Journal, Placed, RecordLoc, WriterOptions, WriterStats,
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
    let path = dir.join(META_FILE_NAME);
    let has_segments = !scan::list_segments(storage.as_ref(), dir)?.is_empty();
    match storage.open(&path) {
        Ok(file) => {
            let mut bytes = Vec::with_capacity(META_BYTES);
            file.read_all(&mut bytes)
                .map_err(|e| JournalError::io(&path, e))?;
            match SpoolIdentity::decode(&bytes) {
                Some(identity) => Ok(Some(identity)),
                None if !has_segments && bytes.len() < META_BYTES && create => {
                    // A creation that died before its rename was synced can
                    // leave nothing else behind; start over.
                    write_identity(storage, dir).map(Some)
                }
                None => Err(JournalError::BadMeta {
                    dir: dir.to_path_buf(),
                    reason: "spool.meta is damaged".into(),
                }),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if has_segments {
                Err(JournalError::BadMeta {
                    dir: dir.to_path_buf(),
                    reason: "spool.meta is missing".into(),
                })
            } else if create {
                write_identity(storage, dir).map(Some)
            } else {
                Ok(None)
            }
        }
        Err(e) => Err(JournalError::io(&path, e)),
    }
}

fn write_identity(storage: &Arc<dyn Storage>, dir: &Path) -> Result<SpoolIdentity, JournalError> {
    let identity = SpoolIdentity::generate();
    let tmp = dir.join("spool.meta.tmp");
    let path = dir.join(META_FILE_NAME);
    let _ = storage.remove(&tmp);
    let file = storage
        .create(&tmp)
        .map_err(|e| JournalError::io(&tmp, e))?;
    file.write_all_at(&identity.encode(), 0)
        .and_then(|()| file.sync_data())
        .map_err(|e| JournalError::io(&tmp, e))?;
    storage
        .rename(&tmp, &path)
        .and_then(|()| storage.sync_dir(dir))
        .map_err(|e| JournalError::io(&path, e))?;
    Ok(identity)
}

/// Makes the end of the journal writable after a scan: truncates a torn tail
/// and removes a last segment whose creation never finished. Returns where
/// the writer starts. Call only when the scan found no [`scan::Problem`].
pub fn prepare_tail(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    summary: &ScanSummary,
) -> Result<WriterStart, JournalError> {
    let next_seq = summary.last_seq + 1;
    let Some(&last_id) = summary.segment_ids.last() else {
        return Ok(WriterStart {
            segment_id: 1,
            end_offset: 0,
            file_len: 0,
            next_seq,
            disk_bytes: 0,
        });
    };
    let path = dir.join(segment_file_name(last_id));
    if summary.torn_last_header {
        storage
            .remove(&path)
            .and_then(|()| storage.sync_dir(dir))
            .map_err(|e| JournalError::io(&path, e))?;
        return Ok(WriterStart {
            segment_id: last_id,
            end_offset: 0,
            file_len: 0,
            next_seq,
            disk_bytes: summary.file_bytes - summary.last_segment_len,
        });
    }
    let mut file_len = summary.last_segment_len;
    if let Some(torn) = summary.torn_tail {
        // Truncate a torn write at the end of the file; zero one that is
        // followed by preallocated space, keeping the space.
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
        segment_id: last_id,
        end_offset: summary.last_segment_end,
        file_len,
        next_seq: next_seq.max(summary.last_segment_first_seq.unwrap_or(0)),
        disk_bytes: summary.file_bytes - summary.last_segment_len + file_len,
    })
}
