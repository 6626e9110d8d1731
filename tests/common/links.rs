//! The network between replicas, under the test's control: each replica's
//! replication listener and API are reached by the others through proxies
//! of their own. Every replication request names its sender
//! (`spooler-cluster-from`) and every relayed API call its relay
//! (`spooler-forwarded`), so a proxy knows which link a request travels.
//! A cut link swallows requests both ways (the sender waits until its own
//! timeout, as on a real partition, rather than being told: a blackhole);
//! a delay holds every request first. Clients of the test reach each API
//! directly, as an application beside its replica would.

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
    /// Nodes whose API no relay reaches (whoever sends).
    api_cut: BTreeSet<u64>,
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

    /// No relay reaches `node`'s API any more (a blackhole: connections
    /// open, no bytes come back).
    pub fn cut_api(&self, node: u64) {
        self.0.lock().unwrap().api_cut.insert(node);
    }

    /// Every link whole again, no delay.
    pub fn heal(&self) {
        let mut s = self.0.lock().unwrap();
        s.cut.clear();
        s.api_cut.clear();
        s.delay = Duration::ZERO;
    }

    /// Serves the proxy of node `target` on `listener`, passing requests
    /// on to `upstream` (host:port of its replication listener).
    pub fn proxy(&self, target: u64, listener: std::net::TcpListener, upstream: String) {
        self.serve(target, listener, upstream, Side::Replication);
    }

    /// Serves the proxy of node `target`'s API on `listener`, passing
    /// relayed calls on to `upstream` (host:port of its API).
    pub fn api_proxy(&self, target: u64, listener: std::net::TcpListener, upstream: String) {
        self.serve(target, listener, upstream, Side::Api);
    }

    fn serve(&self, target: u64, listener: std::net::TcpListener, upstream: String, side: Side) {
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        spoold::testing::install_crypto_provider();
        let proxy = Proxy {
            links: self.clone(),
            target,
            upstream,
            side,
            client: reqwest::Client::new(),
        };
        let app = axum::Router::new().fallback(pass).with_state(proxy);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Replication,
    Api,
}

#[derive(Clone)]
struct Proxy {
    links: Links,
    target: u64,
    upstream: String,
    side: Side,
    client: reqwest::Client,
}

impl Proxy {
    /// Whether a request from `from` (if known) cannot pass now.
    fn cut(&self, from: Option<u64>) -> bool {
        let s = self.links.0.lock().unwrap();
        (self.side == Side::Api && s.api_cut.contains(&self.target))
            || from.is_some_and(|from| s.cut.contains(&pair(from, self.target)))
    }
}

/// How long a request on a cut link is held before it is dropped: longer
/// than any replication timeout.
const SWALLOW: Duration = Duration::from_secs(30);

async fn pass(State(p): State<Proxy>, request: Request) -> Response {
    let sender = match p.side {
        Side::Replication => "spooler-cluster-from",
        Side::Api => "spooler-forwarded",
    };
    let from = request
        .headers()
        .get(sender)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(' ').next())
        .and_then(|id| id.parse::<u64>().ok());
    let delay = p.links.0.lock().unwrap().delay;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if p.cut(from) {
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
        // The upstream went away mid-request (killed): as on a network,
        // the sender hears nothing, rather than an answer a network would
        // never give.
        Err(_) => {
            tokio::time::sleep(SWALLOW).await;
            return StatusCode::GATEWAY_TIMEOUT.into_response();
        }
    };
    // A link cut while the request was on its way loses the answer.
    if p.cut(from) {
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
