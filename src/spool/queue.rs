//! Queue names and settings.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Suffix of every queue's failure queue.
pub(crate) const FAILED_SUFFIX: &str = ".failed";
/// Longest queue name the API accepts (docs/contract.md §2).
pub(crate) const QUEUE_NAME_MAX_BYTES: usize = 128;

/// Checks a base queue name: `[A-Za-z0-9_-]{1,128}`.
pub(crate) fn valid_queue_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= QUEUE_NAME_MAX_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The name of `queue`'s failure queue.
pub(crate) fn failed_queue_name(queue: &str) -> String {
    format!("{queue}{FAILED_SUFFIX}")
}

/// The queue a failure queue belongs to; any other queue is its own.
pub(crate) fn origin_queue_name(queue: &str) -> &str {
    queue.strip_suffix(FAILED_SUFFIX).unwrap_or(queue)
}

/// The history a push queue that subscribes to events keeps when its
/// settings set none (`[events] history_retention`, `history_max_bytes`):
/// filled in where settings are written (a `PUT`, a config table), so
/// every replica journals the same. Off (0) by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryDefault {
    pub retention_ms: u64,
    pub max_bytes: u64,
}

impl Default for HistoryDefault {
    fn default() -> HistoryDefault {
        HistoryDefault {
            retention_ms: 0,
            max_bytes: limits::HISTORY_BYTES_DEFAULT,
        }
    }
}

impl HistoryDefault {
    /// Gives `settings`, which set no history of their own, this default
    /// if they are a push queue's with event subscriptions.
    pub fn fill(&self, settings: &mut QueueSettings) {
        if self.retention_ms > 0 && settings.is_push() && !settings.events.is_empty() {
            settings.history_retention_ms = self.retention_ms;
            settings.history_max_bytes = self.max_bytes;
        }
    }
}

/// What retention does to a message that outlives it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExpire {
    #[default]
    Discard,
    Fail,
}

/// Whether a queue hands out the messages of one ordering key one at a
/// time, in journal order (docs/contract.md §1, "Ordered delivery per
/// key").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ordering {
    /// Every message flows on its own (the key is kept, not obeyed).
    #[default]
    None,
    PerKey,
}

impl Ordering {
    fn is_none(&self) -> bool {
        *self == Ordering::None
    }
}

/// What a message that moves to the failure queue does to its key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderingOnFailure {
    /// The next message of its key goes on (SQS FIFO's behaviour).
    #[default]
    Release,
    /// The key's later messages wait until an operator redrives the
    /// failed one or removes it from the failure queue.
    Hold,
}

impl OrderingOnFailure {
    fn is_release(&self) -> bool {
        *self == OrderingOnFailure::Release
    }
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

/// Every setting of a queue (docs/contract.md §2). Serialised as JSON inside
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
    /// Event types the queue subscribes to (`spool::event` patterns).
    pub events: Vec<String>,
    /// Set: only the events of this tenant (a push queue only).
    pub tenant: Option<String>,
    /// Set: of the events its patterns take, only those whose payload and
    /// headers it passes (`spool::content_filter`). Left out of the JSON
    /// when unset, as records before filters were written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<super::content_filter::ContentFilter>,
    /// How long a delivered (acked) message is kept in the queue's
    /// history; 0: not kept.
    pub history_retention_ms: u64,
    /// The history's bound in bytes of records: the oldest entries go
    /// first past it.
    pub history_max_bytes: u64,
    /// Per key: one message of each ordering key out at a time. Left out
    /// of the JSON when unordered, as records before it were written.
    #[serde(skip_serializing_if = "Ordering::is_none")]
    pub ordering: Ordering,
    #[serde(skip_serializing_if = "OrderingOnFailure::is_release")]
    pub ordering_on_failure: OrderingOnFailure,
    /// The secret a rotation replaced, signing beside `signing_secret`
    /// until it expires (docs/contract.md §5, "Secret rotation"). Set by a
    /// rotation only, never by a file or a `PUT`; left out of the JSON when
    /// unset, as records before rotation were written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_secret: Option<PreviousSecret>,
}

