//! The OpenAPI 3.1 document of the HTTP API, generated from the code: each
//! route's handler carries its `#[utoipa::path]` (method, path, parameters,
//! answers), the router registers handlers through
//! [`utoipa_axum::router::OpenApiRouter`] so that a route and its document
//! cannot drift apart, and the types below describe the JSON bodies.
//! Served at `GET /v1/openapi.json`; `spoold openapi` prints it, and
//! `docs/openapi.json` is a copy that a test keeps equal.

use serde::Serialize;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi, ToSchema};

/// The document's head: title, version, tags, and the two ways to pass an
/// API key. The paths come from the router ([`super::api_router`]).
#[derive(OpenApi)]
#[openapi(
    info(
        title = "spoold",
        description = "A durable local spool: every 2xx that stores or removes something is answered only after the fsync that covers it. The contract is docs/contract.md.",
        license(name = "MIT OR Apache-2.0"),
    ),
    paths(forward, forward_by_header),
    modifiers(&Security, &ForwardIds),
    security(("apiKey" = []), ("bearer" = [])),
    tags(
        (name = "queues", description = "Create, change, list and delete queues; pause, resume, redrive."),
        (name = "messages", description = "Send, peek, cancel, purge and tail messages."),
        (name = "events", description = "Publish an event to every queue that subscribes to its type."),
        (name = "history", description = "Delivered messages kept by a queue: list, show, resend."),
        (name = "leases", description = "Receive with a lease, then ack, nack or renew it."),
        (name = "forward", description = "Store a whole HTTP request for a push queue's destination."),
        (name = "operations", description = "Probes, metrics and this document (no key needed)."),
        (name = "portal", description = "Links to the customer portal, and what a key or session may do."),
    )
)]
pub(crate) struct ApiDoc;

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "apiKey",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "Spooler-Api-Key",
                "One of server.api_keys (or SPOOLD_API_KEYS); not needed on loopback without keys. A scoped key has a role (admin, publisher, consumer, reader), and may be kept to a tenant's push queues and to queue-name patterns: each operation's security lists what it needs (read, publish, consume, manage, or operator: an admin key without tenant or patterns). A queue outside the key's scope is answered as one that does not exist.",
            ))),
        );
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The same key as `Authorization: Bearer KEY` (not on /v1/forward, whose Authorization header is the destination's).",
                    ))
                    .build(),
            ),
        );
    }
}

/// The forward route's operations share one description but each needs an
/// id of its own: `forwardPost`, `forwardPut`, …
struct ForwardIds;

impl Modify for ForwardIds {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (path, stem) in [
            ("/v1/forward/{q}/{path}", "forward"),
            ("/v1/forward/{q}", "forwardByHeader"),
        ] {
            let Some(item) = openapi.paths.paths.get_mut(path) else {
                continue;
            };
            for (method, op) in [
                ("Get", &mut item.get),
                ("Post", &mut item.post),
                ("Put", &mut item.put),
                ("Patch", &mut item.patch),
                ("Delete", &mut item.delete),
            ] {
                if let Some(op) = op {
                    op.operation_id = Some(format!("{stem}{method}"));
                }
            }
        }
    }
}

/// Every error: `{"kind", "message"}` (docs/contract.md §4 lists the kinds).
#[derive(Serialize, ToSchema)]
pub(crate) struct ErrorBody<'a> {
    /// A stable word to match on: `queue_not_found`, `stale_lease`, `spool_full`, …
    pub kind: &'a str,
    /// For people.
    pub message: &'a str,
}

/// The refusals every route of the API can answer, in each route's
/// `responses(…)`.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // describes `ApiError`'s answers
pub(crate) enum Refused<'a> {
    #[response(status = "4XX", description = "refused: the `kind` says why")]
    Client(ErrorBody<'a>),
    #[response(
        status = "5XX",
        description = "unavailable (starting, storage failed, …)"
    )]
    Server(ErrorBody<'a>),
}

/// The answer to a send or forward.
#[derive(Serialize, ToSchema)]
pub(crate) struct StoredBody<'a> {
    /// The message id (also the `Spooler-Delivery-Id` of its deliveries).
    pub id: &'a str,
    pub queue: &'a str,
}

/// `{"messages": […]}`: a peek or a batch receive.
#[derive(ToSchema)]
#[allow(dead_code)] // the shape of `messages::Messages`, for the document
pub(crate) struct MessagesBody {
    messages: Vec<super::view::MessageJson<'static>>,
    /// A peek that may have more: pass it as `after` for the next page
    /// (absent when this page holds the last message). A search's page
    /// may end before its `limit` (its byte or time budget): go on from
    /// `next`.
    next: Option<String>,
    /// A peek with search terms: messages whose records were read.
    scanned: Option<u64>,
    /// A peek with a `match` term: bodies too large to parse (over 1 MiB),
    /// not searched.
    unsearched: Option<u64>,
}

/// What a redrive did (with `dryRun`, would do).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RedriveBody {
    pub moved: u64,
    /// Dead letters the filter selected.
    pub matched: u64,
    /// Still matching afterwards: leased, or beyond `max`.
    pub remaining: u64,
    pub dry_run: bool,
}

/// What a purge did (with `dryRun`, would do).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PurgeBody {
    pub purged: u64,
    pub matched: u64,
    pub remaining: u64,
    pub dry_run: bool,
}

/// A renewed lease's new expiry (RFC 3339).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RenewBody {
    pub lease_expires_at: String,
}

