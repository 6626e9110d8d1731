//! The load generator of `bench/run.sh` for what wrk cannot do: fill a
//! queue with an exact number of messages, and push end to end through a
//! local destination, timing each message from its `202` to its arrival.
//! It talks to a spoold process over HTTP and prints one `RESULT key=value …`
//! line. (Pull is measured with wrk and `bench/pull.lua`.)
//!
//! ```sh
//! load --url http://127.0.0.1:8080 --queue q --messages 100000 fill
//! load --url http://127.0.0.1:8080 --queue hooks --messages 50000 push --sink 127.0.0.1:9000
//! load --url http://127.0.0.1:8080 endpoints --pid PID --queues 100000 --sink 127.0.0.1:9000
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::pin::Pin;

use bytes::Bytes;
use clap::{Parser, Subcommand};
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::client::conn::http1;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::http::request::Parts;
use hyper_util::rt::TokioIo;
use reqwest::{Client, StatusCode};

#[path = "common/destination.rs"]
mod destination;

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
    /// Give message `i` the ordering key `k{i % N}` (`Spooler-Ordering-Key`);
    /// 0: no key.
    #[arg(long, global = true, default_value_t = 0)]
    ordering_keys: usize,
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
        /// Forwards per second, each issued at its appointed time and timed
        /// from it (open loop); as fast as the clients go without it.
        #[arg(long)]
        rate: Option<f64>,
    },
    /// Endpoints at a SaaS's scale: create `queues` push queues (each a
    /// customer endpoint on `sink`), measure spoold's memory per queue and
    /// its CPU while they idle, then (unless `plain`) the time to fan one
    /// event out to `fanout` of them and to deliver one event to `wide` of
    /// them.
    Endpoints {
        /// spoold's process id (its memory and CPU are read from /proc).
        #[arg(long)]
        pid: u32,
        #[arg(long, default_value_t = 100_000)]
        queues: usize,
        #[arg(long)]
        sink: String,
        #[arg(long, default_value_t = 1_000)]
        fanout: usize,
        #[arg(long, default_value_t = 10_000)]
        wide: usize,
        /// Seconds of idling whose CPU is measured.
        #[arg(long, default_value_t = 30)]
        idle_seconds: u64,
        /// Queues without `events` (a build before them): memory and idle
        /// CPU only.
        #[arg(long)]
        plain: bool,
    },
}

