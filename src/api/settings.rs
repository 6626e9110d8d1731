//! Queue settings as JSON (docs/contract.md §2: camelCase, durations as `…Seconds`).
//!
//! `signingSecret` is write-only: it is never rendered. Static `headers`
//! are rendered with their values hidden (they often carry credentials):
//! in a `PUT`, a header whose value is exactly `"<redacted>"` keeps the
//! value it had, so a settings object read back and sent again changes
//! nothing. In a `PUT`, an omitted field takes its default, except
//! `signingSecret`, which an omitted field keeps and `null` clears.
//!
//! Kept secrets follow the destination only within its origin (scheme,
//! host and port). A change that moves it to another origin while a
//! secret would be left behind (an omitted `signingSecret`, a header sent
//! as `"<redacted>"`) is refused, `409 secrets_would_move`: deliveries
//! going out unsigned from then on, in silence, was worse. The request
//! sends the secret again in clear, or says `?keepSecrets=true`, which
//! keeps the signing secret (a secret spoold signs with, not one it sends)
//! and drops those headers (a credential for one host is never sent to
//! another), as its `warnings` say.
//!
//! `PATCH` (RFC 7396 JSON merge patch) applies a patch to the settings as
//! `GET` renders them: what the patch leaves out stays as it was, `null`
//! resets a field to its default (`signingSecret: null` clears it).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::spool::queue::{
    Backoff, OnExpire, Ordering, OrderingOnFailure, PreviousSecret, QueueSettings,
};
use crate::spool::state::QueueStats;

/// What a hidden value is shown as (and, in a `PUT`, means "keep").
pub(crate) const REDACTED: &str = "<redacted>";

fn secs(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

/// The settings object of `GET /v1/queues/{q}`.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SettingsView {
    lease_timeout_seconds: f64,
    max_retries: u32,
    retention_seconds: f64,
    /// 0: dedup off.
    dedup_window_seconds: f64,
    /// `discard` or `fail`.
    on_expire: &'static str,
    /// Event type patterns the queue subscribes to (`POST /v1/events`).
    events: Vec<String>,
    /// The content filter on those events, as it was written.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    filter: Option<serde_json::Value>,
    /// How long delivered messages are kept (0: not kept).
    history_retention_seconds: f64,
    /// The history's bound in bytes.
    history_max_bytes: u64,
    /// `none`, or `per_key`: one message of each ordering key out at a
    /// time, in journal order.
    ordering: &'static str,
    /// `release` (a failed message lets its key's next one go) or `hold`
    /// (the key waits for an operator).
    ordering_on_failure: &'static str,
    /// A push queue's delivery settings (absent for a pull queue).
    #[serde(flatten)]
    push: Option<PushView>,
}

/// The delivery settings of a push queue.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PushView {
    destination: String,
    concurrency: u32,
    /// Requests per second; `null`: no limit.
    rate_limit: Option<f64>,
    timeout_seconds: f64,
    backoff: BackoffView,
    /// Static headers, their values shown as `<redacted>`.
    headers: BTreeMap<String, String>,
    /// Whether a signing secret is set (it is never shown).
    signing_secret_set: bool,
    permanent_failure_statuses: Vec<u16>,
    breaker_failures: u32,
    ca_file: Option<String>,
    client_cert: Option<String>,
    client_key: Option<String>,
    /// Set: only events of this tenant.
    tenant: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct BackoffView {
    initial_seconds: f64,
    multiplier: f64,
    max_seconds: f64,
    jitter: f64,
}

