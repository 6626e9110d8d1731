//! Destination chaos against the real binary: a destination that flaps
//! between resetting connections, hanging past the timeout, answering
//! garbage, answering slowly and answering well. Every accepted message is
//! delivered at least once, the breaker opens and closes with the flaps,
//! and spoold's memory, file descriptors and connections to the
//! destination stay bounded throughout.

use crate::common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::process::{client, queue_json, start_with};
use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MESSAGES: usize = 400;
const CONCURRENCY: usize = 8;

/// How the destination behaves right now.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum Mode {
    /// Close every connection without answering.
    Reset = 0,
    /// Keep the request past spoold's timeout, then answer garbage.
    HangThenGarbage = 1,
    /// Answer `200` after 30 ms.
    Slow = 2,
    /// Answer `200` at once.
    Healthy = 3,
}

#[derive(Default)]
struct Destination {
    mode: AtomicU8,
    open: AtomicUsize,
    max_open: AtomicUsize,
    /// body → times answered `200`.
    delivered: Mutex<BTreeMap<String, usize>>,
}

impl Destination {
    fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    fn mode(&self) -> Mode {
        match self.mode.load(Ordering::SeqCst) {
            0 => Mode::Reset,
            1 => Mode::HangThenGarbage,
            2 => Mode::Slow,
            _ => Mode::Healthy,
        }
    }
}

/// Reads one HTTP/1.1 request with a `Content-Length` body; returns the
/// body, or `None` if the peer went away first.
async fn read_request(sock: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    while buf.len() < head_end + len {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(buf[head_end..head_end + len].to_vec())
}

async fn serve(dest: Arc<Destination>, mut sock: tokio::net::TcpStream) {
    let open = dest.open.fetch_add(1, Ordering::SeqCst) + 1;
    dest.max_open.fetch_max(open, Ordering::SeqCst);
    while let Some(body) = read_request(&mut sock).await {
        match dest.mode() {
            Mode::Reset => break,
            Mode::HangThenGarbage => {
                tokio::time::sleep(Duration::from_millis(800)).await;
                let _ = sock.write_all(b"\x00\x01 not http\r\n\r\n").await;
                break;
            }
            mode @ (Mode::Slow | Mode::Healthy) => {
                if mode == Mode::Slow {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
                let tag = String::from_utf8(body).unwrap();
                *dest.delivered.lock().unwrap().entry(tag).or_default() += 1;
                let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                if sock.write_all(answer).await.is_err() {
                    break;
                }
            }
        }
    }
    dest.open.fetch_sub(1, Ordering::SeqCst);
}

async fn destination() -> (Arc<Destination>, String) {
    let dest = Arc::new(Destination::default());
    dest.set(Mode::Reset);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let d = dest.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(serve(d.clone(), sock));
        }
    });
    (dest, format!("http://{addr}"))
}

/// Resident memory (KiB) and open file descriptors of a process.
fn usage(pid: u32) -> (u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    (rss, fds)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_destination_gets_everything_with_bounded_resources() {
    let started = Instant::now();
    let (dest, url) = destination().await;
    let dir = tempfile::tempdir().unwrap();
    let tables = format!(
        "[queues.hooks]\ndestination = \"{url}/in\"\nconcurrency = {CONCURRENCY}\ntimeout = \"500ms\"\n\
         breaker_failures = 10\nmax_retries = 1000\nbackoff = {{ initial = \"20ms\", max = \"200ms\" }}\n"
    );
    let spoold = start_with(dir.path(), "", &tables).await;
    let pid = spoold.child.id();
    let client = client();
    let baseline = usage(pid);
    let peak = Arc::new(Mutex::new(baseline));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                let (rss, fds) = usage(pid);
                {
                    let mut p = peak.lock().unwrap();
                    *p = (p.0.max(rss), p.1.max(fds));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let body_pad = "b".repeat(1000);
    for i in 0..MESSAGES {
        let r = spoold
            .api()
            .forward("hooks", "e", &format!("m{i:04} {body_pad}"))
            .await;
        assert_eq!(r.status(), StatusCode::ACCEPTED);
    }
    let stats =
        async || -> Value { queue_json(&client, &spoold.base, "hooks").await["stats"].clone() };
    let wait = async |what: &str, check: &dyn Fn(&Value) -> bool| {
        common::eventually(what, Duration::from_secs(60), async || {
            check(&stats().await).then_some(())
        })
        .await
    };
    let distinct = |dest: &Destination| dest.delivered.lock().unwrap().len();

    // Flap 1: resets until the breaker opens, then healthy until it closes
    // and a quarter is through.
    wait("the breaker open (resets)", &|s| s["breakerOpen"] == true).await;
    let opened_at = Instant::now();
    dest.set(Mode::Healthy);
    wait("the breaker closed", &|s| s["breakerOpen"] == false).await;
    let closed_after = opened_at.elapsed();
    common::eventually("a quarter delivered", Duration::from_secs(60), async || {
        (distinct(&dest) >= MESSAGES / 4).then_some(())
    })
    .await;
    // Flap 2: hangs past the timeout and garbage until it opens again,
    // then slow answers until everything is through.
    dest.set(Mode::HangThenGarbage);
    wait("the breaker open (hangs)", &|s| s["breakerOpen"] == true).await;
    dest.set(Mode::Slow);
    wait("everything drained", &|s| {
        s["breakerOpen"] == false && s["visible"] == 0 && s["leased"] == 0 && s["delayed"] == 0
    })
    .await;
    sampler.abort();

    let delivered = dest.delivered.lock().unwrap().clone();
    let duplicates: usize = delivered.values().map(|n| n - 1).sum();
    let s = stats().await;
    let failed = queue_json(&client, &spoold.base, "hooks.failed").await;
    let (base_rss, base_fds) = baseline;
    let (peak_rss, peak_fds) = *peak.lock().unwrap();
    let max_open = dest.max_open.load(Ordering::SeqCst);
    println!(
        "destination chaos: {MESSAGES} forwarded, {} delivered ({duplicates} duplicates), \
         {} failed attempts, breaker opened twice (first closed after {:.1}s); \
         RSS {base_rss} → peak {peak_rss} KiB, fds {base_fds} → peak {peak_fds}, \
         connections to the destination at once: at most {max_open}; {:.1}s",
        delivered.len(),
        s["deliveryFailuresTotal"],
        closed_after.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(delivered.len(), MESSAGES, "every message at least once");
    assert_eq!(failed["stats"]["visible"], 0, "nothing gave up");
    assert!(s["deliveryFailuresTotal"].as_u64().unwrap() >= 20, "{s}");
    // One request per worker at a time, plus the breaker's probe; a request
    // that spoold gave up on (timeout) stays open on the destination's side
    // until the destination is done hanging, overlapping with its retry.
    assert!(max_open <= 2 * CONCURRENCY + 1, "{max_open} connections");
    assert!(peak_fds <= base_fds + 2 * CONCURRENCY + 8, "{peak_fds} fds");
    assert!(peak_rss <= base_rss + 64 * 1024, "{peak_rss} KiB");
}
