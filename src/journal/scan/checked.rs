//! What the checking thread hands the visiting thread: a file read whole,
//! with the valid frames found in it. A frame is kept as offsets into the
//! file's buffer, so the buffer can cross threads and come back for reuse.

use std::sync::mpsc::SyncSender;

use crate::journal::format::FileId;
use crate::journal::frames::Frame;

/// A file read and checked, with its valid frames in order.
pub(super) struct CheckedFile {
    pub(super) id: FileId,
    pub(super) buf: Vec<u8>,
    pub(super) frames: Vec<CheckedFrame>,
}

/// A valid frame of a checked file: where it lies in the file's buffer and
/// what its header says.
pub(super) struct CheckedFrame {
    pub(super) offset: usize,
    pub(super) end: usize,
    pub(super) seq: u64,
    pub(super) term: u64,
    pub(super) kind: u8,
    pub(super) applies: bool,
}

/// The intact frame `f`, kept; `applies` says whether replay applies it.
pub(super) fn checked(f: &Frame<'_>, applies: bool) -> CheckedFrame {
    CheckedFrame {
        offset: f.offset,
        end: f.end(),
        seq: f.header.seq,
        term: f.header.term,
        kind: f.header.kind,
        applies,
    }
}

/// Passes a checked file to the applying side; false when that side has
/// stopped (it found a problem of its own).
pub(super) fn hand_over(
    out: &SyncSender<CheckedFile>,
    id: FileId,
    buf: Vec<u8>,
    frames: Vec<CheckedFrame>,
) -> bool {
    out.send(CheckedFile { id, buf, frames }).is_ok()
}
