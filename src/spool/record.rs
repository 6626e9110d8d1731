//! The journal's record bodies: how each [`Command`] is laid out on disk,
//! and back.
//!
//! # Warning
//!
//! The body layouts below are on disk. `docs/journal-format.md` lists them;
//! change both, with a format-version bump, or not at all.

use std::borrow::Cow;

use bytes::Bytes;

use super::codec::{DecodeError, Reader, put_bytes32, put_i64, put_str16, put_u32, put_u64};
use super::command::{
    ATTEMPTS_KEPT, AttemptInfo, Command, EnqueueMeta, EventMeta, EventTag, FailReason, Payload,
    Record, StoredRequest,
};

/// Record kind bytes.
pub mod kind {
    pub const QUEUE_UPSERT: u8 = 1;
    pub const QUEUE_DELETE: u8 = 2;
    pub const QUEUE_PAUSE: u8 = 3;
    pub const ENQUEUE: u8 = 4;
    pub const ACK: u8 = 5;
    pub const RETRY: u8 = 6;
    /// Reserved for delivery attempts (push queues).
    pub const ATTEMPT: u8 = 7;
    pub const FAIL: u8 = 8;
    pub const EXPIRE: u8 = 9;
    pub const CANCEL: u8 = 10;
    pub const PURGE: u8 = 11;
    pub const REDRIVE: u8 = 12;
    pub const EPOCH: u8 = 13;
    /// Format 1 only (compaction wrote it for a dropped enqueue whose key
    /// was still in its window); read when upgrading, never written now.
    pub const DEDUP_KEY: u8 = 14;
    /// Replicated mode: a new primary's empty entry (Raft's blank).
    pub const RAFT_BLANK: u8 = 15;
    /// Replicated mode: a change of the replica set (openraft's
    /// membership, serialized with postcard).
    pub const RAFT_MEMBERSHIP: u8 = 16;
    /// Replicated mode: a node id that may never be a member again.
    pub const RETIRE_NODE: u8 = 17;
    /// An event and its deliveries, with the payload they share.
    pub const EVENT: u8 = 18;
    /// A delivered message sent again, its payload copied.
    pub const RESEND: u8 = 19;
    /// Delivered messages forgotten from a queue's history.
    pub const HISTORY_DROP: u8 = 20;
    /// A rotated-out signing secret's overlap ended.
    pub const SECRET_EXPIRE: u8 = 21;
    /// An entry of the event catalogue set or removed.
    pub const EVENT_TYPE: u8 = 22;
}

/// An enqueue's flags: it carries a dedup key hash; a stored request.
const ENQUEUE_HAS_DEDUP: u8 = 1;
const ENQUEUE_HAS_REQUEST: u8 = 2;
/// A `traceparent` str16 follows the payload (at the end, so that a
/// reader that does not know the bit reads the rest as before).
const ENQUEUE_HAS_TRACE: u8 = 4;
/// A hop count u8 follows everything else (after the trace, if any), for
/// the same reason: a build before it reads the record as a message that
/// came through no spoold.
const ENQUEUE_HAS_HOPS: u8 = 8;
/// An ordering key str16 follows everything else (after the hop count, if
/// any): a build before it reads the message as one without a key.
const ENQUEUE_HAS_ORDERING: u8 = 16;
/// An event's flags: it carries a dedup key hash; a tenant; a hop count
/// (a u8 after the payload).
const EVENT_HAS_DEDUP: u8 = 1;
const EVENT_HAS_TENANT: u8 = 2;
const EVENT_HAS_HOPS: u8 = 4;
/// A fingerprint u64 of what the event said (its type and body), after
/// everything else (the hop count, if any): a key's repeat with another
/// event is refused. Older builds read the event without it.
const EVENT_HAS_FINGERPRINT: u8 = 8;
/// An ordering key str16 after everything else (the fingerprint, if any).
const EVENT_HAS_ORDERING: u8 = 16;
/// The publisher's `traceparent` str16 after everything else (the
/// ordering key, if any): each delivery's attempts continue its trace.
/// Older builds read the event without it.
const EVENT_HAS_TRACE: u8 = 32;
/// A resend's flags: a stored request; an event tag; its tenant; a hop
/// count (a u8 after the payload).
const RESEND_HAS_REQUEST: u8 = 1;
const RESEND_HAS_EVENT: u8 = 2;
const RESEND_HAS_TENANT: u8 = 4;
const RESEND_HAS_HOPS: u8 = 8;

