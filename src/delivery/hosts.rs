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

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use reqwest::Url;
use tokio::sync::Semaphore;

/// The slots of every origin that some queue's dispatcher delivers to.
pub(crate) struct Hosts {
    max: usize,
    /// Weak: an origin no dispatcher holds is forgotten at [`Hosts::prune`].
    by_origin: HashMap<String, Weak<Semaphore>>,
}

impl Hosts {
    pub(crate) fn new(max: usize) -> Hosts {
        Hosts {
            max: max.max(1),
            by_origin: HashMap::new(),
        }
    }

    /// The slots of `destination`'s origin (a destination that is no URL
    /// has slots of its own: it is never sent anything).
    pub(crate) fn slots(&mut self, destination: Option<&Url>) -> Arc<Semaphore> {
        let Some(key) = destination.and_then(origin) else {
            return Arc::new(Semaphore::new(self.max));
        };
        if let Some(slots) = self.by_origin.get(&key).and_then(Weak::upgrade) {
            return slots;
        }
        let slots = Arc::new(Semaphore::new(self.max));
        self.by_origin.insert(key, Arc::downgrade(&slots));
        slots
    }

    /// Forgets the origins no dispatcher holds any more.
    pub(crate) fn prune(&mut self) {
        self.by_origin.retain(|_, slots| slots.strong_count() > 0);
    }
}

/// `scheme://host:port` of `url`, the port always given.
fn origin(url: &Url) -> Option<String> {
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
        let a = hosts.slots(Some(&url("http://Gateway.example:80/a")));
        let b = hosts.slots(Some(&url("http://gateway.example/b?x=1")));
        let other_port = hosts.slots(Some(&url("http://gateway.example:8080/a")));
        let tls = hosts.slots(Some(&url("https://gateway.example/a")));
        assert!(Arc::ptr_eq(&a, &b), "one origin, one set of slots");
        assert!(!Arc::ptr_eq(&a, &other_port));
        assert!(!Arc::ptr_eq(&a, &tls));
        let held = a.clone().try_acquire_many_owned(2).unwrap();
        assert!(b.try_acquire().is_err(), "the bound is the origin's");
        drop(held);
        assert!(b.try_acquire().is_ok(), "and comes back");
        drop((a, b, other_port, tls));
        hosts.prune();
        assert!(hosts.by_origin.is_empty(), "nothing held, nothing kept");
    }
}
