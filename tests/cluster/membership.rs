//! Running a cluster (docs/operations.md): members added and removed
//! under load, a replica whose disk was wiped, the refusals of what would
//! lose the quorum, and a rolling restart, against real processes on
//! loopback. Every acknowledged message is checked for afterwards, and
//! replicas are compared by their state digests (`GET /v1/cluster?digest=true`:
//! every message, queue and dedup key, without leases).

use crate::common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::cluster::{TestCluster, all_ids};
use crate::common::process::{cli, client, wait_ready};
use reqwest::StatusCode;
use serde_json::Value;

const QUEUE: &str = "jobs";
/// Small segments and frequent compaction: snapshots and purges happen.
const SPOOL: &str = "segment_bytes = \"64KiB\"\ncompaction_interval = \"100ms\"";
const TABLES: &str = "[queues.jobs]\n";

/// Starts replica `i` (not a member yet), waits for its API, and adds it
/// through `base` with `spoold cluster add`, waiting until it is a voter:
/// what the CLI printed.
async fn start_and_add(cluster: &mut TestCluster, i: usize, base: &str) -> String {
    cluster.start(i);
    common::wait_until("the new replica answers", async || {
        cluster.status(i).await.is_some()
    })
    .await;
    let id = cluster.replicas[i].id.to_string();
    let addr = cluster.raft_addr(i);
    let ran = cli(base, &["cluster", "add", &id, &addr, "--wait", "60s"]).await;
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    ran.stdout
}

/// Senders that keep sending to any of `bases` (another one after a
/// failure) until stopped: what was acknowledged, how many answers were
/// `503` (or no answer), and the longest a sender went without a `201`.
struct Load {
    stop: Arc<AtomicBool>,
    acknowledged: Arc<Mutex<BTreeSet<String>>>,
    unavailable: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<Duration>>,
}

impl Load {
    fn start(bases: Vec<String>, senders: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acknowledged = Arc::new(Mutex::new(BTreeSet::new()));
        let unavailable = Arc::new(AtomicU64::new(0));
        let http = client();
        let tasks = (0..senders)
            .map(|s| {
                let (stop, acknowledged, unavailable) =
                    (stop.clone(), acknowledged.clone(), unavailable.clone());
                let (bases, http) = (bases.clone(), http.clone());
                tokio::spawn(async move {
                    let mut n = 0u64;
                    let mut at = s;
                    let (mut last, mut longest) = (Instant::now(), Duration::ZERO);
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let base = &bases[at % bases.len()];
                        let sent = http
                            .post(format!("{base}/v1/queues/{QUEUE}/messages"))
                            .body(format!("sender {s} message {n} {}", "x".repeat(200)))
                            .timeout(Duration::from_secs(15))
                            .send()
                            .await;
                        match sent {
                            Ok(r) if r.status() == StatusCode::CREATED => {
                                let v: Value = r.json().await.unwrap();
                                let id = v["id"].as_str().unwrap().to_owned();
                                acknowledged.lock().unwrap().insert(id);
                                longest = longest.max(last.elapsed());
                                last = Instant::now();
                            }
                            other => {
                                if other.is_err()
                                    || other.is_ok_and(|r| {
                                        r.status() == StatusCode::SERVICE_UNAVAILABLE
                                    })
                                {
                                    unavailable.fetch_add(1, Ordering::Relaxed);
                                }
                                at += 1;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    }
                    longest
                })
            })
            .collect();
        Load {
            stop,
            acknowledged,
            unavailable,
            tasks,
        }
    }

    fn acknowledged(&self) -> usize {
        self.acknowledged.lock().unwrap().len()
    }

    /// Waits (at most a minute) until `n` sends have been acknowledged.
    async fn until_acknowledged(&self, n: usize) {
        common::eventually(
            &format!("{n} sends acknowledged"),
            Duration::from_secs(60),
            async || (self.acknowledged() >= n).then_some(()),
        )
        .await
    }

    /// Stops the senders: every id acknowledged, the `503`s counted, and
    /// the longest wait of a sender for a `201`.
    async fn finish(self) -> (BTreeSet<String>, u64, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        let mut longest = Duration::ZERO;
        for t in self.tasks {
            longest = longest.max(t.await.unwrap());
        }
        let ids = self.acknowledged.lock().unwrap().clone();
        (ids, self.unavailable.load(Ordering::Relaxed), longest)
    }
}

/// The voters and learners the primary (reached through `base`) names.
async fn members(cluster: &TestCluster, i: usize) -> (BTreeSet<u64>, BTreeSet<u64>) {
    let s = cluster.status(i).await.unwrap();
    let (mut voters, mut learners) = (BTreeSet::new(), BTreeSet::new());
    for m in s["members"].as_array().unwrap() {
        let id = m["nodeId"].as_u64().unwrap();
        if m["voter"] == Value::Bool(true) {
            voters.insert(id);
        } else {
            learners.insert(id);
        }
    }
    (voters, learners)
}

/// Node ids of `cluster.replicas[i]` for each `i`.
fn ids_of(cluster: &TestCluster, of: &[usize]) -> BTreeSet<u64> {
    of.iter().map(|&i| cluster.replicas[i].id).collect()
}

/// A fourth replica added and the primary removed while senders run:
/// nothing acknowledged is lost, and the new replica ends with the same
/// state as the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_added_and_removed_under_load_lose_nothing() {
    let mut cluster = TestCluster::with_spool(3, SPOOL, "", TABLES);
    cluster.start_all().await;
    let first = cluster.primary(Duration::from_secs(10)).await;
    let bases: Vec<String> = (0..3).map(|i| cluster.replicas[i].base()).collect();
    // Clients of the two replicas that stay.
    let staying: Vec<usize> = (0..3).filter(|&i| i != first).collect();
    let load = Load::start(staying.iter().map(|&i| bases[i].clone()).collect(), 6);