// One thread: it shares the two cores with spoold, and without work
// stealing it spends less CPU per message (push: 45 -> 36 µs, interleaved).
#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    spoold::testing::install_crypto_provider();
    // Only for waiting until spoold is ready.
    let client = Client::new();
    match &args.command {
        &Mode::Fill { clients } => {
            wait_ready(&client, &args.url).await;
            let started = Instant::now();
            let path = format!("/v1/queues/{}/messages", args.queue);
            let sent = send_all(&args, &path, clients, None, started).await;
            let seconds = started.elapsed().as_secs_f64();
            println!(
                "RESULT fill_msgs={sent} fill_seconds={seconds:.2} fill_msgs_per_s={:.0}",
                sent as f64 / seconds
            );
        }
        Mode::Push {
            sink,
            clients,
            rate,
        } => push(&client, &args, sink, *clients, *rate).await,
        Mode::Endpoints {
            pid,
            queues,
            sink,
            fanout,
            wide,
            idle_seconds,
            plain,
        } => {
            let scale = Scale {
                pid: *pid,
                queues: *queues,
                fanout: *fanout,
                wide: *wide,
                idle: Duration::from_secs(*idle_seconds),
                plain: *plain,
            };
            endpoints(&client, &args.url, sink, scale).await
        }
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

/// Sends `args.messages` bodies to `path` on spoold from `clients` tasks,
/// each owning one HTTP/1.1 connection and driving it itself (no pool, no
/// connection task: this process shares the two cores with spoold). Each
/// request carries the instant it was issued, in nanoseconds since `epoch`,
/// in an `x-bench-sent` header (forward passes it on to the destination).
/// With a `rate`, request i is issued at `i / rate` seconds after the start
/// and carries that appointed instant, so a client that falls behind is
/// timed from when it should have sent (no coordinated omission).
/// Returns how many were answered 2xx; any other answer is a panic.
async fn send_all(
    args: &Args,
    path: &str,
    clients: usize,
    rate: Option<f64>,
    epoch: Instant,
) -> usize {
    let start = epoch.elapsed();
    let authority = args.url.trim_start_matches("http://").to_string();
    let next = Arc::new(AtomicUsize::new(0));
    let payload = Bytes::from(vec![b'x'; args.body]);
    let n = args.messages;
    let keys = args.ordering_keys;
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (authority, path, next, payload) = (
                authority.clone(),
                path.to_string(),
                next.clone(),
                payload.clone(),
            );
            tokio::spawn(async move {
                let stream = tokio::net::TcpStream::connect(&authority).await.unwrap();
                stream.set_nodelay(true).unwrap();
                let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await.unwrap();
                let mut conn = std::pin::pin!(conn);
                let mut sent = 0;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let issued = match rate {
                        Some(rate) => {
                            let due = start + Duration::from_secs_f64(i as f64 / rate);
                            tokio::time::sleep_until((epoch + due).into()).await;
                            due.as_nanos() as u64
                        }
                        None => epoch.elapsed().as_nanos() as u64,
                    };
                    let mut request = Request::post(&path)
                        .header(HOST, &authority)
                        .header(CONTENT_TYPE, "application/octet-stream")
                        .header(SENT_HEADER, issued);
                    if keys > 0 {
                        request = request.header("spooler-ordering-key", format!("k{}", i % keys));
                    }
                    let request = request.body(Full::new(payload.clone())).unwrap();
                    alongside(conn.as_mut(), sender.ready()).await.unwrap();
                    let response = alongside(conn.as_mut(), sender.send_request(request))
                        .await
                        .expect("spoold answers");
                    let status = response.status();
                    alongside(conn.as_mut(), response.into_body().collect())
                        .await
                        .unwrap();
                    assert!(status.is_success(), "{path} answered {status}");
                    sent += 1;
                }
                sent
            })
        })
        .collect();
    let mut sent = 0;
    for t in tasks {
        sent += t.await.unwrap();
    }
    sent
}

