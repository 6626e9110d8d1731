//! Replicated mode against three real processes on loopback
//! (docs/contract.md §9): election, forwarding, the `421` and `503`
//! answers, and that what a primary acknowledged survives its `kill -9`.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::common::api::Api;
use crate::common::cluster::TestCluster;
use crate::common::process::client;
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
    common::eventually(
        "the old primary to rejoin as a follower",
        Duration::from_secs(10),
        async || {
            let s = cluster.status(primary).await.unwrap();
            (s["role"] == "follower" && s["primary"]["apiUrl"].is_string()).then_some(())
        },
    )
    .await;
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
    // The refusal is logged (once per sender and interval) as the answer
    // goes out, so it may trail it.
    r.process
        .as_ref()
        .unwrap()
        .log_with("refused replication requests")
        .await;
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
    let v: Value = common::eventually(
        "a primary after the kill",
        Duration::from_secs(10),
        async || {
            let r = keyed(&survivor, "k3").await.unwrap();
            if r.status().is_success() {
                Some(r.json::<Value>().await.unwrap())
            } else {
                None
            }
        },
    )
    .await;
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
/// after it, and ends with the primary's state exactly: events shared by
/// two queues and a queue's delivery history included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_the_compacted_log_catches_up_by_snapshot() {
    let spool = "segment_bytes = \"64KiB\"\ncompaction_interval = \"100ms\"";
    let tables = "[queues.jobs]\n[queues.fan-a]\nevents = [\"e.*\"]\n\
                  [queues.fan-b]\nevents = [\"e.>\"]\nhistory_retention = \"1h\"\n";
    let mut cluster = TestCluster::with_spool(3, spool, "", tables);
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
    // Events to two queues (one record each), five of them delivered from
    // fan-b, which keeps its history.
    for i in 0..20 {
        let r = http
            .post(format!("{base}/v1/events"))
            .json(&json!({"type": "e.ping", "payload": {"n": i}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED);
    }
    let api = Api::new(base.clone(), None);
    for _ in 0..5 {
        let token = api.lease("fan-b").await;
        let acked = api.settle("fan-b", &token, "ack").await;
        assert_eq!(acked.status(), StatusCode::NO_CONTENT);
    }

    // The primary snapshots, purges, and deletes the segments it no longer
    // needs: the log the follower missed is gone.
    common::eventually(
        "the primary to delete its early segments",
        Duration::from_secs(20),
        async || {
            first_segment(&cluster, primary)
                .is_some_and(|s| s >= 8)
                .then_some(())
        },
    )
    .await;
    let s = cluster.status(primary).await.unwrap();
    assert!(s["purgedIndex"].as_u64().unwrap() > 400, "{s}");
    assert!(s["snapshotIndex"].as_u64().unwrap() > 1500, "{s}");

    // The follower comes back and catches up.
    cluster.start(behind);
    cluster
        .same_state(&[primary, behind], Duration::from_secs(20))
        .await;
    eprintln!("caught up {:?} after the first send", started.elapsed());
    cluster.replicas[behind]
        .process
        .as_ref()
        .unwrap()
        .log_with("installed a snapshot")
        .await;
    // The console's cluster page says so too.
    let s = cluster.status(behind).await.unwrap();
    assert!(s["snapshot"]["installed"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(s["snapshot"]["receiving"], false, "{s}");
    assert!(s["snapshot"]["receivedBytes"].as_u64().unwrap() > 0, "{s}");

    // And it holds the state on its own: with the primary gone, it and the
    // other follower serve every message that was kept.
    cluster.kill(primary);
    let survivor = cluster.replicas[behind].base();
    common::eventually(
        "a primary after the kill (a 201 through the survivor)",
        Duration::from_secs(10),
        async || (send(&survivor, "after").await.status() == StatusCode::CREATED).then_some(()),
    )
    .await;
    let ids = ids(&survivor).await;
    assert!(kept.is_subset(&ids), "lost {:?}", kept.difference(&ids));
    assert_eq!(ids.len(), kept.len() + 1);
    // Every event's deliveries, each reading its own payload, and fan-b's
    // history, on the replica that caught up by snapshot.
    let bodies = async |queue: &str| -> BTreeSet<String> {
        common::process::messages_in(&http, &survivor, queue)
            .await
            .iter()
            .map(|m| m["body"].as_str().unwrap().to_owned())
            .collect()
    };
    let all: BTreeSet<String> = (0..20).map(|i| format!("{{\"n\":{i}}}")).collect();
    assert_eq!(bodies("fan-a").await, all);
    let in_b = bodies("fan-b").await;
    assert_eq!(in_b.len(), 15);
    let history: Value = http
        .get(format!("{survivor}/v1/queues/fan-b/history"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let delivered: BTreeSet<String> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(delivered.len(), 5, "{history}");
    assert!(delivered.is_disjoint(&in_b));
    assert_eq!(&delivered | &in_b, all);
}

/// Leases one message at `base` (`wait` 0): its id and token, if this
/// replica served the receive itself (not relayed).
async fn lease_here(base: &str) -> Option<(String, String)> {
    let r = client()
        .post(format!("{base}/v1/queues/{QUEUE}/receive-batch?max=1"))
        .timeout(Duration::from_secs(1))
        .send()
        .await
        .ok()?;
    if r.status() != StatusCode::OK || r.headers().contains_key("spooler-primary") {
        return None;
    }
    let v: Value = r.json().await.ok()?;
    let m = v["messages"].as_array()?.first()?.clone();
    Some((
        m["id"].as_str()?.to_owned(),
        m["leaseToken"].as_str()?.to_owned(),
    ))
}

/// The primary P is cut from follower F2 past the election timeout; then
/// F1 is killed, cut from P and restarted at once. F1 and F2 elect a new
/// primary Q, which leases and acks messages. Within P's leader lease
/// (which counted on F1's last answer) P must not lease any of them: F1
/// grants no vote until the longest election timeout after its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_restarted_while_the_primary_is_cut_from_the_other_lets_nothing_be_leased_twice()
{
    // A long election timeout makes the old primary's leader lease (half
    // of it) long enough for the new primary to serve within it.
    let timing = "heartbeat = \"1s\"\nelection_timeout = \"8s\"";
    let tables = format!("[queues.{QUEUE}]\nlease_timeout = \"10m\"\n");
    let (mut cluster, links) = TestCluster::behind_links(3, "", timing, &tables);
    cluster.start_all().await;
    let mut checked = 0;
    let mut twice = Vec::new();
    // More rounds widen the chance of a new primary serving within the old
    // one's lease (each round's odds are about even); CI runs three.
    let rounds: usize = std::env::var("DOUBLE_LEASE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    for round in 0..rounds {
        let p = cluster.primary(Duration::from_secs(30)).await;
        let (f1, f2) = ((p + 1) % 3, (p + 2) % 3);
        let ids: Vec<u64> = cluster.replicas.iter().map(|r| r.id).collect();
        for i in 0..40 {
            let r = send(&cluster.replicas[p].base(), &format!("r{round} m{i}")).await;
            assert_eq!(r.status(), StatusCode::CREATED);
        }
        links.cut(ids[p], ids[f2]);
        // F2 campaigns 1.5 to 2 election timeouts after it last heard from
        // P (12 to 16 s): F1 restarts just before.
        tokio::time::sleep(Duration::from_millis(11_000)).await;
        cluster.kill(f1);
        let killed = Instant::now();
        links.cut(ids[p], ids[f1]);
        cluster.start(f1);
        let old = cluster.replicas[p].base();
        let mut first_ack = None;
        let until = Instant::now() + Duration::from_secs(12);
        while Instant::now() < until {
            for q in [f1, f2] {
                let base = cluster.replicas[q].base();
                let Some((id, token)) = lease_here(&base).await else {
                    continue;
                };
                let acked = client()
                    .post(format!("{base}/v1/queues/{QUEUE}/leases/{token}/ack"))
                    .send()
                    .await
                    .unwrap();
                if acked.status() != StatusCode::NO_CONTENT {
                    continue;
                }
                first_ack.get_or_insert(killed.elapsed());
                // Acked by the new primary: the old one must not hand it out.
                let again = client()
                    .post(format!("{old}/v1/queues/{QUEUE}/receive-batch?max=10"))
                    .timeout(Duration::from_secs(1))
                    .send()
                    .await;
                checked += 1;
                if let Ok(r) = again
                    && r.status() == StatusCode::OK
                    && let Ok(v) = r.json::<Value>().await
                    && v["messages"]
                        .as_array()
                        .is_some_and(|ms| ms.iter().any(|m| m["id"] == id.as_str()))
                {
                    twice.push(format!("round {round}: {id}"));
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        eprintln!("round {round}: first ack by a new primary {first_ack:?} after the kill");
        links.heal();
    }
    eprintln!("acks by a new primary checked against the old: {checked}");
    assert!(checked > 0, "no new primary acked anything to check");
    assert!(twice.is_empty(), "leased again after an ack: {twice:?}");
}

/// A follower relaying to a primary that a partition swallows (connections
/// open, no bytes back) gives up once a new primary is elected, and the
/// client's next call is served: no relay waits for the client to give up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_to_a_blackholed_primary_ends_and_the_next_call_is_served() {
    let tables = format!("[queues.{QUEUE}]\n");
    let (mut cluster, links) = TestCluster::behind_links(3, "", "", &tables);
    cluster.start_all().await;
    let p = cluster.primary(Duration::from_secs(10)).await;
    let f = (p + 1) % 3;
    let base = cluster.replicas[f].base();
    // The primary's relay URL is pinned once it answered a heartbeat.
    common::wait_until("a relay through the follower", async || {
        send(&base, "warm").await.status() == StatusCode::CREATED
    })
    .await;

    let ids: Vec<u64> = cluster.replicas.iter().map(|r| r.id).collect();
    links.isolate(ids[p], &ids);
    links.cut_api(ids[p]);
    let cut = Instant::now();
    let mut longest = Duration::ZERO;
    let served = loop {
        let asked = Instant::now();
        let r = client()
            .post(format!("{base}/v1/queues/{QUEUE}/messages"))
            .body("after the cut")
            .timeout(Duration::from_secs(20))
            .send()
            .await;
        longest = longest.max(asked.elapsed());
        if r.is_ok_and(|r| r.status() == StatusCode::CREATED) {
            break cut.elapsed();
        }
        assert!(
            cut.elapsed() < Duration::from_secs(15),
            "no 201 within 15 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    eprintln!(
        "blackholed primary: first 201 through a follower after {served:?}, longest call {longest:?}"
    );
    assert!(
        longest < Duration::from_secs(4),
        "a relayed call took {longest:?}"
    );
    assert!(
        served < Duration::from_secs(5),
        "first 201 after {served:?}"
    );
}

/// An ack that a primary cut off from both followers cannot get committed
/// says that the primary lost its leadership (not that an fsync failed);
/// one made after its leader lease ran out says it is not the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_refused_by_a_deposed_primary_says_it_lost_its_leadership() {
    let tables = format!("[queues.{QUEUE}]\nlease_timeout = \"10m\"\n");
    let (mut cluster, links) = TestCluster::behind_links(3, "", "", &tables);
    cluster.start_all().await;
    let p = cluster.primary(Duration::from_secs(10)).await;
    let base = cluster.replicas[p].base();
    for i in 0..2 {
        assert_eq!(
            send(&base, &format!("m{i}")).await.status(),
            StatusCode::CREATED
        );
    }
    let (_, first) = lease_here(&base).await.unwrap();
    let (_, second) = lease_here(&base).await.unwrap();
    let ids: Vec<u64> = cluster.replicas.iter().map(|r| r.id).collect();
    links.isolate(ids[p], &ids);
    let ack = |token: String| {
        let base = base.clone();
        async move {
            let r = client()
                .post(format!("{base}/v1/queues/{QUEUE}/leases/{token}/ack"))
                .timeout(Duration::from_secs(30))
                .send()
                .await
                .unwrap();
            (r.status(), r.json::<Value>().await.unwrap())
        }
    };
    let (status, v) = ack(first).await;
    assert!(
        status == StatusCode::INTERNAL_SERVER_ERROR || status == StatusCode::SERVICE_UNAVAILABLE,
        "{status} {v}"
    );
    let message = v["message"].as_str().unwrap();
    assert!(!message.contains("fsync"), "{v}");
    assert!(message.contains("primary"), "{v}");
    if status == StatusCode::INTERNAL_SERVER_ERROR {
        assert_eq!(v["kind"], "operation_unconfirmed");
        assert!(message.contains("leadership"), "{v}");
    }
    // Its leader lease runs out on its own clock, which nothing outside
    // shows: the next acks say so once it has.
    let v = common::eventually(
        "the deposed primary to refuse an ack as not the primary",
        Duration::from_secs(20),
        async || {
            let (status, v) = ack(second.clone()).await;
            (status == StatusCode::SERVICE_UNAVAILABLE).then_some(v)
        },
    )
    .await;
    assert!(
        v["message"].as_str().unwrap().contains("not the primary"),
        "{v}"
    );
    links.heal();
}
