//! Writing a checkpoint: the state as chunks, each message delta-encoded
//! against the one before it, every record location passed through the
//! caller's relocation; and the state's digest over the same encoding.

use std::collections::BTreeMap;

use super::{
    CHECKPOINT_FORMAT, CHUNK_BYTES_MAX, CheckpointMeta, Counts, EMPTY_ENTRY, LocUse, kind, put_loc,
};
use crate::journal::RecordLoc;
use crate::spool::codec::{
    put_bytes32, put_i64, put_ivarint, put_str16, put_u32, put_u64, put_uvarint,
};
use crate::spool::queue::failed_queue_name;
use crate::spool::state::{
    DedupEntry, EventKeyEntry, MessageEntry, QueueEntry, QueueState, Spool, SpoolState,
};
use crate::time::Millis;

impl Spool {
    /// The state without leases, as plain data.
    pub(crate) fn state(&self) -> SpoolState {
        let mut state = SpoolState {
            epoch: self.epoch(),
            next_message_id: self.next_message_id(),
            queues: BTreeMap::new(),
            cluster_config: self.cluster_config().map(<[u8]>::to_vec),
            retired_nodes: self.retired_nodes().iter().copied().collect(),
            event_types: self
                .event_types()
                .iter()
                .map(|(name, definition)| (name.clone(), definition.to_vec()))
                .collect(),
            event_keys: self
                .event_keys()
                .map(|(hash, seen)| EventKeyEntry {
                    hash,
                    first_at: seen.first_at,
                    id: seen.id,
                    fingerprint: seen.fingerprint,
                    deliveries: seen.deliveries.clone(),
                })
                .collect(),
        };
        self.for_each_queue(|queue, messages, dedup| {
            let history = self
                .queue(&queue.name)
                .map(|q| q.history_entries().map(|(id, d)| (id, *d)).collect())
                .unwrap_or_default();
            state.queues.insert(
                queue.name.clone(),
                QueueState {
                    queue,
                    messages: messages.map(|(m, _)| m).collect(),
                    dedup,
                    history,
                },
            );
        });
        state
    }

    /// SHA-256 of the replicated state: the checkpoint's chunks (a
    /// versioned encoding, not `Debug` text) with every record location
    /// zeroed and the BEGIN chunk left out. BEGIN holds what is local to a
    /// node: its journal position, keys, epoch and the next id it would
    /// hand out (a send refused after allocating one moves only that node's
    /// counter). Replicas at the same applied record compare these.
    ///
    /// Dedup keys and event keys whose window had passed at `now` are left
    /// out (`event_window_ms`: the events' window): a primary's timer
    /// forgets them in its own time, a follower's when it serves, and
    /// neither is a record.
    pub(crate) fn state_digest(&self, now: Millis, event_window_ms: u64) -> [u8; 32] {
        use sha2::Digest;
        let zero = RecordLoc {
            file: 0,
            offset: 0,
            len: 0,
        };
        let live = Some((now, event_window_ms));
        let chunks = self.encode_chunks(&CheckpointMeta::default(), &mut |_| zero, live);
        let mut hash = sha2::Sha256::new();
        for (kind, body) in chunks.iter().filter(|(k, _)| *k != kind::BEGIN) {
            hash.update([*kind]);
            hash.update((body.len() as u64).to_le_bytes());
            hash.update(body);
        }
        hash.finalize().into()
    }

