//! The fan-out load of `bench/run.sh` section `svix`: one event type, N
//! endpoints on a local destination, events published from 16 connections,
//! the same for spoold and for Svix's server, so that both are measured by
//! one load generator.
//!
//! - spoold: N push queues subscribed to `bench.ping`, each an endpoint
//!   with history kept (24 h, 1 MiB: Svix keeps its attempts); events go
//!   to `POST /v1/events`.
//! - svix: one application with N endpoints; events go to
//!   `POST /api/v1/app/bench/msg/`.
//!
//! Each event carries its publish instant and sequence number in its JSON
//! payload; the destination (in this process) counts each endpoint's first
//! arrival of each event and its time from publish. The CPU of the given
//! processes (`--pids`) is read from /proc from the first publish to the
//! last arrival, and their proportional set size (PSS) sampled meanwhile;
//! the bytes written to the block device holding their files
//! (`--device`, `/sys/class/block/NAME/stat`: file system journal,
//! preallocation and WAL included, so nothing else may write meanwhile).
//! One `RESULT key=value …` line.
//!
//! ```sh
//! fanout --system spoold --url http://127.0.0.1:8080 --endpoints 100 --events 300 \
//!     --sink 127.0.0.1:9000 --pids 1234 --device vda
//! fanout --system svix --url http://127.0.0.1:8071 --token "$JWT" --endpoints 100 --events 300 \
//!     --sink 127.0.0.1:9000 --pids 1,2,3 --device vda --rate 50
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use reqwest::Client;
use serde_json::{Value, json};

#[path = "common/destination.rs"]
mod destination;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum System {
    Spoold,
    Svix,
}

#[derive(Parser)]
struct Args {
    #[arg(long, value_enum)]
    system: System,
    /// The server's base URL.
    #[arg(long)]
    url: String,
    /// Svix's bearer token (`svix-server jwt generate`).
    #[arg(long, default_value = "")]
    token: String,
    #[arg(long)]
    endpoints: usize,
    #[arg(long)]
    events: usize,
    #[arg(long, default_value_t = 16)]
    publishers: usize,
    /// The destination's address (every endpoint is a path on it).
    #[arg(long)]
    sink: String,
    /// Events per second, each published at its appointed time and timed
    /// from it (open loop); as fast as the publishers go without it.
    #[arg(long)]
    rate: Option<f64>,
    /// Processes whose CPU and PSS are the system's, each with its
    /// children (PostgreSQL's backends): comma-separated.
    #[arg(long, value_delimiter = ',')]
    pids: Vec<u32>,
    /// The block device its files are on (`vda`, `nvme0n1p2`).
    #[arg(long)]
    device: String,
    /// The payload's size class: padding of this many bytes.
    #[arg(long, default_value_t = 900)]
    pad: usize,
}

