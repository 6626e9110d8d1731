//! Installing a received snapshot: a checkpoint that points into the packs
//! it was received into, then the state swapped, the log it replaces
//! dropped, and the files it replaced deleted. As for compaction, the
//! checkpoint's rename is the point of no return: before it nothing
//! changed, and after it every step succeeds or the journal takes no more
//! writes (a restart replays from the new checkpoint).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::oneshot;

use super::receive::StagedSnapshot;
use super::stream_pack;
use crate::engine::core::{CheckpointOnDisk, Core, FileMeta};
use crate::engine::replicated::log::RaftLog;
use crate::journal::atomic::{AtomicWriteError, remove_files};
use crate::journal::files::write_checkpoint;
use crate::journal::format::FileId;
use crate::journal::scan::{Listing, list_files};
use crate::journal::storage::StorageFile;
use crate::journal::{Control, JournalError, RecordLoc};
use crate::spool::checkpoint::CheckpointLoader;
use crate::spool::{CheckpointMeta, Spool};

impl RaftLog {
    /// Installs a received snapshot: the state becomes the snapshot's, the
    /// log before it goes, and the log goes on after it.
    pub(crate) async fn install_snapshot(
        &self,
        staged: StagedSnapshot,
    ) -> Result<(), JournalError> {
        // Nothing appended may still be on its way to the disk.
        self.flush().await?;
        let log = self.clone();
        tokio::task::spawn_blocking(move || log.install_blocking(staged))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    }

    /// The steps of an install, in the order the files on disk need: the
    /// compaction lock is held throughout, so that no compaction writes a
    /// checkpoint or deletes a file in between.
    fn install_blocking(&self, mut staged: StagedSnapshot) -> Result<(), JournalError> {
        let inner = &self.engine.inner;
        let _one_at_a_time = inner.compacting.lock().expect("compaction lock poisoned");
        let (seq, term) = (staged.seq, staged.term);
        let keep_log = self.keeps_log(seq, term);
        let (meta, chunks) = self.relocated_checkpoint(&staged);
        let spool = state_of(&chunks);

        // The point of no return.
        let bytes = self.commit_checkpoint(&meta, term, &chunks)?;
        staged.installed = true;
        crate::failpoint::hit(crate::failpoint::SNAPSHOT_BEFORE_RESTART);
        if !keep_log {
            self.restart_log(seq)?;
        }

        // What the new checkpoint makes obsolete: every other checkpoint
        // and pack, and the segments that hold only records before the log.
        let listing = self.list_replaced()?;
        let mut obsolete = obsolete_packs(&listing, &staged);
        let (added, removed) =
            self.swap_in(&staged, spool, bytes, keep_log, &listing, &mut obsolete);
        self.delete_replaced(&listing, &obsolete, seq)?;
        inner
            .journal
            .adjust_disk_bytes(added as i64 - removed as i64);
        tracing::info!(
            seq,
            term,
            packs = staged.packs.len(),
            kept_log = keep_log,
            "installed a snapshot from the primary"
        );
        Ok(())
    }

    /// Whether the replica's own log goes on after the snapshot: only if
    /// it holds the snapshot's last record itself (openraft truncated a
    /// conflicting suffix before). Otherwise the log is dropped and starts
    /// again right after the snapshot.
    fn keeps_log(&self, seq: u64, term: u64) -> bool {
        let r = &self.r;
        r.appended_seq.load(Ordering::Acquire) > seq && self.term(seq) == Some(term)
    }

    /// The checkpoint to write, as chunks: the staged state with its
    /// locations moved from stream packs to the packs they were received
    /// into, under this replica's identity and file counters.
    fn relocated_checkpoint(
        &self,
        staged: &StagedSnapshot,
    ) -> (CheckpointMeta, Vec<(u8, Vec<u8>)>) {
        let inner = &self.engine.inner;
        let pack_of: HashMap<u32, u32> = staged
            .packs
            .iter()
            .enumerate()
            .map(|(k, (id, _, _))| (stream_pack(k as u32), FileId::Pack(*id).to_loc()))
            .collect();
        let meta = CheckpointMeta {
            seq: staged.seq,
            next_segment_id: inner.journal.active_segment() + 1,
            next_pack_id: self.engine.core().next_pack_id,
            salt: inner.identity.salt,
            token_key: inner.identity.token_key,
            files: Vec::new(),
        };
        let chunks = staged.spool.encode_checkpoint(&meta, &mut |u| RecordLoc {
            file: pack_of[&u.loc.file],
            ..u.loc
        });
        (meta, chunks)
    }