pub(crate) fn render(s: &QueueSettings) -> SettingsView {
    let push = s.destination.as_ref().map(|destination| PushView {
        destination: destination.clone(),
        concurrency: s.concurrency,
        rate_limit: s.rate_limit,
        timeout_seconds: secs(s.timeout_ms),
        backoff: BackoffView {
            initial_seconds: secs(s.backoff.initial_ms),
            multiplier: s.backoff.multiplier,
            max_seconds: secs(s.backoff.max_ms),
            jitter: s.backoff.jitter,
        },
        headers: s
            .headers
            .keys()
            .map(|name| (name.clone(), REDACTED.to_owned()))
            .collect(),
        signing_secret_set: s.signing_secret.is_some(),
        permanent_failure_statuses: s.permanent_failure_statuses.clone(),
        breaker_failures: s.breaker_failures,
        ca_file: s.ca_file.clone(),
        client_cert: s.client_cert.clone(),
        client_key: s.client_key.clone(),
        tenant: s.tenant.clone(),
    });
    SettingsView {
        lease_timeout_seconds: secs(s.lease_timeout_ms),
        max_retries: s.max_retries,
        retention_seconds: secs(s.retention_ms),
        dedup_window_seconds: secs(s.dedup_window_ms),
        on_expire: match s.on_expire {
            OnExpire::Discard => "discard",
            OnExpire::Fail => "fail",
        },
        events: s.events.clone(),
        filter: s.filter.as_ref().map(|f| f.source().clone()),
        history_retention_seconds: secs(s.history_retention_ms),
        history_max_bytes: s.history_max_bytes,
        ordering: match s.ordering {
            Ordering::None => "none",
            Ordering::PerKey => "per_key",
        },
        ordering_on_failure: match s.ordering_on_failure {
            OrderingOnFailure::Release => "release",
            OrderingOnFailure::Hold => "hold",
        },
        push,
    }
}

/// The stats object (docs/contract.md §4).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StatsView {
    visible: u64,
    leased: u64,
    delayed: u64,
    /// Waiting behind an earlier message of their ordering key (a queue
    /// with `ordering = "per_key"`): in none of the three counts above.
    held: u64,
    sent_total: u64,
    acked_total: u64,
    nacked_total: u64,
    expired_total: u64,
    failed_total: u64,
    deduplicated_total: u64,
    oldest_visible_age_seconds: f64,
    /// Messages that failed at least once and wait for another try.
    retrying: u64,
    /// Since when the oldest of them was sent (0 when none).
    oldest_retrying_age_seconds: f64,
    /// Paused by an operator (`pause`); nothing is leased until `resume`.
    paused: bool,
    /// The circuit breaker is open: the destination kept failing, and
    /// only its probe delivers until one succeeds (or an operator closes
    /// it, or resumes the queue).
    breaker_open: bool,
    /// While the circuit breaker is open: when its next probe is due (RFC
    /// 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    next_probe_at: Option<String>,
    /// Delivery attempts (push queues only).
    #[serde(skip_serializing_if = "Option::is_none")]
    deliveries_total: Option<u64>,
    /// Failed delivery attempts (push queues only).
    #[serde(skip_serializing_if = "Option::is_none")]
    delivery_failures_total: Option<u64>,
    /// A push queue without a signing secret: its deliveries carry no
    /// signature (push queues only).
    #[serde(skip_serializing_if = "Option::is_none")]
    unsigned: Option<bool>,
    /// How many secrets sign each delivery: 2 while a rotated-out secret
    /// signs beside the new one (push queues only).
    #[serde(skip_serializing_if = "Option::is_none")]
    signing_secrets: Option<u64>,
    /// When the secret a rotation replaced stops signing (RFC 3339; only
    /// while it signs).
    #[serde(skip_serializing_if = "Option::is_none")]
    previous_secret_expires_at: Option<String>,
}

