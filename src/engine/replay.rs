//! Replay: the state a spool directory holds, read at start-up (`open.rs`).
//!
//! Replay is the newest checkpoint plus every record after it, applied in
//! sequence order (`Spool::apply` asserts there is no gap). Records at or
//! before the checkpoint are still read and checked — a damaged byte
//! anywhere is found at start-up, not when a consumer asks for it — but
//! never applied: the checkpoint already holds their effect.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::thread::{Scope, ScopedJoinHandle};

use super::checkpoint::{decode_checkpoint, read_checkpoint};
use crate::journal::atomic::remove_files;
use crate::journal::format::{FileId, SpoolIdentity};
use crate::journal::scan::{
    self, CheckpointBytes, CheckpointInfo, Listing, ScanSummary, ScannedRecord, list_files,
    scan_dir,
};
use crate::journal::storage::Storage;
use crate::journal::{JournalError, RecordLoc};
use crate::spool::{CheckpointMeta, Record, Spool};

/// The state a directory replays to, and what was found on the way.
pub(super) struct Loaded {
    pub spool: Spool,
    pub meta: CheckpointMeta,
    pub checkpoint: Option<CheckpointInfo>,
    /// The replica set the checkpoint holds (replicated mode).
    pub checkpoint_cluster_config: Option<Vec<u8>>,
    pub summary: ScanSummary,
    /// Records applied after the checkpoint.
    pub applied: u64,
    /// Replicated mode: `(term, kind, location)` of every record of the
    /// live log, applied or not.
    pub live: Vec<(u64, u8, RecordLoc)>,
}

/// Loads the newest checkpoint, deletes files it made obsolete, and replays
/// the records after it (in replicated mode, only up to `up_to`: the
/// last record known committed). Corruption is an error (`Corrupt` or
/// `BadRecord`).
pub(super) fn load(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    identity: &SpoolIdentity,
    up_to: Option<u64>,
) -> Result<Loaded, JournalError> {
    let listing = list_files(storage.as_ref(), dir)?;
    let (bytes, meta) = newest_checkpoint(storage, dir, identity, &listing)?;
    remove_obsolete(storage, dir, identity.salt, &listing, &meta)?;
    let scanned = scan_and_apply(storage, dir, identity, bytes.as_ref(), meta.seq, up_to)?;
    let checkpoint = bytes.map(|bytes| bytes.info);
    check_damage(dir, &scanned, checkpoint.is_some())?;
    check_complete(dir, &scanned, meta.seq)?;
    Ok(Loaded {
        spool: scanned.spool,
        meta,
        checkpoint,
        checkpoint_cluster_config: scanned.cluster_config,
        summary: scanned.summary,
        applied: scanned.progress.applied,
        live: scanned.progress.live,
    })
}

/// The newest checkpoint's bytes (every frame checked; decoding waits for
/// the scan to start) and its first chunk: what the journal looked like.
/// Without a checkpoint: an empty journal with this spool's identity.
fn newest_checkpoint(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    identity: &SpoolIdentity,
    listing: &Listing,
) -> Result<(Option<CheckpointBytes>, CheckpointMeta), JournalError> {
    match listing.checkpoints.last() {
        Some(&seq) => {
            let (bytes, meta) = read_checkpoint(storage, dir, identity, seq)?;
            Ok((Some(bytes), meta))
        }
        None => Ok((
            None,
            CheckpointMeta {
                seq: 0,
                next_segment_id: 1,
                next_pack_id: 1,
                salt: identity.salt,
                token_key: identity.token_key,
                files: Vec::new(),
            },
        )),
    }
}

/// Deletes what a compaction (or upgrade, or repair) that finished its
/// checkpoint but not its deletions left behind: gone before the scan, so
/// that nothing obsolete is read, let alone judged. The checkpoint's first
/// chunk (`meta`) says what it points into.
fn remove_obsolete(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    listing: &Listing,
    meta: &CheckpointMeta,
) -> Result<(), JournalError> {
    let obsolete = scan::obsolete_files(storage, dir, salt, listing, meta.seq, &|f| {
        meta.files.binary_search(&f.to_loc()).is_ok()
    })?;
    if !obsolete.is_empty() {
        tracing::info!(files = ?obsolete, "removing files an earlier compaction replaced");
        remove_files(storage, dir, &obsolete)?;
    }
    Ok(())
}

