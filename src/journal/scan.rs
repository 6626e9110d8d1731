//! Reading a journal directory back: the newest checkpoint
//! ([`read_checkpoint`]), then every record in order ([`scan_dir`]), and
//! every place where the bytes are not what spoold wrote.
//!
//! A directory holds three kinds of files (`docs/journal-format.md`):
//!
//! - the newest checkpoint `<S>.ckpt`: the state as of record `S`;
//! - log segments `<id>.seg`: records in sequence order. Those whose records
//!   all have sequence numbers ≤ `S` are only *payload stores* now (the
//!   checkpoint may point at enqueue and attempt records in them); the
//!   *live log* starts at the segment that holds record `S + 1`;
//! - packs `<id>.pack`: payload records that compaction copied out of older
//!   files.
//!
//! Scanning never changes a file. It classifies damage the way the recovery
//! table says:
//!
//! - damage in the last segment confined to its last group-commit batch is a
//!   [`TornTail`]: that batch was being written when the process died, after
//!   the last fsync that returned, so nothing in it was acknowledged (the
//!   frame header's batch fields say where each batch began and ended);
//! - anything else — damage in a sealed file, a batch after the damaged one,
//!   a damaged header or checkpoint, a missing segment of the live log,
//!   records missing between segments — is a [`Problem`]: corruption, which
//!   replay refuses and `verify` reports.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::JournalError;
use super::format::{
    CheckpointHeader, FILE_HEADER_BYTES, FileId, HeaderProblem, PackHeader, SegmentHeader,
    checkpoint_file_name, pack_file_name, parse_checkpoint_file_name, parse_pack_file_name,
    parse_segment_file_name, segment_file_name,
};
use super::frames::{Piece, damage_reason, walk};
use super::storage::Storage;

/// One valid record of a log segment or pack, borrowed from the scan buffer.
#[derive(Debug, Clone, Copy)]
pub struct ScannedRecord<'a> {
    pub file: FileId,
    /// Offset of the frame (not the body) in its file.
    pub offset: u64,
    pub seq: u64,
    /// The Raft term it was appended in (0 outside replicated mode).
    pub term: u64,
    pub kind: u8,
    pub body: &'a [u8],
    /// Part of the live log after the checkpoint: replay applies it. Every
    /// other record (≤ the checkpoint's sequence number) is only a payload
    /// the checkpoint may point at.
    pub applies: bool,
    pub frame_len: u64,
}

/// Corruption: something replay must not paper over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// Bytes `[start, end)` of a file hold no valid record.
    BadSpan {
        file: FileId,
        start: u64,
        end: u64,
        reason: String,
    },
    /// A file header is damaged; the file cannot be read.
    BadHeader { path: PathBuf, reason: String },
    /// The newest checkpoint is damaged or incomplete.
    BadCheckpoint { path: PathBuf, reason: String },
    /// Segment ids of the live log jump: the ones in between are gone.
    MissingSegments { first: u64, last: u64 },
    /// Records of the live log are gone (before `segment`, or before the
    /// first segment when it starts after the checkpoint).
    SequenceGap {
        segment_id: u64,
        expected_seq: u64,
        found_seq: u64,
    },
}

impl Problem {
    /// The file and offset to name in an error message.
    pub fn location(&self, dir: &Path) -> (PathBuf, u64) {
        match self {
            Problem::BadSpan { file, start, .. } => (dir.join(file.file_name()), *start),
            Problem::BadHeader { path, .. } | Problem::BadCheckpoint { path, .. } => {
                (path.clone(), 0)
            }
            Problem::MissingSegments { first, .. } => (dir.join(segment_file_name(*first)), 0),
            Problem::SequenceGap { segment_id, .. } => (
                dir.join(segment_file_name(*segment_id)),
                FILE_HEADER_BYTES as u64,
            ),
        }
    }