    /// Writes the relocated checkpoint; its rename is the point of no
    /// return. One not installed changed nothing: the error is the
    /// caller's, and the staged packs go when the snapshot is dropped. One
    /// in doubt may or may not be the spool's after a crash, so the journal
    /// takes no more writes.
    fn commit_checkpoint(
        &self,
        meta: &CheckpointMeta,
        term: u64,
        chunks: &[(u8, Vec<u8>)],
    ) -> Result<u64, JournalError> {
        let inner = &self.engine.inner;
        match write_checkpoint(
            &inner.storage,
            &inner.dir,
            meta.salt,
            meta.seq,
            term,
            chunks,
        ) {
            Ok(n) => Ok(n),
            Err(AtomicWriteError::NotInstalled(e)) => Err(e),
            Err(AtomicWriteError::InDoubt(e)) => Err(self.engine.fatal(format!(
                "an installed snapshot's checkpoint is in doubt: {e}"
            ))),
        }
    }

    /// Without a log of its own after the snapshot, the writer goes on in
    /// a new segment with record `seq + 1`. The checkpoint is in place
    /// already, so a writer that cannot restart is fatal.
    fn restart_log(&self, seq: u64) -> Result<(), JournalError> {
        let (tx, rx) = oneshot::channel();
        let restarted = self
            .engine
            .inner
            .journal
            .control(Control::Restart {
                next_seq: seq + 1,
                done: tx,
            })
            .and_then(|()| rx.blocking_recv().map_err(|_| JournalError::Closed)?);
        if let Err(e) = restarted {
            return Err(self
                .engine
                .fatal(format!("the log could not restart after a snapshot: {e}")));
        }
        Ok(())
    }

    /// The spool directory's files, to find those the new checkpoint
    /// replaced. Past the point of no return, a listing that fails is
    /// fatal.
    fn list_replaced(&self) -> Result<Listing, JournalError> {
        let inner = &self.engine.inner;
        list_files(inner.storage.as_ref(), &inner.dir).map_err(|e| {
            self.engine.fatal(format!(
                "installing a snapshot could not list the replaced files: {e}"
            ))
        })
    }

    /// Swaps the snapshot in under the core lock, so that nothing sees the
    /// new state beside the old log or files: the log before the snapshot
    /// is purged, the files it replaced are forgotten and the packs it was
    /// received into adopted, and the checkpoint and state become the
    /// snapshot's (without leases: they live in a primary's memory). Adds
    /// to `obsolete` the segments that hold only records before the log,
    /// and says how many bytes the spool gained and lost.
    fn swap_in(
        &self,
        staged: &StagedSnapshot,
        spool: Spool,
        bytes: u64,
        keep_log: bool,
        listing: &Listing,
        obsolete: &mut Vec<FileId>,
    ) -> (u64, u64) {
        let r = &self.r;
        let (seq, term) = (staged.seq, staged.term);
        let mut core = self.engine.core();
        // The log before the snapshot is purged; without a log of its
        // own after it, the log is empty and goes on after it.
        self.purge(seq, term);
        if !keep_log {
            r.index().entries.clear();
            r.unwritten.lock().expect("bug: tail lock poisoned").clear();
            r.appended_seq.store(seq, Ordering::Release);
        }
        obsolete.extend(self.segments_before_log(listing));
        let mut removed = core.checkpoint.as_ref().map_or(0, |c| c.bytes);
        removed += self.forget_files(&mut core, obsolete.as_slice());
        let added = bytes + self.adopt_packs(&mut core, &staged.packs);
        core.checkpoint = Some(CheckpointOnDisk {
            seq,
            term,
            bytes,
            cluster_config: spool.cluster_config().map(<[u8]>::to_vec),
        });
        core.last_now = core.last_now.max(spool.last_at());
        core.spool = spool;
        core.spool.drop_leases();
        (added, removed)
    }

