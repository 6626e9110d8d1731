//! Configuration: the only home of defaults and limits.
//!
//! The file is TOML (docs/contract.md §7). Durations are strings like `"30s"`, `"250ms"`,
//! `"10m"`, `"7d"`; sizes are strings like `"64MiB"` or plain byte counts.
//! Unknown keys and bad values are errors that name the key and the line.
//! With no file, spoold runs on [`Config::default`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::engine::rules::{self, Origin, Policy, QueueRuleError};
use crate::spool::queue::{Backoff, Field, Naming, OnExpire, QueueSettings};

/// Smallest segment size accepted: below it rotation would dominate.
pub(crate) const SEGMENT_BYTES_MIN: u64 = 64 << 10;
/// Largest segment size accepted: record offsets are 32-bit, and a segment
/// is read whole at replay.
pub(crate) const SEGMENT_BYTES_MAX: u64 = 1 << 30;
/// Compaction's period: often enough that garbage does not pile up, never
/// a busy loop.
const COMPACTION_INTERVAL_MIN_MS: u64 = 10;
const COMPACTION_INTERVAL_MAX_MS: u64 = 86_400_000;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {reason}", path.display())]
    Read { path: PathBuf, reason: String },
    /// The TOML is malformed, a key is unknown or a value is out of range;
    /// the message names the key and the line.
    #[error("{}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub spool: SpoolConfig,
    pub log: LogConfig,
    pub events: EventsConfig,
    pub telemetry: TelemetryConfig,
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
    pub api_keys: Vec<String>,
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
}

impl Default for EventsConfig {
    fn default() -> EventsConfig {
        EventsConfig {
            max_subscribers: crate::engine::rules::MAX_EVENT_SUBSCRIBERS_DEFAULT,
            dedup_window_ms: crate::engine::rules::EVENT_DEDUP_WINDOW_MS_DEFAULT,
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

/// Bounds of the `[events]` table: an event's record lists every delivery
/// (about 30 bytes each), and its keys are held in memory for the window.
const EVENT_SUBSCRIBERS_MAX: usize = 100_000;
const EVENT_DEDUP_WINDOW_MAX_MS: u64 = 30 * 86_400_000;

/// Most replicas a cluster may have: five tolerate two failures, seven
/// three; beyond that every write waits for more fsyncs than it gains.
pub(crate) const CLUSTER_REPLICAS_MAX: usize = 7;
/// Shortest cluster secret accepted: a secret is the only thing that keeps
/// a stranger out of replication traffic.
pub(crate) const CLUSTER_SECRET_MIN_BYTES: usize = 16;

/// The `[cluster]` table: one replica of a cluster (docs/contract.md §9).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Stable and unique, ≥ 1; never reused for another disk (a replica
    /// that lost its disk comes back under a new id: docs/operations.md).
    pub node_id: u64,
    /// Where replication traffic is accepted (not the API port).
    pub listen: String,
    /// How peers reach this node; `listen` when absent.
    pub advertise: Option<String>,
    /// What other replicas name as the primary's API.
    pub api_url: String,
    /// Every voter of the cluster's first start: id → address. A replica
    /// not named here never bootstraps: it waits to be added.
    pub peers: BTreeMap<String, String>,
    /// Shared by every replica; also `SPOOLD_CLUSTER_SECRET`.
    pub secret: Option<String>,
    #[serde(default = "default_true")]
    pub forward_to_primary: bool,
    #[serde(
        rename = "heartbeat",
        default = "default_heartbeat_ms",
        deserialize_with = "de_duration"
    )]
    pub heartbeat_ms: u64,
    #[serde(
        rename = "election_timeout",
        default = "default_election_timeout_ms",
        deserialize_with = "de_duration"
    )]
    pub election_timeout_ms: u64,
    /// TLS with mutual certificates on the cluster port (`src/tls.rs`).
    pub tls: Option<ClusterTlsConfig>,
}

/// `[cluster.tls]`: PEM files of this replica's certificate (and chain),
/// its key, and the CA that signs every replica's certificate.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterTlsConfig {
    pub cert: String,
    pub key: String,
    pub ca: String,
}

fn default_true() -> bool {
    true
}

fn default_heartbeat_ms() -> u64 {
    100
}

fn default_election_timeout_ms() -> u64 {
    500
}

impl ClusterConfig {
    /// The peers with their ids as numbers (validated at parse time).
    pub fn peer_ids(&self) -> BTreeMap<u64, String> {
        self.peers
            .iter()
            .filter_map(|(id, addr)| Some((id.parse().ok()?, addr.clone())))
            .collect()
    }

    /// The address peers use for this node.
    pub fn advertised(&self) -> &str {
        self.advertise.as_deref().unwrap_or(&self.listen)
    }

