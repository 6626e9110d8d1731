//! Replicated mode, Jepsen-style: three real replicas on loopback under
//! senders, forwarders (to a local destination) and receivers that ack and
//! nack, while a nemesis, round after round:
//!
//! - kills the primary with SIGKILL; kills a follower (for a second, or
//!   for long enough that the primary purges the log it missed, so it
//!   comes back through a snapshot); freezes the primary with SIGSTOP past
//!   the election timeout;
//! - partitions the replicas (each reaches the others, replication and
//!   relayed API calls alike, through proxies the test controls,
//!   `tests/common/links.rs`): the primary isolated with a client of its
//!   own (which must get no `2xx` once the primary lost its majority), the
//!   primary blackholed while clients of the followers keep calling
//!   (their relays must end, and a new primary serve them), a follower
//!   isolated, a bridge (two replicas that see only the third), flapping
//!   links, and every link delayed;
//! - restarts a follower at once while the primary is cut from the other
//!   follower (a restarted replica must not vote while the primary may
//!   still count on its last answer, or two primaries lease at once);
//! - flaps the connections under the links (`tests/common/wires.rs`:
//!   each direction reset at one end, or blackholed with its bytes and
//!   connections held); floods every cluster port with connections of
//!   someone without the secret and kills the primary; steps the wall
//!   clock of one replica, or of all, an hour ahead and then an hour
//!   behind (the `testing` clock offset, `src/time.rs`).
//!
//! Clients talk to any replica, on both sides of every cut (followers
//! relay). Segments are small and compaction frequent, so snapshots are
//! built, purged behind and sent all along.
//!
//! The checker (as `tests/process/crash_loop.rs`'s, plus what replication
//! adds):
//!
//! - lost: a `2xx` never received nor delivered: must be 0;
//! - resurrected: received by a receive asked for after its ack's `204`
//!   (a message leased twice, once by a primary that should no longer
//!   lease, is one);
//! - unexpected: received but never sent; ids reused: one id for two
//!   messages: must be 0;
//! - retry counts raised by a primary change: a receive showing a retry
//!   count above the nacks of that message that were answered `204` or in
//!   doubt, or were still on their way (leases last 10 minutes, so no
//!   lease expires during the test): must be 0;
//! - stale tokens: a token of an older term answered anything but
//!   `409 stale_lease`: must be 0;
//! - acknowledged by an isolated primary: a `2xx` to a send that reached
//!   the primary after it was cut from both followers (plus its leader
//!   lease of `election_timeout / 2` and a margin): must be 0;
//! - duplicates: counted, allowed;
//! - ordering keys (`jobs` is `ordering = "per_key"`, and half the sends
//!   carry one of a few keys): two messages of one key leased at once by
//!   one primary (the second leased after the first's lease was answered,
//!   and answered before the first was settled, both under one term), or
//!   a message of a key leased after a later one of its key was already
//!   out (an inversion): must be 0;
//! - at the end, every replica holds the same state (the digest of
//!   `GET /v1/cluster?digest=true` at the same applied index).
//!
//! It also measures failover: from `kill -9` of the primary (with and
//! without the flood), and from the moment it is blackholed, to the first
//! `201` through a follower. Rounds: `CLUSTER_NEMESIS_ROUNDS` (default 15,
//! each fault once, what CI runs;
//! local runs and their figures: `docs/reliability.md`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::cluster::{TestCluster, hold_one_byte};
use crate::common::sink::Sink;
use crate::common::wires::Way;
use base64::Engine as _;
use reqwest::{Client, StatusCode};
use serde_json::Value;

const SENDERS: usize = 4;
const HOUR_MS: i64 = 3_600_000;
const RECEIVERS: usize = 2;

