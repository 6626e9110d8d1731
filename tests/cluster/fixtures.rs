//! Replicated mode's journals as earlier builds of format 2 wrote them
//! (`tests/data/README.md`), restarted as clusters by today's build:
//! `v2-cluster-membership-v1` by 139ec3c, whose membership records and
//! checkpoints hold the first layout (members without API URLs), and
//! `v2-cluster-membership-v2` by 2c52364, the layout since. Each replica
//! replays its log segments, its checkpoint (with the replica set in its
//! `CLUSTER` chunk) and its Raft files; the three elect a primary, which
//! pins today's API URLs into a new membership record (a v1 cluster's
//! first with URLs), and a follower relays to it. Everything the fixture
//! held is served, the cluster takes writes, and a second restart reads
//! them back.
//!
//! The replicas listen for replication where the stored membership names
//! them (`TestCluster::from_fixture`); their APIs are on free ports. The
//! fixtures' queue keeps messages for 3 650 days and has no delay:
//! these processes run on the real clock.

use crate::common;

use std::time::Duration;

use crate::common::cluster::TestCluster;
use crate::common::process::{client, messages_in, queue_json};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The fixtures' message ids (the same in both: a cluster's identity
/// comes from its secret).
const NACKED: &str = "0000000000000002115736ab550e1343";
const KEYED: &str = "0000000000000003115736ab550e1343";
/// Sent after every replica's checkpoint: replayed from the log.
const LATE: &str = "000000000000004a115736ab550e1343";

/// `orders` as a follower serves it (relayed to the primary): each
/// message's id, body and retry count, and whether the queue is paused.
async fn orders(cluster: &TestCluster, primary: usize) -> (Vec<(String, String, u64)>, bool) {
    let follower = cluster.replicas[(primary + 1) % 3].base();
    let primary = cluster.replicas[primary].base();
    // The follower relays to the API URL the membership names: the
    // primary's of today once it has pinned it.
    common::eventually(
        "a relay to the primary",
        Duration::from_secs(30),
        async || {
            let r = client()
                .get(format!("{follower}/v1/queues/orders"))
                .send()
                .await
                .ok()?;
            let relayed = r.headers().get("spooler-primary")?.to_str().ok()? == primary;
            (r.status() == StatusCode::OK && relayed).then_some(())
        },
    )
    .await;
    let queue = queue_json(&client(), &follower, "orders").await;
    let settings = &queue["settings"];
    assert_eq!(settings["maxRetries"], json!(3), "{queue}");
    assert_eq!(settings["dedupWindowSeconds"], json!(3600.0), "{queue}");
    assert_eq!(
        settings["retentionSeconds"],
        json!(315_360_000.0),
        "{queue}"
    );
    assert!(
        messages_in(&client(), &follower, "churn").await.is_empty(),
        "purged"
    );
    let messages = messages_in(&client(), &follower, "orders").await;
    let messages = messages
        .iter()
        .map(|m: &Value| {
            (
                m["id"].as_str().unwrap().to_owned(),
                m["body"].as_str().unwrap().to_owned(),
                m["retryCount"].as_u64().unwrap(),
            )
        })
        .collect();
    (messages, queue["stats"]["paused"] == json!(true))
}

fn row(id: &str, body: &str, retry_count: u64) -> (String, String, u64) {
    (id.into(), body.into(), retry_count)
}

/// Every replica names the three members where the fixture put them,
/// all voters, and holds the same state.
async fn check_members(cluster: &TestCluster, host: &str) {
    for i in 0..3 {
        let status = cluster.status(i).await.unwrap();
        let members: Vec<(String, bool)> = status["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["addr"].as_str().unwrap().to_owned(),
                    m["voter"] == json!(true),
                )
            })
            .collect();
        let expected: Vec<(String, bool)> = (1..=3)
            .map(|id| (format!("{host}:{}", 7380 + id), true))
            .collect();
        assert_eq!(members, expected, "{status}");
    }
    cluster
        .same_state(&[0, 1, 2], Duration::from_secs(30))
        .await;
}

/// Restarts the fixture `name` (replicas on `host`), checks it, writes
/// to it, restarts it again and checks what it wrote.
async fn restart_and_write(name: &str, host: &str) {
    let mut cluster = TestCluster::from_fixture(name, host);
    cluster.start_all().await;
    let primary = cluster.primary(Duration::from_secs(30)).await;
    let (messages, paused) = orders(&cluster, primary).await;
    assert_eq!(
        messages,
        [
            row(NACKED, "nacked", 1),
            row(KEYED, "keyed", 0),
            row(LATE, "after the snapshot", 0),
        ]
    );
    assert!(paused, "paused after the checkpoint");
    check_members(&cluster, host).await;

    // Written through the primary: resumed, the oldest acked, one sent.
    let api = common::api::Api::new(cluster.replicas[primary].base(), None);
    let resumed = api
        .call(reqwest::Method::POST, "/v1/queues/orders/resume")
        .await;
    assert_eq!(resumed.status(), StatusCode::NO_CONTENT);
    let r = api.receive("orders", "").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["spooler-message-id"], NACKED);
    let token = r.headers()["spooler-lease-token"]
        .to_str()
        .unwrap()
        .to_owned();
    let acked = api.settle("orders", &token, "ack").await;
    assert_eq!(acked.status(), StatusCode::NO_CONTENT);
    let sent = api.send_id("orders", "after the restart").await;

    for replica in &mut cluster.replicas {
        let mut process = replica.process.take().unwrap();
        assert_eq!(process.stop(), 0, "replica {} stops cleanly", replica.id);
    }
    cluster.start_all().await;
    let primary = cluster.primary(Duration::from_secs(30)).await;
    let (messages, paused) = orders(&cluster, primary).await;
    assert_eq!(
        messages,
        [
            row(KEYED, "keyed", 0),
            row(LATE, "after the snapshot", 0),
            row(&sent, "after the restart", 0),
        ]
    );
    assert!(!paused);
    check_members(&cluster, host).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_written_before_members_had_api_urls_restarts_and_is_served() {
    restart_and_write("v2-cluster-membership-v1", "127.38.0.1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_written_with_member_api_urls_restarts_and_is_served() {
    restart_and_write("v2-cluster-membership-v2", "127.38.0.2").await;
}
