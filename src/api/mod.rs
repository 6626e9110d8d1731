//! The HTTP surface (docs/contract.md §4): routes, auth, error mapping. It talks only
//! to the [`Engine`].
//!
//! The server starts listening before the journal is replayed, so that
//! `/healthz` answers and `/readyz` says "not ready" during a long replay;
//! `/v1` answers `503 unavailable` until the engine is in place.

pub(crate) mod auth;
pub(crate) mod cluster;
pub(crate) mod console;
pub(crate) mod deliveries;
pub(crate) mod edge;
pub(crate) mod error;
pub(crate) mod event_types;
pub(crate) mod events;
pub(crate) mod examples;
pub(crate) mod filter;
pub(crate) mod forward;
pub(crate) mod history;
pub(crate) mod hops;
pub(crate) mod messages;
pub(crate) mod openapi;
pub(crate) mod params;
pub(crate) mod portal;
pub(crate) mod queues;
pub(crate) mod rates;
pub(crate) mod relay;
pub(crate) mod scope;
pub(crate) mod scrape;
pub(crate) mod search;
pub(crate) mod secrets;
pub(crate) mod session;
pub(crate) mod settings;
pub(crate) mod stored;
pub(crate) mod view;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use tracing::Instrument;
use utoipa::OpenApi as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use bytes::Bytes;
use http_body_util::BodyExt;
use openapi::{ErrorBody, ReadyBody, StatusBody};
use tokio::sync::{Semaphore, watch};

use crate::config::Config;
use crate::engine::Engine;
use error::ApiError;

/// How long reading a request body may take: a client that trickles its body
/// cannot hold a connection and its buffer forever.
pub(crate) const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Long polls (`wait` > 0) that may wait at once; more are refused with
/// `503` so that waiting receivers cannot exhaust the server.
pub const LONG_POLLS_MAX: usize = 1024;
/// Longest `wait` of a receive (docs/contract.md §4).
pub(crate) const WAIT_SECONDS_MAX: f64 = 20.0;

/// What the HTTP layer needs from the config.
#[derive(Debug, Clone)]
pub(crate) struct ApiConfig {
    /// The keys at start; [`AppState::api_keys`] has the current ones (a
    /// reload changes them).
    pub api_keys: Vec<crate::config::ApiKey>,
    pub max_body_bytes: u64,
    /// `server.redact_headers`, lower-cased.
    pub redact_headers: Vec<String>,
    /// What the edge refuses before the key check (`edge.rs`).
    pub edge: edge::EdgePolicy,
    /// The portal: sessions (when a secret is set) and its page's policy.
    pub portal: portal::PortalPolicy,
}

impl ApiConfig {
    pub(crate) fn from_config(config: &Config, env_keys: Option<&str>) -> ApiConfig {
        // An empty key is refused before anything serves
        // (`Config::check_exposure`); none is accepted here either.
        let api_keys = config.api_keys(env_keys).unwrap_or_default();
        // Without a key, a server on loopback trusts being there: the
        // `Host` must say loopback too. One listening beyond it (allowed
        // by `allow_unauthenticated`) is reached by other names.
        let edge = edge::EdgePolicy {
            loopback_only: api_keys.is_empty() && crate::config::is_loopback(&config.server.listen),
        };
        let env_secret = std::env::var("SPOOLD_PORTAL_SECRET").ok();
        ApiConfig {
            edge,
            portal: portal::PortalPolicy::from_config(&config.portal, env_secret.as_deref()),
            api_keys,
            max_body_bytes: config.server.max_body_bytes,
            redact_headers: config.server.redacted_header_names(),
        }
    }
}

/// Shared by every handler.
pub(crate) struct AppState {
    engine: OnceLock<Engine>,
    /// Replicated mode: this replica's cluster.
    cluster: OnceLock<crate::cluster::Cluster>,
    pub config: ApiConfig,
    /// The API keys accepted now (`server.api_keys` and `SPOOLD_API_KEYS`;
    /// a reload replaces them).
    api_keys: std::sync::RwLock<Arc<auth::Keyring>>,
    /// True once the server is stopping: `/readyz` fails and open tails
    /// end.
    shutting_down: watch::Sender<bool>,
    long_polls: Arc<Semaphore>,
    /// Slots of the searches that may run at once (`search.rs`).
    searches: Arc<Semaphore>,
    /// Bumped by every reload of the keys (`set_api_keys`).
    keys_changed: watch::Sender<u64>,
    /// Replicated mode: the term in which the config's queues are in place
    /// on this primary; `/v1` calls are served here only in that term.
    open_term: std::sync::atomic::AtomicU64,
    /// Why this server will not serve until an operator acts (a replica
    /// whose vote must be repaired): every `/v1` call is answered with it.
    blocked: OnceLock<String>,
    /// Replicated mode: how a follower relays calls to the primary.
    relay: OnceLock<relay::Relay>,
}

