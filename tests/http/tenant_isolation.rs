//! Issue 41's property: random routes, sent with random tenant-scoped
//! keys, never carry another tenant's data, in an answer's body, its
//! headers or a stream, and never change another tenant's queues.
//!
//! Two tenants each have a push queue that delivers (so it has history and
//! deliveries), one that fails (so it has dead letters), messages and
//! events; an operator's queue takes every tenant's events (`>`), and a
//! pull queue has no tenant. Every datum of tenant `t` carries `cus_t` (its
//! queue names, its tenant) or `secret-t` (its payloads), and the
//! operator's `ops-` or `secret-ops`. An answer to a key of tenant `a` may
//! name `cus_b` or `ops-` only where the request itself did (a `404` names
//! the queue asked for), and never `secret-b` or `secret-ops`.
//!
//! Alongside, a model of each tenant's queues: a `PUT` or `DELETE` changes
//! them only when it succeeds under that tenant's key, and after every case
//! the operator's list must agree.
//!
//! Cases per run: `TENANT_CASES` (default 12).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;
use std::time::Duration;

use proptest::prelude::*;
use reqwest::Method;
use serde_json::{Value, json};

use crate::common::api::Api;
use crate::common::server::Server;
use crate::common::sink::Sink;

const TENANTS: [&str; 2] = ["a", "b"];

/// The scoped keys: (key, tenant, role, patterns).
const KEYS: [(&str, &str, &str, &str); 5] = [
    ("key-a-admin-0123456789", "a", "admin", "[\"cus_a-*\"]"),
    ("key-a-reader-0123456789", "a", "reader", "[]"),
    // Patterns, so that b never names a queue `cus_a-…` (the marker).
    ("key-b-admin-0123456789", "b", "admin", "[\"cus_b-*\"]"),
    (
        "key-b-publisher-0123456789",
        "b",
        "publisher",
        "[\"cus_b-*\"]",
    ),
    ("key-b-consumer-0123456789", "b", "consumer", "[]"),
];
const OPERATOR: &str = "key-operator-0123456789";

/// Queue names a request may name: each tenant's, made or not, and the
/// operator's.
const NAMES: [&str; 12] = [
    "cus_a-ok",
    "cus_a-fail",
    "cus_a-fail.failed",
    "cus_a-new",
    "cus_b-ok",
    "cus_b-fail",
    "cus_b-fail.failed",
    "cus_b-new",
    "ops-audit",
    "ops-audit.failed",
    "ops-work",
    "cus_a-ok.failed",
];

fn cases() -> u32 {
    std::env::var("TENANT_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12)
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    })
}

fn config() -> String {
    let scoped: Vec<String> = KEYS
        .iter()
        .map(|(key, tenant, role, queues)| {
            format!(
                "{{ key = \"{key}\", role = \"{role}\", tenant = \"cus_{tenant}\", queues = {queues} }}"
            )
        })
        .collect();
    format!(
        "api_keys = [\"{OPERATOR}\", {}]\n[queues.ops-work]\n",
        scoped.join(", ")
    )
}

/// One request a case makes.
#[derive(Debug, Clone)]
struct Call {
    key: usize,
    route: usize,
    queue: usize,
    /// Which tenant a body names: its own, the other, none.
    tenant: usize,
    /// Which known message id the path names.
    id: usize,
}

fn call() -> impl Strategy<Value = Call> {
    (
        0..KEYS.len(),
        0..ROUTES,
        0..NAMES.len(),
        0..3usize,
        0..64usize,
    )
        .prop_map(|(key, route, queue, tenant, id)| Call {
            key,
            route,
            queue,
            tenant,
            id,
        })
}

/// How many routes [`request`] knows.
const ROUTES: usize = 30;

