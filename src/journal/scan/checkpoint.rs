//! Reading a checkpoint: whole and checked, every chunk in its place
//! ([`read_checkpoint`]), or, for repair, whatever intact chunks a damaged
//! one still holds ([`salvage_checkpoint`]).

use std::path::Path;
use std::sync::Arc;

use crate::journal::error::JournalError;
use crate::journal::format::{
    CheckpointHeader, FILE_HEADER_BYTES, FRAME_HEADER_BYTES, HeaderProblem, checkpoint_file_name,
};
use crate::journal::frames::{Piece, damage_reason, walk};
use crate::journal::storage::Storage;

use super::Problem;
use super::checked::{CheckedFrame, checked};
use super::listing::read_whole;

/// The newest checkpoint, as found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CheckpointInfo {
    pub seq: u64,
    pub term: u64,
    pub file_bytes: u64,
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
        Err(damage) => {
            return Ok(Err(Problem::BadCheckpoint {
                path,
                reason: damage.to_string(),
            }));
        }
    };
    let chunks = frames
        .iter()
        .map(|f| (f.kind, f.offset + FRAME_HEADER_BYTES, f.end))
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

/// Why a checkpoint file is damaged or incomplete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum CheckpointDamage {
    #[error("{0}")]
    Header(HeaderProblem),
    /// Cut short, or written on past its end.
    #[error("file holds {file_bytes} bytes where its header says {header_bytes}")]
    Size { file_bytes: u64, header_bytes: u64 },
    /// A span with no intact frame, the first frame's `reason`.
    #[error("offset {offset}: {reason}")]
    Frame { offset: usize, reason: String },
    /// A chunk of another checkpoint, or out of order, or after the last.
    #[error(
        "offset {offset}: chunk {chunk} out of place (sequence {seq}, expected chunk {expected} \
         of {checkpoint_seq})"
    )]
    OutOfPlace {
        offset: usize,
        chunk: u32,
        seq: u64,
        expected: usize,
        checkpoint_seq: u64,
    },
    /// Fewer or more chunks than the header says, or no final one.
    #[error(
        "{found} chunk(s) where the header says {expected}{}",
        if *ended { "" } else { ", and no final chunk" }
    )]
    Chunks {
        found: usize,
        expected: u64,
        ended: bool,
    },
}

/// Checks a whole checkpoint file: its header, then chunk frames numbered
/// 0, 1, … all carrying sequence number `seq`, the last one flagged, as
/// many as the header says, ending where the file ends.
fn check_checkpoint(
    buf: &[u8],
    salt: u64,
    seq: u64,
) -> Result<(CheckpointHeader, Vec<CheckedFrame>), CheckpointDamage> {
    let header = CheckpointHeader::decode(buf, salt, seq).map_err(CheckpointDamage::Header)?;
    if header.file_bytes != buf.len() as u64 {
        return Err(CheckpointDamage::Size {
            file_bytes: buf.len() as u64,
            header_bytes: header.file_bytes,
        });
    }
    let mut frames = Vec::new();
    let mut ended = false;
    for piece in walk(buf, FILE_HEADER_BYTES, salt, 0) {
        let f = match piece {
            Piece::Frame(f) => f,
            Piece::Damage { start, .. } => {
                return Err(CheckpointDamage::Frame {
                    offset: start,
                    reason: damage_reason(buf, start, salt),
                });
            }
        };
        if ended || f.header.seq != seq || u64::from(f.header.batch_index) != frames.len() as u64 {
            return Err(CheckpointDamage::OutOfPlace {
                offset: f.offset,
                chunk: f.header.batch_index,
                seq: f.header.seq,
                expected: frames.len(),
                checkpoint_seq: seq,
            });
        }
        ended = f.header.ends_batch();
        frames.push(checked(&f, false));
    }
    if !ended || frames.len() as u64 != header.chunks {
        return Err(CheckpointDamage::Chunks {
            found: frames.len(),
            expected: header.chunks,
            ended,
        });
    }
    Ok((header, frames))
}