impl AppState {
    pub(crate) fn new(config: ApiConfig) -> Arc<AppState> {
        Arc::new(AppState {
            engine: OnceLock::new(),
            cluster: OnceLock::new(),
            api_keys: std::sync::RwLock::new(Arc::new(auth::Keyring::new(&config.api_keys))),
            config,
            shutting_down: watch::Sender::new(false),
            long_polls: Arc::new(Semaphore::new(LONG_POLLS_MAX)),
            searches: Arc::new(Semaphore::new(search::searches_max())),
            keys_changed: watch::Sender::new(0),
            open_term: std::sync::atomic::AtomicU64::new(0),
            blocked: OnceLock::new(),
            relay: OnceLock::new(),
        })
    }

    /// The API keys accepted now.
    pub(crate) fn api_keys(&self) -> Arc<auth::Keyring> {
        self.api_keys.read().expect("api keys poisoned").clone()
    }

    /// A reload's keys: the next request is checked against them, and
    /// the streams and long polls whose key they no longer accept end
    /// ([`AppState::revoked`]).
    pub(crate) fn set_api_keys(&self, keys: &[crate::config::ApiKey]) {
        *self.api_keys.write().expect("api keys poisoned") = Arc::new(auth::Keyring::new(keys));
        self.keys_changed.send_modify(|n| *n += 1);
    }

    /// Resolves once the keys in force no longer grant all `presented`
    /// was granted: a stream or long poll opened with it ends (a reload
    /// that removes or narrows a key takes what it opened with it).
    pub(crate) fn revoked(
        self: &Arc<Self>,
        presented: auth::Presented,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let state = self.clone();
        let mut changed = self.keys_changed.subscribe();
        async move {
            // A portal session ends at its end, whatever the keys do.
            if let Some(ends) = presented.session_ends {
                let left = ends.saturating_sub(session::unix_now());
                return tokio::time::sleep(Duration::from_secs(left)).await;
            }
            loop {
                if !presented.accepted_by(&state.api_keys()) {
                    return;
                }
                if changed.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        }
    }

    /// This server will not serve: `reason` says what the operator must do.
    pub(crate) fn block(&self, reason: String) {
        let _ = self.blocked.set(reason);
    }

    /// Replicated mode: this primary serves `/v1` calls in `term` (the
    /// config's queues are reconciled).
    pub(crate) fn open_in(&self, term: u64) {
        self.open_term
            .store(term, std::sync::atomic::Ordering::Release);
    }

    /// Hands over the engine once replay is done.
    pub(crate) fn set_engine(&self, engine: Engine) {
        let _ = self.engine.set(engine);
    }

    /// Replicated mode: hands over the cluster (before the engine).
    pub(crate) fn set_cluster(&self, cluster: crate::cluster::Cluster) {
        let _ = self.cluster.set(cluster);
    }

    pub(crate) fn cluster(&self) -> Option<&crate::cluster::Cluster> {
        self.cluster.get()
    }

    /// Marks the server as stopping: `/readyz` fails from now on, and
    /// open tails end.
    pub(crate) fn begin_shutdown(&self) {
        self.shutting_down.send_replace(true);
    }

    /// Becomes true when the server starts stopping.
    pub(crate) fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutting_down.subscribe()
    }

    pub(crate) fn engine(&self) -> Result<&Engine, ApiError> {
        match self.engine.get() {
            Some(engine) if engine.is_poisoned() => Err(ApiError::unavailable(
                "storage failed (an fsync failed); the server is restarting",
            )),
            Some(engine) => Ok(engine),
            None => Err(ApiError::unavailable(self.blocked.get().map_or(
                "the spool is starting (replaying its journal)",
                String::as_str,
            ))),
        }
    }

