//! The OpenAPI document (docs/contract.md §4) describes exactly the routes
//! spoold serves: the served document equals `docs/openapi.json`, and every
//! operation it lists reaches a handler (never the router's "no such
//! route" or "method not allowed"). The router registers its routes from
//! the same list that writes the document (`src/api/mod.rs`), and
//! `.ci/run` validates the file with `openapi-spec-validator`.

use crate::common;

use crate::common::server::Server;
use reqwest::Method;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_document_is_the_checked_in_one_and_every_operation_is_routed() {
    let server = Server::temp("api_keys = [\"k1\"]").await;
    let served = server.text("/v1/openapi.json").await;
    let checked_in = include_str!("../../docs/openapi.json");
    assert_eq!(
        served.trim_end(),
        checked_in.trim_end(),
        "docs/openapi.json is stale: run `cargo run -- openapi > docs/openapi.json`"
    );
    let doc: Value = serde_json::from_str(&served).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");

    let mut operations = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        // A queue that does not exist: every handler answers at once.
        let concrete = path
            .replace("{q}", "nope")
            .replace("{id}", "00000000000000010000000000000000")
            .replace("{token}", "t")
            .replace("{path}", "a/b")
            .replace("{asset}", "app.js");
        for method in ["get", "post", "put", "patch", "delete"] {
            if item.get(method).is_none() {
                continue;
            }
            operations += 1;
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let r = server
                .req(m, &concrete)
                .body("{\"maxRetries\": -1}")
                .header("Content-Type", "application/json")
                .send()
                .await
                .unwrap();
            let status = r.status();
            let text = r.text().await.unwrap_or_default();
            let kind = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["kind"].as_str().map(str::to_owned))
                .unwrap_or_default();
            // On a single node `/v1/cluster` and its members are routed
            // and answer 404 by the contract (§9): it is no cluster.
            let single_node = path.starts_with("/v1/cluster") && text.contains("single node");
            assert!(
                single_node || (kind != "not_found" && kind != "method_not_allowed"),
                "{method} {path} ({concrete}) is documented but not routed: {status} {text}"
            );
        }
    }
    assert!(operations >= 25, "{operations} operations");

    // And what is routed is documented: the one route outside the list
    // (forward, any method, any depth) is described by hand.
    for path in [
        "/v1/forward/nope",
        "/v1/forward/nope/",
        "/v1/forward/nope/a/b/c",
    ] {
        let r = server.call(Method::OPTIONS, path).await;
        let v: Value = r.json().await.unwrap();
        assert_ne!(v["kind"], "not_found", "{path}");
    }
    let undocumented = server.call(Method::GET, "/v1/queues/nope/frobnicate").await;
    let v: Value = undocumented.json().await.unwrap();
    assert_eq!(v["kind"], "not_found");
    server.stop().await;
}

#[test]
fn the_binary_prints_the_same_document() {
    let out = common::process::run_input(&["openapi"], "");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim_end(),
        include_str!("../../docs/openapi.json").trim_end()
    );
}

/// What client generators need (issue: openapi-python-client dropped send
/// and every forward call): payloads as binary strings, the error kind as
/// an enum, a server, and an example on every operation.
#[test]
fn the_document_generates_clients() {
    let root = env!("CARGO_MANIFEST_DIR");
    let text = std::fs::read_to_string(format!("{root}/docs/openapi.json")).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert!(doc["servers"][0]["url"].is_string(), "servers");
    let kinds = doc["components"]["schemas"]["ErrorBody"]["properties"]["kind"]["enum"]
        .as_array()
        .expect("kind is an enum");
    for kind in [
        "queue_not_found",
        "stale_lease",
        "spool_full",
        "not_primary",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "{kind}");
    }
    let mut operations = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            operations += 1;
            let name = format!("{method} {path}");
            let op_text = op.to_string();
            assert!(!op_text.contains("\"*/*\""), "{name}: a */* body");
            assert!(
                !op_text.contains("\"items\":{\"format\":\"int32\""),
                "{name}: bytes as an integer array"
            );
            let params = op["parameters"].as_array().cloned().unwrap_or_default();
            let mut examples = params.iter().filter(|p| p.get("example").is_some()).count();
            for media in op["requestBody"]["content"]
                .as_object()
                .into_iter()
                .flatten()
            {
                examples += usize::from(media.1.get("example").is_some());
            }
            for (status, response) in op["responses"].as_object().unwrap() {
                if let Some(json) = response["content"].get("application/json") {
                    assert!(json.get("example").is_some(), "{name} {status}: no example");
                    examples += 1;
                }
            }
            if !params.is_empty() || op.get("requestBody").is_some() {
                assert!(examples > 0, "{name}: no example");
            }
            for p in params.iter().filter(|p| p["in"] == "path") {
                assert!(p.get("example").is_some(), "{name}: path parameter {p}");
            }
        }
    }
    assert!(operations > 35, "{operations}");
}
