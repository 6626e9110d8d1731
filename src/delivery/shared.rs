//! What every worker of one push queue shares: the engine, the settings
//! its dispatcher started with, the ways to its destination, its rate
//! limit and metrics.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, SystemTime};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use reqwest::Client;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::sync::watch;

use super::direct::{Direct, Ways};
use super::hosts::{Hosts, Origin};
use super::target::{Destination, DestinationError};
use crate::engine::{Engine, PushDelivery};
use crate::metrics::DeliveryMetrics;
use crate::spool::QueueSettings;
use crate::spool::queue::static_header_refusal;

/// What every worker of one queue shares.
pub(crate) struct QueueShared {
    pub engine: Engine,
    pub queue: String,
    pub settings: QueueSettings,
    /// `settings.destination`, parsed once.
    pub destination: Result<Destination, DestinationError>,
    /// The direct way to a plain-HTTP destination (`direct.rs`), if it
    /// has one.
    pub direct: Option<Arc<Direct>>,
    /// The destination's origin (`hosts.rs`): a worker holds one of its
    /// slots while it delivers.
    pub origin: Arc<Origin>,
    pub client: Client,
    /// `settings.headers` as the request carries them, built once: each
    /// attempt copies them in (`send.rs`).
    pub static_headers: HeaderMap,
    pub limiter: Option<DefaultDirectRateLimiter>,
    pub metrics: DeliveryMetrics,
    /// Whether this pool's probe task runs. The breaker itself (failures
    /// in a row, when it probes) is the engine's (`Engine::breaker`): the
    /// settle that fails once too often opens it, an operator closes it or
    /// asks for a probe now through the API, and a pool that replaces this
    /// one (settings changed) finds it open and probes with its own
    /// settings.
    pub probing: AtomicBool,
    /// The pool's stop: set when the queue's settings change or the
    /// server stops.
    pub stop: watch::Receiver<bool>,
    /// Header names whose values are secrets (lower case): the contract's
    /// (`Authorization`, `Cookie`, …) and `server.redact_headers`. Their
    /// values are scrubbed from what an attempt records.
    secret_headers: Arc<Vec<String>>,
}

/// What every dispatcher's queue reaches its destination's origin
/// through, kept between dispatchers: the direct ways to plain-HTTP
/// origins and every origin's slots.
pub(crate) struct Origins {
    pub ways: Ways,
    pub hosts: Hosts,
}

impl Origins {
    /// Forgets what no dispatcher holds; closes connections idle too long.
    pub(crate) fn prune(&mut self) {
        self.ways.prune();
        self.hosts.prune();
    }
}

/// Header names whose values never appear in what an attempt records.
const SECRET_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "spooler-api-key",
];

impl QueueShared {
    pub(crate) fn new(
        engine: Engine,
        queue: String,
        settings: QueueSettings,
        client: Client,
        origins: &mut Origins,
        redact_headers: Arc<Vec<String>>,
        stop: watch::Receiver<bool>,
    ) -> Arc<QueueShared> {
        let limiter = settings.rate_limit.and_then(|per_second| {
            // Whole requests per second, at least one; fractional rates
            // become one request per 1/rate seconds.
            let quota = if per_second >= 1.0 {
                Quota::per_second(NonZeroU32::new(per_second.round() as u32)?)
            } else {
                Quota::with_period(Duration::from_secs_f64(1.0 / per_second))?
            };
            Some(RateLimiter::direct(quota))
        });
        // Checked when set; again here for settings written before a
        // rule of the guard, or before this node's addresses were known.
        let destination = match &settings.destination {
            Some(d) => Destination::parse(d).and_then(|dest| {
                let url = dest.url();
                let host = url.host_str().unwrap_or_default();
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let port = url.port_or_known_default().unwrap_or(80);
                engine
                    .guard()
                    .check_destination(&host.to_ascii_lowercase(), port)
                    .map_err(DestinationError::Refused)?;
                Ok(dest)
            }),
            None => Err(DestinationError::Missing),
        };
        let url = destination.as_ref().ok().map(Destination::url);
        let direct = origins.ways.to(url);
        let origin = origins.hosts.origin(url);
        let static_headers = static_headers(&settings);
        Arc::new(QueueShared {
            engine,
            destination,
            direct,
            origin,
            metrics: DeliveryMetrics::new(&queue),
            queue,
            settings,
            client,
            static_headers,
            limiter,
            probing: AtomicBool::new(false),
            stop,
            secret_headers: redact_headers,
        })
    }

    /// The secret values a delivery carries: those of the stored request's
    /// secret headers and every static header's (static headers are
    /// credentials more often than not). Short ones are left alone: hiding
    /// "1" would garble everything.
    pub(crate) fn secrets(&self, d: &PushDelivery) -> Vec<String> {
        const SECRET_BYTES_MIN: usize = 4;
        let secret_name = |name: &str| {
            SECRET_HEADERS
                .iter()
                .copied()
                .chain(self.secret_headers.iter().map(String::as_str))
                .any(|secret| secret.eq_ignore_ascii_case(name))
        };
        let stored = d
            .payload
            .request
            .iter()
            .flat_map(|r| r.headers.iter())
            .filter(|(name, _)| secret_name(name))
            .map(|(_, value)| value);
        stored
            .chain(self.settings.headers.values())
            .flat_map(|value| {
                // A bearer token is also echoed without its scheme.
                let bare = value.split_once(' ').map(|(_, v)| v.to_string());
                std::iter::once(value.clone()).chain(bare)
            })
            .filter(|v| v.len() >= SECRET_BYTES_MIN)
            .collect()
    }

    /// Now, by the engine's clock (never the system's directly, so that a
    /// test's clock governs delivery too).
    pub(crate) fn engine_now_ms(&self) -> i64 {
        self.engine.clock_ms()
    }

    pub(crate) fn engine_now(&self) -> SystemTime {
        let ms = u64::try_from(self.engine_now_ms()).unwrap_or(0);
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
    }
}

/// A queue's static headers as a request carries them. Those the settings
/// refuse (`static_header_refusal`) are refused when the settings are
/// made; they are skipped here too, for settings journaled before that
/// rule, as is a name or value that is not one.
fn static_headers(settings: &QueueSettings) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in &settings.headers {
        if static_header_refusal(name).is_some() {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.insert(n, v);
        }
    }
    headers
}
