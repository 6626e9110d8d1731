//! A real full file system: the spool on a 6 MiB tmpfs (mounted here; the
//! tests run as root, as `.ci/run` does), `max_bytes` far above it, so
//! that the kernel's ENOSPC, not spoold's `SpoolFull`, stops the sends.
//! Nothing half-written is acknowledged; after the disk grows, every 201
//! is there.

use crate::common::mount::Mount;
use crate::common::process::{ids_in, start_with};
use reqwest::Client;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, to mount a tmpfs (.ci/run runs as root)"]
async fn a_full_file_system_refuses_sends_without_losing_acknowledged_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mount = Mount::tmpfs(dir.path(), "6m");
    spoold::testing::install_crypto_provider();
    let client = Client::new();
    // spool.dir is dir/spool and the config file sits on the tmpfs too.
    let mut spoold = start_with(dir.path(), "", "[queues.q]\n").await;
    let mut acknowledged = Vec::new();
    let mut refused = None;
    for n in 0..20_000 {
        let r = spoold.api().send("q", &format!("{n:0>4000}")).await;
        match r.status().as_u16() {
            201 => acknowledged.push(
                r.json::<serde_json::Value>().await.unwrap()["id"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            ),
            status => {
                refused = Some((status, r.text().await.unwrap()));
                break;
            }
        }
    }
    let (status, body) = refused.expect("the 6 MiB disk filled up");
    assert!(matches!(status, 503 | 507), "{status}: {body}");
    assert!(!acknowledged.is_empty());
    // Still serving: reads work while the disk is full.
    let health = client
        .get(format!("{}/healthz", spoold.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    spoold.stop();

    mount.resize("64m");
    let spoold = start_with(dir.path(), "", "[queues.q]\n").await;
    let found = ids_in(&client, &spoold.base, "q").await;
    let lost: Vec<&String> = acknowledged
        .iter()
        .filter(|id| !found.contains(*id))
        .collect();
    println!(
        "full tmpfs: {} sends acknowledged before the disk filled ({status} after), {} found after it grew, {} lost",
        acknowledged.len(),
        found.len(),
        lost.len()
    );
    assert!(lost.is_empty(), "lost after a full disk: {lost:?}");
    let r = spoold.api().send("q", "room again").await;
    assert_eq!(r.status(), 201);
}
