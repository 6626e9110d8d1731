//! Compaction: garbage collection from a checkpoint, never record by record.
//!
//! One run, start to finish:
//!
//! 1. **Plan**, under the core lock: pick files that are mostly garbage
//!    (sealed log segments whose every record is applied, and packs), take
//!    a checkpoint of the state at the last applied record `S`, and give
//!    every payload record the state points at in those files a place in a
//!    new pack. The checkpoint is encoded with those new places. Handles
//!    of the files are pinned, so nothing can delete them under the copy.
//! 2. **Write**, without the lock: the pack (each record copied byte for
//!    byte and checked again), then the checkpoint `<S>.ckpt`, each through
//!    temp file, fsync, rename, directory fsync. The checkpoint's rename is
//!    the point of no return: before it the old files and the old
//!    checkpoint are the journal, after it the new ones are.
//! 3. **Swap**, under the core lock: the moved messages point at the pack,
//!    the pack's handle is registered, the old files are forgotten.
//! 4. **Delete** the old files and the old checkpoint.
//!
//! A failure before the point of no return changes nothing (a written pack
//! nobody points at is deleted at the next start). A failure after it
//! would leave memory and disk disagreeing, so it is fatal: the journal is
//! poisoned and the process exits non-zero, and replay decides. A crash
//! between 2 and 4 leaves files the new checkpoint made obsolete; start-up
//! deletes them before reading anything (`journal::scan::obsolete_files`).
//!
//! Nothing in a log segment is judged before it is applied: only segments
//! below the highest one that has an applied record are candidates, and the
//! checkpoint is the applied state. No file is ever rewritten in place, so a
//! reader that took a location and a handle together (under the core lock)
//! always reads what the location names.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::Engine;
use super::core::{CheckpointOnDisk, Core, FileMeta};
use crate::failpoint;
use crate::journal::JournalError;
use crate::journal::RecordLoc;
use crate::journal::atomic::{AtomicWriteError, remove_files};
use crate::journal::files::{write_checkpoint, write_pack};
use crate::journal::format::{FILE_HEADER_BYTES, FileId, PackHeader, checkpoint_file_name};
use crate::journal::storage::StorageFile;
use crate::spool::checkpoint::LocUse;
use crate::spool::{CheckpointMeta, MessageId};

/// Compact a file once at most this fraction of its bytes is live.
const LIVE_FRACTION_MAX: f64 = 0.5;
/// Most files merged into one pack by one run.
const RUN_FILES_MAX: usize = 64;

/// What one compaction run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// The files replaced (segment and pack names).
    pub files: Vec<String>,
    /// Payload records copied into the new pack.
    pub records_moved: usize,
    /// Bytes of the replaced files, and of the new pack.
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// The checkpoint written: its sequence number and size.
    pub checkpoint_seq: u64,
    pub checkpoint_bytes: u64,
}

/// A payload record on its way into the new pack.
struct Move {
    holder: Holder,
    from: RecordLoc,
    to: RecordLoc,
    /// The first holder of `from`: the record is copied once, however many
    /// messages (an event's deliveries) point at it.
    copy: bool,
}

/// Who points at a moving record.
enum Holder {
    /// One message: its enqueue record, or (`attempts`) its newest attempt
    /// record.
    Message {
        queue: String,
        id: MessageId,
        attempts: bool,
    },
    /// Every untouched delivery of the event whose record it is: they move
    /// as one (`Spool::relocate_fresh`), whatever their number.
    Event,
}

/// Where a compaction's plan moves each record of its run: into one new
/// pack, in the order the checkpoint's encoding meets them, each record
/// once however many hold it.
struct Relocation {
    in_run: BTreeSet<u32>,
    pack: u32,
    /// Where the next record placed in the pack starts.
    offset: u64,
    placed: HashMap<RecordLoc, RecordLoc>,
    /// Records whose event's untouched deliveries already have their move.
    events_moved: HashSet<RecordLoc>,
    moves: Vec<Move>,
}

