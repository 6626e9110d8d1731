//! One delivery log per endpoint against the binary (docs/contract.md §4,
//! "Delivery log"): `[events] history_retention` gives event endpoints
//! that set none a history; `GET /v1/queues/{q}/deliveries` (and `spoold
//! deliveries`) lists pending, retrying, failed and delivered messages
//! together, newest first, each with its state, attempts and last status,
//! searched and paged like the history, the same after `kill -9`.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::process::{cli, client, put, queue_json, start_config};
use crate::common::sink::Sink;

async fn publish(base: &str, event_type: &str, n: u32) {
    let r = client()
        .post(format!("{base}/v1/events"))
        .json(&json!({"type": event_type, "payload": {"n": n}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
}

async fn log(base: &str, query: &str) -> Value {
    let r = client()
        .get(format!("{base}/v1/queues/hooks/deliveries{query}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.unwrap()
}

/// (state, body, attempts, last status) of each entry, newest first.
fn summary(page: &Value) -> Vec<(String, String, usize, Value)> {
    page["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["state"].as_str().unwrap().to_owned(),
                d["body"].as_str().unwrap().to_owned(),
                d["attempts"].as_array().unwrap().len(),
                d["lastStatus"].clone(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_lists_every_state_newest_first_through_kill_9() {
    let (sink, sink_url) = Sink::start().await;
    sink.script([(200, Vec::new()), (410, Vec::new()), (503, Vec::new())]);
    let dir = tempfile::tempdir().unwrap();
    let server = "";
    let tables = "[events]\nhistory_retention = \"1h\"\nhistory_max_bytes = \"1MiB\"\n";
    let mut spoold = start_config(dir.path(), server, "", tables).await;
    let base = spoold.base.clone();
    let http = client();
    let hooks = json!({"destination": sink_url, "events": ["invoice.*"],
                       "permanentFailureStatuses": [410],
                       "backoff": {"initialSeconds": 600, "jitter": 0}});
    let (status, answer) = put(&http, &base, "hooks", &hooks).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    // The server's default filled in: this endpoint set no history.
    assert_eq!(
        answer["settings"]["historyRetentionSeconds"], 3600.0,
        "{answer}"
    );
    assert_eq!(answer["settings"]["historyMaxBytes"], 1 << 20, "{answer}");
    // One that says 0 keeps none; a pull queue is no endpoint.
    let mut own = hooks.clone();
    own["historyRetentionSeconds"] = json!(0);
    let (_, answer) = put(&http, &base, "silent", &own).await;
    assert_eq!(
        answer["settings"]["historyRetentionSeconds"], 0.0,
        "{answer}"
    );
    let (_, answer) = put(&http, &base, "pulled", &json!({"events": ["invoice.*"]})).await;
    assert_eq!(
        answer["settings"]["historyRetentionSeconds"], 0.0,
        "{answer}"
    );
    http.delete(format!("{base}/v1/queues/silent"))
        .send()
        .await
        .unwrap();

    // Delivered, failed (410), retrying (503, next try in ten minutes),
    // and pending (the queue paused).
    for (n, seen) in [(1, 1), (2, 2), (3, 3)] {
        publish(&base, "invoice.paid", n).await;
        sink.wait_for(seen).await;
    }
    let r = http
        .post(format!("{base}/v1/queues/hooks/pause"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    publish(&base, "invoice.voided", 4).await;
    let want = vec![
        ("pending".into(), "{\"n\":4}".into(), 0, Value::Null),
        ("retrying".into(), "{\"n\":3}".into(), 1, json!(503)),
        ("failed".into(), "{\"n\":2}".into(), 1, json!(410)),
        ("delivered".into(), "{\"n\":1}".into(), 1, json!(200)),
    ];
    let settled = crate::common::eventually(
        "every delivery settled",
        Duration::from_secs(10),
        async || {
            let page = log(&base, "").await;
            (summary(&page) == want).then_some(page)
        },
    )
    .await;
    let entries = settled["deliveries"].as_array().unwrap();
    assert_eq!(entries[2]["queue"], "hooks.failed");
    assert_eq!(entries[2]["reason"], "permanent_status");
    assert_eq!(entries[0]["messageState"], "visible");
    assert_eq!(entries[3]["messageState"], "delivered");
    assert!(settled.get("next").is_none(), "{settled}");

    // Searched by the history's terms, and paged.
    let paid = log(&base, "?type=invoice.paid").await;
    assert_eq!(summary(&paid), want[1..]);
    let first = log(&base, "?limit=2").await;
    assert_eq!(summary(&first), want[..2]);
    let next = first["next"].as_str().unwrap();
    let second = log(&base, &format!("?limit=2&before={next}")).await;
    assert_eq!(summary(&second), want[2..]);
    let r = http
        .get(format!("{base}/v1/queues/hooks/deliveries?after=x"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = http
        .get(format!("{base}/v1/queues/nowhere/deliveries"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    // kill -9: the same log.
    spoold.signal("-KILL");
    spoold.wait_exit();
    let spoold = start_config(dir.path(), server, "", tables).await;
    let base = spoold.base.clone();
    assert_eq!(summary(&log(&base, "").await), want);
    let q = queue_json(&http, &base, "hooks").await;
    assert_eq!(q["settings"]["historyRetentionSeconds"], 3600.0, "{q}");

    // The command line shows the same.
    let ran = cli(&base, &["deliveries", "hooks"]).await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let states: Vec<&str> = ran
        .stdout
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(
        states,
        ["pending", "retrying", "failed", "delivered"],
        "{}",
        ran.stdout
    );
    let ran = cli(&base, &["deliveries", "hooks", "--json", "--limit", "1"]).await;
    let line: Value = serde_json::from_str(ran.stdout.trim()).unwrap();
    assert_eq!(line["state"], "pending", "{}", ran.stdout);
}
