//! Content filters on subscriptions against the binary (docs/contract.md
//! §4 "Content filters"): a queue keeps only the events its filter passes,
//! by payload and by the headers the event was published with; the answer
//! says how many queues the type matched; a filter survives `kill -9` and
//! restart (API-set) and is refused, naming its part, over the API and in
//! a config file (with its line).

use crate::common::process::{client, put, queue_json, run_in, start_config};
use reqwest::StatusCode;
use serde_json::{Value, json};

const TABLES: &str = r#"
[queues.big-orders]
events = ["order.*"]
filter = { payload = { amount = [{ numeric = [">=", 1000] }], "$or" = [{ region = [{ prefix = "eu-" }] }, { vip = [true] }] } }
[queues.all-orders]
events = ["order.*"]
"#;

/// Publishes `event` with `headers`: the answer.
async fn publish(base: &str, event: &Value, headers: &[(&str, &str)]) -> Value {
    let mut request = client().post(format!("{base}/v1/events")).json(event);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let r = request.send().await.unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    r.json().await.unwrap()
}

/// The queues an answer delivered to, and how many the type matched.
fn delivered(answer: &Value) -> (Vec<String>, u64) {
    let queues = answer["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["queue"].as_str().unwrap().to_owned())
        .collect();
    (queues, answer["matchedByType"].as_u64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_keeps_only_the_events_it_passes_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut spoold = start_config(dir.path(), "", "", TABLES).await;
    let base = spoold.base.clone();
    let http = client();

    // An endpoint created over the API, filtering on a header.
    let (status, answer) = put(
        &http,
        &base,
        "from-checkout",
        &json!({"events": ["order.>"], "filter": {"headers": {"x-source": ["checkout"]}}}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");

    let cases = [
        (
            json!({"amount": 1500, "region": "eu-west-1"}),
            None,
            vec!["all-orders", "big-orders"],
        ),
        (
            json!({"amount": 1500, "region": "us-east-1"}),
            None,
            vec!["all-orders"],
        ),
        (
            json!({"amount": 1500, "region": "us-east-1", "vip": true}),
            None,
            vec!["all-orders", "big-orders"],
        ),
        (
            json!({"amount": 999.5, "region": "eu-west-1"}),
            Some("checkout"),
            vec!["all-orders", "from-checkout"],
        ),
        (
            json!({"region": "eu-west-1"}),
            Some("billing"),
            vec!["all-orders"],
        ),
        (
            json!(["not", "an", "object"]),
            Some("checkout"),
            vec!["all-orders", "from-checkout"],
        ),
    ];
    let mut expected_in: std::collections::BTreeMap<&str, usize> = Default::default();
    for (payload, source, queues) in &cases {
        let headers: Vec<(&str, &str)> = source.iter().map(|s| ("X-Source", *s)).collect();
        let answer = publish(
            &base,
            &json!({"type": "order.created", "payload": payload}),
            &headers,
        )
        .await;
        let (got, matched) = delivered(&answer);
        assert_eq!(&got, queues, "payload {payload}, source {source:?}");
        assert_eq!(matched, 3, "every queue's patterns take order.created");
        for q in queues {
            *expected_in.entry(q).or_default() += 1;
        }
    }

    // The API-set filter and every delivery outlive kill -9.
    spoold.signal("-KILL");
    spoold.wait_exit();
    let spoold = start_config(dir.path(), "", "", TABLES).await;
    let base = spoold.base.clone();
    let q = queue_json(&http, &base, "from-checkout").await;
    assert_eq!(
        q["settings"]["filter"],
        json!({"headers": {"x-source": ["checkout"]}}),
        "{q}"
    );
    for (queue, n) in expected_in {
        let messages = crate::common::process::messages_in(&http, &base, queue).await;
        assert_eq!(messages.len(), n, "{queue}");
    }
    // The filter goes on filtering after the restart.
    let answer = publish(
        &base,
        &json!({"type": "order.paid", "payload": {}}),
        &[("x-source", "billing")],
    )
    .await;
    assert_eq!(delivered(&answer).0, vec!["all-orders"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_filter_is_refused_naming_its_part_over_the_api_and_in_a_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let spoold = start_config(dir.path(), "", "", "").await;
    let http = client();
    for (filter, names) in [
        (
            json!({"payload": {"amount": [{"numeric": [">", "x"]}]}}),
            "filter.payload.amount[0].numeric",
        ),
        (
            json!({"payload": {"a": [{"regex": "."}]}}),
            "unknown operator \"regex\"",
        ),
        (json!({"body": {"a": [1]}}), "filter.body"),
    ] {
        let (status, answer) = put(
            &http,
            &spoold.base,
            "q",
            &json!({"events": ["a.b"], "filter": filter}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert!(
            answer["message"].as_str().unwrap().contains(names),
            "{answer}"
        );
    }
    let (status, answer) = put(
        &http,
        &spoold.base,
        "q",
        &json!({"filter": {"payload": {"a": [1]}}}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        answer.to_string().contains("subscribes to events"),
        "{answer}"
    );

    std::fs::write(
        dir.path().join("bad.toml"),
        "[spool]\ndir = \"x\"\n\n[queues.q]\nevents = [\"a.b\"]\nfilter = { payload = { a = [{ numeric = [\"~\", 1] }] } }\n",
    )
    .unwrap();
    let bad = run_in(dir.path(), &["check-config", "--config", "bad.toml"]);
    assert_eq!(bad.code, 1, "{}", bad.stderr);
    assert!(bad.stderr.contains("line 6"), "{}", bad.stderr);
    assert!(
        bad.stderr.contains("filter.payload.a[0].numeric"),
        "{}",
        bad.stderr
    );
}
