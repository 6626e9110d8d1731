//! Replicated mode under faults the nemesis (`tests/cluster/nemesis.rs`)
//! does not throw: membership changes while a replica is cut off or
//! down, `kill -9` in the middle of a snapshot (of the replica receiving
//! it, and of the primary sending it), a full disk on a follower and on
//! the primary, and sends retried with their idempotency key across
//! failovers. Each ends with every acknowledged message present and the
//! replicas' states equal.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::cluster::{TestCluster, all_ids};
use crate::common::mount::Mount;
use crate::common::process::{cli, client};
use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::Value;

const QUEUE: &str = "jobs";

/// Senders that keep sending to any of `bases` until stopped; the ids
/// acknowledged.
struct Load {
    stop: Arc<AtomicBool>,
    acknowledged: Arc<Mutex<BTreeSet<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(bases: Vec<String>, senders: usize, body_bytes: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acknowledged = Arc::new(Mutex::new(BTreeSet::new()));
        let http = client();
        let tasks = (0..senders)
            .map(|s| {
                let (stop, acknowledged, bases, http) = (
                    stop.clone(),
                    acknowledged.clone(),
                    bases.clone(),
                    http.clone(),
                );
                tokio::spawn(async move {
                    let mut n = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let base = &bases[(s + n) % bases.len()];
                        let sent = http
                            .post(format!("{base}/v1/queues/{QUEUE}/messages"))
                            .body(format!("s{s} n{n} {}", "x".repeat(body_bytes)))
                            .timeout(Duration::from_secs(15))
                            .send()
                            .await;
                        match sent {
                            Ok(r) if r.status() == StatusCode::CREATED => {
                                let v: Value = r.json().await.unwrap();
                                acknowledged
                                    .lock()
                                    .unwrap()
                                    .insert(v["id"].as_str().unwrap().to_owned());
                            }
                            _ => tokio::time::sleep(Duration::from_millis(20)).await,
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            acknowledged,
            tasks,
        }
    }

    fn count(&self) -> usize {
        self.acknowledged.lock().unwrap().len()
    }

    async fn finish(self) -> BTreeSet<String> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        self.acknowledged.lock().unwrap().clone()
    }
}

/// Every acknowledged id is in the queue as replica `i` serves it.
async fn nothing_lost(cluster: &TestCluster, i: usize, acknowledged: &BTreeSet<String>) {
    let ids = all_ids(&cluster.replicas[i].base(), QUEUE).await;
    let lost: Vec<&String> = acknowledged.difference(&ids).collect();
    assert!(
        lost.is_empty(),
        "lost {} of {}: {lost:?}",
        lost.len(),
        acknowledged.len()
    );
}

/// Waits until `n` more messages than `from` were acknowledged.
async fn more_sent(load: &Load, n: usize) {
    let from = load.count();
    common::wait_until("more sends acknowledged", async || load.count() >= from + n).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changes_while_a_replica_is_cut_off_or_down_lose_nothing() {
    let tables = format!("[queues.{QUEUE}]\n");
    let spool = "segment_bytes = \"64KiB\"\ncompaction_interval = \"200ms\"";
    let (mut cluster, links) = TestCluster::behind_links(3, spool, "", &tables);
    cluster.start_all().await;
    let p = cluster.primary(Duration::from_secs(10)).await;
    let (cut, other) = ((p + 1) % 3, (p + 2) % 3);
    let ids: Vec<u64> = cluster.replicas.iter().map(|r| r.id).collect();
    let load = Load::start(
        vec![cluster.replicas[p].base(), cluster.replicas[other].base()],
        3,
        100,
    );
    more_sent(&load, 50).await;

    // A follower cut off; a fourth replica added meanwhile.
    links.isolate(ids[cut], &ids);
    let spare = cluster.spare();
    cluster.start(spare);
    common::wait_until("the new replica answers", async || {
        cluster.status(spare).await.is_some()
    })
    .await;
    let (id, addr) = (
        cluster.replicas[spare].id.to_string(),
        cluster.raft_addr(spare),
    );
    let base = cluster.replicas[p].base();
    let ran = cli(&base, &["cluster", "add", &id, &addr, "--wait", "60s"]).await;
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    more_sent(&load, 50).await;

    // The cut-off follower killed, and removed while it is down.
    cluster.kill(cut);
    let ran = cli(&base, &["cluster", "remove", &ids[cut].to_string()]).await;
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    links.heal();
    more_sent(&load, 50).await;

    // The removed replica comes back: it neither disrupts the others nor
    // is counted again.
    cluster.start(cut);
    more_sent(&load, 100).await;
    let acknowledged = load.finish().await;
    let now = cluster.primary(Duration::from_secs(20)).await;
    assert_ne!(now, cut, "a removed replica leads");
    cluster
        .same_state(&[p, other, spare], Duration::from_secs(60))
        .await;
    nothing_lost(&cluster, now, &acknowledged).await;
    let s = cluster.status(now).await.unwrap();
    let members: BTreeSet<u64> = s["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["nodeId"].as_u64().unwrap())
        .collect();
    assert!(!members.contains(&ids[cut]), "{s}");
    eprintln!(
        "membership under faults: {} acknowledged, 0 lost; members now {members:?}",
        acknowledged.len()
    );
}

/// Three replicas, one of them (`behind`) stopped while the primary (`p`)
/// took far more than openraft keeps behind a snapshot, in large bodies,
/// and purged the log it missed: started again, it needs a snapshot.
/// Returns the cluster, the load still running, and `[p, behind, other]`.
async fn a_follower_behind_a_purge() -> (TestCluster, Load, [usize; 3]) {
    let tables = format!("[queues.{QUEUE}]\n");
    let spool = "segment_bytes = \"256KiB\"\ncompaction_interval = \"100ms\"";
    let mut cluster = TestCluster::with_spool(3, spool, "", &tables);
    cluster.start_all().await;
    let p = cluster.primary(Duration::from_secs(10)).await;
    let (behind, other) = ((p + 1) % 3, (p + 2) % 3);
    cluster.kill(behind);
    let load = Load::start(vec![cluster.replicas[p].base()], 8, 8 << 10);
    more_sent(&load, 3000).await;
    common::wait_until(
        "the primary purged the log the follower missed",
        async || {
            cluster
                .status(p)
                .await
                .is_some_and(|s| s["purgedIndex"].as_u64().unwrap_or(0) > 1500)
        },
    )
    .await;
    (cluster, load, [p, behind, other])
}

/// A follower that needs a snapshot; `kill -9` of `victim` (the follower
/// itself, or the primary) once the transfer began.
async fn kill_during_a_snapshot(victim_is_primary: bool) -> (usize, bool) {
    let (mut cluster, load, [p, behind, other]) = a_follower_behind_a_purge().await;

    cluster.start(behind);
    let receiving = common::eventually(
        "a snapshot on its way",
        Duration::from_secs(30),
        async || {
            let log = cluster.replicas[behind].process.as_ref()?.log();
            log.contains("receiving a snapshot").then_some(log)
        },
    )
    .await;
    let victim = if victim_is_primary { p } else { behind };
    cluster.kill(victim);
    let mid_transfer = !receiving.contains("installed a snapshot")
        && !cluster.replicas[behind]
            .process
            .as_ref()
            .is_some_and(|pr| pr.log().contains("installed a snapshot"));
    cluster.start(victim);
    more_sent(&load, 200).await;
    let acknowledged = load.finish().await;
    cluster
        .same_state(&[p, behind, other], Duration::from_secs(60))
        .await;
    let now = cluster.primary(Duration::from_secs(20)).await;
    nothing_lost(&cluster, now, &acknowledged).await;
    (acknowledged.len(), mid_transfer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_killed_while_installing_a_snapshot_catches_up_after_its_restart() {
    let (acknowledged, mid) = kill_during_a_snapshot(false).await;
    eprintln!(
        "follower killed during a snapshot (mid-transfer: {mid}): {acknowledged} acknowledged, 0 lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_while_sending_a_snapshot_loses_nothing() {
    let (acknowledged, mid) = kill_during_a_snapshot(true).await;
    eprintln!(
        "primary killed during a snapshot (mid-transfer: {mid}): {acknowledged} acknowledged, 0 lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_retried_with_their_key_across_failovers_keep_exactly_one_message_each() {
    let tables = format!("[queues.{QUEUE}]\ndedup_window = \"10m\"\n");
    let mut cluster = TestCluster::new(3, "", &tables);
    cluster.start_all().await;
    let bases: Vec<String> = cluster.replicas.iter().map(|r| r.base()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    // key → the id its 201 (or, for a retry the key had reached, 200)
    // named; how many calls were answered `500 operation_unconfirmed` (or
    // not at all) and retried.
    let ids: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    let unconfirmed = Arc::new(Mutex::new(0usize));
    let senders: Vec<_> = (0..4)
        .map(|s| {
            let (stop, ids, unconfirmed, bases) = (
                stop.clone(),
                ids.clone(),
                unconfirmed.clone(),
                bases.clone(),
            );
            tokio::spawn(async move {
                let http = client();
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let key = format!("s{s}-k{n}");
                    let mut attempt = 0usize;
                    loop {
                        attempt += 1;
                        let base = &bases[(s + attempt) % bases.len()];
                        let r = http
                            .post(format!("{base}/v1/queues/{QUEUE}/messages"))
                            .header("Idempotency-Key", &key)
                            .body(key.clone())
                            .timeout(Duration::from_secs(15))
                            .send()
                            .await;
                        match r {
                            // 200: the key was seen, the original's id.
                            Ok(r)
                                if r.status() == StatusCode::CREATED
                                    || r.status() == StatusCode::OK =>
                            {
                                let v: Value = r.json().await.unwrap();
                                let id = v["id"].as_str().unwrap().to_owned();
                                let mut ids = ids.lock().unwrap();
                                if let Some(before) = ids.get(&key) {
                                    assert_eq!(before, &id, "key {key} named two ids");
                                }
                                ids.insert(key.clone(), id);
                                break;
                            }
                            Ok(r) if r.status() == StatusCode::INTERNAL_SERVER_ERROR => {
                                *unconfirmed.lock().unwrap() += 1;
                            }
                            Err(_) => *unconfirmed.lock().unwrap() += 1,
                            Ok(_) => {}
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            })
        })
        .collect();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let p = cluster.primary(Duration::from_secs(20)).await;
        cluster.kill(p);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        cluster.start(p);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    for s in senders {
        tokio::time::timeout(Duration::from_secs(120), s)
            .await
            .unwrap()
            .unwrap();
    }
    let p = cluster.primary(Duration::from_secs(20)).await;
    cluster
        .same_state(&[0, 1, 2], Duration::from_secs(60))
        .await;
    let messages = common::process::messages_in(&client(), &bases[p], QUEUE).await;
    let mut per_key = BTreeMap::<String, usize>::new();
    for m in &messages {
        *per_key
            .entry(m["body"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    let ids = ids.lock().unwrap();
    let twice: Vec<_> = per_key.iter().filter(|(_, n)| **n > 1).collect();
    let missing: Vec<_> = ids.keys().filter(|k| !per_key.contains_key(*k)).collect();
    eprintln!(
        "keyed retries across 3 failovers: {} keys acknowledged, {} calls unconfirmed or \
         unanswered and retried, {} messages kept, {} keys twice, {} missing",
        ids.len(),
        unconfirmed.lock().unwrap(),
        messages.len(),
        twice.len(),
        missing.len()
    );
    assert!(twice.is_empty(), "kept twice: {twice:?}");
    assert!(missing.is_empty(), "lost: {missing:?}");
}

/// Fills `dir`'s file system until `free_mib` are left; the ballast file.
fn ballast(dir: &std::path::Path, free_mib: u64) -> std::path::PathBuf {
    let out = Command::new("df")
        .args(["-k", "--output=avail"])
        .arg(dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let avail_kib: u64 = text.lines().nth(1).unwrap().trim().parse().unwrap();
    let path = dir.join("ballast");
    let mib = (avail_kib / 1024).saturating_sub(free_mib);
    std::fs::write(&path, vec![1u8; (mib << 20) as usize]).unwrap();
    path
}

/// Every replica's spool on a 96 MiB tmpfs; the disk of `victim` (a
/// follower, or the primary) filled up under load.
async fn a_full_disk_on(victim_is_primary: bool) {
    let tables = format!("[queues.{QUEUE}]\n");
    let spool = "segment_bytes = \"1MiB\"\ncompaction_interval = \"200ms\"";
    let mut cluster = TestCluster::with_spool(3, spool, "", &tables);
    let mounts: Vec<Mount> = cluster
        .replicas
        .iter()
        .map(|r| Mount::tmpfs(&r.dir.join("spool"), "96m"))
        .collect();
    cluster.start_all().await;
    let p = cluster.primary(Duration::from_secs(10)).await;
    let victim = if victim_is_primary { p } else { (p + 1) % 3 };
    let bases: Vec<String> = cluster.replicas.iter().map(|r| r.base()).collect();
    let load = Load::start(bases, 6, 4 << 10);
    more_sent(&load, 100).await;
    let weight = ballast(&mounts[victim].0, 1);
    // The victim's disk fills: it stops (a Raft log it cannot write is
    // fatal) or refuses, and the others carry on.
    let said = common::eventually(
        "the victim's disk full",
        Duration::from_secs(60),
        async || {
            let log = cluster.replicas[victim].process.as_ref()?.log();
            log.lines()
                .find(|l| l.contains("a Raft log write failed"))
                .map(str::to_owned)
        },
    )
    .await;
    eprintln!("the victim said: {said}");
    let code = cluster.replicas[victim]
        .process
        .as_mut()
        .unwrap()
        .wait_exit();
    assert_ne!(
        code, 0,
        "a replica that cannot write its log exits non-zero"
    );
    cluster.replicas[victim].process = None;
    more_sent(&load, 300).await;
    std::fs::remove_file(weight).unwrap();
    cluster.start(victim);
    more_sent(&load, 100).await;
    let acknowledged = load.finish().await;
    cluster
        .same_state(&[0, 1, 2], Duration::from_secs(60))
        .await;
    let now = cluster.primary(Duration::from_secs(20)).await;
    nothing_lost(&cluster, now, &acknowledged).await;
    eprintln!(
        "full disk on the {}: {} acknowledged, 0 lost",
        if victim_is_primary {
            "primary"
        } else {
            "follower"
        },
        acknowledged.len()
    );
    drop(cluster);
    drop(mounts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, to mount a tmpfs (.ci/run runs as root)"]
async fn a_full_disk_on_a_follower_loses_nothing_and_it_catches_up_once_freed() {
    a_full_disk_on(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, to mount a tmpfs (.ci/run runs as root)"]
async fn a_full_disk_on_the_primary_hands_over_and_loses_nothing() {
    a_full_disk_on(true).await;
}

/// `raft.commit` as a replica writes it (docs/journal-format.md): magic,
/// term, index + 1, CRC-32C of the first 24 bytes, 4 bytes of padding.
fn commit_file(term: u64, index: u64) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(b"SPOOLCMT");
    bytes[8..16].copy_from_slice(&term.to_le_bytes());
    bytes[16..24].copy_from_slice(&(index + 1).to_le_bytes());
    let crc = crc32c::crc32c(&bytes[..24]);
    bytes[24..28].copy_from_slice(&crc.to_le_bytes());
    bytes
}

/// A follower learns an entry is committed before its own copy of it is
/// durable, and writes its commit pointer then: a `kill -9` (or a full
/// disk) between the two leaves `raft.commit` ahead of its log. Such a
/// replica starts, applies what it has and takes the rest from the
/// primary (found by CI: start-up read entries the log never held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_pointer_ahead_of_the_log_does_not_stop_a_replica() {
    let tables = format!("[queues.{QUEUE}]\n");
    let mut cluster = TestCluster::new(3, "", &tables);
    cluster.start_all().await;
    let p = cluster.primary(Duration::from_secs(10)).await;
    let victim = (p + 1) % 3;
    let bases: Vec<String> = cluster.replicas.iter().map(|r| r.base()).collect();
    let load = Load::start(bases, 3, 64);
    more_sent(&load, 100).await;
    let status = cluster.status(victim).await.unwrap();
    let term = status["term"].as_u64().unwrap();
    let applied = status["appliedIndex"].as_u64().unwrap();
    cluster.kill(victim);
    let path = cluster.replicas[victim]
        .dir
        .join("spool")
        .join("raft.commit");
    std::fs::write(&path, commit_file(term, applied + 50)).unwrap();
    more_sent(&load, 100).await;
    cluster.start(victim);
    more_sent(&load, 100).await;
    let acknowledged = load.finish().await;
    cluster
        .same_state(&[0, 1, 2], Duration::from_secs(30))
        .await;
    nothing_lost(&cluster, victim, &acknowledged).await;
}

/// A relay's bound counts from the client's last body byte: a 200 KB body
/// uploaded over 3 s through a follower is stored and answered `201`, as
/// it is by the primary itself. The build before counted the upload
/// against 3 election timeouts (1.5 s) and answered `500
/// operation_unconfirmed`, with nothing stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_through_a_follower_is_stored() {
    let mut cluster = TestCluster::new(3, "", "[queues.jobs]\n");
    cluster.start_all().await;
    let primary = cluster.primary(Duration::from_secs(10)).await;
    let follower = (primary + 1) % 3;
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..10).map(|i| Ok(vec![b'a' + i as u8; 20_000])).collect();
    let slow = futures_util::stream::iter(chunks).then(|chunk| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        chunk
    });
    let sent = client()
        .post(format!(
            "{}/v1/queues/{QUEUE}/messages",
            cluster.replicas[follower].base()
        ))
        .header("content-length", "200000")
        .body(reqwest::Body::wrap_stream(slow))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .unwrap();
    let status = sent.status();
    let text = sent.text().await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{text}");
    let id = serde_json::from_str::<Value>(&text).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let stored = all_ids(&cluster.replicas[primary].base(), QUEUE).await;
    assert!(stored.contains(&id));
}

/// Issue 42: a follower that installs a snapshot stops between the
/// checkpoint's rename and the restart of its log (fail point
/// `snapshot.before_restart`, `src/failpoint.rs`). Restarted, it reads the
/// installed checkpoint, catches up, and the replicas agree; nothing
/// acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_stopped_between_a_snapshots_rename_and_its_restart_catches_up() {
    use spoold::testing::fail_points::{ENV, EXIT_CODE, SNAPSHOT_BEFORE_RESTART};
    let (mut cluster, load, [p, behind, other]) = a_follower_behind_a_purge().await;
    let armed = format!("{SNAPSHOT_BEFORE_RESTART}=exit");
    cluster.start_with_env(behind, &[(ENV, &armed)]);
    let (code, log) = cluster.wait_exited(behind);
    assert_eq!(code, EXIT_CODE, "{log}");
    assert!(log.contains("receiving a snapshot"), "{log}");

    cluster.start(behind);
    more_sent(&load, 200).await;
    let acknowledged = load.finish().await;
    cluster
        .same_state(&[p, behind, other], Duration::from_secs(60))
        .await;
    nothing_lost(&cluster, behind, &acknowledged).await;
    eprintln!(
        "follower stopped between a snapshot's rename and its restart: {} acknowledged, 0 lost",
        acknowledged.len()
    );
}

/// Issue 42: the primary stops between a record's commit and its apply
/// (fail point `raft.before_apply`, armed at the same record on every
/// replica: they apply the same log in the same order), and the
/// followers go down with it. Restarted, they apply it once, agree, and
/// lose nothing acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_stopped_between_a_commit_and_its_apply_lose_nothing() {
    use spoold::testing::fail_points::{ENV, EXIT_CODE, RAFT_BEFORE_APPLY};
    let tables = format!("[queues.{QUEUE}]\n");
    let mut cluster = TestCluster::new(3, "", &tables);
    let armed = format!("{RAFT_BEFORE_APPLY}=exit@400");
    for i in 0..3 {
        cluster.start_with_env(i, &[(ENV, &armed)]);
    }
    let p = cluster.primary(Duration::from_secs(10)).await;
    let load = Load::start(vec![cluster.replicas[p].base()], 4, 100);
    let (code, log) = cluster.wait_exited(p);
    assert_eq!(code, EXIT_CODE, "the primary: {log}");
    // The followers stop at the same record once they learn it committed,
    // or are killed first: a follower alone never learns it.
    for i in (0..3).filter(|&i| i != p) {
        cluster.kill(i);
    }
    let acknowledged = load.finish().await;
    assert!(
        acknowledged.len() > 100,
        "{} acknowledged",
        acknowledged.len()
    );

    cluster.start_all().await;
    cluster
        .same_state(&[0, 1, 2], Duration::from_secs(60))
        .await;
    let now = cluster.primary(Duration::from_secs(20)).await;
    nothing_lost(&cluster, now, &acknowledged).await;
    let stored = all_ids(&cluster.replicas[now].base(), QUEUE).await;
    eprintln!(
        "replicas stopped between commit and apply: {} acknowledged, {} stored, 0 lost",
        acknowledged.len(),
        stored.len()
    );
}
