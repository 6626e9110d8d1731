//! What the OpenAPI document needs beyond what the handlers' annotations
//! say, so that clients generate from it (`tests/http/openapi.rs` runs
//! openapi-python-client and openapi-typescript on it):
//!
//! - payloads as binary strings (`type: string, format: binary`,
//!   `application/octet-stream`) rather than the arrays of integers a
//!   `Vec<u8>` becomes, and which generators drop or mistype; any content
//!   type is still accepted and stored as sent;
//! - the error `kind` as an enum of [`super::error::KINDS`];
//! - `servers`: spoold's default address;
//! - a flattened optional struct (`#[serde(flatten)] push: Option<…>`) as
//!   optional properties of the object, which is what the JSON is
//!   (utoipa writes `allOf: [oneOf: [null, …], …]`, which no object
//!   satisfies);
//! - an example on every operation: its path parameters, its JSON request
//!   body and its JSON answers, taken from a real run.
//!
//! It works on the serialized document (`serde_json::Value`), after the
//! router has put the paths together.

use serde_json::{Value, json};

/// Applies every rule above to `doc`.
pub(crate) fn finish(doc: &mut Value) {
    doc["servers"] = json!([
        {"url": "http://127.0.0.1:8787", "description": "spoold's default server.listen"}
    ]);
    if let Some(kind) = doc.pointer_mut("/components/schemas/ErrorBody/properties/kind") {
        kind["enum"] = json!(super::error::KINDS);
    }
    flatten_optional(doc);
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for item in paths.values_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for op in item.values_mut().filter_map(Value::as_object_mut) {
            binary_bodies(op);
            let id = op
                .get("operationId")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            examples(&id, op);
        }
    }
}

/// Each schema `allOf: [{oneOf: [{type: null}, {$ref: X}]}, {object}]`
/// becomes the object with X's properties added as optional ones.
fn flatten_optional(doc: &mut Value) {
    let Some(schemas) = doc
        .pointer("/components/schemas")
        .and_then(Value::as_object)
        .cloned()
    else {
        return;
    };
    for (name, schema) in &schemas {
        let Some([first, object]) = schema["allOf"].as_array().map(Vec::as_slice) else {
            continue;
        };
        let Some(target) = first["oneOf"]
            .as_array()
            .and_then(|o| o.iter().find_map(|s| s["$ref"].as_str()))
            .and_then(|r| r.strip_prefix("#/components/schemas/"))
        else {
            continue;
        };
        let mut flat = object.clone();
        if let (Some(props), Some(extra)) = (
            flat["properties"].as_object_mut(),
            schemas
                .get(target)
                .and_then(|t| t["properties"].as_object()),
        ) {
            for (key, value) in extra {
                props.insert(key.clone(), value.clone());
            }
        }
        if let Some(description) = schema.get("description") {
            flat["description"] = description.clone();
        }
        doc["components"]["schemas"][name] = flat;
    }
}

/// `*/*` bodies (a payload, any content type) become binary strings.
fn binary_bodies(op: &mut serde_json::Map<String, Value>) {
    let binary = |content: &mut Value| {
        let Some(content) = content.as_object_mut() else {
            return;
        };
        if let Some(mut any) = content.remove("*/*") {
            any["schema"] = json!({"type": "string", "format": "binary"});
            content.insert("application/octet-stream".into(), any);
        }
    };
    if let Some(content) = op.get_mut("requestBody").and_then(|b| b.get_mut("content")) {
        binary(content);
    }
    if let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) {
        for response in responses.values_mut() {
            if let Some(content) = response.get_mut("content") {
                binary(content);
            }
        }
    }
}

/// A message id and lease token as spoold makes them.
const ID: &str = "00000000000000019685887550920f21";
const TOKEN: &str = "AQEAAAAAAAAAAQAAAAAAAAABAAAAAAAAAIM2AyJs7kIlxNEC4vBAMTw";
const AT: &str = "2026-12-03T07:13:24.797Z";

