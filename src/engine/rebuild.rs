//! Rebuilding a journal from a replayed state, offline: the upgrade of a
//! format-1 spool, and the repair of a damaged one.
//!
//! Both end the same way ([`write_out`]): every payload record the state
//! points at is copied into new packs (as many as [`PackLayout`] needs,
//! however large the spool), a checkpoint of the state is
//! written beside it, and only then is every older file deleted. The
//! checkpoint's rename is the moment the new journal takes over: a crash
//! before it leaves the old files as they were (the new pack is an orphan
//! that start-up deletes), a crash after it leaves old files that start-up
//! recognises as obsolete (`journal::scan::obsolete_files`) and deletes
//! before it reads anything.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::checkpoint::load_checkpoint;
use crate::journal::atomic::{AtomicWriteError, remove_files, write_atomically};
use crate::journal::files::{PackLayout, write_checkpoint, write_pack};
use crate::journal::format::{
    FileId, PackHeader, SpoolIdentity, checkpoint_file_name, pack_file_name, segment_file_name,
};
use crate::journal::frames::frame_at;
use crate::journal::scan::{self, Listing, Problem, ScanSummary, list_files, scan_dir};
use crate::journal::storage::Storage;
use crate::journal::{JournalError, RecordLoc, v1};
use crate::spool::checkpoint::LocUse;
use crate::spool::{CheckpointLoader, CheckpointMeta, Record, Spool};

/// What an upgrade or a repair did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RebuildReport {
    /// Records read (and applied) from the old journal.
    pub records: u64,
    /// Messages in the rebuilt spool.
    pub messages: usize,
    /// Packs written (as many as `PackLayout` lays the records into).
    pub packs: u64,
    /// Problems found, as `verify` prints them.
    pub problems: Vec<String>,
    /// Quarantine files written, with the bytes each holds.
    pub quarantined: Vec<(PathBuf, u64)>,
    /// Messages whose payload record was damaged, and parts of a damaged
    /// checkpoint that could not be read: lost.
    pub lost: Vec<String>,
}

