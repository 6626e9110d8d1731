//! A local HTTP sink for delivery tests: records every request and answers
//! from a script (then 200), optionally after a delay.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::IntoResponse;

/// One request the sink received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Instant,
    pub method: Method,
    pub uri: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// A scripted answer: status and extra headers.
pub type Answer = (u16, Vec<(&'static str, String)>);

#[derive(Default)]
struct SinkState {
    delay: Duration,
    seen: Vec<Seen>,
    script: VecDeque<Answer>,
}

#[derive(Clone, Default)]
pub struct Sink(Arc<Mutex<SinkState>>);

impl Sink {
    pub async fn start() -> (Sink, String) {
        Sink::start_slow(Duration::ZERO).await
    }

    /// A sink that takes `delay` to answer each request.
    pub async fn start_slow(delay: Duration) -> (Sink, String) {
        let sink = Sink::default();
        sink.0.lock().unwrap().delay = delay;
        let handler = {
            let sink = sink.clone();
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let sink = sink.clone();
                async move {
                    // Recorded on arrival; answered after the delay.
                    let (delay, (status, extra)) = {
                        let mut s = sink.0.lock().unwrap();
                        s.seen.push(Seen {
                            at: Instant::now(),
                            method,
                            uri: uri.to_string(),
                            headers,
                            body,
                        });
                        (s.delay, s.script.pop_front().unwrap_or((200, Vec::new())))
                    };
                    tokio::time::sleep(delay).await;
                    let mut response =
                        (StatusCode::from_u16(status).unwrap(), "sink says hi").into_response();
                    for (name, value) in extra {
                        response.headers_mut().insert(name, value.parse().unwrap());
                    }
                    response
                }
            }
        };
        let app = axum::Router::new().fallback(handler);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (sink, format!("http://{addr}"))
    }

    pub fn script(&self, answers: impl IntoIterator<Item = Answer>) {
        self.0.lock().unwrap().script.extend(answers);
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.0.lock().unwrap().seen.clone()
    }

    pub async fn wait_for(&self, n: usize) -> Vec<Seen> {
        super::eventually(
            &format!("the sink to see {n} requests"),
            Duration::from_secs(30),
            async || {
                let seen = self.seen();
                (seen.len() >= n).then_some(seen)
            },
        )
        .await
    }
}
