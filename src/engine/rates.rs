//! What the console's dashboard charts: messages enqueued, delivered
//! (acked), retried and failed, per second, in total and per queue, kept in
//! the process (no external store) for the last hour.
//!
//! Each record the engine applies names the queues whose counters it moved
//! (`Core::note_active`, called from `sink::apply`); once a second a task
//! reads those queues' counters ([`crate::spool::state::Counters`]) and
//! adds the differences to rings of buckets. Work and memory follow the
//! queues that are busy, not the queues that exist: 100 000 idle endpoints
//! cost nothing here. A ring keeps the last [`SECONDS`] seconds one by one
//! and the last hour by minute; at most [`QUEUES_MAX`] queues have rings
//! of their own (the others are summed under
//! [`crate::metrics::OTHER_QUEUES`], as in `/metrics`), and a queue's ring
//! is dropped after an hour without activity.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::spool::state::Counters;

/// Seconds kept one by one.
pub const SECONDS: usize = 300;
/// Minutes kept (the hour).
pub const MINUTES: usize = 60;
/// Queues with rings of their own.
pub const QUEUES_MAX: usize = 1000;

/// One bucket: enqueued, delivered, retried, failed.
pub type Counts = [u32; 4];

/// The four series, in [`Counts`] order.
pub const SERIES: [&str; 4] = ["enqueued", "delivered", "retried", "failed"];

/// Buckets of `N` slots of `width` seconds, each stamped with its start so
/// that a slot from an earlier lap reads as zero.
struct Buckets<const N: usize> {
    counts: Box<[Counts; N]>,
    stamps: Box<[i64; N]>,
    width: i64,
}

impl<const N: usize> Buckets<N> {
    fn new(width: i64) -> Self {
        Buckets {
            counts: Box::new([[0; 4]; N]),
            stamps: Box::new([i64::MIN; N]),
            width,
        }
    }

    fn add(&mut self, second: i64, counts: Counts) {
        let start = second.div_euclid(self.width);
        let slot = start.rem_euclid(N as i64) as usize;
        if self.stamps[slot] != start {
            self.stamps[slot] = start;
            self.counts[slot] = [0; 4];
        }
        for (bucket, n) in self.counts[slot].iter_mut().zip(counts) {
            *bucket = bucket.saturating_add(n);
        }
    }

    /// The `N` buckets up to and including the one holding `second`,
    /// oldest first.
    fn read(&self, second: i64) -> Vec<Counts> {
        let last = second.div_euclid(self.width);
        (last - N as i64 + 1..=last)
            .map(|start| {
                let slot = start.rem_euclid(N as i64) as usize;
                if self.stamps[slot] == start {
                    self.counts[slot]
                } else {
                    [0; 4]
                }
            })
            .collect()
    }
}

/// One series' memory: per second for [`SECONDS`], per minute for the
/// hour.
struct Ring {
    seconds: Buckets<SECONDS>,
    minutes: Buckets<MINUTES>,
    last_active: i64,
}

impl Ring {
    fn new() -> Ring {
        Ring {
            seconds: Buckets::new(1),
            minutes: Buckets::new(60),
            last_active: i64::MIN,
        }
    }

    fn add(&mut self, second: i64, counts: Counts) {
        self.seconds.add(second, counts);
        self.minutes.add(second, counts);
        self.last_active = second;
    }
}

/// A series as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateSeries {
    /// The second (Unix time) of the last per-second bucket.
    pub now: i64,
    /// The last [`SECONDS`] seconds, oldest first.
    pub seconds: Vec<Counts>,
    /// The last [`MINUTES`] minutes (the current one so far), oldest first.
    pub minutes: Vec<Counts>,
}

#[derive(Default)]
struct Inner {
    /// Each queue's counters when last read.
    last: HashMap<String, Counters>,
    total: Option<Ring>,
    queues: HashMap<String, Ring>,
    /// The sum of the queues past [`QUEUES_MAX`].
    others: Option<Ring>,
}

