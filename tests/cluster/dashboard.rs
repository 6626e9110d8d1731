//! Issue 42, point 13: every metric the Grafana dashboard
//! (`grafana/spoold.json`) queries is exported by a running cluster, on
//! the primary and on a follower, from the start: none of its panels says
//! "No data" on a healthy cluster that has done nothing yet (a snapshot's
//! figures, a leader change, an event's outcome). `.ci/check-dashboard.py`
//! checks the queries' PromQL and that each name exists in the code; this
//! checks a real scrape.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::api::Api;
use crate::common::cluster::TestCluster;
use crate::common::sink::Sink;

/// The metric names the dashboard's queries use, as exported (a
/// histogram's by its base name).
fn dashboard_metrics() -> BTreeSet<String> {
    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../../grafana/spoold.json")).unwrap();
    let mut names = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            for (at, _) in expr.match_indices("spoold_") {
                let name: String = expr[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let base = ["_bucket", "_count", "_sum"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .unwrap_or(&name);
                names.insert(base.to_owned());
            }
        }
    }
    names
}

/// The metric names a scrape of `base` shows, with a sample each.
async fn exported(base: &str) -> BTreeSet<String> {
    let text = Api::new(base.to_owned(), None).text("/metrics").await;
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let name: String = l
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(&name)
                .to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_queries_is_exported_from_the_start() {
    let wanted = dashboard_metrics();
    assert!(wanted.len() >= 20, "{wanted:?}");
    let (sink, url) = Sink::start().await;
    let tables = format!("[queues.hooks]\ndestination = \"{url}/in\"\n");
    let mut cluster = TestCluster::new(3, "", &tables);
    cluster.start_all().await;
    let primary = cluster.primary(Duration::from_secs(10)).await;
    // What no replica has done yet is there all the same, at zero: a
    // snapshot received, a published event, a scope refused.
    let from_the_start = [
        "spoold_cluster_snapshot_receiving",
        "spoold_cluster_snapshot_received_bytes_total",
        "spoold_cluster_leader_changes_total",
        "spoold_events_total",
        "spoold_event_deliveries_filtered_total",
        "spoold_scope_refusals_total",
    ];
    for replica in &cluster.replicas {
        let scraped = exported(&replica.base()).await;
        for name in from_the_start {
            assert!(wanted.contains(name), "{name} is not on the dashboard");
            assert!(
                scraped.contains(name),
                "replica {} does not export {name}",
                replica.id
            );
        }
    }
    // A delivery (the primary's work): then every panel has data, the
    // replicas' scrapes together (the dashboard sums over pods).
    let sent = reqwest::Client::new()
        .post(format!(
            "{}/v1/queues/hooks/messages",
            cluster.replicas[primary].base()
        ))
        .body("one")
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 201);
    sink.wait_for(1).await;
    let mut all = BTreeSet::new();
    for replica in &cluster.replicas {
        all.extend(exported(&replica.base()).await);
    }
    let missing: Vec<&String> = wanted.difference(&all).collect();
    assert!(missing.is_empty(), "no replica exports {missing:?}");
}