    // Node 4 joins through a follower's API (relayed to the primary).
    load.until_acknowledged(300).await;
    let new = cluster.spare();
    assert_eq!(cluster.replicas[new].id, 4);
    let printed = start_and_add(&mut cluster, new, &bases[staying[0]]).await;
    assert!(printed.contains("voter"), "{printed}");
    let p = cluster.primary(Duration::from_secs(10)).await;
    assert_eq!(members(&cluster, p).await.0, BTreeSet::from([1, 2, 3, 4]));

    // The primary leaves (it steps down once the change commits).
    let before = load.acknowledged();
    load.until_acknowledged(before + 300).await;
    let leaving = cluster.primary(Duration::from_secs(10)).await;
    let leaving_id = cluster.replicas[leaving].id.to_string();
    let ran = cli(&bases[staying[0]], &["cluster", "remove", &leaving_id]).await;
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    let before = load.acknowledged();
    load.until_acknowledged(before + 300).await;
    let (acknowledged, unavailable, longest) = load.finish().await;
    eprintln!(
        "membership under load: {} acknowledged, {unavailable} answers 503 or none, \
         longest wait for a 201 {longest:?}",
        acknowledged.len()
    );
    cluster.kill(leaving);

    let left: Vec<usize> = (0..4).filter(|&i| i != leaving).collect();
    let p = cluster.primary(Duration::from_secs(10)).await;
    assert_eq!(
        members(&cluster, p).await,
        (ids_of(&cluster, &left), BTreeSet::new())
    );
    cluster.same_state(&left, Duration::from_secs(30)).await;
    for &i in &left {
        let ids = all_ids(&cluster.replicas[i].base(), QUEUE).await;
        assert!(
            acknowledged.is_subset(&ids),
            "lost {} (on node {})",
            acknowledged.difference(&ids).count(),
            cluster.replicas[i].id
        );
        assert_eq!(ids.len(), acknowledged.len(), "unexpected messages");
        let queues: Value = client()
            .get(format!("{}/v1/queues", cluster.replicas[i].base()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            queues["queues"][0]["stats"]["visible"].as_u64(),
            Some(acknowledged.len() as u64),
            "{queues}"
        );
    }
}

/// A replica whose spool directory is wiped takes no part under its old
/// identity (it lost its log and its vote); it is removed, comes back
/// under a new node id, catches up by snapshot and ends identical. The
/// refusals: a member added twice, a member that cannot be reached, a
/// removal that would leave no answering majority, an unknown member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_replica_rejoins_under_a_new_id_by_snapshot_and_quorum_risks_are_refused() {
    let mut cluster = TestCluster::with_spool(3, SPOOL, "", TABLES);
    cluster.start_all().await;
    let p = cluster.primary(Duration::from_secs(10)).await;
    let wiped = (p + 1) % 3;
    let other = (p + 2) % 3;
    let base = cluster.replicas[p].base();
    // The primary pins every member's incarnation once it answered.
    common::wait_until("every incarnation pinned", async || {
        let Some(s) = cluster.status(p).await else {
            return false;
        };
        s["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["incarnation"].is_string())
    })
    .await;

    let load = Load::start(vec![base.clone()], 4);
    load.until_acknowledged(200).await;

    // Its disk is lost; it comes back empty under the same id.
    cluster.wipe(wiped);
    cluster.start(wiped);
    common::wait_until(
        "the wiped replica refuses the old incarnation",
        async || {
            cluster.replicas[wiped]
                .process
                .as_ref()
                .unwrap()
                .log()
                .contains("meant for an earlier incarnation")
        },
    )
    .await;
    // (Its replication listener opens before its API does.)
    let s = common::eventually(
        "the wiped replica's status",
        Duration::from_secs(30),
        async || cluster.status(wiped).await,
    )
    .await;
    assert!(
        s["appliedIndex"].is_null(),
        "the wiped replica applied: {s}"
    );
    assert_eq!(s["members"], serde_json::json!([]), "{s}");
    let wiped_id = cluster.replicas[wiped].id.to_string();
    let addr = cluster.raft_addr(wiped);

    // Refusals, each with its kind, changing nothing.
    let ran = cli(&base, &["cluster", "add", &wiped_id, &addr]).await;
    assert_ne!(ran.code, 0);
    assert!(ran.stderr.contains("already_member"), "{}", ran.stderr);
    let ran = cli(&base, &["cluster", "add", "9", "127.0.0.1:1"]).await;
    assert!(ran.stderr.contains("member_unreachable"), "{}", ran.stderr);
    let ran = cli(&base, &["cluster", "remove", "9"]).await;
    assert!(ran.stderr.contains("member_not_found"), "{}", ran.stderr);
    // Removing the healthy follower would leave the primary and the wiped
    // one, which does not answer: no majority. (A replica that went silent
    // a moment ago is still counted on: the primary waits for it to be
    // silent for a while first.)
    common::wait_until("the primary sees the wiped replica silent", async || {
        let Some(s) = cluster.status(p).await else {
            return false;
        };
        s["members"].as_array().unwrap().iter().any(|m| {
            m["nodeId"] == cluster.replicas[wiped].id && m["lastContactMs"].as_u64() > Some(1000)
        })
    })
    .await;
    let other_id = cluster.replicas[other].id.to_string();
    let ran = cli(&base, &["cluster", "remove", &other_id]).await;
    assert!(ran.stderr.contains("quorum_at_risk"), "{}", ran.stderr);
    assert_eq!(
        members(&cluster, p).await.0,
        BTreeSet::from([1, 2, 3]),
        "a refused change changed the membership"
    );

    // The runbook: remove it, give it a new id, add it back.
    let ran = cli(&base, &["cluster", "remove", &wiped_id]).await;
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    // Its old id never comes back (it may have voted in old memberships).
    let ran = cli(&base, &["cluster", "add", &wiped_id, &addr]).await;
    assert!(ran.stderr.contains("node_id_retired"), "{}", ran.stderr);
    cluster.kill(wiped);
    // Enough for the primary to purge its log past the new member's start.
    let before = load.acknowledged();
    load.until_acknowledged(before + 1500).await;
    cluster.renumber(wiped);
    start_and_add(&mut cluster, wiped, &base).await;
    let (acknowledged, _, _) = load.finish().await;

    let all = [p, other, wiped];
    cluster.same_state(&all, Duration::from_secs(30)).await;
    cluster.replicas[wiped]
        .process
        .as_ref()
        .unwrap()
        .log_with("installed a snapshot")
        .await;
    let metrics = client()
        .get(format!("{}/metrics", cluster.replicas[wiped].base()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.lines().any(
            |l| l.starts_with("spoold_cluster_snapshots_installed_total ") && !l.ends_with(" 0")
        ),
        "{metrics}"
    );
    let ids = all_ids(&base, QUEUE).await;
    assert!(acknowledged.is_subset(&ids), "lost acknowledged messages");
    assert_eq!(ids.len(), acknowledged.len());

    // With the new member a voter, the primary's loss is survived by it.
    cluster.kill(p);
    let survivor = cluster.primary(Duration::from_secs(10)).await;
    assert!(survivor == wiped || survivor == other);
    assert_eq!(all_ids(&cluster.replicas[wiped].base(), QUEUE).await, ids);
}

/// Each replica restarted in turn (SIGTERM, start, ready) while senders
/// run: every `2xx` survives, and clients see only brief `503`s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_keeps_every_acknowledged_message() {
    let mut cluster = TestCluster::with_spool(3, SPOOL, "", TABLES);
    cluster.start_all().await;
    cluster.primary(Duration::from_secs(10)).await;
    let bases: Vec<String> = (0..3).map(|i| cluster.replicas[i].base()).collect();
    let load = Load::start(bases, 6);
    let started = Instant::now();
    for i in 0..3 {
        let before = load.acknowledged();
        load.until_acknowledged(before + 200).await;
        let mut process = cluster.replicas[i].process.take().unwrap();
        process.signal("-TERM");
        assert_eq!(
            process.wait_exit(),
            0,
            "replica {} did not stop cleanly",
            i + 1
        );
        cluster.start(i);
        wait_ready(cluster.replicas[i].process.as_ref().unwrap()).await;
    }
    let before = load.acknowledged();
    load.until_acknowledged(before + 200).await;
    let (acknowledged, unavailable, longest) = load.finish().await;
    eprintln!(
        "rolling restart: {} acknowledged in {:?}, {unavailable} answers 503 or none, \
         longest wait for a 201 {longest:?}",
        acknowledged.len(),
        started.elapsed()
    );
    // Brief: about an election (a restarted primary) at most, never an
    // outage.
    assert!(
        longest < Duration::from_secs(5),
        "a sender waited {longest:?}"
    );
    let p = cluster.primary(Duration::from_secs(10)).await;
    cluster
        .same_state(&[0, 1, 2], Duration::from_secs(30))
        .await;
    let ids = all_ids(&cluster.replicas[p].base(), QUEUE).await;
    assert!(acknowledged.is_subset(&ids), "lost acknowledged messages");
    assert_eq!(ids.len(), acknowledged.len());
}

/// A follower whose journal is damaged in the middle (a bit flipped in a
/// sealed segment) refuses to start, naming the file, as a single node
/// does; the others carry on, and the runbook's way back (remove it, wipe
/// it, add it back under a new id) ends with the same state everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_a_damaged_journal_refuses_to_start_and_rejoins_once_wiped() {
    let mut cluster = TestCluster::with_spool(3, SPOOL, "", TABLES);
    cluster.start_all().await;
    let p = cluster.primary(Duration::from_secs(10)).await;
    let damaged = (p + 1) % 3;
    let base = cluster.replicas[p].base();
    let load = Load::start(vec![base.clone()], 4);
    load.until_acknowledged(600).await;
    cluster.kill(damaged);
    let spool = cluster.replicas[damaged].dir.join("spool");
    let mut segments: Vec<std::path::PathBuf> = std::fs::read_dir(&spool)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segments.sort();
    assert!(segments.len() >= 2, "{segments:?}");
    let sealed = &segments[0];
    let mut bytes = std::fs::read(sealed).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(sealed, &bytes).unwrap();

