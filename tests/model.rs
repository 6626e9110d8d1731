//! The model test: random sequences of sends, receives, acks, nacks, renews,
//! cancels, redrives, clock jumps, failed writes, failed fsyncs and crashes,
//! run against the real journal and state machine on fault-injecting
//! storage, and against a plain in-memory model of what must be true.
//!
//! After every step the spool must hold exactly the model's messages (queue,
//! id, retry count). After a crash (every unsynced byte dropped, or the last
//! write torn) and replay it must still hold every acknowledged, unsettled
//! message with its retry count; no acked message may come back; dedup keys
//! still answer with the first id. A send whose fsync failed is "in doubt":
//! it may or may not be there after the crash, and if it is, it is adopted.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::time::Duration;

use common::*;
use proptest::prelude::*;
use spoold::engine::{Engine, EngineError, SendRequest};
use spoold::journal::sim::{SimStorage, Tear};
use spoold::spool::{MessageId, QueueSettings};
use spoold::time::ManualClock;

const QUEUES: [&str; 2] = ["a", "b"];
const DEDUP_WINDOW_MS: i64 = 60_000;

fn settings(queue: &str) -> QueueSettings {
    match queue {
        "a" => QueueSettings {
            lease_timeout_ms: 10_000,
            max_retries: 2,
            dedup_window_ms: DEDUP_WINDOW_MS as u64,
            ..QueueSettings::default()
        },
        _ => QueueSettings {
            lease_timeout_ms: 5_000,
            max_retries: 1,
            ..QueueSettings::default()
        },
    }
}

fn max_retries(queue: &str) -> Option<u32> {
    match queue {
        "a" => Some(2),
        "b" => Some(1),
        _ => None, // failure queues
    }
}

fn lease_ms(queue: &str) -> i64 {
    let base = queue.trim_end_matches(".failed");
    settings(base).lease_timeout_ms as i64
}

#[derive(Debug, Clone)]
enum Op {
    Send {
        queue: usize,
        delayed: bool,
        key: Option<u8>,
    },
    Receive {
        queue: usize,
        failed: bool,
        max: usize,
    },
    Ack(usize),
    Nack {
        lease: usize,
        delay_ms: u64,
    },
    Renew(usize),
    Cancel(usize),
    Redrive(usize),
    Advance(i64),
    Due,
    FailWrite,
    /// The disk fills up `room` bytes from now for one send.
    FullDisk {
        room: u64,
    },
    /// Compact: only what is worth it, or every sealed segment.
    Compact {
        force: bool,
    },
    Crash {
        in_doubt: bool,
        tear: Option<u64>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..2usize, proptest::bool::weighted(0.2), proptest::option::weighted(0.3, 0..3u8))
            .prop_map(|(queue, delayed, key)| Op::Send { queue, delayed, key }),
        4 => (0..2usize, proptest::bool::weighted(0.2), 1..4usize)
            .prop_map(|(queue, failed, max)| Op::Receive { queue, failed, max }),
        3 => (0..8usize).prop_map(Op::Ack),
        3 => (0..8usize, prop_oneof![Just(0u64), Just(2_000u64)])
            .prop_map(|(lease, delay_ms)| Op::Nack { lease, delay_ms }),
        1 => (0..8usize).prop_map(Op::Renew),
        1 => (0..16usize).prop_map(Op::Cancel),
        1 => (0..2usize).prop_map(Op::Redrive),
        3 => prop_oneof![Just(1i64), Just(3_000), Just(7_000), Just(30_000)].prop_map(Op::Advance),
        2 => Just(Op::Due),
        1 => Just(Op::FailWrite),
        1 => (0..300u64).prop_map(|room| Op::FullDisk { room }),
        2 => proptest::bool::ANY.prop_map(|force| Op::Compact { force }),
        1 => (proptest::bool::ANY, proptest::option::of(0..400u64))
            .prop_map(|(in_doubt, tear)| Op::Crash { in_doubt, tear }),
    ]
}