    pub fn reason(&self) -> String {
        match self {
            Problem::BadSpan {
                start, end, reason, ..
            } => format!("{} bad bytes [{start}, {end}): {reason}", end - start),
            Problem::BadHeader { reason, .. } => format!("bad file header: {reason}"),
            Problem::BadCheckpoint { reason, .. } => format!("bad checkpoint: {reason}"),
            Problem::MissingSegments { first, last } => format!(
                "segment files {} to {} are missing",
                segment_file_name(*first),
                segment_file_name(*last)
            ),
            Problem::SequenceGap {
                expected_seq,
                found_seq,
                ..
            } => format!(
                "records {expected_seq} to {} are missing before this segment",
                found_seq - 1
            ),
        }
    }

    pub fn into_error(self, dir: &Path) -> JournalError {
        let (file, offset) = self.location(dir);
        JournalError::Corrupt {
            dir: dir.to_path_buf(),
            file,
            offset,
            reason: self.reason(),
        }
    }
}

/// Damage at the end of the last segment, confined to its last batch: a
/// write that was cut short. Never acknowledged, safe to clear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TornTail {
    pub segment_id: u64,
    pub offset: u64,
    pub len_bytes: u64,
}

/// A log segment as found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentInfo {
    pub id: u64,
    pub first_seq: u64,
    /// The file's length, preallocated space included.
    pub file_bytes: u64,
    /// Every record in it is ≤ the checkpoint's sequence number.
    pub payload_only: bool,
}

/// The newest checkpoint, as found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CheckpointInfo {
    pub seq: u64,
    pub term: u64,
    pub file_bytes: u64,
}

/// What a scan found, besides what it handed to the visitor.
#[derive(Debug, Clone, Default)]
pub struct ScanSummary {
    /// The checkpoint sequence number the scan was told (0: none).
    pub checkpoint_seq: u64,
    /// Log segments with a valid header, ascending.
    pub segments: Vec<SegmentInfo>,
    /// Packs with a valid header and their file lengths, ascending.
    pub packs: Vec<(u64, u64)>,
    /// Segments in format 1: the spool needs upgrading (no checkpoint), or
    /// they are what an upgrade that was cut short left behind.
    pub old_format_segments: Vec<u64>,
    pub records: u64,
    pub record_bytes: u64,
    /// Bytes of all files read (preallocated space included).
    pub file_bytes: u64,
    /// Sequence number of the last valid record of the log, or the
    /// checkpoint's when no record follows it (0 for an empty journal).
    pub last_seq: u64,
    /// The valid end of the last segment (where the next write goes).
    pub last_segment_end: u64,
    /// The last segment's file length (beyond the valid end: a torn write
    /// and/or preallocated zeros).
    pub last_segment_len: u64,
    /// The sequence number the last segment's next record would carry
    /// (its first one's if it holds none). Below `last_seq + 1` only in
    /// replicated mode, after a snapshot from the primary put the
    /// checkpoint ahead of the log.
    pub last_segment_next_seq: u64,
    pub torn_tail: Option<TornTail>,
    /// The last segment (this id) has an incomplete header: it was being
    /// created when the process died and holds nothing.
    pub torn_last_header: Option<u64>,
    pub problems: Vec<Problem>,
}

/// The journal files in a directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Listing {
    pub segments: Vec<u64>,
    pub packs: Vec<u64>,
    pub checkpoints: Vec<u64>,
}

impl Listing {
    pub(crate) fn is_empty(&self) -> bool {
        self.segments.is_empty() && self.packs.is_empty() && self.checkpoints.is_empty()
    }
}

/// Lists the journal files in `dir`, each kind ascending.
pub(crate) fn list_files(storage: &dyn Storage, dir: &Path) -> Result<Listing, JournalError> {
    let names = storage.list(dir).map_err(|e| JournalError::io(dir, e))?;
    let mut listing = Listing::default();
    for name in &names {
        if let Some(id) = parse_segment_file_name(name) {
            listing.segments.push(id);
        } else if let Some(id) = parse_pack_file_name(name) {
            listing.packs.push(id);
        } else if let Some(seq) = parse_checkpoint_file_name(name) {
            listing.checkpoints.push(seq);
        }
    }
    listing.segments.sort_unstable();
    listing.packs.sort_unstable();
    listing.checkpoints.sort_unstable();
    Ok(listing)
}

