//! Repair: move what is damaged aside, keep every good record.
//!
//! `spoold journal repair --dir D` (and start-up with
//! `on_corruption = "quarantine"`) runs [`repair`]: for every damaged span it
//! copies the bytes to a quarantine file beside the journal
//! (`<segment>.seg.<offset>.quarantine`, fsynced), then rewrites the segment
//! without them (temp file, fsync, rename, directory fsync). A segment whose
//! header is damaged is moved aside whole. Gaps that damage leaves in the
//! sequence or the segment ids are declared in the headers (the segment
//! before a gap is flagged compacted; the segment after a missing range
//! "covers" it), so the repaired journal replays cleanly.
//!
//! The spool's identity (`spool.meta`) is never touched, and no good record
//! is ever dropped: a record is dropped only if its checksum fails or the
//! caller's `body_ok` says it cannot be decoded.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::JournalError;
use super::format::{
    FRAME_HEADER_BYTES, FrameHeader, RECORD_BODY_MAX_BYTES, SEGMENT_FLAG_COMPACTED,
    SEGMENT_HEADER_BYTES, SegmentHeader, segment_file_name,
};
use super::load_identity;
use super::scan::{Problem, all_zero, resync, scan_dir};
use super::storage::Storage;

/// Most passes `repair` makes; each fixes what the previous scan found.
const REPAIR_PASSES_MAX: usize = 4;

/// What `repair` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// Quarantine files written, with the bytes each holds.
    pub quarantined: Vec<(PathBuf, u64)>,
    /// Segments rewritten.
    pub rewritten: Vec<u64>,
    /// Problems found before repairing, as `verify` would print them.
    pub problems: Vec<String>,
    /// Good records kept across the rewritten segments.
    pub records_kept: u64,
}

/// Repairs the journal in `dir`. `body_ok(kind, body)` tells whether a
/// record that passes its checksum can be decoded; one that cannot is
/// quarantined too.
pub fn repair(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    body_ok: &dyn Fn(u8, &[u8]) -> bool,
) -> Result<RepairReport, JournalError> {
    let mut report = RepairReport::default();
    let Some(identity) = load_identity(storage, dir, false)? else {
        return Ok(report);
    };
    let salt = identity.salt;
    for _ in 0..REPAIR_PASSES_MAX {
        let mut undecodable: Vec<(u64, u64)> = Vec::new();
        let summary = scan_dir(storage, dir, salt, |rec| {
            if !body_ok(rec.kind, rec.body) {
                undecodable.push((rec.segment_id, rec.offset));
            }
            Ok(())
        })?;
        if summary.problems.is_empty() && undecodable.is_empty() {
            return Ok(report);
        }
        for p in &summary.problems {
            let (file, offset) = p.location(dir);
            report.problems.push(format!(
                "{} offset {offset}: {}",
                file.display(),
                p.reason()
            ));
        }
        // Segments to rewrite, and header changes the gaps need.
        let mut damaged: Vec<u64> = undecodable.iter().map(|u| u.0).collect();
        let mut flag_compacted: Vec<u64> = Vec::new();
        let mut covers: Vec<(u64, u64)> = Vec::new();
        let ids = &summary.segment_ids;
        for p in &summary.problems {
            match p {
                Problem::BadSpan { segment_id, .. } => damaged.push(*segment_id),
                Problem::BadHeader { segment_id, .. } => {
                    let from = dir.join(segment_file_name(*segment_id));
                    let to = quarantine_path(dir, *segment_id, 0);
                    let len = storage
                        .open(&from)
                        .and_then(|f| f.size_bytes())
                        .map_err(|e| JournalError::io(&from, e))?;
                    storage
                        .rename(&from, &to)
                        .and_then(|()| storage.sync_dir(dir))
                        .map_err(|e| JournalError::io(&from, e))?;
                    report.quarantined.push((to, len));
                }
                Problem::MissingSegments { first, last } => {
                    if let Some(&next) = ids.iter().find(|&&id| id > *last) {
                        covers.push((next, *first));
                    }
                }
                Problem::SequenceGap { segment_id, .. } => {
                    if let Some(&prev) = ids.iter().rev().find(|&&id| id < *segment_id) {
                        flag_compacted.push(prev);
                    }
                }
            }
        }
        damaged.sort_unstable();
        damaged.dedup();
        let mut touched: Vec<u64> = damaged
            .iter()
            .chain(&flag_compacted)
            .chain(covers.iter().map(|c| &c.0))
            .copied()
            .collect();
        touched.sort_unstable();
        touched.dedup();
        for id in touched {
            let path = dir.join(segment_file_name(id));
            if storage.open(&path).is_err() {
                continue; // moved aside above
            }
            let drop_at: Vec<u64> = undecodable
                .iter()
                .filter(|u| u.0 == id)
                .map(|u| u.1)
                .collect();
            let cover = covers.iter().find(|c| c.0 == id).map(|c| c.1);
            let kept = rewrite_segment(storage, dir, salt, id, &drop_at, cover, &mut report)?;
            report.records_kept += kept;
            report.rewritten.push(id);
        }
    }
    Err(JournalError::Corrupt {
        dir: dir.to_path_buf(),
        file: dir.to_path_buf(),
        offset: 0,
        reason: format!("still damaged after {REPAIR_PASSES_MAX} repair passes"),
    })
}

