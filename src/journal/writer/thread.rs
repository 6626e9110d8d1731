//! The writer thread: takes everything pending at once, writes it with one
//! `write`, makes it durable with one `fdatasync`, and only then hands it on
//! with a [`Durable`] receipt.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::segment::ActiveSegment;
use super::{BatchFailure, BatchSink, Control, Durable, Placed, Shared, WriterOptions};
use crate::journal::error::JournalError;
use crate::journal::format::{
    FILE_HEADER_BYTES, FRAME_FLAG_BATCH_END, FileId, FrameHeader, RecordLoc, segment_file_name,
};

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

    pub(super) fn commit(&mut self, buf: &mut [u8], frames: &[(usize, u8, u64)], entries: Vec<E>) {
        if self.shared.poisoned.load(Ordering::Acquire) {
            // Appended after the fsync failure: never written, so rejected
            // rather than in doubt.
            let failure = BatchFailure::RolledBack(io::Error::other("journal is poisoned"));
            self.sink.failed(&failure, entries);
            return;
        }
        let first_seq = self.next_seq;
        let last = frames.len() - 1;
        for (i, &(start, kind, term)) in frames.iter().enumerate() {
            let end = frames.get(i + 1).map_or(buf.len(), |f| f.0);
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

        let full = self.segment.len > FILE_HEADER_BYTES as u64
            && self.segment.len + buf.len() as u64 > self.options.segment_bytes;
        // After a truncation removed the segment it would append to.
        let missing = self.segment.file.is_none();
        if full || missing {
            let id = if missing {
                self.segment.id
            } else {
                self.segment.id + 1
            };
            match self.segment.create(id, first_seq, false) {
                Ok(added) => {
                    self.shared.disk_bytes.fetch_add(added, Ordering::Relaxed);
                    self.shared
                        .active_file_bytes
                        .store(self.segment.file_len, Ordering::Relaxed);
                    self.shared
                        .active_segment
                        .store(self.segment.id, Ordering::Release);
                }
                Err(e) => {
                    let failure = BatchFailure::RolledBack(io::Error::other(e.to_string()));
                    self.sink.failed(&failure, entries);
                    return;
                }
            }
        }

        let base = self.segment.len;
        let file = self.segment.file().clone();
        if let Err(e) = file.write_all_at(buf, base) {
            // Roll back: truncate what the write appended past the old end
            // of the file, zero what it changed inside preallocated space,
            // and make that durable, so that no byte of a write answered 503
            // can come back after a crash.
            let end = base + buf.len() as u64;
            let keep_len = self.segment.file_len.max(base);
            let rollback = file
                .set_len(keep_len)
                .and_then(|()| match (end.min(keep_len) - base) as usize {
                    0 => Ok(()),
                    n => file.write_all_at(&vec![0u8; n], base),
                })
                .and_then(|()| file.sync_data());
            let failure = match rollback {
                Ok(()) => BatchFailure::RolledBack(e),
                Err(rollback) => {
                    self.shared.poisoned.store(true, Ordering::Release);
                    BatchFailure::Unconfirmed(io::Error::new(
                        rollback.kind(),
                        format!("write failed ({e}) and its rollback failed ({rollback})"),
                    ))
                }
            };
            self.sink.failed(&failure, entries);
            return;
        }
        let fsync_started = Instant::now();
        if self.options.fsync
            && let Err(e) = file.sync_data()
        {
            self.shared.poisoned.store(true, Ordering::Release);
            self.sink.failed(&BatchFailure::Unconfirmed(e), entries);
            return;
        }
        let fsync_duration = fsync_started.elapsed();
        self.segment.len += buf.len() as u64;
        if self.segment.len > self.segment.file_len {
            self.shared
                .disk_bytes
                .fetch_add(self.segment.len - self.segment.file_len, Ordering::Relaxed);
            self.segment.file_len = self.segment.len;
            self.shared
                .active_file_bytes
                .store(self.segment.file_len, Ordering::Relaxed);
        }
        self.next_seq = first_seq + frames.len() as u64;
        self.shared.batches.fetch_add(1, Ordering::Relaxed);
        self.shared
            .records
            .fetch_add(frames.len() as u64, Ordering::Relaxed);

        let file_id = FileId::Segment(self.segment.id).to_loc();
        let placed = entries
            .into_iter()
            .enumerate()
            .map(|(i, entry)| {
                let start = frames[i].0;
                let end = frames.get(i + 1).map_or(buf.len(), |f| f.0);
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
            .collect();
        let receipt = Durable {
            last_seq: self.next_seq - 1,
            fsync_duration,
        };
        self.sink.durable(&receipt, placed);
        self.shared.durable_seq.send_replace(self.next_seq - 1);
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
                let mut prefix = vec![0u8; cut.offset as usize];
                old.read_exact_at(&mut prefix, 0)
                    .map_err(|e| JournalError::io(&cut_path, e))?;
                let frame = &mut prefix[last.offset as usize..(last.offset + last.len) as usize];
                let mut header = FrameHeader::peek(frame);
                header.flags |= FRAME_FLAG_BATCH_END;
                header.body_len = 0;
                FrameHeader::seal(frame, self.segment.salt, header);
                let file = crate::journal::atomic::write_atomically(
                    &storage,
                    &dir,
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