pub(crate) fn render_stats(st: &QueueStats, settings: &QueueSettings) -> StatsView {
    let push = settings.is_push();
    let c = &st.counters;
    let age = |ms: Option<i64>| ms.map_or(0.0, |ms| ms as f64 / 1000.0);
    StatsView {
        visible: st.visible,
        leased: st.leased,
        delayed: st.delayed,
        held: st.held,
        sent_total: c.sent,
        acked_total: c.acked,
        nacked_total: c.nacked,
        expired_total: c.expired,
        failed_total: c.failed,
        deduplicated_total: c.deduplicated,
        oldest_visible_age_seconds: age(st.oldest_visible_age_ms),
        retrying: st.retrying,
        oldest_retrying_age_seconds: age(st.oldest_retrying_age_ms),
        paused: st.paused,
        breaker_open: st.next_probe_at.is_some(),
        next_probe_at: st.next_probe_at.map(crate::time::format_rfc3339),
        deliveries_total: push.then_some(c.deliveries),
        delivery_failures_total: push.then_some(c.delivery_failures),
        unsigned: push.then_some(settings.signing_secret.is_none()),
        signing_secrets: push.then_some(st.signing_secrets),
        previous_secret_expires_at: (st.previous_secret_expires_at)
            .map(crate::time::format_rfc3339),
    }
}

/// Why a settings body makes no settings.
#[derive(Debug)]
pub(crate) enum SettingsRefusal {
    /// A field out of its shape (`400`).
    Invalid(BodyError),
    /// A move to another origin would leave a secret behind (`409
    /// secrets_would_move`).
    SecretsWouldMove(String),
}

impl From<BodyError> for SettingsRefusal {
    fn from(problem: BodyError) -> SettingsRefusal {
        SettingsRefusal::Invalid(problem)
    }
}

/// Why a settings body, or a merge patch of one, is not one (`400`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// A duration in seconds that is negative, not finite, or over
    /// [`DURATION_SECONDS_MAX`].
    #[error("{field} = {seconds} is out of range: allowed 0 to {DURATION_SECONDS_MAX} seconds")]
    Duration { field: &'static str, seconds: f64 },
    /// A header sent as `"<redacted>"` (keep it) that the queue lacks.
    #[error("headers.{name} is \"{REDACTED}\", but the queue has no such header to keep")]
    NoHeaderToKeep { name: String },
    /// A `PATCH` body that is not a JSON object.
    #[error("a merge patch of queue settings is a JSON object")]
    PatchNotAnObject,
    /// The merged settings do not read as a settings body.
    #[error("{0}")]
    Merged(serde_json::Error),
}

/// A `PUT /v1/queues/{q}` body. Unknown fields are errors.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct SettingsBody {
    lease_timeout_seconds: Option<f64>,
    max_retries: Option<u32>,
    retention_seconds: Option<f64>,
    dedup_window_seconds: Option<f64>,
    /// `discard` or `fail`.
    #[schema(value_type = Option<String>)]
    on_expire: Option<OnExpire>,
    destination: Option<String>,
    concurrency: Option<u32>,
    rate_limit: Option<f64>,
    timeout_seconds: Option<f64>,
    backoff: Option<BackoffBody>,
    headers: Option<BTreeMap<String, String>>,
    /// Absent: keep; `null`: clear; a string: set.
    #[serde(default, deserialize_with = "present")]
    signing_secret: Option<Option<String>>,
    permanent_failure_statuses: Option<Vec<u16>>,
    breaker_failures: Option<u32>,
    ca_file: Option<String>,
    client_cert: Option<String>,
    client_key: Option<String>,
    /// Event type patterns: `invoice.*` (one segment), `invoice.>` (one or
    /// more).
    events: Option<Vec<String>>,
    /// A push queue only: just this tenant's events.
    tenant: Option<String>,
    /// A content filter (Amazon SNS filter policies) on the payload and
    /// headers of the events `events` takes: `{"payload": {…},
    /// "headers": {…}}`.
    #[schema(value_type = Option<Object>)]
    filter: Option<crate::spool::content_filter::ContentFilter>,
    /// Keep delivered messages this long (0: not kept).
    history_retention_seconds: Option<f64>,
    history_max_bytes: Option<u64>,
    /// `none` (the default) or `per_key`.
    #[schema(value_type = Option<String>)]
    ordering: Option<Ordering>,
    /// `release` (the default) or `hold`.
    #[schema(value_type = Option<String>)]
    ordering_on_failure: Option<OrderingOnFailure>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct BackoffBody {
    initial_seconds: Option<f64>,
    multiplier: Option<f64>,
    max_seconds: Option<f64>,
    jitter: Option<f64>,
}

