//! The checkpoint half of the golden bytes (`tests/data/golden/
//! checkpoint.txt`): a state with every chunk kind, encoded and read back
//! as the parent module's records are.

use super::*;

/// Where the checkpoint's payload records lie: log segment 3 and pack 1.
const SEGMENT: u32 = 3;
const PACK: u32 = (1 << 31) + 1;

/// A state with every chunk kind: `billing` (events, a history with a
/// shared entry and one with attempts), `hooks` (a push queue managed by
/// the config and paused, with a dedup key, a retried message with
/// attempts, a failed one and an event's delivery), an event key, a
/// replica set and a retired node.
fn checkpoint_state() -> (Spool, CheckpointMeta) {
    let mut spool = Spool::new();
    let hooks = || Cow::Borrowed("hooks");
    let billing = || Cow::Borrowed("billing");
    let commands = vec![
        Command::QueueUpsert {
            name: billing(),
            settings: Box::new(QueueSettings {
                history_retention_ms: 86_400_000,
                events: vec!["invoice.*".into()],
                ..QueueSettings::default()
            }),
            managed_by_config: false,
        },
        Command::QueueUpsert {
            name: hooks(),
            settings: Box::new(QueueSettings {
                destination: Some("https://hooks.example.com/in".into()),
                dedup_window_ms: 3_600_000,
                max_retries: 1,
                ..QueueSettings::default()
            }),
            managed_by_config: true,
        },
        Command::QueuePause {
            name: hooks(),
            paused: true,
        },
        Command::Enqueue(EnqueueMeta {
            ordering_key: None,
            id: MessageId(1),
            queue: hooks(),
            visible_at: AT + 4_000,
            dedup_hash: Some(0xfeed),
        }),
        Command::Attempt {
            queue: hooks(),
            id: MessageId(1),
            attempts: vec![AttemptInfo {
                at: AT + 4_500,
                status: Some(500),
                ..AttemptInfo::default()
            }],
        },
        Command::Retry {
            queue: hooks(),
            id: MessageId(1),
            visible_at: AT + 60_000,
            retry_count: 1,
        },
        Command::Enqueue(EnqueueMeta {
            ordering_key: None,
            id: MessageId(2),
            queue: hooks(),
            visible_at: AT + 7_000,
            dedup_hash: None,
        }),
        Command::Fail {
            queue: hooks(),
            id: MessageId(2),
            reason: FailReason::PermanentStatus,
            last_status: Some(410),
            retry_count: 0,
        },
        Command::Event(EventMeta {
            ordering_key: None,
            id: MessageId(3),
            event_type: "invoice.paid".into(),
            tenant: Some("cus_42".into()),
            visible_at: AT + 9_000,
            dedup_hash: Some(0xbeef),
            fingerprint: None,
            deliveries: vec![(billing(), MessageId(4)), (hooks(), MessageId(5))],
        }),
        Command::Ack {
            queue: billing(),
            id: MessageId(4),
        },
        Command::Enqueue(EnqueueMeta {
            ordering_key: None,
            id: MessageId(6),
            queue: billing(),
            visible_at: AT + 11_000,
            dedup_hash: None,
        }),
        Command::Attempt {
            queue: billing(),
            id: MessageId(6),
            attempts: vec![AttemptInfo {
                at: AT + 12_000,
                status: Some(200),
                ..AttemptInfo::default()
            }],
        },
        Command::Ack {
            queue: billing(),
            id: MessageId(6),
        },
        Command::RaftMembership {
            config: Cow::Borrowed(b"\x02opaque replica set"),
        },
        Command::RetireNode { id: 4 },
        Command::Epoch { epoch: 3 },
    ];
    apply_in_order(&mut spool, commands, |seq| {
        let file = if seq <= 8 { PACK } else { SEGMENT };
        (AT + 1_000 * seq as i64, file)
    });
    let meta = CheckpointMeta {
        seq: spool.applied_seq(),
        next_segment_id: 4,
        next_pack_id: 2,
        salt: 0x5eed_0000_0000_0001,
        token_key: [0x42; 32],
        files: vec![SEGMENT, PACK],
    };
    (spool, meta)
}

