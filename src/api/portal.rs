//! The customer portal (docs/contract.md §4, "The portal"): links that
//! open one tenant's own page, and the page.
//!
//! `POST /v1/portal/sessions` (an operator's key) signs a session for a
//! tenant (`session.rs`) and answers with its token and a link to
//! `/portal/#token=…`. The page is three static files compiled into the
//! binary, like the console's, and the console's `dom.js`; it reads the
//! token from the link's fragment (never sent to a server, never in a log) and calls `/v1` with
//! it, same-origin. Its API calls are a scoped key's like any other.
//!
//! The page may be opened from another site (a link, or an iframe of the
//! origins in `portal.frame_ancestors`): its `GET`s are exempt from the
//! edge's cross-site refusal (`edge.rs`); nothing else is.

use std::sync::Arc;

use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::Presented;
use super::error::ApiError;
use super::openapi::Refused;
use super::session::{Capability, Claims, Sessions, unix_now};
use super::{AppState, read_body};
use crate::config::PortalConfig;
use crate::spool::event::tenant_problem;

const INDEX: &str = include_str!("portal/index.html");
const APP: &str = include_str!("portal/app.js");
const STYLE: &str = include_str!("portal/style.css");

/// What the server knows of the portal.
#[derive(Debug, Clone, Default)]
pub(crate) struct PortalPolicy {
    /// Set with `portal.secret` (or `SPOOLD_PORTAL_SECRET`).
    pub sessions: Option<Arc<Sessions>>,
    url: Option<String>,
    /// The page's CSP `frame-ancestors` value.
    frame_ancestors: String,
    ttl_max_secs: u64,
    /// `theme.css`: the config's theme as CSS variables.
    theme: String,
}

impl PortalPolicy {
    pub(crate) fn from_config(config: &PortalConfig, env_secret: Option<&str>) -> PortalPolicy {
        let frame_ancestors = if config.frame_ancestors.is_empty() {
            "'none'".to_owned()
        } else {
            format!("'self' {}", config.frame_ancestors.join(" "))
        };
        let vars: String = config
            .theme
            .iter()
            .map(|(k, v)| format!("  --{k}: {v};\n"))
            .collect();
        PortalPolicy {
            sessions: config
                .secret_in_force(env_secret)
                .map(|s| Arc::new(Sessions::new(&s))),
            url: config.url.clone(),
            frame_ancestors,
            ttl_max_secs: config.session_ttl_max_ms / 1000,
            theme: format!(":root {{\n{vars}}}\n"),
        }
    }
}

/// `POST /v1/portal/sessions`'s body.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct SessionRequest {
    tenant: String,
    /// How long the link works (default 1 h, at most `portal.session_ttl_max`).
    #[serde(default)]
    ttl_seconds: Option<u64>,
    /// What the customer may do (default all three).
    #[serde(default)]
    capabilities: Option<Vec<Capability>>,
    /// Queue-name globs the session is kept to (default: every queue of
    /// the tenant).
    #[serde(default)]
    queues: Vec<String>,
}

/// A session: its token, the link that carries it, and when it ends.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SessionView {
    /// `Authorization: Bearer <token>` on `/v1` (the page does this).
    token: String,
    /// The portal page for the tenant, the token in its fragment.
    url: String,
    tenant: String,
    capabilities: Vec<Capability>,
    /// RFC 3339.
    expires_at: String,
}

/// Most queue patterns a session carries (each is in its token).
const SESSION_PATTERNS_MAX: usize = 16;

/// Default session length.
const TTL_DEFAULT_SECS: u64 = 3600;

/// `POST /v1/portal/sessions`
#[utoipa::path(
    post, path = "/v1/portal/sessions", operation_id = "createPortalSession", tag = "portal",
    description = "A link to the customer portal for one tenant (an operator's key): a token signed with `portal.secret` that stands for the tenant's own key (its push queues only, with the capabilities given) until it ends. `409 portal_disabled` without a secret.",
    request_body(content = SessionRequest, content_type = "application/json"),
    responses((status = 201, body = SessionView), Refused)
)]
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let policy = &state.config.portal;
    let sessions = policy.sessions.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "portal_disabled",
            "the portal has no secret: set portal.secret or SPOOLD_PORTAL_SECRET",
        )
    })?;
    let bytes = read_body(&state, &headers, body).await?;
    let asked: SessionRequest = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "a session is {{\"tenant\", \"ttlSeconds\"?, \"capabilities\"?, \"queues\"?}}: {e}"
        ))
    })?;
    let ttl = check_session(&asked, policy.ttl_max_secs)?;
    let capabilities = asked
        .capabilities
        .unwrap_or_else(|| Capability::ALL.to_vec());
    let claims = Claims {
        tenant: asked.tenant.clone(),
        capabilities: capabilities.clone(),
        queues: asked.queues,
        expires: unix_now() + ttl,
        nonce: rand::random(),
    };
    let token = sessions.sign(&claims);
    let base = portal_base(policy, &headers);
    let view = SessionView {
        url: format!("{base}/portal/#token={token}"),
        token,
        tenant: asked.tenant,
        capabilities,
        expires_at: crate::time::format_rfc3339(claims.expires as i64 * 1000),
    };
    Ok((StatusCode::CREATED, axum::Json(view)).into_response())
}

