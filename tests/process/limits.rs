//! Every limit has one owner (issue 38): each finding of the review,
//! reproduced against the binary. Each test failed on the build before
//! its fix (`SPOOLD_TEST_BIN` names an older binary to show it); large
//! bounds are scaled down under the `testing` feature where the issue
//! allows it, and the full-size runs are in `docs/reliability.md`.

use std::time::Duration;

use reqwest::Method;
use sha2::{Digest, Sha256};

use crate::common;
use crate::common::process::Spoold;

/// Finding 1: the largest body `server.max_body_bytes` may allow (a record
/// with it still fits the journal's record bound) is acknowledged, and is
/// there byte for byte after `kill -9` and a restart. (A bound past the
/// record's is refused by `check-config` and `run`:
/// `config_parity.rs`.)
#[tokio::test]
async fn the_largest_body_allowed_survives_kill_9() {
    const LARGEST: usize = 240 << 20;
    let dir = tempfile::tempdir().unwrap();
    let start = || common::process::start_with(dir.path(), "max_body_bytes = \"240MiB\"", "");
    let mut spoold: Spoold = start().await;
    let api = spoold.api();
    assert_eq!(
        api.put_queue("big", serde_json::json!({})).await.status(),
        201
    );
    let body: Vec<u8> = (0..LARGEST).map(|i| (i % 251) as u8).collect();
    let digest = Sha256::digest(&body);
    let sent = api
        .req(Method::POST, "/v1/queues/big/messages")
        .header("Content-Type", "application/octet-stream")
        .body(body)
        .timeout(Duration::from_secs(120))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 201, "{}", sent.text().await.unwrap());
    // One byte more is refused on its Content-Length, before any of it is
    // read.
    let head = format!(
        "POST /v1/queues/big/messages HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n\r\n",
        api.addr(),
        LARGEST + 1
    );
    let answer = common::raw::exchange(api.addr(), head.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
    spoold.child.kill().unwrap();
    spoold.wait_exit();

    let spoold = start().await;
    let got = spoold
        .api()
        .req(Method::POST, "/v1/queues/big/receive")
        .timeout(Duration::from_secs(120))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    let bytes = got.bytes().await.unwrap();
    assert_eq!(bytes.len(), LARGEST);
    assert_eq!(Sha256::digest(&bytes), digest);
    let stats = spoold.api().get_json("/v1/queues/big").await;
    assert_eq!(stats["stats"]["visible"], 0, "{stats}");
    assert_eq!(stats["stats"]["leased"], 1, "{stats}");
}