/// The examples of one operation.
fn examples(id: &str, op: &mut serde_json::Map<String, Value>) {
    if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
        for p in params.iter_mut() {
            let example = match p["name"].as_str().unwrap_or_default() {
                "q" => json!("orders"),
                "id" if p["schema"]["type"] == "integer" => json!(2),
                "id" if p["in"] == "path" => json!(ID),
                "token" => json!(TOKEN),
                "path" => json!("v1/charges"),
                "asset" => json!("app.js"),
                "name" => json!("invoice.paid"),
                _ => continue,
            };
            p["example"] = example;
        }
    }
    if let Some(example) = request_example(id)
        && let Some(content) = op
            .get_mut("requestBody")
            .and_then(|b| b.get_mut("content"))
            .and_then(Value::as_object_mut)
    {
        for media in content.values_mut() {
            media["example"] = example.clone();
        }
    }
    let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
        return;
    };
    for (status, response) in responses.iter_mut() {
        let Some(json) = response
            .get_mut("content")
            .and_then(|c| c.get_mut("application/json"))
        else {
            continue;
        };
        let example = match status.chars().next() {
            Some('2') => response_example(id),
            Some('4') => {
                Some(json!({"kind": "queue_not_found", "message": "no queue named orders"}))
            }
            _ => Some(json!({
                "kind": "unavailable", "message": "the spool is starting (replaying its journal)"
            })),
        };
        if let Some(example) = example {
            json["example"] = example;
        }
    }
}

/// A send or a forward (of any method, either way of giving its path):
/// its body is a payload, its answer the stored message.
fn takes_payload(op: &str) -> bool {
    op == "sendMessage" || op.starts_with("forward")
}

/// The JSON request body of `op`, if it takes one.
fn request_example(op: &str) -> Option<Value> {
    Some(match op {
        "putQueue" => json!({
            "destination": "https://api.example.com/hooks",
            "maxRetries": 5,
            "backoff": {"initialSeconds": 1.0, "multiplier": 2.0, "maxSeconds": 3600.0},
        }),
        "patchQueue" => json!({"maxRetries": 10, "signingSecret": null}),
        "publishEvent" => json!({
            "type": "invoice.paid",
            "tenant": "cus_42",
            "payload": {"invoice": "in_1", "amount": 4200},
        }),
        "addMember" => json!({"nodeId": 4, "addr": "spoold-3.spoold:8788"}),
        "rotateSecret" => json!({"overlapSeconds": 86400}),
        "putEventType" => event_type(),
        "createPortalSession" => json!({
            "tenant": "cus_42", "ttlSeconds": 3600, "capabilities": ["read", "manage", "publish"]
        }),
        op if takes_payload(op) => json!("{\"order\":42}"),
        _ => return None,
    })
}

/// An entry of the event catalogue.
fn event_type() -> Value {
    json!({
        "description": "An invoice was paid in full.",
        "schema": {"type": "object", "required": ["invoice", "amount"],
                   "properties": {"invoice": {"type": "string"}, "amount": {"type": "integer"}}},
        "example": {"invoice": "in_1", "amount": 4200}
    })
}

fn queue() -> Value {
    json!({
        "name": "orders",
        "managedByConfig": false,
        "settings": {
            "leaseTimeoutSeconds": 30.0, "maxRetries": 5, "retentionSeconds": 604800.0,
            "dedupWindowSeconds": 0.0, "onExpire": "discard", "events": [],
            "historyRetentionSeconds": 0.0, "historyMaxBytes": 67108864,
            "ordering": "none", "orderingOnFailure": "release"
        },
        "stats": {
            "visible": 1, "leased": 0, "delayed": 0, "held": 0, "sentTotal": 1, "ackedTotal": 0,
            "nackedTotal": 0, "expiredTotal": 0, "failedTotal": 0, "deduplicatedTotal": 0,
            "oldestVisibleAgeSeconds": 0.4, "retrying": 0, "oldestRetryingAgeSeconds": 0.0,
            "paused": false, "breakerOpen": false
        }
    })
}

