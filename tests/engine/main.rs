//! The engine in this test's process, without the server: on the
//! fault-injecting simulated storage (what is answered only after its
//! fsync, every row of the recovery table, the model test of every
//! operation through crashes and power cuts, arbitrary input to replay and
//! the parsers), and on the real file system (a bounded soak, a spool of
//! the previous format upgraded, spools earlier builds of this format
//! wrote read and written again, and the table of every such spool by
//! format and level, which a new format or level must extend).
//!
//! One module per subject: `cargo test --test engine model::` runs one.

mod bounds;
#[path = "../common/mod.rs"]
mod common;

mod end_to_end;
mod fan_out;
mod fixture_table;
mod fixtures;
mod fuzz;
mod model;
mod recovery_table;
mod soak;
mod upgrade;