fn quarantine_path(dir: &Path, segment_id: u64, offset: u64) -> PathBuf {
    dir.join(format!(
        "{}.{offset}.quarantine",
        segment_file_name(segment_id)
    ))
}

/// Rewrites segment `id` keeping every valid frame except those at
/// `drop_at`; every other byte run goes to a quarantine file. The result is
/// flagged compacted (its sequence numbers may now skip). Returns the frames
/// kept.
fn rewrite_segment(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    id: u64,
    drop_at: &[u64],
    covers_from: Option<u64>,
    report: &mut RepairReport,
) -> Result<u64, JournalError> {
    let path = dir.join(segment_file_name(id));
    let file = storage
        .open(&path)
        .map_err(|e| JournalError::io(&path, e))?;
    let mut buf = Vec::new();
    file.read_all(&mut buf)
        .map_err(|e| JournalError::io(&path, e))?;
    let header = SegmentHeader::decode(&buf, salt, id).map_err(|p| JournalError::Corrupt {
        dir: dir.to_path_buf(),
        file: path.clone(),
        offset: 0,
        reason: p.to_string(),
    })?;
    let header = SegmentHeader {
        flags: header.flags | SEGMENT_FLAG_COMPACTED,
        covers_from: covers_from.map_or(header.covers_from, |c| {
            u32::try_from(c).expect("bug: segment id overflows u32")
        }),
        ..header
    };
    let mut out = header.encode().to_vec();
    let mut kept = 0u64;
    let mut off = SEGMENT_HEADER_BYTES;
    let mut last_seq = 0u64;
    while off < buf.len() && !all_zero(&buf[off..]) {
        let good = frame_len_at(&buf, off, salt).filter(|_| !drop_at.contains(&(off as u64)));
        match good {
            Some(len) => {
                last_seq = FrameHeader::peek(&buf[off..]).seq;
                out.extend_from_slice(&buf[off..off + len]);
                kept += 1;
                off += len;
            }
            None => {
                let end = match frame_len_at(&buf, off, salt) {
                    // An undecodable but intact frame: exactly that frame.
                    Some(len) => off + len,
                    None => resync(&buf, off + 1, salt, last_seq + 1).unwrap_or_else(|| {
                        buf.iter().rposition(|&b| b != 0).map_or(off, |p| p + 1)
                    }),
                };
                let qpath = quarantine_path(dir, id, off as u64);
                let qfile = storage
                    .create(&qpath)
                    .map_err(|e| JournalError::io(&qpath, e))?;
                qfile
                    .write_all_at(&buf[off..end], 0)
                    .and_then(|()| qfile.sync_data())
                    .map_err(|e| JournalError::io(&qpath, e))?;
                report.quarantined.push((qpath, (end - off) as u64));
                off = end;
            }
        }
    }
    storage
        .sync_dir(dir)
        .map_err(|e| JournalError::io(dir, e))?;
    let tmp = dir.join(format!("{}.repair.tmp", segment_file_name(id)));
    let _ = storage.remove(&tmp);
    let tmp_file = storage
        .create(&tmp)
        .map_err(|e| JournalError::io(&tmp, e))?;
    tmp_file
        .write_all_at(&out, 0)
        .and_then(|()| tmp_file.sync_data())
        .and_then(|()| storage.rename(&tmp, &path))
        .and_then(|()| storage.sync_dir(dir))
        .map_err(|e| JournalError::io(&path, e))?;
    Ok(kept)
}

/// The length of the intact frame at `off`, if there is one.
fn frame_len_at(buf: &[u8], off: usize, salt: u64) -> Option<usize> {
    if buf.len() - off < FRAME_HEADER_BYTES {
        return None;
    }
    let h = FrameHeader::peek(&buf[off..]);
    let len = FRAME_HEADER_BYTES + h.body_len as usize;
    (h.body_len as usize <= RECORD_BODY_MAX_BYTES
        && off + len <= buf.len()
        && FrameHeader::verify(&buf[off..off + len], salt))
    .then_some(len)
}
