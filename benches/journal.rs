//! `cargo bench --bench journal`: the spool core's numbers, printed as the
//! Markdown table that `docs/performance.md` keeps.
//!
//! - durable sends/s with fsync on and off, at 1, 16 and 64 concurrent
//!   writers, 1 KiB bodies, through the whole engine (reserve, append, group
//!   commit, apply, answer) on the real file system;
//! - replay: records/s to reopen a spool of 1 M messages from the page cache;
//! - memory: heap bytes per queued message after that replay, counted by a
//!   counting allocator (the payloads stay on disk).
//!
//! `SPOOLD_BENCH_SECONDS` (default 3) sets each throughput run's length and
//! `SPOOLD_BENCH_MESSAGES` (default 1000000) the replay spool's size.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use spoold::engine::{Engine, EngineOptions, SendRequest};
use spoold::spool::{Payload, QueueSettings};

/// Counts live heap bytes, to measure the index's memory exactly.
struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to the system allocator with the caller's
// arguments unchanged; the counter is a side effect only.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same layout the caller gave us.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn request(len: usize) -> SendRequest {
    SendRequest {
        payload: Payload {
            content_type: "application/octet-stream".into(),
            request: None,
            event: None,
            resent_from: None,
            trace: None,
            hops: 0,
            ordering_key: None,
            body: vec![b'x'; len].into(),
        },
        ..SendRequest::default()
    }
}

/// An engine on `options` with an empty queue `bench`.
async fn with_queue(options: EngineOptions) -> Engine {
    let (engine, _) = Engine::open(options).await.unwrap();
    engine
        .upsert_queue(
            "bench",
            QueueSettings::default(),
            spoold::engine::Origin::Api,
        )
        .await
        .unwrap();
    engine
}

/// Sends/s and p50/p99 latency (µs) with `writers` tasks for `seconds`.
async fn sends(fsync: bool, writers: usize, seconds: u64) -> (f64, f64, f64) {
    let dir = tempfile::tempdir_in(".").unwrap();
    let mut options = EngineOptions::new(dir.path());
    options.fsync = fsync;
    let engine = with_queue(options).await;
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..writers {
        let (engine, stop, count) = (engine.clone(), stop.clone(), count.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let body = request(1024);
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                engine.send("bench", body.clone()).await.unwrap();
                latencies.push(started.elapsed().as_micros() as u32);
                count.fetch_add(1, Ordering::Relaxed);
            }
            latencies
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)] as f64;
    let stats = engine.journal_stats();
    eprintln!(
        "fsync={fsync} writers={writers}: {} records in {} batches ({:.1} per batch)",
        stats.records,
        stats.batches,
        stats.records as f64 / stats.batches as f64
    );
    engine.close();
    (
        count.load(Ordering::Relaxed) as f64 / elapsed,
        pct(0.50),
        pct(0.99),
    )
}

async fn replay_and_memory(messages: u64) -> (f64, f64, f64, u64) {
    let dir = tempfile::tempdir_in(".").unwrap();
    let mut options = EngineOptions::new(dir.path());
    options.fsync = false;
    {
        let engine = with_queue(options.clone()).await;
        let writers = 64;
        let per = messages / writers;
        let mut tasks = Vec::new();
        for _ in 0..writers {
            let engine = engine.clone();
            tasks.push(tokio::spawn(async move {
                let body = request(1024);
                for _ in 0..per {
                    engine.send("bench", body.clone()).await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        engine.close();
    }
    // Warm the page cache, then measure a cold start of the process state.
    drop(Engine::open(options.clone()).await.unwrap());
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let started = Instant::now();
    let (engine, report) = Engine::open(options).await.unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    let after = LIVE_BYTES.load(Ordering::Relaxed);
    let queued = engine.all_messages().len() as f64;
    let per_message = (after - before) as f64 / queued;
    let disk_per_message = engine.journal_bytes() as f64 / queued;
    engine.close();
    (
        report.records as f64 / elapsed,
        per_message,
        disk_per_message,
        report.records,
    )
}

fn main() {
    let seconds = env_u64("SPOOLD_BENCH_SECONDS", 3);
    let messages = env_u64("SPOOLD_BENCH_MESSAGES", 1_000_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let only = std::env::var("SPOOLD_BENCH_ONLY").unwrap_or_default();
    runtime.block_on(async {
        if only != "replay" {
        println!("| writers | fsync on: sends/s | p50 µs | p99 µs | fsync off: sends/s | p50 µs | p99 µs | on / off |");
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
        for writers in [1, 16, 64] {
            let on = sends(true, writers, seconds).await;
            let off = sends(false, writers, seconds).await;
            println!(
                "| {writers} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} |",
                on.0, on.1, on.2, off.0, off.1, off.2, on.0 / off.0
            );
        }
        }
        let (rate, mem, disk, records) = replay_and_memory(messages).await;
        println!();
        println!("| replay: records | records/s | heap bytes per queued message | journal bytes per message |");
        println!("|---:|---:|---:|---:|");
        println!("| {records} | {rate:.0} | {mem:.0} | {disk:.0} |");
    });
}
