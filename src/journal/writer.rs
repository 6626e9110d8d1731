//! Group commit: one thread owns the active segment.
//!
//! Appenders put framed records into a shared pending buffer (under a short
//! mutex) together with an entry of their choosing. The writer thread takes
//! everything pending at once, stamps sequence numbers and checksums, writes
//! it with one `write`, makes it durable with one `fdatasync`, and only then
//! hands the entries to the [`BatchSink`] with a [`Durable`] receipt. The
//! receipt can only be made here, so no code path can tell a caller "done"
//! for a record whose fsync has not returned.
//!
//! The sink runs in journal order, whether or not the caller that appended a
//! record is still waiting: a caller that goes away cannot split "appended"
//! from "applied". While the applier thread is busy with earlier batches,
//! the writer queues batch N for it and already writes and fsyncs batch
//! N+1; when nothing is queued, the writer applies the batch itself, which
//! saves a thread hand-off per write at low load (the sink is then idle, so
//! order holds either way).
//!
//! Failures follow PostgreSQL's rule. A failed write is rolled back
//! (truncated to the last durable offset) and its batch rejected; the journal
//! goes on. A failed fsync is never retried (the kernel may have dropped the
//! dirty pages): the batch is reported unconfirmed, the journal is poisoned
//! and takes no more writes, and replay after a restart decides.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::JournalError;
use super::format::{
    FILE_HEADER_BYTES, FRAME_FLAG_BATCH_END, FRAME_HEADER_BYTES, FileId, FrameHeader, RecordLoc,
    SegmentHeader, segment_file_name,
};
use super::prealloc::Preallocator;
use super::reader::SegmentReader;
use super::storage::{Storage, StorageFile};

/// Proof that a batch is on disk: made only by the writer thread, after the
/// fsync that covers the batch returned (or after the write, when the spool
/// runs with `fsync = false`).
#[derive(Debug)]
pub(crate) struct Durable {
    last_seq: u64,
    fsync_duration: Duration,
}

impl Durable {
    pub(crate) fn fsync_duration(&self) -> Duration {
        self.fsync_duration
    }
}

/// A durable record, with the entry its appender gave.
#[derive(Debug)]
pub(crate) struct Placed<E> {
    pub entry: E,
    pub seq: u64,
    pub loc: RecordLoc,
}

/// Why a batch did not become durable.
#[derive(Debug)]
pub(crate) enum BatchFailure {
    /// The write failed and was rolled back: none of the batch is on disk,
    /// and the journal goes on taking writes.
    RolledBack(io::Error),
    /// The fsync (or the rollback after a failed write) failed: the batch
    /// may or may not be on disk, and the journal is now poisoned.
    Unconfirmed(io::Error),
}

/// Receives every batch's outcome in journal order, on the writer or the
/// applier thread, never on both at once.
pub(crate) trait BatchSink<E>: Send + 'static {
    fn durable(&mut self, receipt: &Durable, batch: Vec<Placed<E>>);
    fn failed(&mut self, failure: &BatchFailure, batch: Vec<E>);
}

/// Settings of the writer.
#[derive(Debug, Clone)]
pub(crate) struct WriterOptions {
    /// Rotate to a new segment once the active one would grow past this.
    pub segment_bytes: u64,
    /// `false` skips fsync: benchmarks and throwaway spools only.
    pub fsync: bool,
    /// Rotate into zero-filled spare segments (see [`super::prealloc`]).
    pub preallocate: bool,
}

/// Where the writer starts: the end of the last valid record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriterStart {
    pub segment_id: u64,
    /// Valid length of that segment; 0 means the segment must be created.
    pub end_offset: u64,
    /// That segment's file length (preallocated zeros included).
    pub file_len: u64,
    pub next_seq: u64,
    /// Bytes of all segments on disk now.
    pub disk_bytes: u64,
}