    /// The secret in force: the config's, else `SPOOLD_CLUSTER_SECRET`.
    pub fn secret(&self, env_secret: Option<&str>) -> Result<String, String> {
        let secret = self
            .secret
            .clone()
            .or_else(|| env_secret.map(str::to_owned))
            .unwrap_or_default();
        secret_shape(&secret).map_err(|why| format!("cluster.secret: {why}"))?;
        if secret.len() < CLUSTER_SECRET_MIN_BYTES {
            return Err(format!(
                "cluster.secret: {} bytes is too short: set at least \
                 {CLUSTER_SECRET_MIN_BYTES} bytes in the config or SPOOLD_CLUSTER_SECRET \
                 (the same on every replica)",
                secret.len()
            ));
        }
        Ok(secret)
    }

    fn validate(&self, at: &dyn Fn(&str) -> String) -> Result<(), String> {
        if self.node_id == 0 {
            return Err(format!(
                "{}cluster.node_id = 0: node ids start at 1",
                at("node_id")
            ));
        }
        let mut ids = BTreeMap::new();
        for (id, addr) in &self.peers {
            match id.parse::<u64>() {
                Ok(n) if n >= 1 => {
                    ids.insert(n, addr);
                }
                _ => {
                    return Err(format!(
                        "{}cluster.peers: {id:?} is not a node id (a number ≥ 1)",
                        at("peers")
                    ));
                }
            }
            if addr
                .rsplit_once(':')
                .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
            {
                return Err(format!(
                    "{}cluster.peers.{id} = {addr:?} is not host:port",
                    at("peers")
                ));
            }
        }
        if ids.len() > CLUSTER_REPLICAS_MAX || ids.len() % 2 == 0 {
            return Err(format!(
                "{}cluster.peers names {} replicas: allowed 1, 3, 5 or 7 (an even number \
                 tolerates no more failures than one fewer)",
                at("peers"),
                ids.len()
            ));
        }
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(format!(
                "{}cluster.listen = {:?} is not an address (e.g. \"0.0.0.0:8788\")",
                at("listen"),
                self.listen
            ));
        }
        if !(self.api_url.starts_with("http://") || self.api_url.starts_with("https://"))
            || url::Url::parse(&self.api_url).is_err()
        {
            return Err(format!(
                "{}cluster.api_url = {:?} is not an http(s) URL",
                at("api_url"),
                self.api_url
            ));
        }
        if !(10..=10_000).contains(&self.heartbeat_ms) {
            return Err(format!(
                "{}cluster.heartbeat = {} is out of range: allowed 10ms to 10s",
                at("heartbeat"),
                format_duration_ms(self.heartbeat_ms)
            ));
        }
        if self.election_timeout_ms < 3 * self.heartbeat_ms || self.election_timeout_ms > 60_000 {
            return Err(format!(
                "{}cluster.election_timeout = {} is out of range: allowed 3 × heartbeat ({}) \
                 to 1m, so that a slow heartbeat never starts an election",
                at("election_timeout"),
                format_duration_ms(self.election_timeout_ms),
                format_duration_ms(3 * self.heartbeat_ms)
            ));
        }
        if let Some(secret) = &self.secret
            && let Err(why) = secret_shape(secret)
        {
            return Err(format!("{}cluster.secret: {why}", at("secret")));
        }
        if let Some(secret) = &self.secret
            && secret.len() < CLUSTER_SECRET_MIN_BYTES
        {
            return Err(format!(
                "{}cluster.secret is {} bytes: set at least {CLUSTER_SECRET_MIN_BYTES}",
                at("secret"),
                secret.len()
            ));
        }
        if let Some(tls) = &self.tls {
            crate::tls::ClusterTls::load(tls).map_err(|e| format!("{}{e}", at("tls")))?;
        }
        Ok(())
    }

    fn table(&self) -> toml::Table {
        let mut t = toml::Table::new();
        t.insert("node_id".into(), (self.node_id as i64).into());
        t.insert("listen".into(), self.listen.as_str().into());
        t.insert("advertise".into(), self.advertised().into());
        t.insert("api_url".into(), self.api_url.as_str().into());
        let peers: toml::Table = self
            .peers
            .iter()
            .map(|(k, v)| (k.clone(), toml::Value::from(v.as_str())))
            .collect();
        t.insert("peers".into(), toml::Value::Table(peers));
        // The secret is never printed, not even redacted: a placeholder
        // would not parse back as a secret.
        t.insert("forward_to_primary".into(), self.forward_to_primary.into());
        t.insert(
            "heartbeat".into(),
            format_duration_ms(self.heartbeat_ms).into(),
        );
        t.insert(
            "election_timeout".into(),
            format_duration_ms(self.election_timeout_ms).into(),
        );
        if let Some(tls) = &self.tls {
            let mut table = toml::Table::new();
            table.insert("cert".into(), tls.cert.as_str().into());
            table.insert("key".into(), tls.key.as_str().into());
            table.insert("ca".into(), tls.ca.as_str().into());
            t.insert("tls".into(), toml::Value::Table(table));
        }
        t
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
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub history_retention: Option<u64>,
    #[serde(default, deserialize_with = "de_opt_size")]
    pub history_max_bytes: Option<u64>,
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
            history_retention_ms: self.history_retention.unwrap_or(d.history_retention_ms),
            history_max_bytes: self.history_max_bytes.unwrap_or(d.history_max_bytes),
        }
    }
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.to_path_buf(),
            reason: match e.kind() {
                std::io::ErrorKind::NotFound => "no such file".into(),
                std::io::ErrorKind::PermissionDenied => "permission denied".into(),
                _ => e.to_string(),
            },
        })?;
        Config::parse(&text).map_err(|message| ConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        })
    }

    /// A copy safe to print: API keys and signing secrets replaced.
    pub fn redacted(&self) -> Config {
        let mut c = self.clone();
        for key in &mut c.server.api_keys {
            *key = "<redacted>".into();
        }
        if let Some(cluster) = &mut c.cluster
            && cluster.secret.is_some()
        {
            cluster.secret = Some("<redacted>".into());
        }
        for q in c.queues.values_mut() {
            if q.signing_secret.is_some() {
                q.signing_secret = Some("<redacted>".into());
            }
            // Static headers often carry credentials (Authorization).
            for value in q.headers.iter_mut().flat_map(|h| h.values_mut()) {
                *value = "<redacted>".into();
            }
        }
        c
    }

    /// The effective config as TOML, defaults filled in and secrets
    /// hidden (API keys, signing secrets, static header values): what
    /// `spoold check-config` prints. It parses back to the same config
    /// (secrets aside).
    pub fn effective_toml(&self) -> String {
        use toml::{Table, Value};
        let c = self.redacted();
        let strings =
            |v: &[String]| Value::Array(v.iter().map(|s| Value::from(s.as_str())).collect());
        let mut server = Table::new();
        server.insert("listen".into(), c.server.listen.as_str().into());
        if let Some(m) = &c.server.metrics_listen {
            server.insert("metrics_listen".into(), m.as_str().into());
        }
        server.insert("api_keys".into(), strings(&c.server.api_keys));
        server.insert(
            "allow_unauthenticated".into(),
            c.server.allow_unauthenticated.into(),
        );
        server.insert(
            "max_body_bytes".into(),
            format_size(c.server.max_body_bytes).into(),
        );
        server.insert(
            "shutdown_grace".into(),
            format_duration_ms(c.server.shutdown_grace_ms).into(),
        );
        server.insert(
            "drain_on_shutdown".into(),
            c.server.drain_on_shutdown.into(),
        );
        if let Some(allowed) = &c.server.allowed_destinations {
            server.insert("allowed_destinations".into(), strings(allowed));
        }
        server.insert("redact_headers".into(), strings(&c.server.redact_headers));
        let mut spool = Table::new();
        spool.insert("dir".into(), c.spool.dir.display().to_string().into());
        spool.insert("max_bytes".into(), format_size(c.spool.max_bytes).into());
        spool.insert(
            "segment_bytes".into(),
            format_size(c.spool.segment_bytes).into(),
        );
        spool.insert("fsync".into(), c.spool.fsync.into());
        let on_corruption = match c.spool.on_corruption {
            OnCorruption::Refuse => "refuse",
            OnCorruption::Quarantine => "quarantine",
        };
        spool.insert("on_corruption".into(), on_corruption.into());
        spool.insert(
            "compaction_interval".into(),
            format_duration_ms(c.spool.compaction_interval_ms).into(),
        );
        let mut log = Table::new();
        let format = match c.log.format {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        };
        log.insert("format".into(), format.into());
        log.insert("level".into(), c.log.level.as_str().into());
        let mut events = Table::new();
        events.insert(
            "max_subscribers".into(),
            (c.events.max_subscribers as i64).into(),
        );
        events.insert(
            "dedup_window".into(),
            format_duration_ms(c.events.dedup_window_ms).into(),
        );
        let mut telemetry = Table::new();
        if let Some(endpoint) = &c.telemetry.otlp_endpoint {
            telemetry.insert("otlp_endpoint".into(), endpoint.as_str().into());
        }
        telemetry.insert(
            "service_name".into(),
            c.telemetry.service_name.as_str().into(),
        );
        let mut queues = Table::new();
        for (name, q) in &c.queues {
            queues.insert(name.clone(), Value::Table(queue_table(&q.settings())));
        }
        let mut root = Table::new();
        root.insert("server".into(), Value::Table(server));
        root.insert("spool".into(), Value::Table(spool));
        root.insert("log".into(), Value::Table(log));
        root.insert("events".into(), Value::Table(events));
        root.insert("telemetry".into(), Value::Table(telemetry));
        root.insert("queues".into(), Value::Table(queues));
        if let Some(cluster) = &c.cluster {
            root.insert("cluster".into(), Value::Table(cluster.table()));
        }
        let mut text = toml::to_string_pretty(&root).expect("a table of plain values serializes");
        for (name, q) in &c.queues {
            let header = format!("[queues.{name}]\n");
            if q.signing_secret.is_some()
                && let Some(at) = text.find(&header)
            {
                text.insert_str(
                    at + header.len(),
                    "# signing_secret is set (never printed)\n",
                );
            }
        }
        text
    }

    /// Parses and validates config text; the error names key and line.
    pub fn parse(text: &str) -> Result<Config, String> {
        let mut config: Config = toml::from_str(text).map_err(|e| describe_toml_error(text, &e))?;
        config.validate(text)?;
        config.listen_line = line_in_table(text, "[server]", "listen");
        Ok(config)
    }

    fn validate(&self, text: &str) -> Result<(), String> {
        let at = |key: &str| line_of(text, key).map_or(String::new(), |l| format!("line {l}: "));
        let seg = self.spool.segment_bytes;
        if !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&seg) {
            return Err(format!(
                "{}spool.segment_bytes = {seg} is out of range: allowed {SEGMENT_BYTES_MIN} (64KiB) to {SEGMENT_BYTES_MAX} (1GiB)",
                at("segment_bytes")
            ));
        }
        let min_max = 4 * seg;
        if self.spool.max_bytes < min_max {
            return Err(format!(
                "{}spool.max_bytes = {} is too small for segment_bytes = {seg}: \
                 allowed at least 4 × segment_bytes = {min_max}, so that acks, nacks and \
                 compaction always fit",
                at("max_bytes"),
                self.spool.max_bytes
            ));
        }
        // A queue has a `dedup_window` of its own: look in `[events]`.
        let in_events = |key: &str| {
            line_in_table(text, "[events]", key).map_or(String::new(), |l| format!("line {l}: "))
        };
        let subscribers = self.events.max_subscribers;
        if !(1..=EVENT_SUBSCRIBERS_MAX).contains(&subscribers) {
            return Err(format!(
                "{}events.max_subscribers = {subscribers} is out of range: allowed 1 to {EVENT_SUBSCRIBERS_MAX}",
                in_events("max_subscribers")
            ));
        }
        if self.events.dedup_window_ms > EVENT_DEDUP_WINDOW_MAX_MS {
            return Err(format!(
                "{}events.dedup_window = {} is out of range: allowed 0 to 30d",
                in_events("dedup_window"),
                format_duration_ms(self.events.dedup_window_ms)
            ));
        }
        if let Some(endpoint) = &self.telemetry.otlp_endpoint {
            let at = line_in_table(text, "[telemetry]", "otlp_endpoint")
                .map_or(String::new(), |l| format!("line {l}: "));
            let parsed = url::Url::parse(endpoint);
            if !parsed.is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some()) {
                return Err(format!(
                    "{at}telemetry.otlp_endpoint = {endpoint:?} is not an http or https URL \
                     (a collector's OTLP/HTTP address, such as http://otel-collector:4318)"
                ));
            }
        }
        if self.telemetry.service_name.trim().is_empty() {
            let at = line_in_table(text, "[telemetry]", "service_name")
                .map_or(String::new(), |l| format!("line {l}: "));
            return Err(format!("{at}telemetry.service_name is empty"));
        }
        let every = self.spool.compaction_interval_ms;
        if !(COMPACTION_INTERVAL_MIN_MS..=COMPACTION_INTERVAL_MAX_MS).contains(&every) {
            return Err(format!(
                "{}spool.compaction_interval = {} is out of range: allowed 10ms to 1d",
                at("compaction_interval"),
                format_duration_ms(every)
            ));
        }
        if self.server.shutdown_grace_ms > SHUTDOWN_GRACE_MAX_MS {
            return Err(format!(
                "{}server.shutdown_grace = {} is out of range: allowed 0 to 1h (a Kubernetes \
                 pod's terminationGracePeriodSeconds should exceed it)",
                at("shutdown_grace"),
                format_duration_ms(self.server.shutdown_grace_ms)
            ));
        }
        if let Some((i, why)) = self
            .server
            .api_keys
            .iter()
            .enumerate()
            .find_map(|(i, k)| secret_shape(k).err().map(|why| (i, why)))
        {
            return Err(format!(
                "{}server.api_keys: key {}: {why}",
                at("api_keys"),
                i + 1
            ));
        }
        for header in &self.server.redact_headers {
            if header.is_empty() || header.bytes().any(|b| b.is_ascii_whitespace() || b == b':') {
                return Err(format!(
                    "{}server.redact_headers: {header:?} is not a header name",
                    at("redact_headers")
                ));
            }
        }
        if let Some(cluster) = &self.cluster {
            let in_cluster = |key: &str| {
                line_in_table(text, "[cluster]", key)
                    .map_or(String::new(), |l| format!("line {l}: "))
            };
            cluster.validate(&in_cluster)?;
        }
        let policy = self.policy();
        for (name, queue) in &self.queues {
            let table = format!("[queues.{name}]");
            if let Err(e) = rules::check(name, &queue.settings(), Origin::Config, &policy) {
                let key = match &e {
                    QueueRuleError::Settings(s) => Some(s.field),
                    QueueRuleError::File { field, .. } => Some(*field),
                    QueueRuleError::DestinationNotAllowed { .. } => Some(Field::Destination),
                    QueueRuleError::Name { .. } | QueueRuleError::FileOverApi { .. } => None,
                };
                let line = key
                    .and_then(|f| line_in_table(text, &table, f.toml_name()))
                    .or_else(|| line_of(text, &table));
                let at = line.map_or(String::new(), |l| format!("line {l}: "));
                let detail = match &e {
                    QueueRuleError::Settings(s) => s.describe(Naming::Toml),
                    other => other.to_string(),
                };
                return Err(format!("{at}queues.{name}.{detail}"));
            }
        }
        Ok(())
    }

    /// What the server allows any queue, from `[server]`.
    pub fn policy(&self) -> Policy {
        Policy {
            allowed_destinations: self.server.allowed_destinations.clone(),
            max_event_subscribers: self.events.max_subscribers,
            event_dedup_window_ms: self.events.dedup_window_ms,
        }
    }

    /// The API keys in force: the config's and those of `SPOOLD_API_KEYS`
    /// (comma-separated); an empty key is refused.
    pub fn api_keys(&self, env_api_keys: Option<&str>) -> Result<Vec<String>, String> {
        let mut keys = self.server.api_keys.clone();
        let from_env: Vec<String> = env_api_keys
            .filter(|env| !env.trim().is_empty())
            .map(|env| env.split(',').map(|k| k.trim().to_string()).collect())
            .unwrap_or_default();
        if from_env.iter().any(String::is_empty) {
            return Err(
                "SPOOLD_API_KEYS holds an empty key (two commas, or a trailing one): \
                 an empty key would let anyone in"
                    .into(),
            );
        }
        keys.extend(from_env);
        Ok(keys)
    }

    /// Refuses to serve beyond loopback without a key (unless
    /// `allow_unauthenticated`): `run` and `check-config` both ask this.
    pub fn check_exposure(&self, env_api_keys: Option<&str>) -> Result<(), String> {
        let keys = self.api_keys(env_api_keys)?;
        if keys.is_empty()
            && !self.server.allow_unauthenticated
            && !is_loopback(&self.server.listen)
        {
            let at = self
                .listen_line
                .map_or(String::new(), |l| format!("line {l}: "));
            return Err(format!(
                "{at}server.listen = {:?}: refusing to listen beyond loopback without an API \
                 key: set server.api_keys or SPOOLD_API_KEYS, listen on a loopback address, \
                 or set server.allow_unauthenticated = true",
                self.server.listen
            ));
        }
        Ok(())
    }
}