impl Record<'_> {
    pub fn kind(&self) -> u8 {
        match self.command {
            Command::QueueUpsert { .. } => kind::QUEUE_UPSERT,
            Command::QueueDelete { .. } => kind::QUEUE_DELETE,
            Command::QueuePause { .. } => kind::QUEUE_PAUSE,
            Command::Enqueue(_) => kind::ENQUEUE,
            Command::Event(_) => kind::EVENT,
            Command::Resend { .. } => kind::RESEND,
            Command::HistoryDrop { .. } => kind::HISTORY_DROP,
            Command::SecretExpire { .. } => kind::SECRET_EXPIRE,
            Command::Ack { .. } => kind::ACK,
            Command::Retry { .. } => kind::RETRY,
            Command::Fail { .. } => kind::FAIL,
            Command::Expire { .. } => kind::EXPIRE,
            Command::Cancel { .. } => kind::CANCEL,
            Command::Purge { .. } => kind::PURGE,
            Command::Redrive { .. } => kind::REDRIVE,
            Command::Epoch { .. } => kind::EPOCH,
            Command::DedupKey { .. } => kind::DEDUP_KEY,
            Command::Attempt { .. } => kind::ATTEMPT,
            Command::RaftBlank => kind::RAFT_BLANK,
            Command::RaftMembership { .. } => kind::RAFT_MEMBERSHIP,
            Command::RetireNode { .. } => kind::RETIRE_NODE,
            Command::EventType { .. } => kind::EVENT_TYPE,
        }
    }

    /// Appends the record body to `out`. An enqueue needs its `payload`;
    /// every other command ignores it.
    pub fn encode(&self, payload: Option<&Payload>, out: &mut Vec<u8>) {
        put_i64(out, self.at);
        match &self.command {
            Command::QueueUpsert {
                name,
                settings,
                managed_by_config,
            } => {
                put_str16(out, name);
                out.push(u8::from(*managed_by_config));
                let json = serde_json::to_vec(settings).expect("bug: settings always serialise");
                put_bytes32(out, &json);
            }
            Command::QueueDelete { name } => put_str16(out, name),
            Command::QueuePause { name, paused } => {
                put_str16(out, name);
                out.push(u8::from(*paused));
            }
            Command::Enqueue(meta) => {
                let payload = payload.expect("bug: enqueue encoded without its payload");
                put_u64(out, meta.id.0);
                put_i64(out, meta.visible_at);
                let mut flags = 0u8;
                if meta.dedup_hash.is_some() {
                    flags |= ENQUEUE_HAS_DEDUP;
                }
                if payload.request.is_some() {
                    flags |= ENQUEUE_HAS_REQUEST;
                }
                if payload.trace.is_some() {
                    flags |= ENQUEUE_HAS_TRACE;
                }
                if payload.hops > 0 {
                    flags |= ENQUEUE_HAS_HOPS;
                }
                if meta.ordering_key.is_some() {
                    flags |= ENQUEUE_HAS_ORDERING;
                }
                out.push(flags);
                put_u64(out, meta.dedup_hash.unwrap_or(0));
                put_str16(out, &meta.queue);
                put_str16(out, &payload.content_type);
                if let Some(req) = &payload.request {
                    put_request(out, req);
                }
                put_bytes32(out, &payload.body);
                if let Some(trace) = &payload.trace {
                    put_str16(out, trace);
                }
                if payload.hops > 0 {
                    out.push(payload.hops);
                }
                if let Some(key) = &meta.ordering_key {
                    put_str16(out, key);
                }
            }
            Command::Event(meta) => {
                let payload = payload.expect("bug: event encoded without its payload");
                put_u64(out, meta.id.0);
                put_i64(out, meta.visible_at);
                let mut flags = 0u8;
                if meta.dedup_hash.is_some() {
                    flags |= EVENT_HAS_DEDUP;
                }
                if meta.tenant.is_some() {
                    flags |= EVENT_HAS_TENANT;
                }
                if payload.hops > 0 {
                    flags |= EVENT_HAS_HOPS;
                }
                if meta.fingerprint.is_some() {
                    flags |= EVENT_HAS_FINGERPRINT;
                }
                if meta.ordering_key.is_some() {
                    flags |= EVENT_HAS_ORDERING;
                }
                if payload.trace.is_some() {
                    flags |= EVENT_HAS_TRACE;
                }
                out.push(flags);
                put_u64(out, meta.dedup_hash.unwrap_or(0));
                put_str16(out, &meta.event_type);
                if let Some(tenant) = &meta.tenant {
                    put_str16(out, tenant);
                }
                put_u32(out, meta.deliveries.len() as u32);
                for (queue, id) in &meta.deliveries {
                    put_str16(out, queue);
                    put_u64(out, id.0);
                }
                put_str16(out, &payload.content_type);
                put_bytes32(out, &payload.body);
                if payload.hops > 0 {
                    out.push(payload.hops);
                }
                if let Some(fingerprint) = meta.fingerprint {
                    put_u64(out, fingerprint);
                }
                if let Some(key) = &meta.ordering_key {
                    put_str16(out, key);
                }
                if let Some(trace) = &payload.trace {
                    put_str16(out, trace);
                }
            }
            Command::Resend {
                queue,
                id,
                from,
                visible_at,
            } => {
                let payload = payload.expect("bug: resend encoded without its payload");
                put_str16(out, queue);
                put_u64(out, id.0);
                put_u64(out, from.0);
                put_i64(out, *visible_at);
                let mut flags = 0u8;
                if payload.request.is_some() {
                    flags |= RESEND_HAS_REQUEST;
                }
                if let Some(event) = &payload.event {
                    flags |= RESEND_HAS_EVENT;
                    if event.tenant.is_some() {
                        flags |= RESEND_HAS_TENANT;
                    }
                }
                if payload.hops > 0 {
                    flags |= RESEND_HAS_HOPS;
                }
                out.push(flags);
                put_str16(out, &payload.content_type);
                if let Some(req) = &payload.request {
                    put_request(out, req);
                }
                if let Some(event) = &payload.event {
                    put_u64(out, event.id.0);
                    put_str16(out, &event.event_type);
                    if let Some(tenant) = &event.tenant {
                        put_str16(out, tenant);
                    }
                }
                put_bytes32(out, &payload.body);
                if payload.hops > 0 {
                    out.push(payload.hops);
                }
            }
            Command::HistoryDrop { queue, ids } => {
                put_str16(out, queue);
                put_u32(out, ids.len() as u32);
                for id in ids {
                    put_u64(out, id.0);
                }
            }
            Command::SecretExpire { queue, expires_at } => {
                put_str16(out, queue);
                put_i64(out, *expires_at);
            }
            Command::Ack { queue, id }
            | Command::Expire { queue, id }
            | Command::Cancel { queue, id } => {
                put_str16(out, queue);
                put_u64(out, id.0);
            }
            Command::Redrive { queue, ids } | Command::Purge { queue, ids } => {
                put_str16(out, queue);
                put_u32(out, ids.len() as u32);
                for id in ids {
                    put_u64(out, id.0);
                }
            }
            Command::Retry {
                queue,
                id,
                visible_at,
                retry_count,
            } => {
                put_str16(out, queue);
                put_u64(out, id.0);
                put_i64(out, *visible_at);
                put_u32(out, *retry_count);
            }
            Command::Fail {
                queue,
                id,
                reason,
                last_status,
                retry_count,
            } => {
                put_str16(out, queue);
                put_u64(out, id.0);
                out.push(reason.code());
                out.extend_from_slice(&last_status.unwrap_or(0).to_le_bytes());
                put_u32(out, *retry_count);
            }
            Command::Epoch { epoch } => put_u64(out, *epoch),
            Command::Attempt {
                queue,
                id,
                attempts,
            } => {
                put_str16(out, queue);
                put_u64(out, id.0);
                put_u32(out, attempts.len() as u32);
                for a in attempts {
                    put_i64(out, a.at);
                    out.extend_from_slice(&a.status.unwrap_or(0).to_le_bytes());
                    put_u32(out, a.duration_ms);
                    put_bytes32(out, a.error.as_bytes());
                    put_bytes32(out, a.response.as_bytes());
                }
            }
            Command::DedupKey {
                queue,
                hash,
                first_at,
                id,
            } => {
                put_str16(out, queue);
                put_u64(out, *hash);
                put_i64(out, *first_at);
                put_u64(out, id.0);
            }
            Command::RaftBlank => {}
            Command::RaftMembership { config } => put_bytes32(out, config),
            Command::RetireNode { id } => put_u64(out, *id),
            Command::EventType { name, definition } => {
                put_str16(out, name);
                put_bytes32(out, definition);
            }
        }
    }

    /// Decodes a record body. Strings borrow from `body`; an enqueue's
    /// payload is skipped (`decode_payload_of` reads it).
    pub fn decode(kind: u8, body: &[u8]) -> Result<Record<'_>, DecodeError> {
        let mut r = Reader { buf: body, pos: 0 };
        let at = r.i64()?;
        let command = match kind {
            kind::QUEUE_UPSERT => {
                let name = Cow::Borrowed(r.str16()?);
                let managed_by_config = r.u8()? != 0;
                let json = r.bytes32()?;
                let settings = serde_json::from_slice(json)
                    .map_err(|e| DecodeError(format!("queue settings: {e}")))?;
                Command::QueueUpsert {
                    name,
                    settings: Box::new(settings),
                    managed_by_config,
                }
            }
            kind::QUEUE_DELETE => Command::QueueDelete {
                name: Cow::Borrowed(r.str16()?),
            },
            kind::QUEUE_PAUSE => Command::QueuePause {
                name: Cow::Borrowed(r.str16()?),
                paused: r.u8()? != 0,
            },
            kind::ENQUEUE => {
                let (mut meta, flags) = read_enqueue_head(&mut r)?;
                if flags & ENQUEUE_HAS_ORDERING != 0 {
                    // After the payload (skipped, not copied), the trace
                    // and the hops.
                    r.str16()?;
                    if flags & ENQUEUE_HAS_REQUEST != 0 {
                        read_request(&mut r)?;
                    }
                    r.bytes32()?;
                    if flags & ENQUEUE_HAS_TRACE != 0 {
                        r.str16()?;
                    }
                    if flags & ENQUEUE_HAS_HOPS != 0 {
                        r.u8()?;
                    }
                    meta.ordering_key = Some(Cow::Borrowed(r.str16()?));
                }
                Command::Enqueue(meta)
            }
            kind::EVENT => {
                let (mut meta, flags) = read_event_head(&mut r)?;
                if flags & (EVENT_HAS_FINGERPRINT | EVENT_HAS_ORDERING) != 0 {
                    // After the payload (skipped, not copied) and the hops.
                    r.str16()?;
                    r.bytes32()?;
                    if flags & EVENT_HAS_HOPS != 0 {
                        r.u8()?;
                    }
                    if flags & EVENT_HAS_FINGERPRINT != 0 {
                        meta.fingerprint = Some(r.u64()?);
                    }
                    if flags & EVENT_HAS_ORDERING != 0 {
                        meta.ordering_key = Some(Cow::Borrowed(r.str16()?));
                    }
                }
                Command::Event(meta)
            }
            kind::RESEND => Command::Resend {
                queue: Cow::Borrowed(r.str16()?),
                id: r.id()?,
                from: r.id()?,
                visible_at: r.i64()?,
            },
            kind::HISTORY_DROP => {
                let queue = Cow::Borrowed(r.str16()?);
                let n = r.u32()? as usize;
                let mut ids = Vec::with_capacity(n.min(body.len() / 8));
                for _ in 0..n {
                    ids.push(r.id()?);
                }
                Command::HistoryDrop { queue, ids }
            }
            kind::SECRET_EXPIRE => Command::SecretExpire {
                queue: Cow::Borrowed(r.str16()?),
                expires_at: r.i64()?,
            },
            kind::ACK => Command::Ack {
                queue: Cow::Borrowed(r.str16()?),
                id: r.id()?,
            },
            kind::RETRY => Command::Retry {
                queue: Cow::Borrowed(r.str16()?),
                id: r.id()?,
                visible_at: r.i64()?,
                retry_count: r.u32()?,
            },
            kind::FAIL => {
                let queue = Cow::Borrowed(r.str16()?);
                let id = r.id()?;
                let code = r.u8()?;
                let reason = FailReason::from_code(code)
                    .ok_or_else(|| DecodeError(format!("unknown fail reason {code}")))?;
                let status = u16::from_le_bytes([r.u8()?, r.u8()?]);
                Command::Fail {
                    queue,
                    id,
                    reason,
                    last_status: (status != 0).then_some(status),
                    retry_count: r.u32()?,
                }
            }
            kind::EXPIRE => Command::Expire {
                queue: Cow::Borrowed(r.str16()?),
                id: r.id()?,
            },
            kind::CANCEL => Command::Cancel {
                queue: Cow::Borrowed(r.str16()?),
                id: r.id()?,
            },
            kind::PURGE | kind::REDRIVE => {
                let queue = Cow::Borrowed(r.str16()?);
                let n = r.u32()? as usize;
                let mut ids = Vec::with_capacity(n.min(body.len() / 8));
                for _ in 0..n {
                    ids.push(r.id()?);
                }
                if kind == kind::PURGE {
                    Command::Purge { queue, ids }
                } else {
                    Command::Redrive { queue, ids }
                }
            }
            kind::EPOCH => match r.u64()? {
                // Each start adds one to the last epoch: the last value has
                // no successor, so no journal can carry it.
                u64::MAX => return Err(DecodeError("epoch out of range".into())),
                epoch => Command::Epoch { epoch },
            },
            kind::ATTEMPT => {
                let queue = Cow::Borrowed(r.str16()?);
                let id = r.id()?;
                let n = r.u32()? as usize;
                let mut attempts = Vec::with_capacity(n.min(ATTEMPTS_KEPT));
                for _ in 0..n {
                    let at = r.i64()?;
                    let status = u16::from_le_bytes([r.u8()?, r.u8()?]);
                    let duration_ms = r.u32()?;
                    let error = r.str32()?.to_owned();
                    let response = r.str32()?.to_owned();
                    attempts.push(AttemptInfo {
                        at,
                        status: (status != 0).then_some(status),
                        error,
                        duration_ms,
                        response,
                    });
                }
                Command::Attempt {
                    queue,
                    id,
                    attempts,
                }
            }
            kind::DEDUP_KEY => Command::DedupKey {
                queue: Cow::Borrowed(r.str16()?),
                hash: r.u64()?,
                first_at: r.i64()?,
                id: r.id()?,
            },
            kind::RAFT_BLANK => Command::RaftBlank,
            kind::RAFT_MEMBERSHIP => Command::RaftMembership {
                config: Cow::Borrowed(r.bytes32()?),
            },
            kind::RETIRE_NODE => Command::RetireNode { id: r.u64()? },
            kind::EVENT_TYPE => Command::EventType {
                name: Cow::Borrowed(r.str16()?),
                definition: Cow::Borrowed(r.bytes32()?),
            },
            other => return Err(DecodeError(format!("unknown record kind {other}"))),
        };
        Ok(Record { at, command })
    }
}

