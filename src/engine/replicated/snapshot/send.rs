//! Sending a snapshot: the checkpoint and every payload record it points
//! at, one message at a time. The checkpoint is re-encoded with its
//! locations naming places in stream packs (the records in the order they
//! are sent), so that the receiver can lay them out as they arrive.

use std::collections::HashMap;
use std::sync::Arc;

use super::{RECORD_HEADER_BYTES, stream_pack, tag};
use crate::engine::checkpoint::load_checkpoint;
use crate::engine::replicated::log::RaftLog;
use crate::journal::files::PackLayout;
use crate::journal::format::FRAME_HEADER_BYTES;
use crate::journal::reader::SegmentReader;
use crate::journal::storage::StorageFile;
use crate::journal::{JournalError, RecordLoc};
use crate::spool::CheckpointMeta;

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

impl RaftLog {
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
        let mut layout = PackLayout::new();
        let mut placed: HashMap<RecordLoc, RecordLoc> = HashMap::new();
        let mut relocate = |u: crate::spool::checkpoint::LocUse<'_>| {
            // An event's record is shipped once for all its deliveries.
            if let Some(&to) = placed.get(&u.loc) {
                return to;
            }
            let (pack, offset) = layout.place(u.loc.len);
            let pack = u32::try_from(pack).expect("bug: more stream packs than file ids");
            records.push((pack, u.loc));
            let to = RecordLoc {
                file: stream_pack(pack),
                offset,
                len: u.loc.len,
            };
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
}
