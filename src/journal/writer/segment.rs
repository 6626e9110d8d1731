//! The segment being written: its file, where the next frame goes, and how
//! it rolls over to the next one.

use std::path::PathBuf;
use std::sync::Arc;

use crate::journal::error::JournalError;
use crate::journal::format::{FILE_HEADER_BYTES, FileId, SegmentHeader, segment_file_name};
use crate::journal::prealloc::Preallocator;
use crate::journal::reader::SegmentReader;
use crate::journal::storage::{Storage, StorageFile};

pub(super) struct ActiveSegment {
    pub(super) storage: Arc<dyn Storage>,
    pub(super) dir: PathBuf,
    pub(super) salt: u64,
    pub(super) id: u64,
    pub(super) file: Option<Arc<dyn StorageFile>>,
    /// Where the next record goes.
    pub(super) len: u64,
    /// The file's length: beyond `len` when preallocated.
    pub(super) file_len: u64,
    pub(super) reader: SegmentReader,
    pub(super) prealloc: Option<Preallocator>,
}

impl ActiveSegment {
    pub(super) fn path(&self, id: u64) -> PathBuf {
        self.dir.join(segment_file_name(id))
    }

    pub(super) fn open_existing(&mut self) -> Result<(), JournalError> {
        let path = self.path(self.id);
        let file = self
            .storage
            .open(&path)
            .map_err(|e| JournalError::io(&path, e))?;
        self.reader.register(FileId::Segment(self.id), file.clone());
        self.file = Some(file);
        Ok(())
    }

    /// Creates segment `id` whose first record will be `first_seq` (from a
    /// zero-filled spare when one is ready): header, fsync, rename, directory
    /// fsync, so that the name and header are durable before any record in it
    /// is acknowledged. Returns the bytes it added on disk. `wait_for_spare`
    /// (start-up) waits for the spare being made rather than append.
    pub(super) fn create(
        &mut self,
        id: u64,
        first_seq: u64,
        wait_for_spare: bool,
    ) -> Result<u64, JournalError> {
        // Panics (a bug, or 2³¹ segments) before anything is written.
        let _ = FileId::Segment(id).to_loc();
        let path = self.path(id);
        let spare = self.prealloc.as_ref().and_then(|p| p.take(wait_for_spare));
        let opened = match &spare {
            Some(spare) => self.storage.open(spare),
            None => self.storage.create(&path),
        };
        let file = opened.map_err(|e| JournalError::io(&path, e))?;
        let header = SegmentHeader {
            segment_id: id,
            first_seq,
        };
        let written = file
            .write_all_at(&header.encode(self.salt), 0)
            .and_then(|()| file.sync_data())
            .and_then(|()| match &spare {
                Some(spare) => self.storage.rename(spare, &path),
                None => Ok(()),
            })
            .and_then(|()| self.storage.sync_dir(&self.dir));
        let file_len = written.and_then(|()| file.size_bytes());
        let file_len = match file_len {
            Ok(n) => n,
            Err(e) => {
                // Best effort: a half-made segment is also recognised at
                // replay (a truncated header in the last segment is an
                // incomplete rotation; spares are swept), so a failed removal
                // loses nothing.
                let _ = self.storage.remove(spare.as_deref().unwrap_or(&path));
                let _ = self.storage.remove(&path);
                return Err(JournalError::io(&path, e));
            }
        };
        self.reader.register(FileId::Segment(id), file.clone());
        self.id = id;
        self.file = Some(file);
        self.len = FILE_HEADER_BYTES as u64;
        self.file_len = file_len;
        Ok(file_len)
    }

    pub(super) fn file(&self) -> &Arc<dyn StorageFile> {
        self.file.as_ref().expect("bug: active segment has no file")
    }
}
