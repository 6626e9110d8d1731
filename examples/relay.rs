//! The bound of push on this machine: what hyper alone costs to take a
//! forward and deliver it, with no journal, no fsync, no lease, no
//! signing. `bench/run.sh` section `relay` runs it where spoold's push
//! runs, with the same load generator (`examples/load.rs push`), so its
//! rate and CPU per message are the most any design built on hyper, with
//! an HTTP request in and an HTTP request out per message, could reach
//! here.
//!
//! It answers `POST /v1/forward/{queue}/{path}` with `202` once the body is
//! in memory, and 64 workers, each on one HTTP/1.1 connection of its own
//! to `--sink`, post every body there with the two headers the load
//! generator reads (`spooler-delivery-id` and `x-bench-sent`). `GET
//! /readyz` answers `200`.
//!
//! ```sh
//! relay --listen 127.0.0.1:8080 --sink 127.0.0.1:9000
//! ```

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper::header::{CONTENT_TYPE, HOST, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode, server};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, mpsc};

#[derive(Parser)]
struct Args {
    /// Where the load generator sends its forwards.
    #[arg(long)]
    listen: String,
    /// The destination every body is posted to.
    #[arg(long)]
    sink: String,
    /// Delivery workers, each with one connection to the sink.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
}

/// A forward taken and not yet delivered.
struct Job {
    id: u64,
    sent: Option<HeaderValue>,
    body: Bytes,
}

type Jobs = Arc<Mutex<mpsc::UnboundedReceiver<Job>>>;

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let (tx, rx) = mpsc::unbounded_channel();
    let jobs: Jobs = Arc::new(Mutex::new(rx));
    for _ in 0..args.concurrency {
        tokio::spawn(deliver(args.sink.clone(), jobs.clone()));
    }
    let listener = TcpListener::bind(&args.listen).await.unwrap();
    let next_id = Arc::new(AtomicU64::new(0));
    loop {
        let (stream, _) = listener.accept().await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (tx, next_id) = (tx.clone(), next_id.clone());
        let service = service_fn(move |request: Request<Incoming>| {
            let (tx, next_id) = (tx.clone(), next_id.clone());
            async move { take(request, &tx, &next_id).await }
        });
        tokio::spawn(async move {
            // A client closing its connection ends it here.
            let _ = server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Answers one request: a forward is queued for the workers, then `202`.
async fn take(
    request: Request<Incoming>,
    tx: &mpsc::UnboundedSender<Job>,
    next_id: &AtomicU64,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let answer = |status: StatusCode, body: &'static [u8]| {
        let mut response = Response::new(Full::new(Bytes::from_static(body)));
        *response.status_mut() = status;
        response
    };
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/readyz") => return Ok(answer(StatusCode::OK, b"ready")),
        (&Method::POST, path) if path.starts_with("/v1/forward/") => {}
        _ => return Ok(answer(StatusCode::NOT_FOUND, b"")),
    }
    let sent = request.headers().get("x-bench-sent").cloned();
    let body = request.into_body().collect().await?.to_bytes();
    let id = next_id.fetch_add(1, Ordering::Relaxed);
    tx.send(Job { id, sent, body }).expect("workers run");
    let mut response = answer(StatusCode::ACCEPTED, b"{\"id\":\"relayed\"}");
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(response)
}

/// One delivery worker: posts each job it takes to the sink on its own
/// connection, driven in this task as spoold's direct push workers do.
async fn deliver(sink: String, jobs: Jobs) {
    let stream = TcpStream::connect(&sink).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await.unwrap();
    let mut conn = std::pin::pin!(conn);
    loop {
        let Some(job) = jobs.lock().await.recv().await else {
            return;
        };
        let mut request = Request::post("/in")
            .header(HOST, &sink)
            .header(CONTENT_TYPE, "application/octet-stream")
            .header("spooler-delivery-id", job.id)
            .body(Full::new(job.body))
            .unwrap();
        if let Some(sent) = job.sent {
            request.headers_mut().insert("x-bench-sent", sent);
        }
        alongside(conn.as_mut(), sender.ready()).await.unwrap();
        let response = alongside(conn.as_mut(), sender.send_request(request))
            .await
            .expect("the sink answers");
        alongside(conn.as_mut(), response.into_body().collect())
            .await
            .unwrap();
    }
}

/// Polls `work` while driving the connection it needs.
async fn alongside<F: Future>(
    conn: Pin<&mut http1::Connection<TokioIo<TcpStream>, Full<Bytes>>>,
    work: F,
) -> F::Output {
    tokio::select! {
        biased;
        out = work => out,
        ended = conn => panic!("the connection to the sink ended: {ended:?}"),
    }
}