/// The first bytes of segment `id` (its header, or what there is of it) and
/// the file's length.
pub(crate) fn read_header(
    storage: &dyn Storage,
    dir: &Path,
    id: u64,
) -> Result<(Vec<u8>, u64), JournalError> {
    let path = dir.join(segment_file_name(id));
    let file = storage
        .open(&path)
        .map_err(|e| JournalError::io(&path, e))?;
    let len = file.size_bytes().map_err(|e| JournalError::io(&path, e))?;
    let mut header = vec![0u8; FILE_HEADER_BYTES];
    let got = file
        .read_at(&mut header, 0)
        .map_err(|e| JournalError::io(&path, e))?;
    header.truncate(got);
    Ok((header, len))
}

/// Files that the checkpoint at `checkpoint_seq` made obsolete: older
/// checkpoints, packs it does not point into, log segments whose records
/// it covers and does not point into, and format-1 segments an upgrade
/// replaced. Reads only headers; changes nothing.
pub(crate) fn obsolete_files(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    listing: &Listing,
    checkpoint_seq: u64,
    referenced: &dyn Fn(FileId) -> bool,
) -> Result<Vec<String>, JournalError> {
    let mut out = Vec::new();
    // Without a checkpoint nothing points into a pack: any pack is one
    // whose compaction never wrote its checkpoint.
    out.extend(
        listing
            .packs
            .iter()
            .filter(|&&id| !referenced(FileId::Pack(id)))
            .map(|&id| pack_file_name(id)),
    );
    let Some((_, stale)) = listing.checkpoints.split_last() else {
        return Ok(out);
    };
    out.extend(stale.iter().map(|&seq| checkpoint_file_name(seq)));
    let mut headers = Vec::new();
    for &id in &listing.segments {
        let (buf, _) = read_header(storage.as_ref(), dir, id)?;
        match SegmentHeader::decode(&buf, salt, id) {
            Ok(h) => headers.push(h),
            Err(HeaderProblem::OldVersion(_)) => out.push(segment_file_name(id)),
            // Damage is the scan's to report.
            Err(_) => {}
        }
    }
    if let Some(live_start) = headers
        .iter()
        .rposition(|h| h.first_seq <= checkpoint_seq + 1)
    {
        out.extend(
            headers[..live_start]
                .iter()
                .filter(|h| !referenced(FileId::Segment(h.segment_id)))
                .map(|h| segment_file_name(h.segment_id)),
        );
    }
    Ok(out)
}

