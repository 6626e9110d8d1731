//! Compaction: deciding which records of sealed segments are still needed,
//! and swapping the index over to the rewritten file.
//!
//! A record is kept when dropping it could change what replay rebuilds:
//!
//! | record | kept while |
//! |---|---|
//! | enqueue | its message is still here; else, if its dedup key is still in its window, a dedup-key record takes its place |
//! | retry, fail, redrive | a message it names is still here (records about a message are absolute, so the last one decides) |
//! | attempt | it is the newest attempt record of a message still here |
//! | ack, expire, cancel, purge, queue delete | an older segment may still hold a record it settles: its sequence number is above the *floor*, the lowest "compacted through" watermark of the segments before the run |
//! | queue upsert / pause, epoch | it is the one in force |
//! | dedup key | the key is still in its window |
//!
//! The floor rule is what makes a settle record safe to drop: a segment
//! compacted when the journal stood at sequence `w` holds no record of a
//! message settled at or before `w`, because compaction dropped them then.
//!
//! Decisions are made under the core lock against the state as it is, with
//! the watermark set to the last applied record: whatever changes while the
//! file is being written only makes a kept record useless, never a dropped
//! one needed.

use std::borrow::Cow;

use super::sink::{Core, SegmentMeta};
use super::{Engine, EngineError};
use crate::journal::compact::{
    Piece, SegmentFrames, install, read_segment, remove_segments, write_compacted,
};
use crate::journal::format::{SEGMENT_FLAG_COMPACTED, SegmentHeader, segment_file_name};
use crate::journal::{JournalError, RecordLoc};
use crate::spool::command::kind;
use crate::spool::queue::FAILED_SUFFIX;
use crate::spool::{Command, MessageId, Record, Spool};
use crate::time::Millis;

/// Compact a segment once at most this fraction of its bytes is live.
const LIVE_FRACTION_MAX: f64 = 0.5;
/// Most segments merged into one file by one run.
const RUN_SEGMENTS_MAX: usize = 64;

/// What one compaction run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// The segments rewritten (merged into the last of them).
    pub segments: Vec<u64>,
    pub records_kept: usize,
    pub records_dropped: usize,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// The run held nothing live and led the journal: its files are gone.
    pub deleted: bool,
}

/// What to write for one frame of the run.
enum Decision {
    Copy,
    Drop,
    /// A dedup-key record in place of a dropped enqueue.
    DedupKey(Vec<u8>),
}

/// A kept enqueue (or newest attempt record) whose message must be pointed
/// at the new file.
struct Relocation {
    piece: usize,
    base_queue: String,
    id: MessageId,
    from: RecordLoc,
    attempts: bool,
}

