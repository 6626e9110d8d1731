//! Plain-HTTP delivery on connections that the workers drive in their own
//! tasks, for a push queue whose destination is `http://` and reached
//! without a proxy. Everything else (TLS, mTLS, proxies, HTTP/2) goes
//! through reqwest's pooled client (`client.rs`).
//!
//! Why two ways: through reqwest, each request passes its redirect and
//! retry layers and its pool, and is handed to a connection task of its
//! own, which wakes the worker again for the answer and for its body.
//! Here a worker keeps one HTTP/1.1 connection while its queue has work
//! and polls it beside the request it waits for: no hand-off between
//! tasks, no per-request layers (docs/performance.md, "push").
//!
//! A worker that runs out of messages leaves its connection idle
//! ([`Direct::idle`]) for the next worker of any queue that delivers to the
//! same origin ([`Ways`]); idle connections are closed after
//! [`POOL_IDLE_TIMEOUT`] ([`Ways::prune`]). A request that a reused
//! connection refused unsent (the destination closed it while idle) goes
//! once more on a new connection, as reqwest's pool does.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::header::{ACCEPT, HOST, HeaderMap, HeaderValue, RETRY_AFTER, USER_AGENT};
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use reqwest::Url;
use tokio::net::TcpStream;
use tower_service::Service;

use super::answer::{Answer, RESPONSE_KEPT_BYTES, SendError};
use super::client::{CONNECT_TIMEOUT_MAX, POOL_IDLE_TIMEOUT, USER_AGENT_VALUE};
use super::resolve::GuardedResolver;
use crate::config::PlainHttpClient;
use crate::engine::guard::Guard;
use crate::metrics::AttemptClass;

/// Most bytes of a response body read to keep its connection: a larger
/// body ends the connection instead.
const DRAIN_BYTES_MAX: usize = 64 * 1024;

/// The environment variables that give plain-HTTP requests a proxy (the
/// ones reqwest reads for an `http://` URL).
const HTTP_PROXY_VARS: [&str; 4] = ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"];

/// A plain-HTTP origin and the connections to it that no worker holds.
pub(crate) struct Direct {
    /// `http://host:port`, what the connector dials.
    origin: Uri,
    /// DNS (through the destination guard), then TCP to each address
    /// (IPv6 and IPv4 raced after 300 ms, "happy eyeballs"), as reqwest
    /// does.
    connector: HttpConnector<GuardedResolver>,
    /// Checks where each new connection landed: never on spoold itself.
    guard: Guard,
    /// The `Host` header: the destination's host, and its port unless 80.
    host_header: HeaderValue,
    /// Each with the moment it was left idle.
    idle: Mutex<Vec<(Instant, Conn)>>,
}

/// The direct ways to plain-HTTP destinations, by origin (`host:port`),
/// shared by every push queue that delivers there, as reqwest's pool is
/// by host. Kept past the queues' dispatchers (which end about 5 s after
/// their queue empties), so that idle connections outlive a quiet spell,
/// up to [`POOL_IDLE_TIMEOUT`].
pub(crate) struct Ways {
    by_origin: HashMap<(Uri, HeaderValue), Arc<Direct>>,
    guard: Guard,
    /// `delivery.plain_http_client`: with `pooled`, no destination has a
    /// direct way and reqwest's pool sends everything.
    client: PlainHttpClient,
}

impl Ways {
    pub(crate) fn new(guard: Guard, client: PlainHttpClient) -> Ways {
        Ways {
            by_origin: HashMap::new(),
            guard,
            client,
        }
    }

    /// The direct way to `destination`, if it has one.
    pub(crate) fn to(&mut self, destination: Option<&Url>) -> Option<Arc<Direct>> {
        if self.client == PlainHttpClient::Pooled {
            return None;
        }
        let key = destination.and_then(origin)?;
        let guard = &self.guard;
        let way = self
            .by_origin
            .entry(key)
            .or_insert_with_key(|(origin, host_header)| {
                Arc::new(Direct::new(origin, host_header, guard))
            });
        Some(way.clone())
    }

    /// Closes the connections idle past [`POOL_IDLE_TIMEOUT`], and forgets
    /// the ways that no dispatcher holds and that keep none.
    pub(crate) fn prune(&mut self) {
        self.by_origin.retain(|_, way| {
            let mut idle = way.idle.lock().expect("idle lock poisoned");
            idle.retain(|(since, _)| !expired(*since));
            !idle.is_empty() || Arc::strong_count(way) > 1
        });
    }
}

/// One HTTP/1.1 connection: the handle requests go through and the
/// connection's own future, which must be polled for anything to move.
struct Conn {
    sender: http1::SendRequest<Full<Bytes>>,
    driver: Pin<Box<Driver>>,
    /// The connection's future has finished: it must not be polled again.
    ended: bool,
}

/// How one request on one connection went.
enum Exchange {
    Answered {
        answer: Answer,
        reusable: bool,
    },
    /// The connection refused the request before sending any of it.
    Unsent(Box<Request<Full<Bytes>>>, String),
    Failed(String),
}

