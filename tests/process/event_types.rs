//! Issue 41's event catalogue, against the binary: a type's JSON Schema
//! refuses a payload that does not match with `422` naming where; a bad
//! schema or example is refused when it is put; only an operator's key
//! writes the catalogue, any key reads it; it survives `kill -9`.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common;
use common::api::Api;
use common::process::{start_command, write_config};

const ADMIN: &str = "admin-key-0123456789";
const TENANT: &str = "tenant-key-0123456789";

fn keys() -> String {
    format!("api_keys = [\"{ADMIN}\", {{ key = \"{TENANT}\", tenant = \"cus_1\" }}]")
}

async fn publish(api: &Api, event: Value) -> (StatusCode, Value) {
    let r = api
        .req(Method::POST, "/v1/events")
        .json(&event)
        .send()
        .await
        .unwrap();
    (r.status(), r.json().await.unwrap_or(Value::Null))
}

async fn put_type(api: &Api, name: &str, definition: Value) -> (StatusCode, Value) {
    let r = api
        .req(Method::PUT, &format!("/v1/event-types/{name}"))
        .json(&definition)
        .send()
        .await
        .unwrap();
    (r.status(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_types_schema_refuses_payloads_that_do_not_match() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &keys(),
        "",
        "[queues.audit]\nevents = [\">\"]\n",
    );
    let start = async || {
        let mut command = std::process::Command::new(common::process::bin());
        command.args(["run", "--config"]).arg(&config);
        start_command(&mut command).await
    };
    let mut spoold = start().await;
    let admin = Api::new(spoold.base.clone(), Some(ADMIN.into()));
    let tenant = Api::new(spoold.base.clone(), Some(TENANT.into()));
    let schema = json!({
        "type": "object",
        "required": ["amount"],
        "properties": {"amount": {"type": "integer", "minimum": 0}, "lines": {"type": "array", "items": {"type": "string"}}}
    });
    let paid =
        json!({"description": "An invoice was paid", "schema": schema, "example": {"amount": 42}});
    let (status, got) = put_type(&admin, "invoice.paid", paid.clone()).await;
    assert_eq!(
        (status, &got["name"]),
        (StatusCode::CREATED, &json!("invoice.paid")),
        "{got}"
    );
    assert_eq!(put_type(&admin, "invoice.paid", paid.clone()).await.0, 200);

    // Refused at publish, naming where.
    let cases = [
        (json!({"amount": "ten"}), "/amount"),
        (json!({"amount": -1}), "/amount"),
        (json!({"amount": 1, "lines": ["a", 2]}), "/lines/1"),
        (json!({}), ""),
    ];
    for (payload, path) in cases {
        let (status, got) =
            publish(&admin, json!({"type": "invoice.paid", "payload": payload})).await;
        assert_eq!(
            (status, &got["kind"]),
            (StatusCode::UNPROCESSABLE_ENTITY, &json!("schema_mismatch")),
            "{got}"
        );
        let message = got["message"].as_str().unwrap();
        assert!(message.contains(&format!("at {path:?}")), "{message}");
    }
    let raw = admin
        .req(Method::POST, "/v1/events")
        .header("Spooler-Event-Type", "invoice.paid")
        .header("Content-Type", "text/plain")
        .body("amount=1")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 422);
    assert_eq!(
        admin.get_json("/v1/queues/audit").await["stats"]["sentTotal"],
        0
    );
    let (status, got) = publish(
        &tenant,
        json!({"type": "invoice.paid", "payload": {"amount": 7}}),
    )
    .await;
    assert_eq!(status, 202, "{got}");
    // A type without a schema takes anything.
    let (status, _) = publish(&admin, json!({"type": "invoice.sent", "payload": "text"})).await;
    assert_eq!(status, 202);

    // Bad definitions are refused when put.
    for bad in [
        json!({"description": "x", "schema": {"type": "nope"}}),
        json!({"description": "x", "schema": schema, "example": {"amount": "no"}}),
        json!({"description": "x", "schema": {"$ref": "https://example.com/s.json"}}),
        json!({"description": "x", "extra": 1}),
        json!({"description": "x".repeat(70_000)}),
    ] {
        let (status, got) = put_type(&admin, "invoice.odd", bad).await;
        assert_eq!(status, 400, "{got}");
    }
    assert_eq!(put_type(&admin, "not a type", json!({})).await.0, 400);

    // Any key reads the catalogue; only an operator's writes it.
    let listed = tenant.get_json("/v1/event-types").await;
    assert_eq!(listed["eventTypes"][0]["name"], "invoice.paid", "{listed}");
    assert_eq!(listed["eventTypes"][0]["example"], json!({"amount": 42}));
    assert_eq!(put_type(&tenant, "invoice.paid", paid.clone()).await.0, 403);
    assert_eq!(
        tenant
            .status(Method::DELETE, "/v1/event-types/invoice.paid")
            .await,
        403
    );

    // It is durable: after kill -9 it is there and still refuses.
    spoold.child.kill().unwrap();
    spoold.wait_exit();
    spoold = start().await;
    let admin = Api::new(spoold.base.clone(), Some(ADMIN.into()));
    assert_eq!(
        admin.get_json("/v1/event-types/invoice.paid").await["description"],
        "An invoice was paid"
    );
    let (status, _) = publish(
        &admin,
        json!({"type": "invoice.paid", "payload": {"amount": "x"}}),
    )
    .await;
    assert_eq!(status, 422);
    let metrics = admin.text("/metrics").await;
    assert!(metrics.contains("spoold_event_types 1"), "{metrics}");

    // Removed: the schema no longer applies; a second removal is 404.
    assert_eq!(
        admin
            .status(Method::DELETE, "/v1/event-types/invoice.paid")
            .await,
        204
    );
    assert_eq!(
        admin
            .status(Method::DELETE, "/v1/event-types/invoice.paid")
            .await,
        404
    );
    let (status, _) = publish(
        &admin,
        json!({"type": "invoice.paid", "payload": {"amount": "x"}}),
    )
    .await;
    assert_eq!(status, 202);
}