/// What the destination saw: for each (endpoint, event), its first
/// arrival's latency from publish in nanoseconds (0: not yet).
struct Arrivals {
    events: usize,
    latency: Vec<u64>,
    unique: usize,
    /// When the last new arrival came (since the epoch).
    last: Duration,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    spoold::testing::install_crypto_provider();
    let epoch = Instant::now();
    let arrivals = Arc::new(Mutex::new(Arrivals {
        events: args.events,
        latency: vec![0; args.endpoints * args.events],
        unique: 0,
        last: Duration::ZERO,
    }));
    start_sink(&args.sink, epoch, arrivals.clone());
    let client = Client::builder()
        .pool_max_idle_per_host(args.publishers)
        .build()
        .unwrap();
    setup(&client, &args).await;
    let before = Usage::of(&args.pids);
    let written_before = device_bytes_written(&args.device);
    let pss_peak = Arc::new(AtomicUsize::new(0));
    let sampler = tokio::spawn(sample_pss(args.pids.clone(), pss_peak.clone()));
    let started = epoch.elapsed();
    publish_all(&client, &args, epoch).await;
    let publish_seconds = (epoch.elapsed() - started).as_secs_f64();
    let wanted = args.endpoints * args.events;
    let deadline = Instant::now() + Duration::from_secs(900);
    while arrivals.lock().unwrap().unique < wanted {
        assert!(Instant::now() < deadline, "deliveries stalled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu = Usage::of(&args.pids).cpu_since(&before);
    sampler.abort();
    // Let the last writes (attempt rows, settle records) reach the disk.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let written = device_bytes_written(&args.device) - written_before;
    let a = arrivals.lock().unwrap();
    let mut latencies = a.latency.clone();
    latencies.sort_unstable();
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize] as f64 / 1e6;
    let seconds = (a.last - started).as_secs_f64();
    println!(
        "RESULT events_per_s={:.0} deliveries_per_s={:.0} p50_ms={:.1} p99_ms={:.1} cpu_us_per_delivery={:.0} pss_mib={} disk_bytes_per_delivery={}",
        args.events as f64 / publish_seconds,
        wanted as f64 / seconds,
        pct(0.50),
        pct(0.99),
        cpu * 1e6 / wanted as f64,
        pss_peak.load(Ordering::Relaxed) >> 20,
        written / wanted as u64,
    );
}

/// The endpoints: N push queues subscribed to the event type (spoold), or
/// one application with N endpoints (Svix); 16 at a time.
async fn setup(client: &Client, args: &Args) {
    wait_ready(client, args).await;
    if args.system == System::Svix {
        let app = json!({"name": "bench", "uid": "bench"});
        let r = request(client, args, reqwest::Method::POST, "/api/v1/app/", app).await;
        assert!(r.is_success() || r.as_u16() == 409, "create the app: {r}");
    }
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (client, next) = (client.clone(), next.clone());
            let (system, url, token, sink, n) = (
                args.system,
                args.url.clone(),
                args.token.clone(),
                args.sink.clone(),
                args.endpoints,
            );
            tokio::spawn(async move {
                let args = Args::for_setup(system, url, token);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    let destination = format!("http://{sink}/ep/{i}");
                    let (method, path, body) = match system {
                        System::Spoold => (
                            reqwest::Method::PUT,
                            format!("/v1/queues/ep-{i}"),
                            json!({"destination": destination, "events": ["bench.ping"],
                                "historyRetentionSeconds": 86_400, "historyMaxBytes": 1 << 20}),
                        ),
                        System::Svix => (
                            reqwest::Method::POST,
                            "/api/v1/app/bench/endpoint/".to_owned(),
                            json!({"url": destination, "uid": format!("ep-{i}")}),
                        ),
                    };
                    let status = request(&client, &args, method, &path, body).await;
                    assert!(status.is_success(), "endpoint {i}: {status}");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

impl Args {
    /// The fields a setup task needs.
    fn for_setup(system: System, url: String, token: String) -> Args {
        Args {
            system,
            url,
            token,
            endpoints: 0,
            events: 0,
            publishers: 0,
            sink: String::new(),
            rate: None,
            pids: Vec::new(),
            device: String::new(),
            pad: 0,
        }
    }
}

async fn request(
    client: &Client,
    args: &Args,
    method: reqwest::Method,
    path: &str,
    body: Value,
) -> reqwest::StatusCode {
    let mut r = client
        .request(method, format!("{}{path}", args.url))
        .json(&body);
    if !args.token.is_empty() {
        r = r.bearer_auth(&args.token);
    }
    let response = r.send().await.unwrap();
    let status = response.status();
    if !status.is_success() {
        eprintln!(
            "{path}: {status} {}",
            response.text().await.unwrap_or_default()
        );
    }
    status
}

async fn wait_ready(client: &Client, args: &Args) {
    let path = match args.system {
        System::Spoold => "/readyz",
        System::Svix => "/api/v1/health/",
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let url = format!("{}{path}", args.url);
        if let Ok(r) = client.get(&url).send().await
            && r.status().is_success()
        {
            return;
        }
        assert!(Instant::now() < deadline, "{url} never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Publishes `events` from `publishers` connections: each as soon as the
/// one before it was answered, or at its time under `rate`.
async fn publish_all(client: &Client, args: &Args, epoch: Instant) {
    let next = Arc::new(AtomicUsize::new(0));
    let begun = Instant::now();
    let pad = "x".repeat(args.pad);
    let tasks: Vec<_> = (0..args.publishers)
        .map(|_| {
            let (client, next, pad) = (client.clone(), next.clone(), pad.clone());
            let (system, url, token) = (args.system, args.url.clone(), args.token.clone());
            let (events, rate) = (args.events, args.rate);
            tokio::spawn(async move {
                let args = Args::for_setup(system, url, token);
                loop {
                    let seq = next.fetch_add(1, Ordering::Relaxed);
                    if seq >= events {
                        return;
                    }
                    let due = rate.map(|r| begun + Duration::from_secs_f64(seq as f64 / r));
                    if let Some(due) = due {
                        tokio::time::sleep_until(due.into()).await;
                    }
                    // Timed from its appointed time under a rate.
                    let t = due.unwrap_or_else(Instant::now) - epoch;
                    let payload = json!({"t": t.as_nanos() as u64, "seq": seq, "pad": pad});
                    let (path, body) = match system {
                        System::Spoold => (
                            "/v1/events".to_owned(),
                            json!({"type": "bench.ping", "payload": payload}),
                        ),
                        System::Svix => (
                            "/api/v1/app/bench/msg/?with_content=false".to_owned(),
                            json!({"eventType": "bench.ping", "payload": payload}),
                        ),
                    };
                    let status = request(&client, &args, reqwest::Method::POST, &path, body).await;
                    assert!(status.is_success(), "event {seq}: {status}");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// The destination, on a thread of its own: `200` to everything, and the
/// first arrival of each (endpoint, event) recorded.
fn start_sink(address: &str, epoch: Instant, arrivals: Arc<Mutex<Arrivals>>) {
    let listener = std::net::TcpListener::bind(address).unwrap();
    destination::serve_on_thread(listener, move |head, body, arrived| {
        let endpoint = head.uri.path().strip_prefix("/ep/");
        if let Some(endpoint) = endpoint.and_then(|e| e.parse().ok()) {
            arrivals
                .lock()
                .unwrap()
                .record(endpoint, &body, arrived - epoch);
        }
    });
}

impl Arrivals {
    fn record(&mut self, endpoint: usize, body: &[u8], arrived: Duration) {
        let Ok(payload) = serde_json::from_slice::<Value>(body) else {
            return;
        };
        // spoold delivers the event's payload as it was published; Svix
        // too (its own envelope has none).
        let (Some(t), Some(seq)) = (payload["t"].as_u64(), payload["seq"].as_u64()) else {
            return;
        };
        let Some(slot) = self.latency.get_mut(endpoint * self.events + seq as usize) else {
            return;
        };
        if *slot == 0 {
            *slot = (arrived.as_nanos() as u64).saturating_sub(t).max(1);
            self.unique += 1;
            self.last = arrived;
        }
    }
}

/// Samples the sum of the processes' PSS every half second, keeping the
/// highest.
async fn sample_pss(pids: Vec<u32>, peak: Arc<AtomicUsize>) {
    loop {
        let total: usize = with_children(&pids).into_iter().map(pss_bytes).sum();
        peak.fetch_max(total, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The proportional set size of `pid` (its share of pages it shares).
fn pss_bytes(pid: u32) -> usize {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let kib: usize = rollup
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    kib << 10
}

/// The CPU time of some processes, each by pid.
struct Usage(std::collections::HashMap<u32, f64>);

impl Usage {
    fn of(pids: &[u32]) -> Usage {
        let each = with_children(pids).into_iter();
        Usage(each.map(|p| (p, destination::cpu_seconds(p))).collect())
    }

    /// CPU seconds used since `before` (a process started meanwhile counts
    /// whole; one that ended meanwhile is lost).
    fn cpu_since(&self, before: &Usage) -> f64 {
        let was = |p| before.0.get(p).copied().unwrap_or(0.0);
        self.0.iter().map(|(p, now)| now - was(p)).sum()
    }
}

/// `pids` and each one's children.
fn with_children(pids: &[u32]) -> Vec<u32> {
    let mut all = pids.to_vec();
    for &pid in pids {
        let path = format!("/proc/{pid}/task/{pid}/children");
        let children = std::fs::read_to_string(path).unwrap_or_default();
        all.extend(
            children
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok()),
        );
    }
    all
}

/// Bytes written to block device `name` so far (sectors of 512 bytes,
/// the seventh field of its `stat`).
fn device_bytes_written(name: &str) -> u64 {
    let path = format!("/sys/class/block/{name}/stat");
    let stat = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let sectors: u64 = stat.split_whitespace().nth(6).unwrap().parse().unwrap();
    sectors * 512
}
