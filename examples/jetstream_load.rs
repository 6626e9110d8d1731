//! The NATS JetStream side of `bench/run.sh`'s `jetstream` section: many
//! publishers, each waiting for JetStream's ack (the stream stored the
//! message on its replicas) before publishing the next, as spoold's
//! senders wait for `201`. It speaks NATS's text protocol directly over
//! TCP (`CONNECT`, `SUB`, `PUB` with a reply inbox, `MSG`, `PING`/`PONG`),
//! so the comparison needs no client library. Prints one `RESULT` line.
//!
//! ```sh
//! jetstream_load --servers 127.0.0.1:4222,127.0.0.1:4223 --subject bench.x --clients 64 --seconds 10
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

#[derive(Parser)]
struct Args {
    /// NATS servers, comma-separated; connections are spread over them.
    #[arg(long, default_value = "127.0.0.1:4222")]
    servers: String,
    /// A subject the JetStream stream captures.
    #[arg(long, default_value = "bench.x")]
    subject: String,
    /// Publishers waiting for their ack, in all.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// TCP connections the publishers share.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    #[arg(long, default_value_t = 1024)]
    body: usize,
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// First create this stream (file storage, 3 replicas, capturing the
    /// subject's first token `.>`), retrying while the cluster forms.
    #[arg(long)]
    create_stream: Option<String>,
}

/// One connection: publishers take turns writing; one task reads acks
/// and hands each to its publisher by the inbox's last token.
struct Conn {
    writer: Mutex<tokio::net::tcp::OwnedWriteHalf>,
    waiting: std::sync::Mutex<Vec<Option<tokio::sync::oneshot::Sender<bool>>>>,
}

async fn connect(addr: &str, publishers: usize) -> std::io::Result<Arc<Conn>> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut info = String::new();
    read.read_line(&mut info).await?;
    if !info.starts_with("INFO") {
        return Err(std::io::Error::other(format!("not a NATS server: {info}")));
    }
    write
        .write_all(b"CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":false}\r\nSUB _INBOX.bench.* 1\r\nPING\r\n")
        .await?;
    let conn = Arc::new(Conn {
        writer: Mutex::new(write),
        waiting: std::sync::Mutex::new((0..publishers).map(|_| None).collect()),
    });
    let reader = conn.clone();
    tokio::spawn(async move {
        let mut line = String::new();
        loop {
            line.clear();
            if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            if line.starts_with("PING") {
                let _ = reader.writer.lock().await.write_all(b"PONG\r\n").await;
            } else if let Some(rest) = line.strip_prefix("MSG ") {
                // MSG <subject> <sid> <bytes>
                let parts: Vec<&str> = rest.split_whitespace().collect();
                let size: usize = parts.last().and_then(|s| s.parse().ok()).unwrap_or(0);
                let mut payload = vec![0u8; size + 2];
                if read.read_exact(&mut payload).await.is_err() {
                    return;
                }
                let ok = !String::from_utf8_lossy(&payload).contains("\"error\"");
                let slot: Option<usize> = parts
                    .first()
                    .and_then(|s| s.rsplit('.').next())
                    .and_then(|n| n.parse().ok());
                if let Some(slot) = slot
                    && let Some(tx) = reader
                        .waiting
                        .lock()
                        .unwrap()
                        .get_mut(slot)
                        .and_then(Option::take)
                {
                    let _ = tx.send(ok);
                }
            } else if line.starts_with("-ERR") {
                eprintln!("nats: {}", line.trim_end());
            }
        }
    });
    Ok(conn)
}

/// `$JS.API.STREAM.CREATE.<name>` until JetStream answers without an
/// error (its meta leader is elected a moment after the servers start).
async fn create_stream(conn: &Conn, name: &str, subject: &str) -> std::io::Result<()> {
    let prefix = subject.split('.').next().unwrap_or(subject);
    let config = format!(
        "{{\"name\":\"{name}\",\"subjects\":[\"{prefix}.>\"],\"storage\":\"file\",\"num_replicas\":3}}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (tx, rx) = tokio::sync::oneshot::channel();
        conn.waiting.lock().unwrap()[0] = Some(tx);
        let frame = format!(
            "PUB $JS.API.STREAM.CREATE.{name} _INBOX.bench.0 {}\r\n{config}\r\n",
            config.len()
        );
        conn.writer.lock().await.write_all(frame.as_bytes()).await?;
        if let Ok(Ok(true)) = tokio::time::timeout(Duration::from_secs(5), rx).await {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(std::io::Error::other("JetStream did not create the stream"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let servers: Vec<&str> = args.servers.split(',').collect();
    let per_conn = args.clients.div_ceil(args.connections);
    let mut conns = Vec::new();
    for c in 0..args.connections {
        conns.push(connect(servers[c % servers.len()], per_conn).await?);
    }
    if let Some(name) = &args.create_stream {
        create_stream(&conns[0], name, &args.subject).await?;
    }
    let body = vec![b'x'; args.body];
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..args.clients {
        let conn = conns[p % conns.len()].clone();
        let slot = p / conns.len();
        let (stop, body, subject) = (stop.clone(), body.clone(), args.subject.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            let mut frame = Vec::with_capacity(body.len() + 64);
            while !stop.load(Ordering::Relaxed) {
                let (tx, rx) = tokio::sync::oneshot::channel();
                conn.waiting.lock().unwrap()[slot] = Some(tx);
                frame.clear();
                frame.extend_from_slice(
                    format!("PUB {subject} _INBOX.bench.{slot} {}\r\n", body.len()).as_bytes(),
                );
                frame.extend_from_slice(&body);
                frame.extend_from_slice(b"\r\n");
                let sent = Instant::now();
                if conn.writer.lock().await.write_all(&frame).await.is_err() {
                    errors += 1;
                    break;
                }
                match tokio::time::timeout(Duration::from_secs(10), rx).await {
                    Ok(Ok(true)) => latencies.push(sent.elapsed()),
                    _ => errors += 1,
                }
            }
            (latencies, errors)
        }));
    }
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.expect("a publisher panicked");
        latencies.extend(l);
        errors += e;
    }
    let seconds = started.elapsed().as_secs_f64();
    latencies.sort();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0, |d| d.as_micros())
    };
    println!(
        "RESULT sends_per_s={:.0} p50_us={} p99_us={} requests={} errors={errors}",
        latencies.len() as f64 / seconds,
        at(0.5),
        at(0.99),
        latencies.len(),
    );
    Ok(())
}
