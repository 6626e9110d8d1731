//! Reading a journal directory back: every record in order, and every place
//! where the bytes are not what the writer wrote.
//!
//! Scanning never changes a file. It classifies damage the way the recovery
//! table in `docs/journal-format.md` says:
//!
//! - a bad record in the last segment with no valid record after it is a
//!   [`TornTail`]: the write was cut short, so nothing in it was ever
//!   acknowledged, and the caller may truncate it;
//! - a bad record with a valid record after it, any damage in a sealed
//!   segment, a damaged segment header, or a missing segment is a
//!   [`Problem`]: corruption, which replay refuses and `verify` reports.
//!
//! After a bad record the scanner resynchronises by looking for the next
//! offset that holds a valid frame with a later sequence number, so one flipped
//! bit costs one span, not the rest of the segment.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::JournalError;
use super::format::{
    FRAME_HEADER_BYTES, FrameHeader, RECORD_BODY_MAX_BYTES, SEGMENT_HEADER_BYTES, SegmentHeader,
    parse_segment_file_name, segment_file_name,
};
use super::storage::Storage;

/// One valid record, borrowed from the scan buffer.
#[derive(Debug, Clone, Copy)]
pub struct ScannedRecord<'a> {
    pub segment_id: u64,
    /// Offset of the frame (not the body) in its segment.
    pub offset: u64,
    pub seq: u64,
    pub kind: u8,
    pub body: &'a [u8],
}

impl ScannedRecord<'_> {
    pub fn frame_len(&self) -> u64 {
        (FRAME_HEADER_BYTES + self.body.len()) as u64
    }
}

