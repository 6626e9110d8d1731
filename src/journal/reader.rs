//! Reading single records back by location: a receive or a peek reads the
//! payload from its segment instead of keeping it in memory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::error::JournalError;
use super::format::{FRAME_HEADER_BYTES, FrameHeader, segment_file_name};
use super::storage::{Storage, StorageFile};
use super::writer::RecordLoc;

/// Shared, cheap to clone. Open segment handles are cached; a handle stays
/// usable for as long as a reader holds its `Arc`, even if the segment is
/// replaced meanwhile.
#[derive(Clone)]
pub struct SegmentReader {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    salt: u64,
    open: Arc<Mutex<HashMap<u64, Arc<dyn StorageFile>>>>,
}

impl SegmentReader {
    pub fn new(storage: Arc<dyn Storage>, dir: &Path, salt: u64) -> SegmentReader {
        SegmentReader {
            storage,
            dir: dir.to_path_buf(),
            salt,
            open: Arc::default(),
        }
    }

    /// Makes the writer's handle of a new segment known, so that readers
    /// need not reopen it.
    pub fn register(&self, segment_id: u64, file: Arc<dyn StorageFile>) {
        self.open
            .lock()
            .expect("reader lock poisoned")
            .insert(segment_id, file);
    }

    /// Forgets a segment that compaction deleted (readers that hold its
    /// handle keep it).
    pub fn unregister(&self, segment_id: u64) {
        self.open
            .lock()
            .expect("reader lock poisoned")
            .remove(&segment_id);
    }

    /// The open handle of a segment. Take it under the engine's core lock
    /// together with a location, so that compaction cannot swap the file in
    /// between.
    pub fn file(&self, segment_id: u64) -> Result<Arc<dyn StorageFile>, JournalError> {
        let mut open = self.open.lock().expect("reader lock poisoned");
        if let Some(file) = open.get(&segment_id) {
            return Ok(file.clone());
        }
        let path = self.dir.join(segment_file_name(segment_id));
        let file = self
            .storage
            .open(&path)
            .map_err(|e| JournalError::io(&path, e))?;
        open.insert(segment_id, file.clone());
        Ok(file)
    }

    /// Reads the record at `loc` and returns its body, after checking its
    /// checksum again: damage that happened after replay is reported, never
    /// handed out as a payload.
    pub fn read_body(&self, loc: RecordLoc) -> Result<Vec<u8>, JournalError> {
        let file = self.file(u64::from(loc.segment_id))?;
        self.read_body_from(&file, loc)
    }

    /// Like `read_body`, from a handle taken earlier with [`SegmentReader::file`].
    pub fn read_body_from(
        &self,
        file: &Arc<dyn StorageFile>,
        loc: RecordLoc,
    ) -> Result<Vec<u8>, JournalError> {
        let segment_id = u64::from(loc.segment_id);
        let path = || self.dir.join(segment_file_name(segment_id));
        let mut frame = vec![0u8; loc.len as usize];
        file.read_exact_at(&mut frame, u64::from(loc.offset))
            .map_err(|e| JournalError::io(path(), e))?;
        let header = FrameHeader::peek(&frame);
        if frame.len() < FRAME_HEADER_BYTES
            || header.body_len as usize != frame.len() - FRAME_HEADER_BYTES
            || !FrameHeader::verify(&frame, self.salt)
        {
            return Err(JournalError::Corrupt {
                dir: self.dir.clone(),
                file: path(),
                offset: u64::from(loc.offset),
                reason: "record changed on disk after it was replayed".into(),
            });
        }
        frame.drain(..FRAME_HEADER_BYTES);
        Ok(frame)
    }
}
