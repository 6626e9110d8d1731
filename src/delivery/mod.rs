//! Push delivery: spoold's own workers for every queue with a
//! `destination` (spec §3, §5). A worker is just another consumer of the
//! engine: it leases, makes the HTTP request, and settles by the outcome.
//!
//! [`Deliveries`] keeps one pool of `concurrency` workers per push queue and
//! follows queue changes (config or API) once a second: a new push queue
//! gets workers, a changed one gets new workers with the new settings (the
//! old ones finish what they hold), a deleted one loses them.

pub mod backoff;
pub mod client;
pub mod signing;
pub mod target;
pub mod worker;

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::engine::Engine;
use crate::spool::QueueSettings;
use worker::QueueShared;

/// How often the pools are matched against the queues.
const RECONCILE_PERIOD: Duration = Duration::from_secs(1);

struct Pool {
    settings: QueueSettings,
    stop: watch::Sender<bool>,
    workers: JoinSet<()>,
}

/// Runs every push queue's workers until `stop`; then stops leasing (or,
/// with `drain`, keeps delivering while messages are visible) and returns
/// when every worker is done. The caller bounds that wait by the grace
/// period.
pub async fn run(engine: Engine, mut stop: watch::Receiver<bool>, drain: bool) {
    let mut pools: BTreeMap<String, Pool> = BTreeMap::new();
    loop {
        reconcile(&engine, &mut pools, drain);
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            () = tokio::time::sleep(RECONCILE_PERIOD) => {}
        }
    }
    for pool in pools.values() {
        pool.stop.send_replace(true);
    }
    for (_, mut pool) in pools {
        while pool.workers.join_next().await.is_some() {}
    }
}

fn reconcile(engine: &Engine, pools: &mut BTreeMap<String, Pool>, drain: bool) {
    let wanted: BTreeMap<String, QueueSettings> = engine
        .queue_names()
        .into_iter()
        .filter_map(|name| {
            let (settings, _) = engine.queue_settings(&name).ok()?;
            settings.is_push().then_some((name, settings))
        })
        .collect();
    pools.retain(|name, pool| {
        let keep = wanted.get(name) == Some(&pool.settings);
        if !keep {
            pool.stop.send_replace(true);
            let mut workers = std::mem::take(&mut pool.workers);
            // The old workers finish the request they hold, then exit.
            tokio::spawn(async move { while workers.join_next().await.is_some() {} });
        }
        keep
    });
    for (name, settings) in wanted {
        if pools.contains_key(&name) {
            continue;
        }
        let client = match client::build(&settings) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(queue = %name, error = %e, "cannot build the delivery client; queue not delivered");
                continue;
            }
        };
        let (stop, stop_rx) = watch::channel(false);
        let shared = QueueShared::new(engine.clone(), name.clone(), settings.clone(), client);
        let mut workers = JoinSet::new();
        for _ in 0..settings.concurrency.max(1) {
            workers.spawn(worker::run(shared.clone(), stop_rx.clone(), drain));
        }
        tracing::info!(queue = %name, concurrency = settings.concurrency, "delivery workers started");
        pools.insert(
            name,
            Pool {
                settings,
                stop,
                workers,
            },
        );
    }
}
