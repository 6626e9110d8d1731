//! The shape of the config file: a serde struct for each table, with the
//! defaults of every key it may leave out. Reading a value's text (a
//! duration, a size) is `units`'; whether the values make sense together
//! is `check`'s.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::cluster::ClusterConfig;
use super::units::{de_duration, de_opt_duration, de_opt_size, de_size};
use crate::engine::rules::{EVENT_DEDUP_WINDOW_MS_DEFAULT, MAX_EVENT_SUBSCRIBERS_DEFAULT};
use crate::spool::queue::{
    Backoff, HistoryDefault, OnExpire, Ordering, OrderingOnFailure, QueueSettings,
};

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub spool: SpoolConfig,
    pub log: LogConfig,
    pub events: EventsConfig,
    pub telemetry: TelemetryConfig,
    pub delivery: DeliveryConfig,
    /// The customer portal (`portal.rs`).
    pub portal: super::portal::PortalConfig,
    pub queues: BTreeMap<String, QueueConfig>,
    /// Replicated mode (docs/contract.md §9); without it, a single node.
    pub cluster: Option<ClusterConfig>,
    /// Where `server.listen` was in the file, for messages.
    #[serde(skip)]
    pub listen_line: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub listen: String,
    /// Bare keys and scoped tables (`keys.rs`).
    pub api_keys: Vec<super::keys::ApiKeyEntry>,
    pub allow_unauthenticated: bool,
    #[serde(deserialize_with = "de_size")]
    pub max_body_bytes: u64,
    #[serde(rename = "shutdown_grace", deserialize_with = "de_duration")]
    pub shutdown_grace_ms: u64,
    pub drain_on_shutdown: bool,
    pub allowed_destinations: Option<Vec<String>>,
    pub redact_headers: Vec<String>,
    /// A second listener for `/metrics`, `/healthz` and `/readyz` only, so
    /// that `/v1` can stay on loopback while Prometheus and the kubelet
    /// reach these (no API key: they carry no messages).
    pub metrics_listen: Option<String>,
    /// Most queues the API may create (failure queues not counted; the
    /// file's count too).
    pub max_queues: usize,
}

/// The `[delivery]` table: how push delivery reaches destinations.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeliveryConfig {
    /// Most requests in flight to one origin (`host:port`) from every push
    /// queue together, and so most connections to it
    /// (`delivery/hosts.rs`): many endpoints behind one gateway must not
    /// overflow its accept queue.
    pub max_connections_per_host: usize,
    /// How a plain-HTTP destination without a proxy is reached
    /// (`delivery/direct.rs`).
    pub plain_http_client: PlainHttpClient,
}

impl Default for DeliveryConfig {
    fn default() -> DeliveryConfig {
        DeliveryConfig {
            max_connections_per_host: MAX_CONNECTIONS_PER_HOST_DEFAULT,
            plain_http_client: PlainHttpClient::Direct,
        }
    }
}

/// The default of `delivery.max_connections_per_host`: a quarter of
/// Linux's default listen backlog (`somaxconn`, 4096), so that one spoold
/// cannot fill a destination's accept queue by itself.
pub const MAX_CONNECTIONS_PER_HOST_DEFAULT: usize = 1024;

/// How push delivery reaches a plain-HTTP destination without a proxy.
/// Both send the same requests and read the same answers
/// (`tests/http/clients.rs` runs one matrix over both).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlainHttpClient {
    /// A worker drives its own HTTP/1.1 connection (`delivery/direct.rs`):
    /// less CPU per message (docs/performance.md, "push").
    #[default]
    Direct,
    /// reqwest's pooled client, as every other destination.
    Pooled,
}

impl PlainHttpClient {
    pub fn as_str(self) -> &'static str {
        match self {
            PlainHttpClient::Direct => "direct",
            PlainHttpClient::Pooled => "pooled",
        }
    }
}