/// Distinguishes an explicit `null` from an absent field.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

/// Upper bound of any duration setting: ten years, far past any sane value,
/// so that conversions never overflow.
const DURATION_SECONDS_MAX: f64 = 10.0 * 365.0 * 86_400.0;

fn ms(field: &'static str, seconds: Option<f64>, default_ms: u64) -> Result<u64, BodyError> {
    match seconds {
        None => Ok(default_ms),
        Some(s) if s.is_finite() && (0.0..=DURATION_SECONDS_MAX).contains(&s) => {
            Ok((s * 1000.0).round() as u64)
        }
        Some(seconds) => Err(BodyError::Duration { field, seconds }),
    }
}

impl SettingsBody {
    /// Whether it says how much history to keep (else the `[events]`
    /// default applies to an event endpoint).
    pub(crate) fn sets_history(&self) -> bool {
        self.history_retention_seconds.is_some() || self.history_max_bytes.is_some()
    }

    /// The full settings a `PUT` asks for, and warnings for the answer.
    /// `previous` (the queue's settings now, if it exists) gives what an
    /// omitted `signingSecret` keeps and what a header sent as
    /// `"<redacted>"` keeps, while the destination keeps its origin; a
    /// move to another origin that would leave one behind is
    /// [`SettingsRefusal::SecretsWouldMove`] unless `keep_secrets`.
    pub(crate) fn into_settings(
        mut self,
        previous: Option<&QueueSettings>,
        keep_secrets: bool,
    ) -> Result<(QueueSettings, Vec<String>), SettingsRefusal> {
        let mut warnings = Vec::new();
        let moved = previous.and_then(|p| {
            let (from, to) = (p.destination.as_deref()?, self.destination.as_deref()?);
            (origin(from) != origin(to)).then(|| (origin(from), origin(to)))
        });
        self.check_secrets_move(previous, moved.as_ref(), keep_secrets)?;
        let headers = self.headers.take().unwrap_or_default();
        let headers = kept_headers(headers, previous, moved.as_ref(), &mut warnings)?;
        let secrets = self.signing_secrets(previous);
        let settings = self.with_defaults(headers, secrets)?;
        Ok((settings, warnings))
    }

    /// Refuses a move to another origin (`moved`, from and to) that would
    /// leave a kept secret behind: an omitted `signingSecret`, a header
    /// sent as `"<redacted>"`. Unless `keep_secrets`.
    fn check_secrets_move(
        &self,
        previous: Option<&QueueSettings>,
        moved: Option<&(String, String)>,
        keep_secrets: bool,
    ) -> Result<(), SettingsRefusal> {
        let left: Vec<String> = moved
            .iter()
            .flat_map(|_| {
                let secret = previous
                    .and_then(|p| p.signing_secret.as_ref())
                    .filter(|_| self.signing_secret.is_none())
                    .map(|_| "signingSecret".to_string());
                let headers = self
                    .headers
                    .iter()
                    .flatten()
                    .filter(|(_, v)| *v == REDACTED);
                secret
                    .into_iter()
                    .chain(headers.map(|(name, _)| format!("headers.{name}")))
            })
            .collect();
        if let (Some((from, to)), false, false) = (moved, left.is_empty(), keep_secrets) {
            return Err(SettingsRefusal::SecretsWouldMove(format!(
                "the destination moves from {from} to {to}, and {} would not go with it: send \
                 them again in clear, or pass keepSecrets=true to keep the signing secret and \
                 drop the headers",
                left.join(", ")
            )));
        }
        Ok(())
    }

    /// The signing secret the settings get, and the one a rotation
    /// replaced: an omitted `signingSecret` keeps `previous`'s.
    fn signing_secrets(
        &mut self,
        previous: Option<&QueueSettings>,
    ) -> (Option<String>, Option<PreviousSecret>) {
        match self.signing_secret.take() {
            None => (
                previous.and_then(|p| p.signing_secret.clone()),
                // A rotated-out secret stays while the secret is kept,
                // and goes with it when the body sets or clears it.
                previous.and_then(|p| p.previous_secret.clone()),
            ),
            Some(set) => (set, None),
        }
    }