/// Applies `commands` as the records of sequence 1, 2, …, each 150 bytes at
/// offset `64 + 200 * seq`; `place` says, by sequence, when it was written
/// and in which file.
fn apply_in_order(
    spool: &mut Spool,
    commands: Vec<Command<'static>>,
    place: impl Fn(u64) -> (i64, u32),
) {
    for (seq, command) in (1..).zip(commands) {
        let (at, file) = place(seq);
        let loc = RecordLoc {
            file,
            offset: 64 + 200 * seq as u32,
            len: 150,
        };
        spool.apply(&Record { at, command }, seq, loc);
    }
}

/// The checkpoints of the golden file, by name: a state and its meta.
/// Its chunks are entries `NAME/0`, `NAME/1`, … in order.
fn checkpoints() -> Vec<(&'static str, Spool, CheckpointMeta)> {
    let (spool, meta) = checkpoint_state();
    let (printed, printed_meta) = printed_keys_state();
    let (ordered, ordered_meta) = ordering_keys_state();
    let (catalogue, catalogue_meta) = catalogue_state();
    vec![
        ("every-chunk", spool, meta),
        ("printed-keys", printed, printed_meta),
        ("ordering-keys", ordered, ordered_meta),
        ("event-types", catalogue, catalogue_meta),
    ]
}

/// A state whose messages carry ordering keys (message flag bit 4): a
/// queue ordered per key that holds a failed message's key, two messages
/// of key "a" (the first failed), one of "b", one without a key.
fn ordering_keys_state() -> (Spool, CheckpointMeta) {
    use crate::spool::queue::{Ordering, OrderingOnFailure};
    let mut spool = Spool::new();
    let orders = || Cow::Borrowed("orders");
    let send = |id: u64, key: Option<&'static str>| {
        Command::Enqueue(EnqueueMeta {
            id: MessageId(id),
            queue: orders(),
            visible_at: AT,
            dedup_hash: None,
            ordering_key: key.map(Cow::Borrowed),
        })
    };
    let commands = vec![
        Command::QueueUpsert {
            name: orders(),
            settings: Box::new(QueueSettings {
                ordering: Ordering::PerKey,
                ordering_on_failure: OrderingOnFailure::Hold,
                ..QueueSettings::default()
            }),
            managed_by_config: false,
        },
        send(1, Some("a")),
        send(2, Some("a")),
        send(3, Some("b")),
        send(4, None),
        Command::Fail {
            queue: orders(),
            id: MessageId(1),
            reason: FailReason::PermanentStatus,
            last_status: Some(422),
            retry_count: 0,
        },
    ];
    apply_in_order(&mut spool, commands, |_| (AT, SEGMENT));
    let meta = CheckpointMeta {
        seq: spool.applied_seq(),
        next_segment_id: 4,
        next_pack_id: 1,
        salt: 0x5eed_0000_0000_0003,
        token_key: [0x33; 32],
        files: vec![SEGMENT],
    };
    (spool, meta)
}