/// Whether `listen` (an address or `host:port`) is loopback: an IP literal
/// that is, or `localhost`. A name that might resolve elsewhere is not.
pub(crate) fn is_loopback(listen: &str) -> bool {
    if let Ok(addr) = listen.parse::<std::net::SocketAddr>() {
        return addr.ip().is_loopback();
    }
    let host = listen.rsplit_once(':').map_or(listen, |(h, _)| h);
    host.eq_ignore_ascii_case("localhost")
}

/// The line of `key` inside the table whose header is `table` (an inline
/// `backoff = { … }` counts for `backoff.initial`).
fn line_in_table(text: &str, table: &str, key: &str) -> Option<usize> {
    let start = text.lines().position(|l| l.trim() == table)?;
    let first = key.split('.').next().unwrap_or(key);
    text.lines()
        .enumerate()
        .skip(start + 1)
        .take_while(|(_, l)| !l.trim_start().starts_with('['))
        .find(|(_, l)| {
            let l = l.trim_start();
            l.starts_with(first) && l[first.len()..].trim_start().starts_with(['=', '.'])
        })
        .map(|(i, _)| i + 1)
}

/// The 1-based line where `needle` first appears, for error messages.
fn line_of(text: &str, needle: &str) -> Option<usize> {
    text.lines().position(|l| l.contains(needle)).map(|i| i + 1)
}

fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    match e.span() {
        Some(span) => {
            let start = span.start.min(text.len());
            let line = text[..start].matches('\n').count() + 1;
            // Name the key when the span is a value: `table.key = …`.
            let line_text = text.lines().nth(line - 1).unwrap_or_default();
            let key = line_text
                .split_once('=')
                .map(|(k, _)| k.trim())
                .filter(|k| !k.is_empty() && !k.starts_with('['));
            let table = text[..start]
                .lines()
                .rev()
                .map(str::trim)
                .find(|l| l.starts_with('[') && l.ends_with(']'))
                .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim());
            match (table, key) {
                (Some(table), Some(key)) => format!("line {line}: {table}.{key}: {}", e.message()),
                (None, Some(key)) => format!("line {line}: {key}: {}", e.message()),
                _ => format!("line {line}: {}", e.message()),
            }
        }
        None => e.message().to_string(),
    }
}

/// Parses `"30s"`, `"250ms"`, `"10m"`, `"2h"`, `"7d"`, `"1.5s"`, or
/// several spans as `humantime` reads them (`"1h30m"`, `"2h 15min"`) into
/// milliseconds.
pub(crate) fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let text = text.trim();
    match parse_one_span_ms(text) {
        Ok(ms) => Ok(ms),
        Err(e) => match humantime::parse_duration(text) {
            Ok(d) => u64::try_from(d.as_millis())
                .ok()
                .filter(|ms| *ms <= DURATION_MS_MAX)
                .ok_or_else(|| format!("duration {text:?} is too long")),
            Err(_) => Err(e),
        },
    }
}

