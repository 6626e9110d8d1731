//! `spoold journal verify | repair | compact | upgrade --dir D`: offline
//! tools for a stopped spool. `verify` reads and changes nothing; the others
//! take the spool's lock first.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use crate::engine::rebuild::{self, RebuildReport};
use crate::journal::format::{FileId, checkpoint_file_name, segment_file_name};
use crate::journal::scan::{self, Listing, ScanSummary, list_files, scan_dir};
use crate::journal::storage::{OsStorage, Storage};
use crate::journal::{JournalError, load_identity};
use crate::spool::{CheckpointLoader, Record};

/// What `verify` found.
#[derive(Debug, Default)]
pub struct VerifyReport {
    pub summary: ScanSummary,
    /// The checkpoint's problems (damage, or chunks that do not decode),
    /// and records whose checksum holds but whose body does not decode.
    pub bad: Vec<String>,
    /// The messages the checkpoint holds.
    pub checkpoint_messages: Option<usize>,
    /// The spool is in format 1 and needs `spoold journal upgrade` (start-up
    /// does it too).
    pub old_format: bool,
}

impl VerifyReport {
    /// Sound: no corruption (a torn tail is not corruption: it was never
    /// acknowledged and start-up truncates it).
    pub fn is_clean(&self) -> bool {
        self.summary.problems.is_empty() && self.bad.is_empty()
    }

    /// The report as printed, one finding per line.
    pub fn render(&self, dir: &Path) -> String {
        let mut out = String::new();
        let s = &self.summary;
        if self.old_format {
            let _ = writeln!(
                out,
                "{}: format 1 (before checkpoints); `spoold journal upgrade --dir {}` (or the next start) converts it",
                dir.display(),
                dir.display()
            );
            return out;
        }
        let _ = writeln!(
            out,
            "{}: {} segment(s), {} pack(s), {} record(s), {} bytes of records",
            dir.display(),
            s.segments.len(),
            s.packs.len(),
            s.records,
            s.record_bytes
        );
        if let Some(n) = self.checkpoint_messages {
            let _ = writeln!(
                out,
                "checkpoint at record {} with {n} message(s)",
                s.checkpoint_seq
            );
        }
        for p in &s.problems {
            let (file, offset) = p.location(dir);
            let _ = writeln!(
                out,
                "BAD {} at offset {offset}: {}",
                file.display(),
                p.reason()
            );
        }
        for u in &self.bad {
            let _ = writeln!(out, "BAD {u}");
        }
        if let Some(t) = s.torn_tail {
            let _ = writeln!(
                out,
                "torn tail: {} offset {} ({} bytes of an unacknowledged write; truncated at start-up)",
                dir.join(segment_file_name(t.segment_id)).display(),
                t.offset,
                t.len_bytes
            );
        }
        if s.torn_last_header.is_some() {
            let _ = writeln!(
                out,
                "incomplete last segment (creation cut short; removed at start-up)"
            );
        }
        let _ = writeln!(out, "{}", if self.is_clean() { "clean" } else { "CORRUPT" });
        out
    }
}

/// Checks `dir` on `storage`: the newest checkpoint, then every record.
pub fn verify_with(storage: Arc<dyn Storage>, dir: &Path) -> Result<VerifyReport, JournalError> {
    let Some(identity) = load_identity(&storage, dir, false)? else {
        // No identity and no journal files: an empty (or never used) spool.
        return Ok(VerifyReport::default());
    };
    let mut report = VerifyReport::default();
    if rebuild::needs_upgrade(&storage, dir, identity.salt)? {
        report.old_format = true;
        return Ok(report);
    }
    let listing = list_files(storage.as_ref(), dir)?;
    let mut checkpoint_seq = 0;
    if let Some(&seq) = listing.checkpoints.last() {
        checkpoint_seq = seq;
        verify_checkpoint(&storage, dir, identity.salt, seq, &listing, &mut report)?;
    }
    let total = journal_bytes(storage.as_ref(), dir, &listing);
    let (summary, bad) = verify_records(&storage, dir, identity.salt, checkpoint_seq, total)?;
    report.summary = summary;
    report.bad.extend(bad);
    Ok(report)
}