/// The rings of one engine.
#[derive(Default)]
pub struct Rates(Mutex<Inner>);

impl Rates {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().expect("rates lock poisoned")
    }

    /// The counters now, before any activity is measured: what replay
    /// counted is not a rate.
    pub fn baseline(&self, counters: impl IntoIterator<Item = (String, Counters)>) {
        let mut inner = self.inner();
        for (queue, c) in counters {
            inner.last.insert(queue, c);
        }
    }

    /// Adds what changed in `second` for the queues that were active
    /// (`None`: the queue is gone since).
    pub fn record(
        &self,
        second: i64,
        active: impl IntoIterator<Item = (String, Option<Counters>)>,
    ) {
        let mut inner = self.inner();
        let inner = &mut *inner;
        let mut total = [0u32; 4];
        for (queue, now) in active {
            let Some(now) = now else {
                inner.last.remove(&queue);
                continue;
            };
            let before = inner.last.insert(queue.clone(), now).unwrap_or_default();
            // A queue deleted and made again starts from zero.
            let delta = |a: u64, b: u64| u32::try_from(a.saturating_sub(b)).unwrap_or(u32::MAX);
            let counts = [
                delta(now.sent, before.sent),
                delta(now.acked, before.acked),
                delta(now.nacked, before.nacked),
                delta(now.failed, before.failed),
            ];
            if counts == [0; 4] {
                continue;
            }
            for (t, n) in total.iter_mut().zip(counts) {
                *t = t.saturating_add(n);
            }
            let room = inner.queues.len() < QUEUES_MAX;
            match inner.queues.get_mut(&queue) {
                Some(ring) => ring.add(second, counts),
                None if room => {
                    let mut ring = Ring::new();
                    ring.add(second, counts);
                    inner.queues.insert(queue, ring);
                }
                None => inner
                    .others
                    .get_or_insert_with(Ring::new)
                    .add(second, counts),
            }
        }
        inner.total.get_or_insert_with(Ring::new).add(second, total);
        // Rings idle for the hour they cover hold only zeros.
        let hour = (MINUTES * 60) as i64;
        if second % 60 == 0 {
            inner.queues.retain(|_, r| second - r.last_active < hour);
        }
    }

    /// The series of `queue` (its own, or the others' sum for a queue
    /// past [`QUEUES_MAX`]), or of every queue with `None`, up to `second`.
    pub fn series(&self, queue: Option<&str>, second: i64) -> RateSeries {
        let inner = self.inner();
        let ring = match queue {
            None => inner.total.as_ref(),
            Some(q) => inner.queues.get(q).or(if inner.queues.len() >= QUEUES_MAX {
                inner.others.as_ref()
            } else {
                None
            }),
        };
        match ring {
            Some(r) => RateSeries {
                now: second,
                seconds: r.seconds.read(second),
                minutes: r.minutes.read(second),
            },
            None => RateSeries {
                now: second,
                seconds: vec![[0; 4]; SECONDS],
                minutes: vec![[0; 4]; MINUTES],
            },
        }
    }

    /// Whether `queue` is summed with the others (past [`QUEUES_MAX`]).
    pub fn is_pooled(&self, queue: &str) -> bool {
        let inner = self.inner();
        inner.queues.len() >= QUEUES_MAX && !inner.queues.contains_key(queue)
    }
}

impl super::Engine {
    /// The dashboard's counts of `queue` (every queue with `None`), up to
    /// now.
    pub fn rates(&self, queue: Option<&str>) -> RateSeries {
        self.inner
            .rates
            .series(queue, self.clock_ms().div_euclid(1000))
    }

    /// Whether `queue`'s counts are pooled with others' (past
    /// [`QUEUES_MAX`]).
    pub fn rates_pooled(&self, queue: &str) -> bool {
        self.inner.rates.is_pooled(queue)
    }