/// A signing secret on its way out: it signs until `expires_at`, and then
/// the timer journals the queue without it (`spool/state/timers.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviousSecret {
    pub secret: String,
    /// Milliseconds since the epoch.
    pub expires_at: i64,
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
            events: Vec::new(),
            tenant: None,
            filter: None,
            history_retention_ms: 0,
            history_max_bytes: limits::HISTORY_BYTES_DEFAULT,
            ordering: Ordering::None,
            ordering_on_failure: OrderingOnFailure::Release,
            previous_secret: None,
        }
    }
}

impl QueueSettings {
    pub fn is_push(&self) -> bool {
        self.destination.is_some()
    }

    /// The secrets that sign an attempt at `now`, space-separated: the
    /// queue's own, and a rotated-out one until it expires.
    pub fn signing_secrets(&self, now: i64) -> Option<std::borrow::Cow<'_, str>> {
        let current = self.signing_secret.as_deref()?;
        Some(match self.live_previous_secret(now) {
            Some(previous) => format!("{current} {}", previous.secret).into(),
            None => current.into(),
        })
    }

    /// The rotated-out secret, while it still signs.
    pub fn live_previous_secret(&self, now: i64) -> Option<&PreviousSecret> {
        self.previous_secret
            .as_ref()
            .filter(|p| p.expires_at > now && self.signing_secret.is_some())
    }

    /// How many secrets sign at `now` (each of a space-separated list
    /// counts).
    pub fn signing_secret_count(&self, now: i64) -> usize {
        self.signing_secrets(now)
            .map_or(0, |s| s.split_whitespace().count())
    }
}

/// A setting of a queue, for error messages: each has a TOML name (the
/// config file) and a JSON name (the API).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    LeaseTimeout,
    MaxRetries,
    Retention,
    DedupWindow,
    Destination,
    Concurrency,
    RateLimit,
    Timeout,
    BackoffInitial,
    BackoffMultiplier,
    BackoffMax,
    BackoffJitter,
    Headers,
    SigningSecret,
    PermanentFailureStatuses,
    BreakerFailures,
    CaFile,
    ClientCert,
    ClientKey,
    Events,
    Tenant,
    Filter,
    HistoryRetention,
    HistoryMaxBytes,
    Ordering,
    OrderingOnFailure,
}

impl Field {
    /// The key in a `[queues.NAME]` table.
    pub fn toml_name(self) -> &'static str {
        match self {
            Field::LeaseTimeout => "lease_timeout",
            Field::MaxRetries => "max_retries",
            Field::Retention => "retention",
            Field::DedupWindow => "dedup_window",
            Field::Destination => "destination",
            Field::Concurrency => "concurrency",
            Field::RateLimit => "rate_limit",
            Field::Timeout => "timeout",
            Field::BackoffInitial => "backoff.initial",
            Field::BackoffMultiplier => "backoff.multiplier",
            Field::BackoffMax => "backoff.max",
            Field::BackoffJitter => "backoff.jitter",
            Field::Headers => "headers",
            Field::SigningSecret => "signing_secret",
            Field::PermanentFailureStatuses => "permanent_failure_statuses",
            Field::BreakerFailures => "breaker_failures",
            Field::CaFile => "ca_file",
            Field::ClientCert => "client_cert",
            Field::ClientKey => "client_key",
            Field::Events => "events",
            Field::Tenant => "tenant",
            Field::Filter => "filter",
            Field::HistoryRetention => "history_retention",
            Field::HistoryMaxBytes => "history_max_bytes",
            Field::Ordering => "ordering",
            Field::OrderingOnFailure => "ordering_on_failure",
        }
    }

    /// The field in a `PUT /v1/queues/{q}` body.
    pub fn json_name(self) -> &'static str {
        match self {
            Field::LeaseTimeout => "leaseTimeoutSeconds",
            Field::MaxRetries => "maxRetries",
            Field::Retention => "retentionSeconds",
            Field::DedupWindow => "dedupWindowSeconds",
            Field::Destination => "destination",
            Field::Concurrency => "concurrency",
            Field::RateLimit => "rateLimit",
            Field::Timeout => "timeoutSeconds",
            Field::BackoffInitial => "backoff.initialSeconds",
            Field::BackoffMultiplier => "backoff.multiplier",
            Field::BackoffMax => "backoff.maxSeconds",
            Field::BackoffJitter => "backoff.jitter",
            Field::Headers => "headers",
            Field::SigningSecret => "signingSecret",
            Field::PermanentFailureStatuses => "permanentFailureStatuses",
            Field::BreakerFailures => "breakerFailures",
            Field::CaFile => "caFile",
            Field::ClientCert => "clientCert",
            Field::ClientKey => "clientKey",
            Field::Events => "events",
            Field::Tenant => "tenant",
            Field::Filter => "filter",
            Field::HistoryRetention => "historyRetentionSeconds",
            Field::HistoryMaxBytes => "historyMaxBytes",
            Field::Ordering => "ordering",
            Field::OrderingOnFailure => "orderingOnFailure",
        }
    }
}

