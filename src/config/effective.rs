//! The effective config as TOML: what `spoold check-config` prints, every
//! default filled in and every secret hidden. Each value is spelled as the
//! file would spell it (`"30s"`, `"64MiB"`), so the text parses back to the
//! same config, secrets aside.

use toml::{Table, Value};

use super::cluster::ClusterConfig;
use super::keys::ApiKeyEntry;
use super::shape::{Config, LogFormat, OnCorruption};
use super::units::{format_duration_ms, format_size};
use crate::spool::queue::{OnExpire, QueueSettings};

/// What a hidden secret or header value is shown as.
const REDACTED: &str = "<redacted>";

impl Config {
    /// A copy safe to print: API keys and signing secrets replaced.
    pub fn redacted(&self) -> Config {
        let mut c = self.clone();
        for entry in &mut c.server.api_keys {
            match entry {
                ApiKeyEntry::Plain(key) => *key = REDACTED.into(),
                ApiKeyEntry::Scoped(scoped) => {
                    if scoped.key.is_some() {
                        scoped.key = Some(REDACTED.into());
                    }
                }
            }
        }
        if c.portal.secret.is_some() {
            c.portal.secret = Some(REDACTED.into());
        }
        if let Some(cluster) = &mut c.cluster
            && cluster.secret.is_some()
        {
            cluster.secret = Some(REDACTED.into());
        }
        for q in c.queues.values_mut() {
            if q.signing_secret.is_some() {
                q.signing_secret = Some(REDACTED.into());
            }
            // Static headers often carry credentials (Authorization).
            for value in q.headers.iter_mut().flat_map(|h| h.values_mut()) {
                *value = REDACTED.into();
            }
        }
        c
    }

    /// The effective config as TOML, defaults filled in and secrets
    /// hidden (API keys, signing secrets, static header values): what
    /// `spoold check-config` prints. It parses back to the same config
    /// (secrets aside).
    pub fn effective_toml(&self) -> String {
        let c = self.redacted();
        let mut queues = Table::new();
        for (name, q) in &c.queues {
            let mut table = queue_table(&q.settings());
            if let Some(unsigned) = q.unsigned {
                table.insert("unsigned".into(), unsigned.into());
            }
            queues.insert(name.clone(), Value::Table(table));
        }
        let mut root = Table::new();
        root.insert("server".into(), Value::Table(server_table(&c)));
        root.insert("spool".into(), Value::Table(spool_table(&c)));
        root.insert("log".into(), Value::Table(log_table(&c)));
        root.insert("events".into(), Value::Table(events_table(&c)));
        root.insert("delivery".into(), Value::Table(delivery_table(&c)));
        root.insert("telemetry".into(), Value::Table(telemetry_table(&c)));
        root.insert("portal".into(), Value::Table(portal_table(&c)));
        root.insert("queues".into(), Value::Table(queues));
        if let Some(cluster) = &c.cluster {
            root.insert("cluster".into(), Value::Table(cluster_table(cluster)));
        }
        let mut text = toml::to_string_pretty(&root).expect("a table of plain values serializes");
        // A signing secret is never printed, not even redacted (a
        // placeholder would not be a valid secret): a comment says one is set.
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
}

fn strings(v: &[String]) -> Value {
    Value::Array(v.iter().map(|s| Value::from(s.as_str())).collect())
}

/// An entry of `server.api_keys` as the file spells it.
fn key_value(entry: &ApiKeyEntry) -> Value {
    let scoped = match entry {
        ApiKeyEntry::Plain(key) => return Value::from(key.as_str()),
        ApiKeyEntry::Scoped(scoped) => scoped,
    };
    let mut table = Table::new();
    if let Some(key) = &scoped.key {
        table.insert("key".into(), key.as_str().into());
    }
    if let Some(hex) = &scoped.sha256 {
        table.insert("sha256".into(), hex.as_str().into());
    }
    table.insert("role".into(), scoped.role.as_str().into());
    if let Some(tenant) = &scoped.tenant {
        table.insert("tenant".into(), tenant.as_str().into());
    }
    table.insert("queues".into(), strings(&scoped.queues));
    Value::Table(table)
}

fn duration(ms: u64) -> Value {
    Value::from(format_duration_ms(ms))
}

fn server_table(c: &Config) -> Table {
    let mut server = Table::new();
    server.insert("listen".into(), c.server.listen.as_str().into());
    if let Some(m) = &c.server.metrics_listen {
        server.insert("metrics_listen".into(), m.as_str().into());
    }
    let keys = c.server.api_keys.iter().map(key_value).collect();
    server.insert("api_keys".into(), Value::Array(keys));
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
        duration(c.server.shutdown_grace_ms),
    );
    server.insert(
        "drain_on_shutdown".into(),
        c.server.drain_on_shutdown.into(),
    );
    if let Some(allowed) = &c.server.allowed_destinations {
        server.insert("allowed_destinations".into(), strings(allowed));
    }
    server.insert("redact_headers".into(), strings(&c.server.redact_headers));
    server.insert("max_queues".into(), (c.server.max_queues as i64).into());
    server
}

