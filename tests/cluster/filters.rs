//! Content filters on three replicas (docs/contract.md §4 "Content
//! filters"): the primary decides once, the deliveries it journaled are
//! what every replica holds, through a relay from a follower and across
//! a failover, and a filter set over the API on one primary filters on
//! the next.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::common::cluster::{TestCluster, all_ids};
use crate::common::process::client;
use reqwest::StatusCode;
use serde_json::{Value, json};

const TABLES: &str = r#"
[queues.big]
events = ["order.*"]
filter = { payload = { amount = [{ numeric = [">=", 1000] }] } }
[queues.all]
events = ["order.*"]
"#;

/// Publishes through `base` (retried across an election): queue →
/// delivery id.
async fn publish(base: &str, amount: u64) -> BTreeMap<String, String> {
    for _ in 0..100 {
        let r = client()
            .post(format!("{base}/v1/events"))
            .json(&json!({"type": "order.created", "payload": {"amount": amount}}))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        if let Ok(r) = r
            && r.status() == StatusCode::ACCEPTED
        {
            let v: Value = r.json().await.unwrap();
            return v["deliveries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| {
                    (
                        d["queue"].as_str().unwrap().into(),
                        d["id"].as_str().unwrap().into(),
                    )
                })
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no 202 through {base}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_filters_once_and_every_replica_holds_what_it_decided() {
    let mut cluster = TestCluster::new(3, "", TABLES);
    cluster.start_all().await;
    let primary = cluster.primary(Duration::from_secs(10)).await;
    let follower = (primary + 1) % 3;
    let mut expected: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut record = |deliveries: BTreeMap<String, String>| {
        for (queue, id) in deliveries {
            expected.entry(queue).or_default().insert(id);
        }
    };
    // Through a follower's relay, and at the primary.
    for (i, amount) in [5, 1500, 999, 1000].into_iter().enumerate() {
        let at = if i % 2 == 0 { follower } else { primary };
        let d = publish(&cluster.replicas[at].base(), amount).await;
        let queues: Vec<&str> = d.keys().map(String::as_str).collect();
        let want: &[&str] = if amount >= 1000 {
            &["all", "big"]
        } else {
            &["all"]
        };
        assert_eq!(queues, want, "amount {amount}");
        record(d);
    }
    // An endpoint filtered over the API, then a failover.
    let base = cluster.replicas[primary].base();
    let r = client()
        .put(format!("{base}/v1/queues/tiny"))
        .json(&json!({"events": ["order.>"], "filter": {"payload": {"amount": [{"numeric": ["<", 10]}]}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    cluster.kill(primary);
    let next = cluster.primary(Duration::from_secs(10)).await;
    for amount in [3, 2000] {
        let d = publish(&cluster.replicas[next].base(), amount).await;
        let queues: Vec<&str> = d.keys().map(String::as_str).collect();
        let want: &[&str] = if amount < 10 {
            &["all", "tiny"]
        } else {
            &["all", "big"]
        };
        assert_eq!(queues, want, "amount {amount} on the next primary");
        record(d);
    }
    cluster.start(primary);
    // Every replica holds exactly the deliveries the primaries decided.
    for i in 0..3 {
        crate::common::process::wait_ready(cluster.replicas[i].process.as_ref().unwrap()).await;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    for i in 0..3 {
        for (queue, ids) in &expected {
            loop {
                let held = all_ids(&cluster.replicas[i].base(), queue).await;
                if &held == ids {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "replica {i}, queue {queue}: {held:?}, decided {ids:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