/// Corruption: something replay must not paper over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// Bytes `[start, end)` of a segment hold no valid record.
    BadSpan {
        segment_id: u64,
        start: u64,
        end: u64,
        reason: String,
    },
    /// A segment header is damaged; the segment cannot be read.
    BadHeader { segment_id: u64, reason: String },
    /// Segment ids jump: the ones in between are gone.
    MissingSegments { first: u64, last: u64 },
    /// Records between two segments are gone (the earlier one lost its end).
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
            Problem::BadSpan {
                segment_id, start, ..
            } => (dir.join(segment_file_name(*segment_id)), *start),
            Problem::BadHeader { segment_id, .. } => (dir.join(segment_file_name(*segment_id)), 0),
            Problem::MissingSegments { first, .. } => (dir.join(segment_file_name(*first)), 0),
            Problem::SequenceGap { segment_id, .. } => (
                dir.join(segment_file_name(*segment_id)),
                SEGMENT_HEADER_BYTES as u64,
            ),
        }
    }

    pub fn reason(&self) -> String {
        match self {
            Problem::BadSpan {
                start, end, reason, ..
            } => format!("{} bad bytes [{start}, {end}): {reason}", end - start),
            Problem::BadHeader { reason, .. } => format!("bad segment header: {reason}"),
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

/// The end of the last segment does not hold a complete record: a write that
/// was cut short. Never acknowledged, safe to truncate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TornTail {
    pub segment_id: u64,
    pub offset: u64,
    pub len_bytes: u64,
}

/// What a scan found, besides the records it handed to the visitor.
#[derive(Debug, Clone, Default)]
pub struct ScanSummary {
    /// Every segment id found, ascending.
    pub segment_ids: Vec<u64>,
    pub records: u64,
    pub record_bytes: u64,
    /// Bytes of all segment files, preallocated space included.
    pub file_bytes: u64,
    /// The valid headers, in id order, with their file lengths.
    pub headers: Vec<(SegmentHeader, u64)>,
    /// The highest message-id floor any header carries.
    pub id_floor: u64,
    /// Segments a later, merged segment covers: left behind by a compaction
    /// that was cut short after its new file was in place. Skipped by the
    /// scan; start-up deletes them.
    pub superseded: Vec<u64>,
    /// Sequence number of the last valid record (0 when there is none).
    pub last_seq: u64,
    /// `first_seq` of the last segment's header, if its header is valid.
    pub last_segment_first_seq: Option<u64>,
    /// The valid end of the last segment (where the next write goes).
    pub last_segment_end: u64,
    /// The last segment's file length (beyond the valid end: a torn write
    /// and/or preallocated zeros).
    pub last_segment_len: u64,
    pub torn_tail: Option<TornTail>,
    /// The last segment's header is incomplete: it was being created when
    /// the process died and holds nothing.
    pub torn_last_header: bool,
    pub problems: Vec<Problem>,
}

/// Lists the segment ids in `dir`, ascending.
pub fn list_segments(storage: &dyn Storage, dir: &Path) -> Result<Vec<u64>, JournalError> {
    let names = storage.list(dir).map_err(|e| JournalError::io(dir, e))?;
    let mut ids: Vec<u64> = names
        .iter()
        .filter_map(|n| parse_segment_file_name(n))
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// `(covers_from, id)` of every segment whose valid header says it stands
/// for earlier ids too (a merged compaction output).
fn covered_ranges(
    storage: &dyn Storage,
    dir: &Path,
    salt: u64,
    ids: &[u64],
) -> Result<Vec<(u64, u64)>, JournalError> {
    let mut out = Vec::new();
    let mut header = [0u8; SEGMENT_HEADER_BYTES];
    for &id in ids {
        let path = dir.join(segment_file_name(id));
        let file = storage
            .open(&path)
            .map_err(|e| JournalError::io(&path, e))?;
        if file.read_exact_at(&mut header, 0).is_err() {
            continue;
        }
        if let Ok(h) = SegmentHeader::decode(&header, salt, id)
            && h.first_covered_id() < id
        {
            out.push((h.first_covered_id(), id));
        }
    }
    Ok(out)
}

/// Scans every segment of `dir` in order, handing each valid record to
/// `visit`. A visitor error stops the scan and is returned as is.
pub fn scan_dir(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    mut visit: impl FnMut(ScannedRecord<'_>) -> Result<(), JournalError>,
) -> Result<ScanSummary, JournalError> {
    // A helper thread reads and checks segment N+1 (the copy out of the
    // page cache and the checksums are half the work) while this one hands
    // segment N's records to `visit`. At most two buffers exist: the one
    // being visited and the one being filled; buffers go back for reuse.
    let (segments_tx, segments_rx) = std::sync::mpsc::sync_channel::<CheckedSegment>(0);
    let (spare_tx, spare_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::scope(|scope| {
        let reader = std::thread::Builder::new()
            .name("journal-scan".into())
            .spawn_scoped(scope, || {
                check_segments(storage, dir, salt, segments_tx, spare_rx)
            })
            .map_err(|e| JournalError::io(dir, e))?;
        let visited = segments_rx.iter().try_for_each(|segment| {
            for (i, frame) in segment.frames.iter().enumerate() {
                if let Some(ahead) = segment.frames.get(i + PREFETCH_FRAMES_AHEAD) {
                    prefetch(&segment.buf[ahead.offset..ahead.end]);
                }
                visit(ScannedRecord {
                    segment_id: segment.id,
                    offset: frame.offset as u64,
                    seq: frame.seq,
                    kind: frame.kind,
                    body: &segment.buf[frame.offset + FRAME_HEADER_BYTES..frame.end],
                })?;
            }
            let _ = spare_tx.send(segment.buf);
            Ok(())
        });
        // On a visitor's error the reader finds the channel closed and stops.
        drop(segments_rx);
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

/// A segment read and checked, with its valid records in order.
struct CheckedSegment {
    id: u64,
    buf: Vec<u8>,
    frames: Vec<CheckedFrame>,
}

struct CheckedFrame {
    offset: usize,
    end: usize,
    seq: u64,
    kind: u8,
}

/// The reading half of [`scan_dir`]: everything but the visiting.
fn check_segments(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    segments: std::sync::mpsc::SyncSender<CheckedSegment>,
    spare: std::sync::mpsc::Receiver<Vec<u8>>,
) -> Result<ScanSummary, JournalError> {
    let all_ids = list_segments(storage.as_ref(), dir)?;
    let covers = covered_ranges(storage.as_ref(), dir, salt, &all_ids)?;
    let superseded: Vec<u64> = all_ids
        .iter()
        .copied()
        .filter(|&id| covers.iter().any(|&(from, to)| from <= id && id < to))
        .collect();
    let ids: Vec<u64> = all_ids
        .iter()
        .copied()
        .filter(|id| !superseded.contains(id))
        .collect();
    let mut summary = ScanSummary {
        segment_ids: ids.clone(),
        superseded,
        ..ScanSummary::default()
    };
    // The sequence number the next record must carry, when it is known
    // exactly (an uncompacted segment after an undamaged one).
    let mut expect_exact: Option<u64> = None;
    // Every later record must carry at least this sequence number.
    let mut min_next_seq = 0u64;
    for (i, &id) in ids.iter().enumerate() {
        let is_last = i + 1 == ids.len();
        let first_covered = covers
            .iter()
            .find(|&&(_, to)| to == id)
            .map_or(id, |&(from, _)| from);
        if i > 0 && first_covered != ids[i - 1] + 1 {
            summary.problems.push(Problem::MissingSegments {
                first: ids[i - 1] + 1,
                last: first_covered - 1,
            });
            expect_exact = None;
        }
        let path = dir.join(segment_file_name(id));
        let file = storage
            .open(&path)
            .map_err(|e| JournalError::io(&path, e))?;
        let mut buf = spare.try_recv().unwrap_or_default();
        let mut frames = Vec::new();
        file.read_all(&mut buf)
            .map_err(|e| JournalError::io(&path, e))?;
        summary.file_bytes += buf.len() as u64;

        let header = match SegmentHeader::decode(&buf, salt, id) {
            Ok(h) => h,
            Err(problem) => {
                if is_last && buf.len() <= SEGMENT_HEADER_BYTES {
                    summary.torn_last_header = true;
                } else {
                    summary.problems.push(Problem::BadHeader {
                        segment_id: id,
                        reason: problem.to_string(),
                    });
                }
                expect_exact = None;
                continue;
            }
        };
        if is_last {
            summary.last_segment_first_seq = Some(header.first_seq);
        }
        summary.id_floor = summary.id_floor.max(header.id_floor);
        summary.headers.push((header, buf.len() as u64));
        let compacted = header.is_compacted();
        if header.first_seq < min_next_seq {
            summary.problems.push(Problem::BadHeader {
                segment_id: id,
                reason: format!(
                    "first sequence {} overlaps records already seen (next at least {min_next_seq})",
                    header.first_seq
                ),
            });
        }
        if let Some(expected) = expect_exact
            && header.first_seq != expected
            && !(compacted && header.first_seq < expected)
        {
            if header.first_seq > expected {
                summary.problems.push(Problem::SequenceGap {
                    segment_id: id,
                    expected_seq: expected,
                    found_seq: header.first_seq,
                });
            } else {
                summary.problems.push(Problem::BadHeader {
                    segment_id: id,
                    reason: format!(
                        "first sequence {} overlaps records already seen (next expected {expected})",
                        header.first_seq
                    ),
                });
            }
        }
        // Within a segment sequence numbers are exact unless compacted.
        let mut next_seq = header.first_seq;
        let mut clean = true;
        let mut off = SEGMENT_HEADER_BYTES;
        while off < buf.len() {
            if all_zero(&buf[off..]) {
                // Preallocated space that no record reached yet.
                break;
            }
            match check_frame(&buf, off, salt, next_seq, compacted) {
                Ok(frame_len) => {
                    let h = FrameHeader::peek(&buf[off..]);
                    frames.push(CheckedFrame {
                        offset: off,
                        end: off + frame_len,
                        seq: h.seq,
                        kind: h.kind,
                    });
                    summary.records += 1;
                    summary.record_bytes += frame_len as u64;
                    summary.last_seq = h.seq;
                    next_seq = h.seq + 1;
                    off += frame_len;
                }
                Err(reason) => match resync(&buf, off + 1, salt, next_seq) {
                    Some(good) => {
                        summary.problems.push(Problem::BadSpan {
                            segment_id: id,
                            start: off as u64,
                            end: good as u64,
                            reason,
                        });
                        clean = false;
                        next_seq = FrameHeader::peek(&buf[good..]).seq;
                        off = good;
                    }
                    None if is_last => {
                        // Zeros after the torn bytes are preallocated space.
                        let end = buf.iter().rposition(|&b| b != 0).map_or(off, |p| p + 1);
                        summary.torn_tail = Some(TornTail {
                            segment_id: id,
                            offset: off as u64,
                            len_bytes: (end - off) as u64,
                        });
                        break;
                    }
                    None => {
                        summary.problems.push(Problem::BadSpan {
                            segment_id: id,
                            start: off as u64,
                            end: buf.len() as u64,
                            reason: format!("{reason} (sealed segment ends in damage)"),
                        });
                        clean = false;
                        break;
                    }
                },
            }
        }
        if is_last {
            summary.last_segment_end = off.min(buf.len()) as u64;
            summary.last_segment_len = buf.len() as u64;
        }
        // After a compacted segment the next one's first sequence number is
        // only known to be larger: compaction may have dropped the last
        // records.
        expect_exact = (clean && !compacted).then_some(next_seq);
        min_next_seq = next_seq;
        if segments.send(CheckedSegment { id, buf, frames }).is_err() {
            // The visitor failed; its error is the one to report.
            return Ok(summary);
        }
    }
    Ok(summary)
}

/// True when `bytes` holds only zeros: preallocated, never written.
pub(crate) fn all_zero(bytes: &[u8]) -> bool {
    // Eight bytes at a time: replay looks at every segment's tail. A frame
    // header is never zero, so at a record this stops at the first word.
    let mut words = bytes.chunks_exact(8);
    words.all(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")) == 0)
        && words.remainder().iter().all(|&b| b == 0)
}

/// Checks the frame at `off`; returns its total length, or why it is bad.
fn check_frame(
    buf: &[u8],
    off: usize,
    salt: u64,
    next_seq: u64,
    compacted: bool,
) -> Result<usize, String> {
    let rest = buf.len() - off;
    if rest < FRAME_HEADER_BYTES {
        return Err(format!("{rest} bytes are too short for a record frame"));
    }
    let h = FrameHeader::peek(&buf[off..]);
    let body_len = h.body_len as usize;
    if body_len > RECORD_BODY_MAX_BYTES {
        return Err(format!("impossible record length {body_len}"));
    }
    let frame_len = FRAME_HEADER_BYTES + body_len;
    if frame_len > rest {
        return Err(format!(
            "record of {frame_len} bytes runs past the end of the segment ({rest} left)"
        ));
    }
    if !FrameHeader::verify(&buf[off..off + frame_len], salt) {
        return Err("record checksum mismatch".to_string());
    }
    let seq_ok = if compacted {
        h.seq >= next_seq
    } else {
        h.seq == next_seq
    };
    if !seq_ok {
        return Err(format!(
            "record carries sequence {} where {next_seq} was expected",
            h.seq
        ));
    }
    Ok(frame_len)
}

/// The first offset at or after `from` that holds a valid frame with a
/// sequence number at or after `min_seq`.
pub(crate) fn resync(buf: &[u8], from: usize, salt: u64, min_seq: u64) -> Option<usize> {
    let last_start = buf.len().checked_sub(FRAME_HEADER_BYTES)?;
    (from..=last_start).find(|&p| {
        let h = FrameHeader::peek(&buf[p..]);
        let frame_len = FRAME_HEADER_BYTES + h.body_len as usize;
        h.seq >= min_seq
            && h.body_len as usize <= RECORD_BODY_MAX_BYTES
            && frame_len <= buf.len() - p
            && FrameHeader::verify(&buf[p..p + frame_len], salt)
    })
}
