//! Issue 41: scoped API keys, against the binary. A tenant's key sees,
//! makes and changes only its tenant's push queues under its patterns; a
//! queue outside them is answered as one that does not exist; a role that
//! lacks a verb gets `403`; the operator's routes need a bare key; a reload
//! that narrows a key ends what it opened; no key is ever logged.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common;
use common::api::Api;
use common::process::{start_config, write_config};

const ADMIN: &str = "admin-key-0123456789";
const A: &str = "tenant-a-key-0123456789";
const B: &str = "tenant-b-key-0123456789";
const A_READER: &str = "tenant-a-reader-0123456789";
const PUBLISHER: &str = "publisher-key-0123456789";
const CONSUMER: &str = "consumer-key-0123456789";

/// `[server]` keys: the six keys above, tenant a's with `a_role`.
fn keys(a_role: &str) -> String {
    format!(
        "api_keys = [\"{ADMIN}\",\n\
         {{ key = \"{A}\", role = \"{a_role}\", tenant = \"cus_a\", queues = [\"cus_a-*\"] }},\n\
         {{ key = \"{B}\", tenant = \"cus_b\", queues = [\"cus_b-*\"] }},\n\
         {{ key = \"{A_READER}\", role = \"reader\", tenant = \"cus_a\" }},\n\
         {{ key = \"{PUBLISHER}\", role = \"publisher\" }},\n\
         {{ sha256 = \"{}\", role = \"consumer\", queues = [\"work\"] }}]",
        sha256_hex(CONSUMER)
    )
}