/// An enqueue body after its `at`: what the state machine keeps (the
/// payload that follows stays on disk), and the flags that say what the
/// payload part holds. The one reader of this layout.
fn read_enqueue_head<'a>(r: &mut Reader<'a>) -> Result<(EnqueueMeta<'a>, u8), DecodeError> {
    let id = r.id()?;
    let visible_at = r.i64()?;
    let flags = r.u8()?;
    let hash = r.u64()?;
    let queue = Cow::Borrowed(r.str16()?);
    let meta = EnqueueMeta {
        id,
        queue,
        visible_at,
        dedup_hash: (flags & ENQUEUE_HAS_DEDUP != 0).then_some(hash),
        ordering_key: None,
    };
    Ok((meta, flags))
}

/// A stored request as an enqueue or resend record holds it.
fn put_request(out: &mut Vec<u8>, req: &StoredRequest) {
    put_str16(out, &req.method);
    put_bytes32(out, req.path.as_bytes());
    put_bytes32(out, req.query.as_bytes());
    put_u32(out, req.headers.len() as u32);
    for (name, value) in &req.headers {
        put_str16(out, name);
        put_bytes32(out, value.as_bytes());
    }
}

fn read_request(r: &mut Reader<'_>) -> Result<StoredRequest, DecodeError> {
    let method = r.str16()?.to_owned();
    let path = r.str32()?.to_owned();
    let query = r.str32()?.to_owned();
    let n = r.u32()? as usize;
    let mut headers = Vec::with_capacity(n.min(256));
    for _ in 0..n {
        headers.push((r.str16()?.to_owned(), r.str32()?.to_owned()));
    }
    Ok(StoredRequest {
        method,
        path,
        query,
        headers,
    })
}

