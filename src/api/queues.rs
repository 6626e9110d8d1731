//! Queue routes: list, get, create/update, delete, redrive, pause, resume.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::auth::Presented;
use super::error::ApiError;
use super::filter::BulkQuery;
use super::openapi::{BulkQueryParams, DeadLetterQuery, QueuePath, RedriveBody, Refused};
use super::scope::Grant;
use super::settings::{
    SettingsBody, SettingsRefusal, SettingsView, StatsView, render, render_stats,
};
use super::{AppState, BULK_DEFAULT, query_pairs, read_body};
use crate::engine::{Engine, Origin};
use crate::spool::QueueSettings;

fn queue_json(engine: &Engine, name: &str) -> Result<QueueView, ApiError> {
    let (settings, managed) = engine.queue_settings(name)?;
    let stats = engine.stats(name)?;
    Ok(QueueView {
        name: name.to_owned(),
        warnings: Vec::new(),
        managed_by_config: managed,
        settings: render(&settings),
        stats: render_stats(&stats, &settings),
    })
}

/// A queue: its settings and its stats.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct QueueView {
    name: String,
    /// What a change did that the caller may not expect (secrets dropped
    /// because the destination moved to another origin); absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
    /// Defined in the config file: change it there.
    managed_by_config: bool,
    settings: SettingsView,
    stats: StatsView,
}

/// `{"queues": […], "next"?}`, failure queues included.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub(crate) struct QueueList {
    queues: Vec<QueueView>,
    /// More follow: the `after` of the next page (paged lists only).
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<String>,
}

/// Most queues a page of `GET /v1/queues` holds.
pub(crate) const QUEUE_PAGE_MAX: usize = 1000;

/// `GET /v1/queues`'s query: which queues, and which page.
#[derive(Debug, Default)]
struct ListQuery {
    prefix: String,
    tenant: Option<String>,
    /// An event type: queues whose patterns take it.
    events: Option<String>,
    /// Unset: every queue, in one answer.
    limit: Option<usize>,
    after: Option<String>,
}

impl ListQuery {
    fn parse(raw: Option<&str>) -> Result<ListQuery, ApiError> {
        let mut q = ListQuery::default();
        for (name, value) in query_pairs(raw) {
            let bad = |what: String| ApiError::bad_request(format!("{name}: {what}"));
            match name.as_str() {
                "prefix" => q.prefix = value,
                "tenant" => {
                    if let Some(why) = crate::spool::event::tenant_problem(&value) {
                        return Err(bad(why));
                    }
                    q.tenant = Some(value);
                }
                "events" => {
                    if let Some(why) = crate::spool::event::event_type_problem(&value) {
                        return Err(bad(why));
                    }
                    q.events = Some(value);
                }
                "limit" => {
                    let n = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=QUEUE_PAGE_MAX).contains(n));
                    q.limit = Some(n.ok_or_else(|| bad(format!("1 to {QUEUE_PAGE_MAX}")))?);
                }
                "after" => q.after = Some(value),
                _ => return Err(bad("unknown".into())),
            }
        }
        Ok(q)
    }

    /// Whether queue `name` with (its own queue's) `settings` is listed
    /// for `grant`.
    fn keeps(&self, grant: &Grant, name: &str, settings: &QueueSettings, managed: bool) -> bool {
        let owner = crate::engine::QueueOwner {
            push: settings.is_push(),
            tenant: settings.tenant.clone(),
            managed_by_config: managed,
        };
        let events = self.events.as_deref().is_none_or(|t| {
            settings
                .events
                .iter()
                .any(|p| crate::spool::event::pattern_matches(p, t))
        });
        events
            && self
                .tenant
                .as_ref()
                .is_none_or(|t| settings.tenant.as_ref() == Some(t))
            && grant.reaches(name, Some(&owner))
    }
}

/// `GET /v1/queues`
#[utoipa::path(
    get, path = "/v1/queues", operation_id = "listQueues", tag = "queues",
    params(
        ("prefix" = Option<String>, Query, description = "Only queues whose name starts with this."),
        ("tenant" = Option<String>, Query, description = "Only the push queues of this tenant (and their failure queues)."),
        ("events" = Option<String>, Query, description = "Only queues whose `events` patterns take this event type."),
        ("limit" = Option<u32>, Query, description = "A page of at most this many (1 to 1000); without it, every queue in one answer."),
        ("after" = Option<String>, Query, description = "Page: the `next` of the page before (queues are in name order)."),
    ),
    description = "Queues with their settings and stats, failure queues included, in name order; a scoped key sees only those in its scope.",
    responses((status = 200, body = QueueList), Refused)
)]
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    RawQuery(raw): RawQuery,
    Extension(presented): Extension<Presented>,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let q = ListQuery::parse(raw.as_deref())?;
    let grant = &presented.grant;
    let (names, more) = engine.queue_page(
        q.after.as_deref(),
        &q.prefix,
        q.limit.unwrap_or(usize::MAX),
        |name, settings, managed| q.keeps(grant, name, settings, managed),
    );
    let queues: Vec<QueueView> = names
        .iter()
        // A queue deleted between the list and the lookup is skipped.
        .filter_map(|name| queue_json(engine, name).ok())
        .collect();
    let next = more.then(|| names.last().cloned()).flatten();
    Ok(axum::Json(QueueList { queues, next }).into_response())
}