    /// Encodes the state as checkpoint chunks, each record location passed
    /// through `relocate` (compaction points the checkpoint at the pack it
    /// is about to write).
    pub(crate) fn encode_checkpoint(
        &self,
        meta: &CheckpointMeta,
        relocate: &mut dyn FnMut(LocUse<'_>) -> RecordLoc,
    ) -> Vec<(u8, Vec<u8>)> {
        self.encode_chunks(meta, relocate, None)
    }

    /// [`Spool::encode_checkpoint`], leaving out the keys whose window had
    /// passed at `live`'s time (`live`: the time and the events' window).
    fn encode_chunks(
        &self,
        meta: &CheckpointMeta,
        relocate: &mut dyn FnMut(LocUse<'_>) -> RecordLoc,
        live: Option<(Millis, u64)>,
    ) -> Vec<(u8, Vec<u8>)> {
        let mut out = ChunkWriter::default();
        let mut counts = Counts::default();
        // Every file the relocated locations name, for the BEGIN chunk.
        let mut files = std::collections::BTreeSet::new();
        let mut relocate = |u: LocUse<'_>| {
            let loc = relocate(u);
            files.insert(loc.file);
            loc
        };

        let mut queues = Vec::new();
        self.for_each_queue(|queue, _, _| queues.push(queue));
        out.start(kind::QUEUES, Vec::new());
        for q in &queues {
            let mut e = Vec::new();
            put_str16(&mut e, &q.name);
            e.push(u8::from(q.managed_by_config));
            e.push(u8::from(q.paused));
            let json = serde_json::to_vec(&q.settings).expect("bug: settings always serialise");
            put_bytes32(&mut e, &json);
            out.entry(&e);
            counts.queues += 1;
        }
        out.finish();

        self.for_each_queue(|queue, messages, dedup| {
            let mut prefix = Vec::new();
            put_str16(&mut prefix, &queue.name);
            out.start(kind::MESSAGES, prefix.clone());
            let mut previous = EMPTY_ENTRY;
            let mut e = Vec::new();
            let mut keyed = Vec::new();
            for (m, fresh) in messages {
                let m = MessageEntry {
                    loc: relocate(LocUse {
                        queue: &queue.name,
                        id: m.id,
                        attempts: false,
                        fresh,
                        loc: m.loc,
                    }),
                    attempts: m.attempts.map(|loc| {
                        relocate(LocUse {
                            queue: &queue.name,
                            id: m.id,
                            attempts: true,
                            fresh: false,
                            loc,
                        })
                    }),
                    ..m
                };
                if out.is_fresh() {
                    previous = EMPTY_ENTRY;
                }
                e.clear();
                encode_message(&mut e, &m, &previous);
                out.entry(&e);
                if let Some(key) = m.ordering_key {
                    keyed.push((m.id, key));
                }
                previous = m;
                counts.messages += 1;
            }
            out.finish();
            if !keyed.is_empty() {
                out.start(kind::ORDERING_KEYS, prefix.clone());
                for (id, key) in keyed.drain(..) {
                    e.clear();
                    put_u64(&mut e, id.0);
                    put_u64(&mut e, key);
                    out.entry(&e);
                }
                out.finish();
            }
            out.start(kind::DEDUP, prefix.clone());
            let window = queue.settings.dedup_window_ms as i64;
            let in_window = |d: &DedupEntry| live.is_none_or(|(now, _)| d.first_at + window > now);
            for d in dedup.iter().filter(|d| in_window(d)) {
                e.clear();
                put_u64(&mut e, d.hash);
                put_i64(&mut e, d.first_at);
                put_u64(&mut e, d.id.0);
                out.entry(&e);
                counts.dedup += 1;
            }
            out.finish();
            let q = self.queue(&queue.name).expect("listed");
            if q.history_entries().next().is_some() {
                out.start(kind::HISTORY, prefix);
                for (id, d) in q.history_entries() {
                    let loc = relocate(LocUse {
                        queue: &queue.name,
                        id,
                        attempts: false,
                        fresh: false,
                        loc: d.loc,
                    });
                    let attempts = d.attempts.map(|loc| {
                        relocate(LocUse {
                            queue: &queue.name,
                            id,
                            attempts: true,
                            fresh: false,
                            loc,
                        })
                    });
                    e.clear();
                    put_u64(&mut e, id.0);
                    put_i64(&mut e, d.enqueued_at);
                    put_i64(&mut e, d.delivered_at);
                    put_uvarint(&mut e, u64::from(d.retry_count));
                    e.push(u8::from(d.shared) | (u8::from(attempts.is_some()) << 1));
                    put_loc(&mut e, loc);
                    if let Some(a) = attempts {
                        put_loc(&mut e, a);
                    }
                    out.entry(&e);
                }
                out.finish();
            }
        });

        let mut begin = Vec::new();
        put_u32(&mut begin, CHECKPOINT_FORMAT);
        put_u64(&mut begin, meta.seq);
        put_u64(&mut begin, self.epoch());
        put_u64(&mut begin, self.next_message_id());
        put_i64(&mut begin, self.last_at());
        put_u64(&mut begin, meta.next_segment_id);
        put_u64(&mut begin, meta.next_pack_id);
        put_u64(&mut begin, meta.salt);
        begin.extend_from_slice(&meta.token_key);
        put_u32(&mut begin, files.len() as u32);
        for f in &files {
            put_u32(&mut begin, *f);
        }
        out.chunks.insert(0, (kind::BEGIN, begin));
        let key_live = |seen: &crate::spool::state::EventSeen| {
            live.is_none_or(|(now, window)| seen.first_at + window as i64 > now)
        };
        let mut keys = self
            .event_keys()
            .filter(|(_, seen)| key_live(seen))
            .peekable();
        if keys.peek().is_some() {
            // The layout with fingerprints only when some key has one: a
            // spool without them stays readable by the builds before it.
            let printed = self
                .event_keys()
                .any(|(_, seen)| key_live(seen) && seen.fingerprint.is_some());
            out.start(
                if printed {
                    kind::EVENT_KEYS_PRINTED
                } else {
                    kind::EVENT_KEYS
                },
                Vec::new(),
            );
            let mut e = Vec::new();
            for (hash, seen) in keys {
                e.clear();
                put_u64(&mut e, hash);
                put_i64(&mut e, seen.first_at);
                put_u64(&mut e, seen.id.0);
                put_u32(&mut e, seen.deliveries.len() as u32);
                for (queue, id) in &seen.deliveries {
                    put_str16(&mut e, queue);
                    put_u64(&mut e, id.0);
                }
                if printed {
                    e.push(u8::from(seen.fingerprint.is_some()));
                    put_u64(&mut e, seen.fingerprint.unwrap_or(0));
                }
                out.entry(&e);
            }
            out.finish();
        }
        if !self.event_types().is_empty() {
            out.start(kind::EVENT_TYPES, Vec::new());
            let mut e = Vec::new();
            for (name, definition) in self.event_types() {
                e.clear();
                put_str16(&mut e, name);
                put_bytes32(&mut e, definition);
                out.entry(&e);
            }
            out.finish();
        }
        if let Some(config) = self.cluster_config() {
            let mut body = Vec::new();
            put_bytes32(&mut body, config);
            put_u32(&mut body, self.retired_nodes().len() as u32);
            for id in self.retired_nodes() {
                put_u64(&mut body, *id);
            }
            out.chunks.push((kind::CLUSTER, body));
        }

        let mut end = Vec::new();
        put_u64(&mut end, out.chunks.len() as u64);
        put_u64(&mut end, counts.queues);
        put_u64(&mut end, counts.messages);
        put_u64(&mut end, counts.dedup);
        out.chunks.push((kind::END, end));
        out.chunks
    }

    /// Calls `f` for every base queue (by name) with its messages (base
    /// queue and failure queue merged, ids ascending) and dedup keys (by
    /// window start).
    pub(super) fn for_each_queue(
        &self,
        mut f: impl FnMut(QueueEntry, &mut dyn Iterator<Item = (MessageEntry, bool)>, Vec<DedupEntry>),
    ) {
        for name in self.queue_names() {
            let q = self.queue(&name).expect("listed above");
            if q.is_failure_queue() {
                continue;
            }
            let fq = self
                .queue(&failed_queue_name(&name))
                .expect("bug: a queue without its failure queue");
            let entry = QueueEntry {
                name: name.clone(),
                settings: (*q.settings).clone(),
                managed_by_config: q.managed_by_config,
                paused: q.paused,
            };
            let mut dedup: Vec<DedupEntry> = q
                .dedup_entries()
                .map(|(hash, first_at, id)| DedupEntry { first_at, hash, id })
                .collect();
            dedup.sort_unstable();
            let events = self.fresh_events();
            let mut messages = merge_by_id(
                q.message_entries(false, events),
                fq.message_entries(true, events),
            );
            f(entry, &mut messages, dedup);
        }
    }
}

/// Two id-ordered streams merged by id.
pub(super) fn merge_by_id<'a>(
    a: impl Iterator<Item = (MessageEntry, bool)> + 'a,
    b: impl Iterator<Item = (MessageEntry, bool)> + 'a,
) -> impl Iterator<Item = (MessageEntry, bool)> + 'a {
    let mut a = a.peekable();
    let mut b = b.peekable();
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if x.0.id <= y.0.id => a.next(),
        (Some(_), Some(_)) => b.next(),
        (Some(_), None) => a.next(),
        (None, _) => b.next(),
    })
}