impl ServerConfig {
    /// `redact_headers` in lower case, as the API and delivery compare
    /// header names.
    pub fn redacted_header_names(&self) -> Vec<String> {
        self.redact_headers
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect()
    }
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            listen: "127.0.0.1:8787".into(),
            api_keys: Vec::new(),
            allow_unauthenticated: false,
            max_body_bytes: 1 << 20,
            shutdown_grace_ms: 30_000,
            drain_on_shutdown: false,
            allowed_destinations: None,
            redact_headers: Vec::new(),
            metrics_listen: None,
            max_queues: crate::engine::rules::MAX_QUEUES_DEFAULT,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnCorruption {
    Refuse,
    Quarantine,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpoolConfig {
    pub dir: PathBuf,
    #[serde(deserialize_with = "de_size")]
    pub max_bytes: u64,
    #[serde(deserialize_with = "de_size")]
    pub segment_bytes: u64,
    /// What the state may hold in memory, as accounted; unset: half the
    /// cgroup's memory limit, or half the machine's memory without one.
    #[serde(deserialize_with = "de_opt_size")]
    pub max_memory: Option<u64>,
    pub fsync: bool,
    pub on_corruption: OnCorruption,
    /// How often compaction looks for files worth compacting.
    #[serde(rename = "compaction_interval", deserialize_with = "de_duration")]
    pub compaction_interval_ms: u64,
}

impl Default for SpoolConfig {
    fn default() -> SpoolConfig {
        SpoolConfig {
            dir: PathBuf::from("./spool"),
            max_bytes: 1 << 30,
            segment_bytes: 64 << 20,
            max_memory: None,
            fsync: true,
            on_corruption: OnCorruption::Refuse,
            compaction_interval_ms: 1_000,
        }
    }
}

/// The `[events]` table: limits of `POST /v1/events`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EventsConfig {
    /// An event that more queues subscribe to is refused (`400`).
    pub max_subscribers: usize,
    /// How long an event's `Idempotency-Key` is remembered.
    #[serde(rename = "dedup_window", deserialize_with = "de_duration")]
    pub dedup_window_ms: u64,
    /// History that push queues subscribing to events keep when they set
    /// none of their own (0: none).
    #[serde(rename = "history_retention", deserialize_with = "de_duration")]
    pub history_retention_ms: u64,
    #[serde(deserialize_with = "de_size")]
    pub history_max_bytes: u64,
}

impl EventsConfig {
    pub fn history_default(&self) -> HistoryDefault {
        HistoryDefault {
            retention_ms: self.history_retention_ms,
            max_bytes: self.history_max_bytes,
        }
    }
}

impl Default for EventsConfig {
    fn default() -> EventsConfig {
        EventsConfig {
            max_subscribers: MAX_EVENT_SUBSCRIBERS_DEFAULT,
            dedup_window_ms: EVENT_DEDUP_WINDOW_MS_DEFAULT,
            history_retention_ms: 0,
            history_max_bytes: HistoryDefault::default().max_bytes,
        }
    }
}

/// The `[telemetry]` table: OpenTelemetry traces, off unless
/// `otlp_endpoint` is set (`src/telemetry.rs`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Where spans go, over OTLP/HTTP with protobuf: a collector's base URL
    /// (`http://otel-collector:4318`, `/v1/traces` is added) or the whole
    /// traces URL.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of every span.
    pub service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> TelemetryConfig {
        TelemetryConfig {
            otlp_endpoint: None,
            service_name: "spoold".into(),
        }
    }
}