    /// The segments on disk that hold only records before the log, now that
    /// it is purged: those before its first record's, or with the log
    /// empty, every one before the segment being written. Called under the
    /// core lock.
    fn segments_before_log(&self, listing: &Listing) -> Vec<FileId> {
        let floor = self.engine.purge_floor();
        let active = self.engine.inner.journal.active_segment();
        listing
            .segments
            .iter()
            .map(|&id| FileId::Segment(id))
            .filter(|f| match floor {
                Some(floor) => f.to_loc() < floor,
                None => matches!(f, FileId::Segment(id) if *id < active),
            })
            .collect()
    }

    /// Takes the `obsolete` files out of the file list and the reader, and
    /// says how many bytes they held (a file the list did not know counts
    /// by its size on disk).
    fn forget_files(&self, core: &mut Core, obsolete: &[FileId]) -> u64 {
        let inner = &self.engine.inner;
        let mut removed = 0u64;
        for f in obsolete {
            removed += match core.files.remove(&f.to_loc()) {
                Some(meta) => meta.bytes,
                None => inner
                    .storage
                    .open(&inner.dir.join(f.file_name()))
                    .and_then(|h| h.size_bytes())
                    .unwrap_or(0),
            };
            inner.reader.unregister(*f);
        }
        removed
    }

    /// Puts the packs the snapshot was received into in the file list and
    /// the reader, and says how many bytes they hold.
    fn adopt_packs(&self, core: &mut Core, packs: &[(u64, Arc<dyn StorageFile>, u64)]) -> u64 {
        let inner = &self.engine.inner;
        let mut added = 0u64;
        for (id, handle, len) in packs {
            let file = FileId::Pack(*id);
            inner.reader.register(file, handle.clone());
            core.files.insert(file.to_loc(), FileMeta { bytes: *len });
            added += len;
        }
        added
    }

    /// Deletes what the new checkpoint replaced: the `obsolete` packs and
    /// segments, and every checkpoint but the one of record `seq`. Past the
    /// point of no return, a deletion that fails is fatal.
    fn delete_replaced(
        &self,
        listing: &Listing,
        obsolete: &[FileId],
        seq: u64,
    ) -> Result<(), JournalError> {
        let inner = &self.engine.inner;
        let mut names: Vec<String> = obsolete.iter().map(|f| f.file_name()).collect();
        names.extend(
            listing
                .checkpoints
                .iter()
                .filter(|&&c| c != seq)
                .map(|&c| crate::journal::format::checkpoint_file_name(c)),
        );
        remove_files(&inner.storage, &inner.dir, &names).map_err(|e| {
            self.engine.fatal(format!(
                "installing a snapshot could not delete replaced files: {e}"
            ))
        })
    }
}

/// The state to swap in, loaded from the chunks about to be written: the
/// staged one still names stream packs.
fn state_of(chunks: &[(u8, Vec<u8>)]) -> Spool {
    // The state was loaded from chunks already; encoding it again and
    // loading that cannot fail but by a bug.
    let mut loader = CheckpointLoader::new();
    for (kind, body) in chunks {
        if let Err(e) = loader.chunk(*kind, body) {
            panic!("bug: a re-encoded checkpoint does not load: {e}");
        }
    }
    let (spool, _) = loader
        .finish()
        .unwrap_or_else(|e| panic!("bug: a re-encoded checkpoint does not load: {e}"));
    spool
}

/// Every pack on disk but those the snapshot was received into.
fn obsolete_packs(listing: &Listing, staged: &StagedSnapshot) -> Vec<FileId> {
    let new_packs: Vec<u64> = staged.packs.iter().map(|(id, _, _)| *id).collect();
    listing
        .packs
        .iter()
        .filter(|id| !new_packs.contains(id))
        .map(|&id| FileId::Pack(id))
        .collect()
}