#[derive(Debug, Clone)]
struct ModelMessage {
    queue: String,
    retry_count: u32,
    visible_at: i64,
    body: String,
}

#[derive(Debug, Clone)]
struct ModelLease {
    queue: String,
    id: MessageId,
    token: String,
    expires_at: i64,
}

#[derive(Default)]
struct Model {
    messages: BTreeMap<MessageId, ModelMessage>,
    /// Held by the engine until settled, expired by `Due`, or a restart.
    leases: Vec<ModelLease>,
    acked: BTreeSet<MessageId>,
    /// (queue, key) → (first send time, id).
    keys: BTreeMap<(String, u8), (i64, MessageId)>,
    /// Bodies of sends whose fsync failed.
    in_doubt: BTreeSet<String>,
    next_body: u64,
}

impl Model {
    fn lease_of(&self, id: MessageId) -> Option<&ModelLease> {
        self.leases.iter().find(|l| l.id == id)
    }

    /// Where a nack or an expired lease sends a message.
    /// A nack (or expired lease) at `now`: visible again at `visible_at`,
    /// or in the failure queue at once when retries are exhausted.
    fn retry(&mut self, id: MessageId, visible_at: i64, now: i64) {
        let m = self.messages.get_mut(&id).unwrap();
        let exhausted = max_retries(&m.queue).is_some_and(|max| m.retry_count + 1 > max);
        if exhausted {
            m.queue = format!("{}.failed", m.queue);
            m.visible_at = now;
        } else {
            m.retry_count += 1;
            m.visible_at = visible_at;
        }
    }
}

fn check_state(engine: &Engine, model: &Model, step: &str) {
    let actual: Vec<(String, MessageId, u32)> = engine
        .all_messages()
        .into_iter()
        .map(|(q, id, m)| (q, id, m.retry_count))
        .collect();
    let expected: Vec<(String, MessageId, u32)> = model
        .messages
        .iter()
        .map(|(id, m)| (m.queue.clone(), *id, m.retry_count))
        .collect();
    assert_eq!(actual, expected, "after {step}");
    for id in &model.acked {
        assert!(
            !actual.iter().any(|(_, a, _)| a == id),
            "acked {id:?} came back after {step}"
        );
    }
}

