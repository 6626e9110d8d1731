//! The web console at `/ui`: six static files compiled into the binary
//! (no build step, no CDN), a client of the `/v1` API like any other. The
//! files carry no data, so they are served without a key; the console asks
//! for one and sends it with every `/v1` call (kept in the tab's session
//! storage, never in a URL).

use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

const INDEX: &str = include_str!("console/index.html");
const APP: &str = include_str!("console/app.js");
const STYLE: &str = include_str!("console/style.css");
const CHARTS: &str = include_str!("console/charts.js");
const FAVICON: &str = include_str!("console/favicon.svg");
/// The DOM helper the console and the portal share (`portal.rs` serves it
/// too).
pub(crate) const DOM: &str = include_str!("console/dom.js");

/// What every console file is sent with: no sniffing, no framing by other
/// sites, scripts only from here, and no caching across versions.
fn file(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
            ),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

#[utoipa::path(
    get, path = "/ui", operation_id = "console", tag = "operations", security(()),
    description = "The web console (HTML); it asks for an API key and calls /v1 with it.",
    responses((status = 200, description = "the console's page", content_type = "text/html", body = String))
)]
pub(crate) async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX)
}

#[utoipa::path(
    get, path = "/ui/{asset}", operation_id = "consoleAsset", tag = "operations", security(()),
    params(("asset" = String, Path, description = "`app.js`, `charts.js`, `dom.js`, `style.css` or `favicon.svg`")),
    responses(
        (status = 200, description = "the console's script or style sheet", content_type = "text/plain", body = String),
        (status = 404, description = "no such file", body = super::openapi::ErrorBody),
    )
)]
pub(crate) async fn asset(Path(asset): Path<String>) -> Response {
    match asset.as_str() {
        "app.js" => file("text/javascript; charset=utf-8", APP),
        "style.css" => file("text/css; charset=utf-8", STYLE),
        "charts.js" => file("text/javascript; charset=utf-8", CHARTS),
        "dom.js" => file("text/javascript; charset=utf-8", DOM),
        "favicon.svg" => file("image/svg+xml", FAVICON),
        _ => ApiError::not_found().into_response(),
    }
}