/// The method, path and JSON body of route `n` on `q`.
fn request(n: usize, q: &str, id: &str, tenant: Option<&str>) -> (Method, String, Option<Value>) {
    let hook = || {
        let mut v = json!({"destination": "http://127.0.0.1:9/new", "events": ["invoice.*"]});
        if let Some(t) = tenant {
            v["tenant"] = json!(t);
        }
        v
    };
    let event = || {
        let mut v = json!({"type": "invoice.paid", "payload": {"n": 1}});
        if let Some(t) = tenant {
            v["tenant"] = json!(t);
        }
        v
    };
    let get = |path: String| (Method::GET, path, None);
    let post = |path: String| (Method::POST, path, None);
    let base = format!("/v1/queues/{q}");
    match n {
        0 => get("/v1/queues".into()),
        1 => get("/v1/queues?limit=2".into()),
        2 => get(format!("/v1/queues?tenant={}", tenant.unwrap_or("cus_b"))),
        3 => get(base),
        4 => (Method::PUT, base, Some(hook())),
        5 => (Method::PATCH, base, Some(json!({"maxRetries": 2}))),
        6 => (Method::DELETE, base, None),
        7 => get(format!("{base}/messages")),
        8 => (
            Method::POST,
            format!("{base}/messages"),
            Some(json!({"x": "secret-mine"})),
        ),
        9 => (Method::DELETE, format!("{base}/messages?dryRun=true"), None),
        10 => get(format!("{base}/messages/{id}")),
        11 => post(format!("{base}/messages/{id}/retry")),
        12 => (Method::DELETE, format!("{base}/messages/{id}"), None),
        13 => get(format!("{base}/history")),
        14 => get(format!("{base}/history/{id}")),
        15 => post(format!("{base}/history/{id}/resend")),
        16 => get(format!("{base}/deliveries")),
        17 => post(format!("{base}/receive")),
        18 => post(format!("{base}/receive-batch?max=5")),
        19 => post(format!("{base}/redrive?dryRun=true")),
        20 => post(format!("{base}/pause")),
        21 => post(format!("{base}/resume")),
        22 => post(format!("{base}/breaker/probe")),
        23 => get(format!("{base}/rates")),
        24 => get(format!("{base}/tail?last=10")),
        25 => (Method::POST, "/v1/events".into(), Some(event())),
        26 => get("/v1/rates".into()),
        27 => get("/metrics".into()),
        28 => post(format!("{base}/secret/rotate")),
        _ => (
            Method::POST,
            format!("/v1/forward/{q}/hook"),
            Some(json!({"y": 1})),
        ),
    }
}

/// Tenant `t`'s data, by the operator: a queue that delivers (with
/// history), one that fails at once (dead letters), sends and events.
/// Every message id, of either tenant.
async fn seed(operator: &Api, sink: &str) -> Vec<String> {
    operator
        .queue(
            "ops-audit",
            json!({"destination": format!("{sink}/audit"), "events": [">"]}),
        )
        .await;
    let mut ids = Vec::new();
    for t in TENANTS {
        let tenant = format!("cus_{t}");
        operator
            .queue(
                &format!("cus_{t}-ok"),
                json!({"destination": format!("{sink}/{t}"), "events": ["invoice.*"],
                       "tenant": tenant, "historyRetentionSeconds": 3600}),
            )
            .await;
        operator
            .queue(
                &format!("cus_{t}-fail"),
                json!({"destination": "http://127.0.0.1:9/", "events": ["invoice.*"],
                       "tenant": tenant, "maxRetries": 0, "historyRetentionSeconds": 3600}),
            )
            .await;
        for n in 0..2 {
            let event = json!({"type": "invoice.paid", "tenant": tenant, "payload": {"s": format!("secret-{t}-{n}")}});
            let r = operator
                .req(Method::POST, "/v1/events")
                .json(&event)
                .send()
                .await
                .unwrap();
            let published: Value = r.json().await.unwrap();
            for d in published["deliveries"].as_array().unwrap() {
                ids.push(d["id"].as_str().unwrap().to_owned());
            }
            ids.push(
                operator
                    .send_id(&format!("cus_{t}-ok"), &format!("secret-{t}-sent"))
                    .await,
            );
        }
    }
    ids.push(operator.send_id("ops-work", "secret-ops").await);
    // Delivered, and failed, before the calls begin.
    crate::common::eventually(
        "history and dead letters",
        Duration::from_secs(30),
        async || {
            let mut ready = true;
            for t in TENANTS {
                let history = operator
                    .get_json(&format!("/v1/queues/cus_{t}-ok/history"))
                    .await;
                let failed = operator
                    .get_json(&format!("/v1/queues/cus_{t}-fail.failed/messages"))
                    .await;
                ready &= history["messages"].as_array().is_some_and(|e| e.len() >= 4)
                    && failed["messages"].as_array().is_some_and(|m| m.len() >= 2);
            }
            ready.then_some(())
        },
    )
    .await;
    ids
}

