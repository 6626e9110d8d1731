//! The checks of a parsed config, table by table, each error naming the
//! key and its line; the queue tables are held to the engine's own rules
//! (`engine::rules::check`), so that the config cannot own a queue rule.
//! Also the exposure check (a key when listening beyond loopback) that
//! `run` and `check-config` both ask.

use super::KeyError;
use super::keys::{ApiKey, ApiKeyEntry};
use super::lines::{KeyLines, at_line};
use super::shape::Config;
use super::units::{format_duration_ms, format_size};
use crate::engine::guard::{Guard, OwnEndpoints, check_allowed_destinations};
use crate::engine::rules::{self, Origin, Policy, QueueRuleError};
use crate::journal::format::RECORD_BODY_MAX_BYTES;
use crate::listen::HEADER_BYTES_MAX;
use crate::spool::queue::QUEUE_NAME_MAX_BYTES;
use crate::spool::queue::limits;
use crate::spool::queue::{Field, Naming};

/// Smallest segment size accepted: below it rotation would dominate.
const SEGMENT_BYTES_MIN: u64 = 64 << 10;
/// Largest segment size accepted: record offsets are 32-bit, and a segment
/// is read whole at replay.
const SEGMENT_BYTES_MAX: u64 = 1 << 30;
/// Compaction's period: often enough that garbage does not pile up, never
/// a busy loop.
const COMPACTION_INTERVAL_MIN_MS: u64 = 10;
const COMPACTION_INTERVAL_MAX_MS: u64 = 86_400_000;
/// Bounds of the `[events]` table: an event's record lists every delivery
/// (about 30 bytes each), and its keys are held in memory for the window.
const EVENT_SUBSCRIBERS_MAX: usize = 100_000;
/// The largest `server.max_body_bytes`: a payload and the most a record
/// holds beside it ([`RECORD_ENVELOPE_BYTES_MAX`]) fit in the journal's
/// record bound, which a longer record would break (the writer refuses
/// it; a scan reads it as damage).
pub(crate) const BODY_BYTES_MAX: u64 = (RECORD_BODY_MAX_BYTES - RECORD_ENVELOPE_BYTES_MAX) as u64;
/// What a record holds beside its payload, at most: an event's delivery
/// list (`events.max_subscribers` queues of the longest name, each a
/// length, the name and an id), a forwarded request's head (the listener's
/// header bound), and a record's short strings (type, tenant, content
/// type, trace: a 16-bit length each) and fixed fields.
const RECORD_ENVELOPE_BYTES_MAX: usize = 16 << 20;
const _: () = assert!(
    EVENT_SUBSCRIBERS_MAX * (2 + QUEUE_NAME_MAX_BYTES + 8)
        + HEADER_BYTES_MAX
        + 4 * (2 + 65_535)
        + 1024
        <= RECORD_ENVELOPE_BYTES_MAX,
    "a record's envelope outgrew the room left beside max_body_bytes"
);
/// The largest `delivery.max_connections_per_host`: a port's worth of
/// connections from one address.
const CONNECTIONS_PER_HOST_MAX: usize = 65_535;

/// The largest `server.max_queues`: each queue costs memory and a timer's
/// look, and a spool's state of millions of them is no longer one node's.
const QUEUES_MAX: usize = 10_000_000;
/// The smallest `spool.max_memory`: below it a few thousand messages fill
/// it.
const MAX_MEMORY_MIN: u64 = 16 << 20;
/// The largest `spool.max_bytes`, in segments: every journal file stays
/// open for reads (`journal/reader.rs`), one descriptor each, and this is
/// a quarter of what `deploy/systemd/spoold.service` allows a process.
const SPOOL_SEGMENTS_MAX: u64 = 16_384;
const EVENT_DEDUP_WINDOW_MAX_MS: u64 = 30 * 86_400_000;
/// The longest `server.shutdown_grace`.
const SHUTDOWN_GRACE_MAX_MS: u64 = 3_600_000;

impl Config {
    /// Checks every table; the first mistake is the error, naming its key
    /// and, from `keys`, its line.
    pub(super) fn validate(&self, keys: &KeyLines) -> Result<(), KeyError> {
        self.check_sizes(keys)?;
        self.check_events(keys)?;
        self.check_delivery(keys)?;
        self.check_telemetry(keys)?;
        self.check_periods(keys)?;
        self.check_server(keys)?;
        self.portal.validate(keys)?;
        if let Some(cluster) = &self.cluster {
            cluster.validate(keys)?;
        }
        self.check_queues(keys)
    }

