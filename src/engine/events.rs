//! Publishing an event: the subscribers found, one record with every
//! delivery written and fsynced, the answer after it.

use std::borrow::Cow;

use serde_json::{Map, Value};
use tokio::sync::oneshot;

use super::Engine;
use super::core::{Core, Reply};
use super::error::EventError;
use super::error::closed;
use crate::spool::command::EventMeta;
use crate::spool::content_filter::FILTER_PAYLOAD_BYTES_MAX;
use crate::spool::event::{event_type_problem, tenant_problem};
use crate::spool::queue::origin_queue_name;
use crate::spool::state::Queue;
use crate::spool::{Command, MessageId, Payload, Record};
use crate::time::Millis;

/// An event to publish (`POST /v1/events`).
#[derive(Debug, Clone)]
pub struct EventRequest {
    pub event_type: String,
    pub tenant: Option<String>,
    /// Content type and body; `request` and `event` are ignored.
    pub payload: Payload,
    pub dedup_key: Option<String>,
    /// The headers it was published with (lower-case names): what a
    /// subscription's content filter reads beside the payload. Not kept.
    pub headers: Map<String, Value>,
    /// Who publishes it: a client, or spoold itself.
    pub publisher: Publisher,
}

/// Who publishes an event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Publisher {
    /// A client (`POST /v1/events`): may not use spoold's own types.
    #[default]
    Client,
    /// spoold's own operational event (`operational.rs`): of a type under
    /// `spoold.`, and never delivered to the queue it describes (`about`)
    /// nor to that queue's failure queue.
    Spoold { about: Option<String> },
}

/// The engine's answer to an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventOutcome {
    pub id: MessageId,
    /// Queue and message id of each delivery, queues in name order.
    pub deliveries: Vec<(String, MessageId)>,
    /// The key was seen inside `events.dedup_window`: nothing was stored,
    /// and the answer is the first event's.
    pub deduplicated: bool,
    /// How many queues its type (and tenant) matched, before their
    /// content filters kept `deliveries` of them (for a repeat: the
    /// deliveries).
    pub matched: usize,
}

/// A key whose event is still being written is refused with 409 for at
/// most this long (after that, an event that never became durable no
/// longer holds its key).
const PENDING_KEY_MS: i64 = 60_000;

impl Engine {
    /// Publishes an event: `Ok` only after the fsync of the one record
    /// that holds it and every delivery.
    pub async fn publish(&self, request: EventRequest) -> Result<EventOutcome, EventError> {
        self.check_event(&request)?;
        let (tx, rx) = oneshot::channel();
        let outcome = {
            let mut core = self.core();
            let now = self.now(&mut core);
            let hash = self.event_dedup_hash(&request);
            let fingerprint = hash.map(|_| fingerprint(&request));
            if let Some(hash) = hash
                && let Some(repeat) = self.known_key(&mut core, hash, fingerprint, now)?
            {
                return Ok(repeat);
            }
            let (queues, matched) = self.event_subscribers(&core, &request)?;
            let id = core.spool.allocate_id();
            let deliveries: Vec<(String, MessageId)> = queues
                .into_iter()
                .map(|q| (q, core.spool.allocate_id()))
                .collect();
            let record = event_record(&request, now, id, hash, fingerprint, &deliveries);
            self.check_memory(&core, &record)?;
            self.append(&core, record, Some(&request.payload), Reply::Done(tx))?;
            if let Some(hash) = hash {
                core.pending_events.insert(hash, now);
            }
            EventOutcome {
                id,
                deliveries,
                deduplicated: false,
                matched,
            }
        };
        drop(request);
        rx.await.map_err(|_| closed())??;
        crate::metrics::count_event(if outcome.deliveries.is_empty() {
            "no_subscribers"
        } else {
            "fanned_out"
        });
        Ok(outcome)
    }

