//! Events: a message with a type (and a tenant) that every queue
//! subscribing to it receives (docs/contract.md §4 "Events").
//!
//! - An event type is dot-separated segments of `[A-Za-z0-9_-]`
//!   (`invoice.paid`), at most [`EVENT_TYPE_MAX_BYTES`].
//! - A queue subscribes with patterns of the same segments, where `*`
//!   stands for exactly one segment and a last segment `>` for one or more
//!   (NATS subjects' wildcards): `invoice.*` takes `invoice.paid` but not
//!   `invoice.payment.failed`, `invoice.>` takes both.
//! - A queue with a `tenant` takes only the events of that tenant; one
//!   without takes every tenant's.
//!
//! [`Subscriptions`] is the index the fan-out asks: a trie on segments, so
//! finding the subscribers of a type costs its segments, not the queues.

use std::collections::{BTreeMap, BTreeSet};

/// Longest event type (and tenant), in bytes.
pub(crate) const EVENT_TYPE_MAX_BYTES: usize = 255;
pub(crate) const TENANT_MAX_BYTES: usize = 255;
/// Most patterns one queue subscribes with.
pub(crate) const PATTERNS_MAX: usize = 256;

fn segment_ok(segment: &str) -> bool {
    !segment.is_empty()
        && segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Why an event type is refused, or `None`.
pub(crate) fn event_type_problem(event_type: &str) -> Option<String> {
    if event_type.is_empty() {
        return Some("is empty".into());
    }
    if event_type.len() > EVENT_TYPE_MAX_BYTES {
        return Some(format!(
            "is {} bytes: at most {EVENT_TYPE_MAX_BYTES}",
            event_type.len()
        ));
    }
    if !event_type.split('.').all(segment_ok) {
        return Some(format!(
            "{event_type:?} is not dot-separated segments of [A-Za-z0-9_-]"
        ));
    }
    None
}

/// Why a pattern is refused, or `None`.
pub(crate) fn pattern_problem(pattern: &str) -> Option<String> {
    if pattern.is_empty() || pattern.len() > EVENT_TYPE_MAX_BYTES {
        return Some(format!(
            "pattern {pattern:?} must be 1 to {EVENT_TYPE_MAX_BYTES} bytes"
        ));
    }
    let segments: Vec<&str> = pattern.split('.').collect();
    let last = segments.len() - 1;
    for (i, s) in segments.iter().enumerate() {
        let ok = *s == "*" || (*s == ">" && i == last) || segment_ok(s);
        if !ok {
            return Some(format!(
                "pattern {pattern:?}: segment {s:?} is not [A-Za-z0-9_-]+, `*` \
                 (one segment) or a last `>` (one or more)"
            ));
        }
    }
    None
}

/// Why a tenant is refused, or `None`.
pub(crate) fn tenant_problem(tenant: &str) -> Option<String> {
    let ok = !tenant.is_empty()
        && tenant.len() <= TENANT_MAX_BYTES
        && tenant
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:@".contains(&b));
    (!ok).then(|| format!("{tenant:?} is not 1 to {TENANT_MAX_BYTES} of [A-Za-z0-9_.:@-]"))
}

/// Whether `pattern` (valid) takes `event_type` (valid).
pub(crate) fn pattern_matches(pattern: &str, event_type: &str) -> bool {
    let mut types = event_type.split('.');
    let mut patterns = pattern.split('.').peekable();
    while let Some(p) = patterns.next() {
        if p == ">" {
            return types.next().is_some();
        }
        match types.next() {
            Some(t) if p == "*" || p == t => {}
            _ => return false,
        }
        if patterns.peek().is_none() {
            return types.next().is_none();
        }
    }
    false
}

/// One level of the trie: the queues (by the state machine's id) whose
/// pattern ends here, those whose pattern ends with `>` here, and the next
/// segments. Plain vectors: most hold one queue (a customer's own pattern),
/// and a B-tree set allocates a whole node for one; removing scans.
#[derive(Debug, Default)]
struct Node {
    here: Vec<u32>,
    rest: Vec<u32>,
    star: Option<Box<Node>>,
    next: BTreeMap<Box<str>, Box<Node>>,
}

/// Removes one `queue` from `ids`.
fn remove_one(ids: &mut Vec<u32>, queue: u32) {
    if let Some(i) = ids.iter().position(|&q| q == queue) {
        ids.swap_remove(i);
        if ids.is_empty() {
            *ids = Vec::new();
        }
    }
}

impl Node {
    fn is_empty(&self) -> bool {
        self.here.is_empty() && self.rest.is_empty() && self.star.is_none() && self.next.is_empty()
    }

    fn insert(&mut self, segments: &[&str], queue: u32) {
        match segments {
            [] => self.here.push(queue),
            [">"] => self.rest.push(queue),
            ["*", tail @ ..] => self.star.get_or_insert_default().insert(tail, queue),
            [s, tail @ ..] => self
                .next
                .entry((*s).into())
                .or_default()
                .insert(tail, queue),
        }
    }

    fn remove(&mut self, segments: &[&str], queue: u32) {
        match segments {
            [] => remove_one(&mut self.here, queue),
            [">"] => remove_one(&mut self.rest, queue),
            ["*", tail @ ..] => {
                if let Some(star) = &mut self.star {
                    star.remove(tail, queue);
                    if star.is_empty() {
                        self.star = None;
                    }
                }
            }
            [s, tail @ ..] => {
                if let Some(next) = self.next.get_mut(*s) {
                    next.remove(tail, queue);
                    if next.is_empty() {
                        self.next.remove(*s);
                    }
                }
            }
        }
    }

    fn collect(&self, segments: &[&str], out: &mut BTreeSet<u32>) {
        let Some((first, tail)) = segments.split_first() else {
            out.extend(&self.here);
            return;
        };
        out.extend(&self.rest);
        if let Some(star) = &self.star {
            star.collect(tail, out);
        }
        if let Some(next) = self.next.get(*first) {
            next.collect(tail, out);
        }
    }
}

/// Which queues subscribe to which event types: kept by the state machine
/// as queues are created, changed and deleted (never journaled: it
/// follows from the queues' settings).
#[derive(Debug, Default)]
pub(crate) struct Subscriptions {
    root: Node,
}

impl Subscriptions {
    pub(crate) fn add(&mut self, queue: u32, patterns: &[String]) {
        for p in patterns {
            let segments: Vec<&str> = p.split('.').collect();
            self.root.insert(&segments, queue);
        }
    }

    pub(crate) fn remove(&mut self, queue: u32, patterns: &[String]) {
        for p in patterns {
            let segments: Vec<&str> = p.split('.').collect();
            self.root.remove(&segments, queue);
        }
    }

    /// The queues with a pattern that takes `event_type`, by id.
    pub(crate) fn matching(&self, event_type: &str) -> BTreeSet<u32> {
        let segments: Vec<&str> = event_type.split('.').collect();
        let mut out = BTreeSet::new();
        self.root.collect(&segments, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_take_types_segment_by_segment() {
        let cases = [
            ("invoice.paid", "invoice.paid", true),
            ("invoice.paid", "invoice.paid.late", false),
            ("invoice.*", "invoice.paid", true),
            ("invoice.*", "invoice", false),
            ("invoice.*", "invoice.payment.failed", false),
            ("invoice.>", "invoice.payment.failed", true),
            ("invoice.>", "invoice", false),
            ("*.paid", "order.paid", true),
            ("*", "order", true),
            ("*", "order.paid", false),
            (">", "order.paid", true),
            ("*.*", "a.b", true),
            ("a.*.c", "a.x.c", true),
            ("a.*.c", "a.x.d", false),
        ];
        for (pattern, event_type, expected) in cases {
            assert_eq!(pattern_problem(pattern), None, "{pattern}");
            assert_eq!(
                pattern_matches(pattern, event_type),
                expected,
                "{pattern} ~ {event_type}"
            );
            let mut index = Subscriptions::default();
            index.add(7, &[pattern.to_owned()]);
            assert_eq!(
                index.matching(event_type).contains(&7),
                expected,
                "index: {pattern} ~ {event_type}"
            );
            index.remove(7, &[pattern.to_owned()]);
            assert!(index.root.is_empty(), "{pattern} left the index empty");
        }
    }

    #[test]
    fn bad_types_patterns_and_tenants_are_named() {
        for bad in ["", "a..b", ".a", "a.", "a b", "a.*", &"x".repeat(256)] {
            assert!(event_type_problem(bad).is_some(), "{bad:?}");
        }
        for bad in ["", "a..b", "a.>.b", "**", "a.#", "in voice"] {
            assert!(pattern_problem(bad).is_some(), "{bad:?}");
        }
        for bad in ["", "a b", "ten/ant", &"t".repeat(256)] {
            assert!(tenant_problem(bad).is_some(), "{bad:?}");
        }
        assert_eq!(tenant_problem("cus_42"), None);
        assert_eq!(event_type_problem("invoice.paid"), None);
    }

    proptest::proptest! {
        /// The trie finds exactly the queues whose pattern matches, however
        /// patterns were added and removed.
        #[test]
        fn the_index_agrees_with_matching(
            patterns in proptest::collection::vec(
                proptest::collection::vec(proptest::sample::select(vec!["a", "b", "*", ">"]), 1..4),
                0..12,
            ),
            removed in proptest::collection::vec(proptest::bool::ANY, 12),
            event_type in proptest::collection::vec(proptest::sample::select(vec!["a", "b", "c"]), 1..5),
        ) {
            let event_type = event_type.join(".");
            let mut index = Subscriptions::default();
            let mut kept = Vec::new();
            for (i, segments) in patterns.iter().enumerate() {
                let pattern = segments.join(".");
                if pattern_problem(&pattern).is_some() {
                    continue;
                }
                let queue = i as u32;
                index.add(queue, std::slice::from_ref(&pattern));
                if removed[i] {
                    index.remove(queue, std::slice::from_ref(&pattern));
                } else {
                    kept.push((queue, pattern));
                }
            }
            let expected: BTreeSet<u32> = kept
                .iter()
                .filter(|(_, p)| pattern_matches(p, &event_type))
                .map(|(q, _)| *q)
                .collect();
            proptest::prop_assert_eq!(index.matching(&event_type), expected);
        }
    }
}