    /// Segments within their bounds, and room for four of them.
    fn check_sizes(&self, keys: &KeyLines) -> Result<(), KeyError> {
        let seg = self.spool.segment_bytes;
        if !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&seg) {
            return Err(keys.error(
                &["spool", "segment_bytes"],
                format!(
                    "spool.segment_bytes = {seg} is out of range: allowed {SEGMENT_BYTES_MIN} \
                     (64KiB) to {SEGMENT_BYTES_MAX} (1GiB)"
                ),
            ));
        }
        let min_max = 4 * seg;
        if self.spool.max_bytes < min_max {
            return Err(keys.error(
                &["spool", "max_bytes"],
                format!(
                    "spool.max_bytes = {} is too small for segment_bytes = {seg}: \
                     allowed at least 4 × segment_bytes = {min_max}, so that acks, nacks and \
                     compaction always fit",
                    self.spool.max_bytes
                ),
            ));
        }
        let most = SPOOL_SEGMENTS_MAX * seg;
        if self.spool.max_bytes > most {
            return Err(keys.error(
                &["spool", "max_bytes"],
                format!(
                    "spool.max_bytes = {} is too large for segment_bytes = {seg}: allowed at most \
                     {SPOOL_SEGMENTS_MAX} × segment_bytes = {most} ({}), since every journal file \
                     stays open for reads; raise segment_bytes for a larger spool",
                    self.spool.max_bytes,
                    format_size(most)
                ),
            ));
        }
        if let Some(memory) = self.spool.max_memory
            && memory < MAX_MEMORY_MIN
        {
            return Err(keys.error(
                &["spool", "max_memory"],
                format!(
                    "spool.max_memory = {memory} is too small: allowed at least {} (16MiB)",
                    MAX_MEMORY_MIN
                ),
            ));
        }
        let body = self.server.max_body_bytes;
        if !(1..=BODY_BYTES_MAX).contains(&body) {
            return Err(keys.error(
                &["server", "max_body_bytes"],
                format!(
                    "server.max_body_bytes = {body} is out of range: allowed 1 to {BODY_BYTES_MAX} \
                     ({}), so that a record with the largest body still fits the journal's \
                     record bound of {} ({})",
                    format_size(BODY_BYTES_MAX),
                    RECORD_BODY_MAX_BYTES,
                    format_size(RECORD_BODY_MAX_BYTES as u64)
                ),
            ));
        }
        Ok(())
    }

    /// Gives each queue table that sets no history of its own the
    /// `[events]` default, if it is an event endpoint (a push queue with
    /// `events`): the file's queues and the API's get the same.
    pub(super) fn fill_history_defaults(&mut self) {
        let default = self.events.history_default();
        for queue in self.queues.values_mut() {
            if queue.history_retention.is_some() || queue.history_max_bytes.is_some() {
                continue;
            }
            let mut settings = queue.settings();
            default.fill(&mut settings);
            if settings.history_retention_ms > 0 {
                queue.history_retention = Some(settings.history_retention_ms);
                queue.history_max_bytes = Some(settings.history_max_bytes);
            }
        }
    }

    fn check_delivery(&self, keys: &KeyLines) -> Result<(), KeyError> {
        let max = self.delivery.max_connections_per_host;
        if !(1..=CONNECTIONS_PER_HOST_MAX).contains(&max) {
            return Err(keys.error(
                &["delivery", "max_connections_per_host"],
                format!(
                    "delivery.max_connections_per_host = {max} is out of range: allowed 1 to \
                     {CONNECTIONS_PER_HOST_MAX}"
                ),
            ));
        }
        Ok(())
    }

    fn check_events(&self, keys: &KeyLines) -> Result<(), KeyError> {
        let subscribers = self.events.max_subscribers;
        if !(1..=EVENT_SUBSCRIBERS_MAX).contains(&subscribers) {
            return Err(keys.error(
                &["events", "max_subscribers"],
                format!(
                    "events.max_subscribers = {subscribers} is out of range: allowed 1 to \
                     {EVENT_SUBSCRIBERS_MAX}"
                ),
            ));
        }
        if self.events.dedup_window_ms > EVENT_DEDUP_WINDOW_MAX_MS {
            return Err(keys.error(
                &["events", "dedup_window"],
                format!(
                    "events.dedup_window = {} is out of range: allowed 0 to 30d",
                    format_duration_ms(self.events.dedup_window_ms)
                ),
            ));
        }
        if self.events.history_retention_ms > limits::HISTORY_RETENTION_MS {
            return Err(keys.error(
                &["events", "history_retention"],
                format!(
                    "events.history_retention = {} is out of range: allowed 0 to 365d",
                    format_duration_ms(self.events.history_retention_ms)
                ),
            ));
        }
        let (lo, hi) = limits::HISTORY_BYTES;
        if !(lo..=hi).contains(&self.events.history_max_bytes) {
            return Err(keys.error(
                &["events", "history_max_bytes"],
                format!(
                    "events.history_max_bytes = {} is out of range: allowed 1KiB to 1TiB",
                    format_size(self.events.history_max_bytes)
                ),
            ));
        }
        Ok(())
    }

    fn check_telemetry(&self, keys: &KeyLines) -> Result<(), KeyError> {
        if let Some(endpoint) = &self.telemetry.otlp_endpoint {
            let parsed = url::Url::parse(endpoint);
            if !parsed.is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some()) {
                return Err(keys.error(
                    &["telemetry", "otlp_endpoint"],
                    format!(
                        "telemetry.otlp_endpoint = {endpoint:?} is not an http or https URL \
                         (a collector's OTLP/HTTP address, such as http://otel-collector:4318)"
                    ),
                ));
            }
        }
        if self.telemetry.service_name.trim().is_empty() {
            return Err(keys.error(
                &["telemetry", "service_name"],
                "telemetry.service_name is empty".into(),
            ));
        }
        Ok(())
    }

    /// A compaction period that is neither a busy loop nor forever, and a
    /// shutdown grace a pod's termination period can cover.
    fn check_periods(&self, keys: &KeyLines) -> Result<(), KeyError> {
        let every = self.spool.compaction_interval_ms;
        if !(COMPACTION_INTERVAL_MIN_MS..=COMPACTION_INTERVAL_MAX_MS).contains(&every) {
            return Err(keys.error(
                &["spool", "compaction_interval"],
                format!(
                    "spool.compaction_interval = {} is out of range: allowed 10ms to 1d",
                    format_duration_ms(every)
                ),
            ));
        }
        if self.server.shutdown_grace_ms > SHUTDOWN_GRACE_MAX_MS {
            return Err(keys.error(
                &["server", "shutdown_grace"],
                format!(
                    "server.shutdown_grace = {} is out of range: allowed 0 to 1h (a Kubernetes \
                     pod's terminationGracePeriodSeconds should exceed it)",
                    format_duration_ms(self.server.shutdown_grace_ms)
                ),
            ));
        }
        Ok(())
    }

    /// API keys of a secret's shape, and header names to redact.
    fn check_server(&self, keys: &KeyLines) -> Result<(), KeyError> {
        if let Some((i, why)) = self
            .server
            .api_keys
            .iter()
            .enumerate()
            .find_map(|(i, k)| k.problem().map(|why| (i, why)))
        {
            return Err(keys.error(
                &["server", "api_keys"],
                format!("server.api_keys: key {}: {why}", i + 1),
            ));
        }
        let max_queues = self.server.max_queues;
        if !(1..=QUEUES_MAX).contains(&max_queues) {
            return Err(keys.error(
                &["server", "max_queues"],
                format!(
                    "server.max_queues = {max_queues} is out of range: allowed 1 to {QUEUES_MAX}"
                ),
            ));
        }
        if self.queues.len() > max_queues {
            return Err(keys.error(
                &["server", "max_queues"],
                format!(
                    "server.max_queues = {max_queues}, but the file defines {} queues",
                    self.queues.len()
                ),
            ));
        }
        if let Some(allowed) = &self.server.allowed_destinations
            && let Err(why) = check_allowed_destinations(allowed)
        {
            return Err(keys.error(
                &["server", "allowed_destinations"],
                format!("server.allowed_destinations: {why}"),
            ));
        }
        for header in &self.server.redact_headers {
            if header.is_empty() || header.bytes().any(|b| b.is_ascii_whitespace() || b == b':') {
                return Err(keys.error(
                    &["server", "redact_headers"],
                    format!("server.redact_headers: {header:?} is not a header name"),
                ));
            }
        }
        Ok(())
    }

    /// Each queue table against the engine's rules, as if the queue were
    /// created from the config at start-up; the error names the setting
    /// with its TOML name, on its line (or its table's).
    fn check_queues(&self, keys: &KeyLines) -> Result<(), KeyError> {
        let policy = self.policy();
        for (name, queue) in &self.queues {
            if queue.unsigned == Some(true) && queue.signing_secret.is_some() {
                return Err(keys.error_near(
                    &["queues", name.as_str(), "unsigned"],
                    format!(
                        "queues.{name}.unsigned = true, but the queue has a signing_secret: one \
                         or the other"
                    ),
                ));
            }
            let Err(e) = rules::check(name, &queue.settings(), Origin::Config, &policy) else {
                continue;
            };
            let field = match &e {
                QueueRuleError::Settings(s) => Some(s.field),
                QueueRuleError::File { field, .. } => Some(*field),
                QueueRuleError::Destination(_) => Some(Field::Destination),
                QueueRuleError::Name { .. } | QueueRuleError::FileOverApi { .. } => None,
            };
            let mut path = vec!["queues", name.as_str()];
            path.extend(field.iter().flat_map(|f| f.toml_name().split('.')));
            let detail = match &e {
                QueueRuleError::Settings(s) => s.describe(Naming::Toml),
                other => other.to_string(),
            };
            return Err(keys.error_near(&path, format!("queues.{name}.{detail}")));
        }
        Ok(())
    }

    /// What the server allows any queue, from `[server]`, and what a
    /// destination may never be: this node's addresses as the config
    /// writes them, and its peers' (the server adds its listeners as
    /// bound, and the members' API URLs as the cluster learns them).
    pub fn policy(&self) -> Policy {
        let own = OwnEndpoints::default();
        own.add_addr(&self.server.listen, "this node's API");
        if let Some(metrics) = &self.server.metrics_listen {
            own.add_addr(metrics, "this node's metrics listener");
        }
        if let Some(cluster) = &self.cluster {
            own.add_addr(&cluster.listen, "this node's cluster port");
            if let Some(advertise) = &cluster.advertise {
                own.add_addr(advertise, "this node's cluster port");
            }
            own.add_url(&cluster.api_url, "this node's API");
            for (id, addr) in &cluster.peers {
                own.add_addr(addr, &format!("peer {id}'s cluster port"));
            }
        }
        Policy {
            guard: Guard::new(self.server.allowed_destinations.as_deref(), own),
            max_event_subscribers: self.events.max_subscribers,
            event_dedup_window_ms: self.events.dedup_window_ms,
            max_queues: self.server.max_queues,
            history_default: self.events.history_default(),
        }
    }

    /// The API keys in force: the config's and those of `SPOOLD_API_KEYS`
    /// (comma-separated, each an admin key); an empty key is refused.
    pub fn api_keys(&self, env_api_keys: Option<&str>) -> Result<Vec<ApiKey>, ExposureError> {
        let from_env: Vec<&str> = env_api_keys
            .filter(|env| !env.trim().is_empty())
            .map(|env| env.split(',').map(str::trim).collect())
            .unwrap_or_default();
        if from_env.iter().any(|k| k.is_empty()) {
            return Err(ExposureError::EmptyEnvKey);
        }
        let env = from_env.into_iter().map(ApiKeyEntry::from);
        Ok(self
            .server
            .api_keys
            .iter()
            .cloned()
            .chain(env)
            .map(|entry| entry.resolve())
            .collect())
    }

    /// Refuses to serve beyond loopback without a key (unless
    /// `allow_unauthenticated`): `run` and `check-config` both ask this.
    pub fn check_exposure(&self, env_api_keys: Option<&str>) -> Result<(), ExposureError> {
        let keys = self.api_keys(env_api_keys)?;
        if keys.is_empty()
            && !self.server.allow_unauthenticated
            && !is_loopback(&self.server.listen)
        {
            return Err(ExposureError::NoKey {
                line: self.listen_line,
                listen: self.server.listen.clone(),
            });
        }
        Ok(())
    }
}

/// Why the API keys in force cannot guard the API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExposureError {
    /// `SPOOLD_API_KEYS` has an empty entry between its commas.
    #[error(
        "SPOOLD_API_KEYS holds an empty key (two commas, or a trailing one): an empty key \
         would let anyone in"
    )]
    EmptyEnvKey,
    /// `server.listen` (on `line` of the file, when it writes it) is not
    /// loopback, no key is set and `allow_unauthenticated` is not.
    #[error(
        "{}server.listen = {listen:?}: refusing to listen beyond loopback without an API \
         key: set server.api_keys or SPOOLD_API_KEYS, listen on a loopback address, or set \
         server.allow_unauthenticated = true",
        at_line(*line)
    )]
    NoKey { line: Option<usize>, listen: String },
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
