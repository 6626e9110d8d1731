//! The applier thread: takes durable batches from the writer while the
//! writer goes on with the next one, and hands them to the sink in order.
//! A test can hold it (`ApplyHold`, only built for tests and with the
//! `testing` feature) to keep records durable but not yet applied.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::{BatchFailure, BatchSink, Durable, Outcome, Placed};

/// Lets a test keep durable batches from being applied, so that it can
/// run compaction (or anything else) while records are durable but not yet
/// in the state: every outcome then goes through the applier thread, which
/// waits while the hold is on. A test hook only: without the `testing`
/// feature neither it nor the writer's check of it is compiled.
#[cfg(any(test, feature = "testing"))]
#[derive(Default)]
pub(super) struct ApplyHold {
    pub(super) on: Mutex<bool>,
    pub(super) changed: std::sync::Condvar,
    /// Mirrors `on` for the writer's cheap check.
    pub(super) active: std::sync::atomic::AtomicBool,
}

#[cfg(any(test, feature = "testing"))]
impl ApplyHold {
    pub(super) fn set(&self, on: bool) {
        *self.on.lock().expect("hold lock poisoned") = on;
        self.active.store(on, Ordering::Release);
        self.changed.notify_all();
    }

    pub(super) fn wait_released(&self) {
        let mut on = self.on.lock().expect("hold lock poisoned");
        while *on {
            on = self.changed.wait(on).expect("hold lock poisoned");
        }
    }
}

/// Outcomes in flight between writer and applier: the writer runs at most
/// this many batches ahead of the state machine.
pub(super) const APPLY_QUEUE_BATCHES_MAX: usize = 4;

/// The writer's sink: applies each outcome itself when the applier has
/// nothing queued, else queues it for the applier thread.
pub(super) struct ToApplier<E, S> {
    pub(super) tx: std::sync::mpsc::SyncSender<Outcome<E>>,
    /// The real sink, used by one thread at a time: the writer only while
    /// nothing is queued, the applier only for what is queued.
    pub(super) sink: Arc<Mutex<S>>,
    /// Outcomes sent to the applier and not yet applied.
    pub(super) queued: Arc<AtomicUsize>,
    #[cfg(any(test, feature = "testing"))]
    pub(super) hold: Arc<ApplyHold>,
}

impl<E: Send + 'static, S: BatchSink<E>> ToApplier<E, S> {
    pub(super) fn deliver(&mut self, outcome: Outcome<E>) {
        // Acquire pairs with the applier's Release after applying: at 0,
        // every queued outcome has been applied, so applying here keeps
        // journal order.
        if self.queued.load(Ordering::Acquire) == 0 && !self.held() {
            apply(&self.sink, outcome);
            return;
        }
        self.queued.fetch_add(1, Ordering::AcqRel);
        // The applier only stops after the writer; a send cannot fail
        // unless the applier panicked, which the join reports.
        let _ = self.tx.send(outcome);
    }

    /// A test holds the applier: outcomes go through its thread, which
    /// waits.
    #[cfg(any(test, feature = "testing"))]
    fn held(&self) -> bool {
        self.hold.active.load(Ordering::Acquire)
    }

    /// Without the `testing` feature nothing can hold the applier: the
    /// writer's check is a constant.
    #[cfg(not(any(test, feature = "testing")))]
    fn held(&self) -> bool {
        false
    }
}

pub(super) fn apply<E, S: BatchSink<E>>(sink: &Mutex<S>, outcome: Outcome<E>) {
    // A panic while applying is a bug that takes the process down (the
    // binary aborts on panic); nothing may apply on top of half a batch.
    let mut sink = sink.lock().expect("bug: a sink panicked mid-batch");
    match outcome {
        Outcome::Durable(receipt, batch) => sink.durable(&receipt, batch),
        Outcome::Failed(failure, batch) => sink.failed(&failure, batch),
    }
}

impl<E: Send + 'static, S: BatchSink<E>> BatchSink<E> for ToApplier<E, S> {
    fn durable(&mut self, receipt: &Durable, batch: Vec<Placed<E>>) {
        let receipt = Durable {
            last_seq: receipt.last_seq,
            fsync_duration: receipt.fsync_duration,
        };
        self.deliver(Outcome::Durable(receipt, batch));
    }

    fn failed(&mut self, failure: &BatchFailure, batch: Vec<E>) {
        let failure = match failure {
            BatchFailure::RolledBack(e) => {
                BatchFailure::RolledBack(io::Error::new(e.kind(), e.to_string()))
            }
            BatchFailure::Unconfirmed(e) => {
                BatchFailure::Unconfirmed(io::Error::new(e.kind(), e.to_string()))
            }
        };
        self.deliver(Outcome::Failed(failure, batch));
    }
}
