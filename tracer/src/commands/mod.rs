//! One module per subcommand: each turns a validated config into a run.

pub mod attach;
pub mod generate;
pub mod list;
pub mod profile;
pub mod stacks;
pub mod trace;