/// An event body after its `at`, up to its payload, and its flags. The
/// one reader of this layout.
fn read_event_head<'a>(r: &mut Reader<'a>) -> Result<(EventMeta<'a>, u8), DecodeError> {
    let id = r.id()?;
    let visible_at = r.i64()?;
    let flags = r.u8()?;
    let hash = r.u64()?;
    let event_type = Cow::Borrowed(r.str16()?);
    let tenant = if flags & EVENT_HAS_TENANT != 0 {
        Some(Cow::Borrowed(r.str16()?))
    } else {
        None
    };
    let n = r.u32()? as usize;
    let mut deliveries = Vec::with_capacity(n.min(r.buf.len() / 10));
    for _ in 0..n {
        deliveries.push((Cow::Borrowed(r.str16()?), r.id()?));
    }
    let meta = EventMeta {
        id,
        event_type,
        tenant,
        visible_at,
        dedup_hash: (flags & EVENT_HAS_DEDUP != 0).then_some(hash),
        fingerprint: None,
        deliveries,
        ordering_key: None,
    };
    Ok((meta, flags))
}

/// Decodes the attempts of an attempt record's body.
pub fn decode_attempts(body: &[u8]) -> Result<Vec<AttemptInfo>, DecodeError> {
    match Record::decode(kind::ATTEMPT, body)?.command {
        Command::Attempt { attempts, .. } => Ok(attempts),
        _ => Err(DecodeError("not an attempt record".into())),
    }
}