/// True when `dir` holds a format-1 journal (segments in format 1 and no
/// checkpoint).
pub(crate) fn needs_upgrade(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    _salt: u64,
) -> Result<bool, JournalError> {
    let listing = list_files(storage.as_ref(), dir)?;
    if !listing.checkpoints.is_empty() {
        return Ok(false);
    }
    for &id in &listing.segments {
        if v1::is_old_header(&scan::read_header(storage.as_ref(), dir, id)?.0) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Replays a format-1 journal and writes it out as format 2.
pub(crate) fn upgrade(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    identity: &SpoolIdentity,
) -> Result<RebuildReport, JournalError> {
    let salt = identity.salt;
    let mut spool = Spool::new();
    let summary = v1::read(storage, dir, salt, |rec| {
        let record = Record::decode(rec.kind, rec.body).map_err(|e| JournalError::BadRecord {
            file: dir.join(segment_file_name(rec.segment_id)),
            offset: rec.offset,
            reason: e.to_string(),
        })?;
        let loc = RecordLoc {
            file: FileId::Segment(rec.segment_id).to_loc(),
            offset: rec.offset as u32,
            len: rec.frame_len as u32,
        };
        spool.apply_upgrading(&record, rec.seq, loc);
        Ok(())
    })?;
    spool.raise_next_message_id(summary.id_floor);
    spool.raise_applied_seq(summary.last_seq);
    let next_segment_id = summary.segment_ids.last().map_or(1, |id| id + 1);
    let reframe = Reframe {
        len_added: v1::FRAME_HEADER_GROWTH,
        read: &|loc: RecordLoc| -> std::io::Result<Vec<u8>> {
            let raw = read_at(storage, dir, loc)?;
            v1::reframe(&raw, salt).ok_or_else(|| {
                std::io::Error::other(format!(
                    "format-1 record at {} offset {} is damaged",
                    FileId::from_loc(loc.file).file_name(),
                    loc.offset
                ))
            })
        },
    };
    let packs = write_out(storage, dir, identity, &spool, next_segment_id, 1, &reframe)?;
    Ok(RebuildReport {
        records: summary.records,
        messages: spool.message_count(),
        packs,
        ..RebuildReport::default()
    })
}

/// Repairs a damaged journal: copies every damaged span to a quarantine
/// file, replays every good record (and what can be read of a damaged
/// checkpoint), drops messages whose payload record is damaged, and writes
/// the result out as a fresh checkpoint and pack.
pub fn repair(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    identity: &SpoolIdentity,
) -> Result<RebuildReport, JournalError> {
    let mut report = RebuildReport::default();
    let listing = list_files(storage.as_ref(), dir)?;
    let (mut spool, meta) = newest_checkpoint(storage, dir, identity, &listing, &mut report)?;
    let checkpoint_seq = meta.as_ref().map_or(0, |m| m.seq);
    let summary = apply_good_records(
        storage,
        dir,
        identity.salt,
        checkpoint_seq,
        &mut spool,
        &mut report,
    )?;
    quarantine_problems(storage, dir, &summary.problems, &mut report)?;
    spool.raise_applied_seq(summary.last_seq);
    drop_unreadable(storage, dir, identity.salt, &mut spool, &mut report);
    let next = NextIds::after(&listing, meta.as_ref());
    let copy = Reframe {
        len_added: 0,
        read: &|loc: RecordLoc| read_at(storage, dir, loc),
    };
    report.packs = write_out(
        storage,
        dir,
        identity,
        &spool,
        next.segment_id,
        next.pack_id,
        &copy,
    )?;
    report.messages = spool.message_count();
    Ok(report)
}

/// The newest checkpoint's state, whole or what is left of it (see
/// [`salvage_damaged_checkpoint`]), and its first chunk if that could be read.
/// Without a checkpoint: a new spool.
fn newest_checkpoint(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    identity: &SpoolIdentity,
    listing: &Listing,
    report: &mut RebuildReport,
) -> Result<(Spool, Option<CheckpointMeta>), JournalError> {
    let Some(&seq) = listing.checkpoints.last() else {
        return Ok((Spool::new(), None));
    };
    match load_checkpoint(storage, dir, identity, seq) {
        Ok((spool, meta, _)) => Ok((spool, Some(meta))),
        Err(JournalError::Corrupt { reason, .. } | JournalError::BadRecord { reason, .. }) => {
            salvage_damaged_checkpoint(storage, dir, identity.salt, seq, &reason, report)
        }
        Err(other) => Err(other),
    }
}

/// A damaged checkpoint: copied whole to a quarantine file, then read
/// leniently, chunk by chunk. Every chunk that cannot be read is reported
/// lost.
fn salvage_damaged_checkpoint(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    seq: u64,
    reason: &str,
    report: &mut RebuildReport,
) -> Result<(Spool, Option<CheckpointMeta>), JournalError> {
    let name = checkpoint_file_name(seq);
    report.problems.push(format!("{name}: {reason}"));
    report
        .quarantined
        .push(quarantine_whole(storage, dir, &name)?);
    let mut loader = CheckpointLoader::lenient();
    scan::salvage_checkpoint(storage, dir, salt, seq, |kind, body| {
        let _ = loader.chunk(kind, body);
    })?;
    let (spool, meta, skipped) = loader.finish_lenient();
    report
        .lost
        .extend(skipped.into_iter().map(|s| format!("checkpoint {s}")));
    Ok((spool, meta))
}

/// Applies every good record after the checkpoint to `spool`, gaps and
/// all: a repair keeps what can be kept. A record that does not decode is
/// reported and skipped.
fn apply_good_records(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    checkpoint_seq: u64,
    spool: &mut Spool,
    report: &mut RebuildReport,
) -> Result<ScanSummary, JournalError> {
    scan_dir(storage, dir, salt, checkpoint_seq, |rec| {
        if !rec.applies || rec.seq <= spool.applied_seq() {
            return Ok(());
        }
        let Ok(record) = Record::decode(rec.kind, rec.body) else {
            report.problems.push(format!(
                "{} offset {}: undecodable record",
                rec.file.file_name(),
                rec.offset
            ));
            return Ok(());
        };
        let loc = RecordLoc {
            file: rec.file.to_loc(),
            offset: rec.offset as u32,
            len: rec.frame_len as u32,
        };
        spool.apply_upgrading(&record, rec.seq, loc);
        report.records += 1;
        Ok(())
    })
}

/// Reports every problem the scan found, and copies its damaged bytes to a
/// quarantine file: a bad span, or the whole file when its header is bad.
/// The other problems have no bytes of their own to keep.
fn quarantine_problems(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    problems: &[Problem],
    report: &mut RebuildReport,
) -> Result<(), JournalError> {
    for problem in problems {
        let (file, offset) = problem.location(dir);
        report.problems.push(format!(
            "{} offset {offset}: {}",
            file.display(),
            problem.reason()
        ));
        match problem {
            Problem::BadSpan {
                file, start, end, ..
            } => report.quarantined.push(quarantine_span(
                storage,
                dir,
                &file.file_name(),
                *start,
                *end,
            )?),
            Problem::BadHeader { path, .. } => {
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                report
                    .quarantined
                    .push(quarantine_whole(storage, dir, &name)?);
            }
            Problem::BadCheckpoint { .. }
            | Problem::MissingSegments { .. }
            | Problem::SequenceGap { .. } => {}
        }
    }
    Ok(())
}

/// Messages whose records cannot be read back are lost; say which. A
/// message whose newest attempt record is unreadable only loses its
/// attempts.
fn drop_unreadable(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    spool: &mut Spool,
    report: &mut RebuildReport,
) {
    let mut unreadable = Vec::new();
    {
        let mut probe = |u: LocUse<'_>| {
            if read_at(storage, dir, u.loc)
                .ok()
                .is_none_or(|frame| frame_at(&frame, 0, salt).is_err())
            {
                unreadable.push((u.queue.to_owned(), u.id, u.attempts));
            }
            u.loc
        };
        spool.encode_checkpoint(&CheckpointMeta::default(), &mut probe);
    }
    for (queue, id, attempts) in unreadable {
        if attempts {
            spool.forget_attempts(&queue, id);
        } else {
            spool.drop_message(&queue, id);
            report
                .lost
                .push(format!("message {} of queue {queue}", id.0));
        }
    }
}

/// The ids the rebuilt journal goes on from: past every file on disk, and
/// never below what the checkpoint recorded (files deleted since leave
/// nothing to count from).
struct NextIds {
    segment_id: u64,
    pack_id: u64,
}

impl NextIds {
    fn after(listing: &Listing, meta: Option<&CheckpointMeta>) -> NextIds {
        NextIds {
            segment_id: listing
                .segments
                .last()
                .map_or(1, |id| id + 1)
                .max(meta.map_or(1, |m| m.next_segment_id)),
            pack_id: listing
                .packs
                .last()
                .map_or(1, |id| id + 1)
                .max(meta.map_or(1, |m| m.next_pack_id)),
        }
    }
}

/// Reads the bytes at a record location, by path.
fn read_at(storage: &Arc<dyn Storage>, dir: &Path, loc: RecordLoc) -> std::io::Result<Vec<u8>> {
    let path = dir.join(FileId::from_loc(loc.file).file_name());
    let file = storage.open(&path)?;
    let mut frame = vec![0u8; loc.len as usize];
    file.read_exact_at(&mut frame, u64::from(loc.offset))?;
    Ok(frame)
}

fn quarantine_name(name: &str, offset: u64) -> String {
    format!("{name}.{offset}.quarantine")
}

/// Copies bytes `[start, end)` of `name` to a quarantine file (fsynced).
fn quarantine_span(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    name: &str,
    start: u64,
    end: u64,
) -> Result<(PathBuf, u64), JournalError> {
    let from = dir.join(name);
    let mut bytes = vec![0u8; (end - start) as usize];
    storage
        .open(&from)
        .and_then(|f| f.read_exact_at(&mut bytes, start))
        .map_err(|e| JournalError::io(&from, e))?;
    let to = quarantine_name(name, start);
    write_atomically(storage, dir, &to, |f| f.write_all_at(&bytes, 0))
        .map_err(AtomicWriteError::into_inner)?;
    Ok((dir.join(to), bytes.len() as u64))
}

/// Copies a whole file to a quarantine file (offset 0).
fn quarantine_whole(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    name: &str,
) -> Result<(PathBuf, u64), JournalError> {
    let path = dir.join(name);
    let len = storage
        .open(&path)
        .and_then(|f| f.size_bytes())
        .map_err(|e| JournalError::io(&path, e))?;
    quarantine_span(storage, dir, name, 0, len)
}

/// How [`write_out`] gets each payload record in this format: read (and
/// re-framed), and how much longer than its old location says it is.
struct Reframe<'a> {
    len_added: u32,
    read: &'a dyn Fn(RecordLoc) -> std::io::Result<Vec<u8>>,
}

