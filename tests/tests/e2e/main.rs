//! The privileged end-to-end tests, in one binary with a module per command (the layout
//! of aya's and blazesym's integration tests): `list`, `trace`, `attach`, `profile` and
//! `stacks` as a user runs them on real targets, then what cuts across commands: bad
//! input (`errors`), never harming a target or leaking (`safety`), and the installed tool
//! (`install`).
//!
//! Each test is a `#[privileged_test]`: a plain `cargo test` lists it as ignored with the
//! reason, and `cargo xtask test` runs it with `--include-ignored`. One binary lets the
//! test harness run tests of different commands side by side.

mod common;

mod attach;
mod errors;
mod install;
mod list;
mod profile;
mod safety;
mod stacks;
mod trace;
