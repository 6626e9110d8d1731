//! Replicated mode: replicas as real `spoold` processes on loopback
//! (`common::cluster`), some behind proxies the test cuts and delays
//! (`common::links`): failover and forwarding, membership changes, faults
//! beyond the nemesis, the Jepsen-style nemesis, the cluster port
//! against someone without the secret, and clusters that earlier builds
//! wrote (`tests/data`) restarted by this one.
//!
//! One module per subject: `cargo test --test cluster nemesis::` runs one.

#[path = "../common/mod.rs"]
mod common;

mod clock;
mod dashboard;
mod digest;
mod failover;
mod faults;
mod filters;
mod fixtures;
mod heal;
mod levels;
mod membership;
mod nemesis;
mod port_attacks;
mod webhooks;
