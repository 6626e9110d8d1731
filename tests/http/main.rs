//! The HTTP API of the server running in this test's process (the
//! library's `serve::start` on 127.0.0.1:0, `common::server`), spoken to
//! over real sockets: every route and error, dead-letter workflows (over
//! the API and with the binary's command line), push delivery to a local
//! sink, the OpenAPI document against the routes, and overload.
//!
//! Every server of this binary shares the process's metrics registry, and
//! `dead_letters::filters_select_dead_letters_for_peek_redrive_and_purge`
//! counts every failed delivery of a queue named `hooks` in it: it relies
//! on starting (tests start in name order) before any other test here
//! fails a delivery on a queue of that name.
//!
//! One module per subject: `cargo test --test http push_delivery::` runs
//! one.

#[path = "../common/mod.rs"]
mod common;

mod dead_letters;
mod end_to_end;
mod openapi;
mod overload;
mod push_delivery;
