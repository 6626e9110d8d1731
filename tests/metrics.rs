//! `/metrics` of the real binary (its own process, so its registry holds
//! only its own numbers): every name of spec §8 with HELP text, values that
//! follow what happened, and `promtool check metrics` on the scrape.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::process::start_with;
use common::sink::Sink;
use reqwest::Client;

const NAMES: &[&str] = &[
    "spoold_messages_sent_total",
    "spoold_messages_acked_total",
    "spoold_messages_retried_total",
    "spoold_messages_failed_total",
    "spoold_messages_expired_total",
    "spoold_messages_deduplicated_total",
    "spoold_queue_messages",
    "spoold_queue_oldest_message_age_seconds",
    "spoold_deliveries_total",
    "spoold_delivery_duration_seconds",
    "spoold_queue_paused",
    "spoold_journal_fsync_duration_seconds",
    "spoold_journal_bytes",
    "spoold_journal_max_bytes",
    "spoold_http_requests_total",
];

/// The value of the first sample line starting with `series`.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_cover_the_spec_and_pass_promtool() {
    let (_sink, sink_url) = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let tables = format!(
        "[queues.orders]\nmax_retries = 0\n[queues.hooks]\ndestination = \"{sink_url}/in\"\n"
    );
    let spoold = start_with(dir.path(), "", &tables).await;
    spoold::delivery::client::install_crypto_provider();
    let client = Client::new();
    let base = &spoold.base;
    for i in 0..3 {
        client
            .post(format!("{base}/v1/queues/orders/messages"))
            .body(format!("o{i}"))
            .send()
            .await
            .unwrap();
    }
    let r = client
        .post(format!("{base}/v1/queues/orders/receive"))
        .send()
        .await
        .unwrap();
    let token = r.headers()["spooler-lease-token"]
        .to_str()
        .unwrap()
        .to_string();
    client
        .post(format!("{base}/v1/queues/orders/leases/{token}/ack"))
        .send()
        .await
        .unwrap();
    let r = client
        .post(format!("{base}/v1/queues/orders/receive"))
        .send()
        .await
        .unwrap();
    let token = r.headers()["spooler-lease-token"]
        .to_str()
        .unwrap()
        .to_string();
    client
        .post(format!("{base}/v1/queues/orders/leases/{token}/nack"))
        .send()
        .await
        .unwrap();
    client
        .post(format!("{base}/v1/forward/hooks/x"))
        .body("push")
        .send()
        .await
        .unwrap();

    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = client
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if text.contains("spoold_deliveries_total{queue=\"hooks\",outcome=\"success\"} 1") {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the push delivery never showed up:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for name in NAMES {
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "no HELP for {name}:\n{text}"
        );
    }
    assert_eq!(
        value(&text, "spoold_messages_sent_total{queue=\"orders\"}"),
        Some(3.0)
    );
    assert_eq!(
        value(&text, "spoold_messages_acked_total{queue=\"orders\"}"),
        Some(1.0)
    );
    assert_eq!(
        value(&text, "spoold_messages_failed_total{queue=\"orders\"}"),
        Some(1.0),
        "max_retries = 0"
    );
    assert_eq!(
        value(
            &text,
            "spoold_queue_messages{queue=\"orders\",state=\"visible\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            "spoold_queue_messages{queue=\"orders.failed\",state=\"visible\"}"
        ),
        Some(1.0)
    );
    // Each request counted once, by its route template.
    assert_eq!(
        value(
            &text,
            "spoold_http_requests_total{route=\"/v1/queues/{q}/messages\",status=\"201\"}"
        ),
        Some(3.0)
    );
    assert_eq!(
        value(
            &text,
            "spoold_http_requests_total{route=\"/v1/queues/{q}/leases/{token}/ack\",status=\"204\"}"
        ),
        Some(1.0)
    );
    assert!(value(&text, "spoold_journal_fsync_duration_seconds_count").unwrap() > 0.0);
    assert!(
        text.contains("spoold_journal_fsync_duration_seconds_bucket{le=\"0.00005\"}"),
        "fsync buckets"
    );

    let promtool = which_promtool();
    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// promtool must be there (`.ci/run` installs Debian's `prometheus`); a
/// missing tool fails the test rather than skipping the check.
fn which_promtool() -> &'static str {
    let found = Command::new("promtool").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "promtool not found: install Debian's prometheus package (see .ci/run)"
    );
    "promtool"
}