    /// Refuses an event before the lock is taken: a bad type or tenant, a
    /// client using spoold's own types, a payload its type's schema
    /// refuses, or a full spool.
    fn check_event(&self, request: &EventRequest) -> Result<(), EventError> {
        if let Some(problem) = event_type_problem(&request.event_type) {
            return Err(EventError::Invalid {
                field: "type",
                problem,
            });
        }
        let ours = matches!(request.publisher, Publisher::Spoold { .. });
        debug_assert!(
            !ours || is_operational(&request.event_type),
            "bug: spoold publishes its own types only"
        );
        if is_operational(&request.event_type) && !ours {
            return Err(EventError::Invalid {
                field: "type",
                problem: format!(
                    "{:?}: types under \"spoold.\" are spoold's own operational events; a \
                     client may not publish them",
                    request.event_type
                ),
            });
        }
        if let Some(problem) = request.tenant.as_deref().and_then(tenant_problem) {
            return Err(EventError::Invalid {
                field: "tenant",
                problem,
            });
        }
        if !ours {
            self.check_payload(
                &request.event_type,
                &request.payload.content_type,
                &request.payload.body,
            )?;
        }
        // Told that the spool is nearly full, an operator must hear it even
        // once it is full: that one small event may use the headroom.
        let warns_of_full = ours && request.event_type == super::notes::NEAR_FULL_TYPE;
        if !warns_of_full && self.is_full_for(request.payload.stored_bytes()) {
            return Err(EventError::SpoolFull {
                journal_bytes: self.journal_bytes(),
                max_bytes: self.inner.max_bytes,
            });
        }
        Ok(())
    }

    /// The hash of an event's dedup key, if it has one.
    fn event_dedup_hash(&self, request: &EventRequest) -> Option<u64> {
        // A key belongs to its tenant: another tenant's event with the
        // same key is another event. (Without a tenant, the scope the
        // builds before tenants hashed with, so their keys still hold.)
        let scope = match &request.tenant {
            Some(tenant) => format!("\0events\0{tenant}"),
            None => "\0events".to_owned(),
        };
        request
            .dedup_key
            .as_deref()
            .map(|key| self.inner.tokens.dedup_hash(&scope, key))
    }

    /// What a dedup key already seen answers: the first event's outcome
    /// (`Some`), a refusal when it was reused for another event or its
    /// event is still being written, or `None` for a new key.
    fn known_key(
        &self,
        core: &mut Core,
        hash: u64,
        fingerprint: Option<u64>,
        now: Millis,
    ) -> Result<Option<EventOutcome>, EventError> {
        let window_ms = self.inner.policy.event_dedup_window_ms;
        if let Some(seen) = core.spool.event_by_key(hash, now, window_ms) {
            // A key reused for something else is a mistake to show,
            // not a retry to answer (an event remembered without a
            // fingerprint, from a build before them, is a retry).
            if seen.fingerprint.is_some() && seen.fingerprint != fingerprint {
                return Err(EventError::KeyReused);
            }
            crate::metrics::count_event("deduplicated");
            return Ok(Some(EventOutcome {
                id: seen.id,
                deliveries: seen.deliveries.clone(),
                deduplicated: true,
                matched: seen.deliveries.len(),
            }));
        }
        if core
            .pending_events
            .get(&hash)
            .is_some_and(|&since| now - since < PENDING_KEY_MS)
        {
            return Err(EventError::KeyInProgress);
        }
        Ok(None)
    }

    /// The queues an event goes to, with how many its type (and tenant)
    /// matched before their content filters kept some of them; refused
    /// past `max_event_subscribers`.
    fn event_subscribers(
        &self,
        core: &Core,
        request: &EventRequest,
    ) -> Result<(Vec<String>, usize), EventError> {
        let policy = &self.inner.policy;
        let queues = core
            .spool
            .subscribing(&request.event_type, request.tenant.as_deref());
        if queues.len() > policy.max_event_subscribers {
            return Err(EventError::TooManySubscribers {
                event_type: request.event_type.clone(),
                subscribers: queues.len(),
                max: policy.max_event_subscribers,
            });
        }
        let mut queues = queues;
        if let Publisher::Spoold { about } = &request.publisher {
            // Asked for by name (`spoold.>`, not a catch-all `>`), and
            // never about the queue itself.
            let base = about.as_deref().map(origin_queue_name);
            queues.retain(|q| {
                is_operational_pattern(&q.settings.events)
                    && base.is_none_or(|b| origin_queue_name(&q.name) != b)
            });
        }
        let matched = queues.len();
        let queues = kept_by_filters(queues, request);
        if queues.len() < matched {
            crate::metrics::count_filtered(matched - queues.len());
        }
        Ok((queues, matched))
    }

