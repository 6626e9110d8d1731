//! Timing and bookkeeping rules of the state machine, driven with explicit
//! `now` values: no sleeping, no disk.

use std::borrow::Cow;

use super::*;
use crate::journal::RecordLoc;

const LOC: RecordLoc = RecordLoc {
    file: 1,
    offset: 64,
    len: 100,
};

fn apply(spool: &mut Spool, at: i64, command: Command<'static>) -> Applied {
    let seq = spool.applied_seq() + 1;
    spool.apply(&Record { at, command }, seq, LOC)
}

fn with_queue(settings: QueueSettings) -> Spool {
    let mut spool = Spool::new();
    apply(
        &mut spool,
        0,
        Command::QueueUpsert {
            name: "q".into(),
            settings: Box::new(settings),
            managed_by_config: false,
        },
    );
    spool
}

fn send(spool: &mut Spool, at: i64, visible_at: i64) -> MessageId {
    let id = spool.allocate_id();
    apply(
        spool,
        at,
        Command::Enqueue(EnqueueMeta {
            ordering_key: None,
            id,
            queue: "q".into(),
            visible_at,
            dedup_hash: None,
        }),
    );
    id
}

fn ack(spool: &mut Spool, now: i64, leased: &Leased) -> Result<(), SpoolError> {
    spool.reserve_settle("q", leased.id, leased.serial, now)?;
    apply(
        spool,
        now,
        Command::Ack {
            queue: "q".into(),
            id: leased.id,
        },
    );
    Ok(())
}

fn nack(spool: &mut Spool, now: i64, leased: &Leased, delay_ms: u64) {
    let cmd = spool
        .reserve_nack("q", leased.id, leased.serial, now, delay_ms, None)
        .unwrap();
    apply(spool, now, cmd);
}

fn tick(spool: &mut Spool, now: i64) {
    for cmd in spool.due(now, 1000) {
        apply(spool, now, cmd);
    }
}

#[test]
fn longest_waiting_first_and_a_nacked_message_goes_to_the_back() {
    let mut spool = with_queue(QueueSettings::default());
    let a = send(&mut spool, 10, 10);
    let b = send(&mut spool, 20, 20);
    let first = spool.lease("q", 30, 1000, 1, false).unwrap();
    assert_eq!(first[0].id, a);
    nack(&mut spool, 40, &first[0], 0);
    let c = send(&mut spool, 50, 50);
    let order: Vec<MessageId> = spool
        .lease("q", 60, 1000, 10, false)
        .unwrap()
        .iter()
        .map(|l| l.id)
        .collect();
    assert_eq!(order, vec![b, a, c]);
}

#[test]
fn delayed_messages_wait_and_do_not_lose_retention() {
    let settings = QueueSettings {
        retention_ms: 100,
        ..QueueSettings::default()
    };
    let mut spool = with_queue(settings);
    let id = send(&mut spool, 0, 1_000);
    assert!(spool.lease("q", 999, 10, 1, false).unwrap().is_empty());
    let stats = spool.stats("q", 500).unwrap();
    assert_eq!((stats.visible, stats.delayed), (0, 1));
    tick(&mut spool, 1_050);
    assert_eq!(
        spool.stats("q", 1_050).unwrap().counters.expired,
        0,
        "delay does not eat retention"
    );
    tick(&mut spool, 1_100);
    let stats = spool.stats("q", 1_100).unwrap();
    assert_eq!(stats.counters.expired, 1);
    assert!(spool.get("q", id, 1_100).is_err());
}

