//! The spool that the first build of format 2 at level 5 wrote
//! (`tests/data/v2-level5`, described in `tests/data/README.md`), run by
//! today's binary as a user runs it: everything it holds is read back
//! over HTTP (queues with content filters, per-key ordering, rotated and
//! expired secrets; messages held, failed, delayed, resent; operational
//! events; history; the event catalogue), then written to through every
//! level-5 feature, compacted (the fixture's checkpoint and segment
//! replaced by today's), and read again after a restart.
//!
//! A change that makes today's build misread what level 5 wrote fails
//! here; `tests/engine/fixture_table.rs` makes sure a new level or format
//! brings a fixture of its own.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::process::{
    Spoold, client, messages_in, newest_checkpoint, run_command, run_in, start_command,
    write_config,
};
use crate::common::{V2_LEVEL5_NOW_MS, copy_fixture, wait_until};

/// The fixture's salt: the API shows engine id `n` as `{n:016x}{SALT}`.
const SALT: &str = "de9eaeb18b5aff0f";
/// The fixture's checkpoint and its one segment, which compaction replaces.
const CHECKPOINT: &str = "00000000000000f1.ckpt";
const SEGMENT: &str = "0000000000000003.seg";

fn id(n: u64) -> String {
    format!("{n:016x}{SALT}")
}

fn engine_id(api_id: &str) -> u64 {
    let hex = api_id
        .strip_suffix(SALT)
        .unwrap_or_else(|| panic!("{api_id} has the fixture's salt"));
    u64::from_str_radix(hex, 16).unwrap()
}

/// Starts the binary on `dir/spool` with its wall clock moved by the
/// offset in `clock` (written once, so that a restart's clock runs on):
/// it starts at `V2_LEVEL5_NOW_MS` (`SPOOLD_TEST_CLOCK_FILE`).
async fn start(dir: &Path, clock: &Path) -> Spoold {
    let spool_keys = "segment_bytes = \"64KiB\"\ncompaction_interval = \"1s\"";
    let config = write_config(dir, "", spool_keys, "");
    start_command(run_command(&config).env("SPOOLD_TEST_CLOCK_FILE", clock)).await
}

fn write_clock(clock: &Path) {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    std::fs::write(clock, (V2_LEVEL5_NOW_MS - now_ms).to_string()).unwrap();
}

async fn get(base: &str, path: &str) -> Value {
    let r = client().get(format!("{base}{path}")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "GET {path}");
    r.json().await.unwrap()
}

/// Everything the API shows of the spool that a restart must keep: per
/// queue its settings, pause, signing secrets, messages and history;
/// and the event catalogue.
async fn snapshot(base: &str) -> Value {
    let mut all = serde_json::Map::new();
    for queue in get(base, "/v1/queues").await["queues"].as_array().unwrap() {
        let name = queue["name"].as_str().unwrap();
        let settings = &queue["settings"];
        let history = if settings["historyRetentionSeconds"].as_f64() > Some(0.0) {
            get(base, &format!("/v1/queues/{name}/history?limit=100")).await["messages"].clone()
        } else {
            Value::Null
        };
        let stats = &queue["stats"];
        let view = json!({
            "settings": settings,
            "paused": stats["paused"],
            "signingSecrets": stats["signingSecrets"],
            "previousSecretExpiresAt": stats["previousSecretExpiresAt"],
            "messages": messages_in(&client(), base, name).await,
            "history": history,
        });
        all.insert(name.to_owned(), view);
    }
    all.insert("eventTypes".into(), get(base, "/v1/event-types").await);
    Value::Object(all)
}

/// A message as one line: engine id, state, body (an operational
/// event's: the queue it names), then whichever of its key, event,
/// tenant, resend, failure, status and retries are set.
fn line(m: &Value) -> String {
    let text = |field: &str| m[field].as_str().map(str::to_owned);
    let mut out = format!(
        "{} {}",
        engine_id(&text("id").unwrap()),
        text("state").unwrap()
    );
    let event_type = text("eventType");
    match event_type.as_deref() {
        Some(t) if t.starts_with("spoold.") => {
            let body: Value = serde_json::from_str(&text("body").unwrap()).unwrap();
            out += &format!(" about {}", body["queue"].as_str().unwrap());
        }
        _ => out += &format!(" {}", text("body").unwrap()),
    }
    let extras = [
        ("key", text("orderingKey")),
        ("event", text("eventId").map(|e| engine_id(&e).to_string())),
        ("type", event_type),
        ("tenant", text("tenant")),
        (
            "resent",
            text("resentFrom").map(|r| engine_id(&r).to_string()),
        ),
        ("reason", text("reason")),
        ("status", m["lastStatus"].as_u64().map(|s| s.to_string())),
        (
            "retries",
            m["retryCount"]
                .as_u64()
                .filter(|&n| n > 0)
                .map(|n| n.to_string()),
        ),
    ];
    for (name, value) in extras {
        if let Some(value) = value {
            out += &format!(" {name}={value}");
        }
    }
    out
}