/// Writes `spool` out as packs (every payload record it points at, read
/// through `reframe`, laid out from pack `first_pack` on by [`PackLayout`])
/// and a checkpoint, then deletes every other journal file.
fn write_out(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    identity: &SpoolIdentity,
    spool: &Spool,
    next_segment_id: u64,
    first_pack: u64,
    reframe: &Reframe<'_>,
) -> Result<u64, JournalError> {
    let salt = identity.salt;
    let seq = spool.applied_seq();
    let meta = CheckpointMeta {
        seq,
        next_segment_id,
        next_pack_id: first_pack,
        salt,
        token_key: identity.token_key,
        files: Vec::new(),
    };
    let (moves, chunks) = lay_out(spool, meta, reframe);
    let mut keep = vec![checkpoint_file_name(seq)];
    write_packs(storage, dir, salt, seq, &moves, reframe, &mut keep)?;
    write_checkpoint(storage, dir, salt, seq, 0, &chunks).map_err(AtomicWriteError::into_inner)?;
    remove_obsolete(storage, dir, &keep)?;
    Ok(keep.len() as u64 - 1)
}

/// A record copied: the pack it goes to, where it is now, where it goes.
type Move = (u64, RecordLoc, RecordLoc);

/// Lays out every payload record `spool` points at into packs, from pack
/// `meta.next_pack_id` on, and encodes the checkpoint that points at
/// where they go: each record copied, in the order the packs hold them,
/// and the checkpoint's chunks.
fn lay_out(
    spool: &Spool,
    mut meta: CheckpointMeta,
    reframe: &Reframe<'_>,
) -> (Vec<Move>, Vec<(u8, Vec<u8>)>) {
    let first_pack = meta.next_pack_id;
    let mut moves: Vec<Move> = Vec::new();
    let mut placed: HashMap<RecordLoc, RecordLoc> = HashMap::new();
    let mut layout = PackLayout::new();
    let mut relocate = |u: LocUse<'_>| {
        *placed.entry(u.loc).or_insert_with(|| {
            let len = u.loc.len + reframe.len_added;
            let (index, offset) = layout.place(len);
            let pack = first_pack + index;
            let to = RecordLoc {
                file: FileId::Pack(pack).to_loc(),
                offset,
                len,
            };
            moves.push((pack, u.loc, to));
            to
        })
    };
    // The checkpoint names the next free pack id, known only once the
    // layout is done: a first pass lays the records out, the second
    // encodes the checkpoint with it.
    spool.encode_checkpoint(&meta, &mut relocate);
    meta.next_pack_id = moves.last().map_or(first_pack, |last| last.0 + 1);
    let chunks = spool.encode_checkpoint(&meta, &mut |u: LocUse<'_>| placed[&u.loc]);
    (moves, chunks)
}

