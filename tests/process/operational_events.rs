//! spoold's own operational events against the binary (docs/contract.md
//! §4, "Operational events"): a queue subscribed to `spoold.>` is told when
//! a message fails, a breaker opens and closes, a rotated-out secret is an
//! hour from its end, and the spool nears `max_bytes`; each event carries
//! the tenant of the queue it describes and never reaches that queue (nor
//! a catch-all `>` subscriber); two
//! queues that fail each other's events stop at the hop bound; a client
//! may not publish them.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::eventually;
use crate::common::process::{client, messages_in, put, start_config};
use crate::common::sink::Sink;

const SECRET: &str = "whsec_b3BlcmF0aW9uYWwtZXZlbnRzLXNlY3JldA==";

/// The operational events in pull queue `queue`: type → payloads.
async fn told(base: &str, queue: &str) -> BTreeMap<String, Vec<Value>> {
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for m in messages_in(&client(), base, queue).await {
        let body = serde_json::from_str(m["body"].as_str().unwrap()).unwrap();
        out.entry(m["eventType"].as_str().unwrap().to_owned())
            .or_default()
            .push(body);
    }
    out
}

/// Waits until `queue` holds events of every type in `types`.
async fn told_of(base: &str, queue: &str, types: &[&str]) -> BTreeMap<String, Vec<Value>> {
    eventually(
        &format!("{queue} told of {types:?}"),
        Duration::from_secs(30),
        async || {
            let got = told(base, queue).await;
            types.iter().all(|t| got.contains_key(*t)).then_some(got)
        },
    )
    .await
}