#[test]
fn lease_expiry_retries_and_eventually_fails_with_origin() {
    let settings = QueueSettings {
        max_retries: 1,
        lease_timeout_ms: 100,
        ..QueueSettings::default()
    };
    let mut spool = with_queue(settings);
    let id = send(&mut spool, 0, 0);
    let l = spool.lease("q", 0, 100, 1, false).unwrap()[0];
    assert_eq!(
        spool.reserve_settle("q", id, l.serial, 100),
        Err(SpoolError::StaleLease),
        "stale from the moment now reaches the expiry, before the auto-nack"
    );
    tick(&mut spool, 100);
    let l = spool.lease("q", 100, 100, 1, false).unwrap()[0];
    assert_eq!(l.message.retry_count, 1);
    tick(&mut spool, 200);
    assert!(spool.lease("q", 200, 100, 1, false).unwrap().is_empty());
    let failed = spool
        .peek("q.failed", &DeadLetterFilter::default(), None, 10, 200)
        .unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].id, id);
    assert_eq!(failed[0].message.retry_count, 1);
    assert_eq!(
        failed[0].failure.unwrap().reason,
        FailReason::RetriesExhausted
    );
    assert_eq!(spool.stats("q", 200).unwrap().counters.failed, 1);
}

#[test]
fn consumer_sees_a_message_max_retries_plus_one_times() {
    let settings = QueueSettings {
        max_retries: 3,
        ..QueueSettings::default()
    };
    let mut spool = with_queue(settings);
    send(&mut spool, 0, 0);
    let mut deliveries = 0;
    while let Some(l) = spool
        .lease("q", 10, 1000, 1, false)
        .unwrap()
        .first()
        .copied()
    {
        deliveries += 1;
        nack(&mut spool, 10, &l, 0);
    }
    assert_eq!(deliveries, 4);
    assert_eq!(spool.stats("q.failed", 10).unwrap().visible, 1);
}

#[test]
fn failure_queue_has_no_retry_limit_and_redrive_resets_the_count() {
    let settings = QueueSettings {
        max_retries: 0,
        ..QueueSettings::default()
    };
    let mut spool = with_queue(settings);
    let id = send(&mut spool, 0, 0);
    let l = spool.lease("q", 0, 1000, 1, false).unwrap()[0];
    nack(&mut spool, 0, &l, 0);
    for _ in 0..5 {
        let l = spool.lease("q.failed", 1, 1000, 1, false).unwrap()[0];
        let cmd = spool
            .reserve_nack("q.failed", l.id, l.serial, 1, 0, None)
            .unwrap();
        assert!(matches!(cmd, Command::Retry { .. }));
        apply(&mut spool, 1, cmd);
    }
    let picked = spool
        .redrive_candidates("q", &DeadLetterFilter::default(), 10, true)
        .unwrap();
    assert_eq!(picked.picked, vec![id]);
    apply(
        &mut spool,
        5,
        Command::Redrive {
            queue: "q".into(),
            ids: vec![id],
        },
    );
    let view = spool.get("q", id, 5).unwrap();
    assert_eq!(view.message.retry_count, 0);
    assert!(view.failure.is_none());
}

#[test]
fn stale_leases_cannot_settle_and_renew_extends() {
    let mut spool = with_queue(QueueSettings::default());
    send(&mut spool, 0, 0);
    let l = spool.lease("q", 0, 1_000, 1, false).unwrap()[0];
    assert_eq!(spool.renew("q", l.id, l.serial, 900), Ok(900 + 30_000));
    ack(&mut spool, 5_000, &l).expect("renewed lease still valid");
    assert_eq!(ack(&mut spool, 5_000, &l), Err(SpoolError::StaleLease));
    assert_eq!(spool.stats("q", 5_000).unwrap().counters.acked, 1);
}

#[test]
fn a_settling_lease_is_not_expired_twice_and_release_undoes_it() {
    let mut spool = with_queue(QueueSettings::default());
    send(&mut spool, 0, 0);
    let l = spool.lease("q", 0, 100, 1, false).unwrap()[0];
    spool.reserve_settle("q", l.id, l.serial, 50).unwrap();
    assert!(
        spool.due(200, 100).is_empty(),
        "ack in flight: no auto-nack"
    );
    spool.release("q", l.id);
    assert_eq!(spool.due(200, 100).len(), 1);
}

