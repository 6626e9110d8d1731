//! Golden bytes of every record kind (`tests/data/golden/records.txt`)
//! and every checkpoint chunk kind (`tests/data/golden/checkpoint.txt`),
//! as the encoders of 2026-12-04 wrote them (the first layout of a
//! membership record as 139ec3c, the last build that wrote it, did).
//! Each entry is checked both ways:
//!
//! - read: today's decoders turn the golden bytes into the value built
//!   here (a record and its payload, a replica set, a whole state), so a
//!   later build still reads what earlier ones wrote;
//! - write: today's encoders turn that value into the golden bytes (but
//!   for layouts no build writes any more: format 1's dedup key, the
//!   first membership layout), so a change that alters the layout of an
//!   existing kind fails here before it writes journals that other builds
//!   misread.
//!
//! The one allowance is the settings JSON of a queue (record kind 1,
//! chunk 65): a new setting adds a key, which a reader that does not
//! know it ignores and a reader that does fills in with its default when
//! it is missing (`docs/journal-format.md`). So the JSON written may hold
//! keys the golden bytes lack; every key they hold must be written as it
//! is.
//!
//! An entry is never changed or regenerated: some journal or checkpoint
//! on disk holds its bytes, and every later build must read them. A
//! layout that changes is a new kind or a new flag bit, and the old bytes
//! stay, read as before. To pin a new one, add its value (a record to
//! [`records`], or a state whose checkpoint has the new chunk to
//! [`checkpoints`], as a checkpoint of its own), widen the range of kinds
//! the test requires, and run `cargo test golden`: it fails and prints
//! the missing entries as today's encoders write them. Check them against
//! `docs/journal-format.md` and append them to the file.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::checkpoint::{CheckpointLoader, CheckpointMeta, kind as chunk};
use super::codec::Reader;
use super::command::{AttemptInfo, EventMeta, EventTag, FailReason, StoredRequest};
use super::queue::{Backoff, OnExpire, QueueSettings};
use super::record::decode_payload_of;
use super::{Command, EnqueueMeta, MessageId, Payload, Record, Spool};
use crate::journal::RecordLoc;

pub(crate) const RECORDS: &str = include_str!("../../../tests/data/golden/records.txt");
const CHECKPOINT: &str = include_str!("../../../tests/data/golden/checkpoint.txt");

/// The membership records (kind 16) of both layouts: their bytes are
/// openraft's, checked where they are read (`cluster::store`).
const MEMBERSHIPS: [&str; 2] = ["raft-membership-v1", "raft-membership-v2"];

/// When the records were decided (2026-12-04T15:20:00Z).
const AT: i64 = 1_796_400_000_000;

/// A golden file's entries by name: kind and bytes. An entry is a
/// `NAME: kind K` line after its `#` comment, then its bytes in hex.
pub(crate) fn parse(text: &str) -> BTreeMap<String, (u8, Vec<u8>)> {
    let mut entries = BTreeMap::new();
    let mut open: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some((name, kind)) = line.split_once(": kind ") {
            let kind = kind.parse().expect("a kind is a number");
            assert!(
                entries
                    .insert(name.to_owned(), (kind, Vec::new()))
                    .is_none(),
                "{name} twice"
            );
            open = Some(name.to_owned());
            continue;
        }
        let name = open.as_ref().expect("bytes before any entry");
        let bytes = &mut entries.get_mut(name).expect("opened").1;
        for pair in line.split_whitespace() {
            bytes.push(u8::from_str_radix(pair, 16).expect("hex bytes"));
        }
    }
    entries
}

/// An entry as the golden file spells it, for the message that says
/// what to add.
pub(crate) fn entry_text(name: &str, what: &str, kind: u8, bytes: &[u8]) -> String {
    let mut text = format!("# {what}\n{name}: kind {kind}\n");
    for line in bytes.chunks(32) {
        let hex: Vec<String> = line.iter().map(|b| format!("{b:02x}")).collect();
        text.push_str(&hex.join(" "));
        text.push('\n');
    }
    text.push('\n');
    text
}