    /// The settings the body asks for, each omitted field at its default,
    /// with `headers` as [`kept_headers`] made them and the signing
    /// secrets as [`SettingsBody::signing_secrets`] chose them.
    fn with_defaults(
        self,
        headers: BTreeMap<String, String>,
        (signing_secret, previous_secret): (Option<String>, Option<PreviousSecret>),
    ) -> Result<QueueSettings, SettingsRefusal> {
        let d = QueueSettings::default();
        Ok(QueueSettings {
            lease_timeout_ms: ms(
                "leaseTimeoutSeconds",
                self.lease_timeout_seconds,
                d.lease_timeout_ms,
            )?,
            max_retries: self.max_retries.unwrap_or(d.max_retries),
            retention_ms: ms("retentionSeconds", self.retention_seconds, d.retention_ms)?,
            dedup_window_ms: ms(
                "dedupWindowSeconds",
                self.dedup_window_seconds,
                d.dedup_window_ms,
            )?,
            on_expire: self.on_expire.unwrap_or(d.on_expire),
            destination: self.destination,
            concurrency: self.concurrency.unwrap_or(d.concurrency),
            rate_limit: self.rate_limit,
            timeout_ms: ms("timeoutSeconds", self.timeout_seconds, d.timeout_ms)?,
            backoff: self.backoff.unwrap_or_default().into_backoff()?,
            headers,
            signing_secret,
            permanent_failure_statuses: self
                .permanent_failure_statuses
                .unwrap_or(d.permanent_failure_statuses),
            breaker_failures: self.breaker_failures.unwrap_or(d.breaker_failures),
            ca_file: self.ca_file,
            client_cert: self.client_cert,
            client_key: self.client_key,
            events: self.events.unwrap_or_default(),
            tenant: self.tenant,
            filter: self.filter,
            history_retention_ms: ms(
                "historyRetentionSeconds",
                self.history_retention_seconds,
                d.history_retention_ms,
            )?,
            history_max_bytes: self.history_max_bytes.unwrap_or(d.history_max_bytes),
            ordering: self.ordering.unwrap_or(d.ordering),
            ordering_on_failure: self.ordering_on_failure.unwrap_or(d.ordering_on_failure),
            previous_secret,
        })
    }

    /// The body a `PATCH` (RFC 7396) means: `patch` merged into `previous`
    /// as `GET` renders it.
    pub(crate) fn merged(
        previous: &QueueSettings,
        patch: &serde_json::Value,
    ) -> Result<SettingsBody, BodyError> {
        if !patch.is_object() {
            return Err(BodyError::PatchNotAnObject);
        }
        let mut doc = serde_json::to_value(render(previous)).expect("settings render as JSON");
        if let Some(fields) = doc.as_object_mut() {
            fields.remove("signingSecretSet");
        }
        json_patch::merge(&mut doc, patch);
        let mut body: SettingsBody = serde_json::from_value(doc).map_err(BodyError::Merged)?;
        // A merge patch's `null` removes a member, and an absent secret
        // means "keep": `signingSecret: null` clears it here.
        if patch
            .get("signingSecret")
            .is_some_and(serde_json::Value::is_null)
        {
            body.signing_secret = Some(None);
        }
        Ok(body)
    }
}

impl BackoffBody {
    /// The backoff in milliseconds, each omitted field at its default.
    fn into_backoff(self) -> Result<Backoff, BodyError> {
        let b = Backoff::default();
        Ok(Backoff {
            initial_ms: ms("backoff.initialSeconds", self.initial_seconds, b.initial_ms)?,
            multiplier: self.multiplier.unwrap_or(b.multiplier),
            max_ms: ms("backoff.maxSeconds", self.max_seconds, b.max_ms)?,
            jitter: self.jitter.unwrap_or(b.jitter),
        })
    }
}

