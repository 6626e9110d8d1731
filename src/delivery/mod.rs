//! Push delivery: spoold's own workers for every queue with a
//! `destination` (docs/contract.md §3, §5). A worker is just another consumer of the
//! engine: it leases, makes the HTTP request, and settles by the outcome.
//!
//! [`run`] starts a dispatcher (`worker::dispatch`: a task per delivery in
//! flight, at most `concurrency`) for a push queue only while it has
//! messages: the engine names the queues that hold some at start, and
//! tells of a sleeping queue that gets work (`engine/awake.rs`); a
//! dispatcher whose queue is empty ends. A queue change stops the
//! dispatcher it has (which finishes what it holds) and starts one with the
//! new settings if there is work. So an idle push queue costs no task, no
//! timer and no client: push queues with the same TLS settings share one
//! pooled client (`client.rs`), and a plain-HTTP destination's idle
//! connections wait in [`direct::Ways`] for the queue's next dispatcher.

pub(crate) mod answer;
pub(crate) mod backoff;
pub(crate) mod client;
pub(crate) mod direct;
pub(crate) mod hosts;
pub(crate) mod resolve;
pub(crate) mod send;
pub(crate) mod shared;
pub(crate) mod signing;
pub(crate) mod target;
pub(crate) mod worker;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::engine::{Engine, PushWake};
use shared::QueueShared;

/// The server's settings that delivery reads (`[server]` of the config).
#[derive(Default)]
pub(crate) struct DeliveryOptions {
    /// `drain_on_shutdown`: on a stop, deliver what is visible first.
    pub drain: bool,
    /// `redact_headers`, in lower case.
    pub redact_headers: Vec<String>,
    /// The `[delivery]` table.
    pub delivery: crate::config::DeliveryConfig,
}

/// A running dispatcher.
struct Running {
    stop: watch::Sender<bool>,
    dispatcher: JoinHandle<()>,
}

/// Runs the push queues' dispatchers until `stop`; then stops leasing (or,
/// with `drain`, keeps delivering while messages are visible) and returns
/// when every worker is done. The caller bounds that wait by the grace
/// period.
pub(crate) async fn run(engine: Engine, mut stop: watch::Receiver<bool>, options: DeliveryOptions) {
    let mut pools = Pools::new(engine.clone(), options);
    let (mut wakeups, busy) = engine.listen_for_push_work();
    for queue in busy {
        pools.start(queue);
    }
    let mut prune = tokio::time::interval(PRUNE_IDLE_EVERY);
    prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let wake = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            wake = wakeups.recv() => wake,
            _ = prune.tick() => {
                pools.origins.prune();
                continue;
            }
        };
        match wake {
            Some(PushWake::Work(queue)) => pools.start(queue),
            Some(PushWake::Changed(queue)) => pools.changed(queue),
            None => break,
        }
    }
    for run in pools.running.values().chain(&pools.retired) {
        run.stop.send_replace(true);
    }
    let all = pools
        .running
        .into_values()
        .chain(pools.retired)
        .map(|run| run.dispatcher);
    for dispatcher in all {
        // A dispatcher only ends by returning (a panic aborts the process).
        let _ = dispatcher.await;
    }
}

/// The dispatchers that run, and what starting one needs.
struct Pools {
    engine: Engine,
    drain: bool,
    redact_headers: Arc<Vec<String>>,
    clients: client::Clients,
    /// Plain-HTTP destinations' idle connections and every origin's
    /// slots, kept between dispatchers.
    origins: shared::Origins,
    running: HashMap<String, Running>,
    /// Dispatchers of settings that changed, finishing what they hold.
    retired: Vec<Running>,
    /// Ended dispatchers are dropped from `running` when it grows to this
    /// size (then twice what is left), not at every start: a fan-out that
    /// wakes 10 000 queues must not walk them all 10 000 times.
    prune_at: usize,
}

/// How often idle direct connections past their time are closed
/// (`direct.rs`), and origins no dispatcher holds forgotten (`hosts.rs`).
const PRUNE_IDLE_EVERY: Duration = Duration::from_secs(15);