/// Settings JSON inside `body` (of record kind 1, or chunk 65) cut out:
/// the bytes around them (their length fields too), and each JSON object.
fn without_settings(kind: u8, body: &[u8]) -> (Vec<u8>, Vec<serde_json::Value>) {
    let mut r = Reader::new(body);
    let mut cuts = Vec::new();
    let mut cut_next = |r: &mut Reader<'_>| {
        let start = r.pos;
        let json = r.bytes32().expect("settings");
        cuts.push((start, r.pos, serde_json::from_slice(json).expect("JSON")));
    };
    match kind {
        super::record::kind::QUEUE_UPSERT => {
            r.i64().expect("at");
            r.str16().expect("name");
            r.u8().expect("managed by config");
            cut_next(&mut r);
        }
        chunk::QUEUES => {
            for _ in 0..r.u32().expect("count") {
                r.str16().expect("name");
                r.u8().expect("managed by config");
                r.u8().expect("paused");
                cut_next(&mut r);
            }
        }
        _ => return (body.to_vec(), Vec::new()),
    }
    let mut rest = Vec::new();
    let mut from = 0;
    let mut jsons = Vec::new();
    for (start, end, json) in cuts {
        rest.extend_from_slice(&body[from..start]);
        from = end;
        jsons.push(json);
    }
    rest.extend_from_slice(&body[from..]);
    (rest, jsons)
}

/// `written` is `golden` (of `kind`), but that settings JSON may hold
/// keys the golden bytes lack (a setting added since).
fn assert_writes(kind: u8, written: &[u8], golden: &[u8], name: &str) {
    let (rest, jsons) = without_settings(kind, written);
    let (golden_rest, golden_jsons) = without_settings(kind, golden);
    assert_eq!(
        rest, golden_rest,
        "{name}: today's encoder writes other bytes"
    );
    assert_eq!(jsons.len(), golden_jsons.len(), "{name}");
    for (json, golden) in jsons.iter().zip(&golden_jsons) {
        for (key, value) in golden.as_object().expect("settings are an object") {
            assert_eq!(json.get(key), Some(value), "{name}: setting {key}");
        }
    }
}

/// A record the golden file holds: its name there, what its comment
/// says, the record and the payload it carries (the payload as read:
/// with the event tag or `resent_from` the record gives it).
struct Golden {
    name: &'static str,
    what: &'static str,
    record: Record<'static>,
    payload: Option<Payload>,
    /// A layout today's build reads but no longer writes.
    read_only: bool,
}

fn golden(name: &'static str, what: &'static str, command: Command<'static>) -> Golden {
    Golden {
        name,
        what,
        record: Record { at: AT, command },
        payload: None,
        read_only: false,
    }
}

impl Golden {
    fn carrying(mut self, payload: Payload) -> Golden {
        self.payload = Some(payload);
        self
    }
}

fn text(body: &'static str) -> Payload {
    Payload {
        content_type: "text/plain".into(),
        body: Bytes::from_static(body.as_bytes()),
        ..Payload::default()
    }
}

fn request() -> StoredRequest {
    StoredRequest {
        method: "POST".into(),
        path: "/hooks/a".into(),
        query: "x=1".into(),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("x-request".into(), "r1".into()),
        ],
    }
}

fn tag(tenant: Option<&str>) -> EventTag {
    EventTag {
        id: MessageId(30),
        event_type: "invoice.paid".into(),
        tenant: tenant.map(str::to_owned),
    }
}

/// A push queue with every setting away from its default. A setting
/// added later takes its default here: the golden bytes do not have it,
/// and read as that default.
fn busy_settings() -> QueueSettings {
    QueueSettings {
        ordering: crate::spool::queue::Ordering::None,
        ordering_on_failure: crate::spool::queue::OrderingOnFailure::Release,
        previous_secret: None,
        lease_timeout_ms: 45_000,
        max_retries: 5,
        retention_ms: 3 * 86_400_000,
        dedup_window_ms: 600_000,
        on_expire: OnExpire::Fail,
        destination: Some("https://hooks.example.com/in".into()),
        concurrency: 16,
        rate_limit: Some(50.0),
        timeout_ms: 15_000,
        backoff: Backoff {
            initial_ms: 1_000,
            multiplier: 2.0,
            max_ms: 60_000,
            jitter: 0.1,
        },
        headers: [("X-Source".to_owned(), "shop".to_owned())].into(),
        signing_secret: Some("whsec_ZXhhbXBsZS1zZWNyZXQtb25seQ==".into()),
        permanent_failure_statuses: vec![400, 410],
        breaker_failures: 20,
        ca_file: Some("/etc/spoold/ca.pem".into()),
        client_cert: Some("/etc/spoold/client.pem".into()),
        client_key: Some("/etc/spoold/client.key".into()),
        events: vec!["invoice.*".into(), "order.>".into()],
        tenant: Some("cus_42".into()),
        filter: None,
        history_retention_ms: 86_400_000,
        history_max_bytes: 1 << 20,
    }
}