/// What the scan found, and the state it replayed.
struct Scanned {
    summary: ScanSummary,
    spool: Spool,
    /// The replica set the checkpoint holds (replicated mode).
    cluster_config: Option<Vec<u8>>,
    progress: Progress,
}

/// Reads and checks every file, and applies the records after the
/// checkpoint to the checkpoint's state. The checkpoint is decoded on a
/// thread of its own while the scan reads and checks the files it points
/// into (their records are not applied); the first record to apply waits
/// for it.
fn scan_and_apply(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    identity: &SpoolIdentity,
    checkpoint: Option<&CheckpointBytes>,
    checkpoint_seq: u64,
    up_to: Option<u64>,
) -> Result<Scanned, JournalError> {
    std::thread::scope(|scope| {
        let mut decoding = Decoding::start(scope, dir, identity, checkpoint)?;
        let mut progress = Progress::new(up_to);
        let summary = scan_dir(storage, dir, identity.salt, checkpoint_seq, |rec| {
            if !progress.takes(&rec) {
                return Ok(());
            }
            progress.apply(dir, decoding.spool()?, rec)
        });
        // The thread is joined before the scan's outcome is looked at: a
        // failed decoding is the answer even when the scan failed too.
        let (spool, cluster_config) = decoding.finish()?;
        Ok(Scanned {
            summary: summary?,
            spool,
            cluster_config,
            progress,
        })
    })
}

/// The checkpoint's state, decoded on a thread of its own until the first
/// record to apply needs it.
struct Decoding<'scope> {
    thread: Option<ScopedJoinHandle<'scope, Result<Spool, JournalError>>>,
    spool: Option<Spool>,
    /// The replica set the checkpoint holds, taken as decoded (before any
    /// record is applied).
    cluster_config: Option<Vec<u8>>,
}

impl<'scope> Decoding<'scope> {
    /// Starts the thread that decodes `checkpoint`; without a checkpoint
    /// the state is a new spool and no thread starts.
    fn start(
        scope: &'scope Scope<'scope, '_>,
        dir: &'scope Path,
        identity: &'scope SpoolIdentity,
        checkpoint: Option<&'scope CheckpointBytes>,
    ) -> Result<Decoding<'scope>, JournalError> {
        let thread = checkpoint
            .map(|bytes| {
                std::thread::Builder::new()
                    .name("checkpoint-load".into())
                    .spawn_scoped(scope, move || decode_checkpoint(dir, identity, bytes))
                    .map_err(|e| JournalError::io(dir, e))
            })
            .transpose()?;
        Ok(Decoding {
            thread,
            spool: None,
            cluster_config: None,
        })
    }

    /// The state to apply records to; the first call waits for the thread.
    fn spool(&mut self) -> Result<&mut Spool, JournalError> {
        if self.spool.is_none() {
            let decoded = match self.thread.take() {
                Some(thread) => thread.join().expect("checkpoint-load thread panicked")?,
                None => Spool::new(),
            };
            self.cluster_config = decoded.cluster_config().map(<[u8]>::to_vec);
            self.spool = Some(decoded);
        }
        Ok(self.spool.as_mut().expect("made ready"))
    }

    /// The state once the scan is over (waiting for the thread if no record
    /// needed it), and the replica set the checkpoint holds.
    fn finish(mut self) -> Result<(Spool, Option<Vec<u8>>), JournalError> {
        self.spool()?;
        Ok((self.spool.expect("made ready"), self.cluster_config))
    }
}

/// Replay's way through the live log, record by record.
struct Progress {
    /// Replicated mode: the last record known committed.
    up_to: Option<u64>,
    /// Records applied after the checkpoint.
    applied: u64,
    /// Replicated mode: `(term, kind, location)` of every record of the
    /// live log, applied or not.
    live: Vec<(u64, u8, RecordLoc)>,
    /// The last live record seen: in replicated mode records after `up_to`
    /// are indexed but not applied, so the next one's number comes from here.
    last_seen: Option<u64>,
    /// After damage the scan goes on (to report every problem), but nothing
    /// past a missing record may be applied: the scan's problem is the
    /// answer then.
    gap: Option<Gap>,
}

/// Records missing from the live log, noticed at record `found` (at
/// `offset` of `file`) where record `expected` was due.
struct Gap {
    file: FileId,
    offset: u64,
    expected: u64,
    found: u64,
}

impl Progress {
    fn new(up_to: Option<u64>) -> Progress {
        Progress {
            up_to,
            applied: 0,
            live: Vec::new(),
            last_seen: None,
            gap: None,
        }
    }