/// The smallest [`Pools::prune_at`].
const PRUNE_MIN: usize = 256;

impl Pools {
    fn new(engine: Engine, options: DeliveryOptions) -> Pools {
        let guard = engine.guard().clone();
        Pools {
            engine,
            drain: options.drain,
            redact_headers: Arc::new(options.redact_headers),
            clients: client::Clients::new(guard.clone()),
            origins: shared::Origins {
                ways: direct::Ways::new(guard, options.delivery.plain_http_client),
                hosts: hosts::Hosts::new(options.delivery.max_connections_per_host),
            },
            running: HashMap::new(),
            retired: Vec::new(),
            prune_at: PRUNE_MIN,
        }
    }

    /// Starts `queue`'s dispatcher (the engine counts it awake already),
    /// with the queue's settings as they are now.
    ///
    /// The engine names a queue only while it counts it asleep, so a
    /// dispatcher of `queue` still here went to sleep
    /// (`Engine::sleep_if_idle`) and is on its way out, holding nothing.
    /// The new one starts at once; the old one finishes among the retired.
    /// (Waiting for it instead would leave the queue awake in the engine's
    /// eyes with no dispatcher: nothing would name it again.)
    fn start(&mut self, queue: String) {
        if self.running.len() + self.retired.len() >= self.prune_at {
            self.running.retain(|_, run| !run.dispatcher.is_finished());
            self.retired.retain(|run| !run.dispatcher.is_finished());
            self.prune_at = (2 * (self.running.len() + self.retired.len())).max(PRUNE_MIN);
        }
        if let Some(leaving) = self.running.remove(&queue)
            && !leaving.dispatcher.is_finished()
        {
            self.retired.push(leaving);
        }
        let settings = match self.engine.queue_settings(&queue) {
            Ok((settings, _)) if settings.is_push() => settings,
            _ => {
                self.engine.put_to_sleep(&queue);
                return;
            }
        };
        let client = match self.clients.for_settings(&settings) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(queue = %queue, error = %e, "cannot build the delivery client; queue not delivered");
                self.engine.put_to_sleep(&queue);
                return;
            }
        };
        let (stop, stop_rx) = watch::channel(false);
        let shared = QueueShared::new(
            self.engine.clone(),
            queue.clone(),
            settings,
            client,
            &mut self.origins,
            self.redact_headers.clone(),
            stop_rx.clone(),
        );
        let dispatcher = tokio::spawn(worker::dispatch(shared, stop_rx, self.drain));
        tracing::debug!(queue = %queue, "delivery started");
        self.running.insert(queue, Running { stop, dispatcher });
    }

    /// `queue` was created, changed or deleted: its dispatcher (if any)
    /// finishes what it holds, and a new one starts if there is work.
    fn changed(&mut self, queue: String) {
        if let Some(run) = self.running.remove(&queue) {
            run.stop.send_replace(true);
            self.retired.push(run);
        }
        if self.engine.wake_if_busy(&queue) {
            self.start(queue);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::{oneshot, watch};

    use crate::engine::replicated::testing::{self, raft_of_one};
    use crate::engine::{Engine, Origin};
    use crate::journal::sim::SimStorage;
    use crate::spool::queue::QueueSettings;
    use crate::testing::text_message;

    /// A destination on a local port that answers every request `200`
    /// and counts it.
    async fn counting_destination() -> (String, watch::Receiver<usize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (count_tx, count) = watch::channel(0);
        tokio::spawn(async move {
            loop {
                let (mut conn, _) = listener.accept().await.unwrap();
                let count_tx = count_tx.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 << 10];
                    while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {
                        count_tx.send_modify(|n| *n += 1);
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                        if conn.write_all(ok).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (format!("http://{addr}/hook"), count)
    }

    /// A dispatcher that went to sleep (its queue empty) may not have ended
    /// when its queue's next message comes: the wake-up for that message
    /// still starts a dispatcher. Before, the manager saw the old one
    /// running and did nothing, while the engine counted the queue awake
    /// and never named it again: the queue stalled until a restart.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wake_up_during_a_dispatchers_exit_is_not_lost() {
        let (destination, mut arrived) = counting_destination().await;
        let sim = SimStorage::new();
        let mut options = crate::engine::EngineOptions::new("/spool");
        options.storage = std::sync::Arc::new(sim.clone());
        options.lock = false;
        options.preallocate = false;
        let (engine, _) = Engine::open(options).await.unwrap();
        let settings = QueueSettings {
            destination: Some(destination),
            ..QueueSettings::default()
        };
        engine
            .upsert_queue("hooks", settings, Origin::Api)
            .await
            .unwrap();
        let (mut wakeups, busy) = engine.listen_for_push_work();
        assert!(busy.is_empty());
        let mut pools = super::Pools::new(engine.clone(), super::DeliveryOptions::default());
        // The queue's last dispatcher: asleep in the engine's eyes (it was
        // never counted awake here), its task not ended yet.
        let (stop, _) = watch::channel(false);
        let leaving = tokio::spawn(std::future::pending::<()>());
        pools.running.insert(
            "hooks".to_owned(),
            super::Running {
                stop,
                dispatcher: leaving,
            },
        );

        engine
            .send("hooks", text_message(&b"event"[..]))
            .await
            .unwrap();
        let wake = tokio::time::timeout(Duration::from_secs(5), wakeups.recv())
            .await
            .expect("the engine names the sleeping queue")
            .unwrap();
        let super::PushWake::Work(queue) = wake else {
            panic!("a wake-up for work");
        };
        pools.start(queue);
        tokio::time::timeout(Duration::from_secs(10), arrived.wait_for(|n| *n >= 1))
            .await
            .expect("the message is delivered")
            .unwrap();
        // The dispatcher on its way out is kept until it ends, to be waited
        // for at shutdown.
        assert_eq!(pools.retired.len(), 1);
        engine.close();
    }

    /// A primary that steps down drops its push attempt in flight at once
    /// (the destination sees the connection close long before the
    /// attempt's 60 s timeout), and settles nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_primary_that_steps_down_abandons_the_attempt_in_flight() {
        // A destination that reads the request and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (arrived_tx, arrived) = oneshot::channel();
        let (closed_tx, closed) = oneshot::channel();
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 64 << 10];
            assert!(conn.read(&mut buf).await.unwrap() > 0);
            let _ = arrived_tx.send(());
            while !matches!(conn.read(&mut buf).await, Ok(0) | Err(_)) {}
            let _ = closed_tx.send(());
        });

        let sim = SimStorage::new();
        let options = testing::options(&sim, 1 << 20, 0);
        let engine = crate::engine::replicated::testing::open(options).await;
        raft_of_one(&engine, 1);
        engine.start_serving(1).await.unwrap();
        let settings = QueueSettings {
            destination: Some(format!("http://{addr}/hook")),
            timeout_ms: 60_000,
            ..QueueSettings::default()
        };
        engine
            .upsert_queue("hooks", settings, Origin::Api)
            .await
            .unwrap();
        engine
            .send("hooks", text_message(&b"event"[..]))
            .await
            .unwrap();
        let (_stop, stop) = watch::channel(false);
        let delivery = tokio::spawn(super::run(
            crate::engine::Engine::clone(&engine),
            stop,
            super::DeliveryOptions::default(),
        ));

        tokio::time::timeout(Duration::from_secs(10), arrived)
            .await
            .expect("the attempt reached the destination")
            .unwrap();
        engine.stop_serving();
        tokio::time::timeout(Duration::from_secs(5), closed)
            .await
            .expect("the attempt was abandoned when the primary stepped down")
            .unwrap();
        // Nothing was settled: the message waits, its retry count as it was.
        let messages = engine.all_messages();
        assert_eq!(messages.len(), 1);
        assert_eq!(messages[0].2.retry_count, 0);
        delivery.abort();
        engine.close();
    }
}