/// A setting out of its range (the range is in the problem).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{problem}")]
pub struct SettingsError {
    pub field: Field,
    /// What is wrong and what is allowed, without the field's name.
    pub problem: String,
}

/// How a setting is spelled where the error is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    Toml,
    Json,
}

impl SettingsError {
    fn new(field: Field, problem: impl Into<String>) -> SettingsError {
        SettingsError {
            field,
            problem: problem.into(),
        }
    }

    /// `name: problem`, the name as `naming` spells it.
    pub fn describe(&self, naming: Naming) -> String {
        let name = match naming {
            Naming::Toml => self.field.toml_name(),
            Naming::Json => self.field.json_name(),
        };
        format!("{name}: {}", self.problem)
    }
}

/// The bounds of every number a queue takes, each with why.
pub(crate) mod limits {
    const SECOND_MS: u64 = 1_000;
    const DAY_MS: u64 = 86_400_000;
    /// A lease may last at most a day (SQS: 12 hours): longer, and a
    /// crashed consumer holds a message for longer than anyone waits.
    pub(crate) const LEASE_TIMEOUT_MS: (u64, u64) = (1, DAY_MS);
    /// SQS allows 1 000 receives before its dead-letter queue.
    pub(crate) const MAX_RETRIES: u32 = 10_000;
    /// Retention: a second to ten years.
    pub(crate) const RETENTION_MS: (u64, u64) = (SECOND_MS, 3_650 * DAY_MS);
    /// Dedup keys are held in memory for their window: at most 30 days.
    pub(crate) const DEDUP_WINDOW_MS: u64 = 30 * DAY_MS;
    /// Requests in flight per push queue.
    pub(crate) const CONCURRENCY: (u32, u32) = (1, 1024);
    /// Requests per second: one every 1 000 s to a million a second.
    pub(crate) const RATE_LIMIT: (f64, f64) = (0.001, 1_000_000.0);
    /// Per attempt; a worker's lease lasts this plus 5 s.
    pub(crate) const TIMEOUT_MS: (u64, u64) = (1, 3_600 * SECOND_MS);
    pub(crate) const BACKOFF_INITIAL_MS: (u64, u64) = (1, DAY_MS);
    pub(crate) const BACKOFF_MULTIPLIER: (f64, f64) = (1.0, 100.0);
    pub(crate) const BACKOFF_MAX_MS: u64 = 30 * DAY_MS;
    /// Static headers: how many, and how long a value.
    pub(crate) const HEADERS: usize = 64;
    pub(crate) const HEADER_VALUE_BYTES: usize = 8 << 10;
    pub(crate) const SIGNING_SECRET_BYTES: usize = 1 << 10;
    pub(crate) const PERMANENT_STATUSES: usize = 100;
    pub(crate) const BREAKER_FAILURES: (u32, u32) = (1, 1_000_000);
    pub(crate) const PATH_BYTES: usize = 4096;
    /// A delivered message's history: up to a year, up to 1 TiB of records.
    pub(crate) const HISTORY_RETENTION_MS: u64 = 365 * DAY_MS;
    pub(crate) const HISTORY_BYTES: (u64, u64) = (1 << 10, 1 << 40);
    pub(crate) const HISTORY_BYTES_DEFAULT: u64 = 64 << 20;
}

/// Headers of one hop (RFC 9110 §7.6.1, with RFC 7230's proxy pair and the
/// `Proxy-Connection` old clients send), lowercase: never stored with a
/// forwarded request, relayed to the primary, or set as a static header.
/// The one list every path checks (`api/forward.rs`, `api/relay.rs`).
pub(crate) const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Whether `name` (lowercase, as `http::HeaderName` keeps it) is in
/// [`HOP_BY_HOP`].
pub(crate) fn is_hop_by_hop(name: &str) -> bool {
    HOP_BY_HOP.contains(&name)
}

