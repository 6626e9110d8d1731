//! The real binary over real sockets: `kill -9` in the middle of concurrent
//! sends, and clients that hang up before reading their answer; the
//! allocator setting `spoold run` restarts itself with.

use crate::common;

use std::collections::BTreeSet;
use std::io::Write;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::process::{BIN, ids_in, start, start_command, write_config};
use reqwest::StatusCode;
use serde_json::Value;

/// Sends `body` to queue `q`; notes the id of a `201` in `got`. False
/// once spoold is gone.
async fn send_noting_id(
    client: &reqwest::Client,
    base: &str,
    body: String,
    got: &Mutex<Vec<String>>,
) -> bool {
    let sent = client
        .post(format!("{base}/v1/queues/q/messages"))
        .body(body)
        .send()
        .await;
    let Ok(r) = sent else { return false };
    if r.status() == StatusCode::CREATED {
        let Ok(answer) = r.json::<Value>().await else {
            return false;
        };
        got.lock()
            .unwrap()
            .push(answer["id"].as_str().unwrap().to_string());
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_sixteen_senders_loses_no_201() {
    let dir = tempfile::tempdir().unwrap();
    let client = common::process::client();
    let mut acknowledged = BTreeSet::new();
    let mut attempted = 0usize;
    for round in 0..5 {
        let mut spoold = start(dir.path()).await;
        if round == 0 {
            spoold.api().queue("q", serde_json::json!({})).await;
        }
        let got = Arc::new(Mutex::new(Vec::<String>::new()));
        let tried = Arc::new(Mutex::new(0usize));
        let mut senders = Vec::new();
        for w in 0..16 {
            let (client, base, got, tried) = (
                client.clone(),
                spoold.base.clone(),
                got.clone(),
                tried.clone(),
            );
            senders.push(tokio::spawn(async move {
                for n in 0.. {
                    *tried.lock().unwrap() += 1;
                    let body = format!("round {round} writer {w} n {n}");
                    if !send_noting_id(&client, &base, body, &got).await {
                        return;
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(300 + rand::random::<u64>() % 500)).await;
        spoold.child.kill().unwrap();
        spoold.child.wait().unwrap();
        for s in senders {
            let _ = s.await;
        }
        acknowledged.extend(got.lock().unwrap().iter().cloned());
        attempted += *tried.lock().unwrap();
    }
    let spoold = start(dir.path()).await;
    let found = ids_in(&client, &spoold.base, "q").await;
    let lost: Vec<&String> = acknowledged.difference(&found).collect();
    println!(
        "5 kills: {attempted} sends attempted, {} answered 201, {} found after restart, {} lost",
        acknowledged.len(),
        found.len(),
        lost.len()
    );
    assert!(
        acknowledged.len() > 100,
        "too few sends got through: {}",
        acknowledged.len()
    );
    assert!(lost.is_empty(), "answered 201 but gone: {lost:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_hang_up_change_nothing_a_restart_would_not_show() {
    let dir = tempfile::tempdir().unwrap();
    let client = common::process::client();
    let spoold = start(dir.path()).await;
    spoold.api().queue("q", serde_json::json!({})).await;
    let addr = spoold.base.trim_start_matches("http://").to_string();
    let mut hangups = Vec::new();
    for i in 0..200 {
        let addr = addr.clone();
        hangups.push(std::thread::spawn(move || {
            let mut stream = std::net::TcpStream::connect(addr).unwrap();
            let body = format!("hang-up {i}");
            let request = format!(
                "POST /v1/queues/q/messages HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(request.as_bytes()).unwrap();
            // Close without reading the answer.
            drop(stream);
        }));
    }
    for h in hangups {
        h.join().unwrap();
    }
    // Wait until the count stops moving: every accepted write is applied.
    let mut before = ids_in(&client, &spoold.base, "q").await;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = ids_in(&client, &spoold.base, "q").await;
        if now == before {
            break;
        }
        before = now;
    }
    spoold.signal("-TERM");
    let mut spoold = spoold;
    let code = spoold.child.wait().unwrap().code();
    assert_eq!(code, Some(0), "SIGTERM stops cleanly");
    let spoold = start(dir.path()).await;
    let after = ids_in(&client, &spoold.base, "q").await;
    println!(
        "200 hang-ups: {} messages before the restart, {} after",
        before.len(),
        after.len()
    );
    assert!(!before.is_empty(), "no hung-up send was applied at all");
    assert_eq!(
        before, after,
        "what a restart shows is what the running process showed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_exits_in_time_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let client = common::process::client();
    let mut spoold =
        common::process::start_with(dir.path(), "shutdown_grace = \"5s\"", "[queues.q]\n").await;
    let got = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut senders = Vec::new();
    for w in 0..16 {
        let (client, base, got) = (client.clone(), spoold.base.clone(), got.clone());
        senders.push(tokio::spawn(async move {
            for n in 0.. {
                if !send_noting_id(&client, &base, format!("{w}-{n}"), &got).await {
                    return;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stopping = std::time::Instant::now();
    spoold.signal("-TERM");
    let code = spoold.child.wait().unwrap().code();
    let took = stopping.elapsed();
    for s in senders {
        let _ = s.await;
    }
    assert_eq!(code, Some(0));
    assert!(
        took < Duration::from_secs(5),
        "stopped within the grace period: {took:?}"
    );
    let acknowledged: BTreeSet<String> = got.lock().unwrap().iter().cloned().collect();
    let spoold = start(dir.path()).await;
    let found = ids_in(&client, &spoold.base, "q").await;
    let lost = acknowledged.difference(&found).count();
    println!(
        "SIGTERM under 16 senders: {} acknowledged, stopped in {took:?}, {lost} lost",
        acknowledged.len()
    );
    assert!(acknowledged.len() > 50);
    assert_eq!(lost, 0);
}

/// `spoold run` is the process it was started as (no re-execution: a
/// debugger, profiler or supervisor sees one exec) and says which
/// allocator and which of its settings are in force.
#[tokio::test]
async fn run_logs_the_allocator_settings_and_never_re_executes_itself() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", "", "");
    // What jemalloc (tikv-jemallocator's prefixed build) reads.
    let settings = "narenas:2";
    let spoold = start_command(
        Command::new(BIN)
            .args(["run", "--config"])
            .arg(&config)
            .env("_RJEM_MALLOC_CONF", settings),
    )
    .await;
    let log = spoold.log();
    let line = log
        .lines()
        .find(|l| l.contains("allocator="))
        .unwrap_or_else(|| panic!("no allocator line: {log}"));
    assert!(line.contains("allocator=\"jemalloc\""), "{line}");
    assert!(
        line.contains(&format!("_RJEM_MALLOC_CONF={settings}")),
        "{line}"
    );
    let environ = std::fs::read(format!("/proc/{}/environ", spoold.child.id())).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(!environ.contains("SPOOLD_ALLOCATOR_TUNED"), "{environ}");
    assert!(!environ.contains("GLIBC_TUNABLES"), "{environ}");
    drop(spoold);

    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", "", "");
    let spoold = start_command(
        Command::new(BIN)
            .args(["run", "--config"])
            .arg(&config)
            .env_remove("_RJEM_MALLOC_CONF"),
    )
    .await;
    let log = spoold.log();
    assert!(
        log.contains("defaults (no _RJEM_MALLOC_CONF* set)"),
        "{log}"
    );
}

/// SIGHUP reads the config file again: new queues and keys take effect at
/// once; a file that does not parse, or that would remove the last key,
/// is refused with its reason and changes nothing; what only a restart
/// reads is named as such. The spool keeps every message throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_queues_and_keys_and_refuses_a_bad_file() {
    use crate::common::api::Api;
    use reqwest::Method;
    let dir = tempfile::tempdir().unwrap();
    let first = "[queues.a]\nmax_retries = 3\n";
    let config = write_config(dir.path(), "api_keys = [\"key-one-0123456789\"]", "", first);
    let spoold = start_command(Command::new(BIN).args(["run", "--config"]).arg(&config)).await;
    let one = Api::new(spoold.base.clone(), Some("key-one-0123456789".into()));
    let two = Api::new(spoold.base.clone(), Some("key-two-0123456789".into()));
    let kept = one.send_id("a", "kept").await;
    assert_eq!(two.status(Method::GET, "/v1/queues").await, 401);

    // Reloaded: key two replaces key one, queue a changes, b appears.
    let reloaded = |n: usize| {
        let log = spoold.log();
        (log.matches("SIGHUP: config reloaded").count() >= n).then_some(log)
    };
    let refused = |n: usize| {
        let log = spoold.log();
        (log.matches("SIGHUP: config refused").count() >= n).then_some(log)
    };
    write_config(
        dir.path(),
        "api_keys = [\"key-two-0123456789\"]",
        "",
        "[queues.a]\nmax_retries = 7\n[queues.b]\n",
    );
    spoold.signal("-HUP");
    common::eventually("the reload", Duration::from_secs(10), async || reloaded(1)).await;
    assert_eq!(one.status(Method::GET, "/v1/queues").await, 401);
    assert_eq!(
        two.get_json("/v1/queues/a").await["settings"]["maxRetries"],
        7
    );
    assert_eq!(two.status(Method::GET, "/v1/queues/b").await, 200);

    // A file that does not parse: refused, naming the key and its line.
    write_config(
        dir.path(),
        "api_keys = [\"key-three-0123456789\"]",
        "",
        "[queues.a]\nmax_retries = \"many\"\n",
    );
    spoold.signal("-HUP");
    let log = common::eventually("the refusal", Duration::from_secs(10), async || refused(1)).await;
    let line = log
        .lines()
        .find(|l| l.contains("SIGHUP: config refused"))
        .unwrap();
    assert!(
        line.contains("max_retries") && line.contains("line"),
        "{line}"
    );
    assert_eq!(two.status(Method::GET, "/v1/queues/b").await, 200);

    // No key at all: refused by the server, which keeps key two.
    write_config(dir.path(), "", "", "[queues.a]\n");
    spoold.signal("-HUP");
    let log = common::eventually("the refusal", Duration::from_secs(10), async || refused(2)).await;
    assert!(log.contains("removing the last one"), "{log}");
    assert_eq!(two.status(Method::GET, "/v1/queues/b").await, 200);
    assert_eq!(
        two.get_json("/v1/queues/a").await["settings"]["maxRetries"],
        7
    );

    // b leaves the file (it is empty: deleted); a change to [server] waits
    // for a restart and says so.
    write_config(
        dir.path(),
        "api_keys = [\"key-two-0123456789\"]\nmax_body_bytes = \"2MiB\"",
        "",
        "[queues.a]\nmax_retries = 7\n",
    );
    spoold.signal("-HUP");
    let log = common::eventually("the reload", Duration::from_secs(10), async || reloaded(2)).await;
    let line = log
        .lines()
        .filter(|l| l.contains("config reloaded"))
        .nth(1)
        .unwrap();
    assert!(line.contains("restart_needed=server"), "{line}");
    assert_eq!(two.status(Method::GET, "/v1/queues/b").await, 404);
    assert_eq!(two.message_ids("a", "").await, vec![kept]);
}
