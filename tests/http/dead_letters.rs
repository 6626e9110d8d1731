//! Dead-letter workflows (docs/contract.md §4 filters, §7 CLI): a push
//! queue whose destination fails in known ways fills its failure queue;
//! peek, redrive and purge select by reason, last status, time and id, over
//! the API and from the command line, and say exactly how many matched,
//! moved and remain.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::process::{bin, run_in, run_input, start_in};
use crate::common::server::Server;
use crate::common::sink::Sink;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// A push queue `hooks` (one delivery at a time, no retries) whose five
/// messages failed with 500, 500, 404, 503, 500, oldest first; the
/// destination answers 200 from then on. Returns the ids in send order.
async fn five_dead_letters(toml: &str) -> (Server, Sink, Vec<String>) {
    five_dead_letters_in("hooks", toml).await
}

/// [`five_dead_letters`] in a queue of another name.
async fn five_dead_letters_in(queue: &str, toml: &str) -> (Server, Sink, Vec<String>) {
    let (sink, dest) = Sink::start().await;
    sink.script([500, 500, 404, 503, 500].map(|s| (s, Vec::new())));
    let server = Server::temp(toml).await;
    server
        .queue(
            queue,
            json!({"destination": dest, "concurrency": 1, "maxRetries": 0}),
        )
        .await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let r = server.forward(queue, "/in", &format!("event {i}")).await;
        assert_eq!(r.status(), StatusCode::ACCEPTED);
        let v: Value = r.json().await.unwrap();
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    common::wait_until("five dead letters", async || {
        server
            .message_ids(&format!("{queue}.failed"), "")
            .await
            .len()
            == 5
    })
    .await;
    (server, sink, ids)
}

async fn failed_ids(server: &Server, query: &str) -> Vec<String> {
    server.message_ids("hooks.failed", query).await
}

/// The failed ids of `alerts` (the queue whose failures the metrics
/// test counts: no other test of this binary fails a delivery on it).
async fn alerts_failed(server: &Server, query: &str) -> Vec<String> {
    server.message_ids("alerts.failed", query).await
}