impl Direct {
    fn new(origin: &Uri, host_header: &HeaderValue, guard: &Guard) -> Direct {
        let mut connector = HttpConnector::new_with_resolver(GuardedResolver::new(guard.clone()));
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT_MAX));
        Direct {
            origin: origin.clone(),
            connector,
            guard: guard.clone(),
            host_header: host_header.clone(),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Sends one request to `url` (the destination's, or below it) within
    /// `timeout`, connection included.
    pub(crate) async fn send(
        &self,
        method: Method,
        url: &Url,
        headers: HeaderMap,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Answer, SendError> {
        let request = self.request(method, url, headers, body)?;
        match tokio::time::timeout(timeout, self.round_trip(request)).await {
            Ok(answered) => answered,
            Err(_) => Err(SendError {
                class: AttemptClass::Timeout,
                text: "timeout: operation timed out".into(),
                refused: false,
            }),
        }
    }

    /// The request as it goes on the wire: origin-form target, `Host`,
    /// and reqwest's defaults where the request has none.
    fn request(
        &self,
        method: Method,
        url: &Url,
        mut headers: HeaderMap,
        body: Bytes,
    ) -> Result<Request<Full<Bytes>>, SendError> {
        let target = match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        };
        headers.insert(HOST, self.host_header.clone());
        if !headers.contains_key(USER_AGENT) {
            headers.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
        }
        if !headers.contains_key(ACCEPT) {
            headers.insert(ACCEPT, HeaderValue::from_static("*/*"));
        }
        let mut request = Request::builder()
            .method(method)
            .uri(target)
            .body(Full::new(body))
            .map_err(|e| SendError::from(format!("request error: {e}")))?;
        *request.headers_mut() = headers;
        Ok(request)
    }

    /// On an idle connection if there is one, else a new one; once more
    /// on a new one if a reused connection refused the request unsent.
    async fn round_trip(&self, request: Request<Full<Bytes>>) -> Result<Answer, SendError> {
        let (mut conn, reused) = match self.take_idle().await {
            Some(conn) => (conn, true),
            None => (self.connect().await?, false),
        };
        let exchanged = match conn.exchange(request).await {
            Exchange::Unsent(request, _) if reused => {
                conn = self.connect().await?;
                conn.exchange(*request).await
            }
            other => other,
        };
        match exchanged {
            Exchange::Answered { answer, reusable } => {
                if reusable {
                    let idle = (Instant::now(), conn);
                    self.idle.lock().expect("idle lock poisoned").push(idle);
                }
                Ok(answer)
            }
            Exchange::Unsent(_, text) | Exchange::Failed(text) => Err(SendError::from(text)),
        }
    }

    /// An idle connection that is still open and ready, if any: those
    /// idle too long or closed by the destination are dropped.
    async fn take_idle(&self) -> Option<Conn> {
        loop {
            let (since, mut conn) = self.idle.lock().expect("idle lock poisoned").pop()?;
            if expired(since) {
                continue;
            }
            // Polled once: a close that arrived while it was idle ends it.
            if conn.ready_now().await {
                return Some(conn);
            }
        }
    }

    async fn connect(&self) -> Result<Conn, SendError> {
        let stream = self
            .connector
            .clone()
            .call(self.origin.clone())
            .await
            .map_err(|e| SendError::connect(&e))?;
        let tcp = stream.inner();
        if let (Ok(peer), Ok(local)) = (tcp.peer_addr(), tcp.local_addr()) {
            self.guard
                .check_connected(peer, local.ip())
                .map_err(|refused| SendError::connect(&refused))?;
        }
        let (sender, driver) = http1::handshake(stream)
            .await
            .map_err(|e| SendError::connect(&e))?;
        Ok(Conn {
            sender,
            driver: Box::pin(driver),
            ended: false,
        })
    }
}

/// The origin a plain-HTTP destination is dialled at (`http://host:port`)
/// and its `Host` header (the port left out when the URL leaves it out),
/// unless a proxy variable is set or the URL carries credentials (those
/// are reqwest's).
fn origin(destination: &Url) -> Option<(Uri, HeaderValue)> {
    let proxied = HTTP_PROXY_VARS
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()));
    if destination.scheme() != "http" || proxied {
        return None;
    }
    if !destination.username().is_empty() || destination.password().is_some() {
        return None;
    }
    let host = destination.host_str()?;
    let port = destination.port_or_known_default()?;
    let origin = Uri::try_from(format!("http://{host}:{port}")).ok()?;
    let authority = match destination.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    };
    Some((origin, HeaderValue::from_str(&authority).ok()?))
}

/// Whether a connection idle since `since` is past its time.
fn expired(since: Instant) -> bool {
    since.elapsed() > POOL_IDLE_TIMEOUT
}

type Driver = http1::Connection<TokioIo<TcpStream>, Full<Bytes>>;