fn lines(snap: &Value, queue: &str, list: &str) -> Vec<String> {
    let messages = snap[queue][list].as_array();
    let messages = messages.unwrap_or_else(|| panic!("{queue} has {list}"));
    messages.iter().map(line).collect()
}

/// The settings of `queue` include every field of `expected`.
fn assert_settings(snap: &Value, queue: &str, expected: Value) {
    for (field, value) in expected.as_object().unwrap() {
        assert_eq!(&snap[queue]["settings"][field], value, "{queue}.{field}");
    }
}

/// The queues of the fixture and what their settings hold at level 5.
fn check_queues(snap: &Value) {
    let names: Vec<String> = snap.as_object().unwrap().keys().cloned().collect();
    let mut expected = vec!["eventTypes".to_owned()];
    for queue in [
        "audit", "churn", "flaky", "hooks", "jobs", "ops", "orders", "receipts",
    ] {
        expected.extend([queue.to_owned(), format!("{queue}.failed")]);
    }
    expected.sort();
    assert_eq!(names, expected);
    assert_settings(
        snap,
        "orders",
        json!({"events": ["order.>"], "filter": {"payload": {"region": ["eu"]}},
               "ordering": "per_key", "orderingOnFailure": "hold", "maxRetries": 0,
               "dedupWindowSeconds": 3600.0, "historyRetentionSeconds": 86400.0,
               "leaseTimeoutSeconds": 45.0}),
    );
    assert_settings(
        snap,
        "audit",
        json!({"events": ["order.>"], "ordering": "none"}),
    );
    assert_settings(snap, "ops", json!({"events": ["spoold.>"]}));
    assert_settings(snap, "jobs", json!({"maxRetries": 0}));
    assert_settings(snap, "receipts", json!({"historyRetentionSeconds": 1.0}));
    assert_settings(
        snap,
        "hooks",
        json!({"events": ["order.paid"], "tenant": "cus_42", "signingSecretSet": true,
               "historyRetentionSeconds": 86400.0}),
    );
    // The first secret signs beside the second for 30 days.
    assert_eq!(snap["hooks"]["signingSecrets"], 2);
    assert_eq!(
        snap["hooks"]["previousSecretExpiresAt"],
        "2027-01-05T18:47:16.130Z"
    );
    assert_eq!(snap["hooks"]["paused"], false);
    assert_settings(
        snap,
        "flaky",
        json!({"maxRetries": 3, "backoff": {"initialSeconds": 3600.0, "multiplier": 2.0,
               "maxSeconds": 7200.0, "jitter": 0.0}}),
    );
    // Its rotated-out secret's one second ended (a secret-expire record).
    assert_eq!(snap["flaky"]["signingSecrets"], 1);
    assert_eq!(snap["flaky"]["previousSecretExpiresAt"], Value::Null);
    assert_eq!(snap["flaky"]["paused"], true);
}