struct Pending<E> {
    buf: Vec<u8>,
    /// (start offset in `buf`, kind, term) of each record.
    frames: Vec<(usize, u8, u64)>,
    entries: Vec<E>,
    /// A truncation or restart asked for (replicated mode); the writer runs
    /// it once everything appended before it is written.
    control: Option<Control>,
    closed: bool,
    /// The writer sleeps on `wake` until an appender clears this: only the
    /// first append after the writer went idle pays for a wake-up.
    writer_waiting: bool,
}

struct Shared<E> {
    pending: Mutex<Pending<E>>,
    wake: Condvar,
    poisoned: AtomicBool,
    /// Bytes of all segments on disk, for `max_bytes` and metrics.
    disk_bytes: AtomicU64,
    /// The segment the writer appends to; every lower id is sealed.
    active_segment: AtomicU64,
    /// Bytes of the active segment's file (preallocated space included).
    active_file_bytes: AtomicU64,
    /// Durable batches (one write and one fsync each) and their records.
    batches: AtomicU64,
    records: AtomicU64,
    /// Tests hold durable batches back from the sink (see
    /// [`Journal::hold_apply`]).
    hold: Arc<ApplyHold>,
    /// Sequence number of the last durable record (replicated mode waits
    /// on it: apply, the vote, truncation).
    durable_seq: tokio::sync::watch::Sender<u64>,
}

/// Cutting the log after `keep_seq` (replicated mode: a follower's
/// uncommitted suffix that the primary's log replaces).
#[derive(Debug)]
pub(crate) struct Truncate {
    pub keep_seq: u64,
    /// The frame of record `keep_seq + 1`: it and everything after it go.
    pub cut: RecordLoc,
    /// The frame of record `keep_seq`, if the log keeps any record.
    pub last_kept: Option<RecordLoc>,
    pub done: tokio::sync::oneshot::Sender<Result<(), JournalError>>,
}

/// What replicated mode asks of the writer between batches.
#[derive(Debug)]
pub(crate) enum Control {
    Truncate(Truncate),
    /// Go on at sequence number `next_seq` in a new segment (a snapshot
    /// from the primary replaced the whole log). Nothing is written until
    /// the next batch creates that segment.
    Restart {
        next_seq: u64,
        done: tokio::sync::oneshot::Sender<Result<(), JournalError>>,
    },
}

/// Lets a test keep durable batches from being applied, so that it can
/// run compaction (or anything else) while records are durable but not yet
/// in the state: every outcome then goes through the applier thread, which
/// waits while the hold is on.
#[derive(Default)]
struct ApplyHold {
    on: Mutex<bool>,
    changed: Condvar,
    /// Mirrors `on` for the writer's cheap check.
    active: AtomicBool,
}

impl ApplyHold {
    fn set(&self, on: bool) {
        *self.on.lock().expect("hold lock poisoned") = on;
        self.active.store(on, Ordering::Release);
        self.changed.notify_all();
    }

    fn wait_released(&self) {
        let mut on = self.on.lock().expect("hold lock poisoned");
        while *on {
            on = self.changed.wait(on).expect("hold lock poisoned");
        }
    }
}

/// Counters of the writer, for metrics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    pub batches: u64,
    pub records: u64,
    pub disk_bytes: u64,
}

/// The handle appenders use. Dropping it flushes what is pending and stops
/// the writer thread.
pub(crate) struct Journal<E: Send + 'static> {
    shared: Arc<Shared<E>>,
    /// The writer thread, then the applier thread.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// Batches that are done, on their way from the writer to the applier.
enum Outcome<E> {
    Durable(Durable, Vec<Placed<E>>),
    Failed(BatchFailure, Vec<E>),
}

/// Outcomes in flight between writer and applier: the writer runs at most
/// this many batches ahead of the state machine.
const APPLY_QUEUE_BATCHES_MAX: usize = 4;

