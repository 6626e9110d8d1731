//! The crash loop: rounds of concurrent send / receive / ack / forward
//! traffic, with settings changes, pauses and delayed messages mixed in,
//! against the real binary on tiny segments (so compaction runs all the
//! time), killed with SIGKILL at a random moment and restarted, checked the
//! way Jepsen's set checker does.
//!
//! The checker keeps, per message tag, whether its send was *attempted*,
//! *acknowledged* (`201`/`202`), *received* (with the instant the receive was
//! asked for) and *acked* (`204`, with the instant the answer came). At the
//! end a last process drains every queue, and:
//!
//! - lost: acknowledged but never received nor delivered: must be 0;
//! - resurrected: received by a receive asked for after its ack had answered
//!   `204`: must be 0;
//! - unexpected: received or delivered but never attempted: must be 0;
//! - duplicates: received or delivered more than once: allowed, counted;
//! - ids reused: one message id answered for two different messages: must
//!   be 0;
//! - delayed messages (an hour's delay on queue `admin`) acknowledged but
//!   missing at the end: must be 0;
//! - `admin`'s settings and pause state at the end: what the last
//!   acknowledged change set, or a later change that was in doubt;
//! - events (`POST /v1/events`, to two queues that subscribe): every one
//!   acknowledged is in both queues; none is in a queue twice (a fan-out
//!   applied again); one in doubt is in both or in neither (one record).
//!
//! Rounds: `CRASH_LOOP_ROUNDS` (default 100, what CI runs; the local soak
//! of 2 000 rounds is in `docs/reliability.md`).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::process::{queue_json, start_config};
use crate::common::sink::Sink;
use reqwest::{Client, StatusCode};
use serde_json::Value;

const SENDERS: usize = 6;
const FORWARDERS: usize = 2;
const RECEIVERS: usize = 4;
const PUBLISHERS: usize = 2;
/// The queues every event of the loop goes to.
const FAN_QUEUES: [&str; 2] = ["fan-a", "fan-b"];

/// Everything the clients saw, in one place.
#[derive(Default)]
struct History {
    attempted: BTreeSet<String>,
    acknowledged: BTreeSet<String>,
    /// tag → instants at which a receive that returned it was asked for.
    received: BTreeMap<String, Vec<Instant>>,
    /// tag → instant at which its ack answered `204`.
    acked: BTreeMap<String, Instant>,
    ack_failures: usize,
    /// id → the tags it was answered for (more than one: reused).
    ids: BTreeMap<String, BTreeSet<String>>,
    /// Delayed messages of `admin` acknowledged.
    delayed: BTreeSet<String>,
    /// Events acknowledged (`202`).
    events: BTreeSet<String>,
    /// `admin`'s lease timeouts and pause states set, in order, with
    /// whether the change was acknowledged.
    settings: Vec<(u64, bool)>,
    pauses: Vec<(bool, bool)>,
}

type Shared = Arc<Mutex<History>>;

/// Sends `request` carrying `tag` (noted as attempted). `None` when spoold
/// is gone; `Some(true)` when it answered `ok` (the id it gave noted).
async fn tagged(
    history: &Shared,
    request: reqwest::RequestBuilder,
    tag: &str,
    ok: StatusCode,
) -> Option<bool> {
    history.lock().unwrap().attempted.insert(tag.to_string());
    let r = request.body(tag.to_string()).send().await.ok()?;
    if r.status() != ok {
        return Some(false);
    }
    let Ok(answer) = r.json::<Value>().await else {
        return Some(false);
    };
    let id = answer["id"].as_str().unwrap().to_string();
    let mut h = history.lock().unwrap();
    h.ids.entry(id).or_default().insert(tag.to_string());
    Some(true)
}

fn queues(sink_url: &str) -> String {
    format!(
        "[queues.jobs]\nlease_timeout = \"60s\"\nmax_retries = 1000\n\n\
         [queues.hooks]\ndestination = \"{sink_url}/in\"\nconcurrency = 4\nmax_retries = 1000\n\
         backoff = {{ initial = \"50ms\", max = \"200ms\" }}\n\n\
         [queues.fan-a]\nevents = [\"crash.*\"]\n\n[queues.fan-b]\nevents = [\"crash.>\"]\n"
    )
}

