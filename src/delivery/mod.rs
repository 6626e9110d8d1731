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
            stop_rx.clone(),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncReadExt;
    use tokio::sync::{oneshot, watch};

    use crate::engine::replicated::testing::{self, raft_of_one};
    use crate::engine::{Engine, Origin, SendRequest};
    use crate::journal::sim::SimStorage;
    use crate::spool::Payload;
    use crate::spool::queue::QueueSettings;

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
        let (engine, _) = Engine::open(options).await.unwrap();
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
        let request = SendRequest {
            payload: Payload {
                content_type: "text/plain".into(),
                request: None,
                event: None,
                body: b"event".to_vec().into(),
            },
            delay_ms: 0,
            dedup_key: None,
        };
        engine.send("hooks", request).await.unwrap();
        let (_stop, stop) = watch::channel(false);
        let delivery = tokio::spawn(super::run(engine.clone(), stop, false, Vec::new()));

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