    /// Ready: not stopping, the spool open and healthy, and in replicated
    /// mode a primary known, with the API URL calls are relayed to
    /// (docs/contract.md §9). `Some(why)` when not.
    pub(crate) fn not_ready(&self) -> Option<String> {
        if *self.shutting_down.borrow() {
            return Some("stopping".into());
        }
        match self.engine.get() {
            None => return Some("starting (the spool is being opened)".into()),
            Some(e) if e.is_poisoned() => {
                return Some("storage failed (the journal is poisoned; see the log)".into());
            }
            Some(_) => {}
        }
        let cluster = self.cluster.get()?;
        cluster
            .primary()
            .is_none()
            .then(|| cluster.why_no_primary())
    }
}

/// Every route that `#[utoipa::path]` describes, registered with its
/// description: the router and the OpenAPI document come from the same
/// list.
fn api_router() -> OpenApiRouter<Arc<AppState>> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(queues::list))
        .routes(routes!(
            queues::get_one,
            queues::put,
            queues::patch,
            queues::delete
        ))
        .routes(routes!(events::publish))
        .routes(routes!(event_types::list))
        .routes(routes!(
            event_types::get_one,
            event_types::put,
            event_types::delete
        ))
        .routes(routes!(history::list))
        .routes(routes!(deliveries::list))
        .routes(routes!(history::get_one))
        .routes(routes!(history::resend))
        .routes(routes!(messages::send, messages::peek, messages::purge))
        .routes(routes!(messages::get_one, messages::cancel))
        .routes(routes!(messages::retry_now))
        .routes(routes!(rates::total))
        .routes(routes!(rates::queue))
        .routes(routes!(messages::receive))
        .routes(routes!(messages::receive_batch))
        .routes(routes!(messages::ack))
        .routes(routes!(messages::nack))
        .routes(routes!(messages::renew))
        .routes(routes!(messages::tail))
        .routes(routes!(queues::redrive))
        .routes(routes!(queues::pause))
        .routes(routes!(queues::resume))
        .routes(routes!(queues::probe_breaker))
        .routes(routes!(queues::close_breaker))
        .routes(routes!(secrets::rotate))
        .routes(routes!(cluster::status))
        .routes(routes!(cluster::add_member))
        .routes(routes!(cluster::remove_member))
        .routes(routes!(openapi_json))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(portal::create))
        .routes(routes!(portal::who))
        .routes(routes!(portal::index))
        .routes(routes!(portal::asset))
        .routes(routes!(console::index))
        .routes(routes!(console::asset))
}

/// The OpenAPI 3.1 document of the API (`GET /v1/openapi.json`,
/// `spoold openapi`).
pub fn openapi_document() -> String {
    static DOCUMENT: OnceLock<String> = OnceLock::new();
    DOCUMENT
        .get_or_init(|| {
            let mut api = api_router().into_openapi();
            scope::document(&mut api);
            let mut doc = serde_json::to_value(api).expect("the document serializes");
            examples::finish(&mut doc);
            serde_json::to_string_pretty(&doc).expect("the document serializes")
        })
        .clone()
}

/// Every route of the contract (docs/contract.md §4), in one flat router
/// (nesting `/v1` would route each request twice), behind one middleware
/// ([`gate`]).
pub(crate) fn router(state: Arc<AppState>) -> Router {
    let (routes, _) = api_router().split_for_parts();
    routes
        // Any method and a path of any depth: described in
        // `openapi::forward`, routed here.
        .route("/v1/forward/{q}", any(messages::forward))
        .route("/v1/forward/{q}/", any(messages::forward))
        .route("/v1/forward/{q}/{*path}", any(messages::forward))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // `layer`, not `route_layer`: the fallbacks are behind it too, so
        // that an unknown `/v1` path also needs a key.
        .layer(axum::middleware::from_fn_with_state(state.clone(), gate))
        .with_state(state)
}

/// The routes of `server.metrics_listen`: metrics and probes only, without
/// a key (they carry no messages), so that `/v1` can stay on loopback
/// while Prometheus and the kubelet reach these. Every listener also
/// answers with it a probe that finds no slot free (`server.rs`: only a
/// request line of `GET /healthz` or `GET /readyz` is served so).
pub(crate) fn probe_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(state)
}