/// The messages of the fixture (`tests/data/README.md`).
fn check_messages(snap: &Value) {
    let n3 = r#"{"n":3,"region":"eu"}"#;
    assert_eq!(
        lines(snap, "orders", "messages"),
        [
            "2 held cust-2 second key=cust-2".to_owned(),
            format!("13 visible {n3} key=cust-1 event=10 type=order.paid tenant=cus_42"),
            r#"14 visible {"n":1,"region":"eu"} event=5 type=order.created resent=7"#.into(),
            "15 visible traced".into(),
            "16 delayed delayed".into(),
            r#"178 visible {"n":4,"region":"eu"} key=cust-3 event=176 type=order.created"#.into(),
            "179 held cust-1 after key=cust-1".into(),
        ]
    );
    assert_eq!(
        lines(snap, "orders.failed", "messages"),
        ["1 visible cust-2 first key=cust-2 reason=retries_exhausted"]
    );
    assert_eq!(
        lines(snap, "audit", "messages"),
        [
            r#"6 visible {"n":1,"region":"eu"} key=cust-1 event=5 type=order.created"#.to_owned(),
            r#"9 visible {"n":2,"region":"us"} event=8 type=order.created"#.into(),
            format!("11 visible {n3} key=cust-1 event=10 type=order.paid tenant=cus_42"),
            r#"177 visible {"n":4,"region":"eu"} key=cust-3 event=176 type=order.created"#.into(),
        ]
    );
    assert_eq!(
        lines(snap, "ops", "messages"),
        [
            "4 visible about orders event=3 type=spoold.message.failed",
            "23 visible about jobs event=22 type=spoold.message.failed",
            "25 visible about jobs event=24 type=spoold.message.failed",
            "182 visible about flaky event=181 type=spoold.endpoint.secret_expiring",
        ]
    );
    assert_eq!(
        lines(snap, "flaky", "messages"),
        ["17 delayed attempted status=500 retries=1"]
    );
    assert_eq!(
        lines(snap, "jobs", "messages"),
        ["19 visible job 2", "21 visible job 4"]
    );
    assert_eq!(
        lines(snap, "jobs.failed", "messages"),
        ["18 visible job 1 reason=retries_exhausted"]
    );
    for empty in ["churn", "hooks", "receipts"] {
        assert_eq!(
            lines(snap, empty, "messages"),
            Vec::<String>::new(),
            "{empty}"
        );
    }
}

/// The histories and the catalogue of the fixture.
fn check_history_and_catalogue(snap: &Value) {
    let n3 = r#"{"n":3,"region":"eu"}"#;
    assert_eq!(
        lines(snap, "orders", "history"),
        [r#"7 delivered {"n":1,"region":"eu"} key=cust-1 event=5 type=order.created"#]
    );
    assert_eq!(
        lines(snap, "hooks", "history"),
        [format!(
            "12 delivered {n3} key=cust-1 event=10 type=order.paid tenant=cus_42 status=200"
        )]
    );
    assert_eq!(lines(snap, "receipts", "history"), Vec::<String>::new());
    let types = &snap["eventTypes"]["eventTypes"];
    let names: Vec<&str> = types
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["order.created", "order.paid", "order.shipped"]);
    assert_eq!(types[0]["schema"]["required"], json!(["region"]));
    assert_eq!(types[2]["example"], json!({"region": "eu"}));
}

async fn publish(base: &str, event: Value, key: Option<&str>) -> (StatusCode, Value) {
    let mut request = client().post(format!("{base}/v1/events")).json(&event);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let r = request.send().await.unwrap();
    (r.status(), r.json().await.unwrap_or(Value::Null))
}

/// The queues and ids of an event's deliveries, as engine ids.
fn deliveries(answer: &Value) -> Vec<(String, u64)> {
    let all = answer["deliveries"].as_array().unwrap();
    all.iter()
        .map(|d| {
            (
                d["queue"].as_str().unwrap().to_owned(),
                engine_id(d["id"].as_str().unwrap()),
            )
        })
        .collect()
}

