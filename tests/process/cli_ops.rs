//! The operator subcommands of the binary against a running server.

use crate::common;

use crate::common::api::Api;
use crate::common::server::Server;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use reqwest::Client;
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_spoold");

async fn server(dir: &std::path::Path, keys: &str) -> (Server, String) {
    let s = Server::start(dir, keys).await;
    let base = s.base.clone();
    (s, base)
}

/// Runs the binary with `args` (off the async runtime's threads).
async fn run(args: Vec<String>, stdin: &'static str) -> Output {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        common::process::run_input(&args, stdin)
    })
    .await
    .unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn err(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A server with the pull queue `orders` (`maxRetries = 0`: a nack makes
/// a dead letter), its URL and a client.
async fn with_orders(dir: &std::path::Path) -> (Server, String, Client) {
    let (running, base) = server(dir, "").await;
    let client = Client::new();
    client
        .put(format!("{base}/v1/queues/orders"))
        .json(&json!({"maxRetries": 0}))
        .send()
        .await
        .unwrap();
    (running, base, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_send_tail_and_dead_letters_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let (running, base, _) = with_orders(dir.path()).await;

    let sent = run(
        args(&["--url", &base, "send", "orders", "--data", "from-flag"]),
        "",
    )
    .await;
    assert!(sent.status.success(), "{}", err(&sent));
    let id = text(&sent).trim().to_string();
    assert_eq!(id.len(), 32, "{id}");

    // tail shows the newest message, then follows while we send: its first
    // line says it is subscribed (the server subscribes before it reads the
    // newest), so the next send reaches it without a bet on timing.
    let mut tail = Command::new(BIN)
        .args(["--url", &base, "tail", "orders", "-n", "1", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let stdout = tail.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if lines_tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let mut next_line = async || -> serde_json::Value {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.recv())
            .await
            .expect("tail printed a line")
            .expect("tail is running");
        serde_json::from_str(&line).unwrap()
    };
    let first = next_line().await;
    assert_eq!(first["id"], id.as_str());
    assert_eq!(first["body"], "from-flag");

    let piped = run(
        args(&[
            "send",
            "orders",
            "--url",
            &base,
            "--content-type",
            "text/plain",
        ]),
        "from stdin",
    )
    .await;
    assert!(piped.status.success(), "{}", err(&piped));
    let followed = next_line().await;
    assert_eq!(followed["id"], text(&piped).trim());
    assert_eq!(followed["body"], "from stdin");
    tail.kill().unwrap();
    tail.wait().unwrap();

    let table = run(args(&["--url", &base, "queues"]), "").await;
    let t = text(&table);
    assert!(t.starts_with("QUEUE"), "{t}");
    let orders = t.lines().find(|l| l.starts_with("orders ")).unwrap();
    assert!(
        orders.split_whitespace().nth(2) == Some("2"),
        "two visible: {orders}"
    );
    assert!(t.lines().any(|l| l.starts_with("orders.failed")), "{t}");

    // Fail both (max_retries = 0), then look at, redrive and purge them.
    for _ in 0..2 {
        dead_letter(&base).await;
    }
    let list = run(args(&["--url", &base, "dlq", "list", "orders"]), "").await;
    let l = text(&list);
    assert!(l.starts_with("ID"), "{l}");
    assert_eq!(
        l.lines()
            .filter(|x| x.contains("retries_exhausted"))
            .count(),
        2,
        "{l}"
    );

    let dry = run(
        args(&["--url", &base, "dlq", "redrive", "orders", "--dry-run"]),
        "",
    )
    .await;
    assert!(text(&dry).contains("would move 2"), "{}", text(&dry));
    let one = run(
        args(&["--url", &base, "dlq", "redrive", "orders", "--max", "1"]),
        "",
    )
    .await;
    assert!(text(&one).contains("moved 1"), "{}", text(&one));

    let refused = run(args(&["--url", &base, "dlq", "purge", "orders"]), "no\n").await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(err(&refused).contains("not confirmed"), "{}", err(&refused));
    let confirmed = run(
        args(&["--url", &base, "dlq", "purge", "orders"]),
        "orders\n",
    )
    .await;
    assert!(
        text(&confirmed).contains("purged 1"),
        "{}",
        text(&confirmed)
    );
    let yes = run(
        args(&["--url", &base, "dlq", "purge", "orders", "--yes"]),
        "",
    )
    .await;
    assert!(text(&yes).contains("purged 0"), "{}", text(&yes));

    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_one_line_and_keys_go_before_or_after_the_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let (running, base) = server(dir.path(), "api_keys = [\"k1\"]").await;

    let no_key = run(args(&["--url", &base, "queues"]), "").await;
    assert_eq!(no_key.status.code(), Some(1));
    let e = err(&no_key);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.starts_with("spoold: unauthorized:"), "{e}");

    let before = run(args(&["--url", &base, "--api-key", "k1", "queues"]), "").await;
    assert!(before.status.success(), "{}", err(&before));
    let after = run(args(&["queues", "--url", &base, "--api-key", "k1"]), "").await;
    assert!(after.status.success(), "{}", err(&after));

    let missing = run(
        args(&[
            "--url",
            &base,
            "--api-key",
            "k1",
            "send",
            "nope",
            "--data",
            "x",
        ]),
        "",
    )
    .await;
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        err(&missing).starts_with("spoold: queue_not_found:"),
        "{}",
        err(&missing)
    );

    let down = run(args(&["--url", "http://127.0.0.1:1", "queues"]), "").await;
    assert_eq!(down.status.code(), Some(1));
    assert!(
        err(&down).contains("cannot talk to http://127.0.0.1:1"),
        "{}",
        err(&down)
    );

    let usage = run(args(&["dlq", "frobnicate"]), "").await;
    assert_eq!(usage.status.code(), Some(2), "usage errors exit 2");
    running.stop().await;
}

/// The first line `spoold tail` prints (it then follows until killed).
async fn first_tail_line(extra: &[&str]) -> String {
    let mut tail = Command::new(common::process::bin())
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = tail.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = Vec::new();
        BufReader::new(stdout).read_until(b'\n', &mut line).unwrap();
        String::from_utf8_lossy(&line).into_owned()
    });
    let line = tokio::time::timeout(Duration::from_secs(10), line)
        .await
        .expect("tail printed a line")
        .unwrap();
    tail.kill().unwrap();
    tail.wait().unwrap();
    line
}