/// Every request passes here once, after routing: browsers' cross-site
/// requests and foreign `Host`s are refused ([`edge::check`]), `/v1` and
/// `/metrics` need an API key ([`auth::check_key`]), a query parameter the
/// route does not take is refused ([`params::check`]), and each request is
/// counted by the route template it matched (never by the raw path, so
/// queue names and tokens do not blow up the label set; "unmatched" for
/// the fallbacks).
async fn gate(
    State(state): State<Arc<AppState>>,
    path: Option<axum::extract::MatchedPath>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let started = std::time::Instant::now();
    let route = path.as_ref().map_or("unmatched", |p| p.as_str());
    let mut request = request;
    let queue = path_queue(&mut request).await;
    let checked = edge::check(state.config.edge, &request)
        .and_then(|()| {
            let sessions = state.config.portal.sessions.as_deref();
            auth::check_key(&state.api_keys(), sessions, &request)
        })
        .and_then(|presented| {
            let need = scope::need(request.method(), route);
            let engine = state.engine.get();
            scope::authorize(&presented.grant, need, queue.as_deref(), engine)
                .inspect_err(|e| crate::metrics::record_scope_refusal(e.kind))?;
            params::check(request.method(), route, request.uri().query())?;
            request.extensions_mut().insert(presented);
            Ok(())
        });
    // Each call is a span, continuing the caller's trace (`telemetry.rs`).
    let span = crate::telemetry::span(|| {
        tracing::info_span!("http.request", otel.name = %format!("{} {route}", request.method()),
            http.request.method = %request.method(), http.route = route, otel.kind = "server")
    });
    let traceparent = request
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok());
    crate::telemetry::continue_trace(&span, traceparent);
    let response = async {
        match checked {
            Ok(()) => match in_cluster(&state, request).await {
                Ok(request) => json_rejection(next.run(request).await).await,
                Err(answer) => answer,
            },
            Err(e) => e.into_response(),
        }
    }
    .instrument(span)
    .await;
    crate::metrics::record_http(route, response.status().as_u16(), started.elapsed());
    response
}

/// The queue the path names (its `{q}`, decoded), for the scope check.
async fn path_queue(request: &mut axum::extract::Request) -> Option<String> {
    use axum::RequestPartsExt as _;
    use axum::extract::RawPathParams;
    let (mut parts, body) = std::mem::take(request).into_parts();
    let params = parts.extract::<RawPathParams>().await.ok();
    *request = axum::extract::Request::from_parts(parts, body);
    params?
        .iter()
        .find(|(name, _)| *name == "q")
        .map(|(_, value)| value.to_owned())
}

/// Replicated mode: a `/v1` call (but `/v1/cluster`) is served here only
/// on the serving primary; a follower relays it (`relay.rs`).
async fn in_cluster(
    state: &AppState,
    request: axum::extract::Request,
) -> Result<axum::extract::Request, Response> {
    let Some(cluster) = state.cluster() else {
        return Ok(request);
    };
    let path = request.uri().path();
    if !path.starts_with("/v1/") || path == "/v1/cluster" || path == "/v1/openapi.json" {
        return Ok(request);
    }
    let open = state.open_term.load(std::sync::atomic::Ordering::Acquire);
    let serving = state
        .engine
        .get()
        .is_some_and(|e| e.is_serving() && e.epoch() == open);
    let relay = state.relay.get_or_init(relay::Relay::new);
    relay::route(cluster, relay, serving, request).await
}

/// axum's extractors refuse what they cannot parse (a path segment that is
/// not UTF-8, say) with a plain-text 400; every error of the API is the
/// JSON `{kind, message}`, so such an answer is rewritten into one.
async fn json_rejection(response: Response) -> Response {
    let plain = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/plain"));
    if response.status() != StatusCode::BAD_REQUEST || !plain {
        return response;
    }
    // An extractor's message: a line or two.
    const REJECTION_BYTES_MAX: usize = 4 << 10;
    let body = http_body_util::Limited::new(response.into_body(), REJECTION_BYTES_MAX)
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    ApiError::bad_request(body).into_response()
}

async fn not_found() -> ApiError {
    ApiError::not_found()
}

async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}

#[utoipa::path(
    get, path = "/v1/openapi.json", operation_id = "openapi", tag = "operations",
    responses((status = 200, description = "this document", content_type = "application/json", body = Object))
)]
async fn openapi_json() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        openapi_document(),
    )
        .into_response()
}

#[utoipa::path(
    get, path = "/healthz", operation_id = "healthz", tag = "operations", security(()),
    responses((status = 200, description = "the process runs", body = StatusBody))
)]
async fn healthz() -> impl IntoResponse {
    (StatusCode::OK, axum::Json(StatusBody { status: "ok" }))
}

