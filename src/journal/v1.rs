//! Reading format 1 (spools written before checkpoints), only to upgrade
//! them: `Engine::open` and `spoold journal upgrade` replay a format-1
//! journal through this module and write it out again as a checkpoint and
//! a pack (`engine::rebuild`).
//!
//! Format 1 (the layout is in `docs/journal-format.md`, "Format 1"):
//! segments with a 64-byte header (magic, version 1, flags, salt, id, first
//! sequence number, compaction watermark, message-id floor, "covers from",
//! CRC) and 20-byte frame headers (length, CRC, sequence number, kind, three
//! zero bytes). A merged segment "covers" the ids below it down to its
//! `covers_from`; those are skipped. Reading is strict: a damaged record is
//! an error (repair the spool with the release that wrote it), except a
//! torn final write, which was never acknowledged.

use std::path::Path;
use std::sync::Arc;

use crc32c::{crc32c, crc32c_append};

use super::error::JournalError;
use super::format::{SEGMENT_MAGIC, le_u32, le_u64, segment_file_name};
use super::scan::list_files;
use super::storage::Storage;

const HEADER_BYTES: usize = 64;
const FRAME_HEADER_BYTES: usize = 20;
/// A re-framed record is this much longer in format 2.
pub(crate) const FRAME_HEADER_GROWTH: u32 =
    (super::format::FRAME_HEADER_BYTES - FRAME_HEADER_BYTES) as u32;
const VERSION: u32 = 1;

/// One format-1 record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OldRecord<'a> {
    pub segment_id: u64,
    /// Offset of the frame in its segment, and the frame's length.
    pub offset: u64,
    pub frame_len: u64,
    pub seq: u64,
    pub kind: u8,
    pub body: &'a [u8],
}

/// What reading a format-1 journal found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct OldSummary {
    /// Every segment file (covered ones included): all of them go once the
    /// upgrade is in place.
    pub segment_ids: Vec<u64>,
    pub records: u64,
    pub last_seq: u64,
    /// The highest message-id floor a header carries.
    pub id_floor: u64,
}

struct OldHeader {
    first_seq: u64,
    id_floor: u64,
    covers_from: u64,
}

fn decode_header(bytes: &[u8], salt: u64, id: u64) -> Option<OldHeader> {
    if bytes.len() < HEADER_BYTES
        || &bytes[0..8] != SEGMENT_MAGIC
        || crc32c(&bytes[..60]) != le_u32(&bytes[60..64])
        || le_u32(&bytes[8..12]) != VERSION
        || le_u64(&bytes[16..24]) != salt
        || le_u64(&bytes[24..32]) != id
    {
        return None;
    }
    let covers = u64::from(le_u32(&bytes[56..60]));
    Some(OldHeader {
        first_seq: le_u64(&bytes[32..40]),
        id_floor: le_u64(&bytes[48..56]),
        covers_from: if covers == 0 { id } else { covers },
    })
}

fn frame_ok(frame: &[u8], salt: u64) -> bool {
    let crc = crc32c(&salt.to_le_bytes());
    let crc = crc32c_append(crc, &frame[0..4]);
    let crc = crc32c_append(crc, &frame[8..FRAME_HEADER_BYTES]);
    let crc = crc32c_append(crc, &frame[FRAME_HEADER_BYTES..]);
    crc == le_u32(&frame[4..8]) && frame[17..20] == [0, 0, 0]
}

/// Re-frames a format-1 frame in format 2 (same sequence number, kind and
/// body), for the pack an upgrade writes. `None` if it is not an intact
/// format-1 frame.
pub(crate) fn reframe(frame: &[u8], salt: u64) -> Option<Vec<u8>> {
    if frame.len() < FRAME_HEADER_BYTES
        || le_u32(&frame[0..4]) as usize != frame.len() - FRAME_HEADER_BYTES
        || !frame_ok(frame, salt)
    {
        return None;
    }
    Some(super::files::frame(
        salt,
        le_u64(&frame[8..16]),
        0,
        frame[16],
        &frame[FRAME_HEADER_BYTES..],
    ))
}

/// True when `bytes` start with a format-1 segment header.
pub(crate) fn is_old_header(bytes: &[u8]) -> bool {
    bytes.len() >= HEADER_BYTES
        && &bytes[0..8] == SEGMENT_MAGIC
        && crc32c(&bytes[..60]) == le_u32(&bytes[60..64])
        && le_u32(&bytes[8..12]) == VERSION
}