/// Receives one message of `orders` and nacks it (into `orders.failed`).
async fn dead_letter(base: &str) {
    let api = Api::new(base.to_owned(), None);
    let token = api.lease("orders").await;
    api.settle("orders", &token, "nack").await;
}

/// Issue 26, finding 5: what senders and destinations stored reached the
/// operator's terminal as it was, so an `ESC ] 0 ;` or `ESC [ 2 J` in a
/// body acted on it. Control characters are escaped now; `--raw` keeps
/// the bytes. Finding 11: `tail` of a failure queue says when and why each
/// failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_control_characters_never_reach_the_terminal() {
    const EVIL: &str = "\x1b]0;pwned\x07\x1b[2Jhello\rworld\u{9b}31m";
    let dir = tempfile::tempdir().unwrap();
    let (running, base, client) = with_orders(dir.path()).await;
    let r = client
        .post(format!("{base}/v1/queues/orders/messages"))
        .header("Content-Type", "text/plain")
        .body(EVIL)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let id = r.json::<serde_json::Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let harmless = |what: &str, out: &str| {
        assert!(
            !out.contains(['\x1b', '\x07', '\r', '\u{9b}']),
            "{what} printed control characters: {out:?}"
        );
        assert!(out.contains("\\u001b]0;pwned\\u0007"), "{what}: {out:?}");
    };
    let line = first_tail_line(&["--url", &base, "tail", "orders", "-n", "1"]).await;
    harmless("tail", &line);
    let raw = first_tail_line(&["--url", &base, "tail", "orders", "-n", "1", "--raw"]).await;
    assert!(
        raw.contains(EVIL.split('\r').next().unwrap()),
        "--raw keeps the bytes: {raw:?}"
    );

    dead_letter(&base).await;
    let show = run(args(&["--url", &base, "dlq", "show", "orders", &id]), "").await;
    assert!(show.status.success(), "{}", err(&show));
    harmless("dlq show", &text(&show));
    // A dead letter's line: when and why it failed first.
    let failed = first_tail_line(&["--url", &base, "tail", "orders.failed", "-n", "1"]).await;
    harmless("tail of the failure queue", &failed);
    let letter = running
        .get_json(&format!("/v1/queues/orders.failed/messages/{id}"))
        .await;
    let failed_at = letter["failedAt"].as_str().unwrap();
    assert!(
        failed.starts_with(failed_at),
        "{failed:?} starts with {failed_at}"
    );
    assert!(failed.contains("reason=retries_exhausted"), "{failed:?}");
    running.stop().await;
}

