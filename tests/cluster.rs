//! Replicated mode against three real processes on loopback
//! (docs/contract.md §9): election, forwarding, the `421` and `503`
//! answers, and that what a primary acknowledged survives its `kill -9`.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::cluster::TestCluster;
use common::process::client;
use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};

const QUEUE: &str = "jobs";

async fn send(base: &str, body: &str) -> reqwest::Response {
    client()
        .post(format!("{base}/v1/queues/{QUEUE}/messages"))
        .header("Content-Type", "text/plain")
        .body(body.to_owned())
        .timeout(Duration::from_secs(15))
        .send()
        .await
        .unwrap()
}

async fn ids(base: &str) -> BTreeSet<String> {
    common::cluster::all_ids(base, QUEUE).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_keep_what_the_primary_acknowledged_through_its_kill() {
    let mut cluster = TestCluster::new(3, "", "");
    cluster.start_all().await;
    let primary = cluster.primary(Duration::from_secs(10)).await;
    let follower = (primary + 1) % 3;
    let (p_base, f_base) = (
        cluster.replicas[primary].base(),
        cluster.replicas[follower].base(),
    );

    // Every replica agrees on who leads, and a single node answers 404.
    for i in 0..3 {
        let s = cluster.status(i).await.unwrap();
        assert_eq!(s["primary"]["nodeId"], json!(primary as u64 + 1), "{s}");
        assert_eq!(s["members"].as_array().unwrap().len(), 3, "{s}");
    }

    // A queue made through a follower: relayed, with Spooler-Primary.
    let r = client()
        .put(format!("{f_base}/v1/queues/{QUEUE}"))
        .json(&json!({"leaseTimeoutSeconds": 60}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(r.headers()["spooler-primary"], p_base.as_str());

    let mut acknowledged = BTreeSet::new();
    for i in 0..40 {
        let base = if i % 2 == 0 { &p_base } else { &f_base };
        let r = send(base, &format!("m{i}")).await;
        assert_eq!(r.status(), StatusCode::CREATED);
        let v: Value = r.json().await.unwrap();
        acknowledged.insert(v["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(acknowledged.len(), 40, "ids are unique");

    // Ack five; lease one more and keep its token across the failover.
    for _ in 0..5 {
        let r = client()
            .post(format!("{f_base}/v1/queues/{QUEUE}/receive"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let id = r.headers()["spooler-message-id"]
            .to_str()
            .unwrap()
            .to_owned();
        let token = r.headers()["spooler-lease-token"]
            .to_str()
            .unwrap()
            .to_owned();
        let r = client()
            .post(format!("{p_base}/v1/queues/{QUEUE}/leases/{token}/ack"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        acknowledged.remove(&id);
    }
    let r = client()
        .post(format!("{p_base}/v1/queues/{QUEUE}/receive"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let old_token = r.headers()["spooler-lease-token"]
        .to_str()
        .unwrap()
        .to_owned();
    let leased_id = r.headers()["spooler-message-id"]
        .to_str()
        .unwrap()
        .to_owned();

    // kill -9 of the primary; the first 201 through a follower after it.
    cluster.kill(primary);
    let killed = Instant::now();
    let survivor = cluster.replicas[follower].base();
    let new_id = loop {
        let r = send(&survivor, "after the failover").await;
        if r.status() == StatusCode::CREATED {
            let v: Value = r.json().await.unwrap();
            break v["id"].as_str().unwrap().to_owned();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "no 201 within 10 s of the kill: last {}",
            r.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let failover = killed.elapsed();
    eprintln!("failover: first 201 through a follower {failover:?} after kill -9");
    assert!(
        !acknowledged.contains(&new_id),
        "an id was handed out twice"
    );

    // Everything acknowledged and not acked is there; the acked are not.
    let now = ids(&survivor).await;
    for id in &acknowledged {
        assert!(now.contains(id), "lost {id}");
    }
    assert_eq!(
        now.len(),
        acknowledged.len() + 1,
        "resurrected or unexpected messages"
    );

    // The old primary's token is stale; its message is visible again, with
    // its retry count unchanged.
    let r = client()
        .post(format!(
            "{survivor}/v1/queues/{QUEUE}/leases/{old_token}/ack"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["kind"], "stale_lease", "{v}");
    let m: Value = client()
        .get(format!("{survivor}/v1/queues/{QUEUE}/messages/{leased_id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(m["state"], "visible", "{m}");
    assert_eq!(m["retryCount"], 0, "{m}");

    // The old primary comes back as a follower and catches up.
    cluster.start(primary);
    common::process::wait_ready(cluster.replicas[primary].process.as_ref().unwrap()).await;
    let back = cluster.replicas[primary].base();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = cluster.status(primary).await.unwrap();
        if s["role"] == "follower" && s["primary"]["apiUrl"].is_string() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the old primary did not rejoin: {s}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ids(&back).await, ids(&survivor).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_forwarding_a_follower_answers_421_naming_the_primary() {
    let mut cluster = TestCluster::new(3, "forward_to_primary = false", "");
    cluster.start_all().await;
    let primary = cluster.primary(Duration::from_secs(10)).await;
    let follower = (primary + 1) % 3;
    let r = client()
        .get(format!("{}/v1/queues", cluster.replicas[follower].base()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::MISDIRECTED_REQUEST);
    assert_eq!(
        r.headers()["spooler-primary"],
        cluster.replicas[primary].base().as_str()
    );
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["kind"], "not_primary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_without_the_secret_is_refused_and_logged() {
    let mut cluster = TestCluster::new(1, "", "");
    cluster.start_all().await;
    let r = &cluster.replicas[0];
    let answer = client()
        .post(format!("http://127.0.0.1:{}/raft/vote", r.raft_port))
        .header("spooler-cluster-target", "1")
        .body(vec![0u8; 8])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);
    let log = r.process.as_ref().unwrap().log();
    assert!(log.contains("without the cluster secret"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_cluster_killed_at_once_comes_back_with_everything_and_keys_dedup_across_primaries()
{
    let mut cluster = TestCluster::new(3, "", "[queues.jobs]\ndedup_window = \"10m\"\n");
    cluster.start_all().await;
    let primary = cluster.primary(Duration::from_secs(10)).await;
    let base = cluster.replicas[primary].base();
    let keyed = |base: &str, key: &str| {
        client()
            .post(format!("{base}/v1/queues/{QUEUE}/messages"))
            .header("Idempotency-Key", key)
            .body(format!("keyed {key}"))
            .send()
    };
    let mut acknowledged = BTreeSet::new();
    for i in 0..30 {
        let r = keyed(&base, &format!("k{i}")).await.unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        let v: Value = r.json().await.unwrap();
        acknowledged.insert(v["id"].as_str().unwrap().to_owned());
    }

    // Power lost everywhere at once, then every replica back.
    for i in 0..3 {
        cluster.kill(i);
    }
    cluster.start_all().await;
    let primary = cluster.primary(Duration::from_secs(10)).await;
    let base = cluster.replicas[primary].base();
    assert_eq!(ids(&base).await, acknowledged);

    // The same key on whichever replica leads now finds the original.
    let r = keyed(&base, "k7").await.unwrap();
    let v: Value = r.json().await.unwrap();
    assert!(acknowledged.contains(v["id"].as_str().unwrap()), "{v}");
    assert_eq!(
        ids(&base).await.len(),
        30,
        "a retried key stored a second message"
    );

    // And after the primary is lost too.
    cluster.kill(primary);
    let survivor = cluster.replicas[(primary + 1) % 3].base();
    let deadline = Instant::now() + Duration::from_secs(10);
    let v: Value = loop {
        let r = keyed(&survivor, "k3").await.unwrap();
        if r.status().is_success() {
            break r.json().await.unwrap();
        }
        assert!(Instant::now() < deadline, "no primary after the kill");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(acknowledged.contains(v["id"].as_str().unwrap()), "{v}");
    assert_eq!(ids(&survivor).await.len(), 30);
}

/// The lowest log segment id in replica `i`'s spool directory.
fn first_segment(cluster: &TestCluster, i: usize) -> Option<u64> {
    std::fs::read_dir(cluster.replicas[i].dir.join("spool"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            u64::from_str_radix(name.strip_suffix(".seg")?, 16).ok()
        })
        .min()
}

/// A follower that was down while the primary compacted the log it missed
/// comes back through a snapshot (the checkpoint, streamed), then the log
/// after it, and ends with the primary's state exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_the_compacted_log_catches_up_by_snapshot() {
    let spool = "segment_bytes = \"64KiB\"\ncompaction_interval = \"100ms\"";
    let mut cluster = TestCluster::with_spool(3, spool, "", "[queues.jobs]\n");
    cluster.start_all().await;
    let primary = cluster.primary(Duration::from_secs(10)).await;
    let behind = (primary + 1) % 3;
    let base = cluster.replicas[primary].base();
    cluster.kill(behind);
    let started = Instant::now();

    // Many segments of messages (more than the 1 000 records openraft
    // keeps behind a snapshot), all purged, then some that stay.
    let filler = "x".repeat(1000);
    // One client (a new one per request costs more than the request).
    let http = client();
    let statuses: Vec<StatusCode> = futures_util::stream::iter(0..1500)
        .map(|i| {
            let sent = http
                .post(format!("{base}/v1/queues/{QUEUE}/messages"))
                .body(format!("early {i} {filler}"))
                .send();
            async move { sent.await.unwrap().status() }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    assert!(statuses.iter().all(|&s| s == StatusCode::CREATED));
    let r = client()
        .delete(format!("{base}/v1/queues/{QUEUE}/messages"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let mut kept = BTreeSet::new();
    for i in 0..60 {
        let r = send(&base, &format!("kept {i} {filler}")).await;
        assert_eq!(r.status(), StatusCode::CREATED);
        let v: Value = r.json().await.unwrap();
        kept.insert(v["id"].as_str().unwrap().to_owned());
    }

    // The primary snapshots, purges, and deletes the segments it no longer
    // needs: the log the follower missed is gone.
    let deadline = Instant::now() + Duration::from_secs(20);
    while first_segment(&cluster, primary).is_none_or(|s| s < 8) {
        assert!(
            Instant::now() < deadline,
            "the primary kept its early segments: first is {:?}",
            first_segment(&cluster, primary)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let s = cluster.status(primary).await.unwrap();
    assert!(s["purgedIndex"].as_u64().unwrap() > 400, "{s}");
    assert!(s["snapshotIndex"].as_u64().unwrap() > 1500, "{s}");

    // The follower comes back and catches up.
    cluster.start(behind);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (p, b) = (cluster.digest(primary).await, cluster.digest(behind).await);
        if let (Some(p), Some(b)) = (&p, &b)
            && p == b
        {
            break;
        }
        if Instant::now() > deadline {
            cluster.dump_logs(30);
            panic!("the follower did not catch up: primary {p:?}, follower {b:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("caught up {:?} after the first send", started.elapsed());
    let log = cluster.replicas[behind].process.as_ref().unwrap().log();
    assert!(
        log.contains("installed a snapshot"),
        "no snapshot was installed:\n{log}"
    );

    // And it holds the state on its own: with the primary gone, it and the
    // other follower serve every message that was kept.
    cluster.kill(primary);
    let survivor = cluster.replicas[behind].base();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = send(&survivor, "after").await;
        if r.status() == StatusCode::CREATED {
            break;
        }
        assert!(Instant::now() < deadline, "no primary after the kill");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ids = ids(&survivor).await;
    assert!(kept.is_subset(&ids), "lost {:?}", kept.difference(&ids));
    assert_eq!(ids.len(), kept.len() + 1);
}