#[utoipa::path(
    get, path = "/readyz", operation_id = "readyz", tag = "operations", security(()),
    responses((status = 200, description = "ready to serve", body = ReadyBody), (status = 503, description = "not ready, and why: starting, stopping, storage failed, or (replicated) no primary known, clock skew named", body = ErrorBody))
)]
async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    match state.not_ready() {
        None => {
            let clock_step_ms = state.engine.get().map_or(0, |e| e.clock_step_ms());
            let clock_skew = state
                .cluster
                .get()
                .and_then(|c| c.clock_skew())
                .map(Into::into);
            let body = ReadyBody {
                status: "ready",
                clock_step_ms,
                clock_skew,
            };
            (StatusCode::OK, axum::Json(body)).into_response()
        }
        Some(why) => ApiError::unavailable(format!("not ready: {why}")).into_response(),
    }
}

/// Prometheus text (docs/contract.md §8), the state machine's numbers refreshed first.
#[utoipa::path(
    get, path = "/metrics", operation_id = "metrics", tag = "operations", security(()),
    responses((status = 200, description = "Prometheus text (docs/contract.md §8)", content_type = "text/plain", body = String))
)]
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let text = scrape::render(state.engine.get(), state.cluster());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// Reads a request body: at most `max_body_bytes`, within
/// [`BODY_READ_TIMEOUT`].
pub(crate) async fn read_body(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
    let limit = state.config.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::payload_too_large(limit));
    }
    let limited = http_body_util::Limited::new(body, limit as usize);
    match tokio::time::timeout(BODY_READ_TIMEOUT, limited.collect()).await {
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "bad_request",
            "the request body did not arrive in time",
        )),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ApiError::payload_too_large(limit))
        }
        Ok(Err(_)) => Err(ApiError::bad_request("the request body could not be read")),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

/// The pairs of a query string, percent-decoded (`application/x-www-form-urlencoded`).
pub(crate) fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

/// Most messages one redrive moves when `max` is not given (`remaining`
/// says what is left); a purge takes all unless told.
pub(crate) const BULK_DEFAULT: usize = 1000;

/// `max=N`: a positive number.
pub(crate) fn max_param(value: &str) -> Result<usize, ApiError> {
    value
        .parse::<usize>()
        .ok()
        .filter(|m| *m >= 1)
        .ok_or_else(|| ApiError::bad_request(format!("max = {value:?}: a positive number")))
}

/// A flag: `true`, `1` or empty (`?dryRun`), `false` or `0`.
pub(crate) fn bool_param(name: &str, value: &str) -> Result<bool, ApiError> {
    match value {
        "true" | "1" | "" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(ApiError::bad_request(format!(
            "{name} = {value:?}: true or false"
        ))),
    }
}

/// A number of seconds from a query parameter or header: finite, ≥ 0 and at
/// most `max`.
pub(crate) fn seconds_param(name: &str, value: &str, max: f64) -> Result<f64, ApiError> {
    match value.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && (0.0..=max).contains(&s) => Ok(s),
        _ => Err(ApiError::bad_request(format!(
            "{name} = {value:?} is not allowed: a number of seconds from 0 to {max}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings_decode() {
        let pairs = query_pairs(Some("max=5&id=a%20b&dryRun=true&x"));
        assert_eq!(
            pairs,
            vec![
                ("max".into(), "5".into()),
                ("id".into(), "a b".into()),
                ("dryRun".into(), "true".into()),
                ("x".into(), "".into())
            ]
        );
        assert_eq!(
            query_pairs(Some("a=%&b=%4&c=%zz&d=x+y")),
            vec![
                ("a".into(), "%".into()),
                ("b".into(), "%4".into()),
                ("c".into(), "%zz".into()),
                ("d".into(), "x y".into())
            ]
        );
    }

    #[test]
    fn seconds_params_are_bounded() {
        assert_eq!(seconds_param("wait", "20", 20.0).unwrap(), 20.0);
        assert_eq!(seconds_param("wait", "0.5", 20.0).unwrap(), 0.5);
        assert!(seconds_param("wait", "21", 20.0).is_err());
        assert!(seconds_param("wait", "-1", 20.0).is_err());
        assert!(seconds_param("wait", "NaN", 20.0).is_err());
    }
}