    /// True for a record replay takes: one of the live log, before any gap.
    /// Every other record is only read and checked by the scan.
    fn takes(&self, rec: &ScannedRecord<'_>) -> bool {
        rec.applies && self.gap.is_none()
    }

    /// Takes the next record of the live log: indexes it (replicated mode),
    /// notes a gap before it (and stops there), and applies it to `spool`
    /// unless it lies beyond `up_to`.
    fn apply(
        &mut self,
        dir: &Path,
        spool: &mut Spool,
        rec: ScannedRecord<'_>,
    ) -> Result<(), JournalError> {
        let expected = self.last_seen.map_or(spool.applied_seq(), |s| s) + 1;
        self.last_seen = Some(rec.seq);
        if self.up_to.is_some() {
            self.live.push((rec.term, rec.kind, record_loc(&rec)));
        }
        if rec.seq != expected {
            self.gap = Some(Gap {
                file: rec.file,
                offset: rec.offset,
                expected,
                found: rec.seq,
            });
            return Ok(());
        }
        if self.up_to.is_some_and(|last| rec.seq > last) {
            return Ok(());
        }
        let record = Record::decode(rec.kind, rec.body).map_err(|e| JournalError::BadRecord {
            file: dir.join(rec.file.file_name()),
            offset: rec.offset,
            reason: e.to_string(),
        })?;
        spool.apply(&record, rec.seq, record_loc(&rec));
        self.applied += 1;
        Ok(())
    }
}

/// Where a scanned record lies.
fn record_loc(rec: &ScannedRecord<'_>) -> RecordLoc {
    RecordLoc {
        file: rec.file.to_loc(),
        offset: u32::try_from(rec.offset).expect("bug: offset beyond a segment"),
        len: rec.frame_len as u32,
    }
}

/// Refuses a journal the scan found damaged: the first problem it found,
/// a gap in the live log (nothing past it was applied), or format-1
/// segments without a checkpoint (with one, they are what an upgrade cut
/// short left behind).
fn check_damage(dir: &Path, scanned: &Scanned, has_checkpoint: bool) -> Result<(), JournalError> {
    let summary = &scanned.summary;
    if let Some(problem) = summary.problems.first() {
        return Err(problem.clone().into_error(dir));
    }
    if let Some(gap) = &scanned.progress.gap {
        return Err(JournalError::Corrupt {
            dir: dir.to_path_buf(),
            file: dir.join(gap.file.file_name()),
            offset: gap.offset,
            reason: format!("records {} to {} are missing", gap.expected, gap.found - 1),
        });
    }
    if !summary.old_format_segments.is_empty() && !has_checkpoint {
        return Err(JournalError::Corrupt {
            dir: dir.to_path_buf(),
            file: dir.join(FileId::Segment(summary.old_format_segments[0]).file_name()),
            offset: 0,
            reason: "format-1 segments beside format-2 ones; run `spoold journal upgrade`".into(),
        });
    }
    Ok(())
}

/// Refuses a journal that lacks what its checkpoint needs: every file the
/// checkpoint points into must be there, and the log must reach the
/// record the checkpoint reflects.
fn check_complete(dir: &Path, scanned: &Scanned, checkpoint_seq: u64) -> Result<(), JournalError> {
    let summary = &scanned.summary;
    let present: BTreeSet<u32> = summary
        .segments
        .iter()
        .map(|s| FileId::Segment(s.id).to_loc())
        .chain(
            summary
                .packs
                .iter()
                .map(|&(id, _)| FileId::Pack(id).to_loc()),
        )
        .collect();
    if let Some(&missing) = scanned
        .spool
        .referenced_files()
        .find(|f| !present.contains(f))
        .as_ref()
    {
        return Err(JournalError::Corrupt {
            dir: dir.to_path_buf(),
            file: dir.join(FileId::from_loc(missing).file_name()),
            offset: 0,
            reason: "the checkpoint points at records in this file, which is missing".into(),
        });
    }
    if summary.last_seq < checkpoint_seq {
        return Err(JournalError::Corrupt {
            dir: dir.to_path_buf(),
            file: dir.to_path_buf(),
            offset: 0,
            reason: format!(
                "the checkpoint reflects record {checkpoint_seq} but the log ends at {}",
                summary.last_seq
            ),
        });
    }
    Ok(())
}
