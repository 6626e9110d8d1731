//! The bound on requests in flight to one origin (`host:port`), from every
//! push queue together: `delivery.max_connections_per_host`.
//!
//! Why: a thousand endpoints behind one gateway, each a queue with its own
//! `concurrency`, opened thousands of connections to it at once; its
//! accept queue overflowed, and the connects it refused waited out their
//! backoff while both sides sat idle. A worker holds a slot of its
//! destination's origin while it delivers, beside its queue's concurrency
//! slot, so requests in flight to an origin, and with them the
//! connections open to it (each request takes an idle connection before
//! it opens one, `direct.rs` and reqwest's pool alike), stay within the
//! bound.
//!
//! Fairness: the slots are a FIFO semaphore, and a worker gives its slot
//! back after each delivery and goes on only if it gets one at once
//! (`worker.rs`), so a queue that always has work cannot keep the other
//! queues of its origin waiting: a waiting dispatcher is served first.
//!
//! A flood of this node's own: an origin that refuses a connection while
//! other requests of this node are in flight to it and it answered one
//! lately ([`Origin::flooded`]) is not down; its accept queue is full.
//! The worker tries again soon, within the attempt, instead of waiting
//! out the endpoint's backoff and counting a failure towards its breaker
//! (`worker.rs`, `send_through_flood`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use reqwest::Url;
use tokio::sync::Semaphore;

/// How lately an origin must have answered for a refused connect to be
/// this node's flood rather than the origin being down.
const ANSWERED_LATELY: Duration = Duration::from_secs(5);

/// One origin's slots, and when it last answered.
pub(crate) struct Origin {
    pub slots: Arc<Semaphore>,
    max: usize,
    /// When the origin last answered a request ([`now_ms`]; 0: never).
    /// The monotonic clock: a step of the wall clock changes nothing.
    answered_at: AtomicU64,
}

impl Origin {
    fn new(max: usize) -> Origin {
        Origin {
            slots: Arc::new(Semaphore::new(max)),
            max,
            answered_at: AtomicU64::new(0),
        }
    }

    /// The origin answered a request (any status).
    pub(crate) fn answered(&self) {
        self.answered_at.store(now_ms(), Ordering::Relaxed);
    }

    /// Whether a connect the origin refused is this node's own flood: a
    /// worker holding one of its slots asks, and other workers hold slots
    /// too while the origin answered within [`ANSWERED_LATELY`].
    pub(crate) fn flooded(&self) -> bool {
        self.flooded_at(now_ms())
    }

    fn flooded_at(&self, now: u64) -> bool {
        let in_flight = self.max - self.slots.available_permits();
        let at = self.answered_at.load(Ordering::Relaxed);
        let lately = at != 0 && now.saturating_sub(at) <= ANSWERED_LATELY.as_millis() as u64;
        in_flight > 1 && lately
    }
}

/// Milliseconds since this process first asked, plus one (0 is "never").
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// The slots of every origin that some queue's dispatcher delivers to.
pub(crate) struct Hosts {
    max: usize,
    /// Weak: an origin no dispatcher holds is forgotten at [`Hosts::prune`].
    by_origin: HashMap<String, Weak<Origin>>,
}

impl Hosts {
    pub(crate) fn new(max: usize) -> Hosts {
        Hosts {
            max: max.max(1),
            by_origin: HashMap::new(),
        }
    }

    /// `destination`'s origin (a destination that is no URL has one of
    /// its own: it is never sent anything).
    pub(crate) fn origin(&mut self, destination: Option<&Url>) -> Arc<Origin> {
        let Some(key) = destination.and_then(origin_key) else {
            return Arc::new(Origin::new(self.max));
        };
        if let Some(origin) = self.by_origin.get(&key).and_then(Weak::upgrade) {
            return origin;
        }
        let origin = Arc::new(Origin::new(self.max));
        self.by_origin.insert(key, Arc::downgrade(&origin));
        origin
    }

    /// Forgets the origins no dispatcher holds any more.
    pub(crate) fn prune(&mut self) {
        self.by_origin.retain(|_, origin| origin.strong_count() > 0);
    }
}

/// `scheme://host:port` of `url`, the port always given.
fn origin_key(url: &Url) -> Option<String> {
    let host = url.host_str()?;
    let port = url.port_or_known_default()?;
    Some(format!(
        "{}://{}:{port}",
        url.scheme(),
        host.to_ascii_lowercase()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_of_one_origin_share_its_slots_and_others_do_not() {
        let mut hosts = Hosts::new(2);
        let url = |s: &str| Url::parse(s).unwrap();
        let a = hosts.origin(Some(&url("http://Gateway.example:80/a")));
        let b = hosts.origin(Some(&url("http://gateway.example/b?x=1")));
        let other_port = hosts.origin(Some(&url("http://gateway.example:8080/a")));
        let tls = hosts.origin(Some(&url("https://gateway.example/a")));
        assert!(Arc::ptr_eq(&a, &b), "one origin, one set of slots");
        assert!(!Arc::ptr_eq(&a, &other_port));
        assert!(!Arc::ptr_eq(&a, &tls));
        let held = a.slots.clone().try_acquire_many_owned(2).unwrap();
        assert!(b.slots.try_acquire().is_err(), "the bound is the origin's");
        drop(held);
        assert!(b.slots.try_acquire().is_ok(), "and comes back");
        drop((a, b, other_port, tls));
        hosts.prune();
        assert!(hosts.by_origin.is_empty(), "nothing held, nothing kept");
    }

    #[test]
    fn a_refusal_is_a_flood_only_while_others_are_in_flight_and_it_answered_lately() {
        let origin = Origin::new(4);
        let lately = ANSWERED_LATELY.as_millis() as u64;
        let mine = origin.slots.clone().try_acquire_owned().unwrap();
        let other = origin.slots.clone().try_acquire_owned().unwrap();
        assert!(!origin.flooded(), "never answered: it may be down");
        origin.answered();
        assert!(origin.flooded(), "answering others while refusing me");
        let at = origin.answered_at.load(Ordering::Relaxed);
        assert!(origin.flooded_at(at + lately), "still lately");
        assert!(!origin.flooded_at(at + lately + 1), "answered too long ago");
        drop(other);
        assert!(!origin.flooded(), "nothing else in flight: not my flood");
        drop(mine);
    }
}