    /// Reads the active queues' counters into the rates once a second,
    /// until the engine is dropped everywhere else. Starts from every
    /// queue's counters now (replay's counts are not a rate).
    pub fn spawn_rates(&self) -> tokio::task::JoinHandle<()> {
        {
            let mut core = self.core();
            core.active.clear();
            let all = core
                .spool
                .queue_names()
                .into_iter()
                .filter_map(|name| Some((name.clone(), core.spool.queue(&name)?.counters)))
                .collect::<Vec<_>>();
            self.inner.rates.baseline(all);
        }
        let weak = std::sync::Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                // Just past each second's end, so that the second is whole.
                let ms = weak.upgrade().map(|i| i.clock.now_ms());
                let Some(ms) = ms else { return };
                let wait = 1000 - ms.rem_euclid(1000) + 5;
                tokio::time::sleep(std::time::Duration::from_millis(wait as u64)).await;
                let Some(inner) = weak.upgrade() else { return };
                let engine = super::Engine { inner };
                let second = engine.clock_ms().div_euclid(1000) - 1;
                let active = {
                    let mut core = engine.core();
                    let names = std::mem::take(&mut core.active);
                    names
                        .into_iter()
                        .map(|name| {
                            let c = core.spool.queue(&name).map(|q| q.counters);
                            (name, c)
                        })
                        .collect::<Vec<_>>()
                };
                engine.inner.rates.record(second, active);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(sent: u64, acked: u64, nacked: u64, failed: u64) -> Counters {
        Counters {
            sent,
            acked,
            nacked,
            failed,
            ..Counters::default()
        }
    }

    #[test]
    fn differences_land_in_their_second_and_minute() {
        let rates = Rates::default();
        rates.baseline([("a".to_string(), counters(1000, 900, 5, 1))]);
        rates.record(120, [("a".to_string(), Some(counters(1010, 903, 6, 1)))]);
        rates.record(121, [("a".to_string(), Some(counters(1012, 910, 6, 2)))]);
        let a = rates.series(Some("a"), 121);
        assert_eq!(a.seconds.len(), SECONDS);
        assert_eq!(a.seconds[SECONDS - 2], [10, 3, 1, 0]);
        assert_eq!(a.seconds[SECONDS - 1], [2, 7, 0, 1]);
        assert_eq!(
            a.minutes[MINUTES - 1],
            [12, 10, 1, 1],
            "minute 2 holds both"
        );
        assert_eq!(rates.series(None, 121), a, "the total of one queue is it");
        // Five minutes on, the seconds have gone but the minute stays.
        let later = rates.series(Some("a"), 121 + SECONDS as i64);
        assert!(later.seconds.iter().all(|c| *c == [0; 4]));
        assert_eq!(later.minutes[MINUTES - 6], [12, 10, 1, 1]);
        // An hour on, nothing.
        let gone = rates.series(Some("a"), 121 + 3600);
        assert!(gone.minutes.iter().all(|c| *c == [0; 4]));
    }

    #[test]
    fn a_queue_made_again_starts_from_zero_and_queues_past_the_bound_are_pooled() {
        let rates = Rates::default();
        rates.record(10, [("a".to_string(), Some(counters(5, 0, 0, 0)))]);
        rates.record(11, [("a".to_string(), Some(counters(2, 0, 0, 0)))]);
        let a = rates.series(Some("a"), 11);
        assert_eq!(a.seconds[SECONDS - 2], [5, 0, 0, 0]);
        assert_eq!(
            a.seconds[SECONDS - 1],
            [0; 4],
            "a smaller count is a new queue"
        );
        let many = (0..QUEUES_MAX + 2).map(|i| (format!("q{i}"), Some(counters(1, 0, 0, 0))));
        rates.record(12, many);
        assert!(rates.is_pooled("q1001"));
        assert_eq!(
            rates.series(Some("q1001"), 12).seconds[SECONDS - 1],
            [3, 0, 0, 0]
        );
        assert_eq!(rates.series(None, 12).seconds[SECONDS - 1], [1002, 0, 0, 0]);
    }
}