async fn send(base: &str, queue: &str, body: String) -> StatusCode {
    let r = client()
        .post(format!("{base}/v1/queues/{queue}/messages"))
        .body(body)
        .send()
        .await
        .unwrap();
    r.status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_breakers_and_secrets_are_told_with_the_tenant_never_to_the_queue_itself() {
    let (sink, sink_url) = Sink::start().await;
    let (theirs, theirs_url) = Sink::start().await;
    let (ours, ours_url) = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ops = "[queues.ops]\nevents = [\"spoold.>\"]\n[queues.catchall]\nevents = [\">\"]\n";
    let spoold = start_config(dir.path(), "", "", ops).await;
    let base = spoold.base.clone();
    let http = client();
    // `hooks` is described by every event below, and subscribes to them
    // itself: none may reach it.
    for (queue, settings) in [
        (
            "hooks",
            json!({"destination": sink_url, "signingSecret": SECRET, "tenant": "cus_1",
                   "events": ["spoold.>"], "maxRetries": 0, "breakerFailures": 1}),
        ),
        (
            "cus_1-ops",
            json!({"destination": ours_url, "tenant": "cus_1", "events": ["spoold.endpoint.>"]}),
        ),
        (
            "cus_2-ops",
            json!({"destination": theirs_url, "tenant": "cus_2", "events": ["spoold.>"]}),
        ),
    ] {
        let (status, answer) = put(&http, &base, queue, &settings).await;
        assert_eq!(status, StatusCode::CREATED, "{queue}: {answer}");
    }

    // One failing delivery: retries exhausted (max 0), the breaker open
    // on its first failure, then closed by a probe with nothing to send.
    sink.script([(500, Vec::new())]);
    assert_eq!(
        send(&base, "hooks", "doomed".into()).await,
        StatusCode::CREATED
    );
    let got = told_of(
        &base,
        "ops",
        &[
            "spoold.message.failed",
            "spoold.endpoint.breaker_opened",
            "spoold.endpoint.breaker_closed",
        ],
    )
    .await;
    let failed_id = messages_in(&http, &base, "hooks.failed").await[0]["id"].clone();
    let failed = &got["spoold.message.failed"];
    assert_eq!(failed.len(), 1, "{got:?}");
    let failed = &failed[0];
    assert_eq!(failed["queue"], "hooks");
    assert_eq!(failed["messageId"], failed_id);
    assert_eq!(failed["reason"], "retries_exhausted");
    assert_eq!(failed["lastStatus"], 500);
    assert_eq!(failed["attempts"], 1);
    assert!(
        failed["failedAt"].as_str().unwrap().ends_with('Z'),
        "{failed}"
    );
    let opened = &got["spoold.endpoint.breaker_opened"][0];
    assert_eq!(opened["queue"], "hooks");
    assert!(opened["nextProbeAt"].as_str().unwrap() > opened["openedAt"].as_str().unwrap());
    assert_eq!(got["spoold.endpoint.breaker_closed"][0]["queue"], "hooks");

    // A rotation whose old secret ends within the hour: warned of once.
    let r = http
        .post(format!("{base}/v1/queues/hooks/secret/rotate"))
        .json(&json!({"overlapSeconds": 1800}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let rotated: Value = r.json().await.unwrap();
    let got = told_of(&base, "ops", &["spoold.endpoint.secret_expiring"]).await;
    let expiring = &got["spoold.endpoint.secret_expiring"];
    assert_eq!(expiring.len(), 1, "{got:?}");
    assert_eq!(expiring[0]["queue"], "hooks");
    assert_eq!(expiring[0]["expiresAt"], rotated["previousExpiresAt"]);

    // The tenant's own subscriber was told of its endpoint (the types it
    // took: not message.failed); another tenant's never; nor `hooks`.
    let seen = ours.wait_for(3).await;
    let types: Vec<&str> = seen
        .iter()
        .map(|s| s.headers["spooler-event-type"].to_str().unwrap())
        .collect();
    assert_eq!(
        types
            .iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        [
            "spoold.endpoint.breaker_closed",
            "spoold.endpoint.breaker_opened",
            "spoold.endpoint.secret_expiring"
        ]
        .into(),
        "{types:?}"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(ours.seen().len(), 3, "each told once");
    assert!(theirs.seen().is_empty(), "another tenant's queue was told");
    assert!(
        told(&base, "catchall").await.is_empty(),
        "a catch-all `>` takes clients' events only"
    );
    let to_hooks: Vec<String> = sink
        .seen()
        .iter()
        .map(|s| String::from_utf8_lossy(&s.body).into_owned())
        .collect();
    assert_eq!(
        to_hooks,
        ["doomed"],
        "an event reached the queue it describes"
    );
    let metrics = spoold.api().text("/metrics").await;
    assert!(
        metrics.contains(
            "spoold_operational_events_total{kind=\"message.failed\",outcome=\"published\"} 1"
        ),
        "{metrics}"
    );

    // A client may not publish spoold's own types.
    let r = http
        .post(format!("{base}/v1/events"))
        .json(&json!({"type": "spoold.message.failed", "payload": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_queues_failing_each_others_failures_stop_at_the_hop_bound() {
    // Each queue's destination refuses everything at once (a permanent
    // status), and each subscribes to the other's failures: A's failure
    // goes to B, fails there, goes to A, … one hop further each time.
    let (refuser, refuser_url) = Sink::start().await;
    refuser.script((0..100).map(|_| (410, Vec::new())));
    let dir = tempfile::tempdir().unwrap();
    let ops = "[queues.ops]\nevents = [\"spoold.message.failed\"]\n";
    let spoold = start_config(dir.path(), "", "", ops).await;
    let base = spoold.base.clone();
    for queue in ["a", "b"] {
        let settings = json!({"destination": refuser_url, "events": ["spoold.message.failed"],
                              "permanentFailureStatuses": [410]});
        let (status, answer) = put(&client(), &base, queue, &settings).await;
        assert_eq!(status, StatusCode::CREATED, "{answer}");
    }
    assert_eq!(send(&base, "a", "first".into()).await, StatusCode::CREATED);
    let metrics = eventually(
        "the chain to stop at the hop bound",
        Duration::from_secs(30),
        async || {
            let m = spoold.api().text("/metrics").await;
            m.contains("kind=\"message.failed\",outcome=\"past_hop_bound\"} 1")
                .then_some(m)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // The first message, then one event per hop up to the bound: 1 + 8
    // deliveries in all, each with one more hop than the one before.
    let seen = refuser.seen();
    assert_eq!(seen.len(), 9, "{metrics}");
    let hops: Vec<u8> = seen
        .iter()
        .map(|s| s.headers["spooler-hops"].to_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(hops, (1..=9).collect::<Vec<u8>>());
    // `ops` took every failure but the last.
    assert_eq!(told(&base, "ops").await["spoold.message.failed"].len(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_near_max_bytes_is_told_once() {
    let dir = tempfile::tempdir().unwrap();
    let spool = "segment_bytes = \"64KiB\"\nmax_bytes = \"1280KiB\"";
    let tables = "[queues.ops]\nevents = [\"spoold.spool.>\"]\n[queues.fill]\n";
    let spoold = start_config(dir.path(), "", spool, tables).await;
    let base = spoold.base.clone();
    let body = "x".repeat(16 * 1024);
    let mut sent = 0;
    while send(&base, "fill", body.clone()).await == StatusCode::CREATED {
        sent += 1;
        assert!(sent < 200, "max_bytes never refused a send");
    }
    let got = told_of(&base, "ops", &["spoold.spool.near_full"]).await;
    let near = &got["spoold.spool.near_full"];
    assert_eq!(near.len(), 1, "{got:?}");
    assert_eq!(near[0]["resource"], "disk");
    assert_eq!(near[0]["maxBytes"], 1280 * 1024);
    let used = near[0]["usedBytes"].as_u64().unwrap();
    assert!(used >= 1280 * 1024 * 9 / 10, "{near:?}");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(told(&base, "ops").await["spoold.spool.near_full"].len(), 1);
}
