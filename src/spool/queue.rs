//! Queue names and settings.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Suffix of every queue's failure queue.
pub const FAILED_SUFFIX: &str = ".failed";
/// Longest queue name the API accepts (spec §2).
pub const QUEUE_NAME_MAX_BYTES: usize = 128;

/// Checks a base queue name: `[A-Za-z0-9_-]{1,128}`.
pub fn valid_queue_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= QUEUE_NAME_MAX_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The name of `queue`'s failure queue.
pub fn failed_queue_name(queue: &str) -> String {
    format!("{queue}{FAILED_SUFFIX}")
}

/// What retention does to a message that outlives it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExpire {
    #[default]
    Discard,
    Fail,
}

/// Backoff between delivery attempts of a push queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Backoff {
    pub initial_ms: u64,
    pub multiplier: f64,
    pub max_ms: u64,
    /// ± this fraction of the delay, e.g. 0.2.
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            initial_ms: 5_000,
            multiplier: 4.0,
            max_ms: 10 * 3_600_000,
            jitter: 0.2,
        }
    }
}

/// Every setting of a queue (spec §2). Serialised as JSON inside
/// `queue_upsert` records, so a field added later needs a serde default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct QueueSettings {
    pub lease_timeout_ms: u64,
    pub max_retries: u32,
    pub retention_ms: u64,
    /// 0 = dedup off.
    pub dedup_window_ms: u64,
    pub on_expire: OnExpire,
    /// Set: a push queue delivered by spoold's own workers.
    pub destination: Option<String>,
    pub concurrency: u32,
    pub rate_limit: Option<f64>,
    pub timeout_ms: u64,
    pub backoff: Backoff,
    pub headers: BTreeMap<String, String>,
    /// Write-only over the API; kept in the journal so that an API-created
    /// queue keeps signing after a restart.
    pub signing_secret: Option<String>,
    pub permanent_failure_statuses: Vec<u16>,
    pub breaker_failures: u32,
    pub ca_file: Option<String>,
    pub client_cert: Option<String>,
    pub client_key: Option<String>,
}

impl Default for QueueSettings {
    fn default() -> QueueSettings {
        QueueSettings {
            lease_timeout_ms: 30_000,
            max_retries: 8,
            retention_ms: 7 * 24 * 3_600_000,
            dedup_window_ms: 0,
            on_expire: OnExpire::Discard,
            destination: None,
            concurrency: 8,
            rate_limit: None,
            timeout_ms: 30_000,
            backoff: Backoff::default(),
            headers: BTreeMap::new(),
            signing_secret: None,
            permanent_failure_statuses: vec![400, 401, 403, 404, 405, 410, 413, 422],
            breaker_failures: 10,
            ca_file: None,
            client_cert: None,
            client_key: None,
        }
    }
}

impl QueueSettings {
    pub fn is_push(&self) -> bool {
        self.destination.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_spec_alphabet() {
        assert!(valid_queue_name("orders_2-b"));
        assert!(valid_queue_name(&"a".repeat(128)));
        assert!(!valid_queue_name(&"a".repeat(129)));
        assert!(!valid_queue_name(""));
        assert!(!valid_queue_name("orders.failed"));
        assert!(!valid_queue_name("a/b"));
    }

    #[test]
    fn settings_json_fills_missing_fields_with_defaults() {
        let s: QueueSettings = serde_json::from_str(r#"{"max_retries": 3}"#).unwrap();
        assert_eq!(s.max_retries, 3);
        assert_eq!(s.lease_timeout_ms, 30_000);
        assert_eq!(s.backoff, Backoff::default());
    }
}