#[test]
fn cancel_makes_the_live_lease_stale() {
    let mut spool = with_queue(QueueSettings::default());
    let id = send(&mut spool, 0, 0);
    let l = spool.lease("q", 0, 1_000, 1, false).unwrap()[0];
    spool.reserve_message("q", id).unwrap();
    assert_eq!(
        spool.reserve_message("q", id),
        Err(SpoolError::MessageNotFound)
    );
    assert_eq!(ack(&mut spool, 1, &l), Err(SpoolError::StaleLease));
    apply(
        &mut spool,
        1,
        Command::Cancel {
            queue: "q".into(),
            id,
        },
    );
    assert_eq!(spool.message_count(), 0);
}

#[test]
fn new_epoch_drops_leases_keeping_counts_and_place() {
    let mut spool = with_queue(QueueSettings::default());
    let a = send(&mut spool, 0, 0);
    let b = send(&mut spool, 1, 1);
    let l = spool.lease("q", 2, 1_000, 2, false).unwrap();
    nack(&mut spool, 3, &l[1], 0);
    spool.drop_leases();
    let again: Vec<(MessageId, u32)> = spool
        .lease("q", 4, 1_000, 2, false)
        .unwrap()
        .iter()
        .map(|l| (l.id, l.message.retry_count))
        .collect();
    assert_eq!(again, vec![(a, 0), (b, 1)]);
}

#[test]
fn dedup_window_remembers_keys_after_ack_and_forgets_after_window() {
    let settings = QueueSettings {
        dedup_window_ms: 1_000,
        ..QueueSettings::default()
    };
    let mut spool = with_queue(settings);
    let id = spool.allocate_id();
    apply(
        &mut spool,
        100,
        Command::Enqueue(EnqueueMeta {
            ordering_key: None,
            id,
            queue: Cow::Borrowed("q"),
            visible_at: 100,
            dedup_hash: Some(7),
        }),
    );
    let l = spool.lease("q", 200, 1_000, 1, false).unwrap()[0];
    ack(&mut spool, 200, &l).unwrap();
    assert_eq!(spool.dedup_lookup("q", 7, 1_099), Some(id));
    tick(&mut spool, 1_100);
    assert_eq!(spool.dedup_lookup("q", 7, 1_100), None);
}

#[test]
fn expiry_with_on_expire_fail_moves_to_failure_queue() {
    let settings = QueueSettings {
        retention_ms: 10,
        on_expire: OnExpire::Fail,
        ..QueueSettings::default()
    };
    let mut spool = with_queue(settings);
    let id = send(&mut spool, 0, 0);
    tick(&mut spool, 10);
    let v = spool.get("q.failed", id, 10).unwrap();
    assert_eq!(v.failure.unwrap().reason, FailReason::Expired);
    tick(&mut spool, 15);
    assert!(
        spool.get("q.failed", id, 15).is_ok(),
        "retention restarts in the failure queue"
    );
    tick(&mut spool, 20);
    assert!(spool.get("q.failed", id, 20).is_err());
}

#[test]
fn leased_message_expires_only_after_its_lease_ends() {
    let settings = QueueSettings {
        retention_ms: 10,
        ..QueueSettings::default()
    };
    let mut spool = with_queue(settings);
    send(&mut spool, 0, 0);
    let l = spool.lease("q", 5, 100, 1, false).unwrap()[0];
    tick(&mut spool, 50);
    assert_eq!(spool.message_count(), 1, "leased: retention waits");
    ack(&mut spool, 60, &l).unwrap();
    assert_eq!(spool.stats("q", 60).unwrap().counters.expired, 0);
}

#[test]
fn paused_queue_hands_out_nothing() {
    let mut spool = with_queue(QueueSettings::default());
    send(&mut spool, 0, 0);
    apply(
        &mut spool,
        1,
        Command::QueuePause {
            name: "q".into(),
            paused: true,
        },
    );
    assert!(spool.lease("q", 2, 100, 1, false).unwrap().is_empty());
    assert!(spool.stats("q", 2).unwrap().paused);
}

