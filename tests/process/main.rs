//! The real `spoold` binary: `spoold run` as a child process
//! (`common::process`) that tests kill, signal and fill up, and its other
//! commands against a server. `kill -9` (of the binary, and of this test
//! binary re-run as a writer), SIGTERM and SIGHUP, syscall faults injected
//! with strace and a real full disk, the crash loop, the compaction
//! findings and the corruption matrix through the binary, the command
//! line, config checks, `/metrics`, events, push delivery and destination
//! chaos, the spool the first level-5 build wrote (read, written,
//! compacted and read again), the findings of the adversarial and
//! API-edge reviews, and what needs outside tools (the console in
//! Chromium, the client examples, the Helm chart, the README's quick
//! start).
//!
//! One module per subject: `cargo test --test process crash_loop::` runs
//! one.

#[path = "../common/mod.rs"]
mod common;

mod api_edge;
mod cli;
mod cli_ops;
mod client_examples;
mod clock_steps;
mod compaction;
mod config_parity;
mod console;
mod content_filters;
mod corruption_matrix;
mod crash;
mod crash_loop;
mod delivery_log;
mod destination_chaos;
mod event_types;
mod events;
mod fixtures;
mod full_disk;
mod helm;
mod limits;
mod metrics;
mod operational_events;
mod ordering;
mod push_delivery;
mod readme;
mod refusals_and_secrets;
mod scoped_keys;
mod secret_rotation;
mod security;
mod signals_and_hangups;
mod syscall_faults;
