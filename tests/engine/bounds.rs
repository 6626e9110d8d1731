//! Random sizes around every bound the engine keeps, through crashes
//! (issue 38): bodies just under and just past the journal's record bound,
//! a state's memory at `max_memory`, the queue count at `max_queues`, the
//! disk at `max_bytes`. Whatever was acknowledged is there after a crash
//! and a restart, byte for byte; whatever was refused is not; and every
//! refusal is the bound's own (`TooLarge`, `MemoryFull`, `LimitReached`,
//! `SpoolFull`), never a lost write.
//!
//! `BOUNDS_CASES` sets how many cases run (each may write a 256 MiB
//! record, so CI runs few).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use proptest::prelude::*;
use spoold::engine::{Engine, Origin, QueueError, SendError, WriteError};
use spoold::spool::{MessageId, QueueSettings};
use spoold::testing::{SimStorage, Tear};
use spoold::time::ManualClock;

/// The journal's record bound (`RECORD_BODY_MAX_BYTES`).
const RECORD_MAX: usize = 256 << 20;

#[derive(Debug, Clone)]
enum Op {
    /// Create queue `q{n}` of four names (`max_queues` is 3).
    Create(u8),
    /// `count` small sends of `size` bytes to `q{n}`.
    Sends { queue: u8, count: u8, size: u16 },
    /// One send whose body is the record bound plus `delta` (the record
    /// adds its own fields: anything from about 70 bytes under the bound
    /// on is refused).
    NearRecordBound { queue: u8, delta: i16 },
    /// Receive and ack up to `max` messages of `q{n}`.
    Ack { queue: u8, max: u8 },
    /// Compact what can be compacted.
    Compact,
    /// Drop unsynced bytes and restart.
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..4u8).prop_map(Op::Create),
        6 => (0..4u8, 1..40u8, 0..2048u16)
            .prop_map(|(queue, count, size)| Op::Sends { queue, count, size }),
        2 => (0..4u8, -128..128i16).prop_map(|(queue, delta)| Op::NearRecordBound { queue, delta }),
        3 => (0..4u8, 1..40u8).prop_map(|(queue, max)| Op::Ack { queue, max }),
        1 => Just(Op::Compact),
        2 => Just(Op::Crash),
    ]
}

/// A body that names its message: `tag` then a byte pattern to `len`.
fn body_of(tag: u64, len: usize) -> Vec<u8> {
    let mut b = format!("{tag:08}").into_bytes();
    b.resize(len.max(8), (tag % 251) as u8);
    b.truncate(len.max(8));
    b
}

/// (length, first bytes, a checksum) of a body: enough to tell two apart
/// without keeping 256 MiB ones.
fn digest(b: &[u8]) -> (usize, u32) {
    (
        b.len(),
        b.iter().fold(0u32, |h, &x| h.rotate_left(5) ^ u32::from(x)),
    )
}

struct World {
    sim: SimStorage,
    clock: ManualClock,
    engine: Engine,
    /// Acknowledged and not acked: queue, id → body digest.
    live: BTreeMap<(String, MessageId), (usize, u32)>,
    tag: u64,
    /// How many writes each bound refused.
    refusals: BTreeMap<&'static str, usize>,
}

impl World {
    fn options(sim: &SimStorage, clock: &ManualClock) -> spoold::engine::EngineOptions {
        let mut options = sim_options(sim, clock);
        options.segment_bytes = 1 << 20;
        options.max_bytes = 400 << 20;
        options.max_memory = 16 << 10;
        options.policy.max_queues = 3;
        options
    }

    async fn restart(&mut self) {
        self.engine.close();
        self.sim.crash(Tear::DropUnsynced);
        let (engine, _) = Engine::open(World::options(&self.sim, &self.clock))
            .await
            .unwrap();
        self.engine = engine;
        // Whatever was acknowledged is there, byte for byte.
        let found: BTreeMap<(String, MessageId), (usize, u32)> = self
            .engine
            .all_messages()
            .into_iter()
            .map(|(q, id, _)| {
                let payload = self.engine.payload(&q, id).unwrap();
                ((q, id), digest(&payload.body))
            })
            .collect();
        for (key, d) in &self.live {
            assert_eq!(
                found.get(key),
                Some(d),
                "acknowledged {key:?} lost or changed"
            );
        }
        assert_eq!(
            found.len(),
            self.live.len(),
            "a message nobody acknowledged appeared"
        );
    }

    fn refused(&mut self, bound: &'static str) {
        *self.refusals.entry(bound).or_default() += 1;
    }

    async fn start() -> World {
        let sim = SimStorage::new();
        let clock = ManualClock::new(START_MS);
        let (engine, _) = Engine::open(World::options(&sim, &clock)).await.unwrap();
        World {
            sim,
            clock,
            engine,
            live: BTreeMap::new(),
            tag: 0,
            refusals: BTreeMap::new(),
        }
    }

    async fn send(&mut self, queue: &str, len: usize) {
        self.tag += 1;
        let bytes = body_of(self.tag, len);
        let d = digest(&bytes);
        let mut request = body("");
        request.payload.body = bytes.into();
        match self.engine.send(queue, request).await {
            Ok(out) => {
                assert!(
                    len <= RECORD_MAX,
                    "a body past the record bound was acknowledged"
                );
                self.live.insert((queue.to_owned(), out.id), d);
            }
            Err(SendError::Write(WriteError::TooLarge(e))) => {
                assert!(len + 128 > e.limit_bytes, "{len} refused as too large");
                self.refused("too_large");
            }
            Err(SendError::Write(WriteError::MemoryFull {
                accounted_bytes,
                max_memory,
            })) => {
                assert!(
                    accounted_bytes + 1024 > max_memory,
                    "{accounted_bytes} of {max_memory}"
                );
                self.refused("memory_full");
            }
            Err(SendError::SpoolFull { .. }) => self.refused("spool_full"),
            Err(SendError::QueueNotFound { .. }) => {}
            Err(other) => panic!("{queue} {len}: {other:?}"),
        }
    }

