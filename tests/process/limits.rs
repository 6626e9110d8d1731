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

/// Finding 2: repair (and start-up with `on_corruption = "quarantine"`)
/// laid every payload record into one pack, and panicked once they passed
/// 4 GiB. It lays them into as many packs as they need: under the
/// `testing` feature a pack holds 1 MiB, so 4 MiB of messages take several
/// (the full-size run, past 4 GiB, is in `docs/reliability.md`). Every
/// undamaged message is kept, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_lays_a_large_spool_into_several_packs() {
    const MESSAGES: usize = 40;
    let body = |i: usize| format!("{i:04}").repeat(25_600);
    let template = tempfile::tempdir().unwrap();
    {
        let mut spoold = common::process::start(template.path()).await;
        let api = spoold.api();
        assert_eq!(
            api.put_queue("big", serde_json::json!({})).await.status(),
            201
        );
        for i in 0..MESSAGES {
            let sent = api
                .req(Method::POST, "/v1/queues/big/messages")
                .body(body(i))
                .send()
                .await
                .unwrap();
            assert_eq!(sent.status(), 201);
        }
        assert_eq!(spoold.stop(), 0);
    }
    // A flipped byte in the middle of a sealed segment: one message's
    // record is damaged.
    let spool = template.path().join("spool");
    let mut segments: Vec<_> = std::fs::read_dir(&spool)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segments.sort();
    assert!(segments.len() >= 3, "{segments:?}");
    let damaged = &segments[1];
    let mut bytes = std::fs::read(damaged).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    std::fs::write(damaged, &bytes).unwrap();

    for how in ["journal repair", "on_corruption = quarantine"] {
        let dir = tempfile::tempdir().unwrap();
        common::copy_dir(&spool, &dir.path().join("spool"));
        let spool_keys = if how == "journal repair" {
            let ran = common::process::run_in(dir.path(), &["journal", "repair", "--dir", "spool"]);
            assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
            "segment_bytes = \"1MiB\""
        } else {
            "segment_bytes = \"1MiB\"\non_corruption = \"quarantine\""
        };
        let spoold = common::process::start_config(dir.path(), "", spool_keys, "").await;
        let names: Vec<String> = std::fs::read_dir(dir.path().join("spool"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let packs = names.iter().filter(|n| n.ends_with(".pack")).count();
        assert!(packs >= 3, "{how}: {packs} packs in {names:?}");
        assert!(
            names.iter().any(|n| n.ends_with(".quarantine")),
            "{how}: {names:?}"
        );
        let mut kept = Vec::new();
        loop {
            let got = spoold
                .api()
                .req(Method::POST, "/v1/queues/big/receive-batch?max=10")
                .send()
                .await
                .unwrap();
            let page: serde_json::Value = got.json().await.unwrap();
            let messages = page["messages"].as_array().unwrap().clone();
            if messages.is_empty() {
                break;
            }
            for m in messages {
                let text = m["body"].as_str().unwrap();
                let i: usize = text[..4].parse().unwrap();
                assert_eq!(text, body(i), "{how}: message {i} changed");
                kept.push(i);
            }
        }
        kept.sort();
        assert_eq!(kept.len(), MESSAGES - 1, "{how}: kept {kept:?}");
    }
}

/// Sends `count` messages of `body` to `queue` (created first).
async fn fill(spoold: &Spoold, queue: &str, count: usize, body: &str) {
    let api = spoold.api();
    assert!(
        api.put_queue(queue, serde_json::json!({}))
            .await
            .status()
            .is_success()
    );
    for _ in 0..count {
        let sent = api
            .req(Method::POST, &format!("/v1/queues/{queue}/messages"))
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        assert_eq!(sent.status(), 201);
    }
}

/// Finding 3: a search ran on the async runtime with a quadratic
/// substring test, so two peeks with a 30 000-byte needle over twenty
/// 1 MiB bodies took 31 s each and froze `/healthz` meanwhile. Now the
/// needle is capped, the test is linear, searches run on the blocking
/// pool, at most a few at once (`429` past them, with `Retry-After`), and
/// each page ends early past its byte or time budget with a cursor that
/// goes on. The probes answer within their usual time while eight
/// worst-case searches are asked for again and again (`bench/run.sh`,
/// section `search`, measures the p99).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn searches_cannot_freeze_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let spoold = common::process::start_with(dir.path(), "max_body_bytes = \"2MiB\"", "").await;
    let hay = "a".repeat(1 << 20);
    fill(&spoold, "hay", 70, &hay).await;
    let api = spoold.api();

    // A needle past the cap is refused, naming it.
    let long = "a".repeat(30_000);
    let refused = api
        .get(&format!("/v1/queues/hay/messages?contains={long}"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    assert!(refused.text().await.unwrap().contains("at most 1024"));

    // Eight searches for the worst needle allowed, asked for again and
    // again for three seconds, while the probe is asked every 20 ms.
    let worst = format!("{}b", "a".repeat(1023));
    let until = std::time::Instant::now() + Duration::from_secs(3);
    let searchers: Vec<_> = (0..8)
        .map(|_| {
            let client = reqwest::Client::new();
            let url = format!("{}/v1/queues/hay/messages?contains={worst}", spoold.base);
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while std::time::Instant::now() < until {
                    let r = client.get(&url).send().await.unwrap();
                    let retry_after = r.headers().contains_key("retry-after");
                    let status = r.status().as_u16();
                    let body: serde_json::Value = r.json().await.unwrap();
                    match status {
                        200 => assert!(body["next"].is_string(), "a cut page goes on: {body}"),
                        429 => {
                            assert!(retry_after);
                            assert_eq!(body["kind"], "too_many_searches");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        other => panic!("{other}: {body}"),
                    }
                    seen.push(status);
                }
                seen
            })
        })
        .collect();
    let mut probes = Vec::new();
    let client = reqwest::Client::new();
    while std::time::Instant::now() < until {
        let asked = std::time::Instant::now();
        let r = client
            .get(format!("{}/healthz", spoold.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        probes.push(asked.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut statuses = Vec::new();
    for s in searchers {
        statuses.extend(s.await.unwrap());
    }
    probes.sort();
    let slowest = *probes.last().unwrap();
    eprintln!(
        "{} probes, p99 {:?}, slowest {slowest:?}; {} searches answered, {} refused",
        probes.len(),
        probes[probes.len() * 99 / 100],
        statuses.iter().filter(|&&s| s == 200).count(),
        statuses.iter().filter(|&&s| s == 429).count()
    );
    // The build before answered the probe after seconds; a loaded debug
    // build answers it in milliseconds.
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");
    assert!(statuses.contains(&200));

    // A search that matches nothing reads page after page, each within
    // its budget, until every message was looked at once.
    let mut after = String::new();
    let (mut scanned, mut pages) = (0, 0);
    loop {
        let page = api
            .get_json(&format!("/v1/queues/hay/messages?contains=zzz{after}"))
            .await;
        assert_eq!(page["messages"], serde_json::json!([]), "{page}");
        scanned += page["scanned"].as_u64().unwrap();
        pages += 1;
        match page["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    assert_eq!(scanned, 70);
    assert!(pages >= 2, "a 70 MiB search fits no one page");

    // A `match` on a body past its bound is not parsed, and says so.
    let pad = "x".repeat(1_500_000);
    fill(
        &spoold,
        "json",
        1,
        &format!("{{\"a\": 1, \"pad\": \"{pad}\"}}"),
    )
    .await;
    fill(&spoold, "json", 1, "{\"a\": 1}").await;
    let page = api.get_json("/v1/queues/json/messages?match=a=1").await;
    assert_eq!(page["messages"].as_array().unwrap().len(), 1, "{page}");
    assert_eq!(page["unsearched"], 1, "{page}");

    let metrics = api.text("/metrics").await;
    assert!(
        metrics.contains("spoold_limit_reached_total{limit=\"search_bytes\"}")
            || metrics.contains("spoold_limit_reached_total{limit=\"search_time\"}"),
        "no page counted as cut short"
    );
}

/// Finding 4: 300 small events to 10 000 queues each took the process
/// from 89 to 614 MiB while the journal grew by 48 MiB, and nothing
/// refused them before a pod's memory limit. Now an untouched delivery is
/// a few bytes, what the state holds is accounted, and past
/// `spool.max_memory` events and sends are refused with `507`, before
/// and after a `kill -9` and its replay; settling frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_memory_has_a_bound_that_replay_keeps() {
    const QUEUES: usize = 500;
    let dir = tempfile::tempdir().unwrap();
    let spool_keys = "segment_bytes = \"1MiB\"\nmax_memory = \"16MiB\"";
    let start = || common::process::start_config(dir.path(), "", spool_keys, "");
    let mut spoold = start().await;
    let api = spoold.api();
    for i in 0..QUEUES {
        let made = api
            .put_queue(
                &format!("q{i:03}"),
                serde_json::json!({"events": ["order.>"]}),
            )
            .await;
        assert_eq!(made.status(), 201);
    }
    let accounted = |text: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with("spoold_memory_accounted_bytes "))
            .expect("spoold_memory_accounted_bytes");
        line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64
    };
    let empty = accounted(&api.text("/metrics").await);
    let publish = |n: usize| {
        api.req(Method::POST, "/v1/events")
            .json(&serde_json::json!({"type": "order.created", "payload": {"n": n}}))
            .send()
    };
    let mut published = 0;
    let refused = loop {
        let r = publish(published).await.unwrap();
        if r.status() != 202 {
            break r;
        }
        published += 1;
        assert!(published < 5_000, "never refused");
    };
    assert_eq!(refused.status(), 507);
    assert!(refused.headers().contains_key("retry-after"));
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["kind"], "spool_full");
    assert!(
        body["message"].as_str().unwrap().contains("max_memory"),
        "{body}"
    );
    let full = accounted(&api.text("/metrics").await);
    let per_delivery = (full - empty) / (published * QUEUES) as u64;
    assert!(
        per_delivery <= 40,
        "{per_delivery} bytes accounted a delivery"
    );
    assert!(full <= 16 << 20, "{full}");
    let metrics = api.text("/metrics").await;
    assert!(metrics.contains("spoold_limit_reached_total{limit=\"memory\"}"));

    // kill -9, replay: every acknowledged event is there, and the bound
    // still holds.
    spoold.child.kill().unwrap();
    spoold.wait_exit();
    let spoold = start().await;
    let api = spoold.api();
    for i in [0, QUEUES / 2, QUEUES - 1] {
        let q = api.get_json(&format!("/v1/queues/q{i:03}")).await;
        assert_eq!(q["stats"]["visible"], published as u64, "{q}");
    }
    let replayed = accounted(&api.text("/metrics").await);
    assert!(
        replayed.abs_diff(full) <= full / 10,
        "accounted {full} before the kill, {replayed} after replay"
    );
    let again = api
        .req(Method::POST, "/v1/events")
        .json(&serde_json::json!({"type": "order.created", "payload": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 507);

    // Settled, the memory is free again.
    for i in 0..QUEUES / 2 {
        let purged = api
            .req(Method::DELETE, &format!("/v1/queues/q{i:03}/messages"))
            .send()
            .await
            .unwrap();
        assert_eq!(purged.status(), 200);
    }
    let accepted = api
        .req(Method::POST, "/v1/events")
        .json(&serde_json::json!({"type": "order.created", "payload": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);
}

/// Finding 5: two push queues whose destinations were this node's own
/// `/v1/events` republished each other's deliveries: one publish became
/// 116 155 events in 17 s, and went on after a restart. A destination at
/// this node (its API, by address or `localhost`), at a link-local or
/// metadata address (unless a listed range holds it), or resolving only
/// outside the listed ranges, is refused; what no address check can see
/// (a loop through another spoold) stops at `Spooler-Hops`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_never_loop_through_spoold_nor_reach_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let spoold = common::process::start(dir.path()).await;
    let api = spoold.api();
    let port = api.addr().rsplit_once(':').unwrap().1.to_owned();
    for destination in [
        format!("http://127.0.0.1:{port}/v1/events"),
        format!("http://localhost:{port}/v1/events"),
        format!("http://[::ffff:127.0.0.1]:{port}/v1/events"),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        "http://[fd00:ec2::254]/".to_string(),
        "http://[::ffff:a9fe:a9fe]/".to_string(),
    ] {
        let r = api
            .put_queue(
                "loop",
                serde_json::json!({"destination": destination, "events": ["loop.>"]}),
            )
            .await;
        assert_eq!(r.status(), 403, "{destination}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["kind"], "forbidden", "{destination}: {body}");
    }
    let r = api
        .put_queue(
            "loop",
            serde_json::json!({"destination": format!("http://127.0.0.1:{port}/v1/events")}),
        )
        .await;
    let said: serde_json::Value = r.json().await.unwrap();
    assert!(
        said["message"]
            .as_str()
            .unwrap()
            .contains("this node's API"),
        "{said}"
    );
    drop(spoold);

    // An operator may allow a metadata address by its range; a name is
    // checked by what it resolves to when a delivery connects.
    let (sink, sink_url) = common::sink::Sink::start().await;
    let sink_port = sink_url
        .rsplit_once(':')
        .unwrap()
        .1
        .trim_end_matches('/')
        .to_owned();
    let dir = tempfile::tempdir().unwrap();
    let spoold = common::process::start_with(
        dir.path(),
        "allowed_destinations = [\"*\", \"169.254.169.254/32\"]",
        "",
    )
    .await;
    let made = spoold
        .api()
        .put_queue(
            "metadata",
            serde_json::json!({"destination": "http://169.254.169.254/"}),
        )
        .await;
    assert_eq!(made.status(), 201);
    drop(spoold);
    let dir = tempfile::tempdir().unwrap();
    let spoold =
        common::process::start_with(dir.path(), "allowed_destinations = [\"10.0.0.0/8\"]", "")
            .await;
    let api = spoold.api();
    let made = api
        .put_queue(
            "named",
            serde_json::json!({"destination": format!("http://localhost:{sink_port}/hook")}),
        )
        .await;
    assert_eq!(made.status(), 201, "a name may resolve into a listed range");
    let sent = api
        .req(Method::POST, "/v1/queues/named/messages")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 201);
    let attempt = common::eventually("a refused attempt", Duration::from_secs(10), async || {
        let page = api.get_json("/v1/queues/named/messages").await;
        let error = page["messages"][0]["attempts"][0]["error"]
            .as_str()?
            .to_owned();
        Some(error)
    })
    .await;
    assert!(attempt.contains("resolves only to addresses"), "{attempt}");
    assert!(sink.seen().is_empty(), "the sink was reached");
}

/// Finding 5, the hops: a loop through two spoolds (which no address
/// check sees: each is the other's ordinary destination) ends after
/// `Spooler-Hops` reaches its bound, with `508 loop_detected`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_through_two_spoolds_ends_at_the_hop_bound() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = common::process::start(a_dir.path()).await;
    let b = common::process::start(b_dir.path()).await;
    let fast = serde_json::json!({"initialSeconds": 0.05, "multiplier": 1.0, "maxSeconds": 0.05, "jitter": 0.0});
    for (from, to) in [(&a, &b), (&b, &a)] {
        let made = from
            .api()
            .put_queue(
                "relay",
                serde_json::json!({
                    "destination": format!("{}/v1/events", to.base),
                    "events": ["loop.>"],
                    "maxRetries": 0,
                    "backoff": fast,
                }),
            )
            .await;
        assert_eq!(made.status(), 201);
    }
    // Each delivery carries the event as a raw body: the receiving spoold
    // takes its type from Spooler-Event-Type, which a delivery sends.
    let published = a
        .api()
        .req(Method::POST, "/v1/events")
        .header("Spooler-Event-Type", "loop.ping")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(published.status(), 202);
    // The loop runs until the hop bound, then the last delivery fails.
    let failed = common::eventually("the loop to end", Duration::from_secs(30), async || {
        for spoold in [&a, &b] {
            let q = spoold.api().get_json("/v1/queues/relay.failed").await;
            if q["stats"]["visible"].as_u64()? > 0 {
                return Some(
                    spoold
                        .api()
                        .get_json("/v1/queues/relay.failed/messages")
                        .await,
                );
            }
        }
        None
    })
    .await;
    let last = &failed["messages"][0];
    assert_eq!(last["lastStatus"], 508, "{failed}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut total = 0;
    for spoold in [&a, &b] {
        let q = spoold.api().get_json("/v1/queues/relay").await;
        total += q["stats"]["sentTotal"].as_u64().unwrap();
    }
    assert!(total <= 10, "{total} events went round");
}

/// Finding 6: tenant A published `order.created` with key k; tenant B's
/// `invoice.paid` with the same key was answered `200` with A's id and
/// stored nowhere. A key now belongs to its tenant, and a repeat that
/// says something else (another type or body) is `409
/// idempotency_key_reused`, not a silent dedup; a retry (the same event)
/// is still answered with the first one, also after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_key_belongs_to_its_tenant_and_to_one_event() {
    let dir = tempfile::tempdir().unwrap();
    let mut spoold = common::process::start(dir.path()).await;
    for (queue, events) in [("orders", "order.>"), ("invoices", "invoice.>")] {
        let made = spoold
            .api()
            .put_queue(queue, serde_json::json!({"events": [events]}))
            .await;
        assert_eq!(made.status(), 201);
    }
    let publish = async |spoold: &Spoold, tenant: &str, event_type: &str, body: &str| {
        let r = spoold
            .api()
            .req(Method::POST, "/v1/events")
            .header("Idempotency-Key", "k")
            .json(
                &serde_json::json!({"type": event_type, "tenant": tenant, "payload": {"b": body}}),
            )
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json::<serde_json::Value>().await.unwrap())
    };
    let (status, a) = publish(&spoold, "tenant-a", "order.created", "1").await;
    assert_eq!(status, 202, "{a}");
    let (status, b) = publish(&spoold, "tenant-b", "invoice.paid", "2").await;
    assert_eq!(status, 202, "another tenant's event with the same key: {b}");
    assert_ne!(a["id"], b["id"]);
    let invoices = spoold.api().get_json("/v1/queues/invoices").await;
    assert_eq!(
        invoices["stats"]["visible"], 1,
        "B's event is stored: {invoices}"
    );

    let (status, again) = publish(&spoold, "tenant-a", "order.created", "1").await;
    assert_eq!(status, 200, "a retry: {again}");
    assert_eq!(again["id"], a["id"]);
    for (event_type, body) in [("order.created", "changed"), ("order.cancelled", "1")] {
        let (status, reused) = publish(&spoold, "tenant-a", event_type, body).await;
        assert_eq!(status, 409, "{event_type} {body}: {reused}");
        assert_eq!(reused["kind"], "idempotency_key_reused");
    }
    assert_eq!(spoold.stop(), 0);
    let spoold = common::process::start(dir.path()).await;
    let (status, _) = publish(&spoold, "tenant-a", "order.created", "changed").await;
    assert_eq!(status, 409, "the fingerprint survives a restart");
    let (status, again) = publish(&spoold, "tenant-b", "invoice.paid", "2").await;
    assert_eq!((status, &again["id"]), (200, &b["id"]));
}

/// Finding 7: after SIGHUP removed an API key, new requests with it got
/// `401`, but an open `tail` kept receiving every later message and a
/// pending long poll still leased. Both end now: the tail's stream closes
/// and the long poll answers `401` without leasing, so the message stays
/// for the keys still in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_revokes_a_key_ends_its_streams_and_polls() {
    use common::api::Api;
    use common::process::{start_command, write_config};
    const OLD: &str = "revoked-key-0123456789";
    const KEPT: &str = "kept-key-0123456789";
    let dir = tempfile::tempdir().unwrap();
    let keys = |keys: &[&str]| format!("api_keys = {keys:?}");
    let config = write_config(dir.path(), &keys(&[OLD, KEPT]), "", "[queues.q]\n");
    let spoold = start_command(
        std::process::Command::new(common::process::bin())
            .args(["run", "--config"])
            .arg(&config),
    )
    .await;
    let old = Api::new(spoold.base.clone(), Some(OLD.into()));
    let kept = Api::new(spoold.base.clone(), Some(KEPT.into()));

    let mut tail = old.get("/v1/queues/q/tail").send().await.unwrap();
    assert_eq!(tail.status(), 200);
    let poll = tokio::spawn({
        let request = old.req(Method::POST, "/v1/queues/q/receive?wait=20");
        async move { request.send().await.unwrap() }
    });
    kept.send_id("q", "before").await;
    let first = tokio::time::timeout(Duration::from_secs(5), tail.chunk())
        .await
        .expect("the tail's first line")
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&first).contains("before"));
    // The long poll took "before"; the next one waits.
    let leased = poll.await.unwrap();
    assert_eq!(leased.status(), 200);
    let poll = tokio::spawn({
        let request = old.req(Method::POST, "/v1/queues/q/receive?wait=20");
        async move { request.send().await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    write_config(dir.path(), &keys(&[KEPT]), "", "[queues.q]\n");
    spoold.signal("-HUP");
    spoold.log_with("SIGHUP: config reloaded").await;
    let answered = tokio::time::timeout(Duration::from_secs(5), poll)
        .await
        .expect("the long poll ends at the reload")
        .unwrap();
    assert_eq!(answered.status(), 401);
    let ended = tokio::time::timeout(Duration::from_secs(5), tail.chunk())
        .await
        .expect("the tail ends at the reload");
    assert!(matches!(ended, Ok(None)), "{ended:?}");

    kept.send_id("q", "after").await;
    let q = kept.get_json("/v1/queues/q").await;
    assert_eq!(q["stats"]["visible"], 1, "nothing leased it: {q}");
}

/// Finding 8: a config file cut after a queue's `destination` was taken
/// by SIGHUP; the queue lost its `signing_secret` and `Authorization`
/// header, and its next delivery went out unsigned. A reload now reads the
/// file once it stopped changing, and refuses one that drops a secret or a
/// static header unless the queue says `unsigned = true`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_never_takes_a_half_written_file() {
    use common::process::{start_command, write_config};
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let (sink, url) = common::sink::Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let head = format!("[queues.hooks]\ndestination = \"{url}/in\"\n");
    let whole = |max_retries: u32| {
        format!(
            "{head}max_retries = {max_retries}\nsigning_secret = \"{SECRET}\"\n\
             headers = {{ Authorization = \"Bearer t0k3n\" }}\n"
        )
    };
    let config = write_config(dir.path(), "", "", &whole(3));
    let spoold = start_command(
        std::process::Command::new(common::process::bin())
            .args(["run", "--config"])
            .arg(&config),
    )
    .await;
    let api = spoold.api();
    let delivered_signed = async |n: usize, body: &str| {
        api.send_id("hooks", body).await;
        let seen = sink.wait_for(n).await;
        let last = &seen[n - 1];
        (
            last.headers.contains_key("webhook-signature"),
            last.headers.get("authorization").is_some(),
        )
    };
    assert_eq!(delivered_signed(1, "first").await, (true, true));

    // Cut after the destination: refused, and deliveries stay signed.
    write_config(dir.path(), "", "", &head);
    spoold.signal("-HUP");
    let log = spoold.log_with("SIGHUP: config refused").await;
    assert!(log.contains("signing_secret"), "{log}");
    assert_eq!(delivered_signed(2, "second").await, (true, true));

    // Caught mid-write: the reload waits for the file to settle and takes
    // the whole of it.
    write_config(dir.path(), "", "", &head);
    spoold.signal("-HUP");
    tokio::time::sleep(Duration::from_millis(50)).await;
    write_config(dir.path(), "", "", &whole(5));
    spoold.log_with("SIGHUP: config reloaded").await;
    let q = api.get_json("/v1/queues/hooks").await;
    assert_eq!(q["settings"]["maxRetries"], 5, "{q}");
    assert_eq!(delivered_signed(3, "third").await, (true, true));

    // Said explicitly: taken, and the log says what it changed.
    write_config(dir.path(), "", "", &format!("{head}unsigned = true\n"));
    spoold.signal("-HUP");
    let log = spoold.log_with("signing secret removed").await;
    assert!(log.contains("static headers removed"), "{log}");
    assert!(!log.contains(SECRET), "a secret in the log");
    assert_eq!(delivered_signed(4, "fourth").await, (false, false));
}

/// Finding 10: the per-address cap was keyed by address, so connections
/// from 127.0.0.2 and 127.0.0.3 took every slot between them; each sent
/// one byte and stalled, and held its slot until the header timeout: a
/// keyed send waited 7 to 9 s. Every loopback address is one client now,
/// and a connection takes a slot only once its first request's head is
/// in: stalled ones take none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_connections_from_many_loopback_addresses_hold_no_slot() {
    use tokio::io::AsyncWriteExt;
    let _ = rlimit::increase_nofile_limit(20_000);
    let dir = tempfile::tempdir().unwrap();
    let spoold =
        common::process::start_with(dir.path(), "", "[queues.q]\ndedup_window = \"1h\"\n").await;
    let to = spoold.api().addr().to_owned();
    const STALLED: usize = 4200;
    let mut stalled = Vec::with_capacity(STALLED);
    for i in 0..STALLED {
        let from = if i % 2 == 0 { "127.0.0.2" } else { "127.0.0.3" };
        let mut s = common::raw::connect(&to, Some(from)).await.unwrap();
        s.write_all(b"P").await.unwrap();
        stalled.push(s);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    let sent = spoold
        .api()
        .req(Method::POST, "/v1/queues/q/messages")
        .header("Idempotency-Key", "k1")
        .body("keyed")
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    eprintln!("a keyed send beside {STALLED} stalled connections took {took:?}");
    assert_eq!(sent.status(), 201);
    assert!(took < Duration::from_secs(2), "{took:?}");
    drop(stalled);
}

/// Finding 11: any key holder created 10 002 queues in about 9 s, with no
/// bound. `server.max_queues` bounds them (the file's queues count;
/// failure queues do not): past it a create is `409 queue_limit_reached`
/// and counted, a change to an existing queue is not refused, and a
/// deleted queue frees its place. A file with more queues than the bound
/// is refused, naming the key and its line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_count_has_a_bound() {
    let dir = tempfile::tempdir().unwrap();
    let spoold =
        common::process::start_with(dir.path(), "max_queues = 4", "[queues.from-file]\n").await;
    let api = spoold.api();
    for i in 0..3 {
        assert_eq!(
            api.put_queue(&format!("q{i}"), serde_json::json!({}))
                .await
                .status(),
            201
        );
    }
    let refused = api.put_queue("q3", serde_json::json!({})).await;
    assert_eq!(refused.status(), 409);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["kind"], "queue_limit_reached", "{body}");
    assert_eq!(
        api.put_queue("q0", serde_json::json!({"maxRetries": 2}))
            .await
            .status(),
        200,
        "a change is not a create"
    );
    assert_eq!(api.status(Method::DELETE, "/v1/queues/q1").await, 204);
    assert_eq!(
        api.put_queue("q3", serde_json::json!({})).await.status(),
        201
    );
    let metrics = api.text("/metrics").await;
    assert!(metrics.contains("spoold_limit_reached_total{limit=\"queues\"}"));

    let config =
        common::process::write_config(dir.path(), "max_queues = 1", "", "[queues.a]\n[queues.b]\n");
    let ran = common::process::run_in(
        config.parent().unwrap(),
        &["check-config", "--config", config.to_str().unwrap()],
    );
    assert_ne!(ran.code, 0);
    assert!(
        ran.stderr.contains("server.max_queues") && ran.stderr.contains("line 3"),
        "{}",
        ran.stderr
    );
}

/// Found while measuring repair past 4 GiB: a receive of 100 messages of
/// 1 MiB read every payload and built its JSON at once (270 MiB resident
/// for one request, more with several consumers). A lease batch ends once
/// its records pass 4 MiB, as a peek page does, with at least one message
/// however large; the rest stay visible for the next receive, and every
/// message is received once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_batch_has_a_byte_bound() {
    const MESSAGES: usize = 12;
    let dir = tempfile::tempdir().unwrap();
    let spoold = common::process::start_with(dir.path(), "max_body_bytes = \"2MiB\"", "").await;
    fill(&spoold, "big", MESSAGES, &"x".repeat(1 << 20)).await;
    let api = spoold.api();
    let mut batches = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    while ids.len() < MESSAGES {
        let got: serde_json::Value = api
            .receive("big", "-batch?max=100&wait=0")
            .await
            .json()
            .await
            .unwrap();
        let messages = got["messages"].as_array().unwrap();
        assert!(!messages.is_empty(), "visible messages left unreceived");
        batches.push(messages.len());
        for m in messages {
            assert!(
                ids.insert(m["id"].as_str().unwrap().to_owned()),
                "received twice"
            );
        }
    }
    assert!(batches.iter().all(|&n| n <= 4), "{batches:?}");
    let metrics = api.text("/metrics").await;
    assert!(metrics.contains("spoold_limit_reached_total{limit=\"lease_bytes\"}"));
}

