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

use serde_json::Value;
use tokio::sync::mpsc;

use super::Engine;
use super::events::{EventRequest, Publisher};
pub(crate) use super::notes::Note;
use super::notes::{near_full, secret_expiring};
use crate::spool::Payload;
use crate::spool::command::{HOPS_MAX, MessageId};
use crate::time::Millis;

/// How often the publisher looks at the spool's fill and the secrets.
const WATCH_EVERY: Duration = Duration::from_secs(1);
/// `secret_expiring` comes this long before a rotated-out secret goes.
pub(crate) const SECRET_WARNING_MS: i64 = 3_600_000;
/// `near_full` at this share of `max_bytes` or of the memory bound (in
/// per mille), and again only after the fill went below the re-arm mark.
const NEAR_FULL_PER_MILLE: u64 = 900;
const NEAR_FULL_REARM_PER_MILLE: u64 = 800;

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
