//! Commands: the input language of the state machine, and the record kinds
//! of the journal. Each journal record is one [`Record`]; replaying them in
//! order rebuilds the state, so they form a clean command log that a
//! replicated mode can ship as is.
//!
//! Every command is unconditional: its effect depends only on the state
//! *without leases* (which are not journaled) and the command itself. The
//! engine decides lease-dependent questions ("is this ack's lease still
//! valid?") before it appends, so replay and the live process always agree.
//!
//! Every command about a message is also *absolute*: it names the message
//! ids it touches and sets their state (queue, retry count, visible time)
//! rather than changing it relative to what was there. That is what lets
//! compaction drop superseded records without replaying the rest
//! differently: the last surviving record about a message decides its
//! state.
//!
//! How a record is laid out on disk is `record.rs`'s business.

use std::borrow::Cow;

use bytes::Bytes;

use super::queue::QueueSettings;
use crate::time::Millis;

/// A message id: unique within a spool, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MessageId(pub u64);

/// Most message ids one purge or redrive record lists: a purge of a huge
/// queue becomes several records (appended as one batch), each far below
/// the record size limit (8 bytes an id: 512 KiB).
pub const IDS_PER_RECORD_MAX: usize = 64 * 1024;

/// Why and when a message reached a failure queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailInfo {
    pub reason: FailReason,
    pub last_status: Option<u16>,
    pub failed_at: Millis,
}

/// Why a message moved to a failure queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailReason {
    RetriesExhausted,
    PermanentStatus,
    Expired,
}

impl FailReason {
    pub const ALL: [FailReason; 3] = [
        FailReason::RetriesExhausted,
        FailReason::PermanentStatus,
        FailReason::Expired,
    ];

    /// The reason named as [`FailReason::as_str`] spells it.
    pub fn parse(text: &str) -> Option<FailReason> {
        FailReason::ALL.into_iter().find(|r| r.as_str() == text)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FailReason::RetriesExhausted => "retries_exhausted",
            FailReason::PermanentStatus => "permanent_status",
            FailReason::Expired => "expired",
        }
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            FailReason::RetriesExhausted => 1,
            FailReason::PermanentStatus => 2,
            FailReason::Expired => 3,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<FailReason> {
        match code {
            1 => Some(FailReason::RetriesExhausted),
            2 => Some(FailReason::PermanentStatus),
            3 => Some(FailReason::Expired),
            _ => None,
        }
    }
}

/// The part of an enqueue the state machine keeps in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnqueueMeta<'a> {
    pub id: MessageId,
    pub queue: Cow<'a, str>,
    pub visible_at: Millis,
    /// Hash of the `Idempotency-Key`, when the send had one.
    pub dedup_hash: Option<u64>,
    /// The `Spooler-Ordering-Key`, when the send had one.
    pub ordering_key: Option<Cow<'a, str>>,
}

/// An event: one record that is a message in every queue subscribing to
/// its type (`spool::event`), each delivery with an id of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventMeta<'a> {
    /// The event's own id (no message has it).
    pub id: MessageId,
    pub event_type: Cow<'a, str>,
    pub tenant: Option<Cow<'a, str>>,
    pub visible_at: Millis,
    /// Hash of the `Idempotency-Key`, when the event had one.
    pub dedup_hash: Option<u64>,
    /// With a key: what the event said (its type and body), hashed, so
    /// that a repeat of the key with something else is told apart from a
    /// retry (`409 idempotency_key_reused`).
    pub fingerprint: Option<u64>,
    /// The queue and message id of each delivery, queues in name order.
    pub deliveries: Vec<(Cow<'a, str>, MessageId)>,
    /// The event's `orderingKey`: each delivery's key in its queue.
    pub ordering_key: Option<Cow<'a, str>>,
}

/// What an event's deliveries carry besides the payload: its type and
/// tenant (sent as `Spooler-Event-Type`, `Spooler-Tenant`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EventTag {
    pub id: MessageId,
    pub event_type: String,
    pub tenant: Option<String>,
}

/// A stored outbound HTTP request (what `/v1/forward` keeps besides the
/// body).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoredRequest {
    pub method: String,
    pub path: String,
    pub query: String,
    pub headers: Vec<(String, String)>,
}

/// One delivery attempt of a push queue's worker.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AttemptInfo {
    pub at: Millis,
    /// The destination's status, if it answered.
    pub status: Option<u16>,
    /// Why there was no usable answer (connect error, timeout, …).
    pub error: String,
    pub duration_ms: u32,
    /// The first KiB of the response body.
    pub response: String,
}

/// Attempts kept per message (docs/contract.md §3: "the last 10").
pub(crate) const ATTEMPTS_KEPT: usize = 10;

/// Most spoold deliveries a message may have come through: more is a
/// loop (`api/hops.rs` refuses it with `508`; an operational event past it
/// is not published, `engine/operational.rs`).
pub(crate) const HOPS_MAX: u8 = 8;

