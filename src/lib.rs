//! spoold: a durable local spool for outbound work.
//!
//! The crate is a library with a thin binary (`src/main.rs`) so that tests
//! drive exactly what a user runs. The layers, bottom up:
//!
//! - `journal`: bytes on disk. Record framing, segments, group commit,
//!   scanning and replay. Knows nothing of queues or leases.
//! - [`spool`]: the state machine. Queues, messages, leases, retries and
//!   failure queues. Pure: it takes `now` as an argument and does no I/O.
//! - [`engine`]: the one place that joins the two. It turns an operation into
//!   a journal record, waits for the fsync that covers it, applies it to the
//!   state machine and only then answers.
//!
//! `ARCHITECTURE.md` at the repository root has the map and the invariants.
//!
//! The public surface is small on purpose: what the binary runs
//! ([`config`], [`serve`], [`cli`]), the engine's door ([`engine`], with
//! the state-machine types its answers use in [`spool`], and [`time`]),
//! and `testing`, the internals that integration tests, benchmarks and
//! fuzz targets reach for. Everything else is `pub(crate)`.
//!
//! `testing`, the simulated storage (`journal::sim`) and the applier hold
//! (`Engine::hold_apply`) exist only with the `testing` feature (and in
//! unit tests): tests, benchmarks and examples get it through the crate's
//! dev-dependency on itself, the fuzz crate asks for it, and
//! `cargo build --release` leaves it out.
// Checked where `testing` exists (unit tests, and every target of
// `cargo clippy --all-targets`, which the self dev-dependency builds with
// the feature): without it, the items `testing` re-exports are `pub` for
// no outside caller, which is what this lint would flag.
#![cfg_attr(any(test, feature = "testing"), warn(unreachable_pub))]

#[cfg(any(test, feature = "count-allocations"))]
pub mod allocations;
pub(crate) mod api;
pub mod cli;
pub mod cluster;
pub mod config;
pub(crate) mod delivery;
pub mod engine;
pub(crate) mod failpoint;
pub(crate) mod journal;
pub(crate) mod listen;
pub(crate) mod metrics;
pub mod serve;
pub mod spool;
pub mod telemetry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod time;
pub(crate) mod tls;

/// The OpenAPI 3.1 document of the HTTP API (`spoold openapi`).
pub use api::openapi_document;

/// The global allocator the `spoold` binary is built with (`src/main.rs`
/// installs it; `docs/performance.md` says why jemalloc is the default).
pub const ALLOCATOR: &str = if cfg!(feature = "count-allocations") {
    "jemalloc, counting"
} else if cfg!(feature = "mimalloc") {
    "mimalloc"
} else if cfg!(feature = "jemalloc") {
    "jemalloc"
} else {
    "system"
};
