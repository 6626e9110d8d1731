//! Walking one file's frames and judging each piece by where the file sits
//! in the journal. A pack holds only records the checkpoint covers; a log
//! segment's records follow each other in sequence; damage in the last
//! segment confined to its last batch is a torn tail, and any other damage
//! is a bad span. Valid records are counted into the scan's summary and
//! kept for the visitor.

use crate::journal::format::{FILE_HEADER_BYTES, FileId, FrameHeader};
use crate::journal::frames::{Frame, Piece, damage_reason, walk};

use super::checked::{CheckedFrame, checked};
use super::{Problem, ScanSummary, TornTail};

/// Checks the records of pack `id` in `buf`. A pack holds payload records
/// that compaction copied for a checkpoint, so each must be at or before
/// the checkpoint at `checkpoint_seq`, and none applies; a newer record and
/// every damaged span are problems.
pub(super) fn check_pack(
    summary: &mut ScanSummary,
    buf: &[u8],
    id: u64,
    salt: u64,
    checkpoint_seq: u64,
) -> Vec<CheckedFrame> {
    let file = FileId::Pack(id);
    let mut frames = Vec::new();
    for piece in walk(buf, FILE_HEADER_BYTES, salt, 0) {
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
                reason: damage_reason(buf, start, salt),
            }),
        }
    }
    frames
}

/// Where a log segment sits in the journal: it decides what the segment's
/// records and damage mean.
#[derive(Clone, Copy)]
pub(super) struct SegmentPlace {
    pub(super) id: u64,
    /// The sequence number its header gives its first record.
    pub(super) first_seq: u64,
    /// Part of the live log: its records after the checkpoint apply.
    pub(super) live: bool,
    /// The newest segment, the only one a write can have been cut short in.
    pub(super) is_last: bool,
}

/// What walking a log segment found besides problems.
pub(super) struct WalkedSegment {
    /// Its valid records, in order.
    pub(super) frames: Vec<CheckedFrame>,
    /// The sequence number its next record would carry.
    pub(super) next_seq: u64,
    /// The end of the last intact frame walked (in the last segment: where
    /// the next write goes).
    pub(super) end: usize,
}

/// Walks the log segment at `place`, read into `buf`: records in sequence
/// are counted into `summary` and kept, a record out of sequence is a
/// problem, and at the first damage the torn-batch rule decides what the
/// rest of the file is.
pub(super) fn walk_segment(
    summary: &mut ScanSummary,
    buf: &[u8],
    place: SegmentPlace,
    salt: u64,
    checkpoint_seq: u64,
) -> WalkedSegment {
    let mut segment = SegmentWalk {
        summary,
        buf,
        place,
        salt,
        checkpoint_seq,
        walked: WalkedSegment {
            frames: Vec::new(),
            next_seq: place.first_seq,
            end: FILE_HEADER_BYTES,
        },
    };
    // The last intact frame of this file, for the torn-batch rule.
    let mut previous: Option<FrameHeader> = None;
    let mut pieces = walk(buf, FILE_HEADER_BYTES, salt, place.first_seq);
    while let Some(piece) = pieces.next() {
        match piece {
            Piece::Frame(f) if f.header.seq == segment.walked.next_seq => {
                segment.keep(&f);
                previous = Some(f.header);
            }
            Piece::Frame(f) => segment.out_of_sequence(&f),
            Piece::Damage { start, end, last } => {
                let rest: Vec<Piece<'_>> = if last {
                    Vec::new()
                } else {
                    pieces.by_ref().collect()
                };
                segment.damaged(start, end, previous, &rest);
                break;
            }
        }
    }
    segment.walked
}

/// A log segment being walked: what judging a piece needs, and what the
/// walk has found so far.
struct SegmentWalk<'a> {
    summary: &'a mut ScanSummary,
    buf: &'a [u8],
    place: SegmentPlace,
    salt: u64,
    checkpoint_seq: u64,
    walked: WalkedSegment,
}