/// What stays on disk: read back by receive and peek.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Payload {
    pub content_type: String,
    pub request: Option<StoredRequest>,
    /// Set when the message is a delivery of an event.
    pub event: Option<EventTag>,
    /// Set when the message is a resend of a delivered one (its id).
    pub resent_from: Option<MessageId>,
    /// The W3C `traceparent` its delivery attempts continue (a send's or
    /// forward's; docs/contract.md §8).
    pub trace: Option<String>,
    /// How many spoold deliveries the message came through
    /// (`Spooler-Hops`, `api/hops.rs`): its own deliveries say one more.
    /// At most [`HOPS_MAX`].
    pub hops: u8,
    /// The ordering key the message was sent with (docs/contract.md §2,
    /// "Ordered delivery per key"): shown by peek, receive and delivery.
    pub ordering_key: Option<String>,
    /// Shared, not copied: the HTTP layer's buffer goes straight into the
    /// journal record, and a delivery attempt clones a reference.
    pub body: Bytes,
}

impl Payload {
    /// About what its record takes in the journal, counting the body and
    /// the request's strings (the fixed fields are within a segment's
    /// headroom): what the disk bound checks before a write.
    pub fn stored_bytes(&self) -> u64 {
        let request = self.request.as_ref().map_or(0, |r| {
            r.method.len()
                + r.path.len()
                + r.query.len()
                + r.headers
                    .iter()
                    .map(|(n, v)| n.len() + v.len())
                    .sum::<usize>()
        });
        (self.body.len() + self.content_type.len() + request) as u64
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Command<'a> {
    QueueUpsert {
        name: Cow<'a, str>,
        settings: Box<QueueSettings>,
        managed_by_config: bool,
    },
    QueueDelete {
        name: Cow<'a, str>,
    },
    QueuePause {
        name: Cow<'a, str>,
        paused: bool,
    },
    Enqueue(EnqueueMeta<'a>),
    /// An event and its deliveries (each an enqueue into its queue).
    Event(EventMeta<'a>),
    /// A delivered message sent again: a new message `id` in `queue` with
    /// the payload of `from` (copied into this record).
    Resend {
        queue: Cow<'a, str>,
        id: MessageId,
        from: MessageId,
        visible_at: Millis,
    },
    /// A rotated-out signing secret's overlap ended: `queue` stops
    /// signing with it, if it is still the one that ends at `expires_at`
    /// (a later rotation or `PUT` may have replaced it).
    SecretExpire {
        queue: Cow<'a, str>,
        expires_at: Millis,
    },
    /// Forgets delivered messages of `queue`'s history (past its
    /// retention).
    HistoryDrop {
        queue: Cow<'a, str>,
        ids: Vec<MessageId>,
    },
    /// Removes a message for good.
    Ack {
        queue: Cow<'a, str>,
        id: MessageId,
    },
    /// Makes a message visible again at `visible_at` with `retry_count`
    /// (a nack or a lease expiry).
    Retry {
        queue: Cow<'a, str>,
        id: MessageId,
        visible_at: Millis,
        retry_count: u32,
    },
    /// Moves a message from `queue` to its failure queue, keeping
    /// `retry_count`.
    Fail {
        queue: Cow<'a, str>,
        id: MessageId,
        reason: FailReason,
        last_status: Option<u16>,
        retry_count: u32,
    },
    /// Retention discarded a message.
    Expire {
        queue: Cow<'a, str>,
        id: MessageId,
    },
    Cancel {
        queue: Cow<'a, str>,
        id: MessageId,
    },
    /// Removes the listed messages of a queue: every message it held when
    /// the purge was decided.
    Purge {
        queue: Cow<'a, str>,
        ids: Vec<MessageId>,
    },
    /// Moves messages from `queue`'s failure queue back into `queue`.
    Redrive {
        queue: Cow<'a, str>,
        ids: Vec<MessageId>,
    },
    /// A process started; leases of older epochs are stale.
    Epoch {
        epoch: u64,
    },
    /// The last attempts (at most [`ATTEMPTS_KEPT`], oldest first) of
    /// delivering a message; each record carries them all, so the newest
    /// one is all that matters.
    Attempt {
        queue: Cow<'a, str>,
        id: MessageId,
        attempts: Vec<AttemptInfo>,
    },
    /// Replicated mode: Raft's blank entry; nothing to apply.
    RaftBlank,
    /// Replicated mode: the replica set changed. The state machine keeps
    /// the newest `config` (opaque bytes of the cluster module) so that a
    /// checkpoint carries it.
    RaftMembership {
        config: Cow<'a, [u8]>,
    },
    /// Replicated mode: node `id` is leaving the replica set and may never
    /// join it again (a new member under an old id would replay old
    /// memberships in which it voted: docs/replication.md).
    RetireNode {
        id: u64,
    },
    /// The event catalogue's entry `name` (docs/contract.md §4): its
    /// definition as JSON (`engine/catalogue.rs` reads it), or, empty,
    /// none any more.
    EventType {
        name: Cow<'a, str>,
        definition: Cow<'a, [u8]>,
    },
    /// A dedup key that outlives its message: written by compaction in place
    /// of a dropped enqueue whose key is still inside its window.
    DedupKey {
        queue: Cow<'a, str>,
        hash: u64,
        first_at: Millis,
        id: MessageId,
    },
}

/// A journal record: a command and when it was decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Record<'a> {
    pub at: Millis,
    pub command: Command<'a>,
}