#[test]
fn purge_and_delete_remove_everything() {
    let mut spool = with_queue(QueueSettings::default());
    send(&mut spool, 0, 0);
    send(&mut spool, 0, 0);
    let ids = spool
        .purge_candidates("q", &DeadLetterFilter::default(), usize::MAX)
        .unwrap()
        .picked;
    assert_eq!(
        apply(
            &mut spool,
            1,
            Command::Purge {
                queue: "q".into(),
                ids
            }
        ),
        Applied::Count(2)
    );
    send(&mut spool, 2, 2);
    apply(&mut spool, 3, Command::QueueDelete { name: "q".into() });
    assert!(spool.queue("q").is_none());
    assert!(spool.queue("q.failed").is_none());
    assert_eq!(spool.message_count(), 0);
}

#[test]
fn records_for_vanished_messages_are_no_ops() {
    let mut spool = with_queue(QueueSettings::default());
    for command in [
        Command::Ack {
            queue: "q".into(),
            id: MessageId(99),
        },
        Command::Cancel {
            queue: "nope".into(),
            id: MessageId(1),
        },
        Command::Redrive {
            queue: "nope".into(),
            ids: vec![MessageId(99)],
        },
    ] {
        assert_eq!(apply(&mut spool, 1, command), Applied::Missing);
    }
}

#[test]
fn the_in_memory_index_entry_stays_small() {
    // The memory budget (≤ 200 bytes per queued message) rests on this.
    assert!(std::mem::size_of::<state::Message>() <= 48);
}

#[test]
fn peek_after_the_largest_id_is_empty_not_an_overflow() {
    let mut spool = with_queue(QueueSettings::default());
    let id = send(&mut spool, 0, 0);
    let all = spool
        .peek("q", &DeadLetterFilter::default(), None, 10, 0)
        .unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].id, id);
    assert!(
        spool
            .peek("q", &DeadLetterFilter::default(), Some(id), 10, 0)
            .unwrap()
            .is_empty()
    );
    assert!(
        spool
            .peek(
                "q",
                &DeadLetterFilter::default(),
                Some(MessageId(u64::MAX)),
                10,
                0
            )
            .unwrap()
            .is_empty()
    );
}

/// A queue's history keeps acked messages within its byte bound (oldest
/// first out) and its retention (dropped by the timer's record); their
/// records stay live while kept, and not after.
#[test]
fn history_keeps_what_was_acked_within_its_bytes_and_time() {
    let mut spool = with_queue(QueueSettings {
        history_retention_ms: 60_000,
        history_max_bytes: 250,
        ..QueueSettings::default()
    });
    let ids: Vec<MessageId> = (0..3).map(|i| send(&mut spool, i, i)).collect();
    for (i, _) in ids.iter().enumerate() {
        let now = 10 + i as i64;
        let leased = spool.lease("q", now, 1000, 1, false).unwrap().remove(0);
        ack(&mut spool, now, &leased).unwrap();
    }
    let kept: Vec<MessageId> = spool
        .queue("q")
        .unwrap()
        .history_entries()
        .map(|(id, _)| id)
        .collect();
    // 100 bytes each, 250 at most: the oldest went.
    assert_eq!(kept, ids[1..]);
    assert_eq!(spool.live_bytes(LOC.file), 200);
    assert_eq!(spool.queue("q").unwrap().len(), 0);
    let d = spool
        .queue("q")
        .unwrap()
        .delivered(ids[2])
        .copied()
        .unwrap();
    assert_eq!((d.enqueued_at, d.delivered_at), (2, 12));
    // Past the retention of the first kept one only.
    tick(&mut spool, 11 + 60_000);
    let kept: Vec<MessageId> = spool
        .queue("q")
        .unwrap()
        .history_entries()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(kept, ids[2..]);
    assert_eq!(spool.live_bytes(LOC.file), 100);
    assert_eq!(spool.next_deadline(11 + 60_000), Some(12 + 60_000));
    tick(&mut spool, 12 + 60_000);
    assert!(spool.queue("q").unwrap().history_entries().next().is_none());
    assert_eq!(spool.live_bytes(LOC.file), 0);
    assert_eq!(
        spool.next_deadline(12 + 60_000),
        None,
        "nothing left to wait for"
    );
}