async fn run(ops: Vec<Op>, small_preallocated_segments: bool) {
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let mut options = sim_options(&sim, &clock);
    if small_preallocated_segments {
        options.segment_bytes = 512;
        options.preallocate = true;
    }
    let reopen = || Engine::open(options.clone());
    let mut engine = reopen().await.unwrap().0;
    for q in QUEUES {
        make_queue(&engine, q, settings(q)).await;
    }
    let mut model = Model::default();

    for (step, op) in ops.into_iter().enumerate() {
        let now = clock_now(&clock);
        let label = format!("step {step}: {op:?}");
        match op {
            Op::Send {
                queue,
                delayed,
                key,
            } => {
                let queue = QUEUES[queue];
                // Keys only on the queue with a dedup window.
                let key = key.filter(|_| queue == "a");
                model.next_body += 1;
                let text = format!("m{}", model.next_body);
                let request = SendRequest {
                    delay_ms: if delayed { 1_000 } else { 0 },
                    dedup_key: key.map(|k| format!("key-{k}")),
                    ..body(&text)
                };
                let out = engine.send(queue, request).await.unwrap();
                let live_key = key.and_then(|k| {
                    model
                        .keys
                        .get(&(queue.to_string(), k))
                        .filter(|(first, _)| first + DEDUP_WINDOW_MS > now)
                        .map(|&(_, id)| id)
                });
                match live_key {
                    Some(first) => {
                        assert!(out.deduplicated, "{label}: key inside its window");
                        assert_eq!(out.id, first, "{label}");
                    }
                    None => {
                        assert!(!out.deduplicated, "{label}");
                        if let Some(k) = key {
                            model.keys.insert((queue.to_string(), k), (now, out.id));
                        }
                        model.messages.insert(
                            out.id,
                            ModelMessage {
                                queue: queue.to_string(),
                                retry_count: 0,
                                visible_at: now + if delayed { 1_000 } else { 0 },
                                body: text,
                            },
                        );
                    }
                }
            }
            Op::Receive { queue, failed, max } => {
                let queue = if failed {
                    format!("{}.failed", QUEUES[queue])
                } else {
                    QUEUES[queue].to_string()
                };
                let got = engine.receive(&queue, max, Duration::ZERO).await.unwrap();
                // Longest-waiting first among the visible, unleased ones.
                let mut line: Vec<(i64, MessageId)> = model
                    .messages
                    .iter()
                    .filter(|(id, m)| {
                        m.queue == queue && m.visible_at <= now && model.lease_of(**id).is_none()
                    })
                    .map(|(id, m)| (m.visible_at, *id))
                    .collect();
                line.sort();
                let expected: Vec<MessageId> = line.iter().take(max).map(|&(_, id)| id).collect();
                let ids: Vec<MessageId> = got.iter().map(|d| d.id).collect();
                assert_eq!(ids, expected, "{label}");
                for d in got {
                    let m = &model.messages[&d.id];
                    assert_eq!(d.retry_count, m.retry_count, "{label}");
                    assert_eq!(d.payload.body, m.body.as_bytes(), "{label}");
                    model.leases.push(ModelLease {
                        queue: queue.clone(),
                        id: d.id,
                        token: d.token,
                        expires_at: now + lease_ms(&queue),
                    });
                }
            }
            Op::Ack(i) | Op::Nack { lease: i, .. } | Op::Renew(i) if i >= model.leases.len() => {}
            Op::Ack(i) => {
                let lease = model.leases[i].clone();
                let valid = now < lease.expires_at;
                let result = engine.ack(&lease.queue, &lease.token).await;
                assert_eq!(result.is_ok(), valid, "{label}: {result:?}");
                if valid {
                    model.leases.remove(i);
                    model.messages.remove(&lease.id);
                    model.acked.insert(lease.id);
                } else {
                    assert!(matches!(result, Err(EngineError::StaleLease)), "{label}");
                }
            }
            Op::Nack { lease: i, delay_ms } => {
                let lease = model.leases[i].clone();
                let valid = now < lease.expires_at;
                let result = engine.nack(&lease.queue, &lease.token, delay_ms).await;
                assert_eq!(result.is_ok(), valid, "{label}: {result:?}");
                if valid {
                    model.leases.remove(i);
                    model.retry(lease.id, now + delay_ms as i64, now);
                }
            }
            Op::Renew(i) => {
                let lease = &mut model.leases[i];
                let valid = now < lease.expires_at;
                let result = engine.renew(&lease.queue, &lease.token);
                assert_eq!(result.is_ok(), valid, "{label}: {result:?}");
                if let Ok(expires_at) = result {
                    lease.expires_at = now + lease_ms(&lease.queue);
                    assert_eq!(expires_at, lease.expires_at, "{label}");
                }
            }
            Op::Cancel(i) => {
                let Some((&id, m)) = model.messages.iter().nth(i) else {
                    continue;
                };
                let queue = m.queue.clone();
                engine.cancel(&queue, id).await.unwrap();
                model.messages.remove(&id);
                model.acked.insert(id);
                model.leases.retain(|l| l.id != id);
            }
            Op::Redrive(q) => {
                let queue = QUEUES[q];
                let failed = format!("{queue}.failed");
                let movable: Vec<MessageId> = model
                    .messages
                    .iter()
                    .filter(|(id, m)| m.queue == failed && model.lease_of(**id).is_none())
                    .map(|(id, _)| *id)
                    .take(10)
                    .collect();
                assert_eq!(
                    engine.redrive(queue, 10, None, true).await.unwrap(),
                    movable.len() as u64
                );
                assert_eq!(
                    engine.redrive(queue, 10, None, false).await.unwrap(),
                    movable.len() as u64
                );
                for id in movable {
                    let m = model.messages.get_mut(&id).unwrap();
                    m.queue = queue.to_string();
                    m.retry_count = 0;
                    m.visible_at = now;
                }
            }
            Op::Advance(ms) => clock.advance_ms(ms),
            Op::Due => {
                let expired: Vec<ModelLease> = model
                    .leases
                    .iter()
                    .filter(|l| l.expires_at <= now)
                    .cloned()
                    .collect();
                let written = engine.run_due().await;
                assert_eq!(written, expired.len(), "{label}");
                model.leases.retain(|l| l.expires_at > now);
                for l in expired {
                    model.retry(l.id, now, now);
                }
            }
            Op::FailWrite => {
                sim.fail_write(0, io::ErrorKind::StorageFull);
                let err = engine.send("b", body("never stored")).await.unwrap_err();
                assert!(
                    matches!(err, EngineError::Unavailable { .. }),
                    "{label}: {err:?}"
                );
            }
            Op::FullDisk { room } => {
                model.next_body += 1;
                let text = format!("m{}", model.next_body);
                sim.set_capacity(Some(sim.total_bytes() + room));
                let sent = engine.send("b", body(&text)).await;
                sim.set_capacity(None);
                match sent {
                    Ok(out) => {
                        model.messages.insert(
                            out.id,
                            ModelMessage {
                                queue: "b".into(),
                                retry_count: 0,
                                visible_at: now,
                                body: text,
                            },
                        );
                    }
                    // Rolled back: not stored.
                    Err(EngineError::Unavailable { .. }) => {}
                    Err(other) => panic!("{label}: {other:?}"),
                }
            }
            Op::Compact { force } => {
                engine
                    .compact_all(force)
                    .await
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
            }
            Op::Crash { in_doubt, tear } => {
                if in_doubt {
                    model.next_body += 1;
                    let text = format!("m{}", model.next_body);
                    sim.fail_sync(0);
                    match engine.send("b", body(&text)).await.unwrap_err() {
                        // The record's own fsync failed: it may be there.
                        EngineError::Unconfirmed { .. } => {
                            model.in_doubt.insert(text);
                        }
                        // The fsync of a new segment's header failed: the
                        // segment was removed and nothing was written.
                        EngineError::Unavailable { .. } => {}
                        other => panic!("{label}: {other:?}"),
                    }
                }
                drop(engine);
                sim.crash(match tear {
                    Some(n) => Tear::KeepPrefix(n),
                    None => Tear::DropUnsynced,
                });
                engine = open(&sim, &clock)
                    .await
                    .unwrap_or_else(|e| panic!("{label}: replay failed: {e}"));
                model.leases.clear();
                adopt_in_doubt(&engine, &mut model, &label).await;
            }
        }
        check_state(&engine, &model, &label);
    }
}

/// A send whose fsync failed may have reached the disk after all; if replay
/// found it, the model takes it in (once).
async fn adopt_in_doubt(engine: &Engine, model: &mut Model, label: &str) {
    for (queue, id, m) in engine.all_messages() {
        if model.messages.contains_key(&id) {
            continue;
        }
        let payload = engine.payload(&queue, id).unwrap();
        let text = String::from_utf8(payload.body.to_vec()).unwrap();
        assert!(
            model.in_doubt.remove(&text),
            "{label}: unexpected message {text} in {queue}"
        );
        assert!(!model.acked.contains(&id), "{label}");
        model.messages.insert(
            id,
            ModelMessage {
                queue,
                retry_count: m.retry_count,
                visible_at: m.visible_at,
                body: text,
            },
        );
    }
}

fn clock_now(clock: &ManualClock) -> i64 {
    use spoold::time::Clock;
    clock.now_ms()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct("proptest-regressions/model.txt"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn journal_and_state_machine_match_the_model(
        ops in proptest::collection::vec(op(), 1..150),
        small_preallocated_segments in proptest::bool::ANY,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(run(ops, small_preallocated_segments));
    }
}