impl TelemetryConfig {
    /// The traces URL spans are posted to, if any.
    pub fn traces_url(&self) -> Option<String> {
        let base = self.otlp_endpoint.as_deref()?.trim_end_matches('/');
        Some(if base.ends_with("/v1/traces") {
            base.to_owned()
        } else {
            format!("{base}/v1/traces")
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    pub format: LogFormat,
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> LogConfig {
        LogConfig {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

/// A `[queues.NAME]` table. Field names are the TOML names of docs/contract.md §2; omitted
/// fields take its defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueConfig {
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub lease_timeout: Option<u64>,
    pub max_retries: Option<u32>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub retention: Option<u64>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub dedup_window: Option<u64>,
    pub on_expire: Option<OnExpire>,
    pub destination: Option<String>,
    pub concurrency: Option<u32>,
    pub rate_limit: Option<f64>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub timeout: Option<u64>,
    pub backoff: Option<BackoffConfig>,
    pub headers: Option<BTreeMap<String, String>>,
    pub signing_secret: Option<String>,
    pub permanent_failure_statuses: Option<Vec<u16>>,
    pub breaker_failures: Option<u32>,
    pub ca_file: Option<String>,
    pub client_cert: Option<String>,
    pub client_key: Option<String>,
    pub events: Option<Vec<String>>,
    pub tenant: Option<String>,
    /// A content filter on the events its patterns take
    /// (`spool::content_filter`): checked as it is read, so a bad one
    /// names its key and line.
    pub filter: Option<crate::spool::content_filter::ContentFilter>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub history_retention: Option<u64>,
    #[serde(default, deserialize_with = "de_opt_size")]
    pub history_max_bytes: Option<u64>,
    /// `"per_key"`: one message of each ordering key out at a time.
    pub ordering: Option<Ordering>,
    pub ordering_on_failure: Option<OrderingOnFailure>,
    /// `true`: this queue delivers without a signing secret (and without
    /// static headers it had): a reload may remove them
    /// (`config/reload.rs`). Read from the file only.
    pub unsigned: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackoffConfig {
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub initial: Option<u64>,
    pub multiplier: Option<f64>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub max: Option<u64>,
    pub jitter: Option<f64>,
}

impl QueueConfig {
    /// The full settings: what the table says, defaults for the rest.
    pub fn settings(&self) -> QueueSettings {
        let d = QueueSettings::default();
        let b = Backoff::default();
        let backoff = self.backoff.as_ref().map_or(b.clone(), |c| Backoff {
            initial_ms: c.initial.unwrap_or(b.initial_ms),
            multiplier: c.multiplier.unwrap_or(b.multiplier),
            max_ms: c.max.unwrap_or(b.max_ms),
            jitter: c.jitter.unwrap_or(b.jitter),
        });
        QueueSettings {
            lease_timeout_ms: self.lease_timeout.unwrap_or(d.lease_timeout_ms),
            max_retries: self.max_retries.unwrap_or(d.max_retries),
            retention_ms: self.retention.unwrap_or(d.retention_ms),
            dedup_window_ms: self.dedup_window.unwrap_or(d.dedup_window_ms),
            on_expire: self.on_expire.unwrap_or(d.on_expire),
            destination: self.destination.clone(),
            concurrency: self.concurrency.unwrap_or(d.concurrency),
            rate_limit: self.rate_limit,
            timeout_ms: self.timeout.unwrap_or(d.timeout_ms),
            backoff,
            headers: self.headers.clone().unwrap_or_default(),
            signing_secret: self.signing_secret.clone(),
            permanent_failure_statuses: self
                .permanent_failure_statuses
                .clone()
                .unwrap_or(d.permanent_failure_statuses),
            breaker_failures: self.breaker_failures.unwrap_or(d.breaker_failures),
            ca_file: self.ca_file.clone(),
            client_cert: self.client_cert.clone(),
            client_key: self.client_key.clone(),
            events: self.events.clone().unwrap_or_default(),
            tenant: self.tenant.clone(),
            filter: self.filter.clone(),
            history_retention_ms: self.history_retention.unwrap_or(d.history_retention_ms),
            history_max_bytes: self.history_max_bytes.unwrap_or(d.history_max_bytes),
            ordering: self.ordering.unwrap_or(d.ordering),
            ordering_on_failure: self.ordering_on_failure.unwrap_or(d.ordering_on_failure),
            // Rotation is for API-managed queues: the file owns its secret.
            previous_secret: None,
        }
    }
}