impl Relocation {
    fn new(run: &[u32], pack: u32) -> Self {
        Relocation {
            in_run: run.iter().copied().collect(),
            pack,
            offset: FILE_HEADER_BYTES as u64,
            placed: HashMap::new(),
            events_moved: HashSet::new(),
            moves: Vec::new(),
        }
    }

    /// Where the checkpoint records `u`: its place in the pack if its
    /// file is in the run (noting the move), else where it is.
    fn relocate(&mut self, u: LocUse<'_>) -> RecordLoc {
        if !self.in_run.contains(&u.loc.file) {
            return u.loc;
        }
        let copy = !self.placed.contains_key(&u.loc);
        let (pack, offset) = (self.pack, &mut self.offset);
        let to = *self.placed.entry(u.loc).or_insert_with(|| {
            // A run's live bytes fit in one segment (`pick_run`), and
            // segments and packs are far below 4 GiB.
            let to = RecordLoc {
                file: pack,
                offset: u32::try_from(*offset).expect("bug: a pack beyond 4 GiB"),
                len: u.loc.len,
            };
            *offset += u64::from(u.loc.len);
            to
        });
        let holder = if u.fresh {
            if !self.events_moved.insert(u.loc) {
                return to;
            }
            Holder::Event
        } else {
            Holder::Message {
                queue: u.queue.to_owned(),
                id: u.id,
                attempts: u.attempts,
            }
        };
        self.moves.push(Move {
            holder,
            from: u.loc,
            to,
            copy,
        });
        to
    }
}

/// What step 1 decided.
struct Plan {
    run: Vec<u32>,
    handles: HashMap<u32, Arc<dyn StorageFile>>,
    seq: u64,
    /// The term of record `seq` (replicated mode).
    term: u64,
    pack_id: u64,
    moves: Vec<Move>,
    chunks: Vec<(u8, Vec<u8>)>,
    cluster_config: Option<Vec<u8>>,
    old_checkpoint: Option<CheckpointOnDisk>,
}

impl Plan {
    /// A snapshot asked for with no file to compact and nothing applied
    /// since the checkpoint on disk: there is nothing to write.
    fn repeats_checkpoint(&self) -> bool {
        self.run.is_empty() && self.old_checkpoint.as_ref().map(|c| c.seq) == Some(self.seq)
    }

    /// Bytes of the files to compact, read from their pinned handles.
    fn bytes_before(&self) -> u64 {
        self.handles
            .values()
            .map(|h| h.size_bytes().unwrap_or(0))
            .sum::<u64>()
    }

    /// The new checkpoint as the core knows it once written (`bytes` long).
    /// Takes the plan's replica set: nothing needs it afterwards.
    fn checkpoint_on_disk(&mut self, bytes: u64) -> CheckpointOnDisk {
        CheckpointOnDisk {
            seq: self.seq,
            term: self.term,
            bytes,
            cluster_config: self.cluster_config.take(),
        }
    }
}

/// A pack on disk: its handle and length.
type WrittenPack = (Arc<dyn StorageFile>, u64);

impl Engine {
    /// Runs one compaction if some file is worth it (or, with `force`, if
    /// any candidate holds garbage at all). Returns `None` when there was
    /// nothing to do. Blocking file I/O: call it from a blocking thread.
    pub fn compact_once(&self, force: bool) -> Result<Option<CompactReport>, JournalError> {
        if self.is_replicated() {
            // In replicated mode every checkpoint is a Raft snapshot that
            // openraft must know of: compaction runs as its snapshot
            // builder (`replicated/snapshot/build.rs`), asked for by the compactor.
            return Ok(None);
        }
        self.compact(force, false)
    }

