//! The network between replicas, under the test's control: each replica's
//! replication listener is reached through a proxy of its own, and every
//! replication request names its sender (`spooler-cluster-from`), so a
//! proxy knows which link a request travels. A cut link swallows requests
//! both ways (the sender waits until its own timeout, as on a real
//! partition, rather than being told); a delay holds every request first.
//! Client traffic (the `/v1` API, a follower's relay) is not proxied.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Default)]
struct State_ {
    /// Cut links, as (lower id, higher id).
    cut: BTreeSet<(u64, u64)>,
    delay: Duration,
}

/// The links between the replicas of a test cluster.
#[derive(Clone, Default)]
pub struct Links(Arc<Mutex<State_>>);

fn pair(a: u64, b: u64) -> (u64, u64) {
    (a.min(b), a.max(b))
}

impl Links {
    /// Cuts the link between `a` and `b` (both ways).
    pub fn cut(&self, a: u64, b: u64) {
        self.0.lock().unwrap().cut.insert(pair(a, b));
    }

    /// Cuts `node` from every node of `others`.
    pub fn isolate(&self, node: u64, others: &[u64]) {
        for &o in others {
            if o != node {
                self.cut(node, o);
            }
        }
    }

    pub fn is_cut(&self, a: u64, b: u64) -> bool {
        self.0.lock().unwrap().cut.contains(&pair(a, b))
    }

    /// Flips the link between `a` and `b`.
    pub fn toggle(&self, a: u64, b: u64) {
        let mut s = self.0.lock().unwrap();
        if !s.cut.remove(&pair(a, b)) {
            s.cut.insert(pair(a, b));
        }
    }

    /// Holds every request `delay` before passing it on.
    pub fn delay(&self, delay: Duration) {
        self.0.lock().unwrap().delay = delay;
    }

    /// Every link whole again, no delay.
    pub fn heal(&self) {
        let mut s = self.0.lock().unwrap();
        s.cut.clear();
        s.delay = Duration::ZERO;
    }

    /// Serves the proxy of node `target` on `listener`, passing requests
    /// on to `upstream` (host:port of its replication listener).
    pub fn proxy(&self, target: u64, listener: std::net::TcpListener, upstream: String) {
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        spoold::testing::install_crypto_provider();
        let proxy = Proxy {
            links: self.clone(),
            target,
            upstream,
            client: reqwest::Client::new(),
        };
        let app = axum::Router::new().fallback(pass).with_state(proxy);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
    }
}

#[derive(Clone)]
struct Proxy {
    links: Links,
    target: u64,
    upstream: String,
    client: reqwest::Client,
}

/// How long a request on a cut link is held before it is dropped: longer
/// than any replication timeout.
const SWALLOW: Duration = Duration::from_secs(30);

async fn pass(State(p): State<Proxy>, request: Request) -> Response {
    let from = request
        .headers()
        .get("spooler-cluster-from")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(' ').next())
        .and_then(|id| id.parse::<u64>().ok());
    let delay = p.links.0.lock().unwrap().delay;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(from) = from
        && p.links.is_cut(from, p.target)
    {
        tokio::time::sleep(SWALLOW).await;
        return StatusCode::GATEWAY_TIMEOUT.into_response();
    }
    let (parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut out = p
        .client
        .request(parts.method, format!("http://{}{path}", p.upstream));
    for (name, value) in &parts.headers {
        if name != "host" && name != "transfer-encoding" && name != "connection" {
            out = out.header(name, value);
        }
    }
    let sent = out
        .body(reqwest::Body::wrap_stream(body.into_data_stream()))
        .send()
        .await;
    let answer = match sent {
        Ok(a) => a,
        Err(_) => return StatusCode::BAD_GATEWAY.into_response(),
    };
    // A link cut while the request was on its way loses the answer.
    if let Some(from) = from
        && p.links.is_cut(from, p.target)
    {
        tokio::time::sleep(SWALLOW).await;
        return StatusCode::GATEWAY_TIMEOUT.into_response();
    }
    let mut response = Response::builder().status(answer.status().as_u16());
    for (name, value) in answer.headers() {
        if name != "transfer-encoding" && name != "connection" && name != "content-length" {
            response = response.header(name.as_str(), value.as_bytes());
        }
    }
    response
        .body(Body::from_stream(answer.bytes_stream()))
        .unwrap()
}
