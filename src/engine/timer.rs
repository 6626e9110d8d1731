//! The timer: expired leases and retention turned into records.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::Engine;
use super::core::Reply;
use crate::spool::{Command, Record};

/// Most records the timer writes per tick, so one tick never holds the core
/// lock for long; the rest waits for the next tick.
const DUE_RECORDS_PER_TICK_MAX: usize = 4096;
/// Longest the timer sleeps when nothing is due.
const TIMER_IDLE_MAX: Duration = Duration::from_secs(1);
/// How often a replica that is not the primary looks whether it became it.
const NOT_SERVING_WAIT: Duration = Duration::from_millis(100);

impl Engine {
    /// Turns everything due now (expired leases, retention) into records
    /// and waits until they are durable and applied. Returns how many
    /// records it wrote.
    pub async fn run_due(&self) -> usize {
        if !self.is_serving() {
            // Replicated mode: only the primary decides what is due.
            return 0;
        }
        let mut waiting = Vec::new();
        let mut drops_history = false;
        {
            let mut core = self.core();
            let now = self.now(&mut core);
            for command in core.spool.due(now, DUE_RECORDS_PER_TICK_MAX) {
                drops_history |= matches!(command, Command::HistoryDrop { .. });
                let record = Record { at: now, command };
                let undo = record.clone();
                let (tx, rx) = oneshot::channel();
                match self.append(&core, record, None, Reply::Done(tx)) {
                    Ok(()) => waiting.push(rx),
                    Err(_) => core.release(&undo),
                }
            }
        }
        let mut written = 0;
        for rx in waiting {
            if let Ok(Ok(())) = rx.await {
                written += 1;
            }
        }
        if drops_history {
            crate::failpoint::hit(crate::failpoint::HISTORY_DROPPED);
        }
        written
    }

    /// Runs [`Engine::run_due`] until the engine is dropped everywhere else
    /// (or can write no more).
    pub fn spawn_timer(&self) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let engine = Engine { inner };
                if engine.is_poisoned() || engine.inner.journal.is_closed() {
                    // Nothing due can be written any more.
                    return;
                }
                let written = engine.run_due().await;
                let sleep = if !engine.is_serving() {
                    // Replicated mode, not the primary: nothing to decide.
                    NOT_SERVING_WAIT
                } else if written >= DUE_RECORDS_PER_TICK_MAX {
                    Duration::from_millis(1)
                } else {
                    let mut core = engine.core();
                    let now = engine.now(&mut core);
                    core.spool
                        .next_deadline(now)
                        .map(|t| Duration::from_millis((t - now).clamp(1, 1000) as u64))
                        .unwrap_or(TIMER_IDLE_MAX)
                };
                drop(engine);
                tokio::time::sleep(sleep).await;
            }
        })
    }
}