/// Publishes through what the fixture remembers: its event key (with
/// its fingerprint), its catalogue's schema, its content filter and its
/// ordering keys. The new event's id.
async fn publish_through_the_fixture(base: &str) -> u64 {
    let first = json!({"type": "order.created", "payload": {"region": "eu", "n": 1},
                       "orderingKey": "cust-1"});
    let (status, answer) = publish(base, first, Some("evt-1")).await;
    assert_eq!(status, StatusCode::OK, "a repeat of evt-1: {answer}");
    assert_eq!(answer["id"], id(5));
    assert_eq!(
        deliveries(&answer),
        [("audit".into(), 6), ("orders".into(), 7)]
    );
    let other = json!({"type": "order.created", "payload": {"region": "eu", "n": 9}});
    let (status, answer) = publish(base, other, Some("evt-1")).await;
    assert!(
        status.is_client_error(),
        "evt-1 reused for another event: {answer}"
    );
    let mismatched = json!({"type": "order.created", "payload": {"region": 5}});
    let (status, answer) = publish(base, mismatched, None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(answer["kind"], "schema_mismatch");
    let filtered = json!({"type": "order.created", "payload": {"region": "us", "n": 6}});
    let (status, answer) = publish(base, filtered, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["matchedByType"], 2, "the filter kept orders out");
    assert_eq!(deliveries(&answer).len(), 1);
    let keyed = json!({"type": "order.created", "payload": {"region": "eu", "n": 7},
                       "orderingKey": "cust-3"});
    let (status, answer) = publish(base, keyed, Some("evt-3")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    let orders: Vec<u64> = deliveries(&answer)
        .into_iter()
        .filter_map(|(queue, id)| (queue == "orders").then_some(id))
        .collect();
    assert_eq!(orders.len(), 1);
    orders[0]
}

/// Writes to the fixture through the API: events, a repeat of its dedup
/// key, a delivery into its history (which lets `cust-1`'s next message
/// go), a catalogue entry, then churn that compaction collects.
async fn write(base: &str) -> u64 {
    let keyed = publish_through_the_fixture(base).await;
    let http = client();
    let r = http
        .post(format!("{base}/v1/queues/orders/messages"))
        .header("idempotency-key", "key-1")
        .body("delayed again")
        .send()
        .await
        .unwrap();
    assert!(
        r.headers().contains_key("spooler-deduplicated"),
        "key-1 is remembered"
    );
    assert_eq!(r.json::<Value>().await.unwrap()["id"], id(16));
    let api = crate::common::api::Api::new(base.to_owned(), None);
    let r = api.receive("orders", "").await;
    assert_eq!(r.headers()["spooler-message-id"].to_str().unwrap(), id(13));
    let token = r.headers()["spooler-lease-token"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        api.settle("orders", &token, "ack")
            .await
            .status()
            .is_success()
    );
    let r = http
        .put(format!("{base}/v1/event-types/order.refunded"))
        .json(&json!({"description": "An order was refunded"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    for _ in 0..40 {
        assert_eq!(
            api.send("churn", &"c".repeat(1024)).await.status(),
            StatusCode::CREATED
        );
    }
    let r = api.call(Method::DELETE, "/v1/queues/churn/messages").await;
    assert!(r.status().is_success(), "{}", r.status());
    keyed
}

/// What the writes left: `cust-1`'s next message out of its hold, the
/// acked one in the history, the new keyed event held behind `cust-3`'s.
fn check_written(snap: &Value, keyed: u64) {
    let orders = lines(snap, "orders", "messages");
    assert!(
        orders.contains(&"179 visible cust-1 after key=cust-1".to_owned()),
        "{orders:?}"
    );
    let held = format!(
        r#"{keyed} held {{"n":7,"region":"eu"}} key=cust-3 event={} type=order.created"#,
        keyed - 2
    );
    assert!(orders.contains(&held), "{orders:?}");
    let history: Vec<u64> = snap["orders"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| engine_id(m["id"].as_str().unwrap()))
        .collect();
    assert_eq!(history, [13, 7]);
    assert_eq!(
        snap["eventTypes"]["eventTypes"][2]["name"],
        "order.refunded"
    );
    assert_eq!(lines(snap, "churn", "messages"), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn level_5_fixture_is_read_written_compacted_and_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    copy_fixture("v2-level5", &spool);
    let clock = dir.path().join("clock");
    write_clock(&clock);
    let mut spoold = start(dir.path(), &clock).await;
    let base = spoold.base.clone();
    let read = snapshot(&base).await;
    check_queues(&read);
    check_messages(&read);
    check_history_and_catalogue(&read);

    let keyed = write(&base).await;
    wait_until(
        "compaction to replace the fixture's checkpoint and segment",
        async || !spool.join(CHECKPOINT).exists() && !spool.join(SEGMENT).exists(),
    )
    .await;
    assert!(newest_checkpoint(&spool) > Some(CHECKPOINT.to_owned()));
    let written = snapshot(&base).await;
    check_written(&written, keyed);
    assert_eq!(spoold.stop(), 0);

    let verify = run_in(
        dir.path(),
        &["journal", "verify", "--dir", spool.to_str().unwrap()],
    );
    assert_eq!(verify.code, 0, "{}{}", verify.stdout, verify.stderr);
    let mut spoold = start(dir.path(), &clock).await;
    assert_eq!(
        snapshot(&spoold.base).await,
        written,
        "a restart changed what is shown"
    );
    assert_eq!(spoold.stop(), 0);
}
