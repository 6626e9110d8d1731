//! Building a snapshot: when one is due (the compactor asks openraft, which
//! then calls the builder), and the build itself, a compaction that always
//! writes a checkpoint of the last applied record.

use super::SnapshotInfo;
use crate::engine::compact::pick_run;
use crate::engine::replicated::Replica;
use crate::engine::replicated::log::RaftLog;
use crate::journal::JournalError;

impl Replica {
    /// Lets the compactor ask openraft for a snapshot.
    pub(crate) fn set_snapshot_trigger(&self, trigger: Box<dyn Fn() + Send + Sync>) {
        let _ = self.r.snapshot_trigger.set(trigger);
    }

    /// Asks openraft for a snapshot (it then calls the builder).
    pub(in crate::engine) fn request_snapshot(&self) {
        if let Some(trigger) = self.r.snapshot_trigger.get() {
            trigger();
        }
    }

    /// True when a snapshot would free space: a file behind the purged log
    /// is worth compacting, a whole segment of applied records lies after
    /// the checkpoint (a snapshot lets openraft purge it), or the spool is
    /// `full` and anything was applied since the checkpoint.
    pub(in crate::engine) fn snapshot_due(&self, full: bool) -> bool {
        let active = self.inner.journal.active_segment();
        let (checkpoint, applied) = {
            let core = self.core();
            if pick_run(&core, active, full, self.purge_floor()).is_some() {
                return true;
            }
            (
                core.checkpoint.as_ref().map_or(0, |c| c.seq),
                core.spool.applied_seq(),
            )
        };
        if full && applied > checkpoint {
            return true;
        }
        let index = self.r.index();
        match (index.get(checkpoint + 1), index.get(applied)) {
            (Some((_, _, after)), Some((_, _, last))) => after.file < last.file,
            _ => false,
        }
    }
}

impl RaftLog {
    /// The checkpoint on disk, as a snapshot.
    pub(crate) fn current_snapshot(&self) -> Option<SnapshotInfo> {
        self.engine
            .core()
            .checkpoint
            .as_ref()
            .map(|c| SnapshotInfo {
                seq: c.seq,
                term: c.term,
                cluster_config: c.cluster_config.clone(),
            })
    }

    /// Builds a snapshot: one compaction that writes a checkpoint of the
    /// last applied record whether or not a file is worth compacting.
    /// Blocking file I/O: call it from a blocking thread.
    pub(crate) fn build_snapshot(&self) -> Result<SnapshotInfo, JournalError> {
        let report = self.engine.compact(self.engine.is_full(), true)?;
        let report = report.ok_or(JournalError::Closed)?;
        if !report.files.is_empty() {
            report.log();
        }
        self.current_snapshot().ok_or(JournalError::Closed)
    }
}