    /// One run; with `snapshot`, a checkpoint of the last applied record is
    /// written even when no file is worth compacting (replicated mode's
    /// snapshot), and `None` is never returned unless closed.
    pub(super) fn compact(
        &self,
        force: bool,
        snapshot: bool,
    ) -> Result<Option<CompactReport>, JournalError> {
        let _one_at_a_time = self
            .inner
            .compacting
            .lock()
            .expect("compaction lock poisoned");
        if self.inner.journal.is_closed() || self.inner.journal.is_poisoned() {
            // Closed: the directory may already belong to another engine.
            return Ok(None);
        }
        let Some(mut plan) = self.plan(force, snapshot)? else {
            return Ok(None);
        };
        if plan.repeats_checkpoint() {
            // A snapshot asked for with nothing applied since the last one.
            return Ok(Some(CompactReport {
                checkpoint_seq: plan.seq,
                ..CompactReport::default()
            }));
        }

        // Step 2: the pack, then the checkpoint.
        let written = self.write_new_pack(&plan).and_then(|pack| {
            failpoint::hit(failpoint::COMPACT_BEFORE_CHECKPOINT);
            Ok((self.write_new_checkpoint(&plan, pack.is_some())?, pack))
        });
        let (checkpoint_bytes, pack) = match written {
            Ok(written) => written,
            Err(e) => {
                // Nothing changed: the watch the plan started ends.
                self.core().spool.take_promotions();
                return Err(e);
            }
        };

        failpoint::hit(failpoint::COMPACT_BEFORE_SWAP);
        // Step 3: point memory at the new files.
        let bytes_before = plan.bytes_before();
        let pack_bytes = pack.as_ref().map_or(0, |(_, len)| *len);
        let checkpoint = plan.checkpoint_on_disk(checkpoint_bytes);
        let old_checkpoint_bytes = self.swap(&plan, pack, checkpoint);

        // Step 4: delete what the checkpoint replaced.
        let obsolete = self.delete_replaced(&plan)?;
        let added = pack_bytes + checkpoint_bytes;
        let removed = bytes_before + old_checkpoint_bytes;
        self.inner
            .journal
            .adjust_disk_bytes(added as i64 - removed as i64);
        Ok(Some(CompactReport {
            files: obsolete,
            records_moved: plan.moves.iter().filter(|m| m.copy).count(),
            bytes_before,
            bytes_after: pack_bytes,
            checkpoint_seq: plan.seq,
            checkpoint_bytes,
        }))
    }

    /// Step 1, under the core lock.
    fn plan(&self, force: bool, snapshot: bool) -> Result<Option<Plan>, JournalError> {
        let active = self.inner.journal.active_segment();
        let mut core = self.core();
        let run = match pick_run(&core, active, force, self.purge_floor()) {
            Some(run) => run,
            None if snapshot => Vec::new(),
            None => return Ok(None),
        };
        let mut handles = HashMap::new();
        for &f in &run {
            handles.insert(f, self.inner.reader.file(f)?);
        }
        let seq = core.spool.applied_seq();
        let term = self.replica().map_or(0, |r| {
            r.raft_log()
                .term(seq)
                .unwrap_or_else(|| panic!("bug: applied record {seq} has no term"))
        });
        let pack_id = core.next_pack_id;
        let mut relocation = Relocation::new(&run, FileId::Pack(pack_id).to_loc());
        let meta = CheckpointMeta {
            seq,
            next_segment_id: active,
            next_pack_id: pack_id + 1,
            salt: self.inner.identity.salt,
            token_key: self.inner.identity.token_key,
            files: Vec::new(),
        };
        let chunks = core
            .spool
            .encode_checkpoint(&meta, &mut |u| relocation.relocate(u));
        let moves = relocation.moves;
        if !moves.is_empty() {
            core.next_pack_id += 1;
        }
        // Deliveries promoted from here to the swap leave their event with
        // its record's old location: the swap moves them too.
        core.spool.watch_promotions();
        Ok(Some(Plan {
            run,
            handles,
            seq,
            term,
            pack_id,
            moves,
            chunks,
            cluster_config: core.spool.cluster_config().map(<[u8]>::to_vec),
            old_checkpoint: core.checkpoint.clone(),
        }))
    }

