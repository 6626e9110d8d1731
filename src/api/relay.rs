//! A follower's `/v1` calls (docs/contract.md §9): relayed to the primary
//! (streaming both ways, long polls and `tail` included) with
//! `Spooler-Primary` added, or answered `421 not_primary`
//! (`forward_to_primary = false`), or `503` while no primary is known. A
//! relayed call reaching a replica that is not the primary either is
//! answered `421`: one hop at most.
//!
//! The primary's API URL is the one the membership names for the leader
//! Raft agreed on (`cluster/members.rs` pins it), never what a request
//! says. A relay ends as soon as this replica's view of the primary
//! changes, or when the primary has not started answering within a bound
//! tied to the election timeout (plus the call's own `wait`): a primary cut
//! off by the network (connections open, no bytes) is replaced within
//! that time, and the client should try again rather than wait on it.
//! A read that ended so is `503`; a write, which may have reached the
//! primary, is `500 operation_unconfirmed`. That bound counts from the
//! call's last body byte: a client's slow upload is its own time (the
//! primary bounds it, [`super::BODY_READ_TIMEOUT`]), and a 200 KB body
//! uploaded over 3 s was refused through a follower but stored by the
//! primary.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use tokio::sync::oneshot;

use super::error::ApiError;
use crate::cluster::Cluster;
use crate::spool::queue::is_hop_by_hop;

/// Marks a relayed call, naming the replica that relayed it.
const FORWARDED_HEADER: &str = "spooler-forwarded";
/// Names the primary's API on every relayed answer and every `421`.
pub(crate) const PRIMARY_HEADER: &str = "spooler-primary";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How many election timeouts a relay waits for the primary's first byte
/// (beyond the call's `wait`): a new primary is elected within two.
const ELECTIONS_PER_RELAY: u32 = 3;

/// Headers of one hop only, never relayed: the hop-by-hop ones
/// (`spool::queue::HOP_BY_HOP`), `Host`, and a browser's `Origin` and
/// `Sec-Fetch-Site`, which this replica's edge checked against its own name
/// (`edge.rs`) and the primary's would refuse.
fn hop_by_hop(name: &HeaderName) -> bool {
    let name = name.as_str();
    is_hop_by_hop(name) || matches!(name, "host" | "origin" | "sec-fetch-site")
}

/// The pooled client a follower relays with.
pub(crate) struct Relay {
    client: reqwest::Client,
}

/// The `wait` a call asks for (a long poll), at most the API's longest.
fn asked_wait(request: &Request) -> Duration {
    let wait = request.uri().query().and_then(|q| {
        q.split('&')
            .filter_map(|pair| pair.split_once('='))
            .find(|(k, _)| *k == "wait")
            .and_then(|(_, v)| v.parse::<f64>().ok())
    });
    Duration::from_secs_f64(wait.unwrap_or(0.0).clamp(0.0, super::WAIT_SECONDS_MAX))
}

impl Relay {
    pub(crate) fn new() -> Relay {
        crate::tls::install_crypto_provider();
        let client = reqwest::Client::builder()
            .http1_only()
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("a plain HTTP client builds");
        Relay { client }
    }

    /// Relays `request` to the primary (node `primary`, its API at
    /// `base`) and streams its answer back, until this replica's view of
    /// the primary changes.
    async fn relay(
        &self,
        cluster: &Cluster,
        (primary, base): (u64, &str),
        request: Request,
    ) -> Response {
        let bound = asked_wait(&request) + cluster.election_timeout() * ELECTIONS_PER_RELAY;
        let (parts, body) = request.into_parts();
        let write = parts.method != Method::GET && parts.method != Method::HEAD;
        let (outgoing, mut upload_done) = self.outgoing(&parts, body, base, cluster.node_id());
        let answer_bound = async {
            let _ = tokio::time::timeout(super::BODY_READ_TIMEOUT, &mut upload_done).await;
            tokio::time::sleep(bound).await;
        };
        let answer = tokio::select! {
            answer = outgoing.send() => match answer {
                Ok(answer) => answer,
                Err(e) if e.is_connect() => {
                    return ApiError::unavailable(format!("the primary cannot be reached: {e}"))
                        .into_response();
                }
                Err(e) => return lost(write, &format!("its answer was lost ({e})")),
            },
            () = cluster.primary_changed(Some(primary)) => {
                return lost(write, "the primary changed meanwhile");
            }
            () = answer_bound => {
                return lost(write, &format!(
                    "it did not answer within {} ms of the body's end",
                    bound.as_millis()
                ));
            }
        };
        // spoold never answers 502 or 504 itself: a gateway between the
        // replicas (a mesh's proxy) lost the primary's answer.
        if matches!(
            answer.status(),
            StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT
        ) {
            return lost(write, &format!("a gateway answered {}", answer.status()));
        }
        stream_back(cluster, primary, answer)
    }