/// Reads the checkpoint `seq` into `report`: its problems, or the
/// messages it holds and the files it points at that are missing.
fn verify_checkpoint(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    seq: u64,
    listing: &Listing,
    report: &mut VerifyReport,
) -> Result<(), JournalError> {
    let name = checkpoint_file_name(seq);
    let read = scan::read_checkpoint(storage, dir, salt, seq)?;
    let decoded = read.map(|bytes| {
        let mut loader = CheckpointLoader::new();
        bytes
            .chunks()
            .try_for_each(|(kind, body)| loader.chunk(kind, body))
            .and_then(|()| loader.finish())
    });
    match decoded {
        Err(problem) => report.bad.push(format!("{name}: {}", problem.reason())),
        Ok(Err(e)) => report
            .bad
            .push(format!("{name}: undecodable checkpoint: {e}")),
        Ok(Ok((spool, _))) => {
            report.checkpoint_messages = Some(spool.message_count());
            for file in spool.referenced_files().map(FileId::from_loc) {
                let there = match file {
                    FileId::Segment(id) => listing.segments.contains(&id),
                    FileId::Pack(id) => listing.packs.contains(&id),
                };
                if !there {
                    report.bad.push(format!(
                        "{}: missing, and the checkpoint points at records in it",
                        dir.join(file.file_name()).display()
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Bytes of the segments and packs `listing` names, for the progress bar.
fn journal_bytes(storage: &dyn Storage, dir: &Path, listing: &Listing) -> u64 {
    let mut total = 0u64;
    for name in listing
        .segments
        .iter()
        .map(|&id| FileId::Segment(id).file_name())
        .chain(listing.packs.iter().map(|&id| FileId::Pack(id).file_name()))
    {
        total += storage
            .open(&dir.join(name))
            .and_then(|f| f.size_bytes())
            .unwrap_or(0);
    }
    total
}

/// Scans every record after checkpoint `checkpoint_seq` with a progress
/// bar over `total` bytes: the scan's summary, and the records whose
/// checksum holds but whose body does not decode.
fn verify_records(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    salt: u64,
    checkpoint_seq: u64,
    total: u64,
) -> Result<(ScanSummary, Vec<String>), JournalError> {
    let bar = progress_bar(total, "verifying");
    let mut seen = 0u64;
    let mut bytes = 0u64;
    let mut bad = Vec::new();
    let summary = scan_dir(storage, dir, salt, checkpoint_seq, |rec| {
        seen += 1;
        bytes += rec.frame_len;
        if seen.is_multiple_of(PROGRESS_EVERY_RECORDS) {
            bar.set_position(bytes);
        }
        if let Err(e) = Record::decode(rec.kind, rec.body) {
            bad.push(format!(
                "{} offset {}: undecodable record: {e}",
                dir.join(rec.file.file_name()).display(),
                rec.offset
            ));
        }
        Ok(())
    })?;
    bar.finish_and_clear();
    Ok((summary, bad))
}

/// How often (in records) the progress bar moves: often enough to watch,
/// rarely enough to cost nothing.
const PROGRESS_EVERY_RECORDS: u64 = 4096;

/// A progress bar on standard error; indicatif draws nothing when standard
/// error is not a terminal, so scripts and tests see only the report.
fn progress_bar(total_bytes: u64, what: &'static str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(total_bytes);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:40}] {bytes}/{total_bytes} ({eta} left)",
    ) {
        bar.set_style(style);
    }
    bar.set_message(what);
    bar
}

/// A spinner for work whose size is not known up front.
fn spinner(what: &'static str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_message(what);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

fn existing_dir(dir: &Path) -> Result<(), JournalError> {
    if dir.is_dir() {
        Ok(())
    } else {
        Err(JournalError::io(
            dir,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory"),
        ))
    }
}

/// Checks a spool on the real file system.
pub fn verify(dir: &Path) -> Result<VerifyReport, JournalError> {
    existing_dir(dir)?;
    verify_with(Arc::new(OsStorage), dir)
}

/// What `spoold journal repair` or `upgrade` did, as printed.
pub struct RebuildOutcome {
    pub report: Option<RebuildReport>,
    pub what: &'static str,
}

impl RebuildOutcome {
    pub fn render(&self, dir: &Path) -> String {
        let mut out = String::new();
        let Some(r) = &self.report else {
            let _ = writeln!(out, "{}: nothing to {}", dir.display(), self.what);
            return out;
        };
        for p in &r.problems {
            let _ = writeln!(out, "found: {p}");
        }
        for (file, bytes) in &r.quarantined {
            let _ = writeln!(out, "quarantined {bytes} bytes to {}", file.display());
        }
        for lost in &r.lost {
            let _ = writeln!(out, "LOST {lost}");
        }
        let _ = writeln!(
            out,
            "rebuilt the journal from {} good record(s): {} message(s), one checkpoint and {} pack(s)",
            r.records, r.messages, r.packs
        );
        out
    }
}

/// Runs `work` on a stopped spool on the real file system, holding its lock;
/// `None` from `work` (or a directory without a spool) is "nothing to do".
fn offline(
    dir: &Path,
    what: &'static str,
    progress: &'static str,
    work: impl FnOnce(
        &Arc<dyn Storage>,
        &crate::journal::SpoolIdentity,
    ) -> Result<Option<RebuildReport>, JournalError>,
) -> Result<RebuildOutcome, JournalError> {
    existing_dir(dir)?;
    let _lock = crate::journal::lock::DirLock::acquire(dir)?;
    let storage: Arc<dyn Storage> = Arc::new(OsStorage);
    let report = match load_identity(&storage, dir, false)? {
        None => None,
        Some(identity) => {
            let bar = spinner(progress);
            let report = work(&storage, &identity);
            bar.finish_and_clear();
            report?
        }
    };
    Ok(RebuildOutcome { report, what })
}

/// Repairs a stopped spool (taking its lock): every damaged span to a
/// quarantine file, every good record kept.
pub fn repair(dir: &Path) -> Result<RebuildOutcome, JournalError> {
    offline(
        dir,
        "repair",
        "repairing (scanning, quarantining, rebuilding)",
        |storage, identity| {
            let found = verify_with(storage.clone(), dir)?;
            if found.old_format {
                return Err(JournalError::Corrupt {
                    dir: dir.to_path_buf(),
                    file: dir.to_path_buf(),
                    offset: 0,
                    reason: "format 1: run `spoold journal upgrade` first".into(),
                });
            }
            if found.is_clean() {
                return Ok(None);
            }
            rebuild::repair(storage, dir, identity).map(Some)
        },
    )
}

/// `spoold cluster repair-vote`: replaces the vote of a stopped replica
/// (taking its lock) with a vote for itself in `term`, which must be above
/// every term the cluster used: the replica then votes only in later
/// terms, so it can never vote twice in one. For a vote that a forged
/// request poisoned (docs/operations.md), so it may lower the stored vote,
/// but never below the term of the replica's last log entry: a vote below
/// it is one the replica's own log says it gave up (the log is replayed to
/// find it, as start-up does).
pub async fn repair_vote(dir: &Path, term: u64) -> Result<String, JournalError> {
    existing_dir(dir)?;
    let _lock = crate::journal::lock::DirLock::acquire(dir)?;
    let bad = |reason: String| JournalError::Corrupt {
        dir: dir.to_path_buf(),
        file: dir.to_path_buf(),
        offset: 0,
        reason,
    };
    if term == 0 || term >= crate::cluster::server::TERM_CEILING {
        return Err(bad(format!(
            "--term {term}: give a term above every term the cluster used, below {}",
            crate::cluster::server::TERM_CEILING
        )));
    }
    let storage: Arc<dyn Storage> = Arc::new(OsStorage);
    let Some((node_id, _)) = crate::cluster::files::read_id(storage.as_ref(), dir)? else {
        return Err(bad(
            "no raft.id: not the spool directory of a replica".into()
        ));
    };
    let last_term = crate::cluster::files::last_log_term(storage.clone(), dir).await?;
    if term < last_term {
        return Err(bad(format!(
            "--term {term} is below term {last_term} of this replica's last log entry: \
             give a term of at least {last_term}, above every term the cluster used"
        )));
    }
    crate::cluster::files::write_vote(storage, dir, term, node_id)?;
    Ok(format!(
        "{}: node {node_id} now holds a vote for itself in term {term}; start it\n",
        dir.display()
    ))
}

/// Upgrades a stopped format-1 spool to format 2 (start-up does the same).
pub fn upgrade(dir: &Path) -> Result<RebuildOutcome, JournalError> {
    offline(
        dir,
        "upgrade",
        "upgrading (replaying format 1, writing a checkpoint)",
        |storage, identity| {
            if !rebuild::needs_upgrade(storage, dir, identity.salt)? {
                return Ok(None);
            }
            rebuild::upgrade(storage, dir, identity).map(Some)
        },
    )
}

/// Compacts every file of a stopped spool that holds garbage; returns the
/// report as printed.
pub async fn compact(dir: &Path) -> Result<String, JournalError> {
    existing_dir(dir)?;
    let mut options = crate::engine::EngineOptions::new(dir);
    // An offline tool should not leave a fresh spare segment behind.
    options.preallocate = false;
    let bar = spinner("replaying, then compacting");
    let (engine, _) = crate::engine::Engine::open(options).await?;
    let before = engine.journal_bytes();
    let reports = engine.compact_all(true).await;
    bar.finish_and_clear();
    let reports = reports?;
    let after = engine.journal_bytes();
    engine.close();
    let mut out = String::new();
    for r in &reports {
        let _ = writeln!(
            out,
            "{:?}: moved {} record(s) into a pack, {} -> {} bytes; checkpoint at record {} ({} bytes)",
            r.files,
            r.records_moved,
            r.bytes_before,
            r.bytes_after,
            r.checkpoint_seq,
            r.checkpoint_bytes
        );
    }
    let _ = writeln!(out, "journal: {before} -> {after} bytes");
    Ok(out)
}