/// Decodes the on-disk part of an enqueue body: content type, stored
/// request and payload bytes. For tests and fuzz targets (`testing`): the
/// engine reads payloads with `decode_payload_of`.
#[cfg(any(test, feature = "testing"))]
pub fn decode_payload(body: &[u8]) -> Result<Payload, DecodeError> {
    decode_payload_of(kind::ENQUEUE, body)
}

/// Decodes the payload of an enqueue or an event record: content type,
/// stored request (an enqueue's), event tag (an event's) and bytes.
pub(crate) fn decode_payload_of(record_kind: u8, body: &[u8]) -> Result<Payload, DecodeError> {
    let mut r = Reader { buf: body, pos: 0 };
    r.i64()?; // at
    if record_kind == kind::RESEND {
        return decode_resend_payload(&mut r);
    }
    if record_kind == kind::EVENT {
        return decode_event_payload(&mut r);
    }
    decode_enqueue_payload(&mut r)
}

/// A resend's payload, after its `at`: the copy's content type, request
/// and event tag (each if its flag says so), bytes and hops.
fn decode_resend_payload(r: &mut Reader<'_>) -> Result<Payload, DecodeError> {
    r.str16()?; // queue
    r.id()?; // id
    let from = r.id()?;
    r.i64()?; // visible_at
    let flags = r.u8()?;
    let content_type = r.str16()?.to_owned();
    let request = if flags & RESEND_HAS_REQUEST != 0 {
        Some(read_request(r)?)
    } else {
        None
    };
    let event = if flags & RESEND_HAS_EVENT != 0 {
        let id = r.id()?;
        let event_type = r.str16()?.to_owned();
        let tenant = if flags & RESEND_HAS_TENANT != 0 {
            Some(r.str16()?.to_owned())
        } else {
            None
        };
        Some(EventTag {
            id,
            event_type,
            tenant,
        })
    } else {
        None
    };
    let body = Bytes::copy_from_slice(r.bytes32()?);
    let hops = if flags & RESEND_HAS_HOPS != 0 {
        r.u8()?
    } else {
        0
    };
    Ok(Payload {
        content_type,
        request,
        event,
        resent_from: Some(from),
        trace: None,
        hops,
        ordering_key: None,
        body,
    })
}

