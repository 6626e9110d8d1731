//! The writer thread: takes everything pending at once, writes it with one
//! `write`, makes it durable with one `fdatasync`, and only then hands it on
//! with a [`Durable`] receipt.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::segment::ActiveSegment;
use super::{BatchFailure, BatchSink, Control, Durable, Placed, Shared, WriterOptions};
use crate::journal::error::JournalError;
use crate::journal::format::{
    FILE_HEADER_BYTES, FRAME_FLAG_BATCH_END, FileId, FrameHeader, RecordLoc, segment_file_name,
};
use crate::journal::storage::StorageFile;

pub(super) struct Writer<E, S> {
    pub(super) shared: Arc<Shared<E>>,
    pub(super) segment: ActiveSegment,
    pub(super) options: WriterOptions,
    pub(super) next_seq: u64,
    pub(super) sink: S,
}

impl<E: Send + 'static, S: BatchSink<E>> Writer<E, S> {
    pub(super) fn run(mut self) {
        let mut buf = Vec::new();
        let mut frames = Vec::new();
        let mut entries = Vec::new();
        loop {
            {
                let mut pending = self.shared.pending.lock().expect("journal lock poisoned");
                while pending.entries.is_empty() && pending.control.is_none() && !pending.closed {
                    pending.writer_waiting = true;
                    pending = self
                        .shared
                        .wake
                        .wait(pending)
                        .expect("journal lock poisoned");
                }
                pending.writer_waiting = false;
                if pending.entries.is_empty() {
                    let Some(control) = pending.control.take() else {
                        return;
                    };
                    drop(pending);
                    let (result, done) = match control {
                        Control::Truncate(t) => {
                            (self.truncate(t.keep_seq, t.cut, t.last_kept), t.done)
                        }
                        Control::Restart { next_seq, done } => {
                            self.restart(next_seq);
                            (Ok(()), done)
                        }
                    };
                    if result.is_err() {
                        self.shared.poisoned.store(true, Ordering::Release);
                    }
                    let _ = done.send(result);
                    continue;
                }
                std::mem::swap(&mut buf, &mut pending.buf);
                std::mem::swap(&mut frames, &mut pending.frames);
                std::mem::swap(&mut entries, &mut pending.entries);
            }
            self.commit(&mut buf, &frames, std::mem::take(&mut entries));
            buf.clear();
            frames.clear();
        }
    }

    /// Writes one batch and tells the sink how it went: durable, with a
    /// receipt and where each record lies, or failed. `frames` holds
    /// (start in `buf`, kind, term) of each record, one per entry.
    pub(super) fn commit(&mut self, buf: &mut [u8], frames: &[(usize, u8, u64)], entries: Vec<E>) {
        let first_seq = self.next_seq;
        let (base, fsync_duration) = match self.write_durably(buf, frames, first_seq) {
            Ok(written) => written,
            Err(failure) => {
                self.sink.failed(&failure, entries);
                return;
            }
        };
        self.count_in(buf.len() as u64, first_seq, frames.len() as u64);
        let placed = self.placements(entries, frames, buf.len(), base, first_seq);
        let receipt = Durable {
            last_seq: self.next_seq - 1,
            fsync_duration,
        };
        self.sink.durable(&receipt, placed);
        self.shared.durable_seq.send_replace(self.next_seq - 1);
    }

    /// Puts the batch on disk: sealed, in a segment with room for it,
    /// written at the segment's end and synced. Returns the offset it starts
    /// at and how long the fsync took; a failure says whether any of the
    /// batch may be on disk (see [`BatchFailure`]). Changes no count: only
    /// [`Self::count_in`] does, once the batch is durable.
    fn write_durably(
        &mut self,
        buf: &mut [u8],
        frames: &[(usize, u8, u64)],
        first_seq: u64,
    ) -> Result<(u64, Duration), BatchFailure> {
        if self.shared.poisoned.load(Ordering::Acquire) {
            // Appended after the fsync failure: never written, so rejected
            // rather than in doubt.
            return Err(BatchFailure::RolledBack(io::Error::other(
                "journal is poisoned",
            )));
        }
        self.seal_frames(buf, frames, first_seq);
        self.make_room(buf.len() as u64, first_seq)?;
        let base = self.segment.len;
        let file = self.segment.file().clone();
        self.write_or_roll_back(&file, buf, base)?;
        let fsync_duration = self.sync(&file)?;
        Ok((base, fsync_duration))
    }

    /// Stamps every frame's header: its sequence number, term, kind, place
    /// in the batch and checksum. Only the last frame ends the batch, so
    /// replay can tell which batch a write was cut short in (a torn tail)
    /// from damage anywhere else.
    fn seal_frames(&self, buf: &mut [u8], frames: &[(usize, u8, u64)], first_seq: u64) {
        assert!(!frames.is_empty(), "bug: sealing an empty batch");
        let last = frames.len() - 1;
        for (i, &(start, kind, term)) in frames.iter().enumerate() {
            let end = frames.get(i + 1).map_or(buf.len(), |f| f.0);
            // Frames tile the batch in order: each starts where the one
            // before it ended, and `seal` checks each one's size.
            assert!(start < end, "bug: frame {i} of a batch is empty");
            FrameHeader::seal(
                &mut buf[start..end],
                self.segment.salt,
                FrameHeader {
                    body_len: 0,
                    seq: first_seq + i as u64,
                    term,
                    kind,
                    flags: if i == last { FRAME_FLAG_BATCH_END } else { 0 },
                    batch_index: u32::try_from(i).expect("bug: 2³² records in one batch"),
                },
            );
        }
    }

    /// Gives the batch a segment to go to: the next one when `batch_bytes`
    /// would grow the active one past `segment_bytes` (a segment holding
    /// only its header takes any batch, so an oversized batch still goes
    /// somewhere), or the active one again when a truncation removed it.
    /// A segment that cannot be created rejects the batch: none of it was
    /// written.
    fn make_room(&mut self, batch_bytes: u64, first_seq: u64) -> Result<(), BatchFailure> {
        let full = self.segment.len > FILE_HEADER_BYTES as u64
            && self.segment.len + batch_bytes > self.options.segment_bytes;
        // After a truncation removed the segment it would append to.
        let missing = self.segment.file.is_none();
        if full || missing {
            let id = if missing {
                self.segment.id
            } else {
                self.segment.id + 1
            };
            let added = self
                .segment
                .create(id, first_seq, false)
                .map_err(|e| BatchFailure::RolledBack(io::Error::other(e.to_string())))?;
            self.shared.disk_bytes.fetch_add(added, Ordering::Relaxed);
            self.shared
                .active_file_bytes
                .store(self.segment.file_len, Ordering::Relaxed);
            self.shared
                .active_segment
                .store(self.segment.id, Ordering::Release);
        }
        Ok(())
    }

    /// Writes the batch at `base`. A failed write is rolled back: truncate
    /// what it appended past the old end of the file, zero what it changed
    /// inside preallocated space, and make that durable, so that no byte of
    /// a write answered 503 can come back after a crash. When the rollback
    /// fails too, the batch is in doubt and the journal is poisoned.
    fn write_or_roll_back(
        &self,
        file: &Arc<dyn StorageFile>,
        buf: &[u8],
        base: u64,
    ) -> Result<(), BatchFailure> {
        let Err(e) = file.write_all_at(buf, base) else {
            return Ok(());
        };
        let end = base + buf.len() as u64;
        let keep_len = self.segment.file_len.max(base);
        let rollback = file
            .set_len(keep_len)
            .and_then(|()| match (end.min(keep_len) - base) as usize {
                0 => Ok(()),
                n => file.write_all_at(&vec![0u8; n], base),
            })
            .and_then(|()| file.sync_data());
        Err(match rollback {
            Ok(()) => BatchFailure::RolledBack(e),
            Err(rollback) => {
                self.shared.poisoned.store(true, Ordering::Release);
                BatchFailure::Unconfirmed(io::Error::new(
                    rollback.kind(),
                    format!("write failed ({e}) and its rollback failed ({rollback})"),
                ))
            }
        })
    }

    /// Makes the written batch durable (unless the spool runs with
    /// `fsync = false`) and says how long that took. A failed fsync is never
    /// retried, as the kernel may have dropped the dirty pages: the batch is
    /// in doubt and the journal is poisoned.
    fn sync(&self, file: &Arc<dyn StorageFile>) -> Result<Duration, BatchFailure> {
        let fsync_started = Instant::now();
        if self.options.fsync
            && let Err(e) = file.sync_data()
        {
            self.shared.poisoned.store(true, Ordering::Release);
            return Err(BatchFailure::Unconfirmed(e));
        }
        Ok(fsync_started.elapsed())
    }

    /// Counts a durable batch in: the segment's length (and its file's, when
    /// the write went past preallocated space, which adds bytes on disk),
    /// the next sequence number, the batch and record counters.
    fn count_in(&mut self, batch_bytes: u64, first_seq: u64, n_records: u64) {
        self.segment.len += batch_bytes;
        if self.segment.len > self.segment.file_len {
            self.shared
                .disk_bytes
                .fetch_add(self.segment.len - self.segment.file_len, Ordering::Relaxed);
            self.segment.file_len = self.segment.len;
            self.shared
                .active_file_bytes
                .store(self.segment.file_len, Ordering::Relaxed);
        }
        self.next_seq = first_seq + n_records;
        self.shared.batches.fetch_add(1, Ordering::Relaxed);
        self.shared.records.fetch_add(n_records, Ordering::Relaxed);
    }

    /// Where each record of the durable batch written at `base` lies, with
    /// its entry and sequence number: what the sink keeps to read it again.
    fn placements(
        &self,
        entries: Vec<E>,
        frames: &[(usize, u8, u64)],
        batch_bytes: usize,
        base: u64,
        first_seq: u64,
    ) -> Vec<Placed<E>> {
        let file_id = FileId::Segment(self.segment.id).to_loc();
        entries
            .into_iter()
            .enumerate()
            .map(|(i, entry)| {
                let start = frames[i].0;
                let end = frames.get(i + 1).map_or(batch_bytes, |f| f.0);
                let offset = base + start as u64;
                assert!(
                    offset + ((end - start) as u64) <= u32::MAX as u64,
                    "bug: segment offset overflows RecordLoc"
                );
                Placed {
                    entry,
                    seq: first_seq + i as u64,
                    loc: RecordLoc {
                        file: file_id,
                        offset: offset as u32,
                        len: (end - start) as u32,
                    },
                }
            })
            .collect()
    }

    /// Cuts the log after `keep_seq`. Never rewrites a byte in place:
    /// later segments are deleted newest first, and the segment the cut
    /// falls in is replaced by a copy of its kept prefix (whose last frame
    /// now ends its batch), so at every crash point the directory holds a
    /// log that has every record up to `keep_seq`.
    pub(super) fn truncate(
        &mut self,
        keep_seq: u64,
        cut: RecordLoc,
        last_kept: Option<RecordLoc>,
    ) -> Result<(), JournalError> {
        let FileId::Segment(cut_id) = FileId::from_loc(cut.file) else {
            panic!("bug: truncating inside a pack");
        };
        let mut removed_bytes = self.remove_segments_after(cut_id)?;
        let (storage, dir) = (self.segment.storage.clone(), self.segment.dir.clone());
        let cut_path = dir.join(segment_file_name(cut_id));
        let old = storage
            .open(&cut_path)
            .map_err(|e| JournalError::io(&cut_path, e))?;
        removed_bytes += old.size_bytes().unwrap_or(0);
        self.segment.reader.unregister(FileId::Segment(cut_id));
        match last_kept.filter(|l| l.file == cut.file) {
            None => {
                // Nothing of this segment is kept: the next batch creates
                // it again, starting at the record after `keep_seq`.
                crate::journal::atomic::remove_files(&storage, &dir, &[segment_file_name(cut_id)])?;
                self.segment.file = None;
                self.segment.len = 0;
                self.segment.file_len = 0;
            }
            Some(last) => {
                self.keep_prefix(&old, &cut_path, (cut_id, cut), last)?;
                removed_bytes -= u64::from(cut.offset).min(removed_bytes);
            }
        }
        self.segment.id = cut_id;
        self.shared.disk_bytes.fetch_sub(
            removed_bytes.min(self.shared.disk_bytes.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
        self.shared.active_segment.store(cut_id, Ordering::Release);
        self.shared
            .active_file_bytes
            .store(self.segment.file_len, Ordering::Relaxed);
        self.next_seq = keep_seq + 1;
        self.shared.durable_seq.send_replace(keep_seq);
        Ok(())
    }

    /// Removes every segment after `cut_id` (newest first, so a crash
    /// leaves a prefix of the log) and syncs the directory. Returns the
    /// bytes they held.
    fn remove_segments_after(&mut self, cut_id: u64) -> Result<u64, JournalError> {
        let storage = self.segment.storage.clone();
        let dir = self.segment.dir.clone();
        let mut removed_bytes = 0;
        for id in (cut_id + 1..=self.segment.id).rev() {
            let path = dir.join(segment_file_name(id));
            removed_bytes += storage
                .open(&path)
                .and_then(|f| f.size_bytes())
                .unwrap_or(0);
            match storage.remove(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(JournalError::io(&path, e)),
            }
            self.segment.reader.unregister(FileId::Segment(id));
        }
        storage
            .sync_dir(&dir)
            .map_err(|e| JournalError::io(&dir, e))?;
        Ok(removed_bytes)
    }

    /// Rewrites segment `cut_id`, which `cut` falls in (`old`, at `cut_path`), as its
    /// bytes before `cut`, atomically, with `last` (the last record kept)
    /// marked as the end of a batch, and makes it the active segment.
    fn keep_prefix(
        &mut self,
        old: &Arc<dyn StorageFile>,
        cut_path: &Path,
        (cut_id, cut): (u64, RecordLoc),
        last: RecordLoc,
    ) -> Result<(), JournalError> {
        let mut prefix = vec![0u8; cut.offset as usize];
        old.read_exact_at(&mut prefix, 0)
            .map_err(|e| JournalError::io(cut_path, e))?;
        let frame = &mut prefix[last.offset as usize..(last.offset + last.len) as usize];
        let mut header = FrameHeader::peek(frame);
        header.flags |= FRAME_FLAG_BATCH_END;
        header.body_len = 0;
        FrameHeader::seal(frame, self.segment.salt, header);
        let storage = &self.segment.storage;
        let file = crate::journal::atomic::write_atomically(
            storage,
            &self.segment.dir,
            &segment_file_name(cut_id),
            |f| f.write_all_at(&prefix, 0),
        )
        .map_err(|e| e.into_inner())?;
        self.segment
            .reader
            .register(FileId::Segment(cut_id), file.clone());
        self.segment.file = Some(file);
        self.segment.len = u64::from(cut.offset);
        self.segment.file_len = u64::from(cut.offset);
        Ok(())
    }

    /// Goes on at `next_seq` in a new segment, created by the next batch.
    /// The segments before it hold only records the installed checkpoint
    /// covers; the engine deletes them.
    pub(super) fn restart(&mut self, next_seq: u64) {
        if self.segment.file.take().is_some() {
            self.segment.id += 1;
        }
        self.segment.len = 0;
        self.segment.file_len = 0;
        self.shared
            .active_segment
            .store(self.segment.id, Ordering::Release);
        self.shared.active_file_bytes.store(0, Ordering::Relaxed);
        self.next_seq = next_seq;
        self.shared.durable_seq.send_replace(next_seq - 1);
    }
}