/// The writer's sink: applies each outcome itself when the applier has
/// nothing queued, else queues it for the applier thread.
struct ToApplier<E, S> {
    tx: std::sync::mpsc::SyncSender<Outcome<E>>,
    /// The real sink, used by one thread at a time: the writer only while
    /// nothing is queued, the applier only for what is queued.
    sink: Arc<Mutex<S>>,
    /// Outcomes sent to the applier and not yet applied.
    queued: Arc<AtomicUsize>,
    hold: Arc<ApplyHold>,
}

impl<E: Send + 'static, S: BatchSink<E>> ToApplier<E, S> {
    fn deliver(&mut self, outcome: Outcome<E>) {
        // Acquire pairs with the applier's Release after applying: at 0,
        // every queued outcome has been applied, so applying here keeps
        // journal order.
        if self.queued.load(Ordering::Acquire) == 0 && !self.hold.active.load(Ordering::Acquire) {
            apply(&self.sink, outcome);
            return;
        }
        self.queued.fetch_add(1, Ordering::AcqRel);
        // The applier only stops after the writer; a send cannot fail
        // unless the applier panicked, which the join reports.
        let _ = self.tx.send(outcome);
    }
}

fn apply<E, S: BatchSink<E>>(sink: &Mutex<S>, outcome: Outcome<E>) {
    // A panic while applying is a bug that takes the process down (the
    // binary aborts on panic); nothing may apply on top of half a batch.
    let mut sink = sink.lock().expect("bug: a sink panicked mid-batch");
    match outcome {
        Outcome::Durable(receipt, batch) => sink.durable(&receipt, batch),
        Outcome::Failed(failure, batch) => sink.failed(&failure, batch),
    }
}

impl<E: Send + 'static, S: BatchSink<E>> BatchSink<E> for ToApplier<E, S> {
    fn durable(&mut self, receipt: &Durable, batch: Vec<Placed<E>>) {
        let receipt = Durable {
            last_seq: receipt.last_seq,
            fsync_duration: receipt.fsync_duration,
        };
        self.deliver(Outcome::Durable(receipt, batch));
    }

    fn failed(&mut self, failure: &BatchFailure, batch: Vec<E>) {
        let failure = match failure {
            BatchFailure::RolledBack(e) => {
                BatchFailure::RolledBack(io::Error::new(e.kind(), e.to_string()))
            }
            BatchFailure::Unconfirmed(e) => {
                BatchFailure::Unconfirmed(io::Error::new(e.kind(), e.to_string()))
            }
        };
        self.deliver(Outcome::Failed(failure, batch));
    }
}

