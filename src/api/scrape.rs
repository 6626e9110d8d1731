//! The scrape: copies the state machine's counters and gauges, the
//! cluster's role and lag, and the process's figures into the registry
//! that `crate::metrics` records into, then renders it as Prometheus text.
//! Recording is a leaf every layer uses; rendering reads the engine and the
//! cluster, so it lives here, above both.

use ::metrics::{counter, gauge};

use crate::cluster::Cluster;
use crate::engine::Engine;
use crate::metrics::{
    CLUSTER_APPLIED_INDEX, CLUSTER_MEMBERS, CLUSTER_PEER_CONTACT_AGE, CLUSTER_REPLICATION_LAG,
    CLUSTER_ROLE, CLUSTER_TERM, EVENT_TYPES, JOURNAL_BYTES, JOURNAL_MAX_BYTES, LABEL_PEER,
    LABEL_QUEUE, LABEL_ROLE, LABEL_STATE, LABEL_VOTER, MEMORY_BYTES, MEMORY_MAX_BYTES,
    MESSAGES_ACKED, MESSAGES_DEDUPLICATED, MESSAGES_EXPIRED, MESSAGES_FAILED, MESSAGES_RETRIED,
    MESSAGES_SENT, PUSH_DISPATCHERS, QUEUE_BREAKER_OPEN, QUEUE_MESSAGES, QUEUE_OLDEST_AGE,
    QUEUE_OLDEST_RETRYING_AGE, QUEUE_PAUSED, QUEUE_PREVIOUS_SECRET_EXPIRY, QUEUE_RETRYING,
    QUEUE_SIGNING_SECRETS, install, process_collector, queue_label,
};
use crate::spool::state::{Counters, QueueStats};

/// One label's numbers: a queue's, or the sum of those past the limit.
#[derive(Default)]
struct QueueNumbers {
    counters: Counters,
    visible: u64,
    leased: u64,
    delayed: u64,
    held: u64,
    retrying: u64,
    oldest_visible_age_ms: i64,
    oldest_retrying_age_ms: i64,
    paused: u64,
    breaker_open: u64,
    signing_secrets: u64,
    /// The earliest a rotated-out secret stops signing.
    previous_secret_expires_at: Option<i64>,
}

impl QueueNumbers {
    fn add(&mut self, st: &QueueStats) {
        let (a, b) = (&mut self.counters, &st.counters);
        a.sent += b.sent;
        a.acked += b.acked;
        a.nacked += b.nacked;
        a.failed += b.failed;
        a.expired += b.expired;
        a.deduplicated += b.deduplicated;
        self.visible += st.visible;
        self.leased += st.leased;
        self.delayed += st.delayed;
        self.held += st.held;
        self.retrying += st.retrying;
        let oldest = |now: &mut i64, age: Option<i64>| *now = (*now).max(age.unwrap_or(0));
        oldest(&mut self.oldest_visible_age_ms, st.oldest_visible_age_ms);
        oldest(&mut self.oldest_retrying_age_ms, st.oldest_retrying_age_ms);
        self.paused += u64::from(st.paused);
        self.breaker_open += u64::from(st.next_probe_at.is_some());
        self.signing_secrets += st.signing_secrets;
        self.previous_secret_expires_at = (self.previous_secret_expires_at.into_iter())
            .chain(st.previous_secret_expires_at)
            .min();
    }
}

