//! Operational events (docs/contract.md §4, "Operational events"): spoold
//! publishes its own events, types under `spoold.`, into the same fan-out
//! as any event, so that an operator subscribes a queue to `spoold.>` and
//! is told when a message fails, a breaker opens or closes, a rotated-out
//! secret is about to go, or the spool fills up.
//!
//! What happens is noted where it happens ([`Engine::tell`]: the apply
//! path, the breaker), without waiting: a bounded queue takes it, and one
//! task ([`Engine::spawn_operational`]) publishes, and looks once a second
//! at what is not an event of its own (how full the spool is, which old
//! secrets end within the hour). Only the primary (or a single node)
//! publishes; a note past the queue's bound is dropped and counted.
//!
//! An event never goes to the queue it describes (nor its failure queue),
//! carries that queue's tenant, and one more hop than the message it is
//! about: past [`HOPS_MAX`] it is not published, so two queues that
//! subscribe to each other's failures cannot loop.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::Engine;
use super::events::{EventRequest, Publisher};
use crate::spool::command::{FailReason, HOPS_MAX, MessageId};
use crate::spool::queue::failed_queue_name;
use crate::spool::{Command, Payload};
use crate::time::{Millis, format_rfc3339};

/// The event that warns of a full spool: written even into a full one
/// (`events.rs`), since it is the one an operator needs then.
pub(crate) const NEAR_FULL_TYPE: &str = "spoold.spool.near_full";
/// Notes waiting for the publisher at most; more are dropped (counted).
const PENDING_MAX: usize = 1024;
/// How often the publisher looks at the spool's fill and the secrets.
const WATCH_EVERY: Duration = Duration::from_secs(1);
/// `secret_expiring` comes this long before a rotated-out secret goes.
pub(crate) const SECRET_WARNING_MS: i64 = 3_600_000;
/// `near_full` at this share of `max_bytes` or of the memory bound (in
/// per mille), and again only after the fill went below the re-arm mark.
const NEAR_FULL_PER_MILLE: u64 = 900;
const NEAR_FULL_REARM_PER_MILLE: u64 = 800;

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
    rx: std::sync::Mutex<Option<mpsc::Receiver<Note>>>,
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

/// What the watch remembers between looks, so that each warning is told
/// once.
#[derive(Default)]
struct Watched {
    /// Per resource (disk, memory): told, and not yet back under the
    /// re-arm mark.
    near_full: [bool; 2],
    /// Rotated-out secrets (queue, end) already warned of.
    expiring: HashSet<(String, Millis)>,
}

impl Engine {
    /// Notes `note` for the publisher (see [`Notes::tell`]).
    pub(crate) fn tell(&self, note: Note) {
        self.inner.shared.notes.tell(note);
    }

    /// Publishes what [`Engine::tell`] noted, and what the watch sees,
    /// until the engine is dropped. `None` if it already runs.
    pub fn spawn_operational(&self) -> Option<tokio::task::JoinHandle<()>> {
        let rx = self
            .inner
            .shared
            .notes
            .rx
            .lock()
            .expect("notes lock")
            .take()?;
        let weak = std::sync::Arc::downgrade(&self.inner);
        Some(tokio::spawn(run(weak, rx)))
    }

    /// Publishes one note's event (if this replica serves, and the hop
    /// bound allows it).
    async fn publish_note(&self, note: Note) {
        if !self.is_serving() {
            return;
        }
        let hops = match &note.message {
            Some((queue, id)) => self.hops_of(queue, *id).await,
            None => 0,
        };
        if hops >= HOPS_MAX {
            crate::metrics::count_operational(note.kind, "past_hop_bound");
            return;
        }
        let mut payload = note.payload;
        if let (Some((_, id)), Value::Object(fields)) = (&note.message, &mut payload) {
            fields.insert("messageId".into(), self.inner.tokens.format_id(*id).into());
        }
        let tenant = (note.about.as_deref())
            .and_then(|q| self.queue_settings(q).ok())
            .and_then(|(settings, _)| settings.tenant);
        let request = EventRequest {
            event_type: format!("spoold.{}", note.kind),
            tenant,
            payload: Payload {
                content_type: "application/json".into(),
                hops: hops + 1,
                body: serde_json::to_vec(&payload)
                    .expect("JSON values serialize")
                    .into(),
                ..Payload::default()
            },
            dedup_key: None,
            headers: Default::default(),
            publisher: Publisher::Spoold { about: note.about },
        };
        let outcome = match self.publish(request).await {
            Ok(outcome) if outcome.deliveries.is_empty() => "no_subscribers",
            Ok(_) => "published",
            Err(e) => {
                tracing::warn!(error = %e, kind = note.kind, "an operational event was not published");
                "failed"
            }
        };
        crate::metrics::count_operational(note.kind, outcome);
    }

    /// The hop count of a message (read from disk off the runtime's
    /// threads); 0 if it is gone.
    async fn hops_of(&self, queue: &str, id: MessageId) -> u8 {
        let engine = self.clone();
        let queue = queue.to_owned();
        tokio::task::spawn_blocking(move || engine.payload(&queue, id).map(|p| p.hops))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(0)
    }

    /// Looks at the spool's fill and at the secrets about to go: what
    /// crossed a mark since the last look is told.
    fn watch(&self, watched: &mut Watched) {
        if !self.is_serving() {
            return;
        }
        let (memory, max_memory) = self.memory();
        let fills = [
            ("disk", self.disk_accounted(), self.max_bytes()),
            ("memory", memory, max_memory),
        ];
        for (i, (resource, used, max)) in fills.into_iter().enumerate() {
            if max == 0 || max == u64::MAX {
                continue;
            }
            let per_mille =
                u64::try_from(u128::from(used) * 1000 / u128::from(max)).unwrap_or(u64::MAX);
            if !watched.near_full[i] && per_mille >= NEAR_FULL_PER_MILLE {
                watched.near_full[i] = true;
                self.tell(near_full(resource, used, max, self.clock_ms()));
            } else if watched.near_full[i] && per_mille < NEAR_FULL_REARM_PER_MILLE {
                watched.near_full[i] = false;
            }
        }
        let now = self.clock_ms();
        let ending = self
            .core()
            .spool
            .previous_secrets_ending(now, now + SECRET_WARNING_MS);
        watched.expiring.retain(|(_, at)| *at > now);
        for (queue, at) in ending {
            if watched.expiring.insert((queue.clone(), at)) {
                self.tell(secret_expiring(queue, at));
            }
        }
    }
}

/// The publisher's loop: notes as they come, the watch once a second.
async fn run(weak: std::sync::Weak<super::Inner>, mut rx: mpsc::Receiver<Note>) {
    let mut watched = Watched::default();
    let mut tick = tokio::time::interval(WATCH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            note = rx.recv() => {
                let Some(note) = note else { return };
                let Some(inner) = weak.upgrade() else { return };
                Engine { inner }.publish_note(note).await;
            }
            _ = tick.tick() => {
                let Some(inner) = weak.upgrade() else { return };
                Engine { inner }.watch(&mut watched);
            }
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

fn secret_expiring(queue: String, expires_at: Millis) -> Note {
    Note {
        kind: "endpoint.secret_expiring",
        payload: json!({"queue": queue, "expiresAt": format_rfc3339(expires_at)}),
        about: Some(queue),
        message: None,
    }
}

fn near_full(resource: &str, used: u64, max: u64, at: Millis) -> Note {
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