/// Publishes events (raw bodies, each its tag) to the two fan queues.
async fn publisher(client: Client, base: String, history: Shared, round: usize, w: usize) {
    for n in 0.. {
        let tag = format!("event r{round} w{w} n{n}");
        let request = client
            .post(format!("{base}/v1/events"))
            .header("spooler-event-type", "crash.ping")
            .header("content-type", "text/plain");
        match tagged(&history, request, &tag, StatusCode::ACCEPTED).await {
            None => return,
            Some(true) => {
                history.lock().unwrap().events.insert(tag);
            }
            Some(false) => {}
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

async fn sender(client: Client, base: String, history: Shared, round: usize, w: usize) {
    for n in 0.. {
        let tag = format!("send r{round} w{w} n{n}");
        let request = client.post(format!("{base}/v1/queues/jobs/messages"));
        match tagged(&history, request, &tag, StatusCode::CREATED).await {
            None => return,
            Some(true) => {
                history.lock().unwrap().acknowledged.insert(tag);
            }
            Some(false) => {}
        }
    }
}

/// Changes `admin`'s settings, pauses and resumes it, and sends it delayed
/// messages (an hour: they stay until the end).
async fn admin(client: Client, base: String, history: Shared, round: usize) {
    for n in 0u64.. {
        let lease = 30 + (round as u64 * 1000 + n) % 1000;
        history.lock().unwrap().settings.push((lease, false));
        let Ok(r) = client
            .put(format!("{base}/v1/queues/admin"))
            .json(&serde_json::json!({ "leaseTimeoutSeconds": lease }))
            .send()
            .await
        else {
            return;
        };
        if r.status().is_success() {
            history.lock().unwrap().settings.last_mut().unwrap().1 = true;
        }
        let pause = n % 2 == 0;
        history.lock().unwrap().pauses.push((pause, false));
        let verb = if pause { "pause" } else { "resume" };
        let Ok(r) = client
            .post(format!("{base}/v1/queues/admin/{verb}"))
            .send()
            .await
        else {
            return;
        };
        if r.status() == StatusCode::NO_CONTENT {
            history.lock().unwrap().pauses.last_mut().unwrap().1 = true;
        }
        let tag = format!("delayed r{round} n{n}");
        let request = client
            .post(format!("{base}/v1/queues/admin/messages"))
            .header("Spooler-Delay", "3600");
        match tagged(&history, request, &tag, StatusCode::CREATED).await {
            None => return,
            Some(true) => {
                history.lock().unwrap().delayed.insert(tag);
            }
            Some(false) => {}
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What a value set by a sequence of changes can be at the end: the last
/// acknowledged one, or any later one (in doubt: it may have been written).
fn possible<T: Copy + PartialEq>(changes: &[(T, bool)], initial: T) -> Vec<T> {
    let from = changes.iter().rposition(|c| c.1);
    let mut out: Vec<T> = changes[from.unwrap_or(0)..].iter().map(|c| c.0).collect();
    if from.is_none() {
        out.push(initial);
    }
    out
}

async fn forwarder(client: Client, base: String, history: Shared, round: usize, w: usize) {
    for n in 0.. {
        let tag = format!("forward r{round} w{w} n{n}");
        let request = client
            .post(format!("{base}/v1/forward/hooks/events?n={n}"))
            .header("content-type", "text/plain");
        match tagged(&history, request, &tag, StatusCode::ACCEPTED).await {
            None => return,
            Some(true) => {
                history.lock().unwrap().acknowledged.insert(tag);
            }
            Some(false) => {}
        }
        // Forwards are a smaller share of the traffic than sends.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Receives in batches and acks each message; returns when spoold is gone,
/// or (when `drain`) when the queue has nothing left.
async fn receiver(client: Client, base: String, history: Shared, drain: bool) {
    loop {
        let asked = Instant::now();
        let wait = if drain { 0 } else { 1 };
        let Ok(r) = client
            .post(format!(
                "{base}/v1/queues/jobs/receive-batch?max=10&wait={wait}"
            ))
            .send()
            .await
        else {
            return;
        };
        let Ok(batch) = r.json::<Value>().await else {
            return;
        };
        let messages = batch["messages"].as_array().cloned().unwrap_or_default();
        if messages.is_empty() && drain {
            return;
        }
        for m in messages {
            let tag = m["body"].as_str().unwrap().to_string();
            history
                .lock()
                .unwrap()
                .received
                .entry(tag.clone())
                .or_default()
                .push(asked);
            let token = m["leaseToken"].as_str().unwrap();
            let Ok(r) = client
                .post(format!("{base}/v1/queues/jobs/leases/{token}/ack"))
                .send()
                .await
            else {
                return;
            };
            let mut h = history.lock().unwrap();
            if r.status() == StatusCode::NO_CONTENT {
                h.acked.insert(tag, Instant::now());
            } else {
                h.ack_failures += 1;
            }
        }
    }
}

fn rounds() -> usize {
    std::env::var("CRASH_LOOP_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

/// Tiny segments, and compaction looking for work ten times a second: a
/// round lasts 0.2–1 s, so with the default period (1 s) most rounds
/// would end before compaction first ran, and the spool would only grow.
const SPOOL_KEYS: &str = "segment_bytes = \"64KiB\"\ncompaction_interval = \"100ms\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loop_loses_nothing_and_resurrects_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // A bounded request time: a request that hangs (in the client: every
    // spoold of a round is dead by the time its clients are joined) fails
    // instead of stalling the loop.
    spoold::testing::install_crypto_provider();
    let client = Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let (sink, sink_url) = Sink::start().await;
    let tables = queues(&sink_url);
    let history: Shared = Arc::default();
    let started = Instant::now();
    let rounds = rounds();

    for round in 0..rounds {
        let mut spoold = start_config(dir.path(), "", SPOOL_KEYS, &tables).await;
        if round == 0 {
            let r = client
                .put(format!("{}/v1/queues/admin", spoold.base))
                .json(&serde_json::json!({ "leaseTimeoutSeconds": 30 }))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success());
        }
        let mut clients = Vec::new();
        for w in 0..SENDERS {
            let (c, b, h) = (client.clone(), spoold.base.clone(), history.clone());
            clients.push(tokio::spawn(sender(c, b, h, round, w)));
        }
        for w in 0..FORWARDERS {
            let (c, b, h) = (client.clone(), spoold.base.clone(), history.clone());
            clients.push(tokio::spawn(forwarder(c, b, h, round, w)));
        }
        for _ in 0..RECEIVERS {
            let (c, b, h) = (client.clone(), spoold.base.clone(), history.clone());
            clients.push(tokio::spawn(receiver(c, b, h, false)));
        }
        for w in 0..PUBLISHERS {
            let (c, b, h) = (client.clone(), spoold.base.clone(), history.clone());
            clients.push(tokio::spawn(publisher(c, b, h, round, w)));
        }
        let (c, b, h) = (client.clone(), spoold.base.clone(), history.clone());
        clients.push(tokio::spawn(admin(c, b, h, round)));
        tokio::time::sleep(Duration::from_millis(200 + rand::random::<u64>() % 800)).await;
        spoold.child.kill().unwrap();
        spoold.child.wait().unwrap();
        for c in clients {
            tokio::time::timeout(Duration::from_secs(60), c)
                .await
                .unwrap_or_else(|_| panic!("round {round}: a client never returned"))
                .unwrap();
        }
        if (round + 1) % 100 == 0 {
            eprintln!(
                "crash loop: {} rounds in {:.0}s",
                round + 1,
                started.elapsed().as_secs_f64()
            );
        }
    }

    // The last process: check `admin`, drain the pull queue, let the push
    // queue deliver.
    let spoold = start_config(dir.path(), "", SPOOL_KEYS, &tables).await;
    let admin_queue = queue_json(&client, &spoold.base, "admin").await;
    let admin_ids = common::process::messages_in(&client, &spoold.base, "admin").await;
    // Every event's tag, counted in each fan queue.
    let mut fanned: Vec<BTreeMap<String, usize>> = Vec::new();
    for queue in FAN_QUEUES {
        let mut counts = BTreeMap::<String, usize>::new();
        for m in common::process::messages_in(&client, &spoold.base, queue).await {
            *counts
                .entry(m["body"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
        fanned.push(counts);
    }
    receiver(client.clone(), spoold.base.clone(), history.clone(), true).await;
    let forwards_acknowledged = history
        .lock()
        .unwrap()
        .acknowledged
        .iter()
        .filter(|t| t.starts_with("forward"))
        .count();
    let deadline = Instant::now() + Duration::from_secs(60);
    let delivered: BTreeMap<String, usize> = loop {
        let mut delivered = BTreeMap::<String, usize>::new();
        for seen in sink.seen() {
            let tag = String::from_utf8(seen.body.to_vec()).unwrap();
            *delivered.entry(tag).or_default() += 1;
        }
        let missing = history
            .lock()
            .unwrap()
            .acknowledged
            .iter()
            .filter(|t| t.starts_with("forward") && !delivered.contains_key(*t))
            .count();
        if missing == 0 || Instant::now() > deadline {
            break delivered;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let stats = queue_json(&client, &spoold.base, "jobs").await;

    // The checker.
    let h = history.lock().unwrap();
    let lost: Vec<&String> = h
        .acknowledged
        .iter()
        .filter(|t| !h.received.contains_key(*t) && !delivered.contains_key(*t))
        .collect();
    let resurrected: Vec<&String> = h
        .received
        .iter()
        .filter(|(tag, asks)| {
            h.acked
                .get(*tag)
                .is_some_and(|acked| asks.iter().any(|asked| asked > acked))
        })
        .map(|(tag, _)| tag)
        .collect();
    let unexpected: Vec<&String> = h
        .received
        .keys()
        .chain(delivered.keys())
        .filter(|t| !h.attempted.contains(*t))
        .collect();
    let reused: Vec<(&String, &BTreeSet<String>)> =
        h.ids.iter().filter(|(_, tags)| tags.len() > 1).collect();
    let delayed_present: BTreeSet<String> = admin_ids
        .iter()
        .map(|m| m["body"].as_str().unwrap().to_string())
        .collect();
    let delayed_lost: Vec<&String> = h.delayed.difference(&delayed_present).collect();
    let lease = admin_queue["settings"]["leaseTimeoutSeconds"]
        .as_f64()
        .unwrap() as u64;
    let paused = admin_queue["stats"]["paused"].as_bool().unwrap();
    let duplicates: usize = h
        .received
        .values()
        .map(|asks| asks.len() - 1)
        .chain(delivered.values().map(|n| n - 1))
        .sum();
    let received_total: usize = h.received.values().map(Vec::len).sum();
    let events_lost: Vec<&String> = h
        .events
        .iter()
        .filter(|t| fanned.iter().any(|counts| !counts.contains_key(*t)))
        .collect();
    let fanouts_duplicated: Vec<&String> = fanned
        .iter()
        .flat_map(|counts| counts.iter().filter(|(_, n)| **n > 1).map(|(t, _)| t))
        .collect();
    let fanouts_partial: Vec<&String> = fanned[0]
        .keys()
        .chain(fanned[1].keys())
        .filter(|t| !(fanned[0].contains_key(*t) && fanned[1].contains_key(*t)))
        .collect();
    let events_unexpected: Vec<&String> = fanned[0]
        .keys()
        .chain(fanned[1].keys())
        .filter(|t| !h.attempted.contains(*t))
        .collect();
    println!(
        "crash loop: {rounds} SIGKILLs in {:.1}s; attempted {}, acknowledged {} ({} sends, {} forwards); \
         received {} ({} distinct), acked {} (ack not 204: {}); delivered {} ({} distinct); \
         {} settings changes, {} pauses/resumes, {} delayed messages ({} lost); \
         {} events acknowledged, {} fanned out (lost {}, duplicated {}, partial {}, unexpected {}); \
         lost {}, resurrected {}, unexpected {}, ids reused {}, duplicates {}",
        started.elapsed().as_secs_f64(),
        h.attempted.len(),
        h.acknowledged.len(),
        h.acknowledged.len() - forwards_acknowledged,
        forwards_acknowledged,
        received_total,
        h.received.len(),
        h.acked.len(),
        h.ack_failures,
        delivered.values().sum::<usize>(),
        delivered.len(),
        h.settings.len(),
        h.pauses.len(),
        h.delayed.len(),
        delayed_lost.len(),
        h.events.len(),
        fanned[0].len(),
        events_lost.len(),
        fanouts_duplicated.len(),
        fanouts_partial.len(),
        events_unexpected.len(),
        lost.len(),
        resurrected.len(),
        unexpected.len(),
        reused.len(),
        duplicates,
    );
    assert!(lost.is_empty(), "lost: {:?}", &lost[..lost.len().min(10)]);
    assert!(events_lost.is_empty(), "events lost: {events_lost:?}");
    assert!(
        fanouts_duplicated.is_empty(),
        "fan-outs applied twice: {fanouts_duplicated:?}"
    );
    assert!(
        fanouts_partial.is_empty(),
        "events in one queue only: {fanouts_partial:?}"
    );
    assert!(
        events_unexpected.is_empty(),
        "events never published: {events_unexpected:?}"
    );
    assert!(!h.events.is_empty(), "no event was acknowledged");
    assert!(resurrected.is_empty(), "resurrected: {resurrected:?}");
    assert!(unexpected.is_empty(), "unexpected: {unexpected:?}");
    assert!(reused.is_empty(), "ids reused: {reused:?}");
    assert!(
        delayed_lost.is_empty(),
        "delayed messages lost: {delayed_lost:?}"
    );
    assert!(
        possible(&h.settings, 30).contains(&lease),
        "admin's lease timeout {lease} is none that was set last: {:?}",
        &h.settings[h.settings.len().saturating_sub(5)..]
    );
    assert!(
        possible(&h.pauses, false).contains(&paused),
        "admin paused = {paused}, against {:?}",
        &h.pauses[h.pauses.len().saturating_sub(5)..]
    );
    // Every round did real work, and the drain left the queue empty.
    assert!(h.acknowledged.len() > rounds * 10);
    assert!(h.acked.len() > rounds);
    assert!(forwards_acknowledged > rounds);
    assert!(h.delayed.len() > rounds / 2);
    assert_eq!(stats["stats"]["visible"], 0, "{stats}");
    assert_eq!(stats["stats"]["leased"], 0, "{stats}");
}