/// Reads every record of the format-1 journal in `dir`, in order.
pub(crate) fn read(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    mut visit: impl FnMut(OldRecord<'_>) -> Result<(), JournalError>,
) -> Result<OldSummary, JournalError> {
    let ids = list_files(storage.as_ref(), dir)?.segments;
    let mut summary = OldSummary {
        segment_ids: ids.clone(),
        ..OldSummary::default()
    };
    let files = read_segments(storage.as_ref(), dir, &ids)?;
    let headers = decode_headers(dir, &files, salt)?;
    let covered = |id: u64| {
        ids.iter().zip(&headers).any(|(&other, h)| {
            h.as_ref()
                .is_some_and(|h| h.covers_from <= id && id < other)
        })
    };
    for (i, ((id, buf), header)) in files.iter().zip(&headers).enumerate() {
        let Some(header) = header else { continue };
        if covered(*id) {
            continue;
        }
        summary.id_floor = summary.id_floor.max(header.id_floor);
        summary.last_seq = summary.last_seq.max(header.first_seq.saturating_sub(1));
        let is_last = i + 1 == files.len();
        read_frames(dir, *id, buf, salt, is_last, &mut summary, &mut visit)?;
    }
    Ok(summary)
}

/// The bytes of each segment `ids` names, whole.
fn read_segments(
    storage: &dyn Storage,
    dir: &Path,
    ids: &[u64],
) -> Result<Vec<(u64, Vec<u8>)>, JournalError> {
    let mut files = Vec::new();
    for &id in ids {
        let path = dir.join(segment_file_name(id));
        let mut buf = Vec::new();
        super::scan::read_whole(storage, &path, &mut buf)?;
        files.push((id, buf));
    }
    Ok(files)
}

/// The header of each segment of `files`: `None` for an empty last one (a
/// rotation cut short), any other bad header an error.
fn decode_headers(
    dir: &Path,
    files: &[(u64, Vec<u8>)],
    salt: u64,
) -> Result<Vec<Option<OldHeader>>, JournalError> {
    let mut headers = Vec::new();
    for (i, (id, buf)) in files.iter().enumerate() {
        match decode_header(buf, salt, *id) {
            Some(h) => headers.push(Some(h)),
            // A rotation cut short: an empty last segment.
            None if i + 1 == files.len() && buf.len() <= HEADER_BYTES => headers.push(None),
            None => return Err(corrupt(dir, *id, 0, "bad segment header")),
        }
    }
    Ok(headers)
}

/// Visits each record of segment `id` (its bytes `buf`), counting them
/// in `summary`: a damaged one is an error, except a torn final write in
/// the last segment (`is_last`), which ends it.
fn read_frames(
    dir: &Path,
    id: u64,
    buf: &[u8],
    salt: u64,
    is_last: bool,
    summary: &mut OldSummary,
    visit: &mut impl FnMut(OldRecord<'_>) -> Result<(), JournalError>,
) -> Result<(), JournalError> {
    let mut off = HEADER_BYTES;
    while off + FRAME_HEADER_BYTES <= buf.len() {
        if buf[off..].iter().all(|&b| b == 0) {
            break;
        }
        let len = FRAME_HEADER_BYTES + le_u32(&buf[off..off + 4]) as usize;
        if off + len > buf.len() || !frame_ok(&buf[off..off + len], salt) {
            if is_last {
                break; // a torn final write
            }
            return Err(corrupt(dir, id, off, "damaged record"));
        }
        let seq = le_u64(&buf[off + 8..off + 16]);
        visit(OldRecord {
            segment_id: id,
            offset: off as u64,
            frame_len: len as u64,
            seq,
            kind: buf[off + 16],
            body: &buf[off + FRAME_HEADER_BYTES..off + len],
        })?;
        summary.records += 1;
        summary.last_seq = summary.last_seq.max(seq);
        off += len;
    }
    Ok(())
}

/// A format-1 segment found damaged at `offset`: `reason`, and what to do.
fn corrupt(dir: &Path, id: u64, offset: usize, reason: &str) -> JournalError {
    JournalError::Corrupt {
        dir: dir.to_path_buf(),
        file: dir.join(segment_file_name(id)),
        offset: offset as u64,
        reason: format!(
            "{reason} in a format-1 segment; repair it with the spoold release that wrote it, then upgrade"
        ),
    }
}
