//! Storage faults on real syscalls: `strace` attaches to a running spoold
//! and makes its `fdatasync` fail with EIO, or its writes with ENOSPC.
//! A failed write is answered 503 and rolled back, and spoold goes on; a
//! failed fsync is answered 500 `operation_unconfirmed`, and spoold exits 1
//! so that replay decides; every acknowledged message survives.

use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::process::{ids_in, start_with};
use reqwest::Client;
use serde_json::Value;

/// Attaches strace to `pid`, injecting `error` into `syscall`.
fn inject(pid: u32, syscall: &str, error: &str) -> Child {
    let child = Command::new("strace")
        .args(["-f", "-p", &pid.to_string(), "-o", "/dev/null"])
        .args(["-e", &format!("trace={syscall}")])
        .args(["-e", &format!("inject={syscall}:error={error}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("strace: install Debian's strace (see .ci/run)");
    // Wait until strace has attached to every thread of spoold.
    let traced = |task: std::fs::DirEntry| {
        std::fs::read_to_string(task.path().join("status"))
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with("TracerPid:") && l.trim_end() != "TracerPid:\t0")
    };
    common::eventually_blocking("strace to attach", Duration::from_secs(10), || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(Result::ok)
            .all(traced)
            .then_some(())
    });
    child
}

async fn send(client: &Client, base: &str, body: &str) -> (u16, Value) {
    let r = client
        .post(format!("{base}/v1/queues/q/messages"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs strace (.ci/run installs it)"]
async fn enospc_is_rolled_back_and_eio_on_fsync_poisons_and_exits() {
    let dir = tempfile::tempdir().unwrap();
    spoold::testing::install_crypto_provider();
    let client = Client::new();
    let mut spoold = start_with(dir.path(), "", "[queues.q]\n").await;
    let base = spoold.base.clone();
    let (status, first) = send(&client, &base, "before any fault").await;
    assert_eq!(status, 201);
    let first_id = first["id"].as_str().unwrap().to_string();

    // A full disk: the write fails, is rolled back, answered 503. Only the
    // first write fails: rolling back inside preallocated space writes
    // zeros, and if that failed too spoold could not vouch for the file
    // and would (rightly) poison the journal.
    let mut tracer = inject(spoold.child.id(), "pwrite64", "ENOSPC:when=1");
    let (status, body) = send(&client, &base, "disk full").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["kind"], "unavailable");
    tracer.kill().unwrap();
    tracer.wait().unwrap();
    // Once strace has let go, spoold goes on after the rolled-back write.
    let after = common::eventually(
        "a send after the disk cleared",
        Duration::from_secs(10),
        async || {
            let (status, after) = send(&client, &base, "after the disk cleared").await;
            (status == 201).then_some(after)
        },
    )
    .await;
    let after_id = after["id"].as_str().unwrap().to_string();

    // A failing fsync: 500 operation_unconfirmed, then spoold exits 1.
    let mut tracer = inject(spoold.child.id(), "fdatasync", "EIO");
    // (Every fsync from now on fails.)
    let (status, body) = send(&client, &base, "in doubt").await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(body["kind"], "operation_unconfirmed");
    let code = common::eventually(
        "the poisoned spoold to exit",
        Duration::from_secs(20),
        async || spoold.child.try_wait().unwrap().map(|status| status.code()),
    )
    .await;
    assert_eq!(code, Some(1));
    let _ = tracer.kill();
    let _ = tracer.wait();

    let spoold = start_with(dir.path(), "", "[queues.q]\n").await;
    let ids = ids_in(&client, &spoold.base, "q").await;
    assert!(
        ids.contains(&first_id) && ids.contains(&after_id),
        "acknowledged messages survive: {ids:?}"
    );
    let bodies: Vec<String> = client
        .get(format!("{}/v1/queues/q/messages", spoold.base))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        !bodies.contains(&"disk full".to_string()),
        "the rolled-back write is gone: {bodies:?}"
    );
    println!(
        "faults injected: 1 ENOSPC (rolled back, 503), 1 EIO on fsync (500, exit 1); acknowledged kept: 2 of 2"
    );
}
