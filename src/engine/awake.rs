//! Which push queues have a running dispatcher (`src/delivery`). An idle
//! push queue has none, and costs no task and no timer: when work arrives
//! (a message becomes visible, a redrive, a resume) the state machine's
//! wake-up finds the queue asleep and tells the delivery manager, which
//! starts its dispatcher (`core.rs`, `PushWake`). A dispatcher that finds
//! its queue empty goes back to sleep here, under the core lock, so that
//! no wake-up falls between its last look and its exit.

use tokio::sync::mpsc;

use super::Engine;
pub use super::core::PushWake;

impl Engine {
    /// The delivery manager's end of the wake-ups: from now on, work on a
    /// push queue without a dispatcher is sent here. Then every push queue
    /// that holds messages counts as awake and is named, for the manager
    /// to start its dispatcher.
    pub(crate) fn listen_for_push_work(&self) -> (mpsc::UnboundedReceiver<PushWake>, Vec<String>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut core = self.core();
        core.push_wakeups = Some(tx);
        let busy: Vec<String> = core
            .spool
            .queue_names()
            .into_iter()
            .filter(|name| {
                core.spool
                    .queue(name)
                    .is_some_and(|q| q.settings.is_push() && q.len() > 0)
            })
            .collect();
        core.awake.extend(busy.iter().cloned());
        (rx, busy)
    }

    /// After a change to `queue`: whether it should have a dispatcher now
    /// (a push queue with messages; it then counts as awake), else it is
    /// asleep.
    pub(crate) fn wake_if_busy(&self, queue: &str) -> bool {
        let mut core = self.core();
        let busy = core
            .spool
            .queue(queue)
            .is_some_and(|q| q.settings.is_push() && q.len() > 0);
        if busy {
            core.awake.insert(queue.to_owned());
        } else {
            core.awake.remove(queue);
        }
        busy
    }

    /// A dispatcher with nothing in flight asks to sleep: granted when its
    /// queue holds no message at all (none visible, delayed or leased).
    pub(crate) fn sleep_if_idle(&self, queue: &str) -> bool {
        let mut core = self.core();
        let idle = core.spool.queue(queue).is_none_or(|q| q.len() == 0);
        if idle {
            core.awake.remove(queue);
            core.forget_notify(queue);
        }
        idle
    }

    /// The manager could not start a dispatcher for `queue` (no longer a
    /// push queue, a client that cannot be built): it sleeps until its
    /// next change or wake-up.
    pub(crate) fn put_to_sleep(&self, queue: &str) {
        self.core().awake.remove(queue);
    }

    /// How many push queues have a running dispatcher (tests, metrics).
    pub fn awake_push_queues(&self) -> usize {
        self.core().awake.len()
    }
}