    /// The queues an event of `event_type` (and `tenant`) would go to now.
    pub fn subscribers(&self, event_type: &str, tenant: Option<&str>) -> Vec<String> {
        self.core().spool.subscribers(event_type, tenant)
    }
}

/// The one record of an event: its meta and the id of each delivery.
fn event_record(
    request: &EventRequest,
    now: Millis,
    id: MessageId,
    hash: Option<u64>,
    fingerprint: Option<u64>,
    deliveries: &[(String, MessageId)],
) -> Record<'static> {
    Record {
        at: now,
        command: Command::Event(EventMeta {
            id,
            event_type: Cow::Owned(request.event_type.clone()),
            tenant: request.tenant.clone().map(Cow::Owned),
            visible_at: now,
            dedup_hash: hash,
            fingerprint,
            deliveries: deliveries
                .iter()
                .map(|(q, id)| (Cow::Owned(q.clone()), *id))
                .collect(),
            ordering_key: request.payload.ordering_key.clone().map(Cow::Owned),
        }),
    }
}

/// Whether `event_type` is one of spoold's own (`spoold.…`, docs/contract.md
/// §4): a client may subscribe to them, never publish them.
fn is_operational(event_type: &str) -> bool {
    event_type.split('.').next() == Some("spoold")
}

/// Whether one of `patterns` names spoold's own events: a catch-all (`>`,
/// `*.…`) takes a client's events only.
fn is_operational_pattern(patterns: &[String]) -> bool {
    patterns.iter().any(|p| is_operational(p))
}

/// The names of the subscribers of `queues` whose content filter (if
/// any) passes the event: each filter asked once, the payload parsed at
/// most once, and only when a filter reads it.
fn kept_by_filters(queues: Vec<&Queue>, request: &EventRequest) -> Vec<String> {
    let mut parsed: Option<Option<Value>> = None;
    queues
        .into_iter()
        .filter(|q| {
            let Some(filter) = q.settings.filter.as_ref() else {
                return true;
            };
            let payload = match filter.reads_payload() {
                true => parsed
                    .get_or_insert_with(|| parse_payload(&request.payload.body))
                    .as_ref(),
                false => None,
            };
            filter.matches(payload, &request.headers)
        })
        .map(|q| q.name.clone())
        .collect()
}

/// A payload as JSON, when it is JSON within the bound a filter reads.
fn parse_payload(body: &[u8]) -> Option<Value> {
    if body.len() > FILTER_PAYLOAD_BYTES_MAX {
        return None;
    }
    serde_json::from_slice(body).ok()
}

/// What an event says, hashed: its type and its body (SHA-256, the first
/// eight bytes). A repeat of its key must say the same.
fn fingerprint(request: &EventRequest) -> u64 {
    use sha2::Digest;
    let mut hash = sha2::Sha256::new();
    hash.update((request.event_type.len() as u64).to_le_bytes());
    hash.update(request.event_type.as_bytes());
    hash.update(&request.payload.body);
    if let Some(key) = &request.payload.ordering_key {
        hash.update(b"\0ordering key\0");
        hash.update(key.as_bytes());
    }
    let digest = hash.finalize();
    u64::from_le_bytes(digest[..8].try_into().expect("eight bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_past_the_bound_is_not_parsed_for_filters() {
        let mut at_bound = b"{\"a\": \"".to_vec();
        at_bound.resize(FILTER_PAYLOAD_BYTES_MAX - 2, b'x');
        at_bound.extend_from_slice(b"\"}");
        assert!(
            parse_payload(&at_bound).is_some(),
            "a payload at the bound is read"
        );
        let mut past = at_bound.clone();
        past.insert(1, b' ');
        assert_eq!(parse_payload(&past), None, "one byte more is not");
        assert_eq!(parse_payload(b"not json"), None);
    }
}
