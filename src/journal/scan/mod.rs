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
//!
//! The rooms, in the order a scan uses them: `listing` finds the files,
//! `checkpoint` reads the newest checkpoint, `visit` runs the scan on two
//! threads, `check` reads and judges every file on the helper thread
//! (`walk` judges one file's frames) and `checked` is what it hands over.
//! This module holds what a scan finds.

use std::path::{Path, PathBuf};

use super::error::JournalError;
use super::format::{FILE_HEADER_BYTES, FileId, segment_file_name};

mod check;
mod checked;
mod checkpoint;
mod listing;
mod visit;
mod walk;

pub(crate) use checkpoint::{CheckpointBytes, CheckpointInfo, read_checkpoint, salvage_checkpoint};
pub(crate) use listing::{Listing, list_files, obsolete_files, read_header, read_whole};
pub use visit::scan_dir;

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