fn spool_table(c: &Config) -> Table {
    let mut spool = Table::new();
    spool.insert("dir".into(), c.spool.dir.display().to_string().into());
    spool.insert("max_bytes".into(), format_size(c.spool.max_bytes).into());
    spool.insert(
        "segment_bytes".into(),
        format_size(c.spool.segment_bytes).into(),
    );
    if let Some(max_memory) = c.spool.max_memory {
        spool.insert("max_memory".into(), format_size(max_memory).into());
    }
    spool.insert("fsync".into(), c.spool.fsync.into());
    let on_corruption = match c.spool.on_corruption {
        OnCorruption::Refuse => "refuse",
        OnCorruption::Quarantine => "quarantine",
    };
    spool.insert("on_corruption".into(), on_corruption.into());
    spool.insert(
        "compaction_interval".into(),
        duration(c.spool.compaction_interval_ms),
    );
    spool
}

fn log_table(c: &Config) -> Table {
    let mut log = Table::new();
    let format = match c.log.format {
        LogFormat::Text => "text",
        LogFormat::Json => "json",
    };
    log.insert("format".into(), format.into());
    log.insert("level".into(), c.log.level.as_str().into());
    log
}

fn events_table(c: &Config) -> Table {
    let mut events = Table::new();
    events.insert(
        "max_subscribers".into(),
        (c.events.max_subscribers as i64).into(),
    );
    events.insert("dedup_window".into(), duration(c.events.dedup_window_ms));
    events.insert(
        "history_retention".into(),
        duration(c.events.history_retention_ms),
    );
    events.insert(
        "history_max_bytes".into(),
        format_size(c.events.history_max_bytes).into(),
    );
    events
}

fn delivery_table(c: &Config) -> Table {
    let mut delivery = Table::new();
    delivery.insert(
        "max_connections_per_host".into(),
        (c.delivery.max_connections_per_host as i64).into(),
    );
    delivery.insert(
        "plain_http_client".into(),
        c.delivery.plain_http_client.as_str().into(),
    );
    delivery
}

fn telemetry_table(c: &Config) -> Table {
    let mut telemetry = Table::new();
    if let Some(endpoint) = &c.telemetry.otlp_endpoint {
        telemetry.insert("otlp_endpoint".into(), endpoint.as_str().into());
    }
    telemetry.insert(
        "service_name".into(),
        c.telemetry.service_name.as_str().into(),
    );
    telemetry
}

fn portal_table(c: &Config) -> Table {
    let p = &c.portal;
    let mut portal = Table::new();
    if let Some(secret) = &p.secret {
        portal.insert("secret".into(), secret.as_str().into());
    }
    if let Some(url) = &p.url {
        portal.insert("url".into(), url.as_str().into());
    }
    portal.insert("frame_ancestors".into(), strings(&p.frame_ancestors));
    portal.insert("session_ttl_max".into(), duration(p.session_ttl_max_ms));
    let theme: Table = p
        .theme
        .iter()
        .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
        .collect();
    portal.insert("theme".into(), Value::Table(theme));
    portal
}

/// One queue's effective settings as a `[queues.NAME]` table (delivery
/// settings only for a push queue).
fn queue_table(s: &QueueSettings) -> Table {
    let mut t = Table::new();
    t.insert("lease_timeout".into(), duration(s.lease_timeout_ms));
    t.insert("max_retries".into(), i64::from(s.max_retries).into());
    t.insert("retention".into(), duration(s.retention_ms));
    t.insert("dedup_window".into(), duration(s.dedup_window_ms));
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
    t.insert("timeout".into(), duration(s.timeout_ms));
    let mut backoff = Table::new();
    backoff.insert("initial".into(), duration(s.backoff.initial_ms));
    backoff.insert("multiplier".into(), s.backoff.multiplier.into());
    backoff.insert("max".into(), duration(s.backoff.max_ms));
    backoff.insert("jitter".into(), s.backoff.jitter.into());
    t.insert("backoff".into(), Value::Table(backoff));
    let headers: Table = s
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
        t.insert("history_retention".into(), duration(s.history_retention_ms));
        t.insert(
            "history_max_bytes".into(),
            format_size(s.history_max_bytes).into(),
        );
    }
    t
}

/// The `[cluster]` table, its secret left out: a placeholder would not
/// parse back as a secret.
fn cluster_table(c: &ClusterConfig) -> Table {
    let mut t = Table::new();
    t.insert("node_id".into(), (c.node_id as i64).into());
    t.insert("listen".into(), c.listen.as_str().into());
    t.insert("advertise".into(), c.advertised().into());
    t.insert("api_url".into(), c.api_url.as_str().into());
    let peers: Table = c
        .peers
        .iter()
        .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
        .collect();
    t.insert("peers".into(), Value::Table(peers));
    t.insert("forward_to_primary".into(), c.forward_to_primary.into());
    t.insert("heartbeat".into(), duration(c.heartbeat_ms));
    t.insert("election_timeout".into(), duration(c.election_timeout_ms));
    if let Some(tls) = &c.tls {
        let mut table = Table::new();
        table.insert("cert".into(), tls.cert.as_str().into());
        table.insert("key".into(), tls.key.as_str().into());
        table.insert("ca".into(), tls.ca.as_str().into());
        t.insert("tls".into(), Value::Table(table));
    }
    t
}
