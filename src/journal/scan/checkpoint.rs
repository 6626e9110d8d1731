//! Reading a checkpoint: whole and checked, every chunk in its place
//! ([`read_checkpoint`]), or, for repair, whatever intact chunks a damaged
//! one still holds ([`salvage_checkpoint`]).

use std::path::Path;
use std::sync::Arc;

use crate::journal::error::JournalError;
use crate::journal::format::{
    CheckpointHeader, FILE_HEADER_BYTES, FRAME_HEADER_BYTES, checkpoint_file_name,
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
        Err(reason) => return Ok(Err(Problem::BadCheckpoint { path, reason })),
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