/// Push end to end: a local destination answering 200 on `sink`, forwards
/// from `clients` connections, each message timed from the moment its
/// forward request was issued (its `202` included) to its first arrival.
///
/// The time a request was issued travels with it in the `x-bench-sent`
/// header ([`send_all`]), which spoold forwards, so the sink records plain
/// numbers instead of matching ids in shared maps.
async fn push(client: &Client, args: &Args, sink: &str, clients: usize, rate: Option<f64>) {
    let epoch = Instant::now();
    let arrivals: Arc<Mutex<Vec<Arrival>>> = Arc::default();
    let listener = tokio::net::TcpListener::bind(sink).await.unwrap();
    tokio::spawn(destination::serve(
        listener,
        record_arrival(epoch, arrivals.clone()),
    ));
    wait_ready(client, &args.url).await;

    let path = format!("/v1/forward/{}/in", args.queue);
    let started = epoch.elapsed();
    let sent = send_all(args, &path, clients, rate, epoch).await;
    let accept_seconds = (epoch.elapsed() - started).as_secs_f64();

    // Deliveries are at least once: count each delivery id's first arrival.
    let deadline = Instant::now() + Duration::from_secs(300);
    let firsts = loop {
        let firsts = first_arrivals(&arrivals.lock().unwrap());
        if firsts.len() >= sent {
            break firsts;
        }
        assert!(Instant::now() < deadline, "deliveries stalled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let last = firsts.iter().map(|&(_, arrived)| arrived).max().unwrap();
    let mut latencies: Vec<u64> = firsts
        .iter()
        .map(|&(sent, arrived)| arrived.saturating_sub(sent))
        .collect();
    latencies.sort_unstable();
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize] as f64 / 1e6;
    let seconds = (Duration::from_nanos(last) - started).as_secs_f64();
    println!(
        "RESULT push_msgs={sent} push_accepted_per_s={:.0} push_delivered_per_s={:.0} push_p50_ms={:.1} push_p99_ms={:.1}",
        sent as f64 / accept_seconds,
        sent as f64 / seconds,
        pct(0.50),
        pct(0.99)
    );
}

/// The header carrying the instant a forward was issued, in nanoseconds
/// since the load generator's epoch.
const SENT_HEADER: &str = "x-bench-sent";

/// One request that reached the sink.
struct Arrival {
    delivery_id: String,
    /// Nanoseconds since the epoch: when the forward was issued, and when
    /// the delivery arrived.
    sent: u64,
    arrived: u64,
}

/// The first arrival of each delivery id, as (sent, arrived).
fn first_arrivals(all: &[Arrival]) -> Vec<(u64, u64)> {
    let mut firsts: HashMap<&str, &Arrival> = HashMap::with_capacity(all.len());
    for a in all {
        firsts
            .entry(&a.delivery_id)
            .and_modify(|f| {
                if a.arrived < f.arrived {
                    *f = a;
                }
            })
            .or_insert(a);
    }
    firsts.into_values().map(|a| (a.sent, a.arrived)).collect()
}

/// Polls `work` while driving the connection it needs; the connection
/// ending first is an error.
async fn alongside<F: Future>(
    conn: Pin<&mut http1::Connection<TokioIo<tokio::net::TcpStream>, Full<Bytes>>>,
    work: F,
) -> F::Output {
    tokio::select! {
        biased;
        out = work => out,
        ended = conn => panic!("the connection to spoold ended: {ended:?}"),
    }
}

/// The destination's recorder: each request with a delivery id and the
/// instant its forward was issued is an arrival.
fn record_arrival(
    epoch: Instant,
    arrivals: Arc<Mutex<Vec<Arrival>>>,
) -> impl Fn(Parts, Bytes, Instant) + Clone + Send + Sync + 'static {
    move |head, _, arrived| {
        let header = |name: &str| {
            head.headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let delivery_id = header("spooler-delivery-id");
        let sent = header(SENT_HEADER).and_then(|v| v.parse().ok());
        if let (Some(delivery_id), Some(sent)) = (delivery_id, sent) {
            arrivals.lock().unwrap().push(Arrival {
                delivery_id,
                sent,
                arrived: (arrived - epoch).as_nanos() as u64,
            });
        }
    }
}

/// What `endpoints` measures.
struct Scale {
    pid: u32,
    queues: usize,
    fanout: usize,
    wide: usize,
    idle: Duration,
    plain: bool,
}

/// Resident memory of `pid`, in bytes.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib << 10
}