/// Names a push queue may not set as static headers, with why: spoold
/// computes them, they are hop-by-hop, or they are credentials for a proxy.
pub(crate) fn static_header_refusal(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    match lower.as_str() {
        "proxy-authorization" => Some("credentials for a proxy are never forwarded"),
        hop if is_hop_by_hop(hop) => Some("a hop-by-hop header is never forwarded"),
        "host" => Some("the host is the destination's"),
        "content-length" => Some("spoold sets the length of each body"),
        "webhook-id" | "webhook-timestamp" | "webhook-signature" => {
            Some("spoold signs each attempt itself (signing_secret)")
        }
        _ if lower.starts_with("spooler-") => Some("Spooler-* headers are spoold's own"),
        _ => None,
    }
}

/// Whether `name` is an HTTP header name (RFC 9110 token).
fn header_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

impl QueueSettings {
    /// Checks every setting against its bounds (`limits`) and shape. The
    /// one owner of these rules: the config loader, the API and the engine
    /// all call it. The first problem found is the one reported.
    pub fn validate(&self) -> Result<(), SettingsError> {
        self.check_bounds()?;
        self.check_backoff()?;
        check_headers(&self.headers)?;
        self.check_delivery()?;
        self.check_tls_files()?;
        self.check_history()?;
        self.check_ordering()?;
        self.check_events()
    }

    /// A failure rule for ordering keys needs ordering.
    fn check_ordering(&self) -> Result<(), SettingsError> {
        if self.ordering == Ordering::None && self.ordering_on_failure != OrderingOnFailure::Release
        {
            return Err(SettingsError::new(
                Field::OrderingOnFailure,
                "is for a queue with ordering \"per_key\"",
            ));
        }
        Ok(())
    }

    /// Timeouts, retries, retention and the delivery pace.
    fn check_bounds(&self) -> Result<(), SettingsError> {
        use limits::*;
        within_ms(Field::LeaseTimeout, self.lease_timeout_ms, LEASE_TIMEOUT_MS)?;
        within(Field::MaxRetries, self.max_retries, (0, MAX_RETRIES), "")?;
        within_ms(Field::Retention, self.retention_ms, RETENTION_MS)?;
        within_ms(
            Field::DedupWindow,
            self.dedup_window_ms,
            (0, DEDUP_WINDOW_MS),
        )?;
        within_ms(Field::Timeout, self.timeout_ms, TIMEOUT_MS)?;
        within(Field::Concurrency, self.concurrency, CONCURRENCY, "")?;
        if let Some(r) = self.rate_limit {
            within(Field::RateLimit, r, RATE_LIMIT, " requests per second")?;
        }
        Ok(())
    }

    fn check_backoff(&self) -> Result<(), SettingsError> {
        use limits::*;
        let b = &self.backoff;
        within_ms(Field::BackoffInitial, b.initial_ms, BACKOFF_INITIAL_MS)?;
        within_ms(Field::BackoffMax, b.max_ms, (b.initial_ms, BACKOFF_MAX_MS))?;
        within(
            Field::BackoffMultiplier,
            b.multiplier,
            BACKOFF_MULTIPLIER,
            "",
        )?;
        within(Field::BackoffJitter, b.jitter, (0.0, 1.0), "")
    }

    /// How an attempt is signed and judged, and where it goes.
    fn check_delivery(&self) -> Result<(), SettingsError> {
        use limits::*;
        if let Some(secret) = &self.signing_secret {
            signing_secret_ok(secret)
                .map_err(|p| SettingsError::new(Field::SigningSecret, p.to_string()))?;
        }
        if let Some(previous) = &self.previous_secret {
            signing_secret_ok(&previous.secret)
                .map_err(|p| SettingsError::new(Field::SigningSecret, p.to_string()))?;
        }
        let statuses = &self.permanent_failure_statuses;
        if statuses.len() > PERMANENT_STATUSES || statuses.iter().any(|s| !(100..=599).contains(s))
        {
            return Err(SettingsError::new(
                Field::PermanentFailureStatuses,
                format!("HTTP statuses 100 to 599, at most {PERMANENT_STATUSES}"),
            ));
        }
        within(
            Field::BreakerFailures,
            self.breaker_failures,
            BREAKER_FAILURES,
            "",
        )?;
        if let Some(dest) = &self.destination {
            destination_host(dest)
                .map_err(|p| SettingsError::new(Field::Destination, p.to_string()))?;
        }
        Ok(())
    }

