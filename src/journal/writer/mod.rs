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
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::error::JournalError;
use super::format::{FRAME_HEADER_BYTES, RecordLoc, check_record_body};
use super::prealloc::Preallocator;
use super::reader::SegmentReader;
use super::storage::Storage;

mod applier;
mod segment;
mod thread;

#[cfg(any(test, feature = "testing"))]
use applier::ApplyHold;
use applier::{APPLY_QUEUE_BATCHES_MAX, ToApplier, apply};
use segment::ActiveSegment;
use thread::Writer;

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
    #[cfg(any(test, feature = "testing"))]
    hold: Arc<ApplyHold>,
    /// Sequence number of the last durable record (replicated mode waits
    /// on it: apply, the vote, truncation).
    durable_seq: tokio::sync::watch::Sender<u64>,
}

impl<E> Shared<E> {
    /// The state of a journal whose writer starts at `next_seq` in
    /// `segment`, with `disk_bytes` on disk in all.
    fn new(disk_bytes: u64, segment: &ActiveSegment, next_seq: u64) -> Self {
        Shared {
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
            #[cfg(any(test, feature = "testing"))]
            hold: Arc::default(),
            durable_seq: tokio::sync::watch::Sender::new(next_seq.saturating_sub(1)),
        }
    }
}

/// Starts the applier thread: it applies, in order, the outcomes the
/// writer queued through `to` because the state machine was still busy
/// with earlier ones.
fn spawn_applier<E: Send + 'static, S: BatchSink<E>>(
    dir: &Path,
    rx: std::sync::mpsc::Receiver<Outcome<E>>,
    to: &ToApplier<E, S>,
) -> Result<JoinHandle<()>, JournalError> {
    let (sink, queued) = (to.sink.clone(), to.queued.clone());
    #[cfg(any(test, feature = "testing"))]
    let hold = to.hold.clone();
    std::thread::Builder::new()
        .name("journal-applier".into())
        .spawn(move || {
            for outcome in rx {
                #[cfg(any(test, feature = "testing"))]
                hold.wait_released();
                apply(&sink, outcome);
                queued.fetch_sub(1, Ordering::Release);
            }
        })
        .map_err(|e| JournalError::io(dir, e))
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
        let shared = Arc::new(Shared::new(disk_bytes, &segment, start.next_seq));
        let (tx, rx) = std::sync::mpsc::sync_channel(APPLY_QUEUE_BATCHES_MAX);
        let writer = Writer {
            shared: shared.clone(),
            segment,
            options,
            next_seq: start.next_seq,
            sink: ToApplier {
                tx,
                sink: Arc::new(Mutex::new(sink)),
                queued: Arc::default(),
                #[cfg(any(test, feature = "testing"))]
                hold: shared.hold.clone(),
            },
        };
        let applier = spawn_applier(dir, rx, &writer.sink)?;
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
        // Where this call's records begin: a record over the bound takes
        // every one of them back out, so the call is all or nothing.
        let marks = (buf.len(), frames.len(), entries.len());
        for (kind, term, entry) in records {
            let start = buf.len();
            buf.resize(start + FRAME_HEADER_BYTES, 0);
            entries.push(entry);
            encode(entries.last().expect("just pushed"), buf);
            if let Err(e) = check_record_body(buf.len() - start - FRAME_HEADER_BYTES) {
                buf.truncate(marks.0);
                frames.truncate(marks.1);
                entries.truncate(marks.2);
                return Err(e.into());
            }
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
    /// [`ApplyHold`]. Only with the `testing` feature (and in unit tests).
    #[cfg(any(test, feature = "testing"))]
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