/// Issue 26, finding 11: `dlq purge` takes `--max` and `--dry-run` as
/// `dlq redrive` does; `spoold stats` is `queues`, and `stats Q` shows one
/// queue. Finding 9: `spoold queue set` changes only what it names; 8:
/// the breaker's "probe now" and "close" and pause/resume from the CLI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_by_count_stats_of_one_queue_and_settings_one_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let (running, base, client) = with_orders(dir.path()).await;
    for i in 0..3 {
        client
            .post(format!("{base}/v1/queues/orders/messages"))
            .body(format!("m{i}"))
            .send()
            .await
            .unwrap();
        dead_letter(&base).await;
    }
    let dry = run(
        args(&[
            "--url",
            &base,
            "dlq",
            "purge",
            "orders",
            "--max",
            "2",
            "--dry-run",
        ]),
        "",
    )
    .await;
    assert!(dry.status.success(), "{}", err(&dry));
    assert!(text(&dry).contains("would purge 2 of 3"), "{}", text(&dry));
    let two = run(
        args(&[
            "--url", &base, "dlq", "purge", "orders", "--max", "2", "--yes",
        ]),
        "",
    )
    .await;
    assert!(text(&two).contains("purged 2"), "{}", text(&two));
    assert!(text(&two).contains("1 more match"), "{}", text(&two));

    let all = run(args(&["--url", &base, "stats"]), "").await;
    assert!(all.status.success(), "{}", err(&all));
    assert!(text(&all).starts_with("QUEUE"), "{}", text(&all));
    let one = run(args(&["--url", &base, "stats", "orders.failed"]), "").await;
    assert!(one.status.success(), "{}", err(&one));
    let one = text(&one);
    assert!(one.contains("visible              1"), "{one}");
    assert!(one.contains("state                running"), "{one}");

    client
        .put(format!("{base}/v1/queues/hooks"))
        .json(&json!({"destination": "http://127.0.0.1:9/in", "breakerFailures": 1000}))
        .send()
        .await
        .unwrap();
    let set = run(
        args(&[
            "--url",
            &base,
            "queue",
            "set",
            "hooks",
            "destination=http://127.0.0.1:9/other",
            "backoff.max_seconds=60",
        ]),
        "",
    )
    .await;
    assert!(set.status.success(), "{}", err(&set));
    let q = running.get_json("/v1/queues/hooks").await;
    assert_eq!(q["settings"]["destination"], "http://127.0.0.1:9/other");
    assert_eq!(q["settings"]["breakerFailures"], 1000, "kept: {q}");
    assert_eq!(q["settings"]["backoff"]["maxSeconds"], 60.0, "{q}");
    let bad = run(
        args(&["--url", &base, "queue", "set", "hooks", "nonsense"]),
        "",
    )
    .await;
    assert_eq!(bad.status.code(), Some(2), "{}", err(&bad));

    let paused = run(args(&["--url", &base, "queue", "pause", "hooks"]), "").await;
    assert!(text(&paused).contains("hooks: paused"), "{}", err(&paused));
    let probe = run(args(&["--url", &base, "queue", "probe", "hooks"]), "").await;
    assert!(
        text(&probe).contains("nothing to probe"),
        "{}{}",
        text(&probe),
        err(&probe)
    );
    let close = run(
        args(&["--url", &base, "queue", "close-breaker", "hooks"]),
        "",
    )
    .await;
    assert!(close.status.success(), "{}", err(&close));
    let resumed = run(args(&["--url", &base, "queue", "resume", "hooks"]), "").await;
    assert!(
        text(&resumed).contains("hooks: resumed"),
        "{}",
        err(&resumed)
    );
    running.stop().await;
}