/// An event's payload, after its `at`: the event's tag from its head,
/// then content type, bytes, hops, ordering key and trace.
fn decode_event_payload(r: &mut Reader<'_>) -> Result<Payload, DecodeError> {
    let (meta, flags) = read_event_head(r)?;
    let content_type = r.str16()?.to_owned();
    let body = Bytes::copy_from_slice(r.bytes32()?);
    let hops = if flags & EVENT_HAS_HOPS != 0 {
        r.u8()?
    } else {
        0
    };
    if flags & EVENT_HAS_FINGERPRINT != 0 {
        r.u64()?;
    }
    let ordering_key = if flags & EVENT_HAS_ORDERING != 0 {
        Some(r.str16()?.to_owned())
    } else {
        None
    };
    let trace = if flags & EVENT_HAS_TRACE != 0 {
        Some(r.str16()?.to_owned())
    } else {
        None
    };
    Ok(Payload {
        content_type,
        request: None,
        event: Some(EventTag {
            id: meta.id,
            event_type: meta.event_type.into_owned(),
            tenant: meta.tenant.map(Cow::into_owned),
        }),
        resent_from: None,
        trace,
        hops,
        ordering_key,
        body,
    })
}

/// An enqueue's payload, after its `at`: content type, stored request,
/// bytes, trace, hops and ordering key.
fn decode_enqueue_payload(r: &mut Reader<'_>) -> Result<Payload, DecodeError> {
    let (_, flags) = read_enqueue_head(r)?;
    let content_type = r.str16()?.to_owned();
    let request = if flags & ENQUEUE_HAS_REQUEST != 0 {
        Some(read_request(r)?)
    } else {
        None
    };
    let body = Bytes::copy_from_slice(r.bytes32()?);
    let trace = if flags & ENQUEUE_HAS_TRACE != 0 {
        Some(r.str16()?.to_owned())
    } else {
        None
    };
    let hops = if flags & ENQUEUE_HAS_HOPS != 0 {
        r.u8()?
    } else {
        0
    };
    let ordering_key = if flags & ENQUEUE_HAS_ORDERING != 0 {
        Some(r.str16()?.to_owned())
    } else {
        None
    };
    Ok(Payload {
        content_type,
        request,
        event: None,
        resent_from: None,
        trace,
        hops,
        ordering_key,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spool::MessageId;

    fn round_trip(record: Record<'static>, payload: Option<&Payload>) {
        let mut body = Vec::new();
        record.encode(payload, &mut body);
        let decoded = Record::decode(record.kind(), &body).unwrap();
        assert_eq!(decoded, record);
        for cut in 0..body.len() {
            // A truncated body never decodes into something else silently:
            // it either fails or (for trailing payload bytes) still yields the
            // same command.
            if let Ok(r) = Record::decode(record.kind(), &body[..cut]) {
                assert_eq!(r.kind(), record.kind());
            }
        }
    }

    #[test]
    fn every_command_round_trips() {
        let q = || Cow::Borrowed("orders");
        let commands = vec![
            Command::QueueUpsert {
                name: q(),
                settings: Box::default(),
                managed_by_config: true,
            },
            Command::QueueDelete { name: q() },
            Command::QueuePause {
                name: q(),
                paused: true,
            },
            Command::Ack {
                queue: q(),
                id: MessageId(7),
            },
            Command::Retry {
                queue: q(),
                id: MessageId(7),
                visible_at: 99,
                retry_count: 3,
            },
            Command::Fail {
                queue: q(),
                id: MessageId(7),
                reason: FailReason::PermanentStatus,
                last_status: Some(410),
                retry_count: 2,
            },
            Command::Expire {
                queue: q(),
                id: MessageId(7),
            },
            Command::Cancel {
                queue: q(),
                id: MessageId(7),
            },
            Command::Purge {
                queue: q(),
                ids: vec![MessageId(1), MessageId(2)],
            },
            Command::DedupKey {
                queue: q(),
                hash: 0xfeed,
                first_at: 77,
                id: MessageId(5),
            },
            Command::Attempt {
                queue: q(),
                id: MessageId(5),
                attempts: vec![
                    AttemptInfo {
                        at: 1,
                        status: Some(503),
                        error: String::new(),
                        duration_ms: 12,
                        response: "busy".into(),
                    },
                    AttemptInfo {
                        at: 2,
                        status: None,
                        error: "connection refused".into(),
                        duration_ms: 1,
                        response: String::new(),
                    },
                ],
            },
            Command::Redrive {
                queue: q(),
                ids: vec![MessageId(7), MessageId(9)],
            },
            Command::Epoch { epoch: 3 },
        ];
        for command in commands {
            round_trip(Record { at: 1234, command }, None);
        }
    }

    #[test]
    fn enqueue_keeps_its_payload_on_disk_only() {
        let payload = Payload {
            content_type: "application/json".into(),
            request: Some(StoredRequest {
                method: "POST".into(),
                path: "/hooks/a".into(),
                query: "x=1".into(),
                headers: vec![("X-A".into(), "1".into())],
            }),
            event: None,
            resent_from: None,
            trace: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            hops: 2,
            ordering_key: Some("acct-7".into()),
            body: Bytes::from_static(b"{\"a\":1}"),
        };
        let record = Record {
            at: 5,
            command: Command::Enqueue(EnqueueMeta {
                ordering_key: Some(Cow::Borrowed("acct-7")),
                id: MessageId(42),
                queue: Cow::Borrowed("billing"),
                visible_at: 6,
                dedup_hash: Some(0xdead),
            }),
        };
        round_trip(record.clone(), Some(&payload));
        let mut body = Vec::new();
        record.encode(Some(&payload), &mut body);
        assert_eq!(decode_payload(&body).unwrap(), payload);
    }

    #[test]
    fn an_event_lists_its_deliveries_and_keeps_one_payload_on_disk() {
        let payload = Payload {
            content_type: "application/json".into(),
            request: None,
            event: None,
            resent_from: None,
            trace: None,
            hops: 0,
            ordering_key: None,
            body: Bytes::from_static(b"{\"invoice\":7}"),
        };
        for tenant in [None, Some(Cow::Borrowed("cus_42"))] {
            // The tenant's event carries an ordering key, after its
            // fingerprint.
            let ordering_key = tenant.as_ref().map(|_| Cow::Borrowed("acct-7"));
            let meta = EventMeta {
                ordering_key: ordering_key.clone(),
                id: MessageId(10),
                event_type: Cow::Borrowed("invoice.paid"),
                tenant: tenant.clone(),
                visible_at: 6,
                dedup_hash: tenant.as_ref().map(|_| 0xbeef),
                fingerprint: tenant.as_ref().map(|_| 0xfeed),
                deliveries: vec![
                    (Cow::Borrowed("cus-1"), MessageId(11)),
                    (Cow::Borrowed("cus-2"), MessageId(12)),
                ],
            };
            let record = Record {
                at: 5,
                command: Command::Event(meta),
            };
            round_trip(record.clone(), Some(&payload));
            let mut body = Vec::new();
            record.encode(Some(&payload), &mut body);
            let read = decode_payload_of(kind::EVENT, &body).unwrap();
            assert_eq!(read.body, payload.body);
            assert_eq!(read.content_type, payload.content_type);
            let tag = read.event.unwrap();
            assert_eq!(tag.id, MessageId(10));
            assert_eq!(tag.event_type, "invoice.paid");
            assert_eq!(tag.tenant.as_deref(), tenant.as_deref());
            assert_eq!(read.ordering_key.as_deref(), ordering_key.as_deref());
        }
    }

    #[test]
    fn unknown_kinds_are_errors() {
        assert!(Record::decode(200, &[0; 16]).is_err());
    }

    /// Values whose successor would overflow during replay (found by
    /// `cargo fuzz`) are damage, not records.
    #[test]
    fn an_epoch_or_id_with_no_successor_does_not_decode() {
        let encoded = |command: Command<'static>| {
            let mut body = Vec::new();
            Record { at: 1, command }.encode(None, &mut body);
            body
        };
        let epoch = encoded(Command::Epoch { epoch: u64::MAX });
        let err = Record::decode(kind::EPOCH, &epoch).unwrap_err();
        assert!(err.0.contains("epoch out of range"), "{err:?}");
        let ack = encoded(Command::Ack {
            queue: Cow::Borrowed("q"),
            id: MessageId(1 << 63),
        });
        let err = Record::decode(kind::ACK, &ack).unwrap_err();
        assert!(err.0.contains("out of range"), "{err:?}");
        let largest = encoded(Command::Ack {
            queue: Cow::Borrowed("q"),
            id: MessageId((1 << 63) - 1),
        });
        assert!(Record::decode(kind::ACK, &largest).is_ok());
    }
}
