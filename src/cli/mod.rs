//! Operator subcommands that do not need a running server.

pub mod commands;
pub mod journal;
pub mod ops;
pub mod term;