#[derive(Default)]
struct History {
    attempted: BTreeSet<String>,
    acknowledged: BTreeSet<String>,
    /// tag → (instant the receive was asked for, retry count shown, nacks
    /// that may have been applied by then: answered 204 or in doubt, or
    /// still on their way).
    received: BTreeMap<String, Vec<(Instant, u32, u32)>>,
    acked: BTreeMap<String, Instant>,
    nacked: BTreeMap<String, u32>,
    /// Nacks sent and not answered yet: one may be applied (and its
    /// message received again) before its answer arrives.
    nacks_in_flight: BTreeMap<String, u32>,
    ids: BTreeMap<String, BTreeSet<String>>,
    stale_token_violations: Vec<String>,
    stale_tokens_checked: usize,
    failovers: Vec<Duration>,
    /// From blackholing the primary to the first `201` through a follower.
    blackhole_failovers: Vec<Duration>,
    /// From `kill -9` of the primary, while someone without the secret
    /// holds connections on every cluster port, to the first `201`.
    flood_failovers: Vec<Duration>,
    /// Sends to an isolated primary: tried, and answered `2xx` although
    /// they reached it after it lost its majority.
    isolated_tried: usize,
    isolated_acknowledged: Vec<String>,
    /// Every lease of a message with an ordering key.
    keyed: Vec<KeyedLease>,
}

/// A lease of a message with an ordering key, as the client saw it.
struct KeyedLease {
    key: String,
    /// Ids sort in journal order.
    id: String,
    term: u64,
    asked: Instant,
    answered: Instant,
    /// When its ack or nack was sent (never: it is held still).
    settled: Option<Instant>,
}

/// Of the keyed leases, the pairs that broke the key's order: two of a
/// key out at once under one primary, or an earlier one out after a
/// later one.
fn order_violations(leases: &[KeyedLease]) -> Vec<String> {
    let mut found = Vec::new();
    for a in leases {
        for b in leases {
            if a.key != b.key || a.id == b.id {
                continue;
            }
            let held = a.settled.is_none_or(|settled| b.answered < settled);
            if a.term == b.term && a.answered < b.asked && held {
                found.push(format!("{}: {} and {} out at once", a.key, a.id, b.id));
            }
            if b.id < a.id && a.answered < b.asked {
                found.push(format!("{}: {} out after {}", a.key, b.id, a.id));
            }
        }
    }
    found
}

/// Records a lease of a keyed message (`m` as a batch shows it): its
/// index in the history's keyed leases.
fn note_keyed(h: &mut History, m: &Value, asked: Instant) -> Option<usize> {
    let key = m["orderingKey"].as_str()?;
    h.keyed.push(KeyedLease {
        key: key.to_owned(),
        id: m["id"].as_str()?.to_owned(),
        term: token_term(m["leaseToken"].as_str()?),
        asked,
        answered: Instant::now(),
        settled: None,
    });
    Some(h.keyed.len() - 1)
}

impl History {
    /// The nacks of `tag` that may have been applied by now.
    fn nacks_of(&self, tag: &str) -> u32 {
        self.nacked.get(tag).copied().unwrap_or(0)
            + self.nacks_in_flight.get(tag).copied().unwrap_or(0)
    }
}

type Shared = Arc<Mutex<History>>;

fn pick(bases: &[String]) -> &str {
    &bases[rand::random::<u64>() as usize % bases.len()]
}

/// The term a lease token was issued in (`src/engine/token.rs`).
fn token_term(token: &str) -> u64 {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .unwrap();
    u64::from_le_bytes(bytes[1..9].try_into().unwrap())
}

async fn send(
    client: &Client,
    history: &Shared,
    base: &str,
    path: &str,
    tag: &str,
    ok: StatusCode,
    ordering_key: Option<String>,
) -> bool {
    history.lock().unwrap().attempted.insert(tag.to_owned());
    let mut request = client
        .post(format!("{base}{path}"))
        .header("content-type", "text/plain")
        .body(tag.to_owned());
    if let Some(key) = ordering_key {
        request = request.header("spooler-ordering-key", key);
    }
    let Ok(r) = request.send().await else {
        return false;
    };
    if r.status() != ok {
        return false;
    }
    let Ok(v) = r.json::<Value>().await else {
        return false;
    };
    let mut h = history.lock().unwrap();
    h.acknowledged.insert(tag.to_owned());
    h.ids
        .entry(v["id"].as_str().unwrap().to_owned())
        .or_default()
        .insert(tag.to_owned());
    true
}