fn message(state: &str) -> Value {
    let mut m = json!({
        "attempts": [], "body": "{\"order\":42}", "contentType": "application/json",
        "enqueuedAt": AT, "id": ID, "queue": "orders", "retryCount": 0,
        "state": state, "visibleAt": AT
    });
    if state == "delivered" {
        m["deliveredAt"] = json!("2026-12-03T07:13:24.812Z");
        m["attempts"] = json!([{
            "at": "2026-12-03T07:13:24.799Z", "status": 200, "durationSeconds": 0.013,
            "error": "", "response": "ok"
        }]);
    }
    m
}

fn cluster() -> Value {
    json!({
        "nodeId": 1, "role": "primary", "term": 3,
        "primary": {"nodeId": 1, "apiUrl": "http://spoold-0.spoold:8787"},
        "commitIndex": 1042, "appliedIndex": 1042, "snapshotIndex": 1000, "purgedIndex": 900,
        "snapshot": {"receiving": false, "receivedBytes": 0, "installed": 0},
        "members": [
            {"nodeId": 1, "addr": "spoold-0.spoold:8788", "voter": true, "matchIndex": 1042,
             "lagRecords": 0, "lastContactMs": 0},
            {"nodeId": 2, "addr": "spoold-1.spoold:8788", "voter": true, "matchIndex": 1041,
             "lagRecords": 1, "lastContactMs": 40},
            {"nodeId": 3, "addr": "spoold-2.spoold:8788", "voter": true, "matchIndex": 1042,
             "lagRecords": 0, "lastContactMs": 38}
        ],
        "clockStepMs": 0, "clockSkew": null
    })
}

/// The JSON of a successful answer of `op`.
fn response_example(op: &str) -> Option<Value> {
    server_example(op)
        .or_else(|| queue_example(op))
        .or_else(|| message_example(op))
        .or_else(|| event_example(op))
}

/// The answers of the server's own operations: probes, the OpenAPI
/// document, the cluster's status and the rates.
fn server_example(op: &str) -> Option<Value> {
    Some(match op {
        "healthz" => json!({"status": "ok"}),
        "openapi" => json!({
            "openapi": "3.1.0",
            "info": {"title": "spoold", "version": env!("CARGO_PKG_VERSION")},
            "paths": {"/v1/queues": {}}
        }),
        "readyz" => json!({"status": "ready", "clockStepMs": 0}),
        "clusterStatus" | "addMember" | "removeMember" => cluster(),
        "rates" | "queueRates" => {
            let mut rates = json!({
                "pooled": false,
                "series": ["enqueued", "delivered", "retried", "failed"],
                "seconds": {"stepSeconds": 1, "lastStart": "2026-12-03T07:13:24.000Z",
                    "counts": [[120, 118, 2, 0], [131, 130, 1, 0], [97, 99, 0, 1]]},
                "minutes": {"stepSeconds": 60, "lastStart": "2026-12-03T07:13:00.000Z",
                    "counts": [[7020, 7001, 12, 1], [2911, 2890, 4, 1]]}
            });
            if op == "queueRates" {
                rates["queue"] = json!("orders");
            }
            rates
        }
        _ => return None,
    })
}

/// The answers of the operations on queues: their settings and stats, a
/// rotated secret, a purge and a redrive.
fn queue_example(op: &str) -> Option<Value> {
    Some(match op {
        "listQueues" => json!({"queues": [queue()], "next": "orders"}),
        "getQueue" | "putQueue" | "patchQueue" | "closeBreaker" | "probeBreaker" => queue(),
        "rotateSecret" => json!({
            "secret": "whsec_bmV3LXNpZ25pbmcta2V5LWJ5dGVzLTMyLWxvbmc=",
            "signingSecrets": 2,
            "previousExpiresAt": "2026-12-04T07:13:24.840Z"
        }),
        "purgeMessages" => json!({"purged": 12, "matched": 12, "remaining": 0, "dryRun": false}),
        "redrive" => json!({"moved": 3, "matched": 3, "remaining": 0, "dryRun": false}),
        _ => return None,
    })
}