/// Builds chunks of one kind, each opening with the same prefix and a
/// count of its entries, closed once past [`CHUNK_BYTES_MAX`].
#[derive(Default)]
pub(super) struct ChunkWriter {
    chunks: Vec<(u8, Vec<u8>)>,
    kind: u8,
    prefix: Vec<u8>,
    body: Vec<u8>,
    entries: u32,
}

impl ChunkWriter {
    pub(super) fn start(&mut self, kind: u8, prefix: Vec<u8>) {
        self.kind = kind;
        self.prefix = prefix;
        self.open();
    }

    pub(super) fn open(&mut self) {
        self.body = self.prefix.clone();
        self.body.extend_from_slice(&[0; 4]);
        self.entries = 0;
    }

    /// No entry in the open chunk yet (delta encodings restart here).
    pub(super) fn is_fresh(&self) -> bool {
        self.entries == 0
    }

    pub(super) fn entry(&mut self, bytes: &[u8]) {
        self.body.extend_from_slice(bytes);
        self.entries += 1;
        if self.body.len() >= CHUNK_BYTES_MAX {
            self.close();
            self.open();
        }
    }

    pub(super) fn close(&mut self) {
        let at = self.prefix.len();
        self.body[at..at + 4].copy_from_slice(&self.entries.to_le_bytes());
        self.chunks
            .push((self.kind, std::mem::take(&mut self.body)));
    }