/// Finding 12: moving a push queue's destination to another origin (`spoold
/// queue set … destination=…`, or a PATCH) dropped its signing secret and
/// static headers with only a warning, and its deliveries went out
/// unsigned from then on. The move is refused, `409 secrets_would_move`,
/// unless the request sends the secret again or says `keepSecrets=true`
/// (which keeps the signing secret, never the headers); and a push queue
/// without a secret says `unsigned` in its stats and in `spoold queues`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_a_destination_never_drops_its_secret_in_silence() {
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let dir = tempfile::tempdir().unwrap();
    let spoold = common::process::start(dir.path()).await;
    let api = spoold.api();
    let made = api
        .put_queue(
            "cus_42-hooks",
            serde_json::json!({
                "destination": "http://127.0.0.1:9/a",
                "signingSecret": SECRET,
                "headers": {"Authorization": "Bearer t0k3n"},
            }),
        )
        .await;
    assert_eq!(made.status(), 201);
    let patch = |query: &'static str, body: serde_json::Value| {
        api.req(Method::PATCH, &format!("/v1/queues/cus_42-hooks{query}"))
            .header("Content-Type", "application/merge-patch+json")
            .body(body.to_string())
            .send()
    };
    let moved = serde_json::json!({"destination": "http://127.0.0.2:9/b"});
    let refused = patch("", moved.clone()).await.unwrap();
    assert_eq!(refused.status(), 409);
    let said: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(said["kind"], "secrets_would_move", "{said}");
    let q = api.get_json("/v1/queues/cus_42-hooks").await;
    assert_eq!(
        q["settings"]["destination"], "http://127.0.0.1:9/a",
        "unchanged"
    );

    // The CLI says the same, and --keep-secrets moves it with the secret.
    let base = spoold.base.clone();
    let ran = common::process::cli(
        &base,
        &[
            "queue",
            "set",
            "cus_42-hooks",
            "destination=http://127.0.0.2:9/b",
        ],
    )
    .await;
    assert_eq!(ran.code, 1, "{}{}", ran.stdout, ran.stderr);
    assert!(ran.stderr.contains("keepSecrets"), "{}", ran.stderr);
    let ran = common::process::cli(
        &base,
        &[
            "queue",
            "set",
            "cus_42-hooks",
            "destination=http://127.0.0.2:9/b",
            "--keep-secrets",
        ],
    )
    .await;
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    assert!(
        ran.stdout.contains("headers.Authorization"),
        "{}",
        ran.stdout
    );
    let q = api.get_json("/v1/queues/cus_42-hooks").await;
    assert_eq!(q["settings"]["signingSecretSet"], true, "{q}");
    assert_eq!(q["settings"]["headers"], serde_json::json!({}), "{q}");
    assert_eq!(q["stats"]["unsigned"], false, "{q}");

    // Sent again in clear: taken without the flag.
    let again = patch(
        "",
        serde_json::json!({"destination": "http://127.0.0.3:9/c", "signingSecret": SECRET}),
    )
    .await
    .unwrap();
    assert_eq!(again.status(), 200);

    // A push queue without a secret says so.
    let made = api
        .put_queue(
            "plain",
            serde_json::json!({"destination": "http://127.0.0.1:9/p"}),
        )
        .await;
    assert_eq!(made.status(), 201);
    let q = api.get_json("/v1/queues/plain").await;
    assert_eq!(q["stats"]["unsigned"], true, "{q}");
    let listed = common::process::cli(&base, &["queues"]).await;
    let line = listed
        .stdout
        .lines()
        .find(|l| l.contains("plain"))
        .unwrap_or_default()
        .to_owned();
    assert!(line.contains("push, unsigned"), "{}", listed.stdout);
}