fn sha256_hex(key: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The config's own queues: a pull queue, and a push queue of tenant a that
/// only an operator may touch.
const TABLES: &str = "[queues.work]\n\
    [queues.cus_a-managed]\ndestination = \"http://127.0.0.1:9/hook\"\ntenant = \"cus_a\"\n";

async fn body(r: reqwest::Response) -> (StatusCode, Value) {
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn hook(tenant: Option<&str>) -> Value {
    let mut v = json!({"destination": "http://127.0.0.1:9/hook", "events": ["invoice.*"]});
    if let Some(t) = tenant {
        v["tenant"] = json!(t);
    }
    v
}

fn names(list: &Value) -> Vec<String> {
    list["queues"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .map(|q| q["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_keys_keep_to_their_tenant_patterns_and_verbs() {
    let dir = tempfile::tempdir().unwrap();
    let spoold = start_config(dir.path(), &keys("admin"), "", TABLES).await;
    let api = |key: &str| Api::new(spoold.base.clone(), Some(key.into()));
    let (admin, a, b) = (api(ADMIN), api(A), api(B));

    // Tenant a makes a push queue: it is tenant a's without saying so.
    let (status, made) = body(a.put_queue("cus_a-1", hook(None)).await).await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["settings"]["tenant"], "cus_a");
    b.queue("cus_b-1", hook(None)).await;
    // Admin puts a queue of tenant b under a's pattern, and one of no tenant.
    admin.queue("cus_a-taken", hook(Some("cus_b"))).await;
    admin
        .queue(
            "audit",
            json!({"destination": "http://127.0.0.1:9/a", "events": [">"]}),
        )
        .await;

    // Outside a's scope is the very answer of a queue that does not exist,
    // for every route, a PUT on a taken name included.
    let absent = |name: &str| json!({"kind": "queue_not_found", "message": format!("queue {name} does not exist")});
    for name in [
        "cus_b-1",
        "cus_a-taken",
        "audit",
        "cus_a-managed",
        "work",
        "cus_a-nothing",
    ] {
        let failed = format!("{name}.failed");
        for (method, path, named) in [
            (Method::GET, format!("/v1/queues/{name}"), name),
            (Method::GET, format!("/v1/queues/{name}/history"), name),
            (
                Method::GET,
                format!("/v1/queues/{failed}/messages"),
                &failed,
            ),
            (Method::POST, format!("/v1/queues/{name}/pause"), name),
            (Method::DELETE, format!("/v1/queues/{name}"), name),
        ] {
            let (status, got) = body(a.call(method.clone(), &path).await).await;
            assert_eq!(
                (status, &got),
                (StatusCode::NOT_FOUND, &absent(named)),
                "{method} {path}"
            );
        }
    }
    let (status, got) = body(a.put_queue("cus_a-taken", hook(None)).await).await;
    assert_eq!(
        (status, got),
        (StatusCode::NOT_FOUND, absent("cus_a-taken"))
    );
    let (status, got) = body(a.put_queue("cus_b-2", hook(None)).await).await;
    assert_eq!((status, got), (StatusCode::NOT_FOUND, absent("cus_b-2")));
    assert_eq!(b.status(Method::GET, "/v1/queues/cus_b-1").await, 200);

    // Another tenant is not a tenant key's to set; nor is a file on the
    // server (no key's over the API).
    let (status, got) = body(a.put_queue("cus_a-2", hook(Some("cus_b"))).await).await;
    assert_eq!(status, 403, "{got}");
    let mut certs = hook(None);
    certs["caFile"] = json!("/etc/passwd");
    let (status, got) = body(a.put_queue("cus_a-2", certs).await).await;
    assert!(status.is_client_error(), "{status} {got}");
    let patched = a
        .req(Method::PATCH, "/v1/queues/cus_a-1")
        .header("Content-Type", "application/merge-patch+json")
        .body(r#"{"tenant": "cus_b"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(patched.status(), 403);
    // A pull queue has no tenant: a tenant's key cannot make one.
    let (status, got) = body(a.put_queue("cus_a-pull", json!({})).await).await;
    assert_eq!(status, 400, "{got}");

    // The list: a's own queues only, and the admin's everything.
    assert_eq!(
        names(&a.get_json("/v1/queues").await),
        ["cus_a-1", "cus_a-1.failed"]
    );
    let all = names(&admin.get_json("/v1/queues").await);
    for name in [
        "audit",
        "cus_a-1",
        "cus_a-taken",
        "cus_b-1",
        "work",
        "cus_a-managed",
    ] {
        assert!(all.contains(&name.to_owned()), "{name} in {all:?}");
    }

    // Events: a's are a's; another tenant's is refused; the answer names
    // only a's queues though the audit queue took a delivery too.
    let publish = |api: &Api, event: Value| api.req(Method::POST, "/v1/events").json(&event).send();
    let (status, got) = body(
        publish(&a, json!({"type": "invoice.paid", "payload": {}}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 202, "{got}");
    let reached: Vec<&str> = got["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["queue"].as_str().unwrap())
        .collect();
    assert_eq!(
        (reached, &got["matchedByType"]),
        (vec!["cus_a-1"], &json!(1))
    );
    assert_eq!(
        admin.get_json("/v1/queues/audit").await["stats"]["sentTotal"],
        1
    );
    let other = json!({"type": "invoice.paid", "tenant": "cus_b", "payload": {}});
    assert_eq!(publish(&a, other).await.unwrap().status(), 403);

    // Roles: a verb the key lacks is 403, whatever the queue.
    let reader = api(A_READER);
    assert_eq!(reader.status(Method::GET, "/v1/queues/cus_a-1").await, 200);
    assert_eq!(reader.send("cus_a-1", "x").await.status(), 403);
    assert_eq!(reader.put_queue("cus_a-1", hook(None)).await.status(), 403);
    assert_eq!(reader.status(Method::GET, "/v1/queues/cus_b-1").await, 404);
    let publisher = api(PUBLISHER);
    assert_eq!(publisher.send("work", "job").await.status(), 201);
    assert_eq!(publisher.status(Method::GET, "/v1/queues/work").await, 403);
    assert_eq!(publisher.receive("work", "").await.status(), 403);
    let consumer = api(CONSUMER);
    let token = consumer.lease("work").await;
    assert_eq!(consumer.settle("work", &token, "ack").await.status(), 204);
    assert_eq!(consumer.receive("audit", "").await.status(), 404);
    assert_eq!(consumer.send("work", "x").await.status(), 403);

    // The operator's routes need an admin key of every queue.
    for path in ["/metrics", "/v1/cluster", "/v1/rates"] {
        assert_eq!(a.status(Method::GET, path).await, 403, "{path}");
        assert_ne!(admin.status(Method::GET, path).await, 403, "{path}");
    }
    assert_eq!(a.status(Method::GET, "/v1/openapi.json").await, 200);
    assert_eq!(
        api("no-such-key-0123456789")
            .status(Method::GET, "/v1/queues")
            .await,
        401
    );

    // Refusals are counted; no key reached the log.
    let metrics = admin.text("/metrics").await;
    assert!(
        metrics.contains("spoold_scope_refusals_total{kind=\"queue_not_found\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("spoold_scope_refusals_total{kind=\"forbidden\"}"),
        "{metrics}"
    );
    let log = spoold.log();
    for key in [ADMIN, A, B, A_READER, PUBLISHER, CONSUMER] {
        assert!(!log.contains(key), "{key} in the log");
    }
}

/// Paged lists: `limit` and `after` walk the queues in name order with
/// `next`; `prefix`, `tenant` and `events` select; a scoped key pages
/// through its own only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_lists_page_and_filter() {
    let dir = tempfile::tempdir().unwrap();
    let spoold = start_config(dir.path(), &keys("admin"), "", "").await;
    let admin = Api::new(spoold.base.clone(), Some(ADMIN.into()));
    let a = Api::new(spoold.base.clone(), Some(A.into()));
    for i in 0..7 {
        a.queue(&format!("cus_a-{i}"), hook(None)).await;
    }
    admin.queue("cus_b-0", hook(Some("cus_b"))).await;
    admin
        .queue(
            "orders",
            json!({"destination": "http://127.0.0.1:9/o", "events": ["order.*"]}),
        )
        .await;

    let walk = |api: &Api, query: &str| {
        let (api, query) = (
            Api::new(api.base.clone(), api.key.clone()),
            query.to_owned(),
        );
        async move {
            let mut seen = Vec::new();
            let mut after = String::new();
            loop {
                let page = api
                    .get_json(&format!("/v1/queues?limit=3{query}{after}"))
                    .await;
                let got = names(&page);
                assert!(got.len() <= 3, "{page}");
                seen.extend(got);
                match page["next"].as_str() {
                    Some(next) => after = format!("&after={next}"),
                    None => return seen,
                }
            }
        }
    };
    let everything = names(&admin.get_json("/v1/queues").await);
    assert_eq!(walk(&admin, "").await, everything);
    let mut sorted = everything.clone();
    sorted.sort();
    assert_eq!(everything, sorted);
    let a_queues = walk(&a, "").await;
    assert_eq!(a_queues.len(), 14, "{a_queues:?}");
    assert!(a_queues.iter().all(|n| n.starts_with("cus_a-")));
    assert_eq!(
        walk(&admin, "&tenant=cus_b").await,
        ["cus_b-0", "cus_b-0.failed"]
    );
    assert_eq!(
        walk(&admin, "&events=order.placed").await,
        ["orders", "orders.failed"]
    );
    assert_eq!(
        walk(&admin, "&prefix=cus_a-6").await,
        ["cus_a-6", "cus_a-6.failed"]
    );
    assert!(walk(&a, "&prefix=cus_b").await.is_empty());

    // `spoold queues` pages the same way, with the same filters.
    let cli = |args: &'static [&'static str], key: &'static str| {
        let base = spoold.base.clone();
        async move {
            let mut all = vec!["--api-key", key, "queues", "--json"];
            all.extend_from_slice(args);
            let ran = common::process::cli(&base, &all).await;
            assert_eq!(ran.code, 0, "{}", ran.stderr);
            let names: Vec<String> = ran
                .stdout
                .lines()
                .map(|l| {
                    serde_json::from_str::<Value>(l).unwrap()["name"]
                        .as_str()
                        .unwrap()
                        .to_owned()
                })
                .collect();
            names
        }
    };
    assert_eq!(cli(&[], A).await, a_queues);
    assert_eq!(cli(&["--limit", "3"], ADMIN).await, everything[..3]);
    assert_eq!(
        cli(&["--tenant", "cus_b"], ADMIN).await,
        ["cus_b-0", "cus_b-0.failed"]
    );
    assert_eq!(
        cli(&["--prefix", "ord"], ADMIN).await,
        ["orders", "orders.failed"]
    );

    let bad = admin.call(Method::GET, "/v1/queues?limit=0").await;
    assert_eq!(bad.status(), 400);
    let bad = admin
        .call(Method::GET, "/v1/queues?tenant=no%20spaces")
        .await;
    assert_eq!(bad.status(), 400);
}

/// A reload that narrows a key (or takes it away) ends the streams and
/// long polls opened with it; one that leaves it as it was does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_narrows_a_key_ends_its_streams() {
    let dir = tempfile::tempdir().unwrap();
    let spoold = start_config(dir.path(), &keys("admin"), "", TABLES).await;
    let a = Api::new(spoold.base.clone(), Some(A.into()));
    let b = Api::new(spoold.base.clone(), Some(B.into()));
    a.queue("cus_a-1", hook(None)).await;
    b.queue("cus_b-1", hook(None)).await;
    a.req(Method::POST, "/v1/queues/cus_a-1/pause")
        .send()
        .await
        .unwrap();
    b.req(Method::POST, "/v1/queues/cus_b-1/pause")
        .send()
        .await
        .unwrap();
    let mut a_tail = a.get("/v1/queues/cus_a-1/tail").send().await.unwrap();
    let mut b_tail = b.get("/v1/queues/cus_b-1/tail").send().await.unwrap();
    assert_eq!(
        (a_tail.status().as_u16(), b_tail.status().as_u16()),
        (200, 200)
    );

    // The same file again: nothing narrowed, nothing ends.
    spoold.signal("-HUP");
    spoold.log_with("SIGHUP: config reloaded").await;
    a.send_id("cus_a-1", "one").await;
    let line = tokio::time::timeout(Duration::from_secs(5), a_tail.chunk())
        .await
        .expect("a line");
    assert!(String::from_utf8_lossy(&line.unwrap().unwrap()).contains("one"));

    // Tenant a's key becomes a publisher: its tail (a read) ends; b's goes on.
    write_config(dir.path(), &keys("publisher"), "", TABLES);
    spoold.signal("-HUP");
    common::eventually("the second reload", Duration::from_secs(10), async || {
        (spoold.log().matches("SIGHUP: config reloaded").count() >= 2).then_some(())
    })
    .await;
    let ended = tokio::time::timeout(Duration::from_secs(5), a_tail.chunk())
        .await
        .expect("a's tail ends at the reload");
    assert!(matches!(ended, Ok(None)), "{ended:?}");
    assert_eq!(a.status(Method::GET, "/v1/queues/cus_a-1").await, 403);
    b.send_id("cus_b-1", "two").await;
    let line = tokio::time::timeout(Duration::from_secs(5), b_tail.chunk())
        .await
        .expect("b's line");
    assert!(String::from_utf8_lossy(&line.unwrap().unwrap()).contains("two"));
}

/// `spoold portal link`: a link whose token stands for the tenant (its
/// queues only, its capabilities only) in the API; a server without
/// `portal.secret` refuses to make one, saying how to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portal_links_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let portal =
        "[portal]\nsecret = \"portal-secret-0123456789\"\nurl = \"https://hooks.example.com/\"\n";
    let spoold = start_config(dir.path(), &keys("admin"), "", portal).await;
    let admin = Api::new(spoold.base.clone(), Some(ADMIN.into()));
    admin.queue("cus_a-1", hook(Some("cus_a"))).await;
    admin.queue("cus_b-1", hook(Some("cus_b"))).await;
    let args = [
        "--api-key",
        ADMIN,
        "portal",
        "link",
        "--tenant",
        "cus_a",
        "--ttl",
        "10m",
        "--capability",
        "read",
    ];
    let ran = common::process::cli(&spoold.base, &args).await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let url = ran.stdout.lines().next().unwrap();
    let token = url
        .strip_prefix("https://hooks.example.com/portal/#token=")
        .unwrap_or_else(|| panic!("{url}"));
    assert!(
        ran.stdout.contains("# tenant cus_a, until "),
        "{}",
        ran.stdout
    );
    // The token is a key like any (the page sends it as a bearer token,
    // tests/process/console.rs).
    let session = Api::new(spoold.base.clone(), Some(token.to_owned()));
    let who = session.get_json("/v1/portal/session").await;
    assert_eq!(
        (&who["tenant"], &who["may"]),
        (&json!("cus_a"), &json!(["read"])),
        "{who}"
    );
    let listed = session.get_json("/v1/queues").await;
    assert_eq!(names(&listed), ["cus_a-1", "cus_a-1.failed"]);
    assert_eq!(session.status(Method::GET, "/v1/queues/cus_b-1").await, 404);
    assert_eq!(
        session
            .status(Method::POST, "/v1/queues/cus_a-1/pause")
            .await,
        403
    );
    // A tenant's key may not ask for links.
    let ran = common::process::cli(
        &spoold.base,
        &["--api-key", A, "portal", "link", "--tenant", "cus_a"],
    )
    .await;
    assert_ne!(ran.code, 0);
    assert!(ran.stderr.contains("forbidden"), "{}", ran.stderr);

    // Without a secret: refused, naming the setting.
    let other = tempfile::tempdir().unwrap();
    let plain = start_config(other.path(), &keys("admin"), "", "").await;
    let ran = common::process::cli(
        &plain.base,
        &["--api-key", ADMIN, "portal", "link", "--tenant", "cus_a"],
    )
    .await;
    assert_ne!(ran.code, 0);
    assert!(ran.stderr.contains("portal.secret"), "{}", ran.stderr);
}
