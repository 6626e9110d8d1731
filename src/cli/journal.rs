//! `spoold journal verify --dir D`: reads a stopped spool and reports every
//! damaged span without changing a byte.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use crate::journal::format::segment_file_name;
use crate::journal::scan::{ScanSummary, scan_dir};
use crate::journal::storage::{OsStorage, Storage};
use crate::journal::{JournalError, load_identity};
use crate::spool::Record;

/// What `verify` found.
#[derive(Debug)]
pub struct VerifyReport {
    pub summary: ScanSummary,
    /// Records whose checksum holds but whose body does not decode.
    pub undecodable: Vec<String>,
}

impl VerifyReport {
    /// Sound: no corruption (a torn tail is not corruption: it was never
    /// acknowledged and start-up truncates it).
    pub fn is_clean(&self) -> bool {
        self.summary.problems.is_empty() && self.undecodable.is_empty()
    }

    /// The report as printed, one finding per line.
    pub fn render(&self, dir: &Path) -> String {
        let mut out = String::new();
        let s = &self.summary;
        let _ = writeln!(
            out,
            "{}: {} segment(s), {} record(s), {} bytes of records",
            dir.display(),
            s.segment_ids.len(),
            s.records,
            s.record_bytes
        );
        for p in &s.problems {
            let (file, offset) = p.location(dir);
            let _ = writeln!(
                out,
                "BAD {} at offset {offset}: {}",
                file.display(),
                p.reason()
            );
        }
        for u in &self.undecodable {
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
        if s.torn_last_header {
            let _ = writeln!(
                out,
                "incomplete last segment (creation cut short; removed at start-up)"
            );
        }
        let _ = writeln!(out, "{}", if self.is_clean() { "clean" } else { "CORRUPT" });
        out
    }
}

/// Scans `dir` on `storage`.
pub fn verify_with(storage: Arc<dyn Storage>, dir: &Path) -> Result<VerifyReport, JournalError> {
    let Some(identity) = load_identity(&storage, dir, false)? else {
        // No identity and no segments: an empty (or never used) spool.
        return Ok(VerifyReport {
            summary: ScanSummary::default(),
            undecodable: Vec::new(),
        });
    };
    let mut undecodable = Vec::new();
    // Bytes before each segment, for the progress bar.
    let mut before = std::collections::HashMap::new();
    let mut total = 0u64;
    for id in crate::journal::scan::list_segments(storage.as_ref(), dir)? {
        before.insert(id, total);
        let path = dir.join(segment_file_name(id));
        total += storage
            .open(&path)
            .and_then(|f| f.size_bytes())
            .unwrap_or(0);
    }
    let bar = progress_bar(total, "verifying");
    let mut seen = 0u64;
    let summary = scan_dir(&storage, dir, identity.salt, |rec| {
        seen += 1;
        if seen.is_multiple_of(PROGRESS_EVERY_RECORDS) {
            bar.set_position(before.get(&rec.segment_id).copied().unwrap_or(0) + rec.offset);
        }
        if let Err(e) = Record::decode(rec.kind, rec.body) {
            undecodable.push(format!(
                "{} offset {}: undecodable record: {e}",
                dir.join(segment_file_name(rec.segment_id)).display(),
                rec.offset
            ));
        }
        Ok(())
    })?;
    bar.finish_and_clear();
    Ok(VerifyReport {
        summary,
        undecodable,
    })
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

/// Scans a spool directory on the real file system.
pub fn verify(dir: &Path) -> Result<VerifyReport, JournalError> {
    if !dir.is_dir() {
        return Err(JournalError::io(
            dir,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory"),
        ));
    }
    verify_with(Arc::new(OsStorage), dir)
}

/// What `spoold journal repair` did, as printed.
pub struct RepairOutcome {
    pub report: crate::journal::repair::RepairReport,
}

impl RepairOutcome {
    pub fn render(&self, dir: &Path) -> String {
        let r = &self.report;
        let mut out = String::new();
        if r.problems.is_empty() && r.quarantined.is_empty() {
            let _ = writeln!(out, "{}: nothing to repair", dir.display());
            return out;
        }
        for p in &r.problems {
            let _ = writeln!(out, "found: {p}");
        }
        for (file, bytes) in &r.quarantined {
            let _ = writeln!(out, "quarantined {bytes} bytes to {}", file.display());
        }
        let _ = writeln!(
            out,
            "rewrote {} segment(s) keeping {} good record(s); the journal now replays",
            r.rewritten.len(),
            r.records_kept
        );
        out
    }
}

/// Repairs a stopped spool on the real file system (taking its lock).
pub fn repair(dir: &Path) -> Result<RepairOutcome, JournalError> {
    let _lock = crate::journal::lock::DirLock::acquire(dir)?;
    let storage: Arc<dyn Storage> = Arc::new(OsStorage);
    let bar = spinner("repairing (scanning, quarantining, rewriting)");
    let report = crate::journal::repair::repair(&storage, dir, &|kind, body| {
        Record::decode(kind, body).is_ok()
    });
    bar.finish_and_clear();
    Ok(RepairOutcome { report: report? })
}

/// Compacts every sealed segment of a stopped spool; returns the report as
/// printed.
pub async fn compact(dir: &Path) -> Result<String, crate::engine::EngineError> {
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
            "segments {:?}: kept {} record(s), dropped {}, {} -> {} bytes",
            r.segments, r.records_kept, r.records_dropped, r.bytes_before, r.bytes_after
        );
    }
    let _ = writeln!(out, "journal: {before} -> {after} bytes");
    Ok(out)
}
