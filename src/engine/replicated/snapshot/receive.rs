//! Receiving a snapshot: the checkpoint's chunks into the state (without
//! payloads), then each stream pack's records into a new pack of this
//! replica as they arrive, framed under its own salt. Memory holds one
//! record at a time. What arrives is staged: nothing points into its packs
//! until it is installed (`install.rs`), and dropped before that, it
//! deletes them.

use std::iter::Peekable;
use std::sync::Arc;

use super::{RECORD_HEADER_BYTES, stream_pack, tag};
use crate::engine::Engine;
use crate::engine::replicated::error::StreamError;
use crate::engine::replicated::log::RaftLog;
use crate::journal::atomic::{AtomicWriteError, remove_files};
use crate::journal::files::{frame, write_pack};
use crate::journal::format::{FileId, PackHeader};
use crate::journal::storage::StorageFile;
use crate::spool::checkpoint::CheckpointLoader;
use crate::spool::{CheckpointMeta, Spool};

/// A snapshot received and staged: its payload records are in packs of
/// this replica that nothing points at yet. Dropped without being
/// installed, it deletes them.
pub(crate) struct StagedSnapshot {
    engine: Engine,
    pub seq: u64,
    pub term: u64,
    /// The state, its locations still naming stream packs.
    pub(super) spool: Spool,
    /// Per stream pack: this replica's pack id, handle and length.
    pub(super) packs: Vec<(u64, Arc<dyn StorageFile>, u64)>,
    /// Set once the checkpoint pointing into `packs` is in place: from
    /// then on they are the spool's, and dropping this keeps them.
    pub(super) installed: bool,
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

impl RaftLog {
    /// Receives the snapshot of record `seq` (of `term`) from `messages`
    /// (a [`SnapshotSource`](super::send::SnapshotSource)'s, in order): its
    /// records go into new packs as they arrive. Nothing points at them
    /// until it is installed. Blocking file I/O.
    pub(crate) fn receive_snapshot(
        &self,
        seq: u64,
        term: u64,
        messages: impl IntoIterator<Item = Result<Vec<u8>, StreamError>>,
    ) -> Result<StagedSnapshot, StreamError> {
        let mut messages = messages.into_iter().peekable();
        let (spool, meta, chunks) = receive_checkpoint(&mut messages, seq)?;
        let mut staged = StagedSnapshot {
            engine: self.engine.clone(),
            seq,
            term,
            spool,
            packs: Vec::new(),
            installed: false,
        };
        let records = self.receive_records(&mut staged, &mut messages)?;
        check_end(messages.next(), chunks, records)?;
        check_points_into_stream(&meta, staged.packs.len())?;
        Ok(staged)
    }

    /// Writes the payload records that follow the checkpoint into new
    /// packs, one for each stream pack, in the order the sender laid them
    /// out (a stream pack out of order is refused: the checkpoint's
    /// locations name stream packs by number). Stops at the first message
    /// that is not a record, and says how many records arrived.
    fn receive_records<I>(
        &self,
        staged: &mut StagedSnapshot,
        messages: &mut Peekable<I>,
    ) -> Result<u64, StreamError>
    where
        I: Iterator<Item = Result<Vec<u8>, StreamError>>,
    {
        let mut records = 0u64;
        while let Some(k) = messages.peek().and_then(|m| record_pack(m.as_ref().ok()?)) {
            if k as usize != staged.packs.len() {
                return Err(bad_stream(format!("stream pack {k} out of order")));
            }
            self.receive_pack(staged, k, messages, &mut records)?;
        }
        Ok(records)
    }

    /// Writes the records of stream pack `k` into one new pack, framed
    /// under this replica's salt, as they arrive. A record message too
    /// short, or of a record newer than the checkpoint, ends the pack and
    /// the stream; the pack written so far is staged first, so that
    /// dropping the staged snapshot deletes it with the others.
    fn receive_pack<I>(
        &self,
        staged: &mut StagedSnapshot,
        k: u32,
        messages: &mut Peekable<I>,
        records: &mut u64,
    ) -> Result<(), StreamError>
    where
        I: Iterator<Item = Result<Vec<u8>, StreamError>>,
    {
        let inner = &self.engine.inner;
        let salt = inner.identity.salt;
        let seq = staged.seq;
        let pack_id = {
            let mut core = self.engine.core();
            core.next_pack_id += 1;
            core.next_pack_id - 1
        };
        let mut failed = None;
        let frames = std::iter::from_fn(|| {
            let m =
                messages.next_if(|m| m.as_ref().ok().and_then(|m| record_pack(m)) == Some(k))?;
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
            *records += 1;
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
        Ok(())
    }
}

/// Reads the checkpoint's chunks, which come first, into the state
/// (without payloads), and says how many arrived. A checkpoint of another
/// record than `seq` is refused here, before any pack is written.
fn receive_checkpoint<I>(
    messages: &mut Peekable<I>,
    seq: u64,
) -> Result<(Spool, CheckpointMeta, u64), StreamError>
where
    I: Iterator<Item = Result<Vec<u8>, StreamError>>,
{
    let is = |m: &Result<Vec<u8>, StreamError>, t: u8| matches!(m, Ok(b) if b.first() == Some(&t));
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
    Ok((spool, meta, chunks))
}

/// Checks the stream's last message: the sender's counts of chunks and
/// records must be those that arrived. A stream that ended early, lost a
/// message or carried one out of place is refused, although every message
/// that did arrive was whole.
fn check_end(
    end: Option<Result<Vec<u8>, StreamError>>,
    chunks: u64,
    records: u64,
) -> Result<(), StreamError> {
    match end {
        Some(Ok(m)) if m.first() == Some(&tag::END) && m.len() == 17 => {
            let sent_chunks = u64::from_le_bytes(m[1..9].try_into().expect("8 bytes"));
            let sent_records = u64::from_le_bytes(m[9..17].try_into().expect("8 bytes"));
            if (sent_chunks, sent_records) != (chunks, records) {
                return Err(bad_stream(format!(
                    "{sent_chunks} chunks and {sent_records} records were sent, \
                     {chunks} and {records} arrived"
                )));
            }
            Ok(())
        }
        Some(Err(e)) => Err(e),
        Some(Ok(_)) => Err(bad_stream("an unexpected message")),
        None => Err(bad_stream("the stream ended early")),
    }
}

/// Checks that the checkpoint points only into the `packs` stream packs
/// that arrived: any other location would name a file this replica does
/// not have, or one of its own that the snapshot knows nothing of.
fn check_points_into_stream(meta: &CheckpointMeta, packs: usize) -> Result<(), StreamError> {
    let known = |f: u32| (0..packs as u32).any(|k| stream_pack(k) == f);
    if !meta.files.iter().all(|&f| known(f)) {
        return Err(bad_stream("the checkpoint points outside the stream"));
    }
    Ok(())
}

fn bad_stream(reason: impl Into<String>) -> StreamError {
    StreamError::Broken(reason.into())
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