/// The answers of the operations on messages: a stored message, peeked,
/// leased, delivered or failed ones, a resend and a renewed lease.
fn message_example(op: &str) -> Option<Value> {
    Some(match op {
        op if takes_payload(op) => json!({"id": ID, "queue": "orders"}),
        "peekMessages" => json!({"messages": [message("visible")], "next": ID}),
        "receiveBatch" => {
            let mut m = message("leased");
            m["leaseToken"] = json!(TOKEN);
            m["leaseExpiresAt"] = json!("2026-12-03T07:13:54.840Z");
            json!({"messages": [m]})
        }
        "getMessage" => message("visible"),
        "getDelivered" => message("delivered"),
        "listHistory" => json!({"messages": [message("delivered")], "scanned": 1, "unsearched": 0}),
        "listDeliveries" => {
            let mut failed = message("visible");
            failed["state"] = json!("failed");
            failed["messageState"] = json!("visible");
            failed["queue"] = json!("orders.failed");
            failed["originQueue"] = json!("orders");
            failed["retryCount"] = json!(8);
            failed["lastStatus"] = json!(503);
            failed["reason"] = json!("retries_exhausted");
            failed["failedAt"] = json!("2026-12-03T09:02:11.204Z");
            let mut delivered = message("delivered");
            delivered["state"] = json!("delivered");
            delivered["messageState"] = json!("delivered");
            json!({"deliveries": [failed, delivered], "next": ID, "scanned": 2, "unsearched": 0})
        }
        "resendDelivered" => json!({
            "id": "00000000000000019685887553a11c07", "queue": "orders", "resentFrom": ID
        }),
        "renew" => json!({"leaseExpiresAt": "2026-12-03T07:14:24.840Z"}),
        _ => return None,
    })
}

/// The answers of the operations on events and the portal: the
/// catalogue, a published event, a portal session and who it is.
fn event_example(op: &str) -> Option<Value> {
    Some(match op {
        "listEventTypes" => {
            let mut paid = event_type();
            paid["name"] = json!("invoice.paid");
            json!({"eventTypes": [paid]})
        }
        "getEventType" | "putEventType" => {
            let mut paid = event_type();
            paid["name"] = json!("invoice.paid");
            paid
        }
        "createPortalSession" => json!({
            "token": "spt_eyJ0IjoiY3VzXzQyIiwiYyI6WyJyZWFkIl0sImUiOjE3OTY1NDgwMDAsIm4iOjF9.c2lnbmF0dXJl",
            "url": "https://hooks.example.com/portal/#token=spt_eyJ0IjoiY3VzXzQyIiwiYyI6WyJyZWFkIl0sImUiOjE3OTY1NDgwMDAsIm4iOjF9.c2lnbmF0dXJl",
            "tenant": "cus_42",
            "capabilities": ["read", "manage", "publish"],
            "expiresAt": "2026-12-04T08:13:24.840Z"
        }),
        "whoAmI" => json!({
            "tenant": "cus_42", "may": ["read", "publish", "manage"], "queues": ["cus_42-*"],
            "expiresAt": "2026-12-04T08:13:24.840Z"
        }),
        "publishEvent" => json!({
            "id": "0000000000000001968588a1c0d2e431",
            "deliveries": [
                {"queue": "audit", "id": "0000000000000001968588a1c0d2e432"},
                {"queue": "cus_42-hooks", "id": "0000000000000001968588a1c0d2e433"}
            ],
            "matchedByType": 3
        }),
        _ => return None,
    })
}
