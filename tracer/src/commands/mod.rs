//! One module per subcommand: each turns a validated config into a run; [`metrics`]
//! serves the scrapes of `attach` and `profile`.

pub mod attach;
pub mod generate;
pub mod list;
pub mod metrics;
pub mod profile;
pub mod stacks;
pub mod trace;