/// One number and unit, the number possibly fractional.
fn parse_one_span_ms(text: &str) -> Result<u64, String> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("duration {text:?} needs a unit: ms, s, m, h or d"))?;
    let (num, unit) = text.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {text:?}: expected e.g. \"30s\" or \"250ms\""))?;
    let scale = match unit.trim() {
        "ms" => 1.0,
        "s" => 1_000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        other => {
            return Err(format!(
                "invalid duration unit {other:?} in {text:?}: allowed ms, s, m, h, d"
            ));
        }
    };
    let ms = (value * scale).round();
    if !ms.is_finite() || ms > DURATION_MS_MAX as f64 {
        return Err(format!(
            "duration {text:?} is too long: at most {} days",
            DURATION_MS_MAX / 86_400_000
        ));
    }
    Ok(ms as u64)
}

/// The longest duration any setting may be written as: 100 years, past
/// every sane value, so that nothing quietly saturates.
const DURATION_MS_MAX: u64 = 100 * 365 * 86_400_000;
/// The longest `server.shutdown_grace`.
const SHUTDOWN_GRACE_MAX_MS: u64 = 3_600_000;

/// A secret (an API key, the cluster secret) is not blank and has no
/// whitespace at either end: a pasted line break or a placeholder of
/// spaces is a mistake, never a key.
fn secret_shape(secret: &str) -> Result<(), String> {
    if secret.trim().is_empty() {
        return Err("is empty or only whitespace: it would protect nothing".into());
    }
    if secret.trim() != secret {
        return Err("begins or ends with whitespace (a pasted line break?)".into());
    }
    if secret.chars().any(char::is_control) {
        return Err("holds a control character".into());
    }
    Ok(())
}

