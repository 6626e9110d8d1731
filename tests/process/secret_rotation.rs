//! Signing-secret rotation against the binary (docs/contract.md §5,
//! "Secret rotation"): a rotation returns the new secret once, both
//! secrets sign each delivery through the overlap (each signature checked
//! as a Standard Webhooks receiver checks it), stats and `/metrics` say
//! how many sign and until when, the journaled timer drops the old one
//! when the overlap ends (and a `kill -9` changes none of it), and the
//! refusals name what is wrong.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::process::{cli, client, put, queue_json, start_config};
use crate::common::sink::{Seen, Sink};
use crate::common::{eventually, signed_by};

const FIRST: &str = "whsec_Zmlyc3Qtc2VjcmV0LWtleS1ieXRlcw==";

async fn rotate(base: &str, queue: &str, body: Option<Value>) -> (StatusCode, Value) {
    let mut request = client().post(format!("{base}/v1/queues/{queue}/secret/rotate"));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let r = request.send().await.unwrap();
    (r.status(), r.json().await.unwrap_or(Value::Null))
}

async fn send(base: &str, queue: &str, body: &str) {
    let r = client()
        .post(format!("{base}/v1/queues/{queue}/messages"))
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_secrets_sign_through_the_overlap_and_the_old_one_goes_when_it_ends() {
    let (sink, sink_url) = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut spoold = start_config(dir.path(), "", "", "").await;
    let http = client();
    let (status, answer) = put(
        &http,
        &spoold.base,
        "hooks",
        &json!({"destination": sink_url, "signingSecret": FIRST}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");

    // A rotation with no body: a new secret, the first signing a day more.
    let (status, rotated) = rotate(&spoold.base, "hooks", None).await;
    assert_eq!(status, StatusCode::OK, "{rotated}");
    let second = rotated["secret"].as_str().unwrap().to_owned();
    assert!(second.starts_with("whsec_") && second != FIRST, "{rotated}");
    assert_eq!(rotated["signingSecrets"], 2, "{rotated}");
    let q = queue_json(&http, &spoold.base, "hooks").await;
    assert_eq!(q["stats"]["signingSecrets"], 2, "{q}");
    assert_eq!(
        q["stats"]["previousSecretExpiresAt"], rotated["previousExpiresAt"],
        "{q}"
    );
    assert!(!q.to_string().contains(&second), "shown once: {q}");
    let metrics = spoold.api().text("/metrics").await;
    assert!(
        metrics.contains("spoold_queue_signing_secrets{queue=\"hooks\"} 2"),
        "{metrics}"
    );
    send(&spoold.base, "hooks", "one").await;
    let seen = sink.wait_for(1).await;
    assert_eq!(signed_by(&seen[0], &[FIRST, &second]), [0, 1]);

    // kill -9 inside the overlap: both still sign.
    spoold.signal("-KILL");
    spoold.wait_exit();
    let mut spoold = start_config(dir.path(), "", "", "").await;
    send(&spoold.base, "hooks", "two").await;
    let seen = sink.wait_for(2).await;
    assert_eq!(signed_by(&seen[1], &[FIRST, &second]), [0, 1]);

    // Rotated again to a given secret with a short overlap: the first
    // goes at once (at most two sign), the second when the overlap ends.
    let third = "whsec_dGhpcmQtc2VjcmV0LWtleS1ieXRlcw==";
    let (status, rotated) = rotate(
        &spoold.base,
        "hooks",
        Some(json!({"secret": third, "overlapSeconds": 1})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{rotated}");
    assert_eq!(rotated["secret"], third);
    send(&spoold.base, "hooks", "three").await;
    let seen = sink.wait_for(3).await;
    assert_eq!(signed_by(&seen[2], &[FIRST, &second, third]), [1, 2]);
    let base = spoold.base.clone();
    eventually(
        "the old secret dropped",
        Duration::from_secs(10),
        async || {
            let q = queue_json(&client(), &base, "hooks").await;
            (q["stats"]["signingSecrets"] == 1 && q["stats"]["previousSecretExpiresAt"].is_null())
                .then_some(())
        },
    )
    .await;
    // The timer journaled its end: a restart reads it so.
    spoold.signal("-KILL");
    spoold.wait_exit();
    let spoold = start_config(dir.path(), "", "", "").await;
    let q = queue_json(&http, &spoold.base, "hooks").await;
    assert_eq!(q["stats"]["signingSecrets"], 1, "{q}");
    let metrics = spoold.api().text("/metrics").await;
    assert!(
        metrics
            .contains("spoold_queue_previous_secret_expiry_timestamp_seconds{queue=\"hooks\"} 0"),
        "{metrics}"
    );
    send(&spoold.base, "hooks", "four").await;
    let seen = sink.wait_for(4).await;
    assert_eq!(signed_by(&seen[3], &[FIRST, &second, third]), [2]);

    // The CLI prints the new secret first; overlap 0 drops the old at once.
    let rotated = cli(
        &spoold.base,
        &["queue", "rotate-secret", "hooks", "--overlap", "0s"],
    )
    .await;
    assert_eq!(rotated.code, 0, "{}", rotated.stderr);
    let fourth = rotated.stdout.lines().next().unwrap().to_owned();
    assert!(fourth.starts_with("whsec_"), "{}", rotated.stdout);
    send(&spoold.base, "hooks", "five").await;
    let seen = sink.wait_for(5).await;
    assert_eq!(signed_by(&seen[4], &[third, &fourth]), [1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_is_refused_where_it_cannot_apply() {
    let tables = "[queues.filed]\ndestination = \"http://127.0.0.1:9/\"\n\
                  signing_secret = \"whsec_ZXhhbXBsZS1zZWNyZXQtb25seQ==\"\n";
    let dir = tempfile::tempdir().unwrap();
    let spoold = start_config(dir.path(), "", "", tables).await;
    let base = &spoold.base;
    let (status, answer) = rotate(base, "filed", None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert_eq!(answer["kind"], "queue_managed_by_config", "{answer}");
    let (status, answer) = put(&client(), base, "pulled", &json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let (status, answer) = rotate(base, "pulled", None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert_eq!(answer["kind"], "not_push_queue", "{answer}");
    let (status, answer) = rotate(base, "nowhere", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    let (status, answer) = put(
        &client(),
        base,
        "api",
        &json!({"destination": "http://127.0.0.1:9/"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    for (body, names) in [
        (json!({"secret": "plain"}), "signingSecret"),
        (json!({"overlapSeconds": -1}), "overlapSeconds"),
        (json!({"overlapSeconds": 1e9}), "overlapSeconds"),
        (json!({"secrets": "x"}), "unknown field"),
    ] {
        let (status, answer) = rotate(base, "api", Some(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert!(
            answer["message"].as_str().unwrap().contains(names),
            "{answer}"
        );
    }
    // Refused, the queue stays unsigned; a first rotation signs with one.
    let q = queue_json(&client(), base, "api").await;
    assert_eq!(q["stats"]["unsigned"], true, "{q}");
    let (status, answer) = rotate(base, "api", None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["signingSecrets"], 1, "{answer}");
    assert!(answer.get("previousExpiresAt").is_none(), "{answer}");
}

/// The official verifier's verdicts (`standardwebhooks` from PyPI, run by
/// tests/data/standard_webhooks_verify.py): per delivery, per secret.
fn official_verdicts(deliveries: &[(&Seen, &[&str])]) -> Vec<Vec<bool>> {
    use std::io::Write;
    let input: Vec<Value> = deliveries
        .iter()
        .map(|(seen, secrets)| {
            let headers: serde_json::Map<String, Value> = ["webhook-id", "webhook-timestamp", "webhook-signature"]
                .iter()
                .map(|h| (h.to_string(), json!(seen.headers[*h].to_str().unwrap())))
                .collect();
            json!({"body": String::from_utf8_lossy(&seen.body), "headers": headers, "secrets": secrets})
        })
        .collect();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/standard_webhooks_verify.py"
    );
    let mut child = std::process::Command::new("python3")
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(Value::Array(input).to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs python3 with standardwebhooks from PyPI (.ci/run installs it)"]
async fn the_official_verifier_takes_both_secrets_through_the_overlap_then_only_the_new_one() {
    let (sink, sink_url) = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let spoold = start_config(dir.path(), "", "", "").await;
    let base = spoold.base.clone();
    let (status, answer) = put(
        &client(),
        &base,
        "hooks",
        &json!({"destination": sink_url, "signingSecret": FIRST}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let (status, rotated) = rotate(&base, "hooks", Some(json!({"overlapSeconds": 2}))).await;
    assert_eq!(status, StatusCode::OK, "{rotated}");
    let second = rotated["secret"].as_str().unwrap().to_owned();
    send(&base, "hooks", r#"{"during": "the overlap"}"#).await;
    sink.wait_for(1).await;
    eventually("the overlap's end", Duration::from_secs(10), async || {
        let q = queue_json(&client(), &base, "hooks").await;
        (q["stats"]["signingSecrets"] == 1).then_some(())
    })
    .await;
    send(&base, "hooks", r#"{"after": "the overlap"}"#).await;
    let seen = sink.wait_for(2).await;
    let secrets = [FIRST, second.as_str()];
    let verdicts = official_verdicts(&[(&seen[0], &secrets), (&seen[1], &secrets)]);
    assert_eq!(
        verdicts,
        [[true, true], [false, true]],
        "during the overlap either secret verifies; after it only the new one"
    );
}
