//! Replicated mode: the checkpoint is the Raft snapshot
//! (docs/replication.md, "Snapshots").
//!
//! - **Building** one is a compaction that always writes a checkpoint of
//!   the last applied record ([`Engine::build_snapshot`]). openraft then
//!   purges the log behind it ([`Engine::purge_log`]), and the next
//!   compaction may delete the segments that held only purged records.
//!   After a restart the Raft log starts right after the checkpoint.
//! - **Sending** one streams the checkpoint and every payload record it
//!   points at, one message at a time ([`SnapshotSource`]). The
//!   checkpoint's locations are rewritten to name places in *stream packs*:
//!   the records in the order they are sent, laid out as a pack would hold
//!   them.
//! - **Receiving** one writes those records into packs of this replica
//!   (framed under its own salt) as they arrive ([`Engine::receive_snapshot`]):
//!   memory holds one record at a time, and the state without payloads.
//! - **Installing** it ([`Engine::install_snapshot`]) writes a checkpoint
//!   that points into those packs, swaps the state, and drops the log the
//!   snapshot replaces (the writer goes on in a new segment after it, or
//!   after the replica's own records if they continue it). As for
//!   compaction, the checkpoint's rename is the point of no return.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::oneshot;

use super::error::StreamError;
use super::log::RaftLog;
use crate::engine::Engine;
use crate::engine::checkpoint::load_checkpoint;
use crate::engine::compact::pick_run;
use crate::engine::core::{CheckpointOnDisk, FileMeta};
use crate::journal::atomic::{AtomicWriteError, remove_files};
use crate::journal::files::{frame, write_checkpoint, write_pack};
use crate::journal::format::{FILE_HEADER_BYTES, FRAME_HEADER_BYTES, FileId, PackHeader};
use crate::journal::reader::SegmentReader;
use crate::journal::scan::list_files;
use crate::journal::storage::StorageFile;
use crate::journal::{Control, JournalError, RecordLoc};
use crate::spool::checkpoint::CheckpointLoader;
use crate::spool::{CheckpointMeta, Spool};

/// A snapshot: the checkpoint of record `seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SnapshotInfo {
    pub seq: u64,
    /// The term of record `seq`.
    pub term: u64,
    /// The replica set as of `seq` (the cluster module's bytes).
    pub cluster_config: Option<Vec<u8>>,
}

/// A stream pack is closed once the next record would take it past this.
const STREAM_PACK_BYTES_MAX: u64 = 1 << 30;

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

fn bad_stream(reason: impl Into<String>) -> StreamError {
    StreamError::Broken(reason.into())
}

/// A snapshot on its way out: the messages of the stream, read from disk
/// one at a time. The files are pinned (open handles), so compaction may
/// delete their names meanwhile.
pub(crate) struct SnapshotSource {
    chunks: std::vec::IntoIter<(u8, Vec<u8>)>,
    records: std::vec::IntoIter<(u32, RecordLoc)>,
    handles: HashMap<u32, Arc<dyn StorageFile>>,
    reader: SegmentReader,
    sent: (u64, u64),
    ended: bool,
}

impl Iterator for SnapshotSource {
    type Item = Result<Vec<u8>, JournalError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some((kind, body)) = self.chunks.next() {
            self.sent.0 += 1;
            let mut m = Vec::with_capacity(2 + body.len());
            m.extend_from_slice(&[tag::CHUNK, kind]);
            m.extend_from_slice(&body);
            return Some(Ok(m));
        }
        if let Some((pack, from)) = self.records.next() {
            self.sent.1 += 1;
            let frame = self.reader.read_frame_from(&self.handles[&from.file], from);
            return Some(frame.map(|frame| {
                let header = crate::journal::format::FrameHeader::peek(&frame);
                let body = &frame[FRAME_HEADER_BYTES..];
                let mut m = Vec::with_capacity(RECORD_HEADER_BYTES + body.len());
                m.push(tag::RECORD);
                m.extend_from_slice(&pack.to_le_bytes());
                m.extend_from_slice(&header.seq.to_le_bytes());
                m.extend_from_slice(&header.term.to_le_bytes());
                m.push(header.kind);
                m.extend_from_slice(body);
                m
            }));
        }
        if std::mem::replace(&mut self.ended, true) {
            return None;
        }
        let mut m = vec![tag::END];
        m.extend_from_slice(&self.sent.0.to_le_bytes());
        m.extend_from_slice(&self.sent.1.to_le_bytes());
        Some(Ok(m))
    }
}