/// Refuses a session asked for with a bad tenant, too many or bad queue
/// patterns, or a lifetime out of range; else its lifetime in seconds.
fn check_session(asked: &SessionRequest, ttl_max_secs: u64) -> Result<u64, ApiError> {
    if let Some(why) = tenant_problem(&asked.tenant) {
        return Err(ApiError::bad_request(format!("tenant: {why}")));
    }
    if asked.queues.len() > SESSION_PATTERNS_MAX {
        return Err(ApiError::bad_request(format!(
            "queues: at most {SESSION_PATTERNS_MAX} patterns"
        )));
    }
    if let Some(why) = asked
        .queues
        .iter()
        .find_map(|p| crate::config::queue_pattern_problem(p))
    {
        return Err(ApiError::bad_request(format!("queues: {why}")));
    }
    let ttl = asked.ttl_seconds.unwrap_or(TTL_DEFAULT_SECS);
    if ttl == 0 || ttl > ttl_max_secs {
        return Err(ApiError::bad_request(format!(
            "ttlSeconds = {ttl}: allowed 1 to {ttl_max_secs} (portal.session_ttl_max)"
        )));
    }
    Ok(ttl)
}

/// Where the portal's links point: `portal.url`, else this server as the
/// request's `Host` names it.
fn portal_base(policy: &PortalPolicy, headers: &HeaderMap) -> String {
    match &policy.url {
        Some(url) => url.trim_end_matches('/').to_owned(),
        None => {
            let host = headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("localhost");
            format!("http://{host}")
        }
    }
}

/// Who the caller is: a key's or a session's scope.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WhoView {
    /// Set: only this tenant's push queues and events.
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant: Option<String>,
    /// `read`, `publish`, `consume`, `manage`.
    may: Vec<&'static str>,
    /// Queue-name globs; empty: every name.
    queues: Vec<String>,
    /// A portal session: when it ends (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<String>,
}

/// `GET /v1/portal/session`
#[utoipa::path(
    get, path = "/v1/portal/session", operation_id = "whoAmI", tag = "portal",
    description = "What the key or portal session of this call may do: its tenant, verbs, queue patterns and (a session) its end.",
    responses((status = 200, body = WhoView), Refused)
)]
pub(crate) async fn who(Extension(presented): Extension<Presented>) -> Response {
    let grant = &presented.grant;
    axum::Json(WhoView {
        tenant: grant.tenant().map(str::to_owned),
        may: grant.verbs(),
        queues: grant.queues().to_vec(),
        expires_at: presented
            .session_ends
            .map(|s| crate::time::format_rfc3339(s as i64 * 1000)),
    })
    .into_response()
}

/// Every portal file's headers: scripts and styles only from here, framed
/// only by the listed origins, nothing cached across versions.
fn file(policy: &PortalPolicy, content_type: &'static str, body: String) -> Response {
    let csp = format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
         img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors {}",
        policy.frame_ancestors
    );
    let mut response = (
        [
            (header::CONTENT_TYPE, content_type),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_str(&csp).expect("checked origins make a header"),
    );
    if policy.frame_ancestors == "'none'" {
        headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
    response
}

#[utoipa::path(
    get, path = "/portal/", operation_id = "portal", tag = "portal", security(()),
    description = "The customer portal (HTML): opened from a session's link, it works for that session's tenant only.",
    responses((status = 200, description = "the portal's page", content_type = "text/html", body = String))
)]
pub(crate) async fn index(State(state): State<Arc<AppState>>) -> Response {
    file(
        &state.config.portal,
        "text/html; charset=utf-8",
        INDEX.into(),
    )
}

#[utoipa::path(
    get, path = "/portal/{asset}", operation_id = "portalAsset", tag = "portal", security(()),
    params(("asset" = String, Path, description = "`app.js`, `dom.js` (the console's, `console/dom.js`), `style.css` or `theme.css`")),
    responses(
        (status = 200, description = "the portal's script or style sheet", content_type = "text/plain", body = String),
        (status = 404, description = "no such file", body = super::openapi::ErrorBody),
    )
)]
pub(crate) async fn asset(
    State(state): State<Arc<AppState>>,
    Path(asset): Path<String>,
) -> Response {
    let policy = &state.config.portal;
    match asset.as_str() {
        "app.js" => file(policy, "text/javascript; charset=utf-8", APP.into()),
        "dom.js" => file(
            policy,
            "text/javascript; charset=utf-8",
            super::console::DOM.into(),
        ),
        "style.css" => file(policy, "text/css; charset=utf-8", STYLE.into()),
        "theme.css" => file(policy, "text/css; charset=utf-8", policy.theme.clone()),
        _ => ApiError::not_found().into_response(),
    }
}