/// Every record layout: each kind, and each flag that adds a field.
fn records() -> Vec<Golden> {
    let orders = || Cow::Borrowed("orders");
    let enqueue = |id: u64, dedup_hash: Option<u64>| {
        Command::Enqueue(EnqueueMeta {
            ordering_key: None,
            id: MessageId(id),
            queue: orders(),
            visible_at: AT + 1_000,
            dedup_hash,
        })
    };
    let event = |tenant: Option<&'static str>, dedup_hash: Option<u64>| {
        Command::Event(EventMeta {
            ordering_key: None,
            id: MessageId(30),
            event_type: "invoice.paid".into(),
            tenant: tenant.map(Cow::Borrowed),
            visible_at: AT,
            dedup_hash,
            fingerprint: None,
            deliveries: vec![
                ("audit".into(), MessageId(31)),
                ("billing".into(), MessageId(32)),
            ],
        })
    };
    let event_payload = |tenant| Payload {
        content_type: "application/json".into(),
        event: Some(tag(tenant)),
        body: Bytes::from_static(b"{\"invoice\":7}"),
        ..Payload::default()
    };
    let resend = || Command::Resend {
        queue: orders(),
        id: MessageId(40),
        from: MessageId(7),
        visible_at: AT,
    };
    let resent = |request: Option<StoredRequest>, event: Option<EventTag>| Payload {
        request,
        event,
        resent_from: Some(MessageId(7)),
        ..text("hello")
    };
    let fail = |reason, last_status| Command::Fail {
        queue: orders(),
        id: MessageId(7),
        reason,
        last_status,
        retry_count: 3,
    };
    vec![
        golden(
            "queue-upsert",
            "queue upsert (1): \"hooks\", managed by the config, every setting away from its default",
            Command::QueueUpsert {
                name: "hooks".into(),
                settings: Box::new(busy_settings()),
                managed_by_config: true,
            },
        ),
        golden(
            "queue-delete",
            "queue delete (2): \"orders\"",
            Command::QueueDelete { name: orders() },
        ),
        golden(
            "queue-pause",
            "queue pause (3): \"orders\" paused",
            Command::QueuePause {
                name: orders(),
                paused: true,
            },
        ),
        golden(
            "enqueue",
            "enqueue (4): message 7 into \"orders\", visible a second later; no dedup key, request or trace",
            enqueue(7, None),
        )
        .carrying(text("hello")),
        golden(
            "enqueue-dedup",
            "enqueue (4) with a dedup hash (flag bit 0)",
            enqueue(8, Some(0xfeed_beef_0000_0001)),
        )
        .carrying(text("keyed")),
        golden(
            "enqueue-request",
            "enqueue (4) with a stored request of two headers (flag bit 1): a forward",
            enqueue(9, None),
        )
        .carrying(Payload {
            content_type: "application/json".into(),
            request: Some(request()),
            body: Bytes::from_static(b"{\"n\":1}"),
            ..Payload::default()
        }),
        golden(
            "enqueue-trace",
            "enqueue (4) with a traceparent (flag bit 2) and a dedup hash",
            enqueue(10, Some(0x0102_0304_0506_0708)),
        )
        .carrying(Payload {
            trace: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            ..text("traced")
        }),
        golden(
            "ack",
            "ack (5): message 7 of \"orders\"",
            Command::Ack {
                queue: orders(),
                id: MessageId(7),
            },
        ),
        golden(
            "retry",
            "retry (6): message 7 of \"orders\", visible in a minute, retry count 2",
            Command::Retry {
                queue: orders(),
                id: MessageId(7),
                visible_at: AT + 60_000,
                retry_count: 2,
            },
        ),
        golden(
            "attempt",
            "attempt (7): message 7's two attempts, a 503 with a body, then a connection error",
            Command::Attempt {
                queue: "hooks".into(),
                id: MessageId(7),
                attempts: vec![
                    AttemptInfo {
                        at: AT - 5_000,
                        status: Some(503),
                        error: String::new(),
                        duration_ms: 12,
                        response: "busy".into(),
                    },
                    AttemptInfo {
                        at: AT,
                        status: None,
                        error: "connection refused".into(),
                        duration_ms: 1,
                        response: String::new(),
                    },
                ],
            },
        ),
        golden(
            "fail-retries-exhausted",
            "fail (8): retries exhausted (reason 1), no status, retry count 3",
            fail(FailReason::RetriesExhausted, None),
        ),
        golden(
            "fail-permanent-status",
            "fail (8): a permanent status (reason 2), 410",
            fail(FailReason::PermanentStatus, Some(410)),
        ),
        golden(
            "fail-expired",
            "fail (8): expired (reason 3)",
            fail(FailReason::Expired, None),
        ),
        golden(
            "expire",
            "expire (9): message 7 of \"orders\"",
            Command::Expire {
                queue: orders(),
                id: MessageId(7),
            },
        ),
        golden(
            "cancel",
            "cancel (10): message 7 of \"orders\"",
            Command::Cancel {
                queue: orders(),
                id: MessageId(7),
            },
        ),
        golden(
            "purge",
            "purge (11): messages 7 and 9 of \"orders\"",
            Command::Purge {
                queue: orders(),
                ids: vec![MessageId(7), MessageId(9)],
            },
        ),
        golden(
            "redrive",
            "redrive (12): messages 7 and 9 from \"orders.failed\" back to \"orders\"",
            Command::Redrive {
                queue: orders(),
                ids: vec![MessageId(7), MessageId(9)],
            },
        ),
        golden("epoch", "epoch (13): 3", Command::Epoch { epoch: 3 }),
        Golden {
            read_only: true,
            ..golden(
                "dedup-key",
                "dedup key (14), format 1 only: read by the upgrade, never written",
                Command::DedupKey {
                    queue: orders(),
                    hash: 0xfeed_beef_0000_0001,
                    first_at: AT - 1_000,
                    id: MessageId(8),
                },
            )
        },
        Golden {
            record: Record {
                at: 0,
                command: Command::RaftBlank,
            },
            ..golden("raft-blank", "raft blank (15): `at` 0, nothing else", Command::RaftBlank)
        },
        golden(
            "retire-node",
            "retire node (17): node 4",
            Command::RetireNode { id: 4 },
        ),
        golden(
            "event",
            "event (18): event 30 \"invoice.paid\" to audit (31) and billing (32); no tenant, no dedup hash",
            event(None, None),
        )
        .carrying(event_payload(None)),
        golden(
            "event-tenant-dedup",
            "event (18) with a dedup hash (flag bit 0) and a tenant (flag bit 1)",
            event(Some("cus_42"), Some(0xbeef)),
        )
        .carrying(event_payload(Some("cus_42"))),
        golden(
            "resend",
            "resend (19): message 40 into \"orders\", a copy of delivered message 7; no request, no event",
            resend(),
        )
        .carrying(resent(None, None)),
        golden(
            "resend-request",
            "resend (19) of a forward: its stored request (flag bit 0)",
            resend(),
        )
        .carrying(resent(Some(request()), None)),
        golden(
            "resend-event",
            "resend (19) of an event's delivery: its event tag (flag bit 1), no tenant",
            resend(),
        )
        .carrying(resent(None, Some(tag(None)))),
        golden(
            "resend-event-tenant",
            "resend (19) of an event's delivery with a tenant (flag bits 1 and 2)",
            resend(),
        )
        .carrying(resent(None, Some(tag(Some("cus_42"))))),
        golden(
            "queue-upsert-rotated",
            "queue upsert (1): \"hooks\" after a secret rotation, the replaced secret signing until 1 700 000 000 000 ms (the settings JSON's previous_secret)",
            Command::QueueUpsert {
                name: "hooks".into(),
                settings: Box::new(QueueSettings {
                    previous_secret: Some(crate::spool::PreviousSecret {
                        secret: "whsec_b2xkLXNlY3JldA==".into(),
                        expires_at: 1_700_000_000_000,
                    }),
                    ..busy_settings()
                }),
                managed_by_config: false,
            },
        ),
        golden(
            "secret-expire",
            "secret expire (21): \"orders\"'s replaced secret, the one that ends at 1 700 000 000 000 ms",
            Command::SecretExpire {
                queue: orders(),
                expires_at: 1_700_000_000_000,
            },
        ),
        golden(
            "event-type",
            "event type (22): \"invoice.paid\" defined, its definition JSON (description, schema, example)",
            Command::EventType {
                name: "invoice.paid".into(),
                definition: Cow::Borrowed(
                    br#"{"description":"An invoice was paid","schema":{"type":"object","required":["amount"]},"example":{"amount":42}}"#,
                ),
            },
        ),
        golden(
            "event-type-removed",
            "event type (22): \"invoice.paid\" removed (an empty definition)",
            Command::EventType {
                name: "invoice.paid".into(),
                definition: Cow::Borrowed(b""),
            },
        ),
        golden(
            "history-drop",
            "history drop (20): messages 7 and 9 of \"orders\"",
            Command::HistoryDrop {
                queue: orders(),
                ids: vec![MessageId(7), MessageId(9)],
            },
        ),
        golden(
            "event-fingerprint",
            "event (18) with a key and the fingerprint of its type and body (flag bit 3: a u64 at the very end)",
            Command::Event(EventMeta {
                fingerprint: Some(0x1122_3344_5566_7788),
                ..match event(None, Some(0x0a0b)) {
                    Command::Event(meta) => meta,
                    _ => unreachable!("an event"),
                }
            }),
        )
        .carrying(event_payload(None)),
        golden(
            "enqueue-trace-hops",
            "enqueue (4) that came through 3 spoold deliveries (flag bit 3: a u8 at the very end, after the traceparent)",
            enqueue(11, None),
        )
        .carrying(Payload {
            trace: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            hops: 3,
            ..text("relayed")
        }),
        golden(
            "event-hops",
            "event (18) that came through 2 spoold deliveries (flag bit 2: a u8 after the payload)",
            event(None, None),
        )
        .carrying(Payload {
            hops: 2,
            ..event_payload(None)
        }),
        golden(
            "event-trace",
            "event (18) published with a traceparent (flag bit 5: a str16 after everything else)",
            event(None, None),
        )
        .carrying(Payload {
            trace: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            ..event_payload(None)
        }),
        golden(
            "resend-hops",
            "resend (19) of a message that came through 5 spoold deliveries (flag bit 3: a u8 after the payload)",
            resend(),
        )
        .carrying(Payload {
            hops: 5,
            ..resent(None, None)
        }),
        golden(
            "enqueue-ordering",
            "enqueue (4) with an ordering key \"cus_42\" and 3 hops (flag bits 3 and 4: the key a str16 at the very end, after the hop count)",
            Command::Enqueue(EnqueueMeta {
                ordering_key: Some("cus_42".into()),
                ..match enqueue(12, None) {
                    Command::Enqueue(meta) => meta,
                    _ => unreachable!("an enqueue"),
                }
            }),
        )
        .carrying(Payload {
            hops: 3,
            ordering_key: Some("cus_42".into()),
            ..text("in order")
        }),
        golden(
            "event-ordering",
            "event (18) with a key, its fingerprint and an ordering key \"cus_42\" (flag bits 3 and 4: the key a str16 after the fingerprint)",
            Command::Event(EventMeta {
                fingerprint: Some(0x1122_3344_5566_7788),
                ordering_key: Some("cus_42".into()),
                ..match event(None, Some(0x0a0b)) {
                    Command::Event(meta) => meta,
                    _ => unreachable!("an event"),
                }
            }),
        )
        .carrying(Payload {
            ordering_key: Some("cus_42".into()),
            ..event_payload(None)
        }),
    ]
}