    async fn run(&mut self, op: Op) {
        let name = |n: u8| format!("q{n}");
        match op {
            Op::Create(n) => {
                let existing = self.engine.queue_settings(&name(n)).is_ok();
                match self
                    .engine
                    .upsert_queue(&name(n), QueueSettings::default(), Origin::Api)
                    .await
                {
                    Ok(_) => {}
                    Err(QueueError::LimitReached { max }) => {
                        assert!(!existing, "a change refused as a create");
                        assert_eq!(max, 3);
                        self.refused("queue_limit");
                    }
                    Err(other) => panic!("{other:?}"),
                }
            }
            Op::Sends { queue, count, size } => {
                for _ in 0..count {
                    self.send(&name(queue), usize::from(size)).await;
                }
            }
            Op::NearRecordBound { queue, delta } => {
                let len = (RECORD_MAX as isize + isize::from(delta)) as usize;
                self.send(&name(queue), len).await;
            }
            Op::Ack { queue, max } => {
                let got = self
                    .engine
                    .receive(&name(queue), usize::from(max), Duration::ZERO)
                    .await
                    .unwrap_or_default();
                for d in got {
                    self.engine.ack(&name(queue), &d.token).await.unwrap();
                    self.live.remove(&(name(queue), d.id));
                }
            }
            Op::Compact => {
                self.engine.compact_all(true).await.unwrap();
            }
            Op::Crash => self.restart().await,
        }
    }
}

fn cases() -> u32 {
    std::env::var("BOUNDS_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn nothing_acknowledged_is_lost_at_any_bound(ops in prop::collection::vec(op(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let mut world = World::start().await;
            for op in ops {
                world.run(op).await;
            }
            world.restart().await;
        });
    }
}

/// Each bound once, in order, so that a change that stops one from
/// refusing fails here even when the random cases miss it.
#[tokio::test(flavor = "current_thread")]
async fn every_bound_refuses_and_keeps_what_it_acknowledged() {
    let mut world = World::start().await;
    for n in 0..4 {
        world.run(Op::Create(n)).await;
    }
    world
        .run(Op::NearRecordBound {
            queue: 0,
            delta: 64,
        })
        .await;
    // 200 MiB twice: the second passes `max_bytes` (400 MiB).
    world.send("q0", 200 << 20).await;
    world.send("q1", 200 << 20).await;
    world.run(Op::Crash).await;
    for _ in 0..4 {
        world
            .run(Op::Sends {
                queue: 2,
                count: 40,
                size: 10,
            })
            .await;
    }
    world.run(Op::Crash).await;
    let refusals: Vec<_> = world.refusals.keys().copied().collect();
    assert_eq!(
        refusals,
        ["memory_full", "queue_limit", "spool_full", "too_large"]
    );
    assert!(world.live.len() > 40, "{} acknowledged", world.live.len());
}

/// The event catalogue's bound (`engine/catalogue.rs`): a thousand types,
/// then `Full`; a redefinition or a removal makes room as it should, and
/// what was acknowledged is there after a crash.
#[tokio::test(flavor = "current_thread")]
async fn the_event_catalogue_holds_a_thousand_types() {
    use spoold::engine::{CatalogueError, EventTypeDef};
    let sim = SimStorage::new();
    let clock = ManualClock::new(START_MS);
    let options = || {
        let mut options = sim_options(&sim, &clock);
        options.segment_bytes = 1 << 20;
        options
    };
    let (engine, _) = Engine::open(options()).await.unwrap();
    let def = |n: usize| EventTypeDef {
        description: format!("type {n}"),
        ..EventTypeDef::default()
    };
    for n in 0..1000 {
        assert!(
            engine
                .put_event_type(&format!("t.n{n}"), &def(n))
                .await
                .unwrap()
        );
    }
    let full = engine.put_event_type("t.more", &def(1000)).await;
    assert!(matches!(full, Err(CatalogueError::Full)), "{full:?}");
    // Redefining one adds nothing; removing one makes room for another.
    assert!(!engine.put_event_type("t.n7", &def(7_000)).await.unwrap());
    engine.delete_event_type("t.n8").await.unwrap();
    assert!(engine.put_event_type("t.more", &def(1000)).await.unwrap());
    let too_big = EventTypeDef {
        description: "x".repeat(70_000),
        ..EventTypeDef::default()
    };
    let refused = engine.put_event_type("t.n9", &too_big).await;
    assert!(
        matches!(refused, Err(CatalogueError::Invalid(_))),
        "{refused:?}"
    );

    engine.close();
    sim.crash(Tear::DropUnsynced);
    let (engine, _) = Engine::open(options()).await.unwrap();
    assert_eq!(engine.event_type_count(), 1000);
    assert_eq!(engine.event_type("t.n7").unwrap().description, "type 7000");
    assert_eq!(engine.event_type("t.n9").unwrap().description, "type 9");
    assert!(engine.event_type("t.n8").is_none());
}