    /// Step 2, the pack: every record the plan moves, copied from the
    /// pinned handles (once each, however many messages point at it) and
    /// checked again, through temp file, fsync, rename, directory fsync.
    /// Returns its handle and length; `None` when nothing moves.
    fn write_new_pack(&self, plan: &Plan) -> Result<Option<WrittenPack>, JournalError> {
        if plan.moves.is_empty() {
            return Ok(None);
        }
        let reader = &self.inner.reader;
        let frames = plan.moves.iter().filter(|m| m.copy).map(|m| {
            reader
                .read_frame_from(&plan.handles[&m.from.file], m.from)
                .map_err(|e| std::io::Error::other(e.to_string()))
        });
        let header = PackHeader {
            pack_id: plan.pack_id,
            checkpoint_seq: plan.seq,
        };
        let salt = self.inner.identity.salt;
        match write_pack(&self.inner.storage, &self.inner.dir, salt, header, frames) {
            Ok(written) => Ok(Some(written)),
            // Nothing points at the pack: whether or not its name
            // survives, start-up deletes it as obsolete.
            Err(e) => Err(e.into_inner()),
        }
    }

    /// Step 2, the checkpoint `<seq>.ckpt`, whose rename is the point of no
    /// return; returns its length. Not installed: nothing changed, and the
    /// pack just written (if `wrote_pack`) is removed, best effort (nobody
    /// points at it, so the next start deletes it anyway). In doubt: memory
    /// cannot know which journal the disk holds, so it is fatal.
    fn write_new_checkpoint(&self, plan: &Plan, wrote_pack: bool) -> Result<u64, JournalError> {
        let storage = &self.inner.storage;
        let dir = &self.inner.dir;
        let salt = self.inner.identity.salt;
        let written = write_checkpoint(storage, dir, salt, plan.seq, plan.term, &plan.chunks);
        match written {
            Ok(n) => Ok(n),
            Err(AtomicWriteError::NotInstalled(e)) => {
                if wrote_pack {
                    let _ = remove_files(storage, dir, &[FileId::Pack(plan.pack_id).file_name()]);
                }
                Err(e)
            }
            Err(AtomicWriteError::InDoubt(e)) => {
                Err(self.fatal(format!("compaction's checkpoint is in doubt: {e}")))
            }
        }
    }

    /// Step 3, under the core lock: registers the new pack, points every
    /// moved message at it, forgets the compacted files and notes the new
    /// checkpoint. No file I/O happens under the lock. Returns the bytes of
    /// the checkpoint it replaced.
    fn swap(
        &self,
        plan: &Plan,
        pack: Option<(Arc<dyn StorageFile>, u64)>,
        checkpoint: CheckpointOnDisk,
    ) -> u64 {
        let mut core = self.core();
        if let Some((handle, len)) = pack {
            let file = FileId::Pack(plan.pack_id);
            self.inner.reader.register(file, handle);
            core.files.insert(file.to_loc(), FileMeta { bytes: len });
        }
        let mut events = HashMap::new();
        for m in &plan.moves {
            match &m.holder {
                Holder::Message {
                    queue,
                    id,
                    attempts: true,
                } => core.spool.relocate_attempts(queue, *id, m.from, m.to),
                Holder::Message { queue, id, .. } => core.spool.relocate(queue, *id, m.from, m.to),
                Holder::Event => {
                    core.spool.relocate_fresh(m.from, m.to);
                    events.insert(m.from, m.to);
                }
            }
        }
        for (queue, id) in core.spool.take_promotions() {
            let from = core.spool.find(&queue, id).map(|(_, m)| m.loc);
            if let Some(from) = from
                && let Some(&to) = events.get(&from)
            {
                core.spool.relocate(&queue, id, from, to);
            }
        }
        for &f in &plan.run {
            core.files.remove(&f);
            self.inner.reader.unregister(FileId::from_loc(f));
        }
        debug_assert!(
            core.spool
                .referenced_files()
                .all(|f| !plan.run.contains(&f)),
            "bug: a message still points into a compacted file"
        );
        let old = core.checkpoint.replace(checkpoint);
        old.map_or(0, |c| c.bytes)
    }

