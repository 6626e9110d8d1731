//! The way from where something happens to the operational events'
//! publisher (`operational.rs`): a bounded queue that the apply path and
//! the breaker fill without waiting.

use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::spool::Command;
use crate::spool::command::{FailReason, MessageId};
use crate::spool::queue::failed_queue_name;
use crate::time::{Millis, format_rfc3339};

/// The event that warns of a full spool: written even into a full one
/// (`events.rs`), since it is the one an operator needs then.
pub(crate) const NEAR_FULL_TYPE: &str = "spoold.spool.near_full";

/// Notes waiting for the publisher at most; more are dropped (counted).
pub(super) const PENDING_MAX: usize = 1024;
/// Something spoold tells about itself.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Note {
    /// After `spoold.`: `message.failed`, `endpoint.breaker_opened`, …
    pub kind: &'static str,
    /// The queue it describes (never delivered to it), if any.
    pub about: Option<String>,
    /// The message it is about (queue, id): its id joins the payload as
    /// `messageId`, and the event goes one hop further than it.
    pub message: Option<(String, MessageId)>,
    pub payload: Value,
}

/// The notes' way to the publisher.
pub(super) struct Notes {
    tx: mpsc::Sender<Note>,
    pub(super) rx: std::sync::Mutex<Option<mpsc::Receiver<Note>>>,
}

impl Default for Notes {
    fn default() -> Notes {
        let (tx, rx) = mpsc::channel(PENDING_MAX);
        Notes {
            tx,
            rx: std::sync::Mutex::new(Some(rx)),
        }
    }
}

impl Notes {
    /// Takes `note` for the publisher, without waiting; dropped (and
    /// counted) when the publisher is that far behind.
    pub(super) fn tell(&self, note: Note) {
        let kind = note.kind;
        if self.tx.try_send(note).is_err() {
            crate::metrics::count_operational(kind, "dropped");
        }
    }
}

/// The note of an applied command, if it tells something: a message moved
/// to its failure queue.
pub(super) fn of_command(command: &Command<'_>, at: Millis) -> Option<Note> {
    let Command::Fail {
        queue,
        id,
        reason,
        last_status,
        retry_count,
    } = command
    else {
        return None;
    };
    // Each try but an expiry's last counts (an expiry tried no more).
    let attempts = retry_count + u32::from(*reason != FailReason::Expired);
    Some(Note {
        kind: "message.failed",
        about: Some(queue.to_string()),
        message: Some((failed_queue_name(queue), *id)),
        payload: json!({
            "queue": queue,
            "reason": reason.as_str(),
            "lastStatus": last_status,
            "attempts": attempts,
            "failedAt": format_rfc3339(at),
        }),
    })
}

/// A push queue's circuit breaker opened (`next_probe`: when it probes) or
/// closed.
pub(super) fn breaker(queue: &str, next_probe: Option<Millis>, at: Millis) -> Note {
    let (kind, payload) = match next_probe {
        Some(probe) => (
            "endpoint.breaker_opened",
            json!({"queue": queue, "openedAt": format_rfc3339(at), "nextProbeAt": format_rfc3339(probe)}),
        ),
        None => (
            "endpoint.breaker_closed",
            json!({"queue": queue, "closedAt": format_rfc3339(at)}),
        ),
    };
    Note {
        kind,
        about: Some(queue.to_owned()),
        message: None,
        payload,
    }
}

pub(super) fn secret_expiring(queue: String, expires_at: Millis) -> Note {
    Note {
        kind: "endpoint.secret_expiring",
        payload: json!({"queue": queue, "expiresAt": format_rfc3339(expires_at)}),
        about: Some(queue),
        message: None,
    }
}

pub(super) fn near_full(resource: &str, used: u64, max: u64, at: Millis) -> Note {
    Note {
        kind: "spool.near_full",
        about: None,
        message: None,
        payload: json!({
            "resource": resource,
            "usedBytes": used,
            "maxBytes": max,
            "at": format_rfc3339(at),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_past_the_bound_are_dropped_not_queued() {
        let notes = Notes::default();
        let note = |i: u64| breaker(&format!("q{i}"), None, 0);
        for i in 0..=PENDING_MAX as u64 {
            notes.tell(note(i));
        }
        let mut rx = notes.rx.lock().unwrap().take().unwrap();
        let mut queued = Vec::new();
        while let Ok(n) = rx.try_recv() {
            queued.push(n.about.unwrap());
        }
        assert_eq!(queued.len(), PENDING_MAX, "the bound holds");
        assert_eq!(queued.last().unwrap(), &format!("q{}", PENDING_MAX - 1));
    }

    #[test]
    fn a_failure_says_its_reason_status_and_attempts() {
        let fail = |reason, retry_count| Command::Fail {
            queue: "hooks".into(),
            id: MessageId(7),
            reason,
            last_status: Some(503),
            retry_count,
        };
        let note = of_command(&fail(FailReason::RetriesExhausted, 4), 0).unwrap();
        assert_eq!(note.kind, "message.failed");
        assert_eq!(note.message, Some(("hooks.failed".into(), MessageId(7))));
        assert_eq!(note.payload["attempts"], 5);
        assert_eq!(note.payload["lastStatus"], 503);
        assert_eq!(note.payload["reason"], "retries_exhausted");
        let expired = of_command(&fail(FailReason::Expired, 2), 0).unwrap();
        assert_eq!(expired.payload["attempts"], 2, "an expiry tried no more");
        let ack = Command::Ack {
            queue: "hooks".into(),
            id: MessageId(7),
        };
        assert_eq!(of_command(&ack, 0), None);
    }
}
