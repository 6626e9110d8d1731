//! The web console in a real headless browser: `tests/console/console.mjs`
//! drives Chromium through Playwright against a server whose push queue
//! failed five times (500, 500, 404, 503, 500); this test checks what the
//! browser saw and, over the API, that exactly the redriven selection
//! moved and exactly the filtered dead letters were deleted. It needs node, Debian's `chromium` and `playwright-core` from npm
//! (`.ci/run` installs them; `PLAYWRIGHT_NODE_PATH` says where, by default
//! `~/.cache/spoold-console/node_modules`).

use crate::common;

use std::collections::BTreeSet;
use std::process::Command;

use crate::common::server::Server;
use crate::common::sink::Sink;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn failed_ids(server: &Server) -> BTreeSet<String> {
    server
        .message_ids("hooks.failed", "")
        .await
        .into_iter()
        .collect()
}

/// Runs `tests/console/{script}` in node against `server` (whose key is
/// `console-key`) and returns what it printed: one JSON object.
async fn browse(server: &Server, script: &str) -> Value {
    browse_url(&format!("http://{}", server.addr()), script).await
}

/// [`browse`] of the spoold at `url`.
async fn browse_url(url: &str, script: &str) -> Value {
    browse_with(url, script, &[]).await
}

/// [`browse_url`] with more variables for the script.
async fn browse_with(url: &str, script: &str, vars: &[(&str, String)]) -> Value {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut node = Command::new("node");
    node.arg(format!("{root}/tests/console/{script}"))
        .env("SPOOLD_URL", url)
        .env("SPOOLD_API_KEY", "console-key")
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())));
    // Where playwright-core is (`.ci/run` installs it there).
    let modules = std::env::var("PLAYWRIGHT_NODE_PATH").unwrap_or_else(|_| {
        format!(
            "{}/.cache/spoold-console/node_modules",
            std::env::var("HOME").unwrap_or_default()
        )
    });
    node.env("NODE_PATH", modules);
    // `CONSOLE_SCREENSHOTS=docs/console` refreshes the pictures of the
    // docs (`PORTAL_SCREENSHOTS=docs/portal`, the portal's).
    let shots = if script == "portal.mjs" {
        "PORTAL_SCREENSHOTS"
    } else {
        "CONSOLE_SCREENSHOTS"
    };
    if let Ok(dir) = std::env::var(shots) {
        node.env("SCREENSHOTS", format!("{root}/{dir}"));
    }
    let out = tokio::task::spawn_blocking(move || node.output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs node, chromium and playwright-core (.ci/run installs them)"]
async fn the_console_filters_shows_and_redrives_a_selection() {
    let (sink, dest) = Sink::start().await;
    sink.script([500, 500, 404, 503, 500].map(|s| (s, Vec::new())));
    let server = Server::temp("api_keys = [\"console-key\"]").await;
    server
        .queue(
            "hooks",
            json!({"destination": dest, "concurrency": 1, "maxRetries": 0}),
        )
        .await;
    for i in 0..5 {
        let r = server.forward("hooks", "/in", &format!("event {i}")).await;
        assert_eq!(r.status(), StatusCode::ACCEPTED);
    }
    common::wait_until("five dead letters", async || {
        failed_ids(&server).await.len() == 5
    })
    .await;
    let before = failed_ids(&server).await;
    // The console's files are public; the API behind it is not.
    assert_eq!(
        server.bare(Method::GET, "/ui").await.status(),
        StatusCode::OK
    );
    assert_eq!(
        server.bare(Method::GET, "/v1/queues").await.status(),
        StatusCode::UNAUTHORIZED
    );

    let seen = browse(&server, "console.mjs").await;
    assert_eq!(seen["pageErrors"], Value::Null, "{seen}");
    assert_eq!(seen["loginShown"], true);
    assert!(
        seen["wrongKeyMessage"]
            .as_str()
            .unwrap()
            .contains("refused"),
        "{seen}"
    );
    assert_eq!(seen["keyInUrl"], false);
    assert_eq!(seen["queues"], json!(["hooks", "hooks.failed"]));
    let filtered: Vec<&str> = seen["filtered"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(filtered.len(), 3, "three failed with 500: {seen}");
    let detail = seen["detail"].as_str().unwrap();
    for want in ["HTTP 500", "sink says hi", "retries_exhausted", "POST /in"] {
        assert!(detail.contains(want), "{want}: {detail}");
    }
    assert_eq!(
        seen["dialogs"],
        json!(["Move the 2 selected message(s) back to hooks?"]),
        "{seen}"
    );
    assert!(
        seen["status"].as_str().unwrap().starts_with("moved 2 of 2"),
        "{seen}"
    );

    // Exactly the selection moved, over the API too.
    let redriven: BTreeSet<String> = seen["redriven"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(redriven.len(), 2);
    // (and, below, exactly the deleted one left).
    let deleted: BTreeSet<String> = seen["permanent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let after = failed_ids(&server).await;
    let expected: BTreeSet<String> = before
        .difference(&redriven)
        .filter(|id| !deleted.contains(*id))
        .cloned()
        .collect();
    assert_eq!(after, expected);
    let left: BTreeSet<String> = seen["left"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(left.len(), 1, "one 500 left on the filtered page: {seen}");
    assert!(!seen["tailed"].as_array().unwrap().is_empty(), "{seen}");

    // Everything matching `reason = permanent_status` (the 404) deleted.
    assert_eq!(deleted.len(), 1, "{seen}");
    assert!(deleted.is_disjoint(&redriven));
    assert_eq!(
        seen["deleteDialog"],
        "Delete 1 of 1 message(s) matching reason permanent_status?"
    );
    assert!(
        seen["deleteStatus"]
            .as_str()
            .unwrap()
            .starts_with("deleted 1 of 1"),
        "{seen}"
    );
    assert_eq!(after.len(), 2);

    // Paused, then resumed, from the list.
    assert_eq!(seen["pausedPill"], "paused");
    assert_eq!(seen["resumedPill"], "running");
    let stats = server.get_json("/v1/queues/hooks").await["stats"].clone();
    assert_eq!(stats["paused"], false, "{stats}");
    server.stop().await;
}

/// Webhooks to customers in the console: an event published from the
/// queue list reaches its subscribers; a queue's messages are searched by
/// event type and by a JSON path; an endpoint's delivery history is
/// filtered by tenant, shows one delivery with its attempts, and resends
/// it (the destination gets a new delivery saying what it repeats).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs node, chromium and playwright-core (.ci/run installs them)"]
async fn the_console_publishes_searches_and_resends_from_history() {
    let (sink, dest) = Sink::start().await;
    let server = Server::temp("api_keys = [\"console-key\"]").await;
    server.queue("audit", json!({"events": [">"]})).await;
    server
        .queue(
            "cus-1",
            json!({"destination": dest, "events": ["invoice.*"], "tenant": "cus_1",
                "historyRetentionSeconds": 3600}),
        )
        .await;
    server
        .queue("cus-2", json!({"destination": dest, "events": ["order.*"]}))
        .await;
    // Nothing listens there: each delivery fails at once.
    server
        .queue(
            "dead",
            json!({"destination": "http://127.0.0.1:9/", "events": ["order.*"], "maxRetries": 0}),
        )
        .await;
    let mut audit = Vec::new();
    for (event_type, tenant, amount) in [
        ("invoice.paid", "cus_1", 10),
        ("order.created", "cus_2", 5),
        ("order.created", "cus_3", 7),
    ] {
        let r = server
            .req(Method::POST, "/v1/events")
            .json(&json!({"type": event_type, "tenant": tenant, "payload": {"amount": amount}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED);
        let answer: Value = r.json().await.unwrap();
        let to_audit = answer["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["queue"] == "audit")
            .unwrap()["id"]
            .clone();
        audit.push(to_audit);
    }
    sink.wait_for(3).await;

    let seen = browse(&server, "events.mjs").await;
    assert_eq!(seen["pageErrors"], Value::Null, "{seen}");
    assert_eq!(seen["subscriptions"]["audit"], ">", "{seen}");
    assert_eq!(
        seen["subscriptions"]["cus-1"], "invoice.* (tenant cus_1)",
        "{seen}"
    );
    let published = seen["published"].as_str().unwrap();
    assert!(
        published.ends_with(": 2 deliveries to audit, cus-1"),
        "{published}"
    );
    assert_eq!(seen["all"].as_array().unwrap().len(), 4, "{seen}");
    assert_eq!(seen["byType"], json!([audit[1], audit[2]]), "{seen}");
    assert_eq!(
        seen["byTypeEvents"],
        json!(["order.created · cus_2", "order.created · cus_3"])
    );
    let by_path = server.message_ids("audit", "&match=$.amount=42").await;
    assert_eq!(by_path.len(), 1);
    assert_eq!(seen["byPath"], json!(by_path), "{seen}");
    assert!(
        seen["scannedNote"]
            .as_str()
            .unwrap()
            .contains("Looked at 4"),
        "{seen}"
    );

    // History: both deliveries to cus_1, the newest first.
    assert_eq!(seen["historyTenant"].as_array().unwrap().len(), 2, "{seen}");
    let detail = seen["historyDetail"].as_str().unwrap();
    for want in ["HTTP 200", "invoice.paid", "cus_1", "delivered"] {
        assert!(detail.contains(want), "{want}: {detail}");
    }
    let from = seen["resentFrom"].as_str().unwrap();
    let resent = seen["resent"].as_str().unwrap();
    assert_eq!(
        seen["resendDialog"],
        format!("Send {from} to cus-1 again, as a new delivery?")
    );
    // The destination got the resend: a new delivery id, what it repeats.
    let deliveries = sink.wait_for(5).await;
    let again = deliveries
        .iter()
        .find(|d| d.headers.get("spooler-resent-from").is_some())
        .expect("a resent delivery");
    assert_eq!(again.headers["spooler-resent-from"], from);
    assert_eq!(again.headers["spooler-delivery-id"], resent);
    assert_eq!(again.headers["spooler-tenant"], "cus_1");
    // The delivery log: both failures, then redriven since a time.
    assert_eq!(seen["deadStates"], json!(["failed", "failed"]), "{seen}");
    let dialog = seen["redriveDialog"].as_str().unwrap();
    assert!(
        dialog.starts_with("Move 2 of 2 message(s) matching since 19")
            || dialog.starts_with("Move 2 of 2 message(s) matching since 2000-01-01"),
        "{dialog}"
    );
    assert!(dialog.ends_with("back to dead?"), "{dialog}");
    assert!(
        seen["redriven"]
            .as_str()
            .unwrap()
            .starts_with("moved 2 of 2"),
        "{seen}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs node, chromium and playwright-core (.ci/run installs them)"]
async fn the_console_charts_rates_edits_settings_and_acts_on_messages() {
    let (sink, dest) = Sink::start().await;
    sink.script([(503, Vec::new())]);
    let server = Server::temp("api_keys = [\"console-key\"]").await;
    let hour = json!({"initialSeconds": 3600, "multiplier": 1, "maxSeconds": 3600, "jitter": 0});
    let secret = "whsec_Zmlyc3Qtc2VjcmV0LWtleS1ieXRlcw==";
    server
        .queue(
            "hooks",
            json!({"destination": dest, "backoff": hour, "signingSecret": secret}),
        )
        .await;
    server.queue("jobs", json!({"maxRetries": 0})).await;
    // A rotation: the old secret signs for a day, which the row says in UTC.
    let rotated = server.post_json("/v1/queues/hooks/secret/rotate").await;
    let until = rotated["previousExpiresAt"].as_str().unwrap();
    let until = format!("{} UTC", until[..19].replace('T', " "));
    // Activity for the charts; one dead letter; one message an hour away.
    for i in 0..20 {
        server.send("jobs", &format!("job {i}")).await;
    }
    for verb in ["ack", "ack", "nack"] {
        let token = server.lease("jobs").await;
        assert_eq!(server.settle("jobs", &token, verb).await.status(), 204);
    }
    let delayed = server
        .req(Method::POST, "/v1/queues/jobs/messages")
        .header("Spooler-Delay", "3600")
        .body("later")
        .send()
        .await
        .unwrap();
    assert_eq!(delayed.status(), StatusCode::CREATED);
    let delayed = delayed.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let waiting = server.send_id("hooks", "push me").await;
    sink.wait_for(1).await;
    common::wait_until("the push waits for its retry", async || {
        server
            .get_json(&format!("/v1/queues/hooks/messages/{waiting}"))
            .await["state"]
            == "delayed"
    })
    .await;
    let dead: BTreeSet<String> = server
        .message_ids("jobs.failed", "")
        .await
        .into_iter()
        .collect();
    assert_eq!(dead.len(), 1);

    // A browser far from UTC: the console still shows UTC.
    let url = format!("http://{}", server.addr());
    let seen = browse_with(&url, "dashboard.mjs", &[("TZ", "Pacific/Auckland".into())]).await;
    assert_eq!(seen["pageErrors"], Value::Null, "{seen}");
    assert_eq!(
        seen["secretPill"],
        format!("2 secrets sign · old one until {until}"),
        "{seen}"
    );
    assert_eq!(
        seen["lines"],
        json!(["enqueued", "delivered", "retried", "failed"])
    );
    // Counted since the server started: 22 sends, 2 acks, 1 failure.
    assert_eq!(seen["legend"]["enqueued"], 22, "{seen}");
    assert_eq!(seen["legend"]["delivered"], 2, "{seen}");
    assert_eq!(seen["legend"]["failed"], 1, "{seen}");
    assert_eq!(
        seen["order"],
        json!([
            ["hooks", false],
            ["hooks.failed", true],
            ["jobs", false],
            ["jobs.failed", true]
        ]),
        "failure queues under their queue"
    );
    assert_eq!(seen["filtered"], json!(["jobs", "jobs.failed"]), "{seen}");
    assert_eq!(seen["favicon"], "200 image/svg+xml");
    assert!(
        seen["destination"].as_str().unwrap().contains(&dest),
        "{seen}"
    );
    assert_eq!(seen["queueChart"], 4);
    // The settings were patched, and nothing else changed.
    let hooks = server.get_json("/v1/queues/hooks").await;
    assert_eq!(hooks["settings"]["maxRetries"], 3, "{hooks}");
    assert_eq!(hooks["settings"]["concurrency"], 2, "{hooks}");
    assert_eq!(
        hooks["settings"]["backoff"]["initialSeconds"], 3600.0,
        "{hooks}"
    );
    // Retried now: delivered long before its hour.
    assert_eq!(seen["retryRow"], waiting.as_str());
    let arrived = sink.wait_for(2).await;
    assert_eq!(
        arrived[1].headers["spooler-retry-count"], "1",
        "the count is kept"
    );
    // The delayed message deleted; the dead letter back in its queue.
    assert_eq!(seen["deleted"], delayed.as_str());
    let jobs: BTreeSet<String> = server.message_ids("jobs", "").await.into_iter().collect();
    assert!(!jobs.contains(&delayed));
    assert!(dead.is_subset(&jobs), "redriven: {seen}");
    assert!(server.message_ids("jobs.failed", "").await.is_empty());
    assert_eq!(seen["beside"], true, "the detail beside the list: {seen}");
    let detail = seen["detailText"].as_str().unwrap();
    assert!(detail.contains(" UTC"), "{detail}");
    assert!(
        seen["dialogs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d.as_str().unwrap().starts_with("Move ")),
        "{seen}"
    );
    assert!(seen["cluster"].as_str().unwrap().contains("single node"));
    // On a phone: every column there, the page no wider than the screen.
    assert_eq!(seen["phone"]["hiddenCells"], 0, "{seen}");
    assert_eq!(seen["phone"]["columns"], 12, "{seen}");
    assert!(
        seen["phone"]["pageWidth"].as_u64().unwrap() <= 390,
        "{seen}"
    );
    assert_eq!(seen["phoneDetail"], "fixed", "{seen}");
}

/// The cluster page on a three-replica spool's primary: every member, its
/// role and how far it is behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs node, chromium and playwright-core (.ci/run installs them)"]
async fn the_console_shows_the_cluster() {
    let mut cluster = common::cluster::TestCluster::new(3, "", "[queues.jobs]\n");
    cluster.start_all().await;
    let primary = cluster.primary(std::time::Duration::from_secs(10)).await;
    let base = cluster.replicas[primary].base();
    let api = common::api::Api::new(base.clone(), None);
    for i in 0..5 {
        api.send_id("jobs", &format!("m{i}")).await;
    }
    let seen = browse_url(&base, "cluster.mjs").await;
    assert_eq!(seen["pageErrors"], Value::Null, "{seen}");
    let members = seen["members"].as_array().unwrap();
    let roles: Vec<&str> = members.iter().map(|m| m[2].as_str().unwrap()).collect();
    assert_eq!(
        roles.iter().filter(|r| r.starts_with("primary")).count(),
        1,
        "{seen}"
    );
    assert_eq!(
        roles.iter().filter(|r| r.starts_with("follower")).count(),
        2,
        "{seen}"
    );
    assert!(
        roles.iter().any(|r| r.ends_with("(this replica)")),
        "{seen}"
    );
    for m in members {
        // Match index, lag and last contact: the primary knows each.
        assert!(m[4].as_str().unwrap().parse::<u64>().unwrap() > 0, "{seen}");
        assert!(m[5].as_str().unwrap().parse::<u64>().is_ok(), "{seen}");
        assert!(m[6].as_str().unwrap().ends_with("s ago"), "{seen}");
    }
    assert!(
        seen["facts"]["this replica"]
            .as_str()
            .unwrap()
            .contains("primary")
    );
    assert_eq!(seen["facts"]["receiving a snapshot"], "no");
}

/// Issue 41's portal in Chromium, at desktop and phone sizes: tenant A's
/// link lists A's endpoint only, adds one whose secret it shows once,
/// sends it a test event (signed with that secret, at the sink), resends
/// the delivery from the log, shows the catalogue, and says so for an
/// expired or altered link. Neither the pages nor the token used against
/// the API show tenant B's endpoints or deliveries; the token is `401`
/// once it ended or was altered; a cross-site call with it is refused;
/// only the listed origin may frame the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs node, chromium and playwright-core (.ci/run installs them)"]
async fn the_portal_shows_one_tenant_and_delivers_its_test_event() {
    let (sink, dest) = Sink::start().await;
    let server = Server::temp(
        "api_keys = [\"console-key\"]\n\
         [events]\nhistory_retention = \"1h\"\n\
         [portal]\nsecret = \"portal-secret-0123456789\"\n\
         frame_ancestors = [\"https://app.example.com\"]\n\
         theme = { accent = \"#0a7d4f\" }\n",
    )
    .await;
    let r = server
        .req(Method::PUT, "/v1/event-types/invoice.paid")
        .json(
            &json!({"description": "An invoice was paid", "example": {"amount": 42},
            "schema": {"type": "object", "required": ["amount"]}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    for (name, tenant) in [("cus_a-seeded", "cus_a"), ("cus_b-private", "cus_b")] {
        server
            .queue(
                name,
                json!({"destination": format!("{dest}/{name}"), "events": ["invoice.*"], "tenant": tenant}),
            )
            .await;
    }
    let r = server
        .req(Method::POST, "/v1/events")
        .json(&json!({"type": "invoice.paid", "tenant": "cus_b", "payload": {"amount": 1, "note": "secret-of-b"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    sink.wait_for(1).await;

    let session = |body: Value| {
        server
            .req(Method::POST, "/v1/portal/sessions")
            .json(&body)
            .send()
    };
    let a: Value = session(json!({"tenant": "cus_a", "queues": ["cus_a-*"]}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let link = a["url"].as_str().unwrap().to_owned();
    let token = a["token"].as_str().unwrap().to_owned();
    let short: Value = session(json!({"tenant": "cus_a", "ttlSeconds": 1}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut altered = token.clone().into_bytes();
    let i = altered.len() - 5;
    altered[i] = if altered[i] == b'x' { b'y' } else { b'x' };
    let altered = String::from_utf8(altered).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;

    let url = format!("http://{}", server.addr());
    let seen = browse_with(
        &url,
        "portal.mjs",
        &[
            ("PORTAL_LINK", link.clone()),
            ("EXPIRED_LINK", short["url"].as_str().unwrap().to_owned()),
            ("ALTERED_LINK", link.replace(&token, &altered)),
            ("SINK_URL", dest.clone()),
        ],
    )
    .await;
    assert_eq!(seen["error"], Value::Null, "{seen}");
    assert_eq!(seen["pageErrors"], Value::Null, "{seen}");
    assert_eq!(seen["hashAfter"], "#/", "the token leaves the address bar");
    assert_eq!(seen["tenant"], "cus_a");
    assert_eq!(seen["listed"], json!(["cus_a-seeded"]), "{seen}");
    for text in seen["texts"].as_array().unwrap() {
        let text = text.as_str().unwrap();
        assert!(
            !text.contains("cus_b") && !text.contains("secret-of-b"),
            "{text}"
        );
    }
    let added = seen["added"].as_str().unwrap();
    assert!(added.starts_with("cus_a-"), "{added}");
    let secret = seen["secret"].as_str().unwrap();
    assert!(secret.starts_with("whsec_"), "{secret}");
    assert!(seen["resent"].as_str().unwrap().contains("sent again as"));
    assert_eq!(seen["attempt"], "200");
    assert!(seen["example"].as_str().unwrap().contains("42"));
    assert_eq!(
        (&seen["phoneFits"], &seen["phoneEndpointFits"]),
        (&json!(true), &json!(true))
    );
    for name in ["expired", "altered"] {
        assert_eq!(
            seen[name], "This link has expired or is not valid",
            "{name}"
        );
    }

    // At the sink: the test event and its resend, each signed with the
    // secret the page showed.
    let hooks: Vec<_> = sink
        .seen()
        .into_iter()
        .filter(|s| s.uri == "/hook-a")
        .collect();
    assert_eq!(hooks.len(), 2, "the test event and its resend");
    for hook in &hooks {
        assert_eq!(common::signed_by(hook, &[secret]), [0]);
        let body: Value = serde_json::from_slice(&hook.body).unwrap();
        assert_eq!(body["data"], json!({"amount": 42}));
    }

    // The token against the API: tenant A only, 401 once ended or altered,
    // refused cross-site.
    let client = reqwest::Client::new();
    let call = |method: Method, path: &str, token: &str| {
        client
            .request(method, format!("{url}{path}"))
            .bearer_auth(token)
            .send()
    };
    let listed: Value = call(Method::GET, "/v1/queues", &token)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = listed["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["name"].as_str().unwrap())
        .collect();
    assert!(names.iter().all(|n| n.starts_with("cus_a-")), "{names:?}");
    for path in [
        "/v1/queues/cus_b-private",
        "/v1/queues/cus_b-private/deliveries",
    ] {
        assert_eq!(
            call(Method::GET, path, &token).await.unwrap().status(),
            404,
            "{path}"
        );
    }
    assert_eq!(
        call(Method::GET, "/v1/rates", &token)
            .await
            .unwrap()
            .status(),
        403
    );
    assert_eq!(
        call(Method::POST, "/v1/portal/sessions", &token)
            .await
            .unwrap()
            .status(),
        403
    );
    let ended = short["token"].as_str().unwrap();
    assert_eq!(
        call(Method::GET, "/v1/queues", ended)
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        call(Method::GET, "/v1/queues", &altered)
            .await
            .unwrap()
            .status(),
        401
    );
    let forged = client
        .post(format!("{url}/v1/queues/cus_a-seeded/pause"))
        .bearer_auth(&token)
        .header("Sec-Fetch-Site", "cross-site")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 403, "a cross-site call is refused");
    let page = client
        .get(format!("{url}/portal/"))
        .header("Sec-Fetch-Site", "cross-site")
        .header("Sec-Fetch-Dest", "iframe")
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200, "the page opens from another site");
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.contains("frame-ancestors 'self' https://app.example.com"),
        "{csp}"
    );
    assert!(csp.contains("script-src 'self'"), "{csp}");
    let theme = server.text("/portal/theme.css").await;
    assert!(theme.contains("--accent: #0a7d4f;"), "{theme}");
}
