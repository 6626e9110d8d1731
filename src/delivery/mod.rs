//! Push delivery: spoold's own workers for every queue with a
//! `destination` (docs/contract.md §3, §5). A worker is just another consumer of the
//! engine: it leases, makes the HTTP request, and settles by the outcome.
//!
//! [`run`] keeps one dispatcher per push queue (`worker::dispatch`: a task
//! per delivery in flight, at most `concurrency`) and follows queue changes
//! (config or API) once a second: a new push queue gets a dispatcher, a
//! changed one a new dispatcher with the new settings (the old one finishes
//! what it holds), a deleted one loses it.

pub(crate) mod backoff;
pub(crate) mod client;
pub(crate) mod signing;
pub(crate) mod target;
pub(crate) mod worker;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::engine::Engine;
use crate::spool::QueueSettings;
use worker::QueueShared;

/// How often the pools are matched against the queues.
const RECONCILE_PERIOD: Duration = Duration::from_secs(1);

struct Pool {
    settings: QueueSettings,
    stop: watch::Sender<bool>,
    dispatcher: JoinHandle<()>,
}

/// Runs every push queue's workers until `stop`; then stops leasing (or,
/// with `drain`, keeps delivering while messages are visible) and returns
/// when every worker is done. The caller bounds that wait by the grace
/// period.
pub(crate) async fn run(
    engine: Engine,
    mut stop: watch::Receiver<bool>,
    drain: bool,
    redact_headers: Vec<String>,
) {
    let redact_headers = Arc::new(redact_headers);
    let mut pools: BTreeMap<String, Pool> = BTreeMap::new();
    loop {
        reconcile(&engine, &mut pools, drain, &redact_headers);
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            () = tokio::time::sleep(RECONCILE_PERIOD) => {}
        }
    }
    for pool in pools.values() {
        pool.stop.send_replace(true);
    }
    for (_, pool) in pools {
        // A dispatcher only ends by returning (a panic aborts the process).
        let _ = pool.dispatcher.await;
    }
}

fn reconcile(
    engine: &Engine,
    pools: &mut BTreeMap<String, Pool>,
    drain: bool,
    redact_headers: &Arc<Vec<String>>,
) {
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
            // The old dispatcher finishes the deliveries it holds, then
            // exits on its own.
            pool.stop.send_replace(true);
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
        let shared = QueueShared::new(
            engine.clone(),
            name.clone(),
            settings.clone(),
            client,
            redact_headers.clone(),
        );
        let dispatcher = tokio::spawn(worker::dispatch(shared, stop_rx, drain));
        tracing::info!(queue = %name, concurrency = settings.concurrency, "delivery started");
        pools.insert(
            name,
            Pool {
                settings,
                stop,
                dispatcher,
            },
        );
    }
}