/// `GET /v1/queues/{q}`
#[utoipa::path(
    get, path = "/v1/queues/{q}", operation_id = "getQueue", tag = "queues", params(QueuePath),
    responses((status = 200, body = QueueView), Refused)
)]
pub(crate) async fn get_one(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
) -> Result<Response, ApiError> {
    Ok(axum::Json(queue_json(state.engine()?, &queue)?).into_response())
}

/// `PUT /v1/queues/{q}`: the body replaces the whole settings object.
#[utoipa::path(
    put, path = "/v1/queues/{q}", operation_id = "putQueue", tag = "queues", params(QueuePath,
        ("keepSecrets" = Option<bool>, Query, description = "A destination moved to another origin keeps the signing secret (static headers never go with it); without it such a move is `409 secrets_would_move` while a secret would be left behind.")),
    description = "Create or replace a queue's settings (omitted fields take their defaults; `signingSecret` omitted keeps, `null` clears).",
    request_body(content = SettingsBody, content_type = "application/json"),
    responses((status = 201, description = "created", body = QueueView), (status = 200, description = "changed", body = QueueView), Refused)
)]
pub(crate) async fn put(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
    RawQuery(query): RawQuery,
    Extension(presented): Extension<Presented>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let bytes = read_body(&state, &headers, body).await?;
    let parsed: SettingsBody = if bytes.iter().all(u8::is_ascii_whitespace) {
        SettingsBody::default()
    } else {
        serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_request(format!("invalid queue settings: {e}")))?
    };
    let previous = engine.queue_settings(&queue).ok().map(|(s, _)| s);
    let keep = keep_secrets(query.as_deref())?;
    let asked = Asked {
        previous: previous.as_ref(),
        keep_secrets: keep,
        grant: &presented.grant,
    };
    store(engine, &queue, parsed, asked).await
}

/// `?keepSecrets=true`: a move to another origin keeps the signing secret.
fn keep_secrets(query: Option<&str>) -> Result<bool, ApiError> {
    match query_pairs(query)
        .into_iter()
        .find(|(k, _)| k == "keepSecrets")
    {
        None => Ok(false),
        Some((_, v)) => v
            .parse()
            .map_err(|_| ApiError::bad_request(format!("keepSecrets = {v:?}: true or false"))),
    }
}

/// What a `PUT` or `PATCH` asks beyond its body.
struct Asked<'a> {
    /// The queue's settings now, if it exists.
    previous: Option<&'a QueueSettings>,
    keep_secrets: bool,
    /// What the caller's key may do.
    grant: &'a Grant,
}

/// Stores the settings `body` asks for and answers with the queue: `201`
/// if it is new, else `200`; `warnings` say what the change dropped.
async fn store(
    engine: &Engine,
    queue: &str,
    body: SettingsBody,
    asked: Asked<'_>,
) -> Result<Response, ApiError> {
    let sets_history = body.sets_history();
    let (mut settings, warnings) = body
        .into_settings(asked.previous, asked.keep_secrets)
        .map_err(|refused| match refused {
            SettingsRefusal::Invalid(problem) => ApiError::bad_request(problem.to_string()),
            SettingsRefusal::SecretsWouldMove(why) => {
                ApiError::new(StatusCode::CONFLICT, "secrets_would_move", why)
            }
        })?;
    if !sets_history {
        engine.policy().history_default.fill(&mut settings);
    }
    fit_to_grant(asked.grant, &mut settings)?;
    // Every rule (bounds, destinations, who owns the queue) is the engine's.
    let created = engine.upsert_queue(queue, settings, Origin::Api).await?;
    for warning in &warnings {
        tracing::warn!(queue = %queue, "{warning}");
    }
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let view = QueueView {
        warnings,
        ..queue_json(engine, queue)?
    };
    Ok((status, axum::Json(view)).into_response())
}

/// A tenant's key makes and changes only its tenant's queues: a queue it
/// writes without a tenant gets the key's, and another tenant is `403`.
/// (Files on the server, `caFile` and the like, no key names over the
/// API: the engine's rules refuse them for every caller.)
fn fit_to_grant(grant: &Grant, settings: &mut QueueSettings) -> Result<(), ApiError> {
    let Some(tenant) = grant.tenant() else {
        return Ok(());
    };
    match &settings.tenant {
        None => settings.tenant = Some(tenant.to_owned()),
        Some(t) if t == tenant => {}
        Some(t) => {
            return Err(ApiError::forbidden(format!(
                "tenant: this key is tenant {tenant:?}'s and cannot set {t:?}"
            )));
        }
    }
    Ok(())
}

