//! `cargo bench --bench push`: push delivery end to end, in one process on
//! the same cores: a release spoold (fsync on), a local sink that answers
//! 200, and 64 concurrent clients forwarding 1 KiB bodies. Prints messages/s
//! from the first 202 to the last delivery, and p50/p99 of accept →
//! delivered per message (matched by delivery id).
//!
//! `SPOOLD_BENCH_MESSAGES` (default 50000) sets how many.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use spoold::config::Config;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let messages: usize = std::env::var("SPOOLD_BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    spoold::delivery::client::install_crypto_provider();

    let delivered: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let sink = {
        let delivered = delivered.clone();
        axum::Router::new().fallback(move |headers: HeaderMap| {
            let delivered = delivered.clone();
            async move {
                if let Some(id) = headers
                    .get("spooler-delivery-id")
                    .and_then(|v| v.to_str().ok())
                {
                    delivered
                        .lock()
                        .unwrap()
                        .entry(id.to_string())
                        .or_insert_with(Instant::now);
                }
                "ok"
            }
        })
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sink_addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, sink).await.unwrap() });

    let dir = tempfile::tempdir_in(".").unwrap();
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[spool]\nmax_bytes = \"16GiB\"\n[log]\nlevel = \"warn\"\n\
         [queues.bench]\ndestination = \"http://{sink_addr}/in\"\nconcurrency = 64\n"
    );
    let mut config = Config::parse(&text).unwrap();
    config.spool.dir = dir.path().join("spool");
    let running = spoold::serve::start(config, None).await.unwrap();
    let base = format!("http://{}", running.addr);
    let client = reqwest::Client::new();
    while !client
        .get(format!("{base}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let accepted: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let body = vec![b'x'; 1024];
    let started = Instant::now();
    let per_client = messages / 64;
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (client, base, accepted, body) =
            (client.clone(), base.clone(), accepted.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..per_client {
                let r = client
                    .post(format!("{base}/v1/forward/bench/x"))
                    .body(body.clone())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 202);
                let id = r.headers()["spooler-delivery-id"]
                    .to_str()
                    .unwrap()
                    .to_string();
                accepted.lock().unwrap().insert(id, Instant::now());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total = per_client * 64;
    let accept_secs = started.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(600);
    while delivered.lock().unwrap().len() < total {
        assert!(Instant::now() < deadline, "not everything was delivered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let end_secs = started.elapsed().as_secs_f64();
    let accepted = accepted.lock().unwrap().clone();
    let delivered = delivered.lock().unwrap().clone();
    let mut latencies: Vec<f64> = accepted
        .iter()
        .filter_map(|(id, at)| {
            delivered
                .get(id)
                .map(|d| d.saturating_duration_since(*at).as_secs_f64() * 1000.0)
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    println!("| messages | accepted/s | delivered end to end/s | accept→delivered p50 | p99 |");
    println!("|---:|---:|---:|---:|---:|");
    println!(
        "| {total} | {:.0} | {:.0} | {:.1} ms | {:.1} ms |",
        total as f64 / accept_secs,
        total as f64 / end_secs,
        pct(0.5),
        pct(0.99)
    );
    running.stop();
    running.wait().await.unwrap();
}