/// Scans every pack and log segment of `dir`, handing each valid record to
/// `visit`; records after `checkpoint_seq` (the newest checkpoint's, 0 for
/// none) are flagged to be applied. A visitor error stops the scan and is
/// returned as is.
pub fn scan_dir(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    checkpoint_seq: u64,
    mut visit: impl FnMut(ScannedRecord<'_>) -> Result<(), JournalError>,
) -> Result<ScanSummary, JournalError> {
    // A helper thread reads and checks file N+1 (the copy out of the page
    // cache and the checksums are half the work) while this one hands file
    // N's records to `visit`. At most two buffers exist: the one being
    // visited and the one being filled; buffers go back for reuse.
    let (files_tx, files_rx) = std::sync::mpsc::sync_channel::<CheckedFile>(0);
    let (spare_tx, spare_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::scope(|scope| {
        let reader = std::thread::Builder::new()
            .name("journal-scan".into())
            .spawn_scoped(scope, || {
                check_files(storage, dir, salt, checkpoint_seq, files_tx, spare_rx)
            })
            .map_err(|e| JournalError::io(dir, e))?;
        let visited = files_rx.iter().try_for_each(|file| {
            for (i, frame) in file.frames.iter().enumerate() {
                if let Some(ahead) = file.frames.get(i + PREFETCH_FRAMES_AHEAD) {
                    prefetch(&file.buf[ahead.offset..ahead.end]);
                }
                let body = &file.buf[frame.offset + super::format::FRAME_HEADER_BYTES..frame.end];
                visit(ScannedRecord {
                    file: file.id,
                    offset: frame.offset as u64,
                    seq: frame.seq,
                    term: frame.term,
                    kind: frame.kind,
                    body,
                    applies: frame.applies,
                    frame_len: (frame.end - frame.offset) as u64,
                })?;
            }
            let _ = spare_tx.send(file.buf);
            Ok(())
        });
        // On a visitor's error the reader finds the channel closed and stops.
        drop(files_rx);
        let checked = reader.join().expect("journal-scan thread panicked");
        visited.and(checked)
    })
}

/// The buffer was filled on another core and is larger than the caches:
/// without a hint, the first read of each record waits for memory.
const PREFETCH_FRAMES_AHEAD: usize = 4;

/// Asks the CPU to load the first two cache lines of `frame` (its header and
/// the start of its body, where the fields a visitor decodes are).
#[inline]
#[allow(unsafe_code)]
fn prefetch(frame: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in frame.chunks(64).take(2) {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY:
        // - a prefetch is only a hint: it never faults, reads nothing into
        //   the program and writes nothing;
        // - the pointer is inside `frame` all the same.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = frame;
}

/// A file read and checked, with its valid frames in order.
struct CheckedFile {
    id: FileId,
    buf: Vec<u8>,
    frames: Vec<CheckedFrame>,
}

/// An intact frame where it does not belong: a bad span of its own.
fn misplaced(file: FileId, f: &super::frames::Frame<'_>, reason: String) -> Problem {
    Problem::BadSpan {
        file,
        start: f.offset as u64,
        end: f.end() as u64,
        reason,
    }
}

/// Passes a checked file to the applying side; false when that side has
/// stopped (it found a problem of its own).
fn hand_over(
    out: &std::sync::mpsc::SyncSender<CheckedFile>,
    id: FileId,
    buf: Vec<u8>,
    frames: Vec<CheckedFrame>,
) -> bool {
    out.send(CheckedFile { id, buf, frames }).is_ok()
}

struct CheckedFrame {
    offset: usize,
    end: usize,
    seq: u64,
    term: u64,
    kind: u8,
    applies: bool,
}

/// The reading half of [`scan_dir`]: everything but the visiting.
fn check_files(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    checkpoint_seq: u64,
    out: std::sync::mpsc::SyncSender<CheckedFile>,
    spare: std::sync::mpsc::Receiver<Vec<u8>>,
) -> Result<ScanSummary, JournalError> {
    let listing = list_files(storage.as_ref(), dir)?;
    let mut summary = ScanSummary {
        checkpoint_seq,
        ..ScanSummary::default()
    };
    let read = |path: &Path, buf: &mut Vec<u8>| read_whole(storage.as_ref(), path, buf);

    // Segment headers, to know where the live log starts.
    let mut headers: Vec<(u64, SegmentHeader)> = Vec::new();
    let last_id = listing.segments.last().copied();
    for &id in &listing.segments {
        let path = dir.join(segment_file_name(id));
        let (header, len) = read_header(storage.as_ref(), dir, id)?;
        match SegmentHeader::decode(&header, salt, id) {
            Ok(h) => headers.push((id, h)),
            Err(HeaderProblem::OldVersion(_)) => summary.old_format_segments.push(id),
            Err(_) if Some(id) == last_id && len <= FILE_HEADER_BYTES as u64 => {
                // A rotation cut short: nothing in it was acknowledged.
                summary.torn_last_header = Some(id);
                summary.file_bytes += len;
                summary.last_segment_len = len;
            }
            Err(problem) => summary.problems.push(Problem::BadHeader {
                path,
                reason: problem.to_string(),
            }),
        }
    }
    if !summary.old_format_segments.is_empty() && checkpoint_seq == 0 {
        // Format 1: nothing more to check here; the upgrade reads it.
        return Ok(summary);
    }
    // The live log starts at the last segment whose first record is at or
    // before the one after the checkpoint; every segment before it holds
    // only records the checkpoint covers.
    let live_start = headers
        .iter()
        .rposition(|(_, h)| h.first_seq <= checkpoint_seq + 1)
        .unwrap_or(0);
    if let Some((id, h)) = headers.get(live_start)
        && h.first_seq > checkpoint_seq + 1
    {
        summary.problems.push(Problem::SequenceGap {
            segment_id: *id,
            expected_seq: checkpoint_seq + 1,
            found_seq: h.first_seq,
        });
    }
    summary.last_seq = checkpoint_seq;

    // Packs: payload records the checkpoint points at; intact or corrupt.
    for &id in &listing.packs {
        let path = dir.join(pack_file_name(id));
        let mut buf = spare.try_recv().unwrap_or_default();
        read(&path, &mut buf)?;
        summary.file_bytes += buf.len() as u64;
        if let Err(problem) = PackHeader::decode(&buf, salt, id) {
            summary.problems.push(Problem::BadHeader {
                path,
                reason: problem.to_string(),
            });
            continue;
        }
        summary.packs.push((id, buf.len() as u64));
        let file = FileId::Pack(id);
        let mut frames = Vec::new();
        for piece in walk(&buf, FILE_HEADER_BYTES, salt, 0) {
            match piece {
                Piece::Frame(f) if f.header.seq <= checkpoint_seq => {
                    summary.records += 1;
                    summary.record_bytes += f.frame_len() as u64;
                    frames.push(checked(&f, false));
                }
                Piece::Frame(f) => summary.problems.push(misplaced(
                    file,
                    &f,
                    format!(
                        "pack record {} is newer than the checkpoint ({checkpoint_seq})",
                        f.header.seq
                    ),
                )),
                Piece::Damage { start, end, .. } => summary.problems.push(Problem::BadSpan {
                    file,
                    start: start as u64,
                    end: end as u64,
                    reason: damage_reason(&buf, start, salt),
                }),
            }
        }
        if !hand_over(&out, file, buf, frames) {
            return Ok(summary);
        }
    }

    // Log segments, in id order.
    let mut expect: Option<u64> = None;
    for (i, &(id, h)) in headers.iter().enumerate() {
        let is_last = Some(id) == last_id;
        let live = i >= live_start;
        let path = dir.join(segment_file_name(id));
        let mut buf = spare.try_recv().unwrap_or_default();
        read(&path, &mut buf)?;
        summary.file_bytes += buf.len() as u64;
        summary.segments.push(SegmentInfo {
            id,
            first_seq: h.first_seq,
            file_bytes: buf.len() as u64,
            payload_only: !live,
        });
        if live && i > live_start {
            let prev = headers[i - 1].0;
            if prev + 1 != id {
                summary.problems.push(Problem::MissingSegments {
                    first: prev + 1,
                    last: id - 1,
                });
            }
            if let Some(expected) = expect
                && h.first_seq != expected
            {
                summary.problems.push(if h.first_seq > expected {
                    Problem::SequenceGap {
                        segment_id: id,
                        expected_seq: expected,
                        found_seq: h.first_seq,
                    }
                } else {
                    Problem::BadHeader {
                        path: path.clone(),
                        reason: format!(
                            "first sequence {} overlaps records already seen (next expected {expected})",
                            h.first_seq
                        ),
                    }
                });
            }
        }
        let file = FileId::Segment(id);
        let mut frames = Vec::new();
        let mut next_seq = h.first_seq;
        let mut end = FILE_HEADER_BYTES;
        // The last intact frame of this file, for the torn-batch rule.
        let mut previous: Option<super::format::FrameHeader> = None;
        let mut pieces = walk(&buf, FILE_HEADER_BYTES, salt, h.first_seq);
        while let Some(piece) = pieces.next() {
            match piece {
                Piece::Frame(f) if f.header.seq == next_seq => {
                    frames.push(log_record(&mut summary, &f, live, checkpoint_seq));
                    next_seq += 1;
                    end = f.end();
                    previous = Some(f.header);
                }
                Piece::Frame(f) => {
                    summary.problems.push(misplaced(
                        file,
                        &f,
                        format!(
                            "record carries sequence {} where {next_seq} was expected",
                            f.header.seq
                        ),
                    ));
                    next_seq = f.header.seq + 1;
                    end = f.end();
                }
                Piece::Damage {
                    start,
                    end: bad_end,
                    last,
                } => {
                    // In the last segment, damage confined to the batch
                    // that was being written is a torn tail.
                    let batch = match previous {
                        Some(p) if p.ends_batch() => p.seq + 1,
                        Some(p) => p.batch_first_seq(),
                        None => h.first_seq,
                    };
                    let rest: Vec<Piece<'_>> = if last {
                        Vec::new()
                    } else {
                        pieces.by_ref().collect()
                    };
                    let torn = is_last
                        && rest.iter().all(|p| match p {
                            Piece::Frame(f) => f.header.batch_first_seq() == batch,
                            Piece::Damage { .. } => true,
                        });
                    if torn {
                        let torn_end = rest
                            .iter()
                            .map(|p| match p {
                                Piece::Frame(f) => f.end(),
                                Piece::Damage { end, .. } => *end,
                            })
                            .max()
                            .unwrap_or(bad_end)
                            .max(bad_end);
                        summary.torn_tail = Some(TornTail {
                            segment_id: id,
                            offset: start as u64,
                            len_bytes: (torn_end - start) as u64,
                        });
                    } else {
                        summary.problems.push(Problem::BadSpan {
                            file,
                            start: start as u64,
                            end: bad_end as u64,
                            reason: if is_last {
                                damage_reason(&buf, start, salt)
                            } else {
                                format!("{} (sealed segment)", damage_reason(&buf, start, salt))
                            },
                        });
                        // Keep going (verify lists every span, repair
                        // keeps every good record); replay refuses on the
                        // first problem anyway.
                        for p in rest {
                            match p {
                                Piece::Frame(f) => {
                                    frames.push(log_record(&mut summary, &f, live, checkpoint_seq));
                                    next_seq = f.header.seq + 1;
                                    end = f.end();
                                }
                                Piece::Damage { start, end, .. } => {
                                    summary.problems.push(Problem::BadSpan {
                                        file,
                                        start: start as u64,
                                        end: end as u64,
                                        reason: damage_reason(&buf, start, salt),
                                    });
                                }
                            }
                        }
                    }
                    break;
                }
            }
        }
        expect = Some(next_seq);
        if is_last {
            summary.last_segment_end = end as u64;
            summary.last_segment_len = buf.len() as u64;
            summary.last_segment_next_seq = next_seq;
        }
        if !hand_over(&out, file, buf, frames) {
            return Ok(summary);
        }
    }
    Ok(summary)
}

/// Counts a valid record of a log segment; it applies when it is in the
/// live log after the checkpoint.
fn log_record(
    summary: &mut ScanSummary,
    f: &super::frames::Frame<'_>,
    live: bool,
    checkpoint_seq: u64,
) -> CheckedFrame {
    summary.records += 1;
    summary.record_bytes += f.frame_len() as u64;
    if live {
        summary.last_seq = summary.last_seq.max(f.header.seq);
    }
    checked(f, live && f.header.seq > checkpoint_seq)
}

fn checked(f: &super::frames::Frame<'_>, applies: bool) -> CheckedFrame {
    CheckedFrame {
        offset: f.offset,
        end: f.end(),
        seq: f.header.seq,
        term: f.header.term,
        kind: f.header.kind,
        applies,
    }
}

/// A checkpoint read whole and checked: its chunks, in order.
pub(crate) struct CheckpointBytes {
    pub info: CheckpointInfo,
    buf: Vec<u8>,
    /// (kind, body start, body end) of each chunk.
    chunks: Vec<(u8, usize, usize)>,
}

impl CheckpointBytes {
    /// Every chunk: its kind and body.
    pub(crate) fn chunks(&self) -> impl Iterator<Item = (u8, &[u8])> + '_ {
        self.chunks
            .iter()
            .map(|&(kind, start, end)| (kind, &self.buf[start..end]))
    }
}

/// Reads the whole file at `path` into `buf`.
pub(crate) fn read_whole(
    storage: &dyn Storage,
    path: &Path,
    buf: &mut Vec<u8>,
) -> Result<(), JournalError> {
    storage
        .open(path)
        .and_then(|f| f.read_all(buf))
        .map_err(|e| JournalError::io(path, e))
}

/// Reads the checkpoint at `seq` and checks every chunk's frame.
/// `Ok(Err(problem))` is damage; `Err` an I/O error.
pub(crate) fn read_checkpoint(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    seq: u64,
) -> Result<Result<CheckpointBytes, Problem>, JournalError> {
    let path = dir.join(checkpoint_file_name(seq));
    let mut buf = Vec::new();
    read_whole(storage.as_ref(), &path, &mut buf)?;
    let (header, frames) = match check_checkpoint(&buf, salt, seq) {
        Ok(checked) => checked,
        Err(reason) => return Ok(Err(Problem::BadCheckpoint { path, reason })),
    };
    let chunks = frames
        .iter()
        .map(|f| (f.kind, f.offset + super::format::FRAME_HEADER_BYTES, f.end))
        .collect();
    Ok(Ok(CheckpointBytes {
        info: CheckpointInfo {
            seq,
            term: header.term,
            file_bytes: buf.len() as u64,
        },
        buf,
        chunks,
    }))
}

/// Reads what can be read of a damaged checkpoint: every intact chunk, in
/// order (repair keeps what it can).
pub(crate) fn salvage_checkpoint(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    seq: u64,
    mut visit: impl FnMut(u8, &[u8]),
) -> Result<(), JournalError> {
    let path = dir.join(checkpoint_file_name(seq));
    let mut buf = Vec::new();
    read_whole(storage.as_ref(), &path, &mut buf)?;
    for piece in walk(&buf, FILE_HEADER_BYTES, salt, 0) {
        if let Piece::Frame(f) = piece
            && f.header.seq == seq
        {
            visit(f.header.kind, f.body());
        }
    }
    Ok(())
}

/// Checks a whole checkpoint file: its header, then chunk frames numbered
/// 0, 1, … all carrying sequence number `seq`, the last one flagged, as
/// many as the header says, ending where the file ends.
fn check_checkpoint(
    buf: &[u8],
    salt: u64,
    seq: u64,
) -> Result<(CheckpointHeader, Vec<CheckedFrame>), String> {
    let header = CheckpointHeader::decode(buf, salt, seq).map_err(|p| p.to_string())?;
    if header.file_bytes != buf.len() as u64 {
        return Err(format!(
            "file holds {} bytes where its header says {}",
            buf.len(),
            header.file_bytes
        ));
    }
    let mut frames = Vec::new();
    let mut ended = false;
    for piece in walk(buf, FILE_HEADER_BYTES, salt, 0) {
        let f = match piece {
            Piece::Frame(f) => f,
            Piece::Damage { start, .. } => {
                return Err(format!(
                    "offset {start}: {}",
                    damage_reason(buf, start, salt)
                ));
            }
        };
        if ended || f.header.seq != seq || u64::from(f.header.batch_index) != frames.len() as u64 {
            return Err(format!(
                "offset {}: chunk {} out of place (sequence {}, expected chunk {} of {seq})",
                f.offset,
                f.header.batch_index,
                f.header.seq,
                frames.len()
            ));
        }
        ended = f.header.ends_batch();
        frames.push(checked(&f, false));
    }
    if !ended || frames.len() as u64 != header.chunks {
        return Err(format!(
            "{} chunk(s) where the header says {}{}",
            frames.len(),
            header.chunks,
            if ended { "" } else { ", and no final chunk" }
        ));
    }
    Ok((header, frames))
}
