//! Replicated mode: the checkpoint is the Raft snapshot
//! (docs/replication.md, "Snapshots"). A snapshot goes through the rooms
//! of this module in turn:
//!
//! - **Building** one (`build.rs`) is a compaction that always writes a
//!   checkpoint of the last applied record (`RaftLog::build_snapshot`).
//!   openraft then purges the log behind it (`RaftLog::purge`), and the
//!   next compaction may delete the segments that held only purged
//!   records. After a restart the Raft log starts right after the
//!   checkpoint.
//! - **Sending** one (`send.rs`) streams the checkpoint and every payload
//!   record it points at, one message at a time
//!   ([`SnapshotSource`](send::SnapshotSource)). The checkpoint's locations
//!   are rewritten to name places in *stream packs*: the records in the
//!   order they are sent, laid out as a pack would hold them.
//! - **Receiving** one (`receive.rs`) writes those records into packs of
//!   this replica (framed under its own salt) as they arrive
//!   (`RaftLog::receive_snapshot`): memory holds one record at a time, and
//!   the state without payloads.
//! - **Installing** it (`install.rs`, `RaftLog::install_snapshot`) writes
//!   a checkpoint that points into those packs, swaps the state, and drops
//!   the log the snapshot replaces (the writer goes on in a new segment
//!   after it, or after the replica's own records if they continue it).
//!   As for compaction, the checkpoint's rename is the point of no return.
//!
//! This file holds what the rooms share: the snapshot as openraft sees it,
//! and the stream's message layout (written by `send.rs`, read by
//! `receive.rs`) and stream pack ids (which `install.rs` maps to this
//! replica's packs).

mod build;
mod install;
mod receive;
mod send;
#[cfg(test)]
mod tests;

pub(crate) use receive::StagedSnapshot;

use crate::journal::format::FileId;

/// A snapshot: the checkpoint of record `seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SnapshotInfo {
    pub seq: u64,
    /// The term of record `seq`.
    pub term: u64,
    /// The replica set as of `seq` (the cluster module's bytes).
    pub cluster_config: Option<Vec<u8>>,
}

/// The file id standing for stream pack `k` in a streamed checkpoint: a
/// pack id no spool reaches.
fn stream_pack(k: u32) -> u32 {
    FileId::Pack((1 << 31) - 2 - u64::from(k)).to_loc()
}

/// Message tags of the stream.
mod tag {
    /// A checkpoint chunk: kind u8, body.
    pub(super) const CHUNK: u8 = b'C';
    /// A payload record: stream pack u32, seq u64, term u64, kind u8, body.
    pub(super) const RECORD: u8 = b'R';
    /// The end: chunks u64, records u64.
    pub(super) const END: u8 = b'E';
}

const RECORD_HEADER_BYTES: usize = 1 + 4 + 8 + 8 + 1;