/// A state with an event catalogue (chunk 74): two types, one of them
/// with a schema, and one defined and removed again.
fn catalogue_state() -> (Spool, CheckpointMeta) {
    let mut spool = Spool::new();
    let define = |name: &'static str, definition: &'static [u8]| Command::EventType {
        name: Cow::Borrowed(name),
        definition: Cow::Borrowed(definition),
    };
    let commands = vec![
        define(
            "invoice.paid",
            br#"{"description":"An invoice was paid","schema":{"type":"object"}}"#,
        ),
        define("order.created", br#"{"description":"An order"}"#),
        define("user.gone", br#"{"description":"Never mind"}"#),
        define("user.gone", b""),
    ];
    apply_in_order(&mut spool, commands, |_| (AT, SEGMENT));
    let meta = CheckpointMeta {
        seq: spool.applied_seq(),
        next_segment_id: 4,
        next_pack_id: 1,
        salt: 0x5eed_0000_0000_0004,
        token_key: [0x44; 32],
        files: Vec::new(),
    };
    (spool, meta)
}

/// A state whose event keys have fingerprints (chunk 72): one queue, an
/// event with a key and a fingerprint, one without a key.
fn printed_keys_state() -> (Spool, CheckpointMeta) {
    let mut spool = Spool::new();
    let audit = || Cow::Borrowed("audit");
    let event = |id: u64, dedup_hash: Option<u64>, fingerprint: Option<u64>| {
        Command::Event(EventMeta {
            ordering_key: None,
            id: MessageId(id),
            event_type: "order.created".into(),
            tenant: None,
            visible_at: AT,
            dedup_hash,
            fingerprint,
            deliveries: vec![(audit(), MessageId(id + 1))],
        })
    };
    let commands = vec![
        Command::QueueUpsert {
            name: audit(),
            settings: Box::new(QueueSettings {
                events: vec!["order.*".into()],
                ..QueueSettings::default()
            }),
            managed_by_config: false,
        },
        event(1, Some(0x0a0b), Some(0x1122_3344_5566_7788)),
        event(3, None, None),
    ];
    apply_in_order(&mut spool, commands, |_| (AT, SEGMENT));
    let meta = CheckpointMeta {
        seq: spool.applied_seq(),
        next_segment_id: 4,
        next_pack_id: 1,
        salt: 0x5eed_0000_0000_0002,
        token_key: [0x24; 32],
        files: vec![SEGMENT],
    };
    (spool, meta)
}

#[test]
fn every_checkpoint_chunk_kind_reads_its_golden_bytes_and_writes_them() {
    let file = parse(CHECKPOINT);
    let mut missing = String::new();
    let mut expected = BTreeSet::new();
    for (checkpoint, spool, meta) in checkpoints() {
        let written = spool.encode_checkpoint(&meta, &mut |u| u.loc);
        let names: Vec<String> = (0..written.len())
            .map(|i| format!("{checkpoint}/{i}"))
            .collect();
        expected.extend(names.iter().cloned());
        if !file.contains_key(&names[0]) {
            for (name, (kind, body)) in names.iter().zip(&written) {
                missing.push_str(&entry_text(name, &chunk_what(*kind, body), *kind, body));
            }
            continue;
        }
        // Read: the golden chunks, in order, are the state and its meta.
        let mut loader = CheckpointLoader::new();
        let mut i = 0;
        while let Some((kind, body)) = file.get(&format!("{checkpoint}/{i}")) {
            let name = format!("{checkpoint}/{i}");
            loader
                .chunk(*kind, body)
                .unwrap_or_else(|e| panic!("{name}: {e:?}"));
            i += 1;
        }
        let (read, read_meta) = loader.finish().unwrap();
        assert_eq!(read.state(), spool.state(), "{checkpoint}");
        assert_eq!(read_meta, meta, "{checkpoint}");
        assert_eq!(
            (read.applied_seq(), read.last_at()),
            (spool.applied_seq(), spool.last_at()),
            "{checkpoint}"
        );
        // Write: today's encoder makes the same chunks.
        assert_eq!(i, written.len(), "{checkpoint}: as many chunks");
        for (name, (kind, body)) in names.iter().zip(&written) {
            let (golden_kind, golden) = &file[name];
            assert_eq!(golden_kind, kind, "{name}");
            assert_writes(*kind, body, golden, name);
        }
    }
    assert!(
        missing.is_empty(),
        "checkpoints missing from tests/data/golden/checkpoint.txt (check them against \
         docs/journal-format.md, then append them):\n\n{missing}"
    );
    let held: BTreeSet<String> = file.keys().cloned().collect();
    assert_eq!(
        held, expected,
        "every golden chunk belongs to a checkpoint here"
    );
    let kinds: BTreeSet<u8> = file.values().map(|(kind, _)| *kind).collect();
    assert_eq!(
        kinds,
        (64..=74).collect(),
        "every chunk kind has golden bytes"
    );
}

/// What a chunk is, for its comment in the golden file.
fn chunk_what(kind: u8, body: &[u8]) -> String {
    let of_queue = |what: &str| {
        let queue = Reader::new(body).str16().expect("a queue's chunk names it");
        format!("{what} of queue {queue:?}")
    };
    match kind {
        chunk::BEGIN => "BEGIN (64)".into(),
        chunk::QUEUES => "QUEUES (65)".into(),
        chunk::MESSAGES => of_queue("MESSAGES (66)"),
        chunk::DEDUP => of_queue("DEDUP (67)"),
        chunk::END => "END (68)".into(),
        chunk::CLUSTER => "CLUSTER (69)".into(),
        chunk::EVENT_KEYS => "EVENT_KEYS (70)".into(),
        chunk::HISTORY => of_queue("HISTORY (71)"),
        chunk::EVENT_KEYS_PRINTED => "EVENT_KEYS_PRINTED (72)".into(),
        chunk::ORDERING_KEYS => of_queue("ORDERING_KEYS (73)"),
        chunk::EVENT_TYPES => "EVENT_TYPES (74)".into(),
        _ => unreachable!("not a chunk kind"),
    }
}