    fn check_tls_files(&self) -> Result<(), SettingsError> {
        use limits::PATH_BYTES;
        for (field, path) in [
            (Field::CaFile, &self.ca_file),
            (Field::ClientCert, &self.client_cert),
            (Field::ClientKey, &self.client_key),
        ] {
            if let Some(path) = path
                && (path.is_empty() || path.len() > PATH_BYTES || path.contains('\0'))
            {
                return Err(SettingsError::new(
                    field,
                    format!("a file path of 1 to {PATH_BYTES} bytes"),
                ));
            }
        }
        if self.client_cert.is_some() != self.client_key.is_some() {
            return Err(SettingsError::new(
                Field::ClientCert,
                "client_cert and client_key go together",
            ));
        }
        Ok(())
    }

    fn check_history(&self) -> Result<(), SettingsError> {
        use limits::*;
        within_ms(
            Field::HistoryRetention,
            self.history_retention_ms,
            (0, HISTORY_RETENTION_MS),
        )?;
        within(
            Field::HistoryMaxBytes,
            self.history_max_bytes,
            HISTORY_BYTES,
            " bytes",
        )
    }

    /// The event patterns and the tenant filter of a subscription.
    fn check_events(&self) -> Result<(), SettingsError> {
        use super::event::{PATTERNS_MAX, pattern_problem, tenant_problem};
        if self.events.len() > PATTERNS_MAX {
            return Err(SettingsError::new(
                Field::Events,
                format!(
                    "{} patterns: allowed at most {PATTERNS_MAX}",
                    self.events.len()
                ),
            ));
        }
        if let Some(problem) = self.events.iter().find_map(|p| pattern_problem(p)) {
            return Err(SettingsError::new(Field::Events, problem));
        }
        if self.filter.is_some() && self.events.is_empty() {
            return Err(SettingsError::new(
                Field::Filter,
                "a filter is for a queue that subscribes to events (`events`)",
            ));
        }
        if let Some(tenant) = &self.tenant {
            if !self.is_push() {
                return Err(SettingsError::new(
                    Field::Tenant,
                    "a tenant filter is for a push queue (one with a destination): \
                     a pull queue's consumers filter for themselves",
                ));
            }
            if let Some(problem) = tenant_problem(tenant) {
                return Err(SettingsError::new(Field::Tenant, problem));
            }
        }
        Ok(())
    }
}

/// The static headers of a push queue: how many, their names and values.
fn check_headers(headers: &BTreeMap<String, String>) -> Result<(), SettingsError> {
    use limits::{HEADER_VALUE_BYTES, HEADERS};
    if headers.len() > HEADERS {
        return Err(SettingsError::new(
            Field::Headers,
            format!("{} headers: allowed at most {HEADERS}", headers.len()),
        ));
    }
    for (name, value) in headers {
        if !header_name_ok(name) {
            return Err(SettingsError::new(
                Field::Headers,
                format!("{name:?} is not a header name"),
            ));
        }
        if let Some(why) = static_header_refusal(name) {
            return Err(SettingsError::new(
                Field::Headers,
                format!("{name} cannot be set: {why}"),
            ));
        }
        if value.len() > HEADER_VALUE_BYTES
            || value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0)
        {
            return Err(SettingsError::new(
                Field::Headers,
                format!(
                    "the value of {name} is not a header value (no line breaks, at most {HEADER_VALUE_BYTES} bytes)"
                ),
            ));
        }
    }
    Ok(())
}

/// `v` within `lo..=hi` (NaN never is), or the field's out-of-range error
/// naming the bounds, `unit` after them.
fn within<T: PartialOrd + std::fmt::Display>(
    field: Field,
    v: T,
    (lo, hi): (T, T),
    unit: &str,
) -> Result<(), SettingsError> {
    if lo <= v && v <= hi {
        return Ok(());
    }
    Err(SettingsError::new(
        field,
        format!("{v} is out of range: allowed {lo} to {hi}{unit}"),
    ))
}

