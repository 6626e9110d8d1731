//! The HTTP API of the server running in this test's process (the
//! library's `serve::start` on 127.0.0.1:0, `common::server`), spoken to
//! over real sockets: every route and error, dead-letter workflows (over
//! the API and with the binary's command line), push delivery to a local
//! sink, the OpenAPI document against the routes, and overload.
//!
//! Every server of this binary shares the process's metrics registry: a
//! test that counts a metric counts it for a queue name no other test of
//! this binary uses (`dead_letters`' `alerts`).
//!
//! One module per subject: `cargo test --test http push_delivery::` runs
//! one.

mod clients;
#[path = "../common/mod.rs"]
mod common;
mod connections;

mod dead_letters;
mod end_to_end;
mod gateway;
mod openapi;
mod overload;
mod push_delivery;
mod tenant_isolation;