/// A snapshot received and staged: its payload records are in packs of
/// this replica that nothing points at yet. Dropped without being
/// installed, it deletes them.
pub(crate) struct StagedSnapshot {
    engine: Engine,
    pub seq: u64,
    pub term: u64,
    /// The state, its locations still naming stream packs.
    spool: Spool,
    /// Per stream pack: this replica's pack id, handle and length.
    packs: Vec<(u64, Arc<dyn StorageFile>, u64)>,
    installed: bool,
}

impl std::fmt::Debug for StagedSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedSnapshot")
            .field("seq", &self.seq)
            .field("term", &self.term)
            .field("packs", &self.packs.len())
            .finish_non_exhaustive()
    }
}

impl Drop for StagedSnapshot {
    fn drop(&mut self) {
        if self.installed || self.packs.is_empty() {
            return;
        }
        let names: Vec<String> = self
            .packs
            .iter()
            .map(|(id, _, _)| FileId::Pack(*id).file_name())
            .collect();
        // Best effort: start-up deletes packs no checkpoint points into.
        let inner = &self.engine.inner;
        let _ = remove_files(&inner.storage, &inner.dir, &names);
    }
}

impl Engine {
    /// Lets the compactor ask openraft for a snapshot.
    pub(crate) fn set_snapshot_trigger(&self, trigger: Box<dyn Fn() + Send + Sync>) {
        let _ = self.replication().snapshot_trigger.set(trigger);
    }

