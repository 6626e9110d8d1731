//! The ordering rule of `keys.rs` driven with explicit times: one message
//! of a key out at a time, in id order, the others flowing; retries hold
//! their key, a failure releases it (or, with `hold`, keeps it until the
//! failed message is redriven or gone); turning ordering on and off; a
//! checkpoint round trip keeps the keys.

use std::borrow::Cow;

use crate::journal::RecordLoc;
use crate::spool::command::{Command, EnqueueMeta, FailReason, MessageId, Record};
use crate::spool::queue::{Ordering, OrderingOnFailure, QueueSettings};
use crate::spool::state::{Leased, Spool};

const LOC: RecordLoc = RecordLoc {
    file: 1,
    offset: 64,
    len: 100,
};

fn apply(spool: &mut Spool, at: i64, command: Command<'static>) {
    let seq = spool.applied_seq() + 1;
    spool.apply(&Record { at, command }, seq, LOC);
}

fn settings(hold: bool) -> QueueSettings {
    QueueSettings {
        max_retries: 1,
        ordering: Ordering::PerKey,
        ordering_on_failure: if hold {
            OrderingOnFailure::Hold
        } else {
            OrderingOnFailure::Release
        },
        ..QueueSettings::default()
    }
}

fn upsert(spool: &mut Spool, settings: QueueSettings) {
    apply(
        spool,
        0,
        Command::QueueUpsert {
            name: "q".into(),
            settings: Box::new(settings),
            managed_by_config: false,
        },
    );
}

fn send(spool: &mut Spool, at: i64, key: Option<&'static str>) -> MessageId {
    let id = spool.allocate_id();
    apply(
        spool,
        at,
        Command::Enqueue(EnqueueMeta {
            id,
            queue: "q".into(),
            visible_at: at,
            dedup_hash: None,
            ordering_key: key.map(Cow::Borrowed),
        }),
    );
    id
}

fn lease(spool: &mut Spool, now: i64, max: usize) -> Vec<Leased> {
    spool.lease("q", now, 1_000, max, false).unwrap()
}

fn ids(leased: &[Leased]) -> Vec<MessageId> {
    leased.iter().map(|l| l.id).collect()
}

fn ack(spool: &mut Spool, now: i64, l: &Leased) {
    spool.reserve_settle("q", l.id, l.serial, now).unwrap();
    let (queue, id) = ("q".into(), l.id);
    apply(spool, now, Command::Ack { queue, id });
}

fn nack(spool: &mut Spool, now: i64, l: &Leased) {
    let cmd = spool
        .reserve_nack("q", l.id, l.serial, now, 0, Some(503))
        .unwrap();
    apply(spool, now, cmd);
}

/// A permanent failure of leased `l`: to the failure queue.
fn fail(spool: &mut Spool, now: i64, l: &Leased) {
    spool.reserve_settle("q", l.id, l.serial, now).unwrap();
    let fail = Command::Fail {
        queue: "q".into(),
        id: l.id,
        reason: FailReason::PermanentStatus,
        last_status: Some(410),
        retry_count: 0,
    };
    apply(spool, now, fail);
}

#[test]
fn one_message_of_a_key_at_a_time_in_order_and_other_keys_flow() {
    let mut spool = Spool::new();
    upsert(&mut spool, settings(false));
    let a1 = send(&mut spool, 10, Some("a"));
    let a2 = send(&mut spool, 11, Some("a"));
    let b1 = send(&mut spool, 12, Some("b"));
    let free = send(&mut spool, 13, None);
    let a3 = send(&mut spool, 14, Some("a"));
    let stats = spool.stats("q", 20).unwrap();
    assert_eq!((stats.visible, stats.held), (3, 2));
    let first = lease(&mut spool, 20, 10);
    assert_eq!(ids(&first), vec![a1, b1, free]);
    // a1 in flight: a2 and a3 wait.
    assert!(lease(&mut spool, 21, 10).is_empty());
    // A retry of a1 holds its key: a1 comes back before a2.
    nack(&mut spool, 22, &first[0]);
    let again = lease(&mut spool, 23, 10);
    assert_eq!(ids(&again), vec![a1]);
    ack(&mut spool, 24, &again[0]);
    let next = lease(&mut spool, 25, 10);
    assert_eq!(ids(&next), vec![a2]);
    ack(&mut spool, 26, &next[0]);
    assert_eq!(ids(&lease(&mut spool, 27, 10)), vec![a3]);
    assert_eq!(spool.stats("q", 27).unwrap().held, 0);
}

#[test]
fn a_failure_releases_its_key_or_holds_it_until_redriven() {
    for hold in [false, true] {
        let mut spool = Spool::new();
        upsert(&mut spool, settings(hold));
        let a1 = send(&mut spool, 10, Some("a"));
        let a2 = send(&mut spool, 11, Some("a"));
        let l = lease(&mut spool, 20, 10);
        nack(&mut spool, 21, &l[0]);
        let l = lease(&mut spool, 22, 10);
        assert_eq!(ids(&l), vec![a1]);
        // Past max_retries: to the failure queue.
        nack(&mut spool, 23, &l[0]);
        assert_eq!(spool.stats("q.failed", 24).unwrap().visible, 1);
        let next = lease(&mut spool, 24, 10);
        if !hold {
            assert_eq!(ids(&next), vec![a2], "release: the next one goes");
            continue;
        }
        assert!(next.is_empty(), "hold: a2 waits for an operator");
        assert_eq!(spool.stats("q", 24).unwrap().held, 1);
        // Redriven, a1 is first of its key again, before a2.
        let cmd = Command::Redrive {
            queue: "q".into(),
            ids: vec![a1],
        };
        apply(&mut spool, 25, cmd);
        let l = lease(&mut spool, 26, 10);
        assert_eq!(ids(&l), vec![a1]);
        ack(&mut spool, 27, &l[0]);
        assert_eq!(ids(&lease(&mut spool, 28, 10)), vec![a2]);
    }
}