#[test]
fn the_state_digest_covers_replicated_state_and_not_a_nodes_own_counters() {
    let mut a = with_queue(QueueSettings::default());
    let mut b = with_queue(QueueSettings::default());
    let id = send(&mut a, 10, 10);
    assert_eq!(send(&mut b, 10, 10), id);
    assert_eq!(a.state_digest(0, 0), b.state_digest(0, 0));

    // An id handed out for a send that was then refused (a full disk)
    // moves only this node's counter; record locations differ by node too.
    let _refused = b.allocate_id();
    let mut c = with_queue(QueueSettings::default());
    c.apply(
        &Record {
            at: 10,
            command: Command::Enqueue(EnqueueMeta {
                ordering_key: None,
                id,
                queue: "q".into(),
                visible_at: 10,
                dedup_hash: None,
            }),
        },
        c.applied_seq() + 1,
        RecordLoc {
            file: 7,
            offset: 4096,
            len: 100,
        },
    );
    assert_eq!(a.state_digest(0, 0), b.state_digest(0, 0));
    assert_eq!(a.state_digest(0, 0), c.state_digest(0, 0));

    // A message more, or a change of place, is a different state.
    send(&mut b, 20, 20);
    assert_ne!(a.state_digest(0, 0), b.state_digest(0, 0));
    let leased = a.lease("q", 30, 1_000, 1, false).unwrap();
    nack(&mut a, 30, &leased[0], 60_000);
    assert_ne!(a.state_digest(0, 0), c.state_digest(0, 0));
}

#[test]
fn the_breaker_opens_on_the_nth_retryable_failure_in_a_row_and_closing_counts_afresh() {
    use super::state::{AttemptEffect, BreakerTurn};
    let mut spool = with_queue(QueueSettings {
        breaker_failures: 3,
        ..QueueSettings::default()
    });
    let retry = AttemptEffect::Retryable { probe: false };
    let closed = BreakerTurn::Unchanged { open: false };
    assert_eq!(spool.count_attempt("q", retry, 100), closed);
    // A permanent status says nothing of the destination's health; a
    // delivery ends the run.
    assert_eq!(
        spool.count_attempt("q", AttemptEffect::Permanent, 100),
        closed
    );
    assert_eq!(
        spool.count_attempt("q", AttemptEffect::Delivered, 100),
        closed
    );
    assert_eq!(spool.count_attempt("q", retry, 100), closed);
    assert_eq!(spool.count_attempt("q", retry, 100), closed);
    assert_eq!(spool.count_attempt("q", retry, 500), BreakerTurn::Opened);
    assert_eq!(spool.queue("q").unwrap().breaker.next_probe, Some(500));
    // Open: more failures, a probe's among them, move nothing.
    let open = BreakerTurn::Unchanged { open: true };
    assert_eq!(spool.count_attempt("q", retry, 900), open);
    let probe = AttemptEffect::Retryable { probe: true };
    assert_eq!(spool.count_attempt("q", probe, 900), open);
    assert_eq!(spool.queue("q").unwrap().breaker.next_probe, Some(500));
    // Closed (by a probe or an operator): the count starts again.
    spool.set_breaker("q", None);
    assert_eq!(spool.queue("q").unwrap().breaker.failures, 0);
    assert_eq!(spool.count_attempt("q", retry, 100), closed);
    assert_eq!(
        spool.count_attempt("missing", retry, 100),
        closed,
        "a queue that is gone has no breaker"
    );
}