/// `{"status": "ok"}` or `{"status": "ready"}`.
#[derive(Serialize, ToSchema)]
pub(crate) struct StatusBody {
    pub status: &'static str,
}

/// A clock skew with a peer (`GET /v1/cluster`, `/readyz`).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ClockSkewView {
    pub node_id: u64,
    pub skew_ms: u64,
}

impl From<crate::cluster::ClockSkew> for ClockSkewView {
    fn from(c: crate::cluster::ClockSkew) -> ClockSkewView {
        ClockSkewView {
            node_id: c.node_id,
            skew_ms: c.skew_ms,
        }
    }
}

/// `GET /readyz`'s answer when ready.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReadyBody {
    pub status: &'static str,
    /// How far the host's wall clock has stepped from spoold's steady
    /// clock, in ms (0 when they agree within a second): timers run on
    /// the steady clock, so a step moves none of them.
    pub clock_step_ms: i64,
    /// Replicated mode: a clock skew with a peer past the replay window,
    /// found by refused replication in the last 10 s (as in `GET
    /// /v1/cluster`); absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock_skew: Option<ClockSkewView>,
}

/// A queue in the path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct QueuePath {
    /// The queue's name (its failure queue is `NAME.failed`).
    q: String,
}

/// A message in the path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct MessagePath {
    q: String,
    /// A message id, as a send answered it.
    id: String,
}

/// A lease in the path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct LeasePath {
    q: String,
    /// The `Spooler-Lease-Token` of a receive.
    token: String,
}

/// The dead-letter filters (docs/contract.md §4), combined with AND.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct DeadLetterQuery {
    /// `retries_exhausted`, `permanent_status` or `expired`.
    reason: Option<String>,
    /// The last HTTP status (`503`) or a class (`5xx`).
    status: Option<String>,
    /// Failed at or after (RFC 3339).
    since: Option<String>,
    /// Failed before (RFC 3339).
    until: Option<String>,
    /// Only these ids (repeat the parameter).
    id: Option<Vec<String>>,
}

/// Search terms on what messages carry (docs/contract.md §4 "Search"),
/// combined with AND; each candidate's record is read, at most 10 000 a
/// page.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct SearchQuery {
    /// Only deliveries of events of this type.
    #[param(rename = "type")]
    event_type: Option<String>,
    /// Only deliveries of events of this tenant.
    tenant: Option<String>,
    /// Only messages whose body contains this text.
    contains: Option<String>,
    /// Only JSON bodies with this value at this path: `$.customer.id=42`.
    #[param(rename = "match")]
    json_match: Option<String>,
}

/// `max` and `dryRun` of a redrive or purge.
#[derive(IntoParams)]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
#[allow(dead_code)]
pub(crate) struct BulkQueryParams {
    /// Act on at most this many (oldest first).
    max: Option<u64>,
    /// Only count; change nothing.
    dry_run: Option<bool>,
}

/// The headers a forward takes besides those it stores.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)] // describes what `messages::forward` reads
struct ForwardHeaders {
    /// Dedup key (the queue needs a dedup window).
    #[param(rename = "Spooler-Idempotency-Key")]
    idempotency_key: Option<String>,
    /// Seconds before the first attempt.
    #[param(rename = "Spooler-Delay")]
    delay: Option<f64>,
    /// The API key (`Authorization` belongs to the destination here).
    #[param(rename = "Spooler-Api-Key")]
    api_key: Option<String>,
}

/// A forward's answer.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // describes `messages::forward`'s answer
enum Forwarded<'a> {
    #[response(status = 202, description = "stored (durable)", headers(("Spooler-Delivery-Id" = String)))]
    Stored(StoredBody<'a>),
}

// The forward route takes any method and a path of any depth, which a
// `#[utoipa::path]` cannot register; it is described here and routed in
// `super::router` (`tests/http/openapi.rs` checks both agree). A `//` comment:
// a doc comment would become the operations' summary.
#[utoipa::path(
    method(get, post, put, patch, delete),
    path = "/v1/forward/{q}/{path}",
    tag = "forward",
    summary = "Store a whole HTTP request for the queue's destination",
    params(
        QueuePath,
        ("path" = String, Path, description = "Appended to the destination's path; may hold slashes, never `..`."),
        ForwardHeaders,
    ),
    description = "Store the whole request (method, path, query, headers, body) for the push queue's destination + `/{path}?{query}`; spoold's workers deliver it with retries. Answered after the fsync.",
    request_body(content = Vec<u8>, content_type = "*/*"),
    responses(Forwarded, Refused),
    security(("apiKey" = [])),
)]
#[allow(dead_code)]
fn forward() {}

// The same, with the forwarded path in a header: what generated clients
// send, since they percent-encode the slashes of a path parameter.
#[utoipa::path(
    method(get, post, put, patch, delete),
    path = "/v1/forward/{q}",
    tag = "forward",
    summary = "Store a whole HTTP request, its path in a header",
    params(
        QueuePath,
        ("Spooler-Forward-Path" = Option<String>, Header, description = "Appended to the destination's path, with its query (`/v1/charges?x=1`); the URL then has no path or query of its own. Never `..`."),
        ForwardHeaders,
    ),
    description = "As `/v1/forward/{q}/{path}`, the path and query after the destination taken from `Spooler-Forward-Path` (for clients that cannot send slashes in a path parameter). Answered after the fsync.",
    request_body(content = Vec<u8>, content_type = "*/*"),
    responses(Forwarded, Refused),
    security(("apiKey" = [])),
)]
#[allow(dead_code)]
fn forward_by_header() {}