    /// Closes the open chunk unless it is empty.
    pub(super) fn finish(&mut self) {
        if self.entries > 0 {
            self.close();
        }
        self.body.clear();
    }
}

/// One message, its numbers relative to the entry before it in the chunk
/// (ids ascend; times are close together), so that a typical message
/// takes about fifteen bytes.
pub(super) fn encode_message(out: &mut Vec<u8>, m: &MessageEntry, previous: &MessageEntry) {
    put_uvarint(out, m.id.0 - previous.id.0);
    let mut flags = 0u8;
    if m.in_failure_queue {
        flags |= 1;
    }
    if m.attempts.is_some() {
        flags |= 2;
    }
    if m.failure.is_some() {
        flags |= 4;
    }
    if m.shared {
        flags |= 8;
    }
    out.push(flags);
    put_ivarint(out, m.enqueued_at.wrapping_sub(previous.enqueued_at));
    put_ivarint(out, m.visible_at.wrapping_sub(m.enqueued_at));
    put_ivarint(out, m.retention_from.wrapping_sub(m.visible_at));
    put_uvarint(out, u64::from(m.retry_count));
    put_loc(out, m.loc);
    if let Some(a) = m.attempts {
        put_loc(out, a);
    }
    if let Some(f) = m.failure {
        out.push(f.reason.code());
        out.extend_from_slice(&f.last_status.unwrap_or(0).to_le_bytes());
        put_ivarint(out, f.failed_at.wrapping_sub(m.enqueued_at));
    }
}