/// One queue's effective settings as a `[queues.NAME]` table (delivery
/// settings only for a push queue).
fn queue_table(s: &QueueSettings) -> toml::Table {
    use toml::Value;
    let mut t = toml::Table::new();
    let ms = |v: u64| Value::from(format_duration_ms(v));
    t.insert("lease_timeout".into(), ms(s.lease_timeout_ms));
    t.insert("max_retries".into(), i64::from(s.max_retries).into());
    t.insert("retention".into(), ms(s.retention_ms));
    t.insert("dedup_window".into(), ms(s.dedup_window_ms));
    let on_expire = match s.on_expire {
        OnExpire::Discard => "discard",
        OnExpire::Fail => "fail",
    };
    t.insert("on_expire".into(), on_expire.into());
    let Some(destination) = &s.destination else {
        return t;
    };
    t.insert("destination".into(), destination.as_str().into());
    t.insert("concurrency".into(), i64::from(s.concurrency).into());
    if let Some(rate) = s.rate_limit {
        t.insert("rate_limit".into(), rate.into());
    }
    t.insert("timeout".into(), ms(s.timeout_ms));
    let mut backoff = toml::Table::new();
    backoff.insert("initial".into(), ms(s.backoff.initial_ms));
    backoff.insert("multiplier".into(), s.backoff.multiplier.into());
    backoff.insert("max".into(), ms(s.backoff.max_ms));
    backoff.insert("jitter".into(), s.backoff.jitter.into());
    t.insert("backoff".into(), Value::Table(backoff));
    let headers: toml::Table = s
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
        .collect();
    t.insert("headers".into(), Value::Table(headers));
    // A signing secret is never printed: `effective_toml` says in a
    // comment that one is set (a placeholder would not be a valid secret).
    let statuses = s
        .permanent_failure_statuses
        .iter()
        .map(|&c| Value::from(i64::from(c)))
        .collect();
    t.insert("permanent_failure_statuses".into(), Value::Array(statuses));
    t.insert(
        "breaker_failures".into(),
        i64::from(s.breaker_failures).into(),
    );
    for (key, file) in [
        ("ca_file", &s.ca_file),
        ("client_cert", &s.client_cert),
        ("client_key", &s.client_key),
    ] {
        if let Some(f) = file {
            t.insert(key.into(), f.as_str().into());
        }
    }
    if !s.events.is_empty() {
        let events = s.events.iter().map(|p| Value::from(p.as_str())).collect();
        t.insert("events".into(), Value::Array(events));
    }
    if let Some(tenant) = &s.tenant {
        t.insert("tenant".into(), tenant.as_str().into());
    }
    if s.history_retention_ms > 0 {
        t.insert("history_retention".into(), ms(s.history_retention_ms));
        t.insert(
            "history_max_bytes".into(),
            format_size(s.history_max_bytes).into(),
        );
    }
    t
}

