//! The state machine's own values: a message as memory keeps it, what a
//! delivered one leaves in history, leases, counters, and the answers
//! applying and leasing give.

use crate::journal::RecordLoc;
use crate::spool::command::{FailInfo, MessageId};
use crate::time::Millis;

/// One message, as memory keeps it: times, counts and where its record is.
/// Payload, content type and stored request stay on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    pub enqueued_at: Millis,
    /// When it became (or becomes) visible; its place in line.
    pub visible_at: Millis,
    /// Retention runs from here.
    pub retention_from: Millis,
    pub loc: RecordLoc,
    pub retry_count: u32,
    /// A removal or move of this message is being written.
    pub pending: bool,
    /// Its record is an event's, which other messages (the event's other
    /// deliveries) point at too.
    pub shared: bool,
}

/// A delivered message kept in its queue's history (`history_retention`):
/// times, counts and where its records are. Payload and attempts stay on
/// disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub enqueued_at: Millis,
    pub delivered_at: Millis,
    pub retry_count: u32,
    pub loc: RecordLoc,
    pub shared: bool,
    pub attempts: Option<RecordLoc>,
}

impl Delivered {
    /// As a message view (`state` delivered, `visible_at` its delivery).
    pub fn view(&self, id: MessageId) -> MessageView {
        MessageView {
            id,
            state: MessageState::Delivered,
            message: Message {
                enqueued_at: self.enqueued_at,
                visible_at: self.delivered_at,
                retention_from: self.delivered_at,
                loc: self.loc,
                retry_count: self.retry_count,
                pending: false,
                shared: self.shared,
            },
            failure: None,
        }
    }

    /// Bytes of the records it keeps on disk.
    pub(super) fn bytes(&self) -> u64 {
        u64::from(self.loc.len) + self.attempts.map_or(0, |a| u64::from(a.len))
    }
}

/// A consumer's (or push worker's) hold on a message. Memory only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    pub serial: u64,
    pub expires_at: Millis,
    /// An ack, nack or expiry of this lease is being written.
    pub settling: bool,
}

/// Monotonic per-queue counters (docs/contract.md §4 stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub sent: u64,
    pub acked: u64,
    pub nacked: u64,
    pub expired: u64,
    pub failed: u64,
    pub deduplicated: u64,
    /// Delivery attempts of a push queue, and the failed ones.
    pub deliveries: u64,
    pub delivery_failures: u64,
}

/// What applying a record did, for the engine's answer (in replicated
/// mode it travels back from Raft's state machine, hence serde).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Applied {
    Done,
    /// The record referred to a queue or message that is gone.
    Missing,
    /// How many messages a purge removed or a redrive moved.
    Count(u64),
}

/// A message just leased.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Leased {
    pub id: MessageId,
    pub serial: u64,
    pub expires_at: Millis,
    pub message: Message,
    /// Why it is in a failure queue, if it is.
    pub failure: Option<FailInfo>,
}

/// What a peek shows of a message (besides what is read from disk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageView {
    pub id: MessageId,
    pub state: MessageState,
    pub message: Message,
    pub failure: Option<FailInfo>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageState {
    Visible,
    Delayed,
    Leased,
    /// Waiting behind an earlier message of its ordering key (an ordered
    /// queue), whatever its delay.
    Held,
    /// In the queue's history: delivered (acked).
    Delivered,
}

impl MessageState {
    pub fn as_str(self) -> &'static str {
        match self {
            MessageState::Visible => "visible",
            MessageState::Delayed => "delayed",
            MessageState::Leased => "leased",
            MessageState::Held => "held",
            MessageState::Delivered => "delivered",
        }
    }
}

/// A queue's stats at `now` (docs/contract.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueStats {
    pub visible: u64,
    pub leased: u64,
    pub delayed: u64,
    /// Waiting behind an earlier message of their ordering key (an
    /// ordered queue): out of line, in none of the counts above.
    pub held: u64,
    pub counters: Counters,
    pub oldest_visible_age_ms: Option<i64>,
    /// Messages tried and failed at least once, still in the queue (not in
    /// a failure queue's stats), and how long ago the oldest was sent: a
    /// message stuck retrying is delayed most of the time, so the oldest
    /// visible age does not show it.
    pub retrying: u64,
    pub oldest_retrying_age_ms: Option<i64>,
    /// Paused by an operator (`pause`); the breaker is [`Self::next_probe_at`].
    pub paused: bool,
    /// While the circuit breaker is open: when its next probe is due.
    pub next_probe_at: Option<Millis>,
    /// How many secrets sign its deliveries now, and when the one a
    /// rotation replaced stops (docs/contract.md §5, "Secret rotation").
    pub signing_secrets: u64,
    pub previous_secret_expires_at: Option<Millis>,
}

/// An event remembered by its idempotency key: what a repeat answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EventSeen {
    pub first_at: Millis,
    pub id: MessageId,
    /// What the event said (`EventMeta::fingerprint`), when its record
    /// carries it.
    pub fingerprint: Option<u64>,
    pub deliveries: Vec<(String, MessageId)>,
}

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SpoolError {
    #[error("queue not found")]
    QueueNotFound,
    #[error("message not found")]
    MessageNotFound,
    /// The lease expired, was settled, or the message is gone or moving.
    #[error("lease is no longer valid")]
    StaleLease,
}

/// A push queue's circuit breaker, the one place its state lives (memory
/// only: a restart closes it): the retryable failures in a row, and while
/// it is open, when its next probe is due.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Breaker {
    pub failures: u32,
    pub next_probe: Option<Millis>,
}

/// What one settled attempt did to its queue's breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BreakerTurn {
    /// Nothing it did changed whether the breaker is open.
    Unchanged { open: bool },
    /// This attempt's failure was one too many: the breaker opened.
    Opened,
}

/// An attempt as the breaker counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptEffect {
    Delivered,
    /// A status the queue lists as permanent.
    Permanent,
    /// Anything else: a status to retry, no answer; `probe` for the
    /// breaker's own probe.
    Retryable {
        probe: bool,
    },
}