/// Writes the packs `moves` lays out, each record read through `reframe`,
/// and adds the name of each to `keep`.
fn write_packs(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    seq: u64,
    moves: &[Move],
    reframe: &Reframe<'_>,
    keep: &mut Vec<String>,
) -> Result<(), JournalError> {
    // The layout fills one pack after the other: each run of moves is one.
    for pack in moves.chunk_by(|a, b| a.0 == b.0) {
        let pack_id = pack[0].0;
        let frames = pack.iter().map(|(_, from, to)| {
            let frame = (reframe.read)(*from)?;
            if frame.len() != to.len as usize {
                // Anything else would misplace every record after it.
                return Err(std::io::Error::other(format!(
                    "the record at {} offset {} read back {} bytes, not {}",
                    FileId::from_loc(from.file).file_name(),
                    from.offset,
                    frame.len(),
                    to.len
                )));
            }
            Ok(frame)
        });
        write_pack(
            storage,
            dir,
            salt,
            PackHeader {
                pack_id,
                checkpoint_seq: seq,
            },
            frames,
        )
        .map_err(AtomicWriteError::into_inner)?;
        keep.push(pack_file_name(pack_id));
    }
    Ok(())
}

/// Deletes every journal file of `dir` (segment, pack, checkpoint) not
/// named in `keep`.
fn remove_obsolete(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    keep: &[String],
) -> Result<(), JournalError> {
    let listing = list_files(storage.as_ref(), dir)?;
    let obsolete: Vec<String> = listing
        .segments
        .iter()
        .map(|&id| segment_file_name(id))
        .chain(listing.packs.iter().map(|&id| pack_file_name(id)))
        .chain(listing.checkpoints.iter().map(|&s| checkpoint_file_name(s)))
        .filter(|name| !keep.contains(name))
        .collect();
    remove_files(storage, dir, &obsolete)?;
    Ok(())
}