impl SegmentWalk<'_> {
    /// Counts and keeps a valid record; the walk goes on after it.
    fn keep(&mut self, f: &Frame<'_>) {
        let frame = log_record(self.summary, f, self.place.live, self.checkpoint_seq);
        self.walked.frames.push(frame);
        self.walked.next_seq = f.header.seq + 1;
        self.walked.end = f.end();
    }

    /// An intact record where another sequence number was expected: a bad
    /// span of its own, and the walk goes on after it.
    fn out_of_sequence(&mut self, f: &Frame<'_>) {
        let reason = format!(
            "record carries sequence {} where {} was expected",
            f.header.seq, self.walked.next_seq
        );
        let file = FileId::Segment(self.place.id);
        self.summary.problems.push(misplaced(file, f, reason));
        self.walked.next_seq = f.header.seq + 1;
        self.walked.end = f.end();
    }

    /// Judges the first damage, `[start, end)`, with `rest` every piece
    /// after it. In the last segment, damage confined to the batch that was
    /// being written is a torn tail: that batch came after the last fsync
    /// that returned, so nothing in it was acknowledged. Anything else is
    /// corruption.
    fn damaged(
        &mut self,
        start: usize,
        end: usize,
        previous: Option<FrameHeader>,
        rest: &[Piece<'_>],
    ) {
        let batch = batch_at_damage(previous, self.place.first_seq);
        if self.place.is_last && confined_to_batch(rest, batch) {
            self.summary.torn_tail = Some(TornTail {
                segment_id: self.place.id,
                offset: start as u64,
                len_bytes: (torn_end(rest, end) - start) as u64,
            });
        } else {
            self.corrupt(start, end, rest);
        }
    }

    /// Damage that is corruption: a bad span (in a sealed segment, said
    /// so). Keep going (verify lists every span, repair keeps every good
    /// record); replay refuses on the first problem anyway.
    fn corrupt(&mut self, start: usize, end: usize, rest: &[Piece<'_>]) {
        let file = FileId::Segment(self.place.id);
        let reason = damage_reason(self.buf, start, self.salt);
        self.summary.problems.push(Problem::BadSpan {
            file,
            start: start as u64,
            end: end as u64,
            reason: if self.place.is_last {
                reason
            } else {
                format!("{reason} (sealed segment)")
            },
        });
        for piece in rest {
            match piece {
                Piece::Frame(f) => self.keep(f),
                Piece::Damage { start, end, .. } => {
                    self.summary.problems.push(Problem::BadSpan {
                        file,
                        start: *start as u64,
                        end: *end as u64,
                        reason: damage_reason(self.buf, *start, self.salt),
                    });
                }
            }
        }
    }
}

/// The first sequence number of the batch the damage is in: the record
/// after the last intact frame when that frame ended its batch, else that
/// frame's batch; the segment's first record when no frame came before.
fn batch_at_damage(previous: Option<FrameHeader>, first_seq: u64) -> u64 {
    match previous {
        Some(p) if p.ends_batch() => p.seq + 1,
        Some(p) => p.batch_first_seq(),
        None => first_seq,
    }
}

/// True when every intact frame after the damage belongs to `batch`: the
/// write of that batch was cut short, and nothing was written after it.
fn confined_to_batch(rest: &[Piece<'_>], batch: u64) -> bool {
    rest.iter().all(|p| match p {
        Piece::Frame(f) => f.header.batch_first_seq() == batch,
        Piece::Damage { .. } => true,
    })
}

/// Where a torn tail ends: the furthest end of the damage and of every
/// piece after it.
fn torn_end(rest: &[Piece<'_>], damage_end: usize) -> usize {
    rest.iter()
        .map(|p| match p {
            Piece::Frame(f) => f.end(),
            Piece::Damage { end, .. } => *end,
        })
        .max()
        .unwrap_or(damage_end)
        .max(damage_end)
}

/// Counts a valid record of a log segment; it applies when it is in the
/// live log after the checkpoint.
fn log_record(
    summary: &mut ScanSummary,
    f: &Frame<'_>,
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

/// An intact frame where it does not belong: a bad span of its own.
fn misplaced(file: FileId, f: &Frame<'_>, reason: String) -> Problem {
    Problem::BadSpan {
        file,
        start: f.offset as u64,
        end: f.end() as u64,
        reason,
    }
}
