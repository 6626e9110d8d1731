//! Events against the binary (docs/contract.md §4 "Events"): an event is
//! written once and becomes a message in every queue whose patterns take
//! its type (and whose tenant, if set, is the event's), atomically, through
//! `kill -9`, restarts and compaction; endpoints are queues created over
//! the API; bad events and bad subscriptions are refused naming the field.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::common::api::Api;
use crate::common::process::{
    client, messages_in, newest_checkpoint, put, start_config, start_with, wait_for_checkpoint,
};
use crate::common::sink::Sink;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// `POST /v1/events` with a JSON event: the status and the answer.
async fn publish(base: &str, event: &Value, key: Option<&str>) -> (StatusCode, Value) {
    let mut request = client().post(format!("{base}/v1/events")).json(event);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let r = request.send().await.unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// queue → delivery id, from an answer.
fn deliveries(answer: &Value) -> BTreeMap<String, String> {
    answer["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["queue"].as_str().unwrap().to_owned(),
                d["id"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

const PULL_QUEUES: &str = r#"
[queues.all-invoices]
events = ["invoice.*"]
[queues.everything]
events = [">"]
[queues.orders]
events = ["order.created", "order.*.cancelled"]
[queues.quiet]
"#;

/// A 2 KiB message to `quiet`, which no event reaches: litter that
/// [`sweep`] makes garbage, so that the segments it shares with the events
/// around it are worth compacting (mostly garbage) and their live records
/// move.
async fn litter(base: &str) {
    let r = client()
        .post(format!("{base}/v1/queues/quiet/messages"))
        .body("l".repeat(2048))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
}

/// Purges the litter.
async fn sweep(base: &str) {
    let r = client()
        .delete(format!("{base}/v1/queues/quiet/messages"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_reaches_every_subscriber_once_and_survives_kill_and_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let spool = "segment_bytes = \"64KiB\"\ncompaction_interval = \"100ms\"";
    let mut spoold = start_config(dir.path(), "", spool, PULL_QUEUES).await;
    let base = spoold.base.clone();

    let (status, paid) = publish(
        &base,
        &json!({"type": "invoice.paid", "payload": {"invoice": 7, "amount": 1200}}),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{paid}");
    let paid_to = deliveries(&paid);
    assert_eq!(
        paid_to.keys().collect::<Vec<_>>(),
        ["all-invoices", "everything"]
    );
    let ids: BTreeSet<&String> = paid_to.values().collect();
    assert_eq!(ids.len(), 2, "each delivery has an id of its own");
    assert!(!ids.contains(&paid["id"].as_str().unwrap().to_owned()));

    let (_, created) = publish(
        &base,
        &json!({"type": "order.created", "payload": [1, 2]}),
        None,
    )
    .await;
    assert_eq!(
        deliveries(&created).keys().collect::<Vec<_>>(),
        ["everything", "orders"]
    );
    let (_, nested) = publish(
        &base,
        &json!({"type": "order.eu.cancelled", "payload": null}),
        None,
    )
    .await;
    assert_eq!(
        deliveries(&nested).keys().collect::<Vec<_>>(),
        ["everything", "orders"]
    );
    // `invoice.*` is one segment: not invoice.payment.failed.
    let (_, deep) = publish(
        &base,
        &json!({"type": "invoice.payment.failed", "payload": {}}),
        None,
    )
    .await;
    assert_eq!(deliveries(&deep).keys().collect::<Vec<_>>(), ["everything"]);

    // A delivery is a message like any other, with its event's type.
    let got = messages_in(&client(), &base, "all-invoices").await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["id"], paid_to["all-invoices"].as_str());
    assert_eq!(got[0]["eventType"], "invoice.paid");
    assert_eq!(got[0]["eventId"], paid["id"]);
    assert_eq!(got[0]["contentType"], "application/json");
    let body: Value = serde_json::from_str(got[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body, json!({"invoice": 7, "amount": 1200}));
    // A receive says the type in headers.
    let r = client()
        .post(format!("{base}/v1/queues/orders/receive"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["spooler-event-type"], "order.created");
    let token = r.headers()["spooler-lease-token"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"[1,2]");
    // Acking one delivery leaves the event's others alone.
    let acked = client()
        .post(format!("{base}/v1/queues/orders/leases/{token}/ack"))
        .send()
        .await
        .unwrap();
    assert_eq!(acked.status(), StatusCode::NO_CONTENT);

    // Many more events, so that compaction moves the shared records.
    let mut expected: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (queue, id) in paid_to
        .iter()
        .chain(&deliveries(&created))
        .chain(&deliveries(&nested))
        .chain(&deliveries(&deep))
    {
        expected
            .entry(queue.clone())
            .or_default()
            .insert(id.clone());
    }
    let orders_acked = deliveries(&created)["orders"].clone();
    expected.get_mut("orders").unwrap().remove(&orders_acked);
    let before = newest_checkpoint(&dir.path().join("spool"));
    for n in 0..300 {
        let event_type = ["invoice.sent", "order.created", "user.signed_up"][n % 3];
        let (status, answer) = publish(
            &base,
            &json!({"type": event_type, "payload": {"n": n, "pad": "x".repeat(400)}}),
            None,
        )
        .await;
        litter(&base).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        for (queue, id) in deliveries(&answer) {
            expected.entry(queue).or_default().insert(id);
        }
    }
    sweep(&base).await;
    let check = async |base: &str| {
        for queue in ["all-invoices", "everything", "orders", "quiet"] {
            let got: BTreeSet<String> = messages_in(&client(), base, queue)
                .await
                .iter()
                .map(|m| m["id"].as_str().unwrap().to_owned())
                .collect();
            let want = expected.get(queue).cloned().unwrap_or_default();
            assert_eq!(got, want, "queue {queue}");
        }
    };
    check(&base).await;
    // Compaction has run over the segments the events filled.
    wait_for_checkpoint(&dir.path().join("spool"), before).await;
    check(&base).await;
    spoold.signal("-KILL");
    spoold.wait_exit();
    let spoold = start_config(dir.path(), "", "segment_bytes = \"64KiB\"", PULL_QUEUES).await;
    check(&spoold.base).await;
    // Every delivery still reads its own payload after the restart.
    let got = messages_in(&client(), &spoold.base, "everything").await;
    assert!(got.iter().all(|m| m["eventType"].is_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_created_over_the_api_receive_their_tenants_events_with_headers_and_signatures() {
    let dir = tempfile::tempdir().unwrap();
    let (sink, url) = Sink::start().await;
    let spoold = start_with(dir.path(), "", "").await;
    let base = spoold.base.clone();
    let http = client();
    // Each endpoint its own secret; cus-2 is rotating from one to another.
    let whsec = |key: &[u8]| format!("whsec_{}", STANDARD.encode(key));
    let (old_key, new_key) = (b"cus-2 old key".as_slice(), b"cus-2 new key".as_slice());
    for (name, tenant, secret) in [
        ("cus-1", "cus_1", whsec(b"cus-1 key")),
        (
            "cus-2",
            "cus_2",
            format!("{} {}", whsec(old_key), whsec(new_key)),
        ),
    ] {
        let (status, answer) = put(
            &http,
            &base,
            name,
            &json!({
                "destination": format!("{url}/hooks/{name}"),
                "events": ["invoice.*"],
                "tenant": tenant,
                "signingSecret": secret,
            }),
        )
        .await;
        assert!(status.is_success(), "{answer}");
        assert_eq!(answer["settings"]["events"], json!(["invoice.*"]));
        assert_eq!(answer["settings"]["tenant"], tenant);
    }
    // A raw body with its type and tenant in headers.
    let r = http
        .post(format!("{base}/v1/events"))
        .header("Spooler-Event-Type", "invoice.paid")
        .header("Spooler-Tenant", "cus_2")
        .header("Content-Type", "text/plain")
        .body("paid in full")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let answer: Value = r.json().await.unwrap();
    assert_eq!(
        deliveries(&answer).keys().collect::<Vec<_>>(),
        ["cus-2"],
        "only the event's tenant's endpoint"
    );
    let seen = sink.wait_for(1).await;
    assert_eq!(seen[0].uri, "/hooks/cus-2");
    assert_eq!(seen[0].body.as_ref(), b"paid in full");
    let h = &seen[0].headers;
    assert_eq!(h["spooler-event-type"], "invoice.paid");
    assert_eq!(h["spooler-tenant"], "cus_2");
    assert_eq!(h["spooler-event-id"], answer["id"].as_str().unwrap());
    assert_eq!(h["content-type"], "text/plain");
    let delivery_id = deliveries(&answer)["cus-2"].clone();
    assert_eq!(h["webhook-id"], delivery_id.as_str());
    assert_eq!(h["spooler-delivery-id"], delivery_id.as_str());
    // Signed with cus-2's secrets (both, while rotating), over
    // "id.timestamp.body"; the id is the delivery's.
    let signature = |seen: &common::sink::Seen, keys: &[&[u8]]| -> (String, String) {
        let h = |k: &str| seen.headers[k].to_str().unwrap().to_owned();
        let signed = format!("{}.{}.", h("webhook-id"), h("webhook-timestamp"));
        let mut message = signed.into_bytes();
        message.extend_from_slice(&seen.body);
        let expected: Vec<String> = keys
            .iter()
            .map(|k| format!("v1,{}", STANDARD.encode(common::hmac_sha256(k, &message))))
            .collect();
        (h("webhook-signature"), expected.join(" "))
    };
    let (got, expected) = signature(&seen[0], &[old_key, new_key]);
    assert_eq!(got, expected);
    // Rotation done: one call, and the next event is signed by the new
    // key alone.
    let r = http
        .patch(format!("{base}/v1/queues/cus-2"))
        .header("Content-Type", "application/merge-patch+json")
        .body(json!({"signingSecret": whsec(new_key)}).to_string())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let (_, again) = publish(
        &base,
        &json!({"type": "invoice.paid", "tenant": "cus_2", "payload": {"n": 2}}),
        None,
    )
    .await;
    let seen = sink.wait_for(2).await;
    assert_eq!(
        seen[1].headers["webhook-id"],
        deliveries(&again)["cus-2"].as_str()
    );
    let (got, expected) = signature(&seen[1], &[new_key]);
    assert_eq!(got, expected);
    // An event of no tenant reaches no tenant's endpoint: no subscriber.
    let (status, none) = publish(&base, &json!({"type": "invoice.sent", "payload": 1}), None).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(none["deliveries"], json!([]));
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("spoold_events_total{outcome=\"no_subscribers\"} 1"),
        "{metrics}"
    );
    // Deleting an endpoint is one call, and it receives nothing more.
    let r = http
        .delete(format!("{base}/v1/queues/cus-2"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let (_, after) = publish(
        &base,
        &json!({"type": "invoice.paid", "tenant": "cus_2", "payload": 2}),
        None,
    )
    .await;
    assert_eq!(after["deliveries"], json!([]));
    // PATCH moves an endpoint to other events.
    let r = http
        .patch(format!("{base}/v1/queues/cus-1"))
        .header("Content-Type", "application/merge-patch+json")
        .json(&json!({"events": ["order.>"]}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let (_, moved) = publish(
        &base,
        &json!({"type": "order.created", "tenant": "cus_1", "payload": 3}),
        None,
    )
    .await;
    assert_eq!(deliveries(&moved).keys().collect::<Vec<_>>(), ["cus-1"]);
    let (_, old) = publish(
        &base,
        &json!({"type": "invoice.paid", "tenant": "cus_1", "payload": 4}),
        None,
    )
    .await;
    assert_eq!(old["deliveries"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_fans_an_event_out_once_across_restarts_and_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let spool = "segment_bytes = \"64KiB\"\ncompaction_interval = \"100ms\"";
    let mut spoold = start_config(dir.path(), "", spool, PULL_QUEUES).await;
    let base = spoold.base.clone();
    let event = json!({"type": "invoice.paid", "payload": {"n": 1}});
    let (status, first) = publish(&base, &event, Some("evt-1")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let r = client()
        .post(format!("{base}/v1/events"))
        .header("Idempotency-Key", "evt-1")
        .json(&event)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["spooler-deduplicated"], "true");
    let again: Value = r.json().await.unwrap();
    assert_eq!(again, first);
    // Checkpoints come and go (compaction), the process is killed: the key
    // still answers the first event, and nothing was sent twice.
    let before = newest_checkpoint(&dir.path().join("spool"));
    for n in 0..200 {
        let filler = json!({"type": "user.seen", "payload": "x".repeat(500 + n)});
        publish(&base, &filler, None).await;
        litter(&base).await;
    }
    sweep(&base).await;
    wait_for_checkpoint(&dir.path().join("spool"), before).await;
    spoold.signal("-KILL");
    spoold.wait_exit();
    let spoold = start_config(dir.path(), "", spool, PULL_QUEUES).await;
    let (status, after) = publish(&spoold.base, &event, Some("evt-1")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(after, first);
    let invoices = messages_in(&client(), &spoold.base, "all-invoices").await;
    assert_eq!(invoices.len(), 1, "fanned out once");
    // Another key is another event.
    let (status, other) = publish(&spoold.base, &event, Some("evt-2")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_ne!(other["id"], first["id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_events_and_subscriptions_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let tables = format!("{PULL_QUEUES}\n[events]\nmax_subscribers = 1\n");
    let spoold = start_with(dir.path(), "", &tables).await;
    let base = spoold.base.clone();
    let http = client();
    let refused = async |event: Value, field: &str| {
        let (status, answer) = publish(&base, &event, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{event}: {answer}");
        assert_eq!(answer["kind"], "bad_request");
        let message = answer["message"].as_str().unwrap();
        assert!(message.contains(field), "{event}: {message}");
    };
    refused(json!({"type": "", "payload": 1}), "type").await;
    refused(json!({"type": "a".repeat(256), "payload": 1}), "type").await;
    refused(json!({"type": "invoice.*", "payload": 1}), "type").await;
    // spoold's own operational events: subscribed to, never published.
    refused(
        json!({"type": "spoold.message.failed", "payload": 1}),
        "spoold's own",
    )
    .await;
    refused(json!({"type": "spoold", "payload": 1}), "spoold's own").await;
    refused(
        json!({"type": "a", "tenant": "no spaces", "payload": 1}),
        "tenant",
    )
    .await;
    refused(json!({"type": "a", "payload": 1, "extra": 2}), "extra").await;
    refused(json!({"payload": 1}), "type").await;
    // `>` takes everything, `invoice.*` too: two subscribers, over 1.
    refused(
        json!({"type": "invoice.paid", "payload": 1}),
        "events.max_subscribers",
    )
    .await;
    let (status, _) = publish(&base, &json!({"type": "user.created", "payload": 1}), None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "one subscriber is the limit");
    // Nothing was stored by a refused event.
    assert!(messages_in(&http, &base, "all-invoices").await.is_empty());

    for (settings, field) in [
        (json!({"events": ["invoice.**"]}), "events"),
        (json!({"events": ["invoice..paid"]}), "events"),
        (json!({"events": ["a.>.b"]}), "events"),
        (json!({"events": ["a"], "tenant": "cus_1"}), "tenant"),
    ] {
        let (status, answer) = put(&http, &base, "bad", &settings).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{settings}: {answer}");
        let message = answer["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{settings}: {message}");
    }
    let r = http
        .get(format!("{base}/v1/queues/bad"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND, "nothing was created");
    // The config file is held to the same rules, naming key and line.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[queues.q]\nevents = [\"x..y\"]\n").unwrap();
    let ran = common::process::run_in(dir.path(), &["check-config", "--config", "bad.toml"]);
    assert_ne!(ran.code, 0);
    assert!(ran.stderr.contains("queues.q.events"), "{}", ran.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_moves_an_events_record_once_for_all_its_deliveries() {
    let dir = tempfile::tempdir().unwrap();
    let spool = "segment_bytes = \"64KiB\"\ncompaction_interval = \"100ms\"";
    let tables = r#"
[queues.billing]
events = ["invoice.*"]
[queues.ledger]
events = ["invoice.*", "order.*"]
[queues.firehose]
events = ["bulk.*"]
"#;
    let mut spoold = start_config(dir.path(), "", spool, tables).await;
    let base = spoold.base.clone();
    let http = client();
    // Small events both queues keep, between large ones that go away.
    let mut kept = BTreeMap::new();
    for n in 0..60 {
        let (_, answer) = publish(
            &base,
            &json!({"type": "invoice.sent", "payload": {"n": n}}),
            None,
        )
        .await;
        for (queue, id) in deliveries(&answer) {
            kept.insert(id, (queue, n));
        }
        let bulk = json!({"type": "bulk.load", "payload": "x".repeat(8 << 10)});
        publish(&base, &bulk, None).await;
    }
    let r = http
        .delete(format!("{base}/v1/queues/firehose/messages"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    common::wait_until("compaction moved the kept records", async || {
        spoold.log().lines().any(|l| {
            l.contains("compacted")
                && l.split_whitespace()
                    .any(|w| w.starts_with("moved=") && w != "moved=0")
        })
    })
    .await;
    // A record is copied once however many deliveries point at it: the
    // runs moved at most one record per small event.
    let moved: usize = spoold
        .log()
        .lines()
        .filter(|l| l.contains("compacted"))
        .flat_map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.strip_prefix("moved="))
        })
        .map(|n| n.parse::<usize>().unwrap())
        .sum();
    eprintln!("{}", spoold.log());
    spoold.signal("-KILL");
    spoold.wait_exit();
    let spoold = start_config(dir.path(), "", spool, tables).await;
    let mut seen = BTreeMap::new();
    for queue in ["billing", "ledger"] {
        for m in messages_in(&http, &spoold.base, queue).await {
            let body: Value = serde_json::from_str(m["body"].as_str().unwrap()).unwrap();
            let n = body["n"].as_u64().unwrap() as usize;
            seen.insert(m["id"].as_str().unwrap().to_owned(), (queue.to_owned(), n));
            assert_eq!(m["eventType"], "invoice.sent");
        }
    }
    assert_eq!(
        seen, kept,
        "every delivery, each with its own event's payload"
    );
    assert!(moved <= 60, "{moved} records moved for 60 shared ones");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoold_events_send_publishes_and_prints_each_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let spoold = start_with(dir.path(), "", PULL_QUEUES).await;
    let base = spoold.base.clone();
    let cli = |args: &[&str]| {
        let mut all = vec!["--url", base.as_str(), "events", "send"];
        all.extend(args);
        common::process::run_in(dir.path(), &all)
    };
    let ran = cli(&["invoice.paid", "--data", r#"{"invoice":9}"#, "--key", "k1"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", ran.stdout);
    let queues: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(queues, ["all-invoices", "everything"]);
    let got = messages_in(&client(), &base, "all-invoices").await;
    assert_eq!(got[0]["id"], lines[1].split_whitespace().nth(1).unwrap());
    assert_eq!(got[0]["eventId"], lines[0]);
    assert_eq!(got[0]["body"], r#"{"invoice":9}"#);
    // The same key and event again: the first event, nothing new.
    let again = cli(&[
        "invoice.paid",
        "--data",
        r#"{"invoice":9}"#,
        "--key",
        "k1",
        "--json",
    ]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    let answer: Value = serde_json::from_str(again.stdout.trim()).unwrap();
    assert_eq!(answer["id"], lines[0]);
    // The same key for another body is a caller's bug, said as one.
    let reused = cli(&["invoice.paid", "--data", "{}", "--key", "k1"]);
    assert_eq!(reused.code, 1);
    assert!(
        reused.stderr.contains("idempotency_key_reused"),
        "{}",
        reused.stderr
    );
    assert_eq!(messages_in(&client(), &base, "all-invoices").await.len(), 1);
    // A bad type is refused with the server's message, exit 1.
    let bad = cli(&["invoice..paid", "--data", "{}"]);
    assert_eq!(bad.code, 1);
    assert!(bad.stderr.contains("type"), "{}", bad.stderr);
    // A body that says JSON (the default) must be JSON, and none may be
    // empty: the API's answers, word for word (issue 42, point 11).
    let api_says = |content_type: &'static str, body: &'static str| {
        let base = base.clone();
        async move {
            let r = client()
                .post(format!("{base}/v1/events"))
                .header("Spooler-Event-Type", "invoice.paid")
                .header("Content-Type", content_type)
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 400);
            r.json::<Value>().await.unwrap()["message"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    for (args, content_type, body) in [
        (
            vec!["invoice.paid", "--data", "{\"invoice\": 9"],
            "application/json",
            "{\"invoice\": 9",
        ),
        (vec!["invoice.paid", "--data", ""], "application/json", ""),
        (
            vec!["invoice.paid", "--data", "", "--content-type", "text/plain"],
            "text/plain",
            "",
        ),
    ] {
        let refused = cli(&args);
        assert_eq!(refused.code, 1, "{args:?}: {}", refused.stdout);
        let said = api_says(content_type, body).await;
        assert!(said.starts_with("payload: "), "{said}");
        assert!(
            refused.stderr.contains(&said),
            "{args:?}: {} vs {said}",
            refused.stderr
        );
    }
    let text = cli(&[
        "invoice.paid",
        "--data",
        "not json",
        "--content-type",
        "text/plain",
    ]);
    assert_eq!(text.code, 0, "{}", text.stderr);
    assert_eq!(messages_in(&client(), &base, "all-invoices").await.len(), 2);
}

/// Endpoints at scale, small enough for a test (the figures are
/// `bench/run.sh endpoints`'): 300 push queues created over the API, one
/// event to all of them delivered once each, and afterwards no dispatcher
/// left running (an idle endpoint costs no task).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_endpoints_keep_no_dispatcher_and_wake_for_an_event() {
    const ENDPOINTS: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    let (sink, url) = Sink::start().await;
    let spoold = start_with(dir.path(), "", "").await;
    let base = spoold.base.clone();
    let http = client();
    for i in 0..ENDPOINTS {
        let (status, answer) = put(
            &http,
            &base,
            &format!("ep-{i}"),
            &json!({"destination": format!("{url}/ep/{i}"), "events": ["ping"]}),
        )
        .await;
        assert!(status.is_success(), "{answer}");
    }
    let dispatchers = async || {
        let text = http
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("spoold_push_dispatchers "))
            .map(|v| v.trim().parse::<f64>().unwrap() as usize)
            .unwrap()
    };
    assert_eq!(dispatchers().await, 0, "no messages, no dispatcher");
    let (status, answer) = publish(&base, &json!({"type": "ping", "payload": 1}), None).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(answer["deliveries"].as_array().unwrap().len(), ENDPOINTS);
    let seen = sink.wait_for(ENDPOINTS).await;
    let paths: BTreeSet<String> = seen.iter().map(|s| s.uri.clone()).collect();
    assert_eq!(paths.len(), ENDPOINTS, "each endpoint once");
    common::wait_until("every dispatcher went back to sleep", async || {
        dispatchers().await == 0
    })
    .await;
    // Asleep, an endpoint still wakes for its next event.
    let (_, again) = publish(&base, &json!({"type": "ping", "payload": 2}), None).await;
    assert_eq!(again["deliveries"].as_array().unwrap().len(), ENDPOINTS);
    sink.wait_for(2 * ENDPOINTS).await;
}

/// "We never got it": an endpoint that keeps history shows what it was
/// sent (by time, type and tenant) with its attempts, and resends one as a
/// new delivery; history survives compaction and `kill -9`, and is
/// forgotten past its retention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivered_events_are_kept_listed_shown_and_resent() {
    let dir = tempfile::tempdir().unwrap();
    let (sink, url) = Sink::start().await;
    let spool = "segment_bytes = \"64KiB\"\ncompaction_interval = \"100ms\"";
    let mut spoold = start_config(dir.path(), "", spool, "").await;
    let base = spoold.base.clone();
    let http = client();
    let (status, answer) = put(
        &http,
        &base,
        "cus-7",
        &json!({
            "destination": format!("{url}/hooks"),
            "events": ["invoice.*", "order.*"],
            "historyRetentionSeconds": 3600,
        }),
    )
    .await;
    assert!(status.is_success(), "{answer}");
    assert_eq!(answer["settings"]["historyRetentionSeconds"], 3600.0);
    sink.script([(500, vec![])]); // the first attempt fails, the retry works
    let mut sent = Vec::new();
    for (n, event_type) in ["invoice.paid", "order.created", "invoice.sent"]
        .iter()
        .enumerate()
    {
        let (_, a) = publish(
            &base,
            &json!({"type": event_type, "tenant": format!("t{}", n % 2), "payload": {"n": n}}),
            None,
        )
        .await;
        sent.push(deliveries(&a)["cus-7"].clone());
    }
    sink.wait_for(4).await;
    let history = async |base: &str, query: &str| -> Value {
        common::eventually("the history page", Duration::from_secs(30), async || {
            let r = http
                .get(format!("{base}/v1/queues/cus-7/history{query}"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            let page: Value = r.json().await.unwrap();
            (!page["messages"].as_array().unwrap().is_empty()).then_some(page)
        })
        .await
    };
    common::wait_until("all three delivered", async || {
        history(&base, "").await["messages"]
            .as_array()
            .unwrap()
            .len()
            == 3
    })
    .await;
    let all = history(&base, "").await;
    let ids: Vec<&str> = all["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    // Newest delivery first: the delivery whose first attempt failed was
    // delivered last, after its backoff; it shows both attempts.
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(sorted, sent.iter().map(String::as_str).collect::<Vec<_>>());
    let first = &all["messages"][0];
    assert_eq!(first["state"], "delivered");
    assert!(first["deliveredAt"].is_string());
    let statuses: Vec<u64> = first["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [500, 200], "{first}");
    assert_eq!(first["retryCount"], 1);
    let others_tried_once = all["messages"].as_array().unwrap()[1..]
        .iter()
        .all(|m| m["attempts"].as_array().unwrap().len() == 1);
    assert!(others_tried_once, "{all}");
    // By type, by tenant, a page at a time.
    let invoices = history(&base, "?type=invoice.paid").await;
    assert_eq!(invoices["messages"].as_array().unwrap().len(), 1);
    let tenant = history(&base, "?tenant=t0").await;
    assert_eq!(tenant["messages"].as_array().unwrap().len(), 2);
    // By the body: a substring, a JSON path's value.
    let sent_ids = |page: &Value| -> Vec<String> {
        page["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        sent_ids(&history(&base, "?contains=%22n%22:2").await),
        [sent[2].clone()]
    );
    assert_eq!(
        sent_ids(&history(&base, "?match=$.n=1").await),
        [sent[1].clone()]
    );
    let page = history(&base, "?limit=2").await;
    assert_eq!(page["messages"].as_array().unwrap().len(), 2);
    let next = page["next"].as_str().unwrap().to_owned();
    let rest = history(&base, &format!("?limit=2&before={next}")).await;
    assert_eq!(rest["messages"][0]["id"], ids[2]);
    assert!(rest.get("next").is_none(), "{rest}");
    // Resend: a new delivery, saying what it repeats.
    let r = http
        .post(format!("{base}/v1/queues/cus-7/history/{}/resend", sent[0]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let resent: Value = r.json().await.unwrap();
    assert_eq!(resent["resentFrom"], sent[0].as_str());
    assert_ne!(resent["id"], sent[0].as_str());
    let seen = sink.wait_for(5).await;
    let last = &seen[4];
    assert_eq!(last.headers["spooler-resent-from"], sent[0].as_str());
    assert!(
        last.headers.get("webhook-id").is_none(),
        "no secret, no signature"
    );
    assert_eq!(
        last.headers["spooler-delivery-id"],
        resent["id"].as_str().unwrap()
    );
    assert_eq!(last.headers["spooler-event-type"], "invoice.paid");
    assert_eq!(last.body.as_ref(), br#"{"n":0}"#);
    common::wait_until("the resend in history too", async || {
        history(&base, "").await["messages"]
            .as_array()
            .unwrap()
            .len()
            == 4
    })
    .await;
    // Compaction, then kill -9: the history is as it was.
    let before = newest_checkpoint(&dir.path().join("spool"));
    for n in 0..100 {
        let filler = json!({"type": "user.seen", "payload": "x".repeat(1000 + n)});
        publish(&base, &filler, None).await;
    }
    wait_for_checkpoint(&dir.path().join("spool"), before).await;
    let before = history(&base, "").await;
    spoold.signal("-KILL");
    spoold.wait_exit();
    let spoold = start_config(dir.path(), "", spool, "").await;
    let after = history(&spoold.base, "").await;
    assert_eq!(after["messages"], before["messages"]);
    // The same from the CLI: list (by type), show, resend.
    let cli = |args: &[&str]| {
        let mut all = vec!["--url", spoold.base.as_str(), "history"];
        all.extend(args);
        common::process::run_in(dir.path(), &all)
    };
    let listed = cli(&["list", "cus-7", "--type", "invoice.paid", "--json"]);
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let lines: Vec<Value> = listed
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines.len(),
        2,
        "the event and its resend: {}",
        listed.stdout
    );
    let table = cli(&["list", "cus-7"]);
    assert!(table.stdout.starts_with("ID"), "{}", table.stdout);
    assert_eq!(table.stdout.lines().count(), 5, "{}", table.stdout);
    let shown = cli(&["show", "cus-7", &sent[0]]);
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    assert!(shown.stdout.contains("invoice.paid"), "{}", shown.stdout);
    assert!(shown.stdout.contains("attempts"), "{}", shown.stdout);
    let again = cli(&["resend", "cus-7", &sent[1]]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    let new_id = again.stdout.trim();
    assert_eq!(new_id.len(), 32, "{}", again.stdout);
    sink.wait_for(6).await;
    // A resend of what is not in history is 404.
    let r = http
        .post(format!(
            "{}/v1/queues/cus-7/history/{}/resend",
            spoold.base,
            "0".repeat(32)
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    // History off: forgotten.
    let r = http
        .patch(format!("{}/v1/queues/cus-7", spoold.base))
        .header("Content-Type", "application/merge-patch+json")
        .json(&json!({"historyRetentionSeconds": 0}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let r = http
        .get(format!("{}/v1/queues/cus-7/history", spoold.base))
        .send()
        .await
        .unwrap();
    let empty: Value = r.json().await.unwrap();
    assert_eq!(empty["messages"], json!([]));
}

/// Search: messages (and dead letters, and history) by event type,
/// tenant, a substring of the body and a JSON path's value, a page at a
/// time; from the API and the CLI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_found_by_type_tenant_text_and_json_path() {
    let dir = tempfile::tempdir().unwrap();
    let spoold = start_with(dir.path(), "", "").await;
    let base = spoold.base.clone();
    let http = client();
    let (status, _) = put(&http, &base, "audit", &json!({"events": [">"]})).await;
    assert!(status.is_success());
    let mut ids = Vec::new();
    for (event_type, tenant, payload) in [
        (
            "invoice.paid",
            "cus_1",
            json!({"customer": {"id": 1}, "note": "paid late"}),
        ),
        (
            "invoice.paid",
            "cus_2",
            json!({"customer": {"id": 42}, "note": "on time"}),
        ),
        (
            "order.created",
            "cus_2",
            json!({"customer": {"id": 42}, "items": [{"sku": "A-1"}]}),
        ),
        (
            "order.created",
            "cus_3",
            json!({"customer": {"id": 7}, "items": [{"sku": "B-2"}]}),
        ),
    ] {
        let (_, a) = publish(
            &base,
            &json!({"type": event_type, "tenant": tenant, "payload": payload}),
            None,
        )
        .await;
        ids.push(deliveries(&a)["audit"].clone());
    }
    let found = async |query: &str| -> Vec<String> {
        let mut all = Vec::new();
        let mut url = format!("{base}/v1/queues/audit/messages?{query}");
        loop {
            let r = http.get(&url).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{query}");
            let page: Value = r.json().await.unwrap();
            all.extend(
                page["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m["id"].as_str().unwrap().to_owned()),
            );
            match page["next"].as_str() {
                Some(next) => url = format!("{base}/v1/queues/audit/messages?{query}&after={next}"),
                None => return all,
            }
        }
    };
    assert_eq!(found("type=invoice.paid").await, ids[..2]);
    assert_eq!(found("tenant=cus_2").await, ids[1..3]);
    assert_eq!(found("contains=late").await, ids[..1]);
    assert_eq!(found("match=$.customer.id=42").await, ids[1..3]);
    assert_eq!(found("match=$.items[0].sku=B-2").await, ids[3..]);
    assert_eq!(
        found("type=order.created&match=customer.id=42").await,
        ids[2..3]
    );
    // One at a time, every page says where the next starts.
    assert_eq!(found("tenant=cus_2&limit=1").await, ids[1..3]);
    // Bad terms are named.
    for (query, name) in [("match=nothing", "match"), ("contains=", "contains")] {
        let r = http
            .get(format!("{base}/v1/queues/audit/messages?{query}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let e: Value = r.json().await.unwrap();
        assert!(e["message"].as_str().unwrap().starts_with(name), "{e}");
    }
    // The CLI searches dead letters the same way: fail two, find one.
    let (status, _) = put(
        &http,
        &base,
        "audit",
        &json!({"events": [">"], "maxRetries": 0}),
    )
    .await;
    assert!(status.is_success());
    let api = Api::new(base.clone(), None);
    for _ in 0..2 {
        let token = api.lease("audit").await;
        api.settle("audit", &token, "nack").await;
    }
    let ran = common::process::run_in(
        dir.path(),
        &[
            "--url",
            &base,
            "dlq",
            "list",
            "audit",
            "--contains",
            "late",
            "--json",
        ],
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let lines: Vec<Value> = ran
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{}", ran.stdout);
    assert_eq!(lines[0]["id"], ids[0].as_str());
}

/// Issue 42: a crash right after the timer's history drop is durable and
/// applied, before any checkpoint covers it (fail point
/// `history.dropped`, `src/failpoint.rs`). Restarted with a retention of a
/// day, nothing would drop those entries again: only the journaled drop
/// can keep them gone, and it does, through a compaction and a restart.
#[tokio::test]
async fn a_history_drop_stopped_before_its_checkpoint_stays_dropped() {
    use crate::common::process::{run_command, spawn_command, write_config};
    use spoold::testing::fail_points::{ENV, EXIT_CODE, HISTORY_DROPPED};
    let dir = tempfile::tempdir().unwrap();
    let spool_keys = "segment_bytes = \"64KiB\"\ncompaction_interval = \"1d\"";
    let queues = |retention: &str| {
        format!(
            "[queues.kept]\nhistory_retention = \"{retention}\"\n\
             [queues.quiet]\nhistory_retention = \"1d\"\n[queues.junk]\n"
        )
    };
    // Kept a day, all three entries are still there when spoold stops;
    // restarted with a retention of a millisecond, they are all past it at
    // once, so one record drops all three, and the fail point stops spoold
    // right after it is durable and applied.
    let spoold = start_config(dir.path(), "", spool_keys, &queues("1d")).await;
    let api = spoold.api().clone();
    for queue in ["kept", "quiet"] {
        for n in 0..3 {
            api.send_id(queue, &format!("{queue} {n}")).await;
            let token = api.lease(queue).await;
            assert_eq!(
                api.settle(queue, &token, "ack").await.status(),
                StatusCode::NO_CONTENT
            );
        }
    }
    let count = async |api: &Api, queue: &str| {
        let page = api.get_json(&format!("/v1/queues/{queue}/history")).await;
        page["messages"].as_array().unwrap().len()
    };
    assert_eq!(count(&api, "kept").await, 3);
    assert_eq!(count(&api, "quiet").await, 3);
    drop(spoold);
    let config = write_config(dir.path(), "", spool_keys, &queues("1ms"));
    let mut spoold =
        spawn_command(run_command(&config).env(ENV, format!("{HISTORY_DROPPED}=exit")));
    assert_eq!(spoold.wait_exit(), EXIT_CODE, "{}", spoold.log());

    let spool = dir.path().join("spool");
    let checkpoint = newest_checkpoint(&spool);
    let spool_keys = "segment_bytes = \"64KiB\"\ncompaction_interval = \"100ms\"";
    let spoold = start_config(dir.path(), "", spool_keys, &queues("1d")).await;
    let api = spoold.api().clone();
    assert_eq!(count(&api, "kept").await, 0, "the drop was replayed");
    assert_eq!(
        count(&api, "quiet").await,
        3,
        "another queue's history stays"
    );
    // A compaction writes the drop into a checkpoint; a restart reads it.
    for n in 0..200 {
        api.send_id("junk", &"x".repeat(512 + n)).await;
    }
    let purged = api
        .call(reqwest::Method::DELETE, "/v1/queues/junk/messages")
        .await;
    assert_eq!(purged.status(), StatusCode::OK);
    wait_for_checkpoint(&spool, checkpoint).await;
    drop(spoold);
    let spoold = start_config(dir.path(), "", spool_keys, &queues("1d")).await;
    let api = spoold.api().clone();
    assert_eq!(
        count(&api, "kept").await,
        0,
        "still dropped after compaction"
    );
    assert_eq!(count(&api, "quiet").await, 3);
}