/// The headers of a `PUT`: each sent as `"<redacted>"` keeps the value it
/// had in `previous`, or, when the destination `moved` to another origin,
/// is dropped with a warning (a credential for one origin is never sent
/// to another).
fn kept_headers(
    mut headers: BTreeMap<String, String>,
    previous: Option<&QueueSettings>,
    moved: Option<&(String, String)>,
    warnings: &mut Vec<String>,
) -> Result<BTreeMap<String, String>, SettingsRefusal> {
    let mut dropped = Vec::new();
    for (name, value) in &mut headers {
        if value == REDACTED {
            if moved.is_some() {
                dropped.push(format!("headers.{name}"));
                continue;
            }
            *value = previous
                .and_then(|p| p.headers.get(name).cloned())
                .ok_or_else(|| BodyError::NoHeaderToKeep { name: name.clone() })?;
        }
    }
    headers.retain(|_, value| value != REDACTED);
    if let (Some((from, to)), false) = (moved, dropped.is_empty()) {
        warnings.push(format!(
            "the destination moved from {from} to {to}: {} not kept (a credential for one \
             origin is never sent to another); the signing secret is kept",
            dropped.join(", ")
        ));
    }
    Ok(headers)
}

/// The origin (`scheme://host:port`) of a destination URL, as written if it
/// does not parse (the engine refuses it then).
fn origin(url: &str) -> String {
    url::Url::parse(url).map_or_else(|_| url.to_string(), |u| u.origin().ascii_serialization())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::guard::{Guard, OwnEndpoints};
    use crate::spool::ContentFilter;
    use crate::spool::queue::destination_host;

    #[test]
    fn put_bodies_default_what_they_omit_but_keep_the_secret() {
        let body: SettingsBody =
            serde_json::from_str(r#"{"maxRetries": 2, "leaseTimeoutSeconds": 1.5}"#).unwrap();
        let old = QueueSettings {
            signing_secret: Some("old".into()),
            headers: BTreeMap::from([("X-Token".into(), "t0k3n".into())]),
            ..QueueSettings::default()
        };
        let (s, _) = body.into_settings(Some(&old), false).unwrap();
        assert_eq!((s.max_retries, s.lease_timeout_ms), (2, 1500));
        assert_eq!(s.signing_secret.as_deref(), Some("old"));
        let body: SettingsBody = serde_json::from_str(r#"{"signingSecret": null}"#).unwrap();
        assert_eq!(
            body.into_settings(Some(&old), false)
                .unwrap()
                .0
                .signing_secret,
            None
        );
        assert!(serde_json::from_str::<SettingsBody>(r#"{"maxRetrys": 2}"#).is_err());
        // A header read back hidden and sent again keeps its value.
        let body: SettingsBody =
            serde_json::from_str(r#"{"headers": {"X-Token": "<redacted>"}}"#).unwrap();
        let (s, _) = body.into_settings(Some(&old), false).unwrap();
        assert_eq!(s.headers["X-Token"], "t0k3n");
        let body: SettingsBody =
            serde_json::from_str(r#"{"headers": {"X-Other": "<redacted>"}}"#).unwrap();
        assert!(body.into_settings(Some(&old), false).is_err());
    }

    #[test]
    fn secrets_do_not_follow_a_destination_to_another_origin() {
        let old = QueueSettings {
            destination: Some("https://hooks.example.com/a".into()),
            signing_secret: Some("whsec_old".into()),
            headers: BTreeMap::from([("Authorization".into(), "Bearer t0k3n".into())]),
            ..QueueSettings::default()
        };
        let put = |json: &str| {
            serde_json::from_str::<SettingsBody>(json)
                .unwrap()
                .into_settings(Some(&old), false)
                .unwrap()
        };
        // Same origin, another path: kept, nothing to say.
        let (s, warnings) = put(
            r#"{"destination": "https://hooks.example.com/b", "headers": {"Authorization": "<redacted>"}}"#,
        );
        assert_eq!(s.headers["Authorization"], "Bearer t0k3n");
        assert_eq!(s.signing_secret.as_deref(), Some("whsec_old"));
        assert!(warnings.is_empty());
        // Another host, a secret left behind: refused, naming it.
        let json = r#"{"destination": "https://evil.example/", "headers": {"Authorization": "<redacted>"}}"#;
        let body = || serde_json::from_str::<SettingsBody>(json).unwrap();
        match body().into_settings(Some(&old), false) {
            Err(SettingsRefusal::SecretsWouldMove(why)) => {
                assert!(why.contains("signingSecret"), "{why}");
                assert!(why.contains("headers.Authorization"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        // keepSecrets: the signing secret goes with it, the header never.
        let (s, warnings) = body().into_settings(Some(&old), true).unwrap();
        assert!(s.headers.is_empty());
        assert_eq!(s.signing_secret.as_deref(), Some("whsec_old"));
        assert!(
            warnings[0].contains("headers.Authorization"),
            "{warnings:?}"
        );
        // Another port, sent again in clear: taken, nothing dropped.
        let (s, warnings) = put(
            r#"{"destination": "https://hooks.example.com:8443/", "headers": {"Authorization": "Bearer n3w"}, "signingSecret": "whsec_bmV3"}"#,
        );
        assert_eq!(s.headers["Authorization"], "Bearer n3w");
        assert_eq!(s.signing_secret.as_deref(), Some("whsec_bmV3"));
        assert!(warnings.is_empty());
    }

    #[test]
    fn a_merge_patch_changes_only_what_it_names() {
        let old = QueueSettings {
            destination: Some("https://hooks.example.com/a".into()),
            signing_secret: Some("whsec_old".into()),
            breaker_failures: 1000,
            headers: BTreeMap::from([("X-Token".into(), "t0k3n".into())]),
            ..QueueSettings::default()
        };
        let patch = serde_json::json!({"destination": "https://hooks.example.com/b", "backoff": {"maxSeconds": 60}});
        let (s, _) = SettingsBody::merged(&old, &patch)
            .unwrap()
            .into_settings(Some(&old), false)
            .unwrap();
        assert_eq!(
            s.destination.as_deref(),
            Some("https://hooks.example.com/b")
        );
        assert_eq!((s.breaker_failures, s.backoff.max_ms), (1000, 60_000));
        assert_eq!(s.backoff.initial_ms, old.backoff.initial_ms);
        assert_eq!(s.headers["X-Token"], "t0k3n");
        assert_eq!(s.signing_secret.as_deref(), Some("whsec_old"));
        let patch = serde_json::json!({"signingSecret": null, "headers": {"X-Token": null}, "breakerFailures": null});
        let (s, _) = SettingsBody::merged(&old, &patch)
            .unwrap()
            .into_settings(Some(&old), false)
            .unwrap();
        assert_eq!(s.signing_secret, None);
        assert!(s.headers.is_empty());
        assert_eq!(
            s.breaker_failures,
            QueueSettings::default().breaker_failures
        );
        assert!(SettingsBody::merged(&old, &serde_json::json!({"maxRetrys": 1})).is_err());
        assert!(SettingsBody::merged(&old, &serde_json::json!([1])).is_err());
    }

    /// A filter is part of the settings object, so a merge patch merges
    /// into it member by member (RFC 7396), and `"filter": null` clears it.
    #[test]
    fn a_merge_patch_merges_into_a_filter_and_null_clears_it() {
        let old = QueueSettings {
            events: vec!["order.>".into()],
            filter: Some(
                ContentFilter::try_from(serde_json::json!({"headers": {"x-source": ["checkout"]}}))
                    .unwrap(),
            ),
            ..QueueSettings::default()
        };
        let patch =
            serde_json::json!({"filter": {"payload": {"amount": [{"numeric": [">", 10]}]}}});
        let (s, _) = SettingsBody::merged(&old, &patch)
            .unwrap()
            .into_settings(Some(&old), false)
            .unwrap();
        assert_eq!(
            s.filter.as_ref().map(ContentFilter::source),
            Some(&serde_json::json!({
                "headers": {"x-source": ["checkout"]},
                "payload": {"amount": [{"numeric": [">", 10]}]},
            }))
        );
        let patch = serde_json::json!({"filter": {"headers": null}});
        let (s, _) = SettingsBody::merged(&s, &patch)
            .unwrap()
            .into_settings(Some(&s), false)
            .unwrap();
        assert_eq!(
            s.filter.as_ref().map(ContentFilter::source),
            Some(&serde_json::json!({"payload": {"amount": [{"numeric": [">", 10]}]}}))
        );
        let (s, _) = SettingsBody::merged(&s, &serde_json::json!({"filter": null}))
            .unwrap()
            .into_settings(Some(&s), false)
            .unwrap();
        assert_eq!(s.filter, None);
        // A patch that makes the filter bad is refused, naming the part.
        let bad = serde_json::json!({"filter": {"payload": {"amount": [{"numeric": ["~", 1]}]}}});
        let Err(err) = SettingsBody::merged(&old, &bad) else {
            panic!("a bad filter merged");
        };
        assert!(
            err.to_string().contains("filter.payload.amount[0]"),
            "{err}"
        );
    }

    #[test]
    fn the_secret_is_never_rendered() {
        let s = QueueSettings {
            destination: Some("https://x.example.com/h".into()),
            signing_secret: Some("whsec_abc".into()),
            ..QueueSettings::default()
        };
        let text = serde_json::to_string(&render(&s)).unwrap();
        assert!(!text.contains("whsec_abc"), "{text}");
        assert!(text.contains("\"signingSecretSet\":true"));
    }

    #[test]
    fn destinations_are_checked_and_matched() {
        let host = |dest: &str| destination_host(dest).map(|(h, _)| h);
        assert_eq!(
            destination_host("https://Api.Example.com:8443/h").unwrap(),
            ("api.example.com".to_string(), 8443)
        );
        assert_eq!(
            destination_host("http://[::1]:80").unwrap(),
            ("::1".into(), 80)
        );
        assert_eq!(destination_host("https://a.example.com/").unwrap().1, 443);
        assert!(host("https://x.example.com/h?a=1").is_err());
        // What the client dials, not how it was written.
        assert_eq!(host("http://2130706433/").unwrap(), "127.0.0.1");
        assert_eq!(host("http://127.1/").unwrap(), "127.0.0.1");
        assert_eq!(
            host("https://HOOKS.Example.COM./x").unwrap(),
            "hooks.example.com"
        );
        assert_eq!(host("http://[::ffff:127.0.0.1]/").unwrap(), "::ffff:7f00:1");
        assert!(host("ftp://x").is_err());
        assert!(host("https://user@x").is_err());
        let allowed = vec!["*.example.com".to_string(), "127.0.0.1".to_string()];
        let guard = Guard::new(Some(&allowed), OwnEndpoints::default());
        let allowed = |dest: &str| {
            destination_host(dest).is_ok_and(|(h, port)| guard.check_destination(&h, port).is_ok())
        };
        assert!(allowed("https://api.example.com/"));
        assert!(allowed("http://127.0.0.1/"));
        // The same address written as IPv4 mapped into IPv6, or in decimal.
        assert!(allowed("http://[::ffff:127.0.0.1]/"));
        assert!(allowed("http://2130706433/"));
        // Bypass attempts: each resolves to a host the list does not allow.
        for dest in [
            "https://example.com/",
            "https://evilexample.com/",
            "https://hooks.example.com.evil.org/",
            "https://evil.org#.example.com",
            "https://evil.org/.example.com",
            "http://0x7f.0.0.2/",
            "https://hooks.example.com@evil.org/",
        ] {
            assert!(!allowed(dest), "{dest} slipped through");
        }
    }
}
