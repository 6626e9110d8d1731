//! The write path every operation shares: decide under the core lock,
//! append in reservation order, undo the reservation if the journal
//! refuses, and wait for the answer the sink sends after the fsync.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::Engine;
use super::core::Core;
use super::core::Reply;
use super::error::{WriteError, closed};
use super::replicated::Replication;
use super::sink::{Entry, Op};
use crate::journal::JournalError;
use crate::spool::{Command, Payload, Record};
use crate::time::Millis;

impl Engine {
    /// Appends under the core lock (the guard proves it is held), through
    /// the appender chosen at open: the journal, or Raft's proposer. A
    /// refusal means nothing was appended.
    pub(super) fn append(
        &self,
        _core: &Core,
        record: Record<'static>,
        payload: Option<&Payload>,
        reply: Reply,
    ) -> Result<(), WriteError> {
        let cost = crate::spool::state::memory::record_cost(&record.command);
        match &self.inner.appender {
            Appender::Raft(r) => r.propose(record, payload, reply, 0)?,
            Appender::Journal => self
                .append_local(record, payload, reply)
                .map_err(unavailable)?,
        }
        if cost > 0 {
            self.inner
                .shared
                .in_flight_memory
                .fetch_add(cost, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// Appends to this node's journal (a single node).
    pub(super) fn append_local(
        &self,
        record: Record<'static>,
        payload: Option<&Payload>,
        reply: Reply,
    ) -> Result<(), JournalError> {
        let kind = record.kind();
        self.inner
            .journal
            .append(kind, Entry::Local(Op { record, reply }), |entry, buf| {
                if let Entry::Local(op) = entry {
                    op.record.encode(payload, buf);
                }
            })
    }

    /// Decides one command under the core lock, appends it, and waits until
    /// it is durable and applied.
    pub(super) async fn write_done<E: From<WriteError>>(
        &self,
        decide: impl FnOnce(&mut Core, Millis) -> Result<Command<'static>, E>,
    ) -> Result<(), E> {
        let (tx, rx) = oneshot::channel();
        {
            let mut core = self.core();
            let now = self.now(&mut core);
            let command = decide(&mut core, now)?;
            let record = Record { at: now, command };
            let undo = record.clone();
            if let Err(e) = self.append(&core, record, None, Reply::Done(tx)) {
                core.release(&undo);
                return Err(e.into());
            }
        }
        rx.await.map_err(|_| closed())?.map_err(E::from)
    }

    /// Decides several commands under the core lock and appends them as
    /// one batch (one write, one fsync: all or none); answers the sum of
    /// their counts.
    pub(super) async fn write_counts<E: From<WriteError>>(
        &self,
        decide: impl FnOnce(&mut Core, Millis) -> Result<Vec<Command<'static>>, E>,
    ) -> Result<u64, E> {
        let mut waiting = Vec::new();
        {
            let mut core = self.core();
            let now = self.now(&mut core);
            let records: Vec<Record<'static>> = decide(&mut core, now)?
                .into_iter()
                .map(|command| Record { at: now, command })
                .collect();
            let undo = records.clone();
            let mut ops = Vec::with_capacity(records.len());
            for record in records {
                let (tx, rx) = oneshot::channel();
                waiting.push(rx);
                ops.push(Op {
                    record,
                    reply: Reply::Count(tx),
                });
            }
            if let Err(e) = self.append_all(&core, ops) {
                for record in &undo {
                    core.release(record);
                }
                return Err(e.into());
            }
        }
        let mut total = 0;
        for rx in waiting {
            total += rx.await.map_err(|_| closed())??;
        }
        Ok(total)
    }
}

impl Engine {
    /// Appends several records as one batch (one write, one fsync: all or
    /// none) on a single node; in replicated mode, proposes them in order,
    /// all or none.
    fn append_all(&self, _core: &Core, ops: Vec<Op>) -> Result<(), WriteError> {
        if let Appender::Raft(r) = &self.inner.appender {
            return Ok(r.propose_all(ops)?);
        }
        let entries = ops
            .into_iter()
            .map(|op| (op.record.kind(), Entry::Local(op)));
        self.inner
            .journal
            .append_many(entries, |entry, buf| {
                if let Entry::Local(op) = entry {
                    op.record.encode(None, buf);
                }
            })
            .map_err(unavailable)
    }
}

/// The journal refused a write: nothing was written.
fn unavailable(e: JournalError) -> WriteError {
    match e {
        JournalError::RecordTooLarge(e) => WriteError::TooLarge(e),
        e => WriteError::Unavailable {
            reason: e.to_string(),
        },
    }
}

/// Where a decided record goes, chosen once when the spool opens.
pub(super) enum Appender {
    /// A single node: the journal, applied once durable.
    Journal,
    /// Replicated mode: Raft's proposer, applied once committed.
    Raft(Arc<Replication>),
}
