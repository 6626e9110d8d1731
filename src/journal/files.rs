//! Writing the files compaction (and upgrade and repair) produce: packs of
//! payload records copied out of older files, and checkpoints. Both go in
//! place through [`super::atomic::write_atomically`], so a name on disk
//! always holds a complete, fsynced file.
//!
//! What goes into them is the engine's business (it knows the state); this
//! module only lays out bytes.

use std::path::Path;
use std::sync::Arc;

use super::atomic::{AtomicWriteError, write_atomically};
use super::format::{
    CheckpointHeader, FILE_HEADER_BYTES, FRAME_FLAG_BATCH_END, FRAME_HEADER_BYTES, FrameHeader,
    PACK_BYTES_MAX, PackHeader, checkpoint_file_name, pack_file_name,
};
use super::storage::Storage;
use super::storage::StorageFile;

/// Bytes gathered before one write while filling a file: large writes, and
/// a bounded buffer however large the file.
const WRITE_BUFFER_BYTES: usize = 4 << 20;

/// Writes `buf` at `offset` in steps: the buffer is flushed whenever it
/// holds [`WRITE_BUFFER_BYTES`].
struct BufferedWriter<'a> {
    file: &'a dyn StorageFile,
    buf: Vec<u8>,
    /// File offset of `buf[0]`.
    offset: u64,
}

impl BufferedWriter<'_> {
    fn push(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() >= WRITE_BUFFER_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.write_all_at(&self.buf, self.offset)?;
        self.offset += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }
}

/// Lays records out one after another in packs, starting the next pack
/// once a record would take the current one past [`PACK_BYTES_MAX`] (a
/// record larger than that gets a pack of its own). However much a
/// rebuild or a snapshot copies, every offset fits a record location.
#[derive(Debug)]
pub(crate) struct PackLayout {
    /// Index of the pack being filled (0 for the first).
    pack: u64,
    /// Where its next record goes.
    offset: u64,
}

impl PackLayout {
    pub(crate) fn new() -> PackLayout {
        PackLayout {
            pack: 0,
            offset: FILE_HEADER_BYTES as u64,
        }
    }

    /// Where a frame of `len` bytes goes: its pack's index and offset.
    pub(crate) fn place(&mut self, len: u32) -> (u64, u32) {
        let first = FILE_HEADER_BYTES as u64;
        if self.offset > first && self.offset + u64::from(len) > PACK_BYTES_MAX {
            self.pack += 1;
            self.offset = first;
        }
        let at = self.offset;
        self.offset += u64::from(len);
        // `format.rs` asserts that PACK_BYTES_MAX and one record fit.
        (
            self.pack,
            u32::try_from(at).expect("bug: a record placed past 4 GiB"),
        )
    }
}

/// Writes pack `id`: its header, then `frames` byte for byte, each at the
/// offset its caller computed (the first at [`FILE_HEADER_BYTES`], each
/// next one right after the one before). `frames` yields each frame's
/// bytes, already checked. Returns the pack's handle and length.
pub(crate) fn write_pack<F>(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    header: PackHeader,
    frames: F,
) -> Result<(Arc<dyn StorageFile>, u64), AtomicWriteError>
where
    F: IntoIterator<Item = std::io::Result<Vec<u8>>>,
{
    let mut len = 0u64;
    let file = write_atomically(storage, dir, &pack_file_name(header.pack_id), |file| {
        let mut out = BufferedWriter {
            file,
            buf: header.encode(salt).to_vec(),
            offset: 0,
        };
        for frame in frames {
            out.push(&frame?)?;
        }
        len = out.offset + out.buf.len() as u64;
        out.flush()
    })?;
    Ok((file, len))
}

/// Writes the checkpoint at sequence number `seq`: a header, then one frame
/// per chunk (kind and body as given), numbered from 0, all carrying `seq`
/// and `term`, the last one flagged. Returns the file's length.
pub(crate) fn write_checkpoint(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    seq: u64,
    term: u64,
    chunks: &[(u8, Vec<u8>)],
) -> Result<u64, AtomicWriteError> {
    let file_bytes = FILE_HEADER_BYTES as u64
        + chunks
            .iter()
            .map(|(_, body)| (FRAME_HEADER_BYTES + body.len()) as u64)
            .sum::<u64>();
    let header = CheckpointHeader {
        seq,
        chunks: chunks.len() as u64,
        file_bytes,
        term,
    };
    write_atomically(storage, dir, &checkpoint_file_name(seq), |file| {
        let mut out = BufferedWriter {
            file,
            buf: header.encode(salt).to_vec(),
            offset: 0,
        };
        let mut frame = Vec::new();
        for (i, (kind, body)) in chunks.iter().enumerate() {
            let batch = Batch {
                index: u32::try_from(i).expect("bug: 2³² checkpoint chunks"),
                end: i + 1 == chunks.len(),
            };
            frame_into(&mut frame, salt, seq, term, *kind, batch, body);
            out.push(&frame)?;
        }
        out.flush()
    })?;
    Ok(file_bytes)
}

/// Where a frame stands in its group-commit batch.
#[derive(Clone, Copy)]
struct Batch {
    index: u32,
    end: bool,
}

/// Frames `body` into `frame` (cleared first).
fn frame_into(
    frame: &mut Vec<u8>,
    salt: u64,
    seq: u64,
    term: u64,
    kind: u8,
    batch: Batch,
    body: &[u8],
) {
    frame.clear();
    frame.resize(FRAME_HEADER_BYTES, 0);
    frame.extend_from_slice(body);
    let header = FrameHeader {
        body_len: 0,
        seq,
        term,
        kind,
        flags: if batch.end { FRAME_FLAG_BATCH_END } else { 0 },
        batch_index: batch.index,
    };
    FrameHeader::seal(frame, salt, header);
}

/// A frame made anew (an upgrade re-frames format-1 records, a replica
/// re-frames the records of a snapshot under its own salt): the body
/// framed with `seq`, `term` and `kind` as one complete batch of its own.
pub(crate) fn frame(salt: u64, seq: u64, term: u64, kind: u8, body: &[u8]) -> Vec<u8> {
    let mut frame = Vec::new();
    let whole = Batch {
        index: 0,
        end: true,
    };
    frame_into(&mut frame, salt, seq, term, kind, whole, body);
    frame
}