    cluster.start(damaged);
    let code = cluster.replicas[damaged]
        .process
        .as_mut()
        .unwrap()
        .wait_exit();
    let log = cluster.replicas[damaged].process.take().unwrap().log();
    assert_ne!(code, 0, "a damaged replica started:\n{log}");
    let name = sealed.file_name().unwrap().to_str().unwrap();
    assert!(
        log.contains(name),
        "the refusal does not name {name}:\n{log}"
    );

    // The others serve meanwhile; then the damaged one is replaced.
    let before = load.acknowledged();
    load.until_acknowledged(before + 300).await;
    let ran = cli(
        &base,
        &[
            "cluster",
            "remove",
            &cluster.replicas[damaged].id.to_string(),
        ],
    )
    .await;
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    std::fs::remove_dir_all(&spool).unwrap();
    cluster.renumber(damaged);
    start_and_add(&mut cluster, damaged, &base).await;
    let (acknowledged, _, _) = load.finish().await;
    cluster
        .same_state(&[0, 1, 2], Duration::from_secs(30))
        .await;
    let ids = all_ids(&cluster.replicas[damaged].base(), QUEUE).await;
    assert!(acknowledged.is_subset(&ids), "lost acknowledged messages");
    assert_eq!(ids.len(), acknowledged.len());
}