/// Milliseconds in the largest unit that holds them exactly (`"90m"`,
/// `"250ms"`), as the config file spells durations.
pub(crate) fn format_duration_ms(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    for (scale, unit) in UNITS {
        if ms != 0 && ms.is_multiple_of(scale) {
            return format!("{}{unit}", ms / scale);
        }
    }
    format!("{ms}ms")
}

/// Bytes in the largest binary unit that holds them exactly (`"64MiB"`).
fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes != 0 && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Parses `"64MiB"`, `"1GiB"`, `"512KiB"`, `"10MB"` or `"1000"` into bytes.
pub(crate) fn parse_size_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (num, unit) = text.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid size {text:?}: expected e.g. \"64MiB\""))?;
    let scale: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        other => {
            return Err(format!(
                "invalid size unit {other:?} in {text:?}: allowed B, KiB, MiB, GiB, KB, MB, GB"
            ));
        }
    };
    let bytes = (value * scale).round();
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("size {text:?} is too large"));
    }
    Ok(bytes as u64)
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

fn de_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match SizeValue::deserialize(d)? {
        SizeValue::Bytes(n) => Ok(n),
        SizeValue::Text(s) => parse_size_bytes(&s).map_err(serde::de::Error::custom),
    }
}

fn de_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let s = String::deserialize(d)?;
    parse_duration_ms(&s).map_err(serde::de::Error::custom)
}

fn de_opt_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    de_duration(d).map(Some)
}