impl Conn {
    /// Whether the connection takes a request now, after one poll of it.
    async fn ready_now(&mut self) -> bool {
        let Conn {
            sender,
            driver,
            ended,
            ..
        } = self;
        std::future::poll_fn(|cx| {
            if !*ended && driver.as_mut().poll(cx).is_ready() {
                *ended = true;
            }
            Poll::Ready(!*ended && matches!(sender.poll_ready(cx), Poll::Ready(Ok(()))))
        })
        .await
    }

    /// One request and its answer, the connection polled alongside.
    async fn exchange(&mut self, request: Request<Full<Bytes>>) -> Exchange {
        let Conn {
            sender,
            driver,
            ended,
            ..
        } = self;
        match alongside(driver.as_mut(), ended, sender.ready()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Exchange::Unsent(Box::new(request), format!("error sending request: {e}"));
            }
            Err(ended) => return Exchange::Unsent(Box::new(request), ended.to_string()),
        }
        let sent = alongside(driver.as_mut(), ended, sender.try_send_request(request)).await;
        let response = match sent {
            Ok(Ok(response)) => response,
            Ok(Err(mut refused)) => {
                let text = format!("error sending request: {}", refused.error());
                return match refused.take_message() {
                    Some(request) => Exchange::Unsent(Box::new(request), text),
                    None => Exchange::Failed(text),
                };
            }
            Err(ended) => return Exchange::Failed(ended.to_string()),
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let mut body = response.into_body();
        let mut kept = Vec::new();
        let mut read = 0;
        // To its end, so that the connection can be reused, unless it is
        // longer than `DRAIN_BYTES_MAX`.
        let complete = loop {
            let frame = match alongside(driver.as_mut(), ended, body.frame()).await {
                Ok(None) => break true,
                Ok(Some(Ok(frame))) => frame,
                Ok(Some(Err(e))) => {
                    return Exchange::Failed(format!("error reading a response body: {e}"));
                }
                Err(ended) => return Exchange::Failed(ended.to_string()),
            };
            if let Ok(data) = frame.into_data() {
                read += data.len();
                let room = RESPONSE_KEPT_BYTES.saturating_sub(kept.len());
                kept.extend_from_slice(&data[..room.min(data.len())]);
                if read > DRAIN_BYTES_MAX {
                    break false;
                }
            }
        };
        Exchange::Answered {
            answer: Answer {
                status,
                retry_after,
                body: String::from_utf8_lossy(&kept).into_owned(),
            },
            reusable: complete && !*ended && !sender.is_closed(),
        }
    }
}

/// Why a connection ended before the work it was driving was done.
#[derive(Debug, thiserror::Error)]
enum ConnectionEnded {
    /// The destination closed it.
    #[error("error sending request: connection closed")]
    Closed,
    #[error("error sending request: {0}")]
    Failed(hyper::Error),
}

/// Polls `work` while driving the connection it needs. The connection
/// ending first is the error, unless its last poll finished the work (a
/// destination that closes after its answer); once it has ended
/// (`ended`), work that is not done at once never will be.
async fn alongside<F: Future>(
    mut driver: Pin<&mut Driver>,
    ended: &mut bool,
    work: F,
) -> Result<F::Output, ConnectionEnded> {
    let mut work = std::pin::pin!(work);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = work.as_mut().poll(cx) {
            return Poll::Ready(Ok(out));
        }
        if *ended {
            return Poll::Ready(Err(ConnectionEnded::Closed));
        }
        let Poll::Ready(closed) = driver.as_mut().poll(cx) else {
            return Poll::Pending;
        };
        *ended = true;
        Poll::Ready(match work.as_mut().poll(cx) {
            Poll::Ready(out) => Ok(out),
            Poll::Pending => Err(match closed {
                Ok(()) => ConnectionEnded::Closed,
                Err(e) => ConnectionEnded::Failed(e),
            }),
        })
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn direct(url: &str) -> Option<(Uri, HeaderValue)> {
        origin(&Url::parse(url).unwrap())
    }

    #[test]
    fn only_plain_http_goes_direct_with_its_origin_and_host_header() {
        let cases = [
            (
                "http://h.example.com/in",
                "http://h.example.com:80/",
                "h.example.com",
            ),
            (
                "http://h.example.com:8080/in",
                "http://h.example.com:8080/",
                "h.example.com:8080",
            ),
            ("http://127.0.0.1:9/", "http://127.0.0.1:9/", "127.0.0.1:9"),
            ("http://[::1]:8080/in", "http://[::1]:8080/", "[::1]:8080"),
        ];
        for (url, origin, header) in cases {
            let (dialled, host_header) = direct(url).unwrap();
            assert_eq!(dialled, origin, "{url}");
            assert_eq!(host_header, header, "{url}");
        }
        // TLS and credentials in the URL are reqwest's.
        assert!(direct("https://h.example.com/in").is_none());
        assert!(direct("http://user:secret@h.example.com/in").is_none());
    }
}