#[test]
fn a_held_key_is_freed_when_its_failed_message_is_purged() {
    let mut spool = Spool::new();
    upsert(&mut spool, settings(true));
    let a1 = send(&mut spool, 10, Some("a"));
    let a2 = send(&mut spool, 11, Some("a"));
    let l = lease(&mut spool, 20, 10);
    fail(&mut spool, 21, &l[0]);
    assert!(lease(&mut spool, 22, 10).is_empty());
    let purge = Command::Purge {
        queue: "q.failed".into(),
        ids: vec![a1],
    };
    apply(&mut spool, 23, purge);
    assert_eq!(ids(&lease(&mut spool, 24, 10)), vec![a2]);
}

#[test]
fn turning_ordering_on_and_off_keeps_what_is_in_flight() {
    let mut spool = Spool::new();
    upsert(&mut spool, QueueSettings::default());
    let a1 = send(&mut spool, 10, Some("a"));
    let a2 = send(&mut spool, 11, Some("a"));
    let a3 = send(&mut spool, 12, Some("a"));
    // Unordered: the key is kept, not obeyed.
    let l = lease(&mut spool, 20, 1);
    assert_eq!(ids(&l), vec![a1]);
    upsert(&mut spool, settings(false));
    // a1 is in flight: it stays its key's out, the rest wait.
    assert!(lease(&mut spool, 21, 10).is_empty());
    ack(&mut spool, 22, &l[0]);
    let l = lease(&mut spool, 23, 10);
    assert_eq!(ids(&l), vec![a2]);
    upsert(&mut spool, QueueSettings::default());
    assert_eq!(ids(&lease(&mut spool, 24, 10)), vec![a3]);
}

#[test]
fn a_restart_drops_leases_and_the_first_of_each_key_goes_again() {
    let mut spool = Spool::new();
    upsert(&mut spool, settings(false));
    let a1 = send(&mut spool, 10, Some("a"));
    send(&mut spool, 11, Some("a"));
    assert_eq!(ids(&lease(&mut spool, 20, 10)), vec![a1]);
    spool.drop_leases();
    assert_eq!(ids(&lease(&mut spool, 21, 10)), vec![a1]);
}

#[test]
fn a_checkpoint_keeps_each_message_key_and_what_is_held() {
    let mut spool = Spool::new();
    upsert(&mut spool, settings(true));
    let a1 = send(&mut spool, 10, Some("a"));
    let a2 = send(&mut spool, 11, Some("a"));
    let b1 = send(&mut spool, 12, Some("b"));
    let l = lease(&mut spool, 20, 10);
    assert_eq!(ids(&l), vec![a1, b1]);
    fail(&mut spool, 21, &l[0]);
    let mut restored = round_trip(&spool);
    // a1 waits in the failure queue (hold): a2 stays held.
    assert_eq!(ids(&lease(&mut restored, 30, 10)), vec![b1]);
    assert_eq!(restored.stats("q", 30).unwrap().held, 1);
    let redrive = Command::Redrive {
        queue: "q".into(),
        ids: vec![a1],
    };
    apply(&mut restored, 31, redrive);
    let l = lease(&mut restored, 32, 10);
    assert_eq!(ids(&l), vec![a1]);
    ack(&mut restored, 33, &l[0]);
    assert_eq!(ids(&lease(&mut restored, 34, 10)), vec![a2]);
}

/// `spool` written as a checkpoint and read back.
fn round_trip(spool: &Spool) -> Spool {
    use crate::spool::checkpoint::{CheckpointLoader, CheckpointMeta};
    let meta = CheckpointMeta {
        seq: spool.applied_seq(),
        ..CheckpointMeta::default()
    };
    let mut loader = CheckpointLoader::new();
    for (kind, body) in spool.encode_checkpoint(&meta, &mut |u| u.loc) {
        loader.chunk(kind, &body).unwrap();
    }
    let (back, _) = loader.finish().unwrap();
    assert_eq!(back.state(), spool.state());
    back
}

#[test]
fn ordering_turned_on_over_two_leases_of_a_key_lets_none_out_until_both_end() {
    let mut spool = Spool::new();
    upsert(&mut spool, QueueSettings::default());
    let a1 = send(&mut spool, 10, Some("a"));
    let a2 = send(&mut spool, 11, Some("a"));
    let a3 = send(&mut spool, 12, Some("a"));
    let l = lease(&mut spool, 20, 2);
    assert_eq!(ids(&l), vec![a1, a2]);
    upsert(&mut spool, settings(false));
    ack(&mut spool, 21, &l[0]);
    // a2 is still in flight: a3 waits.
    assert!(lease(&mut spool, 22, 10).is_empty());
    ack(&mut spool, 23, &l[1]);
    assert_eq!(ids(&lease(&mut spool, 24, 10)), vec![a3]);
}
