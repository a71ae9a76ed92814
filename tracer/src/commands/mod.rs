//! One module per subcommand: each turns a validated config into a run; [`metrics`]
//! serves the scrapes of `attach` and `profile`; [`entry`] dispatches the command line.

pub(crate) mod attach;
pub(crate) mod entry;
pub(crate) mod generate;
pub(crate) mod list;
pub(crate) mod metrics;
pub(crate) mod profile;
pub(crate) mod stacks;
pub(crate) mod trace;
