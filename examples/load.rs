//! The load generator of `bench/run.sh` for what wrk cannot do: fill a
//! queue with an exact number of messages, and push end to end through a
//! local destination, timing each message from its `202` to its arrival.
//! It talks to a spoold process over HTTP and prints one `RESULT key=value …`
//! line. (Pull is measured with wrk and `bench/pull.lua`.)
//!
//! ```sh
//! load --url http://127.0.0.1:8080 --queue q --messages 100000 fill
//! load --url http://127.0.0.1:8080 --queue hooks --messages 50000 push --sink 127.0.0.1:9000
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use clap::{Parser, Subcommand};
use reqwest::{Client, StatusCode};

#[derive(Parser)]
struct Args {
    /// spoold's base URL.
    #[arg(long, global = true, default_value = "http://127.0.0.1:8080")]
    url: String,
    #[arg(long, global = true, default_value = "bench")]
    queue: String,
    #[arg(long, global = true, default_value_t = 100_000)]
    messages: usize,
    /// Body size in bytes.
    #[arg(long, global = true, default_value_t = 1024)]
    body: usize,
    #[command(subcommand)]
    command: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Send `messages` with `clients` concurrent connections.
    Fill {
        #[arg(long, default_value_t = 64)]
        clients: usize,
    },
    /// Serve a destination on `sink`, forward `messages` to the push queue
    /// with `clients` connections, and time each from `202` to arrival.
    Push {
        #[arg(long)]
        sink: String,
        #[arg(long, default_value_t = 64)]
        clients: usize,
    },
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    spoold::delivery::client::install_crypto_provider();
    let client = Client::builder()
        .pool_max_idle_per_host(1024)
        .build()
        .unwrap();
    match &args.command {
        &Mode::Fill { clients } => {
            wait_ready(&client, &args.url).await;
            let started = Instant::now();
            let url = format!("{}/v1/queues/{}/messages", args.url, args.queue);
            let sent = send_all(&client, &url, args.messages, clients, args.body).await;
            let seconds = started.elapsed().as_secs_f64();
            println!(
                "RESULT fill_msgs={sent} fill_seconds={seconds:.2} fill_msgs_per_s={:.0}",
                sent as f64 / seconds
            );
        }
        Mode::Push { sink, clients } => push(&client, &args, sink, *clients).await,
    }
}

async fn wait_ready(client: &Client, base: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(r) = client.get(format!("{base}/readyz")).send().await
            && r.status() == StatusCode::OK
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "spoold at {base} never became ready"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends `n` bodies to `url` from `clients` tasks; returns how many were
/// answered 2xx.
async fn send_all(client: &Client, url: &str, n: usize, clients: usize, body: usize) -> usize {
    send_all_recording(client, url, n, clients, body, None).await
}

/// Like [`send_all`]; with `accepted`, each answer's delivery id and the
/// instant its request was issued are recorded there.
async fn send_all_recording(
    client: &Client,
    url: &str,
    n: usize,
    clients: usize,
    body: usize,
    accepted: Option<Arc<Mutex<HashMap<String, Instant>>>>,
) -> usize {
    let next = Arc::new(AtomicUsize::new(0));
    let ok = Arc::new(AtomicUsize::new(0));
    let payload = bytes::Bytes::from(vec![b'x'; body]);
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (client, url, next, ok, payload, accepted) = (
                client.clone(),
                url.to_string(),
                next.clone(),
                ok.clone(),
                payload.clone(),
                accepted.clone(),
            );
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < n {
                    // Taken before the request: a delivery can reach the
                    // destination before this task has read its own `202`.
                    let issued = Instant::now();
                    let r = client
                        .post(&url)
                        .header("content-type", "application/octet-stream")
                        .body(payload.clone())
                        .send()
                        .await
                        .expect("spoold answers");
                    assert!(r.status().is_success(), "send answered {}", r.status());
                    if let Some(accepted) = &accepted {
                        let id = r.headers()["spooler-delivery-id"]
                            .to_str()
                            .unwrap()
                            .to_string();
                        accepted.lock().unwrap().insert(id, issued);
                    }
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    ok.load(Ordering::Relaxed)
}

/// Push end to end: a local destination answering 200 on `sink`, forwards
/// from `clients` connections, each message timed from the moment its
/// forward request was issued (its `202` included) to its first arrival
/// (matched by delivery id).
async fn push(client: &Client, args: &Args, sink: &str, clients: usize) {
    let arrived: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let destination = {
        let arrived = arrived.clone();
        axum::Router::new().fallback(move |headers: HeaderMap| {
            let arrived = arrived.clone();
            async move {
                if let Some(id) = headers
                    .get("spooler-delivery-id")
                    .and_then(|v| v.to_str().ok())
                {
                    arrived
                        .lock()
                        .unwrap()
                        .entry(id.to_string())
                        .or_insert_with(Instant::now);
                }
                "ok"
            }
        })
    };
    let listener = tokio::net::TcpListener::bind(sink).await.unwrap();
    tokio::spawn(async move { axum::serve(listener, destination).await.unwrap() });
    wait_ready(client, &args.url).await;

    let accepted: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let url = format!("{}/v1/forward/{}/in", args.url, args.queue);
    let started = Instant::now();
    let sent = send_all_recording(
        client,
        &url,
        args.messages,
        clients,
        args.body,
        Some(accepted.clone()),
    )
    .await;
    let accept_seconds = started.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(300);
    while arrived.lock().unwrap().len() < sent {
        assert!(Instant::now() < deadline, "deliveries stalled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let arrived = arrived.lock().unwrap();
    let accepted = accepted.lock().unwrap();
    let last = arrived.values().max().copied().unwrap();
    let mut latencies: Vec<Duration> = accepted
        .iter()
        .map(|(id, at)| arrived[id].saturating_duration_since(*at))
        .collect();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e3;
    let seconds = (last - started).as_secs_f64();
    println!(
        "RESULT push_msgs={sent} push_accepted_per_s={:.0} push_delivered_per_s={:.0} push_p50_ms={:.1} push_p99_ms={:.1}",
        sent as f64 / accept_seconds,
        sent as f64 / seconds,
        pct(0.50),
        pct(0.99)
    );
}