    /// Step 4: deletes the compacted files and the old checkpoint (unless
    /// this run wrote its checkpoint under the same name). It comes after
    /// the point of no return: a failure is fatal. Returns the names of the
    /// files deleted.
    fn delete_replaced(&self, plan: &Plan) -> Result<Vec<String>, JournalError> {
        let mut obsolete: Vec<String> = plan
            .run
            .iter()
            .map(|&f| FileId::from_loc(f).file_name())
            .collect();
        if let Some(old) = &plan.old_checkpoint
            && old.seq != plan.seq
        {
            obsolete.push(checkpoint_file_name(old.seq));
        }
        if let Err(e) = remove_files(&self.inner.storage, &self.inner.dir, &obsolete) {
            return Err(self.fatal(format!("compaction could not delete replaced files: {e}")));
        }
        Ok(obsolete)
    }

    /// Something failed after a point of no return: memory and disk may
    /// disagree. Stop taking writes and let the process exit; replay
    /// decides.
    pub(super) fn fatal(&self, reason: String) -> JournalError {
        tracing::error!(error = %reason, "fatal: the journal takes no more writes; restart to replay");
        self.inner.journal.poison();
        self.inner.shared.poisoned.send_replace(true);
        JournalError::Poisoned
    }

    /// Compacts until nothing is left worth it (with `force`, until no
    /// candidate holds any garbage).
    pub async fn compact_all(&self, force: bool) -> Result<Vec<CompactReport>, JournalError> {
        let engine = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut reports = Vec::new();
            while let Some(report) = engine.compact_once(force)? {
                reports.push(report);
            }
            Ok(reports)
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
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
                let full = engine.is_full();
                if let Some(replica) = engine.replica() {
                    // openraft runs the compaction as its snapshot builder.
                    if replica.snapshot_due(full) {
                        replica.request_snapshot();
                    }
                    continue;
                }
                match engine.compact_all(full).await {
                    Ok(reports) => reports.iter().for_each(CompactReport::log),
                    Err(e) => tracing::error!(error = %e, "compaction failed; will retry"),
                }
            }
        })
    }
}

impl CompactReport {
    pub(super) fn log(&self) {
        tracing::info!(
            files = ?self.files,
            moved = self.records_moved,
            bytes_before = self.bytes_before,
            bytes_after = self.bytes_after,
            checkpoint_seq = self.checkpoint_seq,
            checkpoint_bytes = self.checkpoint_bytes,
            "compacted"
        );
    }
}

/// Picks the files to compact: candidates (log segments below the highest
/// one with an applied record and below the active one, and every pack)
/// that are mostly garbage (with `force`: hold any garbage), oldest first,
/// while their live bytes fit in one segment. In replicated mode a segment
/// is a candidate only below `floor`, the one holding the oldest record
/// the Raft log still has (openraft purges behind snapshots).
pub(super) fn pick_run(
    core: &Core,
    active: u64,
    force: bool,
    floor: Option<u32>,
) -> Option<Vec<u32>> {
    let highest_segment = core
        .files
        .keys()
        .copied()
        .filter(|&f| matches!(FileId::from_loc(f), FileId::Segment(_)))
        .max()?;
    let candidate = |f: u32| match FileId::from_loc(f) {
        FileId::Segment(id) => {
            id < active && f < highest_segment && floor.is_none_or(|floor| f < floor)
        }
        FileId::Pack(_) => true,
    };
    let worth = |live: u64, meta: &FileMeta| {
        if force {
            live + (FILE_HEADER_BYTES as u64) < meta.bytes
        } else {
            live as f64 <= meta.bytes as f64 * LIVE_FRACTION_MAX
        }
    };
    let mut run = Vec::new();
    let mut live_total = 0u64;
    for (&f, meta) in &core.files {
        let live = core.spool.live_bytes(f);
        if !candidate(f) || !worth(live, meta) {
            continue;
        }
        if !run.is_empty() && (run.len() >= RUN_FILES_MAX || live_total + live > core.segment_bytes)
        {
            break;
        }
        run.push(f);
        live_total += live;
    }
    (!run.is_empty()).then_some(run)
}
