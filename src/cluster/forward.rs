//! A follower's `/v1` calls: relayed to the primary (streaming both ways,
//! long polls and `tail` included) with `Spooler-Primary` added, or
//! answered `421 not_primary` (`forward_to_primary = false`), or `503`
//! while no primary is known. A relayed call reaching a replica that is
//! not the primary either is answered `421`: one hop at most.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

use super::Cluster;
use crate::api::error::ApiError;

/// Marks a relayed call.
const FORWARDED_HEADER: &str = "spooler-forwarded";
/// Names the primary's API on every relayed answer and every `421`.
pub(crate) const PRIMARY_HEADER: &str = "spooler-primary";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Headers of one hop only, never relayed.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
    )
}

/// The pooled client a follower relays with.
pub(crate) struct Forwarder {
    client: reqwest::Client,
}

impl Forwarder {
    pub(crate) fn new() -> Forwarder {
        crate::delivery::client::install_crypto_provider();
        let client = reqwest::Client::builder()
            .http1_only()
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("a plain HTTP client builds");
        Forwarder { client }
    }

    /// Relays `request` to the primary's API at `base` and streams its
    /// answer back.
    async fn relay(&self, base: &str, request: Request) -> Response {
        let (parts, body) = request.into_parts();
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let url = format!("{}{path}", base.trim_end_matches('/'));
        let mut outgoing = self.client.request(parts.method.clone(), url);
        for (name, value) in &parts.headers {
            if !hop_by_hop(name) {
                outgoing = outgoing.header(name, value);
            }
        }
        let outgoing = outgoing
            .header(FORWARDED_HEADER, "1")
            .body(reqwest::Body::wrap_stream(body.into_data_stream()));
        let answer = match outgoing.send().await {
            Ok(answer) => answer,
            Err(e) if e.is_connect() => {
                return ApiError::unavailable(format!("the primary cannot be reached: {e}"))
                    .into_response();
            }
            Err(e) if parts.method == Method::GET || parts.method == Method::HEAD => {
                return ApiError::unavailable(format!("relaying to the primary failed: {e}"))
                    .into_response();
            }
            Err(e) => {
                return ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "operation_unconfirmed",
                    format!("the call was relayed to the primary but its answer was lost: {e}"),
                )
                .into_response();
            }
        };
        let mut response = Response::builder().status(answer.status());
        for (name, value) in answer.headers() {
            if !hop_by_hop(name) {
                response = response.header(name, value);
            }
        }
        response
            .body(Body::from_stream(answer.bytes_stream()))
            .unwrap_or_else(|e| {
                ApiError::unavailable(format!("bad answer from the primary: {e}")).into_response()
            })
    }
}

/// Decides where a `/v1` call is served: `Ok` gives it back to be served
/// here (this replica is the serving primary), `Err` is the answer.
pub(crate) async fn route(
    cluster: &Cluster,
    serving: bool,
    request: Request,
) -> Result<Request, Response> {
    if serving {
        return Ok(request);
    }
    let primary = cluster.primary();
    if primary
        .as_ref()
        .is_some_and(|p| p.node_id == cluster.node_id())
    {
        // Elected, but not serving yet (its barrier, the config's queues)
        // or not any more (its majority is silent).
        return Err(ApiError::unavailable(
            "this replica leads but does not serve right now; retry shortly",
        )
        .into_response());
    }
    let api_url = primary
        .as_ref()
        .filter(|p| p.node_id != cluster.node_id())
        .and_then(|p| p.api_url.clone());
    let with_primary = |mut response: Response| {
        if let Some(url) = &api_url
            && let Ok(value) = HeaderValue::from_str(url)
        {
            response.headers_mut().insert(PRIMARY_HEADER, value);
        }
        response
    };
    if request.headers().contains_key(FORWARDED_HEADER)
        || (!cluster.forward_to_primary() && api_url.is_some())
    {
        return Err(with_primary(
            ApiError::new(
                StatusCode::MISDIRECTED_REQUEST,
                "not_primary",
                "this replica is not the primary; send the call to Spooler-Primary",
            )
            .into_response(),
        ));
    }
    let Some(base) = api_url.clone() else {
        return Err(
            ApiError::unavailable("no primary is known yet (an election is under way)")
                .into_response(),
        );
    };
    let relayed = cluster.forwarder().relay(&base, request).await;
    Err(with_primary(relayed))
}