/// From a new cluster's first election on, a replica that names a primary
/// names its API URL (the membership's), and a send that may not be
/// forwarded is told where the primary is (`421`) whenever `GET
/// /v1/cluster` names one. The build before named the primary with an
/// empty URL for 0.1–0.3 s after the election, and sends were refused
/// `503 no primary is known yet` meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_names_a_primary_only_with_its_url() {
    let mut cluster = TestCluster::new(3, "forward_to_primary = false", TABLES);
    for i in 0..3 {
        cluster.start(i);
    }
    let http = client();
    let started = Instant::now();
    let mut named = 0;
    while started.elapsed() < Duration::from_secs(8) {
        for i in 0..3 {
            let Some(s) = cluster.status(i).await else {
                continue;
            };
            if s["primary"].is_null() || s["role"] == "primary" {
                continue;
            }
            named += 1;
            let url = s["primary"]["apiUrl"].as_str().unwrap_or_default();
            assert!(
                !url.is_empty(),
                "node {i} names a primary without its URL: {s}"
            );
            let sent = http
                .post(format!(
                    "{}/v1/queues/{QUEUE}/messages",
                    cluster.replicas[i].base()
                ))
                .body("x")
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .unwrap();
            // The primary may have changed in between: then no primary
            // is known (503), never a primary without its URL.
            if sent.status() == StatusCode::MISDIRECTED_REQUEST {
                assert!(sent.headers().contains_key("spooler-primary"));
            } else {
                assert_eq!(sent.status(), StatusCode::SERVICE_UNAVAILABLE);
            }
        }
        if named > 200 {
            break;
        }
    }
    assert!(named > 0, "no follower named a primary");
}