impl Engine {
    /// Runs one compaction if a sealed segment is worth it (or, with
    /// `force`, if any sealed segment may hold something droppable).
    /// Returns `None` when there was nothing to do. Blocking file I/O: call
    /// it from a blocking thread.
    pub fn compact_once(&self, force: bool) -> Result<Option<CompactReport>, EngineError> {
        let _one_at_a_time = self
            .inner
            .compacting
            .lock()
            .expect("compaction lock poisoned");
        if self.inner.journal.is_closed() {
            // Closed: the directory may already belong to another engine.
            return Ok(None);
        }
        let active = self.inner.journal.active_segment();
        let Some((run, floor)) = pick_run(&self.core(), active, force) else {
            return Ok(None);
        };
        let storage = &self.inner.storage;
        let dir = &self.inner.dir;
        let salt = self.inner.salt;
        let segments = run
            .iter()
            .map(|&id| read_segment(storage, dir, salt, id))
            .collect::<Result<Vec<_>, JournalError>>()?;
        let bytes_before: u64 = segments.iter().map(|s| s.buf.len() as u64).sum();

        // The watermark and id floor are taken before any decision: every
        // message settled at or before the watermark is already gone, so
        // each later decision drops its records.
        let (watermark, id_floor, now) = {
            let mut core = self.core();
            let now = self.now(&mut core);
            (core.last_applied_seq, core.spool.next_message_id(), now)
        };
        let (decisions, relocations) = self.decide(&segments, floor, now);
        let records_total: usize = segments.iter().map(|s| s.frames.len()).sum();
        let kept = decisions
            .iter()
            .filter(|d| !matches!(d.2, Decision::Drop))
            .count();
        let mut report = CompactReport {
            segments: run.clone(),
            records_kept: kept,
            records_dropped: records_total - kept,
            bytes_before,
            ..CompactReport::default()
        };

        let target = *run.last().expect("a run has a segment");
        let leads_journal = self.core().segments.keys().next() == Some(&run[0]);
        if kept == 0 && leads_journal {
            // Nothing left and nothing older: the files can simply go.
            remove_segments(storage, dir, &run)?;
            let mut core = self.core();
            for id in &run {
                core.segments.remove(id);
                self.inner.reader.unregister(*id);
            }
            drop(core);
            self.inner.journal.adjust_disk_bytes(-(bytes_before as i64));
            report.deleted = true;
            return Ok(Some(report));
        }

        let first_covered = self.core().segments[&run[0]].first_covered;
        let header = SegmentHeader {
            flags: SEGMENT_FLAG_COMPACTED,
            first_seq: segments[0].header.first_seq,
            compacted_through: watermark,
            id_floor,
            covers_from: if first_covered < target {
                u32::try_from(first_covered).expect("bug: segment id overflows u32")
            } else {
                0
            },
            ..SegmentHeader::default()
        };
        let pieces = decisions.iter().filter_map(|(s, f, d)| {
            let seg = &segments[*s];
            let frame = &seg.frames[*f];
            match d {
                Decision::Drop => None,
                Decision::Copy => Some(Piece::Copy(seg.frame_bytes(frame))),
                Decision::DedupKey(body) => Some(Piece::New {
                    seq: frame.seq,
                    kind: kind::DEDUP_KEY,
                    body: body.clone(),
                }),
            }
        });
        let written = write_compacted(storage, dir, salt, target, header, pieces)?;
        install(storage, dir, &written.tmp, target)?;
        remove_segments(storage, dir, &run[..run.len() - 1])?;
        let path = dir.join(segment_file_name(target));
        let file = storage
            .open(&path)
            .map_err(|e| JournalError::io(&path, e))?;

        {
            let mut core = self.core();
            // Under the core lock, so that no reader pairs an old location
            // with the new file.
            self.inner.reader.register(target, file);
            for id in &run[..run.len() - 1] {
                self.inner.reader.unregister(*id);
                core.segments.remove(id);
            }
            let target_u32 = u32::try_from(target).expect("bug: segment id overflows u32");
            for r in &relocations {
                let to = RecordLoc {
                    segment_id: target_u32,
                    offset: u32::try_from(written.offsets[r.piece])
                        .expect("bug: offset overflows u32"),
                    len: r.from.len,
                };
                if r.attempts {
                    core.spool
                        .relocate_attempts(&r.base_queue, r.id, r.from, to);
                } else {
                    core.spool.relocate(&r.base_queue, r.id, r.from, to);
                }
            }
            let live = core.spool.live_bytes(target_u32);
            let futile = (report.records_dropped == 0).then_some((live, floor));
            core.segments.insert(
                target,
                SegmentMeta {
                    len: written.file_len,
                    compacted_through: watermark,
                    first_covered,
                    futile,
                },
            );
        }
        self.inner
            .journal
            .adjust_disk_bytes(written.file_len as i64 - bytes_before as i64);
        report.bytes_after = written.file_len;
        Ok(Some(report))
    }

