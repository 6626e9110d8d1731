//! Ordered delivery per key against the binary (docs/contract.md §2,
//! "Ordered delivery per key"): on a push queue whose destination fails
//! some attempts, messages of one key arrive one at a time and in send
//! order, through `kill -9`, while other keys flow past a retrying one; a
//! pull queue leases one message of a key at a time, holds a key whose
//! message failed until it is redriven (`ordering_on_failure = "hold"`),
//! and says so in peek, stats and `/metrics`; bad keys and settings are
//! refused naming them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode as AxumStatus};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::eventually;
use crate::common::process::{cli, client, put, queue_json, run_in, start_config};

/// What the ordered sink saw.
#[derive(Default)]
struct Seen {
    /// Every arrival, in order: (key, seq).
    arrivals: Vec<(String, u64)>,
    /// Attempts per seq.
    attempts: BTreeMap<u64, u32>,
    /// Seqs answered 200.
    delivered: BTreeMap<u64, String>,
    /// Requests of each key in the handler now, and the most ever.
    in_flight: BTreeMap<String, u32>,
    most_in_flight: BTreeMap<String, u32>,
    /// Deliveries whose `Spooler-Ordering-Key` was not their key.
    wrong_header: Vec<u64>,
}

/// Leaves the handler's count of its key when the request ends, answered
/// or dropped (a killed spoold's connection).
struct InFlight(Arc<Mutex<Seen>>, String);

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.lock().unwrap().in_flight.get_mut(&self.1).unwrap() -= 1;
    }
}

/// Payloads `{"key", "seq"}`; a seq that is 1 modulo 4 fails its first
/// two attempts with 503. Each request takes 15 ms.
async fn ordered_sink() -> (Arc<Mutex<Seen>>, String) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let handler = {
        let seen = seen.clone();
        move |headers: HeaderMap, body: Bytes| {
            let seen = seen.clone();
            async move {
                let body: Value = serde_json::from_slice(&body).unwrap();
                let key = body["key"].as_str().unwrap().to_owned();
                let seq = body["seq"].as_u64().unwrap();
                let fail = {
                    let mut s = seen.lock().unwrap();
                    s.arrivals.push((key.clone(), seq));
                    let attempts = s.attempts.entry(seq).or_default();
                    *attempts += 1;
                    let fail = seq % 4 == 1 && *attempts <= 2;
                    let now = s.in_flight.entry(key.clone()).or_default();
                    *now += 1;
                    let now = *now;
                    let most = s.most_in_flight.entry(key.clone()).or_default();
                    *most = (*most).max(now);
                    let header = headers
                        .get("spooler-ordering-key")
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default();
                    if header != key {
                        s.wrong_header.push(seq);
                    }
                    fail
                };
                let _guard = InFlight(seen.clone(), key.clone());
                tokio::time::sleep(Duration::from_millis(15)).await;
                if fail {
                    return AxumStatus::SERVICE_UNAVAILABLE;
                }
                seen.lock().unwrap().delivered.insert(seq, key);
                AxumStatus::OK
            }
        }
    };
    let app = axum::Router::new().fallback(handler);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (seen, format!("http://{addr}"))
}