/// The endpoint measurement (see [`Mode::Endpoints`]).
async fn endpoints(client: &Client, base: &str, sink: &str, scale: Scale) {
    // The destination counts deliveries by event id, on a thread of its
    // own: 10 000 deliveries arriving must not delay the reading of a
    // `202` on this one (whose time is what is measured).
    let by_event: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let listener = std::net::TcpListener::bind(sink).unwrap();
    let counts = by_event.clone();
    destination::serve_on_thread(listener, move |head, _, _| {
        if let Some(id) = head
            .headers
            .get("spooler-event-id")
            .and_then(|v| v.to_str().ok())
        {
            *counts.lock().unwrap().entry(id.to_owned()).or_default() += 1;
        }
    });
    wait_ready(client, base).await;
    let rss_before = rss_bytes(scale.pid);
    let created = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (client, next, base, sink) = (
                client.clone(),
                next.clone(),
                base.to_string(),
                sink.to_string(),
            );
            let (queues, fanout, wide, plain) =
                (scale.queues, scale.fanout, scale.wide, scale.plain);
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= queues {
                        return;
                    }
                    let mut events = vec![format!("ep{i}.>")];
                    if i < wide {
                        events.push("wide.ping".into());
                    }
                    if i < fanout {
                        events.push("narrow.ping".into());
                    }
                    let mut body = serde_json::json!({
                        "destination": format!("http://{sink}/ep/{i}"),
                        "signingSecret": "whsec_ZXhhbXBsZS1zZWNyZXQtb25seQ==",
                    });
                    if !plain {
                        body["events"] = serde_json::json!(events);
                    }
                    let r = client
                        .put(format!("{base}/v1/queues/ep-{i}"))
                        .json(&body)
                        .send()
                        .await
                        .unwrap();
                    assert!(r.status().is_success(), "PUT ep-{i}: {}", r.status());
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let create_seconds = created.elapsed().as_secs_f64();
    // Let whatever started with the queues settle, then measure idling.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_after = rss_bytes(scale.pid);
    let cpu_before = destination::cpu_seconds(scale.pid);
    tokio::time::sleep(scale.idle).await;
    let idle_cpu =
        (destination::cpu_seconds(scale.pid) - cpu_before) / scale.idle.as_secs_f64() * 100.0;
    let per_queue = rss_after.saturating_sub(rss_before) / scale.queues as u64;
    // The console's first page of the queue list, and its filter box
    // (a name prefix): the median of five of each.
    let page_ms = async |query: &str| {
        let mut took = Vec::new();
        for _ in 0..5 {
            let started = Instant::now();
            let r = client
                .get(format!("{base}/v1/queues?{query}"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            r.bytes().await.unwrap();
            took.push(started.elapsed().as_secs_f64() * 1e3);
        }
        took.sort_by(f64::total_cmp);
        took[took.len() / 2]
    };
    let first_page = page_ms("limit=100").await;
    let prefixed = page_ms("limit=100&prefix=ep-9999").await;
    print!(
        "RESULT endpoints_queues={} endpoints_create_seconds={create_seconds:.1} endpoints_rss_before_mib={} endpoints_rss_after_mib={} endpoints_bytes_per_queue={per_queue} endpoints_idle_cpu_pct={idle_cpu:.2} endpoints_list_page_ms={first_page:.1} endpoints_list_prefix_ms={prefixed:.1}",
        scale.queues,
        rss_before >> 20,
        rss_after >> 20
    );
    if scale.plain {
        println!();
        return;
    }
    let publish = async |event_type: &str| -> (Duration, String, usize) {
        let started = Instant::now();
        let r = client
            .post(format!("{base}/v1/events"))
            .json(&serde_json::json!({"type": event_type, "payload": {"at": 1}}))
            .send()
            .await
            .unwrap();
        let took = started.elapsed();
        assert_eq!(r.status(), StatusCode::ACCEPTED);
        let answer: serde_json::Value = r.json().await.unwrap();
        let n = answer["deliveries"].as_array().unwrap().len();
        (took, answer["id"].as_str().unwrap().to_owned(), n)
    };
    // One event to `fanout` endpoints: the 202 comes once every delivery
    // is enqueued (one record); five of them, the median.
    let mut fanout_ms = Vec::new();
    for _ in 0..5 {
        let (took, _, n) = publish("narrow.ping").await;
        assert_eq!(n, scale.fanout);
        fanout_ms.push(took.as_secs_f64() * 1e3);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    fanout_ms.sort_by(f64::total_cmp);
    // One event to `wide` endpoints: from its 202 until each has it.
    let started = Instant::now();
    let (_, id, n) = publish("wide.ping").await;
    assert_eq!(n, scale.wide);
    let deadline = Instant::now() + Duration::from_secs(300);
    while by_event.lock().unwrap().get(&id).copied().unwrap_or(0) < scale.wide {
        assert!(Instant::now() < deadline, "deliveries stalled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let wide_seconds = started.elapsed().as_secs_f64();
    // Once delivered, the endpoints idle again.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rss_done = rss_bytes(scale.pid);
    println!(
        " endpoints_fanout={} endpoints_fanout_p50_ms={:.1} endpoints_wide={} endpoints_wide_seconds={wide_seconds:.2} endpoints_rss_after_delivery_mib={}",
        scale.fanout,
        fanout_ms[fanout_ms.len() / 2],
        scale.wide,
        rss_done >> 20
    );
}