    /// Compacts until nothing is left worth it (or, with `force`, until every
    /// sealed segment has been rewritten once with nothing more to drop).
    pub async fn compact_all(&self, force: bool) -> Result<Vec<CompactReport>, EngineError> {
        let engine = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut reports = Vec::new();
            while let Some(report) = engine.compact_once(force)? {
                reports.push(report);
            }
            Ok(reports)
        })
        .await
        .map_err(|e| EngineError::Unavailable {
            reason: format!("compaction task failed: {e}"),
        })?
    }

    /// Compacts in the background, checking every `period`, until the
    /// engine is dropped everywhere else.
    pub fn spawn_compactor(&self, period: std::time::Duration) -> tokio::task::JoinHandle<()> {
        let weak = std::sync::Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let Some(inner) = weak.upgrade() else { return };
                let engine = Engine { inner };
                if engine.is_poisoned() {
                    return;
                }
                // A full spool compacts whatever it can.
                match engine.compact_all(engine.is_full()).await {
                    Ok(reports) => {
                        for r in reports {
                            tracing::info!(
                                segments = ?r.segments,
                                kept = r.records_kept,
                                dropped = r.records_dropped,
                                bytes_before = r.bytes_before,
                                bytes_after = r.bytes_after,
                                "compacted"
                            );
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "compaction failed; will retry"),
                }
            }
        })
    }
}

/// The lowest watermark among segments before `id`: no settle record at or
/// below it can have anything left to settle there.
fn floor_before(core: &Core, id: u64) -> u64 {
    core.segments
        .range(..id)
        .map(|(_, m)| m.compacted_through)
        .min()
        .unwrap_or(u64::MAX)
}

/// Picks the run to compact and its floor: the oldest sealed segment that
/// is mostly garbage, merged with the sealed segments after it while their
/// live bytes fit in one segment. When settle records pile up behind an old
/// segment that holds the floor down, that segment is rewritten to raise it.
fn pick_run(core: &Core, active: u64, force: bool) -> Option<(Vec<u64>, u64)> {
    let sealed: Vec<(u64, SegmentMeta)> = core
        .segments
        .range(..active)
        .map(|(&id, &m)| (id, m))
        .collect();
    let live = |id: u64| core.spool.live_bytes(id as u32);
    let worth = |id: u64, m: &SegmentMeta| {
        let floor = floor_before(core, id);
        if m.futile == Some((live(id), floor)) {
            return false;
        }
        force || (live(id) as f64) <= m.len as f64 * LIVE_FRACTION_MAX
    };
    for (i, (id, meta)) in sealed.iter().enumerate() {
        if !worth(*id, meta) {
            continue;
        }
        let mut run = vec![*id];
        let mut live_total = live(*id);
        for (next, next_meta) in &sealed[i + 1..] {
            let l = live(*next);
            if run.len() >= RUN_SEGMENTS_MAX
                || live_total + l > core.segment_bytes
                || !worth(*next, next_meta)
            {
                break;
            }
            run.push(*next);
            live_total += l;
        }
        return Some((run, floor_before(core, *id)));
    }
    // Nothing is mostly garbage by its live bytes. If a segment's worth of
    // settle records is held back only by the floor, rewrite the oldest
    // segment that holds the floor down, so its watermark rises.
    let blocked: u64 = sealed
        .iter()
        .filter(|(id, m)| m.futile.is_some() && floor_before(core, *id) < core.last_applied_seq)
        .map(|(id, m)| m.len.saturating_sub(live(*id)))
        .sum();
    if blocked >= core.segment_bytes {
        let (blocker, _) = sealed
            .iter()
            .min_by_key(|(id, m)| (m.compacted_through, *id))?;
        let meta = core.segments[blocker];
        if meta.compacted_through < core.last_applied_seq {
            return Some((vec![*blocker], floor_before(core, *blocker)));
        }
    }
    None
}

type Plan = (Vec<(usize, usize, Decision)>, Vec<Relocation>);

/// Frames decided per hold of the core lock, so that a long run never
/// stalls writers for long.
const DECIDE_FRAMES_PER_LOCK: usize = 4096;

