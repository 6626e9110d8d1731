//! Reading single records back by location: a receive or a peek reads the
//! payload from its file instead of keeping it in memory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::error::JournalError;
use super::format::RecordLoc;
use super::format::{FRAME_HEADER_BYTES, FileId, RECORD_BODY_MAX_BYTES};
use super::frames::frame_at;
use super::storage::{Storage, StorageFile};

/// Shared, cheap to clone. Open file handles are cached; a handle stays
/// usable for as long as a reader holds its `Arc`, even after compaction
/// deleted the file. Files are never rewritten in place (compaction writes
/// new packs and deletes old files), so a handle and a location taken
/// together always agree.
#[derive(Clone)]
pub(crate) struct SegmentReader {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    salt: u64,
    open: Arc<Mutex<HashMap<FileId, Arc<dyn StorageFile>>>>,
}

impl SegmentReader {
    pub(crate) fn new(storage: Arc<dyn Storage>, dir: &Path, salt: u64) -> SegmentReader {
        SegmentReader {
            storage,
            dir: dir.to_path_buf(),
            salt,
            open: Arc::default(),
        }
    }

    /// Makes an open handle known (the writer's new segment, compaction's
    /// new pack), so that readers need not reopen it.
    pub(crate) fn register(&self, file: FileId, handle: Arc<dyn StorageFile>) {
        self.open
            .lock()
            .expect("reader lock poisoned")
            .insert(file, handle);
    }

    /// Forgets a file that compaction deleted (readers that hold its handle
    /// keep it).
    pub(crate) fn unregister(&self, file: FileId) {
        self.open
            .lock()
            .expect("reader lock poisoned")
            .remove(&file);
    }

    /// The open handle of the file a location names. Take it under the
    /// engine's core lock together with the location, so that compaction
    /// cannot delete the file in between.
    pub(crate) fn file(&self, loc_file: u32) -> Result<Arc<dyn StorageFile>, JournalError> {
        let id = FileId::from_loc(loc_file);
        let mut open = self.open.lock().expect("reader lock poisoned");
        if let Some(file) = open.get(&id) {
            return Ok(file.clone());
        }
        let path = self.dir.join(id.file_name());
        let file = self
            .storage
            .open(&path)
            .map_err(|e| JournalError::io(&path, e))?;
        open.insert(id, file.clone());
        Ok(file)
    }

    /// Reads the record at `loc` from a handle taken earlier with
    /// [`SegmentReader::file`] and returns its body, after checking its
    /// checksum again: damage that happened after replay is reported, never
    /// handed out as a payload.
    pub(crate) fn read_body_from(
        &self,
        file: &Arc<dyn StorageFile>,
        loc: RecordLoc,
    ) -> Result<Vec<u8>, JournalError> {
        let frame = self.read_frame_from(file, loc)?;
        Ok(frame[super::format::FRAME_HEADER_BYTES..].to_vec())
    }

    /// The kind and body of the record at `loc`, checked as
    /// [`SegmentReader::read_body_from`] does, given to `f` without a copy.
    pub(crate) fn with_record_from<T>(
        &self,
        file: &Arc<dyn StorageFile>,
        loc: RecordLoc,
        f: impl FnOnce(u8, &[u8]) -> T,
    ) -> Result<T, JournalError> {
        let frame = self.read_frame_from(file, loc)?;
        let kind = super::format::FrameHeader::peek(&frame).kind;
        Ok(f(kind, &frame[super::format::FRAME_HEADER_BYTES..]))
    }

    /// The whole frame (header and body) at `loc`, checked.
    pub(crate) fn read_frame_from(
        &self,
        file: &Arc<dyn StorageFile>,
        loc: RecordLoc,
    ) -> Result<Vec<u8>, JournalError> {
        let path = || self.dir.join(FileId::from_loc(loc.file).file_name());
        // Paired with the writer's seal (`FrameHeader::seal`): a location
        // comes from a frame replay verified, so one that cannot hold a
        // frame is a bug, not damage.
        assert!(
            (FRAME_HEADER_BYTES..=FRAME_HEADER_BYTES + RECORD_BODY_MAX_BYTES)
                .contains(&(loc.len as usize)),
            "bug: a record location of {} bytes",
            loc.len
        );
        let mut frame = vec![0u8; loc.len as usize];
        file.read_exact_at(&mut frame, u64::from(loc.offset))
            .map_err(|e| JournalError::io(path(), e))?;
        match frame_at(&frame, 0, self.salt) {
            Ok(f) if f.frame_len() == frame.len() => Ok(frame),
            _ => Err(JournalError::Corrupt {
                dir: self.dir.clone(),
                file: path(),
                offset: u64::from(loc.offset),
                reason: "record changed on disk after it was replayed".into(),
            }),
        }
    }
}