fn pick(ids: &[String], places: &[usize]) -> Vec<String> {
    places.iter().map(|&i| ids[i].clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_select_dead_letters_for_peek_redrive_and_purge() {
    let (server, sink, ids) = five_dead_letters_in("alerts", "").await;

    assert_eq!(
        alerts_failed(&server, "&status=5xx").await,
        pick(&ids, &[0, 1, 3, 4])
    );
    assert_eq!(
        alerts_failed(&server, "&status=500").await,
        pick(&ids, &[0, 1, 4])
    );
    assert_eq!(
        alerts_failed(&server, "&reason=permanent_status").await,
        pick(&ids, &[2])
    );
    assert_eq!(
        alerts_failed(&server, "&reason=retries_exhausted&status=503").await,
        pick(&ids, &[3])
    );
    assert_eq!(
        alerts_failed(&server, &format!("&id={}&id={}", ids[4], ids[0])).await,
        pick(&ids, &[0, 4])
    );
    assert_eq!(
        alerts_failed(&server, "&until=2000-01-01T00:00:00Z").await,
        Vec::<String>::new()
    );
    assert_eq!(
        alerts_failed(&server, "&since=2000-01-01T00:00:00%2B02:00")
            .await
            .len(),
        5
    );
    assert_eq!(
        alerts_failed(&server, "&since=2999-01-01T00:00:00Z")
            .await
            .len(),
        0
    );

    for (path, word) in [
        ("/v1/queues/alerts.failed/messages?reason=tired", "reason"),
        ("/v1/queues/alerts.failed/messages?status=5x", "status"),
        ("/v1/queues/alerts.failed/messages?since=yesterday", "since"),
        ("/v1/queues/alerts.failed/messages?id=nope", "id"),
        // Only dead letters have a reason.
        (
            "/v1/queues/alerts/messages?reason=expired",
            "not a failure queue",
        ),
    ] {
        let r = server.call(Method::GET, path).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{path}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["kind"], "bad_request", "{path}");
        assert!(e["message"].as_str().unwrap().contains(word), "{path}: {e}");
    }
    let r = server
        .call(Method::DELETE, "/v1/queues/alerts/messages?status=500")
        .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);

    // A dry run counts, names nothing and moves nothing.
    let dry: Value = server
        .call(
            Method::POST,
            "/v1/queues/alerts/redrive?status=500&max=2&dryRun=true",
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        dry,
        json!({"moved": 2, "matched": 3, "remaining": 1, "dryRun": true})
    );
    assert_eq!(alerts_failed(&server, "").await.len(), 5);

    // Named by the failure queue, as SQS users do: the two oldest 500s.
    let moved: Value = server
        .call(
            Method::POST,
            "/v1/queues/alerts.failed/redrive?status=500&max=2",
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        moved,
        json!({"moved": 2, "matched": 3, "remaining": 1, "dryRun": false})
    );
    assert_eq!(alerts_failed(&server, "").await, pick(&ids, &[2, 3, 4]));
    let seen = sink.wait_for(7).await;
    let redelivered: Vec<String> = seen[5..]
        .iter()
        .map(|s| {
            s.headers["spooler-delivery-id"]
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(redelivered, pick(&ids, &[0, 1]), "same ids, oldest first");

    let purged: Value = server
        .call(
            Method::DELETE,
            "/v1/queues/alerts.failed/messages?reason=permanent_status",
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        purged,
        json!({"purged": 1, "matched": 1, "remaining": 0, "dryRun": false})
    );
    assert_eq!(alerts_failed(&server, "").await, pick(&ids, &[3, 4]));

    // The stats say what is retrying; metrics label the last retry a failure.
    let metrics = server.text("/metrics").await;
    // (One series per status class the attempts got.)
    let failures: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("spoold_deliveries_total{")
                && l.contains("queue=\"alerts\"")
                && l.contains("outcome=\"failure\"")
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(failures, 5.0, "every attempt moved its message: {metrics}");
    assert!(metrics.contains("spoold_build_info{"), "{metrics}");
    server.stop().await;
}

/// Runs the binary against `base` and returns (exit code, stdout, stderr).
fn cli(base: &str, args: &[&str], stdin: &str) -> (i32, String, String) {
    let out = run_input(&[&["--url", base], args].concat(), stdin);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_filters_shows_and_counts_dead_letters() {
    let (server, _sink, ids) = five_dead_letters("").await;
    let base = server.addr().to_string();
    let run = |args: &'static [&'static str], stdin: &'static str| {
        let base = base.clone();
        tokio::task::spawn_blocking(move || cli(&base, args, stdin))
    };

    // --json: one object per line; the failure queue's name is understood.
    let (code, out, err) = run(
        &["dlq", "list", "hooks.failed", "--status", "5xx", "--json"],
        "",
    )
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    let listed: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let listed_ids: Vec<&str> = listed.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(listed_ids, pick(&ids, &[0, 1, 3, 4]));
    let (_, table, _) = run(
        &["dlq", "list", "hooks", "--reason", "permanent_status"],
        "",
    )
    .await
    .unwrap();
    assert!(table.starts_with("ID"), "{table}");
    assert_eq!(table.lines().count(), 2, "{table}");
    assert!(table.contains("404"), "{table}");

    // One dead letter, its attempts and what the destination said.
    let id = ids[3].clone();
    let shown = tokio::task::spawn_blocking({
        let base = base.clone();
        let id = id.clone();
        move || cli(&base, &["dlq", "show", "hooks", &id], "")
    })
    .await
    .unwrap();
    assert_eq!(shown.0, 0, "{}", shown.2);
    for want in [
        "retries_exhausted",
        "HTTP 503",
        "sink says hi",
        "POST /in",
        "event 3",
    ] {
        assert!(shown.1.contains(want), "{want}: {}", shown.1);
    }

    // Dry runs count exactly and say that more remain beyond --max.
    let (_, out, _) = run(
        &[
            "dlq",
            "redrive",
            "hooks",
            "--status",
            "5xx",
            "--max",
            "1",
            "--dry-run",
        ],
        "",
    )
    .await
    .unwrap();
    assert!(
        out.contains("would move 1 of 4 dead letter(s) matching status 5xx")
            && out.contains("3 more match"),
        "{out}"
    );
    let (_, out, _) = run(&["dlq", "redrive", "hooks", "--since", "1h", "--json"], "")
        .await
        .unwrap();
    let answer: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(answer["moved"], 5, "{answer}");

    // Bad flag values are usage errors; nothing is sent.
    let (code, _, err) = run(&["dlq", "purge", "hooks", "--reason", "tired", "--yes"], "")
        .await
        .unwrap();
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--reason"), "{err}");
    let (code, _, err) = run(&["dlq", "list", "hooks", "--since", "last tuesday"], "")
        .await
        .unwrap();
    assert_eq!(code, 2, "{err}");

    let (code, out, err) = run(&["queues", "--json"], "").await.unwrap();
    assert_eq!(code, 0, "{err}");
    let names: Vec<String> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["name"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(names, ["hooks", "hooks.failed"]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_asks_with_the_count_and_takes_either_name() {
    let (server, _sink, _ids) = five_dead_letters("").await;
    let base = server.addr().to_string();
    let b = base.clone();
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        cli(&b, &["dlq", "purge", "hooks", "--status", "500"], "no\n")
    })
    .await
    .unwrap();
    assert_eq!(code, 1, "{out}");
    assert!(
        err.contains("Delete 3 dead letter(s) of hooks.failed matching status 500"),
        "{err}"
    );
    assert!(err.contains("not confirmed"), "{err}");
    let b = base.clone();
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        cli(
            &b,
            &["dlq", "purge", "hooks", "--status", "500"],
            "hooks.failed\n",
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("purged 3 dead letter(s) matching status 500"),
        "{out}"
    );
    assert_eq!(failed_ids(&server, "").await.len(), 2);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_shows_history_and_ends_cleanly_when_the_server_stops() {
    // A long grace: the open tail must not hold up the stop.
    let (server, _sink, ids) = five_dead_letters("shutdown_grace = \"60s\"").await;
    let mut tail = Command::new(bin())
        .args(["--url", server.addr(), "tail", "hooks.failed", "-n", "2"])
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = tail.stdout.take().unwrap();
    let first_two = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stdout).lines();
        let two: Vec<String> = (0..2).map(|_| lines.next().unwrap().unwrap()).collect();
        (two, lines)
    });
    let (two, mut rest) = tokio::time::timeout(Duration::from_secs(20), first_two)
        .await
        .expect("tail printed its history")
        .unwrap();
    for (line, id) in two.iter().zip(pick(&ids, &[3, 4])) {
        assert!(line.contains(&id), "{line}");
        assert!(
            line.contains("reason=retries_exhausted") && line.contains("status=5"),
            "{line}"
        );
    }
    let started = Instant::now();
    server.stop().await;
    let stopped_in = started.elapsed();
    assert!(
        stopped_in < Duration::from_secs(30),
        "the open tail held up the stop for {stopped_in:?}"
    );
    let status = tokio::task::spawn_blocking(move || {
        assert!(rest.next().is_none(), "nothing more after the history");
        tail.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert_eq!(status.status.code(), Some(0));
    let err = String::from_utf8_lossy(&status.stderr);
    assert!(err.contains("server stopped"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_to_a_closed_pipe_ends_quietly() {
    let (server, _sink, _ids) = five_dead_letters("").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("spoold.toml");
    std::fs::write(&config, include_str!("../../config.example.toml")).unwrap();
    let config = config.display().to_string();
    for args in [
        vec!["--url", server.addr(), "dlq", "list", "hooks"],
        vec!["--url", server.addr(), "queues"],
        vec!["check-config", "--config", &config],
    ] {
        let mut child = Command::new(bin())
            .args(&args)
            .env_remove("SPOOLD_API_KEYS")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader leaves before anything is written (`| head -0`).
        drop(child.stdout.take());
        let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
            .await
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_say_their_cause_and_a_listen_flag_needs_no_config() {
    let dir = tempfile::tempdir().unwrap();
    let down = run_in(dir.path(), &["--url", "http://127.0.0.1:1", "queues"]);
    assert_eq!(down.code, 1);
    assert!(
        down.stderr.to_lowercase().contains("connection refused"),
        "{}",
        down.stderr
    );
    let missing = run_in(dir.path(), &["check-config", "--config", "nope.toml"]);
    assert_eq!(missing.code, 1);
    assert_eq!(
        missing.stderr.matches("no such file").count(),
        1,
        "{}",
        missing.stderr
    );
    assert!(!missing.stderr.contains("os error"), "{}", missing.stderr);

    // The effective config as TOML, secrets hidden; it parses back.
    std::fs::write(
        dir.path().join("c.toml"),
        include_str!("../../config.example.toml"),
    )
    .unwrap();
    let checked = run_in(dir.path(), &["check-config", "--config", "c.toml"]);
    assert_eq!(checked.code, 0, "{}", checked.stderr);
    assert!(
        checked.stdout.contains("[queues.billing]"),
        "{}",
        checked.stdout
    );
    assert!(!checked.stdout.contains("whsec_"), "{}", checked.stdout);
    std::fs::write(dir.path().join("again.toml"), &checked.stdout).unwrap();
    assert_eq!(
        run_in(dir.path(), &["check-config", "--config", "again.toml"]).code,
        0
    );

    // No config file: --listen (and SPOOLD_LISTEN) choose the address; the
    // log has no colour codes when it is not a terminal.
    let mut spoold = start_in(dir.path(), &["--listen", "127.0.0.1:0"]).await;
    assert_eq!(
        spoold.api().status(Method::GET, "/readyz").await,
        StatusCode::OK
    );
    assert!(!spoold.log().contains('\u{1b}'), "{}", spoold.log());
    assert_eq!(spoold.stop(), 0);
    let mut by_env = common::process::start_command(
        Command::new(bin())
            .current_dir(dir.path())
            .env("SPOOLD_LISTEN", "127.0.0.1:0"),
    )
    .await;
    assert!(by_env.log().contains("127.0.0.1:"), "{}", by_env.log());
    assert_eq!(by_env.stop(), 0);
}