fn de_opt_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    de_size(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_text_gives_the_embedded_defaults() {
        let c = Config::parse("").unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.server.listen, "127.0.0.1:8787");
        assert_eq!(c.spool.dir, PathBuf::from("./spool"));
    }

    #[test]
    fn durations_and_sizes_parse() {
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("1.5s"), Ok(1_500));
        assert_eq!(parse_duration_ms("7d"), Ok(604_800_000));
        assert_eq!(parse_duration_ms("1h30m"), Ok(5_400_000));
        assert_eq!(parse_duration_ms("2h 15min"), Ok(8_100_000));
        assert_eq!(parse_duration_ms("1d12h"), Ok(129_600_000));
        assert!(parse_duration_ms("30").is_err());
        for ms in [250, 1_000, 90_000, 5_400_000, 604_800_000, 1_500] {
            assert_eq!(parse_duration_ms(&format_duration_ms(ms)), Ok(ms));
        }
        assert!(parse_duration_ms("30x").is_err());
        assert_eq!(parse_size_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size_bytes("1000"), Ok(1000));
        assert!(parse_size_bytes("1 parsec").is_err());
    }

    #[test]
    fn queue_tables_become_settings() {
        let c = Config::parse(
            "[queues.orders]\nlease_timeout = \"60s\"\nmax_retries = 5\ndedup_window = \"10m\"\non_expire = \"fail\"\n\
             [queues.billing]\ndestination = \"https://b.example.com/h\"\nbackoff = { initial = \"1s\", multiplier = 2 }\n",
        )
        .unwrap();
        let orders = c.queues["orders"].settings();
        assert_eq!(orders.lease_timeout_ms, 60_000);
        assert_eq!(orders.max_retries, 5);
        assert_eq!(orders.dedup_window_ms, 600_000);
        assert_eq!(orders.on_expire, OnExpire::Fail);
        let billing = c.queues["billing"].settings();
        assert_eq!(billing.backoff.initial_ms, 1_000);
        assert_eq!(billing.backoff.multiplier, 2.0);
        assert_eq!(billing.backoff.max_ms, Backoff::default().max_ms);
    }

    #[test]
    fn errors_name_the_key_and_line() {
        let err = Config::parse("[spool]\ndir = \"x\"\nfsynk = true\n").unwrap_err();
        assert!(err.contains("line 3"), "{err}");
        assert!(err.contains("fsynk"), "{err}");
        let err = Config::parse("[server]\nshutdown_grace = \"soon\"\n").unwrap_err();
        assert!(err.contains("line 2"), "{err}");
        let err =
            Config::parse("[server]\nshutdown_grace = \"99999999999999999999d\"\n").unwrap_err();
        assert!(
            err.contains("line 2: server.shutdown_grace") && err.contains("too long"),
            "{err}"
        );
        let err = Config::parse("[server]\nshutdown_grace = \"2h\"\n").unwrap_err();
        assert!(err.contains("line 2: server.shutdown_grace"), "{err}");
        let err = Config::parse("[server]\napi_keys = [\"                \"]\n").unwrap_err();
        assert!(err.contains("line 2: server.api_keys"), "{err}");
        let err = Config::parse("[spool]\nsegment_bytes = \"64MiB\"\nmax_bytes = \"128MiB\"\n")
            .unwrap_err();
        assert!(err.contains("max_bytes") && err.contains("line 3"), "{err}");
        let err = Config::parse("[spool]\nsegment_bytes = \"1KiB\"\n").unwrap_err();
        assert!(
            err.contains("segment_bytes") && err.contains("line 2"),
            "{err}"
        );
    }

    const CLUSTER: &str = "[cluster]\nnode_id = 2\nlisten = \"0.0.0.0:8788\"\n\
        api_url = \"http://spoold-1.spoold:8787\"\n\
        peers = { 1 = \"a:8788\", 2 = \"b:8788\", 3 = \"c:8788\" }\n\
        secret = \"0123456789abcdef\"\n";

    #[test]
    fn a_cluster_table_takes_the_contract_defaults() {
        let c = Config::parse(CLUSTER).unwrap().cluster.unwrap();
        assert_eq!(c.node_id, 2);
        assert_eq!((c.heartbeat_ms, c.election_timeout_ms), (100, 500));
        assert!(c.forward_to_primary);
        assert_eq!(c.advertised(), "0.0.0.0:8788");
        assert_eq!(c.peer_ids().len(), 3);
        assert_eq!(c.secret(None).unwrap(), "0123456789abcdef");
        // The effective config never prints the secret, and parses back.
        let printed = Config::parse(CLUSTER).unwrap().effective_toml();
        assert!(!printed.contains("0123456789abcdef"), "{printed}");
        let back = Config::parse(&printed).unwrap().cluster.unwrap();
        assert_eq!(back.peers, c.peers);
    }

    #[test]
    fn cluster_mistakes_name_the_key_and_line() {
        let cases = [
            ("node_id = 2", "node_id = 0", "node_id", 2),
            (", 3 = \"c:8788\"", "", "allowed 1, 3, 5 or 7", 5),
            ("c:8788", "c", "not host:port", 5),
            ("0.0.0.0:8788", "localhost", "cluster.listen", 3),
            ("http://spoold-1", "spoold-1", "cluster.api_url", 4),
            ("0123456789abcdef", "short", "cluster.secret", 6),
        ];
        for (from, to, says, line) in cases {
            let text = CLUSTER.replacen(from, to, 1);
            let err = Config::parse(&text).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
            assert!(err.contains(&format!("line {line}")), "{text}: {err}");
        }
        let timing = format!("{CLUSTER}heartbeat = \"200ms\"\n");
        let err = Config::parse(&timing).unwrap_err();
        assert!(
            err.contains("election_timeout") && err.contains("3 × heartbeat"),
            "{err}"
        );
        let unknown = format!("{CLUSTER}voters = 3\n");
        let err = Config::parse(&unknown).unwrap_err();
        assert!(err.contains("voters") && err.contains("line 7"), "{err}");
        let no_secret = CLUSTER.replace("secret = \"0123456789abcdef\"\n", "");
        let c = Config::parse(&no_secret).unwrap().cluster.unwrap();
        assert!(c.secret(None).is_err());
        assert_eq!(
            c.secret(Some("from-the-environment")).unwrap(),
            "from-the-environment"
        );
    }

    #[test]
    fn event_limits_name_their_line_not_a_queue_key_of_the_same_name() {
        let text = "[queues.a]\ndedup_window = \"1h\"\n[events]\nmax_subscribers = 10\ndedup_window = \"31d\"\n";
        let err = Config::parse(text).unwrap_err();
        assert!(err.starts_with("line 5: events.dedup_window"), "{err}");
        let text = "[queues.a]\n[events]\nmax_subscribers = 0\n";
        let err = Config::parse(text).unwrap_err();
        assert!(err.starts_with("line 3: events.max_subscribers"), "{err}");
    }
}

#[cfg(test)]
mod example_file {
    use super::*;

    #[test]
    fn the_effective_config_parses_back_to_the_same_config() {
        let text = include_str!("../config.example.toml");
        let config = Config::parse(text).unwrap().redacted();
        let printed = config.effective_toml();
        let back = Config::parse(&printed).unwrap_or_else(|e| panic!("{e}\n{printed}"));
        assert_eq!(back.server, config.server);
        assert_eq!(back.spool, config.spool);
        assert_eq!(back.log, config.log);
        for (name, q) in &config.queues {
            let hidden = QueueSettings {
                signing_secret: None,
                ..q.settings()
            };
            assert_eq!(back.queues[name].settings(), hidden, "{name}");
        }
        assert!(printed.contains("# signing_secret is set"), "{printed}");
        assert!(!printed.contains("whsec_"), "{printed}");
    }

    #[test]
    fn config_example_toml_parses() {
        let text = include_str!("../config.example.toml");
        let config = Config::parse(text).expect("config.example.toml is valid");
        assert_eq!(config.queues.len(), 2);
        assert!(config.queues["billing"].settings().is_push());
    }
}