#[test]
fn every_record_layout_reads_its_golden_bytes_and_writes_them() {
    let file = parse(RECORDS);
    let mut missing = String::new();
    for g in records() {
        let kind = g.record.kind();
        let mut written = Vec::new();
        g.record.encode(g.payload.as_ref(), &mut written);
        let Some((golden_kind, bytes)) = file.get(g.name) else {
            missing.push_str(&entry_text(g.name, g.what, kind, &written));
            continue;
        };
        assert_eq!(*golden_kind, kind, "{}", g.name);
        let read = Record::decode(kind, bytes).unwrap_or_else(|e| panic!("{}: {e:?}", g.name));
        assert_eq!(read, g.record, "{}", g.name);
        if let Some(payload) = &g.payload {
            let read = decode_payload_of(kind, bytes).unwrap();
            assert_eq!(&read, payload, "{}: payload", g.name);
        }
        if !g.read_only {
            assert_writes(kind, &written, bytes, g.name);
        }
    }
    assert!(
        missing.is_empty(),
        "entries missing from tests/data/golden/records.txt (check them against \
         docs/journal-format.md, then append them):\n\n{missing}"
    );
    let expected: BTreeSet<&str> = records()
        .iter()
        .map(|g| g.name)
        .chain(MEMBERSHIPS)
        .collect();
    let held: BTreeSet<&str> = file.keys().map(String::as_str).collect();
    assert_eq!(held, expected, "every golden entry has its value here");
    let kinds: BTreeSet<u8> = file.values().map(|(kind, _)| *kind).collect();
    assert_eq!(
        kinds,
        (1..=22).collect(),
        "every record kind has golden bytes"
    );
}

mod checkpoints;