impl<E: Send + 'static> Journal<E> {
    /// Starts the writer thread at `start`.
    pub(crate) fn start(
        storage: Arc<dyn Storage>,
        dir: &Path,
        salt: u64,
        start: WriterStart,
        options: WriterOptions,
        reader: SegmentReader,
        sink: impl BatchSink<E>,
    ) -> Result<Journal<E>, JournalError> {
        let prealloc = options
            .preallocate
            .then(|| Preallocator::start(storage.clone(), dir, options.segment_bytes));
        let mut segment = ActiveSegment {
            storage,
            dir: dir.to_path_buf(),
            salt,
            id: start.segment_id,
            file: None,
            len: start.end_offset,
            file_len: start.file_len,
            reader,
            prealloc,
        };
        let mut disk_bytes = start.disk_bytes;
        if start.end_offset == 0 {
            disk_bytes += segment.create(start.segment_id, start.next_seq, true)?;
        } else {
            segment.open_existing()?;
        }
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending {
                buf: Vec::new(),
                frames: Vec::new(),
                entries: Vec::new(),
                control: None,
                closed: false,
                writer_waiting: false,
            }),
            wake: Condvar::new(),
            poisoned: AtomicBool::new(false),
            disk_bytes: AtomicU64::new(disk_bytes),
            active_segment: AtomicU64::new(segment.id),
            active_file_bytes: AtomicU64::new(segment.file_len),
            batches: AtomicU64::new(0),
            records: AtomicU64::new(0),
            hold: Arc::default(),
            durable_seq: tokio::sync::watch::Sender::new(start.next_seq.saturating_sub(1)),
        });
        let (tx, rx) = std::sync::mpsc::sync_channel(APPLY_QUEUE_BATCHES_MAX);
        let sink = Arc::new(Mutex::new(sink));
        let queued = Arc::new(AtomicUsize::new(0));
        let writer = Writer {
            shared: shared.clone(),
            segment,
            options,
            next_seq: start.next_seq,
            sink: ToApplier {
                tx,
                sink: sink.clone(),
                queued: queued.clone(),
                hold: shared.hold.clone(),
            },
        };
        let hold = shared.hold.clone();
        let applier = std::thread::Builder::new()
            .name("journal-applier".into())
            .spawn(move || {
                for outcome in rx {
                    hold.wait_released();
                    apply(&sink, outcome);
                    queued.fetch_sub(1, Ordering::Release);
                }
            })
            .map_err(|e| JournalError::io(dir, e))?;
        let writer = std::thread::Builder::new()
            .name("journal-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| JournalError::io(dir, e))?;
        Ok(Journal {
            shared,
            threads: Mutex::new(vec![writer, applier]),
        })
    }

    /// Appends one record: `encode` writes its body (it may read the entry,
    /// so that a record need not be built twice). The outcome reaches the
    /// sink with `entry`; nothing is durable when this returns.
    pub(crate) fn append(
        &self,
        kind: u8,
        entry: E,
        encode: impl FnMut(&E, &mut Vec<u8>),
    ) -> Result<(), JournalError> {
        self.append_many(std::iter::once((kind, entry)), encode)
    }

    /// Appends several records so that they reach the disk in one write
    /// and are covered by one fsync: all of them, or (after a failure) none.
    pub(crate) fn append_many(
        &self,
        records: impl IntoIterator<Item = (u8, E)>,
        encode: impl FnMut(&E, &mut Vec<u8>),
    ) -> Result<(), JournalError> {
        self.append_terms(
            records.into_iter().map(|(kind, entry)| (kind, 0, entry)),
            encode,
        )
    }

    /// Appends records with the Raft term each was proposed in
    /// (replicated mode); otherwise as [`Journal::append_many`].
    pub(crate) fn append_terms(
        &self,
        records: impl IntoIterator<Item = (u8, u64, E)>,
        mut encode: impl FnMut(&E, &mut Vec<u8>),
    ) -> Result<(), JournalError> {
        if self.shared.poisoned.load(Ordering::Acquire) {
            return Err(JournalError::Poisoned);
        }
        let mut pending = self.shared.pending.lock().expect("journal lock poisoned");
        if pending.closed {
            return Err(JournalError::Closed);
        }
        let Pending {
            buf,
            frames,
            entries,
            ..
        } = &mut *pending;
        for (kind, term, entry) in records {
            let start = buf.len();
            buf.resize(start + FRAME_HEADER_BYTES, 0);
            entries.push(entry);
            encode(entries.last().expect("just pushed"), buf);
            frames.push((start, kind, term));
        }
        let wake = std::mem::take(&mut pending.writer_waiting);
        drop(pending);
        if wake {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Sequence number of the last durable record, as a watch: replicated
    /// mode waits on it before it applies, votes or truncates.
    pub(crate) fn durable_seq(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.durable_seq.subscribe()
    }

    /// A receipt for every record up to `seq`, if they are all durable
    /// (replicated mode answers a proposal with it once Raft applied it).
    pub(crate) fn durable_receipt(&self, seq: u64) -> Option<Durable> {
        (*self.shared.durable_seq.borrow() >= seq).then_some(Durable {
            last_seq: seq,
            fsync_duration: Duration::ZERO,
        })
    }

    /// Runs `c` between batches (replicated mode): cuts the log after a
    /// record, or restarts it at a later sequence number. The caller has
    /// waited until everything it appended is durable; the writer answers
    /// on the control's `done`.
    pub(crate) fn control(&self, c: Control) -> Result<(), JournalError> {
        let mut pending = self.shared.pending.lock().expect("journal lock poisoned");
        if pending.closed {
            return Err(JournalError::Closed);
        }
        pending.control = Some(c);
        let wake = std::mem::take(&mut pending.writer_waiting);
        drop(pending);
        if wake {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Test hook: while on, durable batches wait before being applied (the
    /// writer goes on writing up to a few batches ahead). See
    /// [`ApplyHold`].
    pub(crate) fn hold_apply(&self, on: bool) {
        self.shared.hold.set(on);
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.shared.poisoned.load(Ordering::Acquire)
    }

    /// Stops taking writes, as after a failed fsync: the engine calls it
    /// when memory and disk could disagree (a compaction that failed after
    /// its point of no return).
    pub(crate) fn poison(&self) {
        self.shared.poisoned.store(true, Ordering::Release);
    }

    /// True once [`Journal::close`] was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.shared
            .pending
            .lock()
            .expect("journal lock poisoned")
            .closed
    }

    /// Bytes of all segment files, as the writer last knew it.
    pub(crate) fn disk_bytes(&self) -> u64 {
        self.shared.disk_bytes.load(Ordering::Relaxed)
    }

    /// The segment being appended to: every lower id is sealed.
    pub(crate) fn active_segment(&self) -> u64 {
        self.shared.active_segment.load(Ordering::Acquire)
    }

    /// Bytes of the active segment's file, preallocated space included.
    pub(crate) fn active_file_bytes(&self) -> u64 {
        self.shared.active_file_bytes.load(Ordering::Relaxed)
    }

    /// Compaction changed the bytes on disk by `delta`.
    pub(crate) fn adjust_disk_bytes(&self, delta: i64) {
        if delta >= 0 {
            self.shared
                .disk_bytes
                .fetch_add(delta as u64, Ordering::Relaxed);
        } else {
            self.shared
                .disk_bytes
                .fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
        }
    }

    pub(crate) fn stats(&self) -> WriterStats {
        WriterStats {
            batches: self.shared.batches.load(Ordering::Relaxed),
            records: self.shared.records.load(Ordering::Relaxed),
            disk_bytes: self.disk_bytes(),
        }
    }

    /// Writes what is pending and stops the writer thread.
    pub(crate) fn close(&self) {
        {
            let mut pending = self.shared.pending.lock().expect("journal lock poisoned");
            pending.closed = true;
        }
        self.shared.wake.notify_one();
        let threads = std::mem::take(&mut *self.threads.lock().expect("journal lock poisoned"));
        for thread in threads {
            if thread.join().is_err() {
                tracing::error!("a journal thread panicked");
            }
        }
    }
}

impl<E: Send + 'static> Drop for Journal<E> {
    fn drop(&mut self) {
        self.close();
    }
}

struct ActiveSegment {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    salt: u64,
    id: u64,
    file: Option<Arc<dyn StorageFile>>,
    /// Where the next record goes.
    len: u64,
    /// The file's length: beyond `len` when preallocated.
    file_len: u64,
    reader: SegmentReader,
    prealloc: Option<Preallocator>,
}

impl ActiveSegment {
    fn path(&self, id: u64) -> PathBuf {
        self.dir.join(segment_file_name(id))
    }

    fn open_existing(&mut self) -> Result<(), JournalError> {
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
    fn create(
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

    fn file(&self) -> &Arc<dyn StorageFile> {
        self.file.as_ref().expect("bug: active segment has no file")
    }
}

struct Writer<E, S> {
    shared: Arc<Shared<E>>,
    segment: ActiveSegment,
    options: WriterOptions,
    next_seq: u64,
    sink: S,
}

impl<E: Send + 'static, S: BatchSink<E>> Writer<E, S> {
    fn run(mut self) {
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

    fn commit(&mut self, buf: &mut [u8], frames: &[(usize, u8, u64)], entries: Vec<E>) {
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
    fn truncate(
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
    fn restart(&mut self, next_seq: u64) {
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