/// What the answer to `text` (a request, all its strings) may say of the
/// other tenant: the names the request itself gave, nothing more.
fn leaks(answer: &str, request: &str, other: &str) -> Option<String> {
    for secret in [format!("secret-{other}"), "secret-ops".into()] {
        if answer.contains(&secret) {
            return Some(secret);
        }
    }
    let names = [format!("cus_{other}"), "ops-".to_owned()];
    let mut rest = answer.to_owned();
    // The names the request gave may come back (`queue cus_b-ok does not
    // exist`): each is taken out before looking.
    let mut given: Vec<&str> = request
        .split(|c: char| !(c.is_ascii_alphanumeric() || "_-.".contains(c)))
        .filter(|w| names.iter().any(|name| w.contains(name.as_str())))
        .collect();
    given.sort_by_key(|w| std::cmp::Reverse(w.len()));
    for word in given {
        rest = rest.replace(word, "");
    }
    names.into_iter().find(|name| rest.contains(name.as_str()))
}

/// The body, headers and (for a stream) what arrived in 300 ms.
async fn answer_text(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    let mut text: String = response
        .headers()
        .iter()
        .map(|(k, v)| format!("{k}: {}\n", String::from_utf8_lossy(v.as_bytes())))
        .collect();
    let mut response = response;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
    while let Ok(Ok(Some(chunk))) = tokio::time::timeout_at(deadline, response.chunk()).await {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    (status, text)
}

/// Each tenant's queues (not failure queues) as the operator lists them.
async fn queues_of(operator: &Api) -> BTreeMap<String, BTreeSet<String>> {
    let list = operator.get_json("/v1/queues").await;
    let mut by = BTreeMap::new();
    for q in list["queues"].as_array().unwrap() {
        let name = q["name"].as_str().unwrap();
        if let Some(t) = q["settings"]["tenant"].as_str()
            && !name.ends_with(".failed")
        {
            by.entry(t.to_owned())
                .or_insert_with(BTreeSet::new)
                .insert(name.to_owned());
        }
    }
    by
}

fn run_case(calls: Vec<Call>) -> Result<(), TestCaseError> {
    runtime().block_on(async move {
        let (_sink, sink) = Sink::start().await;
        let server = Server::temp(&config()).await;
        let base = server.api().base.clone();
        let operator = Api::new(base.clone(), Some(OPERATOR.into()));
        let ids = seed(&operator, &sink).await;
        let mut model = queues_of(&operator).await;
        for call in calls {
            let (key, own, _, _) = KEYS[call.key];
            let other = if own == "a" { "b" } else { "a" };
            let tenant = [Some(format!("cus_{own}")), Some(format!("cus_{other}")), None][call.tenant].clone();
            let q = NAMES[call.queue];
            let id = &ids[call.id % ids.len()];
            let (method, path, body) = request(call.route, q, id, tenant.as_deref());
            let api = Api::new(base.clone(), Some(key.into()));
            let mut builder = api.req(method.clone(), &path);
            if let Some(body) = &body {
                builder = builder.json(body);
            }
            let (status, text) = answer_text(builder.send().await.unwrap()).await;
            let asked = format!("{path} {}", body.as_ref().map(Value::to_string).unwrap_or_default());
            if let Some(leak) = leaks(&text, &asked, other) {
                return Err(TestCaseError::fail(format!(
                    "{method} {path} with tenant {own}'s {key} answered {status} carrying {leak}:\n{text}"
                )));
            }
            // The model: only this tenant's key changes this tenant's queues.
            let made = method == Method::PUT && status == 201;
            let gone = method == Method::DELETE && status == 204 && path == format!("/v1/queues/{q}");
            if made || gone {
                let set = model.entry(format!("cus_{own}")).or_default();
                if made {
                    set.insert(q.to_owned());
                } else {
                    set.remove(q);
                }
            }
        }
        model.retain(|_, set| !set.is_empty());
        let listed = queues_of(&operator).await;
        prop_assert_eq!(listed, model);
        server.stop().await;
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn no_answer_carries_another_tenants_data(calls in prop::collection::vec(call(), 20..80)) {
        run_case(calls)?;
    }
}