async fn sender(
    client: Client,
    bases: Vec<String>,
    history: Shared,
    w: usize,
    stop: Arc<Mutex<bool>>,
) {
    for n in 0u64.. {
        if *stop.lock().unwrap() {
            return;
        }
        let tag = format!("send w{w} n{n}");
        let base = pick(&bases).to_owned();
        send(
            &client,
            &history,
            &base,
            "/v1/queues/jobs/messages",
            &tag,
            StatusCode::CREATED,
            n.is_multiple_of(2).then(|| format!("k{}", n % 6)),
        )
        .await;
        if n % 8 == 0 {
            let tag = format!("forward w{w} n{n}");
            let base = pick(&bases).to_owned();
            send(
                &client,
                &history,
                &base,
                "/v1/forward/hooks/in",
                &tag,
                StatusCode::ACCEPTED,
                None,
            )
            .await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Receives and settles: acks most, nacks some (visible again at once).
/// Returns when `stop` is set, or (`drain`) when nothing is left.
async fn receiver(
    client: Client,
    bases: Vec<String>,
    history: Shared,
    stop: Arc<Mutex<bool>>,
    drain: bool,
) {
    let mut empty = 0;
    loop {
        if *stop.lock().unwrap() {
            return;
        }
        let base = pick(&bases).to_owned();
        let asked = Instant::now();
        let wait = if drain { 0 } else { 1 };
        let Ok(r) = client
            .post(format!(
                "{base}/v1/queues/jobs/receive-batch?max=10&wait={wait}"
            ))
            .send()
            .await
        else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        if r.status() != StatusCode::OK {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let Ok(batch) = r.json::<Value>().await else {
            continue;
        };
        let messages = batch["messages"].as_array().cloned().unwrap_or_default();
        if messages.is_empty() {
            empty += 1;
            if drain && empty >= 5 {
                return;
            }
            continue;
        }
        empty = 0;
        for m in messages {
            let tag = m["body"].as_str().unwrap().to_owned();
            let retry = m["retryCount"].as_u64().unwrap() as u32;
            let keyed = {
                let mut h = history.lock().unwrap();
                let nacks = h.nacks_of(&tag);
                h.received
                    .entry(tag.clone())
                    .or_default()
                    .push((asked, retry, nacks));
                note_keyed(&mut h, &m, asked)
            };
            let token = m["leaseToken"].as_str().unwrap();
            let nack = !drain && rand::random::<u64>().is_multiple_of(8);
            if nack {
                *history
                    .lock()
                    .unwrap()
                    .nacks_in_flight
                    .entry(tag.clone())
                    .or_default() += 1;
            }
            let verb = if nack { "nack" } else { "ack" };
            if let Some(i) = keyed {
                history.lock().unwrap().keyed[i].settled = Some(Instant::now());
            }
            let base = pick(&bases).to_owned();
            let mut answer = client
                .post(format!("{base}/v1/queues/jobs/leases/{token}/{verb}"))
                .send()
                .await
                .map(|r| r.status());
            // Draining, an ack that did not land is tried again: a lease
            // left behind holds its ordering key for the whole lease.
            for _ in 0..20 {
                if !drain || matches!(answer, Ok(StatusCode::NO_CONTENT | StatusCode::CONFLICT)) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                let base = pick(&bases).to_owned();
                answer = client
                    .post(format!("{base}/v1/queues/jobs/leases/{token}/{verb}"))
                    .send()
                    .await
                    .map(|r| r.status());
            }
            let mut h = history.lock().unwrap();
            if nack {
                *h.nacks_in_flight.get_mut(&tag).expect("counted above") -= 1;
            }
            match (nack, answer) {
                (false, Ok(StatusCode::NO_CONTENT)) => {
                    h.acked.insert(tag, Instant::now());
                }
                // A nack that was applied, or may have been.
                (true, Ok(StatusCode::NO_CONTENT))
                | (true, Ok(StatusCode::INTERNAL_SERVER_ERROR))
                | (true, Err(_)) => {
                    *h.nacked.entry(tag).or_default() += 1;
                }
                _ => {}
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    KillPrimary,
    KillFollower,
    FreezePrimary,
    /// A follower down for several seconds: more than the 1 000 records
    /// openraft keeps behind a snapshot go by.
    LagFollower,
    /// The primary cut from both followers for 3 s, while a client keeps
    /// sending to it.
    IsolatePrimary,
    /// A follower cut from the others for 3 s.
    IsolateFollower,
    /// Two replicas cut from each other, both still linked to the third,
    /// for 4 s.
    Bridge,
    /// A random link flipped every 200 ms for 4 s.
    Flap,
    /// Every link delayed by 20–150 ms for 3 s.
    Delay,
    /// The primary cut from everyone (replication and relays: a blackhole)
    /// while clients keep calling the followers.
    BlackholePrimary,
    /// The primary cut from one follower past the election timeout; the
    /// other follower killed, cut from the primary too and restarted at
    /// once.
    RestartFollowerCutFromPrimary,
    /// The connections under the links flap (`common::wires`): for 4 s,
    /// every 50–400 ms one direction of one replica's wire reset (heard
    /// at one end only), blackholed (its bytes held, connections left
    /// open) or up again; then all healed.
    FlapWires,
    /// Someone without the secret holds 1 100 connections on each
    /// replica's cluster port (one byte each, reopened when closed), and
    /// the primary is killed.
    SlotFlood,
    /// One replica's wall clock an hour ahead for 0.3 s, then an hour
    /// behind for 3 s (it is skewed from its peers meanwhile).
    StepOneClock,
    /// Every replica's wall clock likewise, together.
    StepAllClocks,
}

/// How long after its isolation a primary may still answer `2xx`: its
/// leader lease (`election_timeout / 2`, 250 ms by default), plus the
/// time for an answer already decided to arrive.
const ISOLATED_GRACE: Duration = Duration::from_millis(750);

/// Sends to `base` (an isolated primary) until `until`: how many were
/// tried, and the tags of those answered `2xx` that were sent after
/// `cut + ISOLATED_GRACE`.
async fn isolated_client(
    client: Client,
    base: String,
    history: Shared,
    cut: Instant,
    until: Instant,
) {
    let mut n = 0;
    while Instant::now() < until {
        n += 1;
        let tag = format!("isolated {cut:?} n{n}");
        let sent_at = Instant::now();
        let acknowledged = send(
            &client,
            &history,
            &base,
            "/v1/queues/jobs/messages",
            &tag,
            StatusCode::CREATED,
            None,
        )
        .await;
        {
            let mut h = history.lock().unwrap();
            h.isolated_tried += 1;
            if acknowledged && sent_at > cut + ISOLATED_GRACE {
                h.isolated_acknowledged.push(tag);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn rounds() -> usize {
    std::env::var("CLUSTER_NEMESIS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(FAULTS.len())
}

const FAULTS: [Fault; 15] = [
    Fault::KillPrimary,
    Fault::IsolatePrimary,
    Fault::FreezePrimary,
    Fault::Bridge,
    Fault::KillFollower,
    Fault::IsolateFollower,
    Fault::LagFollower,
    Fault::Flap,
    Fault::Delay,
    Fault::BlackholePrimary,
    Fault::RestartFollowerCutFromPrimary,
    Fault::FlapWires,
    Fault::SlotFlood,
    Fault::StepOneClock,
    Fault::StepAllClocks,
];

/// Sends through `through` until one is answered `201`; how long that
/// took from `since`.
async fn first_201(
    client: &Client,
    history: &Shared,
    cluster: &TestCluster,
    (through, since, what): (&str, Instant, &str),
) -> Duration {
    loop {
        let tag = format!("probe {what} {:?}", since.elapsed());
        if send(
            client,
            history,
            through,
            "/v1/queues/jobs/messages",
            &tag,
            StatusCode::CREATED,
            None,
        )
        .await
        {
            return since.elapsed();
        }
        if since.elapsed() > Duration::from_secs(30) {
            cluster.dump_logs(40);
            panic!("no 201 through {through} within 30 s of {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Leases one message at the primary and keeps its token, to ack it after
/// the next fault.
async fn take_token(
    client: &Client,
    base: &str,
    history: &Shared,
) -> Option<(String, String, Option<usize>)> {
    let asked = Instant::now();
    let r = client
        .post(format!("{base}/v1/queues/jobs/receive-batch?max=1"))
        .send()
        .await
        .ok()?;
    let batch: Value = r.json().await.ok()?;
    let m = batch["messages"].as_array()?.first()?.clone();
    let tag = m["body"].as_str()?.to_owned();
    let mut h = history.lock().unwrap();
    let nacks = h.nacks_of(&tag);
    let retry = m["retryCount"].as_u64()? as u32;
    h.received
        .entry(tag.clone())
        .or_default()
        .push((Instant::now(), retry, nacks));
    let keyed = note_keyed(&mut h, &m, asked);
    Some((tag, m["leaseToken"].as_str()?.to_owned(), keyed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nemesis_loses_nothing_resurrects_nothing_and_raises_no_retry_count() {
    spoold::testing::install_crypto_provider();
    let client = Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let (sink, sink_url) = Sink::start().await;
    let tables = format!(
        "[queues.jobs]\nlease_timeout = \"10m\"\nmax_retries = 1000\nordering = \"per_key\"\n\n\
         [queues.hooks]\ndestination = \"{sink_url}\"\nconcurrency = 4\nmax_retries = 1000\n\
         backoff = {{ initial = \"50ms\", max = \"200ms\" }}\n"
    );
    let spool = "segment_bytes = \"64KiB\"\ncompaction_interval = \"200ms\"";
    let (mut cluster, links, wires) = TestCluster::behind_links_and_wires(3, spool, "", &tables);
    cluster.with_clock_files();
    cluster.start_all().await;
    let bases: Vec<String> = cluster.replicas.iter().map(|r| r.base()).collect();
    cluster.primary(Duration::from_secs(10)).await;
    let history: Shared = Arc::default();
    let stop = Arc::new(Mutex::new(false));
    let mut clients = Vec::new();
    for w in 0..SENDERS {
        let (c, b, h, s) = (client.clone(), bases.clone(), history.clone(), stop.clone());
        clients.push(tokio::spawn(sender(c, b, h, w, s)));
    }
    for _ in 0..RECEIVERS {
        let (c, b, h, s) = (client.clone(), bases.clone(), history.clone(), stop.clone());
        clients.push(tokio::spawn(receiver(c, b, h, s, false)));
    }

    let faults = FAULTS;
    let ids: Vec<u64> = cluster.replicas.iter().map(|r| r.id).collect();
    for round in 0..rounds() {
        tokio::time::sleep(Duration::from_millis(500 + rand::random::<u64>() % 1000)).await;
        let primary = cluster.primary(Duration::from_secs(20)).await;
        let held = take_token(&client, &bases[primary], &history).await;
        let fault = faults[round % faults.len()];
        let follower = (primary + 1 + rand::random::<u64>() as usize % 2) % 3;
        match fault {
            Fault::KillPrimary | Fault::SlotFlood => {
                let flood = Arc::new(AtomicBool::new(false));
                if matches!(fault, Fault::SlotFlood) {
                    for r in &cluster.replicas {
                        hold_one_byte(r.raft_port, 1_100, flood.clone());
                    }
                    tokio::time::sleep(Duration::from_secs(3)).await;
                }
                cluster.kill(primary);
                let killed = Instant::now();
                let what = format!("r{round} {fault:?}");
                let took = first_201(
                    &client,
                    &history,
                    &cluster,
                    (&bases[follower], killed, &what),
                )
                .await;
                match fault {
                    Fault::SlotFlood => history.lock().unwrap().flood_failovers.push(took),
                    _ => history.lock().unwrap().failovers.push(took),
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                cluster.start(primary);
                flood.store(true, Ordering::Relaxed);
            }
            Fault::BlackholePrimary => {
                links.isolate(ids[primary], &ids);
                links.cut_api(ids[primary]);
                let cut = Instant::now();
                let what = format!("r{round} blackhole");
                let took =
                    first_201(&client, &history, &cluster, (&bases[follower], cut, &what)).await;
                history.lock().unwrap().blackhole_failovers.push(took);
                tokio::time::sleep(Duration::from_millis(1000)).await;
                links.heal();
            }
            Fault::RestartFollowerCutFromPrimary => {
                let other = 3 - primary - follower;
                links.cut(ids[primary], ids[other]);
                // Past the election timeout: the other follower campaigns.
                tokio::time::sleep(Duration::from_millis(800)).await;
                cluster.kill(follower);
                links.cut(ids[primary], ids[follower]);
                cluster.start(follower);
                tokio::time::sleep(Duration::from_secs(3)).await;
                links.heal();
            }
            Fault::KillFollower => {
                cluster.kill(follower);
                tokio::time::sleep(Duration::from_millis(1000)).await;
                cluster.start(follower);
            }
            Fault::LagFollower => {
                cluster.kill(follower);
                tokio::time::sleep(Duration::from_millis(6000)).await;
                cluster.start(follower);
            }
            Fault::FreezePrimary => {
                let process = cluster.replicas[primary].process.as_ref().unwrap();
                process.signal("-STOP");
                tokio::time::sleep(Duration::from_millis(1500)).await;
                process.signal("-CONT");
            }
            Fault::IsolatePrimary => {
                links.isolate(ids[primary], &ids);
                links.cut_api(ids[primary]);
                let cut = Instant::now();
                let until = cut + Duration::from_secs(3);
                // Short timeouts: a send the isolated primary holds is
                // given up (not acknowledged) and another one tried.
                let impatient = Client::builder()
                    .timeout(Duration::from_millis(500))
                    .build()
                    .unwrap();
                let isolated: Vec<_> = (0..3)
                    .map(|_| {
                        tokio::spawn(isolated_client(
                            impatient.clone(),
                            bases[primary].clone(),
                            history.clone(),
                            cut,
                            until,
                        ))
                    })
                    .collect();
                for c in isolated {
                    c.await.unwrap();
                }
                links.heal();
            }
            Fault::IsolateFollower => {
                links.isolate(ids[follower], &ids);
                tokio::time::sleep(Duration::from_secs(3)).await;
                links.heal();
            }
            Fault::Bridge => {
                // The bridge is a random replica; the other two lose
                // each other.
                let bridge = rand::random::<u64>() as usize % 3;
                links.cut(ids[(bridge + 1) % 3], ids[(bridge + 2) % 3]);
                tokio::time::sleep(Duration::from_secs(4)).await;
                links.heal();
            }
            Fault::Flap => {
                let until = Instant::now() + Duration::from_secs(4);
                while Instant::now() < until {
                    let a = rand::random::<u64>() as usize % 3;
                    links.toggle(ids[a], ids[(a + 1) % 3]);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                links.heal();
            }
            Fault::FlapWires => {
                let until = Instant::now() + Duration::from_secs(4);
                while Instant::now() < until {
                    let from = rand::random::<u64>() as usize % 3;
                    let to = (from + 1 + rand::random::<u64>() as usize % 2) % 3;
                    let way = match rand::random::<u64>() % 3 {
                        0 => Way::Up,
                        1 => Way::Reset,
                        _ => Way::Blackhole,
                    };
                    wires.set(ids[from], ids[to], way);
                    tokio::time::sleep(Duration::from_millis(50 + rand::random::<u64>() % 350))
                        .await;
                }
                wires.heal();
            }
            Fault::StepOneClock | Fault::StepAllClocks => {
                let stepped: Vec<usize> = match fault {
                    Fault::StepOneClock => vec![rand::random::<u64>() as usize % 3],
                    _ => vec![0, 1, 2],
                };
                cluster.step_clocks(&stepped, HOUR_MS);
                tokio::time::sleep(Duration::from_millis(300)).await;
                cluster.step_clocks(&stepped, -HOUR_MS);
                tokio::time::sleep(Duration::from_secs(3)).await;
                cluster.step_clocks(&stepped, 0);
            }
            Fault::Delay => {
                links.delay(Duration::from_millis(20 + rand::random::<u64>() % 130));
                tokio::time::sleep(Duration::from_secs(3)).await;
                links.heal();
            }
        }
        // The token taken before the fault: stale if the primary changed.
        let now = cluster.primary(Duration::from_secs(20)).await;
        let term = cluster.status(now).await.unwrap()["term"].as_u64().unwrap();
        if let Some((tag, token, keyed)) = held {
            if let Some(i) = keyed {
                history.lock().unwrap().keyed[i].settled = Some(Instant::now());
            }
            let r = client
                .post(format!("{}/v1/queues/jobs/leases/{token}/ack", bases[now]))
                .send()
                .await
                .unwrap();
            let status = r.status();
            let v: Value = r.json().await.unwrap_or(Value::Null);
            let mut h = history.lock().unwrap();
            if token_term(&token) < term {
                h.stale_tokens_checked += 1;
                if status != StatusCode::CONFLICT || v["kind"] != "stale_lease" {
                    h.stale_token_violations
                        .push(format!("{fault:?}: {status} {v}"));
                }
            } else if status == StatusCode::NO_CONTENT {
                h.acked.insert(tag, Instant::now());
            }
        }
        eprintln!(
            "round {round}: {fault:?} done, primary now node {}",
            now + 1
        );
    }

    // Stop the clients; every replica up; one last primary change drops
    // the leases of acks that failed, then drain.
    *stop.lock().unwrap() = true;
    for c in clients {
        tokio::time::timeout(Duration::from_secs(60), c)
            .await
            .unwrap()
            .unwrap();
    }
    for i in 0..3 {
        if cluster.replicas[i].process.is_none() {
            cluster.start(i);
        }
    }
    let primary = cluster.primary(Duration::from_secs(20)).await;
    cluster.kill(primary);
    cluster.primary(Duration::from_secs(20)).await;
    cluster.start(primary);
    let drain_stop = Arc::new(Mutex::new(false));
    receiver(
        client.clone(),
        bases.clone(),
        history.clone(),
        drain_stop,
        true,
    )
    .await;

    // Every replica ends with the same state.
    let deadline = Instant::now() + Duration::from_secs(30);
    let digests = loop {
        let mut digests = Vec::new();
        for r in &cluster.replicas {
            let v: Option<Value> = match client
                .get(format!("{}/v1/cluster?digest=true", r.base()))
                .send()
                .await
            {
                Ok(r) => r.json().await.ok(),
                Err(_) => None,
            };
            digests.push(v.map(|v| v["stateDigest"].clone()));
        }
        if digests.iter().all(|d| d.is_some() && *d == digests[0]) || Instant::now() > deadline {
            break digests;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let snapshots: usize = cluster
        .replicas
        .iter()
        .filter_map(|r| r.process.as_ref())
        .map(|p| p.log().matches("installed a snapshot").count())
        .sum();
    eprintln!(
        "cluster nemesis: snapshots installed by restarted replicas (last run of each): {snapshots}"
    );
    assert!(
        digests.iter().all(|d| d.is_some() && *d == digests[0]),
        "the replicas' states differ: {digests:?}"
    );

    // What the queue holds at the end: told if anything was lost.
    let jobs: Option<Value> = match client
        .get(format!("{}/v1/queues/jobs", bases[0]))
        .send()
        .await
    {
        Ok(r) => r.json().await.ok(),
        Err(_) => None,
    };
    let h = history.lock().unwrap();
    let forwards: BTreeSet<&String> = h
        .acknowledged
        .iter()
        .filter(|t| t.starts_with("forward"))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let delivered: BTreeMap<String, usize> = loop {
        let mut delivered = BTreeMap::<String, usize>::new();
        for seen in sink.seen() {
            *delivered
                .entry(String::from_utf8(seen.body.to_vec()).unwrap())
                .or_default() += 1;
        }
        if forwards.iter().all(|t| delivered.contains_key(*t)) || Instant::now() > deadline {
            break delivered;
        }
        std::thread::sleep(Duration::from_millis(100));
    };

    let lost: Vec<&String> = h
        .acknowledged
        .iter()
        .filter(|t| !h.received.contains_key(*t) && !delivered.contains_key(*t))
        .collect();
    let resurrected: Vec<&String> = h
        .acked
        .iter()
        .filter(|(t, at)| h.received[*t].iter().any(|(asked, _, _)| asked > *at))
        .map(|(t, _)| t)
        .collect();
    let unexpected: Vec<&String> = h
        .received
        .keys()
        .chain(delivered.keys())
        .filter(|t| !h.attempted.contains(*t))
        .collect();
    let reused: Vec<&String> = h
        .ids
        .iter()
        .filter(|(_, tags)| tags.len() > 1)
        .map(|(id, _)| id)
        .collect();
    let raised: Vec<String> = h
        .received
        .iter()
        .flat_map(|(t, seen)| {
            seen.iter()
                .filter(|(_, retry, nacks)| retry > nacks)
                .map(move |(_, retry, nacks)| format!("{t}: retry {retry} after {nacks} nacks"))
        })
        .collect();
    let out_of_order = order_violations(&h.keyed);
    let duplicates: usize = h.received.values().map(|v| v.len() - 1).sum::<usize>()
        + delivered.values().map(|n| n - 1).sum::<usize>();
    let mut failovers = h.failovers.clone();
    failovers.sort();
    let median = failovers
        .get(failovers.len() / 2)
        .copied()
        .unwrap_or_default();
    let worst = failovers.last().copied().unwrap_or_default();
    let mut blackholes = h.blackhole_failovers.clone();
    blackholes.sort();
    let blackhole_median = blackholes
        .get(blackholes.len() / 2)
        .copied()
        .unwrap_or_default();
    let blackhole_worst = blackholes.last().copied().unwrap_or_default();
    let mut floods = h.flood_failovers.clone();
    floods.sort();
    let flood_worst = floods.last().copied().unwrap_or_default();
    eprintln!(
        "cluster nemesis: {} rounds; acknowledged {}, acked {}, nacked {}; lost {}, resurrected {}, \
         unexpected {}, ids reused {}, retry counts raised {}, stale tokens {} checked / {} wrong, \
         acknowledged by an isolated primary {} of {} tried, keyed leases {} / out of order {}, \
         duplicates {}; failover median {median:?}, worst {worst:?} ({} kills); \
         failover from a blackholed primary median {blackhole_median:?}, worst {blackhole_worst:?} \
         ({} blackholes); failover under a slot flood worst {flood_worst:?} ({} floods)",
        rounds(),
        h.acknowledged.len(),
        h.acked.len(),
        h.nacked.values().sum::<u32>(),
        lost.len(),
        resurrected.len(),
        unexpected.len(),
        reused.len(),
        raised.len(),
        h.stale_tokens_checked,
        h.stale_token_violations.len(),
        h.isolated_acknowledged.len(),
        h.isolated_tried,
        h.keyed.len(),
        out_of_order.len(),
        duplicates,
        failovers.len(),
        blackholes.len(),
        floods.len(),
    );
    if !lost.is_empty() {
        let keyed = (lost.iter())
            .filter(|t| t.starts_with("send") && t.ends_with(['0', '2', '4', '6', '8']))
            .count();
        eprintln!("lost {} ({keyed} keyed sends); jobs: {jobs:?}", lost.len());
    }
    assert!(lost.is_empty(), "lost: {lost:?}");
    assert!(resurrected.is_empty(), "resurrected: {resurrected:?}");
    assert!(unexpected.is_empty(), "unexpected: {unexpected:?}");
    assert!(reused.is_empty(), "ids reused: {reused:?}");
    assert!(raised.is_empty(), "retry counts raised: {raised:?}");
    assert!(
        h.stale_token_violations.is_empty(),
        "{:?}",
        h.stale_token_violations
    );
    assert!(
        h.isolated_acknowledged.is_empty(),
        "an isolated primary acknowledged: {:?}",
        h.isolated_acknowledged
    );
    assert!(out_of_order.is_empty(), "out of order: {out_of_order:?}");
    assert!(h.acknowledged.len() > 100, "too little traffic to judge");
    assert!(h.keyed.len() > 50, "too few keyed leases to judge");
}