/// `PATCH /v1/queues/{q}`: an RFC 7396 merge patch of the settings.
#[utoipa::path(
    patch, path = "/v1/queues/{q}", operation_id = "patchQueue", tag = "queues", params(QueuePath,
        ("keepSecrets" = Option<bool>, Query, description = "As for `PUT`.")),
    description = "Change some of a queue's settings (RFC 7396 JSON merge patch of the settings object as GET shows it): what the patch leaves out stays, `null` resets a field to its default (`signingSecret: null` clears it).",
    request_body(content = Object, content_type = "application/merge-patch+json"),
    responses((status = 200, description = "changed", body = QueueView), Refused)
)]
pub(crate) async fn patch(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
    RawQuery(query): RawQuery,
    Extension(presented): Extension<Presented>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let bytes = read_body(&state, &headers, body).await?;
    let patch: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid merge patch: {e}")))?;
    let (previous, _) = engine.queue_settings(&queue)?;
    let merged = SettingsBody::merged(&previous, &patch)
        .map_err(|e| ApiError::bad_request(format!("invalid queue settings: {e}")))?;
    let asked = Asked {
        previous: Some(&previous),
        keep_secrets: keep_secrets(query.as_deref())?,
        grant: &presented.grant,
    };
    store(engine, &queue, merged, asked).await
}

/// `DELETE /v1/queues/{q}`
#[utoipa::path(
    delete, path = "/v1/queues/{q}", operation_id = "deleteQueue", tag = "queues", params(QueuePath),
    description = "Delete a queue, its failure queue and their messages.",
    responses((status = 204, description = "deleted (durable)"), Refused)
)]
pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.engine()?.delete_queue(&queue, Origin::Api).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/queues/{q}/redrive?max=N&dryRun=true` and the dead-letter
/// filters; `{q}` may name the failure queue too.
#[utoipa::path(
    post, path = "/v1/queues/{q}/redrive", operation_id = "redrive", tag = "queues", params(QueuePath, DeadLetterQuery, BulkQueryParams),
    description = "Move dead letters of `q.failed` back into `q` (oldest first, at most `max`, default 1000), retry counts reset, same ids. `q` may also name the failure queue.",
    responses((status = 200, body = RedriveBody), Refused)
)]
pub(crate) async fn redrive(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    let q = BulkQuery::parse(engine, query.as_deref())?;
    let max = q.max.unwrap_or(BULK_DEFAULT);
    let done = engine.redrive(&queue, &q.filter, max, q.dry_run).await?;
    Ok(axum::Json(RedriveBody {
        moved: done.done,
        matched: done.matched,
        remaining: done.remaining,
        dry_run: q.dry_run,
    })
    .into_response())
}

/// `POST /v1/queues/{q}/pause`
#[utoipa::path(
    post, path = "/v1/queues/{q}/pause", operation_id = "pauseQueue", tag = "queues", params(QueuePath),
    description = "Stop handing out leases (push workers included); journaled.",
    responses((status = 204, description = "paused (durable)"), Refused)
)]
pub(crate) async fn pause(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.engine()?.set_paused(&queue, true).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/queues/{q}/resume`
#[utoipa::path(
    post, path = "/v1/queues/{q}/resume", operation_id = "resumeQueue", tag = "queues", params(QueuePath),
    description = "Hand out leases again (durable); an open circuit breaker is closed too, so a push queue delivers at once.",
    responses((status = 204, description = "resumed (durable)"), Refused)
)]
pub(crate) async fn resume(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
) -> Result<StatusCode, ApiError> {
    let engine = state.engine()?;
    engine.set_paused(&queue, false).await?;
    engine.set_breaker(&queue, None);
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/queues/{q}/breaker/probe`
#[utoipa::path(
    post, path = "/v1/queues/{q}/breaker/probe", operation_id = "probeBreaker", tag = "queues", params(QueuePath),
    description = "While the circuit breaker is open, send its probe now (with the queue's settings as they are) instead of when it is due. The answer is the queue; `stats.breakerOpen` false means there was nothing to probe.",
    responses((status = 200, body = QueueView), Refused)
)]
pub(crate) async fn probe_breaker(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
) -> Result<Response, ApiError> {
    on_breaker(&state, &queue, |engine| {
        if engine.breaker(&queue).is_some() {
            engine.set_breaker(&queue, Some(engine.clock_ms()));
        }
    })
}

/// `POST /v1/queues/{q}/breaker/close`
#[utoipa::path(
    post, path = "/v1/queues/{q}/breaker/close", operation_id = "closeBreaker", tag = "queues", params(QueuePath),
    description = "Close the circuit breaker without a probe: delivery resumes at once, its failure count starts afresh (not journaled: the breaker is memory only).",
    responses((status = 200, body = QueueView), Refused)
)]
pub(crate) async fn close_breaker(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
) -> Result<Response, ApiError> {
    on_breaker(&state, &queue, |engine| engine.set_breaker(&queue, None))
}

/// Does `act` to the breaker of `queue` (which must exist) and answers
/// with the queue as it is then.
fn on_breaker(
    state: &AppState,
    queue: &str,
    act: impl FnOnce(&Engine),
) -> Result<Response, ApiError> {
    let engine = state.engine()?;
    queue_json(engine, queue)?;
    act(engine);
    Ok(axum::Json(queue_json(engine, queue)?).into_response())
}