    /// The call to the primary at `base`: the request's method, path,
    /// headers (but the hop-by-hop ones) and body streamed, marked as
    /// relayed by node `node_id`; and what tells when the body's last
    /// byte went (or the body failed).
    fn outgoing(
        &self,
        parts: &Parts,
        body: Body,
        base: &str,
        node_id: u64,
    ) -> (reqwest::RequestBuilder, oneshot::Receiver<()>) {
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let url = format!("{}{path}", base.trim_end_matches('/'));
        let mut outgoing = self.client.request(parts.method.clone(), url);
        for (name, value) in &parts.headers {
            if !hop_by_hop(name) {
                outgoing = outgoing.header(name, value);
            }
        }
        // Tells when the body's last byte went (or the body failed).
        let (uploaded, upload_done) = oneshot::channel::<()>();
        let mut uploaded = Some(uploaded);
        let body = body
            .into_data_stream()
            .chain(futures_util::stream::poll_fn(move |_| {
                drop(uploaded.take());
                std::task::Poll::Ready(None)
            }));
        let outgoing = outgoing
            .header(FORWARDED_HEADER, node_id.to_string())
            .body(reqwest::Body::wrap_stream(body));
        (outgoing, upload_done)
    }
}

/// The answer to a relayed call whose outcome is unknown (`why`): a write
/// may have reached the primary (`500 operation_unconfirmed`), a read
/// can be tried again (`503`).
fn lost(write: bool, why: &str) -> Response {
    if write {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "operation_unconfirmed",
            format!("the call was relayed to the primary but {why}; its outcome is unknown"),
        )
        .into_response()
    } else {
        ApiError::unavailable(format!("relaying to the primary failed: {why}")).into_response()
    }
}

/// The primary's `answer`, streamed back with its headers (but the
/// hop-by-hop ones), until this replica's view of the primary changes.
fn stream_back(cluster: &Cluster, primary: u64, answer: reqwest::Response) -> Response {
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if !hop_by_hop(name) {
            response = response.header(name, value);
        }
    }
    // A streamed answer (a tail) ends with this replica's view of the
    // primary too.
    let cluster = cluster.clone();
    let changed = Box::pin(async move { cluster.primary_changed(Some(primary)).await });
    let body = answer.bytes_stream().take_until(changed);
    response.body(Body::from_stream(body)).unwrap_or_else(|e| {
        ApiError::unavailable(format!("bad answer from the primary: {e}")).into_response()
    })
}

/// Decides where a `/v1` call is served: `Ok` gives it back to be served
/// here (this replica is the serving primary), `Err` is the answer.
pub(crate) async fn route(
    cluster: &Cluster,
    relay: &Relay,
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
            "not the primary right now: this replica leads in Raft but does not serve \
             (its barrier is not applied yet, or no majority answered it lately); retry shortly",
        )
        .into_response());
    }
    let target = primary.map(|p| (p.node_id, p.api_url));
    let with_primary = |mut response: Response| {
        if let Some((_, url)) = &target
            && let Ok(value) = HeaderValue::from_str(url)
        {
            response.headers_mut().insert(PRIMARY_HEADER, value);
        }
        response
    };
    if request.headers().contains_key(FORWARDED_HEADER)
        || (!cluster.forward_to_primary() && target.is_some())
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
    let Some((node, base)) = target.clone() else {
        return Err(ApiError::unavailable(cluster.why_no_primary()).into_response());
    };
    let relayed = relay.relay(cluster, (node, &base), request).await;
    Err(with_primary(relayed))
}