const KEYS: [&str; 4] = ["acct-a", "acct-b", "acct-c", "acct-d"];
/// Messages without a key: they flow as on any queue.
const UNKEYED: &str = "";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_of_a_key_at_a_time_in_order_through_retries_and_kill_9() {
    let (seen, sink) = ordered_sink().await;
    let tables = format!(
        "[queues.ordered]\ndestination = \"{sink}\"\nordering = \"per_key\"\nconcurrency = 8\n\
         breaker_failures = 1000\n\
         backoff = {{ initial = \"50ms\", multiplier = 1, max = \"50ms\", jitter = 0 }}\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut spoold = start_config(dir.path(), "", "", &tables).await;
    let http = client();

    // 4 keys of 15 messages, interleaved, and 10 without a key.
    let mut sent = 0u64;
    for round in 0..15 {
        for key in KEYS.iter().chain((round % 3 == 0).then_some(&UNKEYED)) {
            let mut request = http
                .post(format!("{}/v1/queues/ordered/messages", spoold.base))
                .header("content-type", "application/json")
                .body(json!({"key": key, "seq": sent}).to_string());
            if !key.is_empty() {
                request = request.header("spooler-ordering-key", *key);
            }
            let r = request.send().await.unwrap();
            assert_eq!(r.status(), StatusCode::CREATED);
            sent += 1;
        }
    }

    // Cut it down mid-run: what was in flight goes again, after a restart,
    // still first in its key.
    eventually("a third delivered", Duration::from_secs(60), async || {
        (seen.lock().unwrap().delivered.len() as u64 >= sent / 3).then_some(())
    })
    .await;
    spoold.signal("-KILL");
    spoold.wait_exit();
    let spoold = start_config(dir.path(), "", "", &tables).await;
    eventually(
        "every message delivered",
        Duration::from_secs(120),
        async || (seen.lock().unwrap().delivered.len() as u64 == sent).then_some(()),
    )
    .await;
    let stats = eventually("the queue empty", Duration::from_secs(30), async || {
        let q = queue_json(&http, &spoold.base, "ordered").await;
        (q["stats"]["visible"] == 0 && q["stats"]["leased"] == 0).then_some(q)
    })
    .await;
    assert_eq!(stats["stats"]["held"], 0, "{stats}");

    let seen = seen.lock().unwrap();
    assert!(seen.wrong_header.is_empty(), "{:?}", seen.wrong_header);
    for key in KEYS {
        let order: Vec<u64> = (seen.arrivals.iter())
            .filter(|(k, _)| k == key)
            .map(|&(_, seq)| seq)
            .collect();
        assert!(
            order.is_sorted(),
            "{key} arrived out of order (a retry or a redelivery after kill -9 repeats \
             its own seq only): {order:?}"
        );
        assert_eq!(seen.most_in_flight[key], 1, "{key}: two in flight at once");
    }
    // The retried ones were retried, and while one waited for its backoff
    // other keys were delivered.
    let retried: Vec<u64> = (0..sent).filter(|seq| seq % 4 == 1).collect();
    for seq in &retried {
        assert!(seen.attempts[seq] >= 3, "{seq}: {:?}", seen.attempts[seq]);
    }
    let overtaken = retried.iter().any(|seq| {
        let key = &seen.delivered[seq];
        let first = seen.arrivals.iter().position(|(_, s)| s == seq).unwrap();
        let last = seen.arrivals.iter().rposition(|(_, s)| s == seq).unwrap();
        seen.arrivals[first..last].iter().any(|(k, _)| k != key)
    });
    assert!(overtaken, "other keys flow while one retries");
}

/// Sends `body` to `queue` with ordering key `key`: the id.
async fn send(base: &str, queue: &str, body: &str, key: Option<&str>) -> String {
    let mut request = client()
        .post(format!("{base}/v1/queues/{queue}/messages"))
        .body(body.to_owned());
    if let Some(key) = key {
        request = request.header("spooler-ordering-key", key);
    }
    let r = request.send().await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Leases what `queue` offers now (up to 10): (body, lease token) each.
async fn receive_all(base: &str, queue: &str) -> Vec<(String, String)> {
    let r = client()
        .post(format!("{base}/v1/queues/{queue}/receive-batch?max=10"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let batch: Value = r.json().await.unwrap();
    let mut got: Vec<(String, String)> = batch["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let body = m["body"].as_str().unwrap().to_owned();
            (body, m["leaseToken"].as_str().unwrap().to_owned())
        })
        .collect();
    got.sort();
    got
}

fn bodies(got: &[(String, String)]) -> Vec<&str> {
    got.iter().map(|(b, _)| b.as_str()).collect()
}

async fn settle(base: &str, queue: &str, token: &str, verb: &str) {
    let r = client()
        .post(format!("{base}/v1/queues/{queue}/leases/{token}/{verb}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT, "{verb}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_queue_leases_a_key_at_a_time_and_hold_waits_for_the_redrive() {
    const TABLES: &str = "[queues.pulled]\nordering = \"per_key\"\n\
                          ordering_on_failure = \"hold\"\nmax_retries = 0\n\
                          [queues.audit]\nevents = [\"a.b\"]\n";
    let dir = tempfile::tempdir().unwrap();
    let mut spoold = start_config(dir.path(), "", "", TABLES).await;
    let base = spoold.base.clone();
    // The CLI's send takes a key too.
    let sent = cli(
        &base,
        &["send", "pulled", "--data", "a1", "--ordering-key", "a"],
    )
    .await;
    assert_eq!(sent.code, 0, "{}", sent.stderr);
    let a2 = send(&base, "pulled", "a2", Some("a")).await;
    send(&base, "pulled", "b1", Some("b")).await;
    send(&base, "pulled", "n1", None).await;

    // One of each key; a2 waits behind a1, and says so.
    let got = receive_all(&base, "pulled").await;
    assert_eq!(bodies(&got), ["a1", "b1", "n1"]);
    let peeked = (spoold.api())
        .get_json(&format!("/v1/queues/pulled/messages/{a2}"))
        .await;
    assert_eq!(peeked["state"], "held", "{peeked}");
    assert_eq!(peeked["orderingKey"], "a", "{peeked}");
    // So do events, from the CLI as from the API; each delivery keeps it.
    let published = cli(
        &base,
        &[
            "events",
            "send",
            "a.b",
            "--data",
            "{}",
            "--ordering-key",
            "e",
            "--json",
        ],
    )
    .await;
    assert_eq!(published.code, 0, "{}", published.stderr);
    let audit = crate::common::process::messages_in(&client(), &base, "audit").await;
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0]["orderingKey"], "e", "{audit:?}");
    let q = queue_json(&client(), &base, "pulled").await;
    assert_eq!(q["stats"]["held"], 1, "{q}");
    let metrics = spoold.api().text("/metrics").await;
    assert!(
        metrics.contains("spoold_queue_messages{queue=\"pulled\",state=\"held\"} 1"),
        "{metrics}"
    );

    // a1 fails (no retries left): with "hold", a2 still waits, through a
    // kill -9 that drops every lease.
    settle(&base, "pulled", &got[0].1, "nack").await;
    settle(&base, "pulled", &got[1].1, "ack").await;
    settle(&base, "pulled", &got[2].1, "ack").await;
    assert!(receive_all(&base, "pulled").await.is_empty());
    spoold.signal("-KILL");
    spoold.wait_exit();
    let spoold = start_config(dir.path(), "", "", TABLES).await;
    let base = spoold.base.clone();
    assert!(receive_all(&base, "pulled").await.is_empty());
    let q = queue_json(&client(), &base, "pulled").await;
    assert_eq!(q["stats"]["held"], 1, "{q}");

    // Redriven, a1 goes first again; a2 only once a1 is acked.
    let r = client()
        .post(format!("{base}/v1/queues/pulled/redrive"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let got = receive_all(&base, "pulled").await;
    assert_eq!(bodies(&got), ["a1"]);
    settle(&base, "pulled", &got[0].1, "ack").await;
    let got = receive_all(&base, "pulled").await;
    assert_eq!(bodies(&got), ["a2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_and_settings_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let spoold = start_config(dir.path(), "", "", "[queues.q]\n").await;
    let http = client();
    let base = &spoold.base;
    for key in ["k".repeat(129), "two words".into()] {
        let r = http
            .post(format!("{base}/v1/queues/q/messages"))
            .header("spooler-ordering-key", key)
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let answer: Value = r.json().await.unwrap();
        assert!(
            answer["message"]
                .as_str()
                .unwrap()
                .contains("Spooler-Ordering-Key"),
            "{answer}"
        );
    }
    // The longest key is taken.
    send(base, "q", "x", Some(&"k".repeat(128))).await;
    let r = http
        .post(format!("{base}/v1/events"))
        .json(&json!({"type": "a.b", "orderingKey": "", "payload": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().contains("orderingKey"));
    let r = http
        .post(format!("{base}/v1/events"))
        .header("spooler-ordering-key", "k")
        .json(&json!({"type": "a.b", "payload": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // Nothing was stored by the refusals.
    let q = queue_json(&http, base, "q").await;
    assert_eq!(q["stats"]["sentTotal"], 1, "{q}");

    let (status, answer) = put(&http, base, "p", &json!({"orderingOnFailure": "hold"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(answer.to_string().contains("orderingOnFailure"), "{answer}");
    let (status, answer) = put(&http, base, "p", &json!({"ordering": "fifo"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");

    std::fs::write(
        dir.path().join("bad.toml"),
        "[spool]\ndir = \"x\"\n\n[queues.q]\nordering_on_failure = \"hold\"\n",
    )
    .unwrap();
    let bad = run_in(dir.path(), &["check-config", "--config", "bad.toml"]);
    assert_eq!(bad.code, 1, "{}", bad.stderr);
    assert!(bad.stderr.contains("ordering_on_failure"), "{}", bad.stderr);
    assert!(bad.stderr.contains("line 5"), "{}", bad.stderr);
}
