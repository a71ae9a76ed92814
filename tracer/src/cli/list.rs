//! `tracer list`: its raw arguments and its validated config.

use std::num::NonZeroU32;

use clap::Args;

use super::ConfigError;
use super::parse::nonzero_pid;

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// List the probes of this process: its executable and every mapped library.
    #[arg(long, short)]
    pub pid: Option<u32>,
    /// Show every site with its address, semaphore and argument specs.
    #[arg(long, short)]
    pub verbose: bool,
    /// A file, a probe pattern (`python:gc__*`, with --pid) or `usdt:PATH:PROVIDER:NAME`.
    pub target: Option<String>,
}

/// `tracer list`, validated.
#[derive(Debug, Clone)]
pub(crate) struct ListConfig {
    pub pid: Option<NonZeroU32>,
    pub verbose: bool,
    pub target: Option<String>,
}

impl TryFrom<ListArgs> for ListConfig {
    type Error = ConfigError;

    fn try_from(args: ListArgs) -> Result<Self, ConfigError> {
        Ok(Self {
            pid: args.pid.map(nonzero_pid).transpose()?,
            verbose: args.verbose,
            target: args.target,
        })
    }
}
