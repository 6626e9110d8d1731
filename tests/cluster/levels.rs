//! Replicas of two builds side by side (issue 38, "Formats"): a build
//! writes records and checkpoint chunks an older one cannot read (event
//! key fingerprints, chunk 72), so replicas of different levels refuse
//! each other's requests and answers and act as two sides of a partition.
//! Here replica 3 runs as the level before this build's
//! (`SPOOLD_TEST_READS_LEVEL`, the `testing` feature): the two of this
//! level elect a primary and take writes, replica 3 is sent nothing and
//! says why, and once it runs this level it catches up and holds the same
//! state.
//!
//! With `SPOOLD_BEFORE_BIN` set to a build before levels (which ignores
//! the header), replica 3 runs that build instead: the others must hear
//! its level before they send it a record, so it is sent none. Its figures
//! are in `docs/reliability.md`; CI has no older binary.

use std::time::Duration;

use reqwest::Method;

use crate::common;
use crate::common::cluster::TestCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_of_another_level_are_kept_apart_until_upgraded() {
    let mut cluster = TestCluster::new(3, "", "[queues.jobs]\n");
    cluster.start(0);
    cluster.start(1);
    let before = std::env::var_os("SPOOLD_BEFORE_BIN").map(std::path::PathBuf::from);
    match &before {
        Some(binary) => cluster.start_bin(2, binary, &[]),
        None => cluster.start_with_env(2, &[("SPOOLD_TEST_READS_LEVEL", "2")]),
    }
    let primary = cluster.primary(Duration::from_secs(30)).await;
    assert_ne!(primary, 2, "the replica of another level cannot lead");
    let api = common::api::Api::new(cluster.replicas[primary].base(), None);
    let publish = async |n: usize| {
        let r = api
            .req(Method::POST, "/v1/events")
            .header("Idempotency-Key", format!("k{n}"))
            .json(&serde_json::json!({"type": "t.x", "payload": {"n": n}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    };
    for n in 0..5 {
        publish(n).await;
        let sent = api
            .req(Method::POST, "/v1/queues/jobs/messages")
            .body(format!("m{n}"))
            .send()
            .await
            .unwrap();
        assert_eq!(sent.status(), 201);
    }
    // Who says why: the replica of another level, or (a build before
    // levels knows nothing of them) the primary.
    let (says, why) = match before {
        Some(_) => (primary, "a build before levels"),
        None => (2, "replicas of different levels"),
    };
    let log = cluster.replicas[says]
        .process
        .as_ref()
        .unwrap()
        .log_with(why)
        .await;
    assert!(log.contains("level"), "{log}");
    cluster.same_state(&[0, 1], Duration::from_secs(30)).await;
    // Sent no record: it applied none of the ten writes.
    let (odd_applied, odd_digest) = cluster.digest(2).await.unwrap();
    let (applied, digest) = cluster.digest(0).await.unwrap();
    assert_ne!(
        odd_digest, digest,
        "the replica of another level was sent records"
    );
    assert!(
        odd_applied + 10 <= applied,
        "the replica of another level applied {odd_applied} of {applied}"
    );

    // Upgraded: it rejoins and catches up.
    cluster.kill(2);
    cluster.start(2);
    cluster
        .same_state(&[0, 1, 2], Duration::from_secs(60))
        .await;
}
