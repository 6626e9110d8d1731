//! The state machine: queues, messages, leases, retries, failure queues.
//!
//! **Invariant:** nothing in this module does I/O or reads the clock. Time
//! comes in as `now` (or as a record's `at`), so every timing rule (lease
//! expiry, delays, retention, dedup windows) is tested without sleeping.
//!
//! Memory holds only an index per message (`state::Message`: times, counts
//! and the location of its journal record); payloads, content types and
//! stored requests are read back from disk when a consumer needs them.
//!
//! Line order: each queue keeps its waiting messages in a set ordered by
//! `(visible_at, id)`. A new message joins at its send time (or after its
//! delay); a nacked or expired lease rejoins at the moment it becomes visible
//! again, behind everything already waiting, so a failing message never
//! blocks the ones behind it.

pub(crate) mod checkpoint;
mod codec;
pub(crate) mod command;
pub(crate) mod content_filter;
pub(crate) mod event;
mod filter;
pub(crate) mod queue;
pub(crate) mod record;
pub mod search;
pub(crate) mod state;

pub(crate) use checkpoint::{CheckpointLoader, CheckpointMeta};
pub(crate) use codec::DecodeError;
pub(crate) use command::{Command, EnqueueMeta, Record};
pub use command::{FailReason, MessageId, Payload, StoredRequest};
pub use content_filter::ContentFilter;
pub use filter::{DeadLetterFilter, Selection, StatusMatch};
pub use queue::{OnExpire, Ordering, OrderingOnFailure, PreviousSecret, QueueSettings};
pub use state::SpoolState;
pub(crate) use state::{Applied, Leased, Spool, SpoolError};
pub use state::{Delivered, MessageState, MessageView, QueueStats};

#[cfg(test)]
pub(crate) mod golden_tests;
#[cfg(test)]
mod tests;