impl Engine {
    /// Decides every frame of the run against the state as it is, taking
    /// the core lock for a bounded number of frames at a time.
    fn decide(&self, segments: &[SegmentFrames], floor: u64, now: Millis) -> Plan {
        let mut decisions = Vec::new();
        let mut relocations = Vec::new();
        let mut pieces = 0usize;
        for (s, seg) in segments.iter().enumerate() {
            for chunk_start in (0..seg.frames.len()).step_by(DECIDE_FRAMES_PER_LOCK) {
                let core = self.core();
                let chunk_end = (chunk_start + DECIDE_FRAMES_PER_LOCK).min(seg.frames.len());
                for f in chunk_start..chunk_end {
                    let frame = &seg.frames[f];
                    let decision = match Record::decode(frame.kind, seg.body(frame)) {
                        // Not ours to judge (a newer kind): keep it.
                        Err(_) => Decision::Copy,
                        Ok(record) => {
                            let from = RecordLoc {
                                segment_id: seg.id as u32,
                                offset: frame.offset as u32,
                                len: frame.len as u32,
                            };
                            let d =
                                decide_record(&core.spool, &record, frame.seq, from, floor, now);
                            match (&d, &record.command) {
                                (Decision::Copy, Command::Enqueue(meta)) => {
                                    relocations.push(Relocation {
                                        piece: pieces,
                                        base_queue: meta.queue.to_string(),
                                        id: meta.id,
                                        from,
                                        attempts: false,
                                    });
                                }
                                (Decision::Copy, Command::Attempt { queue, id, .. }) => {
                                    relocations.push(Relocation {
                                        piece: pieces,
                                        base_queue: base_queue(queue).to_string(),
                                        id: *id,
                                        from,
                                        attempts: true,
                                    });
                                }
                                _ => {}
                            }
                            d
                        }
                    };
                    if !matches!(decision, Decision::Drop) {
                        pieces += 1;
                    }
                    decisions.push((s, f, decision));
                }
            }
        }
        (decisions, relocations)
    }
}

fn base_queue(queue: &str) -> &str {
    queue.strip_suffix(FAILED_SUFFIX).unwrap_or(queue)
}

fn decide_record(
    spool: &Spool,
    record: &Record<'_>,
    seq: u64,
    loc: RecordLoc,
    floor: u64,
    now: Millis,
) -> Decision {
    let present = |queue: &str, id: MessageId| spool.find(base_queue(queue), id).is_some();
    let keep = |yes: bool| if yes { Decision::Copy } else { Decision::Drop };
    let settled_below_floor = seq <= floor;
    match &record.command {
        Command::Enqueue(meta) => {
            let here = spool
                .find(&meta.queue, meta.id)
                .is_some_and(|(_, m)| m.loc == loc);
            if here {
                return Decision::Copy;
            }
            match meta.dedup_hash {
                Some(hash) if spool.dedup_lookup(&meta.queue, hash, now) == Some(meta.id) => {
                    let key = Record {
                        at: record.at,
                        command: Command::DedupKey {
                            queue: Cow::Borrowed(meta.queue.as_ref()),
                            hash,
                            first_at: record.at,
                            id: meta.id,
                        },
                    };
                    let mut body = Vec::new();
                    key.encode(None, &mut body);
                    Decision::DedupKey(body)
                }
                _ => Decision::Drop,
            }
        }
        Command::Retry { queue, id, .. } | Command::Fail { queue, id, .. } => {
            keep(present(queue, *id))
        }
        Command::Redrive { queue, ids } => keep(ids.iter().any(|id| present(queue, *id))),
        Command::Ack { queue, id }
        | Command::Expire { queue, id }
        | Command::Cancel { queue, id } => keep(present(queue, *id) || !settled_below_floor),
        Command::Purge { queue, ids } => {
            keep(ids.iter().any(|id| present(queue, *id)) || !settled_below_floor)
        }
        Command::QueueDelete { .. } => keep(!settled_below_floor),
        Command::QueueUpsert { name, .. } => {
            keep(spool.queue(name).is_some_and(|q| q.upsert_seq == seq))
        }
        Command::QueuePause { name, .. } => {
            keep(spool.queue(name).is_some_and(|q| q.pause_seq == seq))
        }
        Command::Epoch { .. } => keep(spool.epoch_seq() == seq),
        Command::DedupKey {
            queue, hash, id, ..
        } => keep(spool.dedup_lookup(queue, *hash, now) == Some(*id)),
        Command::Attempt { queue, id, .. } => {
            // Each attempt record carries the last ten; only the newest one
            // of a message still here is needed.
            let current = spool
                .find(base_queue(queue), *id)
                .and_then(|(q, _)| spool.attempts_loc(&q.name, *id));
            keep(current == Some(loc))
        }
    }
}
