//! The file half of compaction: read sealed segments back frame by frame,
//! write the frames worth keeping into a temp file, and put it in place.
//!
//! Which frames are worth keeping is the engine's business (it knows the
//! state); this module only guarantees the file protocol:
//!
//! 1. write `<last id>.seg.compact.tmp`: a header flagged compacted, with
//!    `covers_from` = the run's first id, then the kept frames with their
//!    original sequence numbers; fsync it;
//! 2. rename it over `<last id>.seg`; fsync the directory;
//! 3. delete the run's other segments; fsync the directory.
//!
//! A crash before 2 leaves a temp file (swept at start-up) and the old
//! segments; a crash between 2 and 3 leaves old segments that the new file
//! covers (start-up sees `covers_from` and deletes them). At no moment is a
//! kept record in neither the old nor the new file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::JournalError;
use super::format::{
    FRAME_HEADER_BYTES, FrameHeader, SEGMENT_FLAG_COMPACTED, SEGMENT_HEADER_BYTES, SegmentHeader,
    segment_file_name,
};
use super::storage::{Storage, StorageFile};

/// One frame of a segment read back for compaction.
#[derive(Debug, Clone, Copy)]
pub struct FrameRef {
    pub offset: usize,
    pub len: usize,
    pub seq: u64,
    pub kind: u8,
}

/// A sealed segment in memory.
pub struct SegmentFrames {
    pub id: u64,
    pub header: SegmentHeader,
    pub buf: Vec<u8>,
    pub frames: Vec<FrameRef>,
}

impl SegmentFrames {
    pub fn body(&self, f: &FrameRef) -> &[u8] {
        &self.buf[f.offset + FRAME_HEADER_BYTES..f.offset + f.len]
    }

    pub fn frame_bytes(&self, f: &FrameRef) -> &[u8] {
        &self.buf[f.offset..f.offset + f.len]
    }
}

/// Reads a sealed segment. Damage is an error: compaction never rewrites
/// what it cannot read (repair is for that).
pub fn read_segment(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    id: u64,
) -> Result<SegmentFrames, JournalError> {
    let path = dir.join(segment_file_name(id));
    let file = storage
        .open(&path)
        .map_err(|e| JournalError::io(&path, e))?;
    let mut buf = Vec::new();
    file.read_all(&mut buf)
        .map_err(|e| JournalError::io(&path, e))?;
    let corrupt = |offset: usize, reason: String| JournalError::Corrupt {
        dir: dir.to_path_buf(),
        file: path.clone(),
        offset: offset as u64,
        reason,
    };
    let header = SegmentHeader::decode(&buf, salt, id).map_err(|p| corrupt(0, p.to_string()))?;
    let mut frames = Vec::new();
    let mut off = SEGMENT_HEADER_BYTES;
    while off + FRAME_HEADER_BYTES <= buf.len() {
        let h = FrameHeader::peek(&buf[off..]);
        if h.body_len == 0 && h.seq == 0 && buf[off..].iter().all(|&b| b == 0) {
            break;
        }
        let len = FRAME_HEADER_BYTES + h.body_len as usize;
        if off + len > buf.len() || !FrameHeader::verify(&buf[off..off + len], salt) {
            return Err(corrupt(off, "record damaged since replay".into()));
        }
        frames.push(FrameRef {
            offset: off,
            len,
            seq: h.seq,
            kind: h.kind,
        });
        off += len;
    }
    Ok(SegmentFrames {
        id,
        header,
        buf,
        frames,
    })
}

/// A frame for the new file: copied as it was, or made new (a dedup-key
/// record standing in for a dropped enqueue, with that enqueue's sequence
/// number).
pub enum Piece<'a> {
    Copy(&'a [u8]),
    New { seq: u64, kind: u8, body: Vec<u8> },
}

/// What `write_compacted` produced.
pub struct Written {
    pub tmp: PathBuf,
    /// Offset of each piece's frame in the new file, in order.
    pub offsets: Vec<u64>,
    pub file_len: u64,
}

/// Step 1: writes and fsyncs the temp file for segment `id`.
pub fn write_compacted<'a>(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    id: u64,
    header: SegmentHeader,
    pieces: impl IntoIterator<Item = Piece<'a>>,
) -> Result<Written, JournalError> {
    let tmp = dir.join(format!("{}.compact.tmp", segment_file_name(id)));
    let _ = storage.remove(&tmp);
    let header = SegmentHeader {
        flags: header.flags | SEGMENT_FLAG_COMPACTED,
        salt,
        segment_id: id,
        ..header
    };
    let mut buf = header.encode().to_vec();
    let mut offsets = Vec::new();
    for piece in pieces {
        offsets.push(buf.len() as u64);
        match piece {
            Piece::Copy(frame) => buf.extend_from_slice(frame),
            Piece::New { seq, kind, body } => {
                let start = buf.len();
                buf.resize(start + FRAME_HEADER_BYTES, 0);
                buf.extend_from_slice(&body);
                FrameHeader::seal(&mut buf[start..], salt, seq, kind);
            }
        }
    }
    let file: Arc<dyn StorageFile> = storage
        .create(&tmp)
        .map_err(|e| JournalError::io(&tmp, e))?;
    file.write_all_at(&buf, 0)
        .and_then(|()| file.sync_data())
        .map_err(|e| JournalError::io(&tmp, e))?;
    Ok(Written {
        tmp,
        offsets,
        file_len: buf.len() as u64,
    })
}

/// Step 2: puts the temp file in place of segment `id`.
pub fn install(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    tmp: &Path,
    id: u64,
) -> Result<(), JournalError> {
    let path = dir.join(segment_file_name(id));
    storage
        .rename(tmp, &path)
        .and_then(|()| storage.sync_dir(dir))
        .map_err(|e| JournalError::io(&path, e))
}

/// Step 3 (and start-up's cleanup): deletes segments that a merged segment
/// covers, or that compaction emptied at the head of the journal.
pub fn remove_segments(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    ids: &[u64],
) -> Result<(), JournalError> {
    if ids.is_empty() {
        return Ok(());
    }
    for &id in ids {
        let path = dir.join(segment_file_name(id));
        storage
            .remove(&path)
            .map_err(|e| JournalError::io(&path, e))?;
    }
    storage.sync_dir(dir).map_err(|e| JournalError::io(dir, e))
}