    /// Asks openraft for a snapshot (it then calls the builder).
    pub(in crate::engine) fn request_snapshot(&self) {
        if let Some(trigger) = self.replication().snapshot_trigger.get() {
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
        let index = self.replication().index();
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

    /// The stream of the snapshot at `seq`; an error if a newer checkpoint
    /// replaced it meanwhile (openraft then asks for the current one).
    /// Blocking file I/O.
    pub(crate) fn snapshot_source(&self, seq: u64) -> Result<SnapshotSource, JournalError> {
        let inner = &self.engine.inner;
        let (spool, meta, handles) = {
            // Compaction deletes nothing while this holds: the checkpoint
            // and the files it points into are read or pinned together.
            let _one_at_a_time = inner.compacting.lock().expect("compaction lock poisoned");
            let current = self.engine.core().checkpoint.as_ref().map(|c| c.seq);
            if current != Some(seq) {
                return Err(JournalError::io(
                    &inner.dir,
                    std::io::Error::other(format!(
                        "snapshot {seq} was replaced by {current:?}; ask again"
                    )),
                ));
            }
            let (spool, meta, _) =
                load_checkpoint(&inner.storage, &inner.dir, &inner.identity, seq)?;
            let mut handles = HashMap::new();
            for &f in &meta.files {
                handles.insert(f, inner.reader.file(f)?);
            }
            (spool, meta, handles)
        };
        let mut records = Vec::new();
        let mut pack = 0u32;
        let mut offset = FILE_HEADER_BYTES as u64;
        let mut placed: HashMap<RecordLoc, RecordLoc> = HashMap::new();
        let mut relocate = |u: crate::spool::checkpoint::LocUse<'_>| {
            // An event's record is shipped once for all its deliveries.
            if let Some(&to) = placed.get(&u.loc) {
                return to;
            }
            let len = u64::from(u.loc.len);
            if offset > FILE_HEADER_BYTES as u64 && offset + len > STREAM_PACK_BYTES_MAX {
                pack += 1;
                offset = FILE_HEADER_BYTES as u64;
            }
            records.push((pack, u.loc));
            let to = RecordLoc {
                file: stream_pack(pack),
                offset: u32::try_from(offset).expect("stream packs stay below 4 GiB"),
                len: u.loc.len,
            };
            offset += len;
            placed.insert(u.loc, to);
            to
        };
        let stream_meta = CheckpointMeta {
            seq,
            next_segment_id: 0,
            next_pack_id: 0,
            salt: 0,
            token_key: [0; 32],
            files: Vec::new(),
        };
        let chunks = spool.encode_checkpoint(&stream_meta, &mut relocate);
        debug_assert!(meta.files.iter().all(|f| handles.contains_key(f)));
        Ok(SnapshotSource {
            chunks: chunks.into_iter(),
            records: records.into_iter(),
            handles,
            reader: inner.reader.clone(),
            sent: (0, 0),
            ended: false,
        })
    }

    /// Receives the snapshot of record `seq` (of `term`) from `messages`
    /// (a [`SnapshotSource`]'s, in order): its records go into new packs
    /// as they arrive. Nothing points at them until it is installed.
    /// Blocking file I/O.
    pub(crate) fn receive_snapshot(
        &self,
        seq: u64,
        term: u64,
        messages: impl IntoIterator<Item = Result<Vec<u8>, StreamError>>,
    ) -> Result<StagedSnapshot, StreamError> {
        let inner = &self.engine.inner;
        let salt = inner.identity.salt;
        let mut messages = messages.into_iter().peekable();
        let is =
            |m: &Result<Vec<u8>, StreamError>, t: u8| matches!(m, Ok(b) if b.first() == Some(&t));
        let mut loader = CheckpointLoader::new();
        let mut chunks = 0u64;
        while let Some(m) = messages.next_if(|m| is(m, tag::CHUNK)) {
            let m = m?;
            let kind = *m
                .get(1)
                .ok_or_else(|| bad_stream("a chunk without a kind"))?;
            loader
                .chunk(kind, &m[2..])
                .map_err(|e| bad_stream(format!("checkpoint chunk {chunks}: {e}")))?;
            chunks += 1;
        }
        let (spool, meta) = loader
            .finish()
            .map_err(|e| bad_stream(format!("checkpoint: {e}")))?;
        if meta.seq != seq {
            return Err(bad_stream(format!(
                "the checkpoint is of record {}, not {seq}",
                meta.seq
            )));
        }
        let mut staged = StagedSnapshot {
            engine: self.engine.clone(),
            seq,
            term,
            spool,
            packs: Vec::new(),
            installed: false,
        };
        let mut records = 0u64;
        let mut failed = None;
        while let Some(k) = messages.peek().and_then(|m| record_pack(m.as_ref().ok()?)) {
            if k as usize != staged.packs.len() {
                return Err(bad_stream(format!("stream pack {k} out of order")));
            }
            let pack_id = {
                let mut core = self.engine.core();
                core.next_pack_id += 1;
                core.next_pack_id - 1
            };
            let frames = std::iter::from_fn(|| {
                let m = messages
                    .next_if(|m| m.as_ref().ok().and_then(|m| record_pack(m)) == Some(k))?;
                let m = m.expect("only records pass");
                let parsed = parse_record(&m);
                if parsed.is_none() {
                    failed = Some(bad_stream("a record message too short"));
                }
                let (record_seq, term, kind, body) = parsed?;
                if record_seq > seq {
                    failed = Some(bad_stream(format!(
                        "record {record_seq} is newer than the checkpoint ({seq})"
                    )));
                    return None;
                }
                records += 1;
                Some(Ok(frame(salt, record_seq, term, kind, body)))
            });
            let header = PackHeader {
                pack_id,
                checkpoint_seq: seq,
            };
            let (handle, len) = write_pack(&inner.storage, &inner.dir, salt, header, frames)
                .map_err(AtomicWriteError::into_inner)?;
            staged.packs.push((pack_id, handle, len));
            if let Some(e) = failed.take() {
                return Err(e);
            }
        }
        match messages.next() {
            Some(Ok(m)) if m.first() == Some(&tag::END) && m.len() == 17 => {
                let sent_chunks = u64::from_le_bytes(m[1..9].try_into().expect("8 bytes"));
                let sent_records = u64::from_le_bytes(m[9..17].try_into().expect("8 bytes"));
                if (sent_chunks, sent_records) != (chunks, records) {
                    return Err(bad_stream(format!(
                        "{sent_chunks} chunks and {sent_records} records were sent, \
                         {chunks} and {records} arrived"
                    )));
                }
            }
            Some(Err(e)) => return Err(e),
            Some(Ok(_)) => return Err(bad_stream("an unexpected message")),
            None => return Err(bad_stream("the stream ended early")),
        }
        let known = |f: u32| (0..staged.packs.len() as u32).any(|k| stream_pack(k) == f);
        if !meta.files.iter().all(|&f| known(f)) {
            return Err(bad_stream("the checkpoint points outside the stream"));
        }
        Ok(staged)
    }

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

    fn install_blocking(&self, mut staged: StagedSnapshot) -> Result<(), JournalError> {
        let inner = &self.engine.inner;
        let r = self.engine.replication();
        let _one_at_a_time = inner.compacting.lock().expect("compaction lock poisoned");
        let (seq, term) = (staged.seq, staged.term);
        // The replica's own log goes on after the snapshot only if it
        // holds the snapshot's last record itself (openraft truncated a
        // conflicting suffix before).
        let keep_log = r.appended_seq.load(Ordering::Acquire) > seq && self.term(seq) == Some(term);

        let pack_of: HashMap<u32, u32> = staged
            .packs
            .iter()
            .enumerate()
            .map(|(k, (id, _, _))| (stream_pack(k as u32), FileId::Pack(*id).to_loc()))
            .collect();
        let meta = CheckpointMeta {
            seq,
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
        // The state was loaded from chunks already; encoding it again and
        // loading that cannot fail but by a bug.
        let mut loader = CheckpointLoader::new();
        for (kind, body) in &chunks {
            if let Err(e) = loader.chunk(*kind, body) {
                panic!("bug: a re-encoded checkpoint does not load: {e}");
            }
        }
        let (spool, _) = loader
            .finish()
            .unwrap_or_else(|e| panic!("bug: a re-encoded checkpoint does not load: {e}"));

        // The point of no return.
        let bytes =
            match write_checkpoint(&inner.storage, &inner.dir, meta.salt, seq, term, &chunks) {
                Ok(n) => n,
                Err(AtomicWriteError::NotInstalled(e)) => return Err(e),
                Err(AtomicWriteError::InDoubt(e)) => {
                    return Err(self.engine.fatal(format!(
                        "an installed snapshot's checkpoint is in doubt: {e}"
                    )));
                }
            };
        staged.installed = true;
        if !keep_log {
            let (tx, rx) = oneshot::channel();
            let restarted = inner
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
        }

        // What the new checkpoint makes obsolete: every other checkpoint
        // and pack, and the segments that hold only records before the log.
        let listing = match list_files(inner.storage.as_ref(), &inner.dir) {
            Ok(listing) => listing,
            Err(e) => {
                return Err(self.engine.fatal(format!(
                    "installing a snapshot could not list the replaced files: {e}"
                )));
            }
        };
        let new_packs: Vec<u64> = staged.packs.iter().map(|(id, _, _)| *id).collect();
        let mut obsolete: Vec<FileId> = listing
            .packs
            .iter()
            .filter(|id| !new_packs.contains(id))
            .map(|&id| FileId::Pack(id))
            .collect();
        let (added, removed) = {
            let mut core = self.engine.core();
            // The log before the snapshot is purged; without a log of its
            // own after it, the log is empty and goes on after it.
            self.purge(seq, term);
            if !keep_log {
                r.index().entries.clear();
                r.unwritten.lock().expect("bug: tail lock poisoned").clear();
                r.appended_seq.store(seq, Ordering::Release);
            }
            let floor = self.engine.purge_floor();
            let active = inner.journal.active_segment();
            obsolete.extend(
                listing
                    .segments
                    .iter()
                    .map(|&id| FileId::Segment(id))
                    .filter(|f| match floor {
                        Some(floor) => f.to_loc() < floor,
                        None => matches!(f, FileId::Segment(id) if *id < active),
                    }),
            );
            let mut removed = core.checkpoint.as_ref().map_or(0, |c| c.bytes);
            for f in &obsolete {
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
            let mut added = bytes;
            for (id, handle, len) in &staged.packs {
                let file = FileId::Pack(*id);
                inner.reader.register(file, handle.clone());
                core.files.insert(file.to_loc(), FileMeta { bytes: *len });
                added += len;
            }
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
        };
        let mut names: Vec<String> = obsolete.iter().map(|f| f.file_name()).collect();
        names.extend(
            listing
                .checkpoints
                .iter()
                .filter(|&&c| c != seq)
                .map(|&c| crate::journal::format::checkpoint_file_name(c)),
        );
        if let Err(e) = remove_files(&inner.storage, &inner.dir, &names) {
            return Err(self.engine.fatal(format!(
                "installing a snapshot could not delete replaced files: {e}"
            )));
        }
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
}

/// The stream pack a record message belongs to (`None`: not a record).
fn record_pack(m: &[u8]) -> Option<u32> {
    (m.first() == Some(&tag::RECORD) && m.len() >= RECORD_HEADER_BYTES)
        .then(|| u32::from_le_bytes(m[1..5].try_into().expect("4 bytes")))
}

/// `(seq, term, kind, body)` of a record message.
fn parse_record(m: &[u8]) -> Option<(u64, u64, u8, &[u8])> {
    if m.len() < RECORD_HEADER_BYTES {
        return None;
    }
    let seq = u64::from_le_bytes(m[5..13].try_into().ok()?);
    let term = u64::from_le_bytes(m[13..21].try_into().ok()?);
    Some((seq, term, m[21], &m[RECORD_HEADER_BYTES..]))
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::engine::replicated::LogRecord;
    use crate::engine::replicated::testing::{self, raft_of_one};
    use crate::engine::{EngineOptions, Origin, SendRequest};
    use crate::journal::sim::{SimStorage, Tear};
    use crate::spool::Payload;
    use crate::spool::queue::QueueSettings;

    fn options(sim: &SimStorage, apply_up_to: u64) -> EngineOptions {
        testing::options(sim, 16 << 10, apply_up_to)
    }

    async fn send(engine: &Engine, i: usize) {
        let request = SendRequest {
            payload: Payload {
                content_type: "text/plain".into(),
                request: None,
                event: None,
                resent_from: None,
                trace: None,
                body: format!("message {i} {}", "x".repeat(i % 700))
                    .into_bytes()
                    .into(),
            },
            delay_ms: 0,
            dedup_key: i.is_multiple_of(3).then(|| format!("key {i}")),
        };
        engine.send("q", request).await.unwrap();
    }

    /// A primary with 300 messages, 250 acked, snapshotted twice (the
    /// second time after openraft purged the log behind the first).
    async fn primary(sim: &SimStorage) -> (Engine, SnapshotInfo) {
        let (a, _) = Engine::open(options(sim, 0)).await.unwrap();
        raft_of_one(&a, 1);
        a.start_serving(1).await.unwrap();
        let settings = QueueSettings {
            dedup_window_ms: 3_600_000,
            ..QueueSettings::default()
        };
        a.upsert_queue("q", settings, Origin::Api).await.unwrap();
        for i in 0..300 {
            send(&a, i).await;
        }
        // Most of them acked: the early segments are mostly garbage.
        for _ in 0..5 {
            let leased = a.receive("q", 50, Duration::ZERO).await.unwrap();
            for d in &leased {
                a.ack("q", &d.token).await.unwrap();
            }
        }
        let first = a.raft_log().build_snapshot().unwrap();
        a.raft_log().purge(first.seq, first.term);
        let segments_before = segment_count(sim);
        let second = a.raft_log().build_snapshot().unwrap();
        assert_eq!(second, first, "nothing applied in between");
        for i in 300..320 {
            send(&a, i).await;
        }
        let second = a.raft_log().build_snapshot().unwrap();
        assert!(
            segment_count(sim) < segments_before,
            "the purged log's segments went ({segments_before} before)"
        );
        (a, second)
    }

    fn segment_count(sim: &SimStorage) -> usize {
        let listing = list_files(sim, Path::new("/spool")).unwrap();
        listing.segments.len()
    }

    /// Every message of `q` with its payload, in id order.
    async fn payloads(engine: &Engine) -> Vec<(u64, Vec<u8>)> {
        let mut all = Vec::new();
        loop {
            let got = engine.receive("q", 100, Duration::ZERO).await.unwrap();
            if got.is_empty() {
                break;
            }
            all.extend(got.into_iter().map(|d| (d.id.0, d.payload.body.to_vec())));
        }
        all.sort();
        all
    }

    #[tokio::test]
    async fn a_snapshot_sent_to_a_replica_that_fell_behind_is_the_same_state_after_a_crash() {
        let sim_a = SimStorage::new();
        let (a, info) = primary(&sim_a).await;
        let expected = a.state().without_locations();

        // The replica holds an old log of its own, all before the snapshot.
        let sim_b = SimStorage::new();
        let (b, _) = Engine::open(options(&sim_b, 0)).await.unwrap();
        let old: Vec<LogRecord> = (1..=3).map(|seq| a_blank(seq, 1)).collect();
        append(&b, old).await;

        let source = a.raft_log().snapshot_source(info.seq).unwrap();
        let staged = b
            .raft_log()
            .receive_snapshot(
                info.seq,
                info.term,
                source.map(|m| m.map_err(StreamError::from)),
            )
            .unwrap();
        b.raft_log().install_snapshot(staged).await.unwrap();
        assert_eq!(b.state().without_locations(), expected);
        assert_eq!(
            b.raft_log().bounds(),
            (info.seq + 1, info.seq, Some(info.term))
        );
        assert_eq!(b.raft_log().purged(), Some((info.seq, info.term)));
        let listing = list_files(&sim_b, Path::new("/spool")).unwrap();
        assert_eq!(listing.checkpoints, vec![info.seq]);
        assert!(listing.segments.is_empty(), "the old log is gone");

        // Power lost before the log went on: the checkpoint is the spool.
        sim_b.crash(Tear::DropUnsynced);
        drop(b);
        let (b, _) = Engine::open(options(&sim_b, u64::MAX)).await.unwrap();
        assert_eq!(b.state().without_locations(), expected);
        assert_eq!(b.raft_log().purged(), Some((info.seq, info.term)));

        // It becomes the primary: the log goes on after the snapshot, and
        // every payload is there.
        raft_of_one(&b, 2);
        b.start_serving(2).await.unwrap();
        send(&b, 1000).await;
        let mut on_a = payloads(&a).await;
        let on_b = payloads(&b).await;
        assert_eq!(on_b.len(), on_a.len() + 1);
        on_a.push(on_b.last().unwrap().clone());
        assert_eq!(on_b, on_a);

        // And once more after a crash.
        let state = b.state().without_locations();
        sim_b.crash(Tear::DropUnsynced);
        drop(b);
        let (b, _) = Engine::open(options(&sim_b, u64::MAX)).await.unwrap();
        assert_eq!(b.state().without_locations(), state);
        b.close();
        a.close();
    }

    #[tokio::test]
    async fn a_replica_whose_log_goes_on_past_the_snapshot_keeps_that_log() {
        let sim_a = SimStorage::new();
        let (a, info) = primary(&sim_a).await;
        let expected = a.state().without_locations();
        for i in 400..410 {
            send(&a, i).await;
        }
        // The replica has the primary's records up to the end of the log,
        // but has applied none of them.
        let sim_b = SimStorage::new();
        let (b, _) = Engine::open(options(&sim_b, 0)).await.unwrap();
        let (first, last, _) = a.raft_log().bounds();
        assert!(first <= info.seq && info.seq < last);
        let blanks: Vec<LogRecord> = (1..first).map(|seq| a_blank(seq, 1)).collect();
        append(&b, blanks).await;
        let records: Vec<LogRecord> = (first..=last)
            .map(|seq| a.raft_log().read(seq).unwrap().unwrap())
            .collect();
        append(&b, records).await;

        let source = a.raft_log().snapshot_source(info.seq).unwrap();
        let staged = b
            .raft_log()
            .receive_snapshot(
                info.seq,
                info.term,
                source.map(|m| m.map_err(StreamError::from)),
            )
            .unwrap();
        b.raft_log().install_snapshot(staged).await.unwrap();
        assert_eq!(b.state().without_locations(), expected);
        assert_eq!(b.raft_log().bounds().0, info.seq + 1);
        assert_eq!(b.raft_log().bounds().1, last);
        for seq in info.seq + 1..=last {
            assert_eq!(
                b.raft_log().read(seq).unwrap(),
                a.raft_log().read(seq).unwrap()
            );
        }
        sim_b.crash(Tear::DropUnsynced);
        drop(b);
        let (b, _) = Engine::open(options(&sim_b, last)).await.unwrap();
        assert_eq!(b.state().without_locations(), a.state().without_locations());
        b.close();
        a.close();
    }

    #[tokio::test]
    async fn a_snapshot_cut_short_or_damaged_changes_nothing() {
        let sim_a = SimStorage::new();
        let (a, info) = primary(&sim_a).await;
        let sim_b = SimStorage::new();
        let (b, _) = Engine::open(options(&sim_b, 0)).await.unwrap();
        let all: Vec<_> = a.raft_log().snapshot_source(info.seq).unwrap().collect();
        let n = all.len();
        for cut in [1, n / 2, n - 1] {
            let part = all[..cut].iter().map(|m| Ok(m.as_ref().unwrap().clone()));
            assert!(
                b.raft_log()
                    .receive_snapshot(info.seq, info.term, part)
                    .is_err(),
                "cut at {cut}"
            );
        }
        let mut damaged: Vec<_> = all.iter().map(|m| m.as_ref().unwrap().clone()).collect();
        damaged[0][5] ^= 1;
        assert!(
            b.raft_log()
                .receive_snapshot(info.seq, info.term, damaged.into_iter().map(Ok))
                .is_err()
        );
        let wrong = all.iter().map(|m| Ok(m.as_ref().unwrap().clone()));
        assert!(
            b.raft_log()
                .receive_snapshot(info.seq + 1, info.term, wrong)
                .is_err()
        );
        // Nothing staged is left behind.
        let listing = list_files(&sim_b, Path::new("/spool")).unwrap();
        assert!(listing.packs.is_empty() && listing.checkpoints.is_empty());
        assert_eq!(b.state(), Spool::new().state());
        b.close();
        a.close();
    }

    fn a_blank(seq: u64, term: u64) -> LogRecord {
        let mut body = Vec::new();
        crate::spool::Record {
            at: 0,
            command: crate::spool::Command::RaftBlank,
        }
        .encode(None, &mut body);
        LogRecord {
            seq,
            term,
            kind: crate::spool::record::kind::RAFT_BLANK,
            body,
        }
    }

    async fn append(engine: &Engine, records: Vec<LogRecord>) {
        let (tx, rx) = oneshot::channel();
        let done = Box::new(move |r: std::io::Result<()>| {
            let _ = tx.send(r.is_ok());
        });
        engine.raft_log().append(records, done).unwrap();
        assert!(rx.await.unwrap());
    }
}