/// A duration setting within `lo..=hi` milliseconds, the bounds shown as
/// durations.
fn within_ms(field: Field, v: u64, (lo, hi): (u64, u64)) -> Result<(), SettingsError> {
    if (lo..=hi).contains(&v) {
        return Ok(());
    }
    Err(SettingsError::new(
        field,
        format!(
            "{} is out of range: allowed {} to {}",
            ms(v),
            ms(lo),
            ms(hi)
        ),
    ))
}

/// A duration for messages: whole seconds where it is one, else ms.
fn ms(v: u64) -> String {
    if v.is_multiple_of(1000) {
        format!("{}s", v / 1000)
    } else {
        format!("{v}ms")
    }
}

/// A signing secret: one or more (space-separated, for rotation), each
/// `whsec_` and the base64 of the key, as Standard Webhooks defines it (a
/// plain string would sign with bytes that the official libraries, which
/// base64-decode the secret, never compute).
fn signing_secret_ok(secret: &str) -> Result<(), SigningSecretError> {
    use base64::Engine as _;
    if secret.trim().is_empty() || secret.len() > limits::SIGNING_SECRET_BYTES {
        return Err(SigningSecretError::Length);
    }
    for one in secret.split_whitespace() {
        let Some(b64) = one.strip_prefix("whsec_") else {
            return Err(SigningSecretError::NoPrefix);
        };
        match base64::engine::general_purpose::STANDARD.decode(b64) {
            Ok(key) if !key.is_empty() => {}
            _ => return Err(SigningSecretError::NotBase64),
        }
    }
    Ok(())
}

/// Why a `signing_secret` cannot sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum SigningSecretError {
    /// Blank, or longer than [`limits::SIGNING_SECRET_BYTES`].
    #[error(
        "1 to {} bytes of secrets, separated by spaces",
        limits::SIGNING_SECRET_BYTES
    )]
    Length,
    /// A plain string: the official libraries would base64-decode it and
    /// never compute the signature spoold sends.
    #[error(
        "each secret is \"whsec_\" and the base64 of its key (Standard Webhooks), e.g. whsec_ \
         followed by `openssl rand -base64 32`"
    )]
    NoPrefix,
    #[error("a whsec_ secret is base64 of the key after the prefix")]
    NotBase64,
}

/// Why a destination URL is not one spoold delivers to: `dest` as
/// written, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{dest:?} is not usable: {flaw}")]
pub(crate) struct DestinationProblem {
    dest: String,
    flaw: DestinationFlaw,
}

/// What is wrong with a destination URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum DestinationFlaw {
    #[error("{0}; expected http://host[:port][/path] or https://…")]
    Unparsable(url::ParseError),
    #[error("the scheme must be http or https")]
    Scheme,
    #[error("a destination has no query string or fragment")]
    QueryOrFragment,
    #[error("a destination has no user info")]
    UserInfo,
    #[error("it needs a host")]
    NoHost,
}

/// The host of a destination URL, after checking its shape: `http` or
/// `https`, a host, no query string, no fragment, no user info.
///
/// The host is the one the HTTP client will connect to, as the URL
/// standard normalises it (lower case, `http://2130706433` is 127.0.0.1,
/// IPv6 without brackets, no trailing dot), so that `allowed_destinations`
/// judges exactly what is dialled.
pub(crate) fn destination_host(dest: &str) -> Result<(String, u16), DestinationProblem> {
    let bad = |flaw| {
        Err(DestinationProblem {
            dest: dest.to_owned(),
            flaw,
        })
    };
    let url = match url::Url::parse(dest) {
        Ok(url) => url,
        Err(e) => return bad(DestinationFlaw::Unparsable(e)),
    };
    if url.scheme() != "http" && url.scheme() != "https" {
        return bad(DestinationFlaw::Scheme);
    }
    if url.query().is_some() || url.fragment().is_some() || dest.contains('?') || dest.contains('#')
    {
        return bad(DestinationFlaw::QueryOrFragment);
    }
    if !url.username().is_empty() || url.password().is_some() {
        return bad(DestinationFlaw::UserInfo);
    }
    let host = url.host_str().unwrap_or_default();
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.');
    if host.is_empty() {
        return bad(DestinationFlaw::NoHost);
    }
    let port = url.port_or_known_default().unwrap_or(80);
    Ok((host.to_ascii_lowercase(), port))
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
