//! A wall clock that steps moves no timer (issue 39, finding 3): the
//! clock stepped +1 h for 0.3 s during a write, then was set right, and a
//! 2 s lease never expired, a 2 s delay never ended and a push retry due
//! in 0.5 s showed as due an hour later; a step back of S froze every
//! timer for S; a restart did not clear it.
//!
//! The binary's wall clock is stepped with the `testing` feature's clock
//! offset (`SPOOLD_TEST_CLOCK_FILE`, `src/time.rs`): it moves the wall
//! clock of one process and leaves its monotonic clock alone, as a host's
//! clock step does (libfaketime moves both unless told otherwise, and is
//! a system tool CI would need).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::process::{
    Spoold, client, receive_id, run_command, send_delayed, start_command, write_config,
};
use reqwest::StatusCode;
use serde_json::Value;

const HOUR_MS: i64 = 3_600_000;
/// How late a timer may fire.
const LATE: Duration = Duration::from_secs(1);

/// Sets the offset the process's wall clock reads with.
fn step(file: &Path, ms: i64) {
    std::fs::write(file, ms.to_string()).unwrap();
    // The process reads it again every 10 ms.
    std::thread::sleep(Duration::from_millis(50));
}

async fn start(dir: &Path, clock: &Path) -> Spoold {
    let tables = "[queues.jobs]\nlease_timeout = \"2s\"\n\n\
                  [queues.hooks]\ndestination = \"http://127.0.0.1:9/in\"\n\
                  backoff = { initial = \"500ms\", multiplier = 1.0, max = \"500ms\", jitter = 0.0 }\n\
                  max_retries = 1000\nbreaker_failures = 1000\n";
    let config = write_config(dir, "", "segment_bytes = \"1MiB\"", tables);
    start_command(run_command(&config).env("SPOOLD_TEST_CLOCK_FILE", clock)).await
}

async fn send(base: &str, queue: &str, delay: u64) -> String {
    send_delayed(base, queue, delay).await
}

async fn receive(base: &str, within: Duration) -> Option<String> {
    receive_id(base, "jobs", within).await
}

/// A 2 s lease taken now ends (its message comes back) within 2 s + LATE,
/// and a 2 s delay within the same.
async fn timers_fire(base: &str, when: &str) {
    let id = send(base, "jobs", 0).await;
    assert_eq!(
        receive(base, Duration::from_secs(2)).await,
        Some(id.clone())
    );
    let leased = Instant::now();
    let again = receive(base, Duration::from_secs(2) + LATE + Duration::from_secs(1)).await;
    assert_eq!(again, Some(id.clone()), "{when}: the 2 s lease never ended");
    assert!(
        leased.elapsed() <= Duration::from_secs(2) + LATE,
        "{when}: the 2 s lease ended after {:?}",
        leased.elapsed()
    );
    cancel(base, &id).await;

    let delayed = send(base, "jobs", 2).await;
    let sent = Instant::now();
    let came = receive(base, Duration::from_secs(2) + LATE + Duration::from_secs(1)).await;
    assert_eq!(
        came,
        Some(delayed.clone()),
        "{when}: the 2 s delay never ended"
    );
    assert!(
        sent.elapsed() <= Duration::from_secs(2) + LATE,
        "{when}: the 2 s delay ended after {:?}",
        sent.elapsed()
    );
    cancel(base, &delayed).await;
}

async fn cancel(base: &str, id: &str) {
    let r = client()
        .delete(format!("{base}/v1/queues/jobs/messages/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
}

/// The push message `id`'s next attempt is due within a second of the
/// host's real time (its retry is 0.5 s after each failure).
async fn retry_due_soon(base: &str, id: &str, when: &str) {
    let url = format!("{base}/v1/queues/hooks/messages/{id}");
    let message =
        crate::common::eventually("a failed attempt", Duration::from_secs(10), async || {
            let m: Value = client().get(&url).send().await.ok()?.json().await.ok()?;
            (m["state"] == "delayed").then_some(m)
        })
        .await;
    let due = spoold::time::parse_rfc3339(message["visibleAt"].as_str().unwrap()).unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(
        due - now <= 1_000,
        "{when}: a retry due in 0.5 s is due in {} ms: {message}",
        due - now
    );
}

async fn clock_step_ms(base: &str) -> Option<i64> {
    let ready: Value = client()
        .get(format!("{base}/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    ready["clockStepMs"].as_i64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_step_ahead_or_back_moves_no_timer_nor_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock: PathBuf = dir.path().join("clock-offset");
    step(&clock, 0);
    let mut spoold = start(dir.path(), &clock).await;
    let base = spoold.base.clone();

    // An hour ahead for 0.3 s, with writes in it (a 2 s lease taken, a
    // push message sent); then set right.
    step(&clock, HOUR_MS);
    let id = send(&base, "jobs", 0).await;
    assert_eq!(
        receive(&base, Duration::from_secs(2)).await,
        Some(id.clone())
    );
    let leased = Instant::now();
    let hook = send(&base, "hooks", 0).await;
    let ahead = clock_step_ms(&base).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    step(&clock, 0);
    retry_due_soon(&base, &hook, "after a step ahead").await;
    let again = receive(&base, Duration::from_secs(4)).await;
    assert_eq!(
        again,
        Some(id.clone()),
        "the lease taken in the step never ended"
    );
    assert!(
        leased.elapsed() <= Duration::from_secs(2) + LATE,
        "{:?}",
        leased.elapsed()
    );
    cancel(&base, &id).await;
    timers_fire(&base, "after a step ahead").await;
    let ahead_after = clock_step_ms(&base).await;

    // An hour back, held: timers run on meanwhile, then it is set right.
    step(&clock, -HOUR_MS);
    timers_fire(&base, "during a step back").await;
    let back = clock_step_ms(&base).await;
    step(&clock, 0);
    timers_fire(&base, "after a step back").await;

    // A restart keeps it so.
    spoold.signal("-KILL");
    spoold.wait_exit();
    let spoold = start(dir.path(), &clock).await;
    timers_fire(&spoold.base, "after a restart").await;

    // /readyz said how far the wall clock stepped, and when it was back.
    assert!(ahead.is_some_and(|ms| ms > HOUR_MS - 10_000), "{ahead:?}");
    assert_eq!(ahead_after, Some(0));
    assert!(back.is_some_and(|ms| ms < -HOUR_MS + 10_000), "{back:?}");
}
