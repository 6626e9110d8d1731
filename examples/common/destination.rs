//! What the load generators (`examples/load.rs`, `examples/fanout.rs`)
//! share: the destination they serve, which answers every request
//! `200 ok` after handing it to a recorder, and the CPU time of a process.

use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::http::request::Parts;
use hyper::service::service_fn;
use hyper::{Request, Response, server};
use hyper_util::rt::TokioIo;

/// Serves HTTP/1.1 on `listener` until the process ends: each request's
/// head and body go to `record` with the instant it arrived, then it is
/// answered `200 ok`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    record: impl Fn(Parts, Bytes, Instant) + Clone + Send + Sync + 'static,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        stream.set_nodelay(true).unwrap();
        let record = record.clone();
        let service = service_fn(move |request: Request<Incoming>| {
            let record = record.clone();
            async move {
                let arrived = Instant::now();
                let (head, body) = request.into_parts();
                let body = body.collect().await?.to_bytes();
                record(head, body, arrived);
                Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from_static(b"ok"))))
            }
        });
        tokio::spawn(async move {
            // A connection the server closes ends here; nothing to report.
            let _ = server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// [`serve`] on a thread of its own (its own runtime), so that arrivals
/// do not delay what the caller times on its thread.
pub fn serve_on_thread(
    listener: std::net::TcpListener,
    record: impl Fn(Parts, Bytes, Instant) + Clone + Send + Sync + 'static,
) {
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            serve(listener, record).await;
        });
    });
}

/// CPU time `pid` used so far (user and system), in seconds; 0 if it is
/// gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) in its parens.
    let Some(paren) = stat.rfind(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = stat[paren + 2..].split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}