/// Copies the state machine's counters and gauges into the registry; a
/// scrape calls it before rendering.
fn refresh(engine: &Engine) {
    gauge!(JOURNAL_BYTES).set(engine.journal_bytes() as f64);
    gauge!(JOURNAL_MAX_BYTES).set(engine.max_bytes() as f64);
    let (accounted, max_memory) = engine.memory();
    gauge!(MEMORY_BYTES).set(accounted as f64);
    gauge!(MEMORY_MAX_BYTES).set(max_memory as f64);
    gauge!(PUSH_DISPATCHERS).set(engine.awake_push_queues() as f64);
    gauge!(EVENT_TYPES).set(engine.event_type_count() as f64);
    let mut numbers: std::collections::BTreeMap<String, QueueNumbers> = Default::default();
    for name in engine.queue_names() {
        let Ok(stats) = engine.stats(&name) else {
            continue;
        };
        numbers.entry(queue_label(&name)).or_default().add(&stats);
    }
    for (label, n) in numbers {
        let q = || label.clone();
        let c = n.counters;
        counter!(MESSAGES_SENT, LABEL_QUEUE => q()).absolute(c.sent);
        counter!(MESSAGES_ACKED, LABEL_QUEUE => q()).absolute(c.acked);
        counter!(MESSAGES_RETRIED, LABEL_QUEUE => q()).absolute(c.nacked);
        counter!(MESSAGES_FAILED, LABEL_QUEUE => q()).absolute(c.failed);
        counter!(MESSAGES_EXPIRED, LABEL_QUEUE => q()).absolute(c.expired);
        counter!(MESSAGES_DEDUPLICATED, LABEL_QUEUE => q()).absolute(c.deduplicated);
        for (state, count) in [
            ("visible", n.visible),
            ("leased", n.leased),
            ("delayed", n.delayed),
            ("held", n.held),
        ] {
            gauge!(QUEUE_MESSAGES, LABEL_QUEUE => q(), LABEL_STATE => state).set(count as f64);
        }
        let secs = |ms: i64| ms as f64 / 1000.0;
        gauge!(QUEUE_OLDEST_AGE, LABEL_QUEUE => q()).set(secs(n.oldest_visible_age_ms));
        gauge!(QUEUE_RETRYING, LABEL_QUEUE => q()).set(n.retrying as f64);
        gauge!(QUEUE_OLDEST_RETRYING_AGE, LABEL_QUEUE => q()).set(secs(n.oldest_retrying_age_ms));
        gauge!(QUEUE_PAUSED, LABEL_QUEUE => q()).set(n.paused as f64);
        gauge!(QUEUE_BREAKER_OPEN, LABEL_QUEUE => q()).set(n.breaker_open as f64);
        gauge!(QUEUE_SIGNING_SECRETS, LABEL_QUEUE => q()).set(n.signing_secrets as f64);
        let expiry = n.previous_secret_expires_at.map_or(0.0, secs);
        gauge!(QUEUE_PREVIOUS_SECRET_EXPIRY, LABEL_QUEUE => q()).set(expiry);
    }
}

/// The Prometheus text of everything.
pub(crate) fn render(engine: Option<&Engine>, cluster: Option<&Cluster>) -> String {
    let handle = install();
    if let Some(engine) = engine {
        refresh(engine);
    }
    if let Some(cluster) = cluster {
        refresh_cluster(cluster);
    }
    process_collector().collect();
    #[cfg(feature = "count-allocations")]
    counter!("spoold_allocations_total").absolute(crate::allocations::total());
    handle.run_upkeep();
    handle.render()
}

/// Replicated mode: role, term and lag, refreshed at scrape time.
fn refresh_cluster(cluster: &crate::cluster::Cluster) {
    let status = cluster.status();
    for role in ["primary", "follower", "candidate", "learner"] {
        let on = if status.role == role { 1.0 } else { 0.0 };
        gauge!(CLUSTER_ROLE, LABEL_ROLE => role).set(on);
    }
    gauge!(CLUSTER_TERM).set(status.term as f64);
    gauge!(CLUSTER_APPLIED_INDEX).set(status.applied_index.unwrap_or(0) as f64);
    let voters = status.members.iter().filter(|m| m.voter).count();
    gauge!(CLUSTER_MEMBERS, LABEL_VOTER => "true").set(voters as f64);
    gauge!(CLUSTER_MEMBERS, LABEL_VOTER => "false").set((status.members.len() - voters) as f64);
    if status.role == "primary" {
        for m in status
            .members
            .iter()
            .filter(|m| m.node_id != status.node_id)
        {
            let peer = m.node_id.to_string();
            let lag = m.lag_records.unwrap_or(0);
            gauge!(CLUSTER_REPLICATION_LAG, LABEL_PEER => peer.clone()).set(lag as f64);
            // A peer never heard from since this replica became primary
            // is as old as its term here: the scrape interval is no guide,
            // so report a large age rather than none.
            let age = m
                .last_contact
                .map_or(f64::from(u32::MAX), |d| d.as_secs_f64());
            gauge!(CLUSTER_PEER_CONTACT_AGE, LABEL_PEER => peer).set(age);
        }
    }
}
