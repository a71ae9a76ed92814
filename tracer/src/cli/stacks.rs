//! `tracer stacks`: its raw arguments and its validated config.

use std::num::NonZeroU32;

use clap::Args;

use super::parse::nonzero_pid;
use super::{ConfigError, Format};

#[derive(Debug, Args)]
pub(crate) struct StacksArgs {
    /// The process whose threads to show.
    #[arg(long, short)]
    pub pid: u32,
    /// Output format: text, or one JSON document.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Leave a HotSpot JVM alone: do not ask it for its perf map, so JIT-compiled Java
    /// methods stay unnamed unless a perf map is there already.
    #[arg(long)]
    pub no_jit_symbols: bool,
}

/// `tracer stacks`, validated.
#[derive(Debug, Clone)]
pub(crate) struct StacksConfig {
    pub pid: NonZeroU32,
    pub format: Format,
    /// A HotSpot JVM is asked for its perf map.
    pub jit_symbols: bool,
}

impl TryFrom<StacksArgs> for StacksConfig {
    type Error = ConfigError;

    fn try_from(args: StacksArgs) -> Result<Self, ConfigError> {
        Ok(Self {
            pid: nonzero_pid(args.pid)?,
            format: args.format,
            jit_symbols: !args.no_jit_symbols,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser as _;

    #[test]
    fn stacks_needs_a_pid() {
        let config = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["tracer", "stacks"], args].concat())?;
            let Command::Stacks(args) = cli.command else {
                panic!("not stacks")
            };
            Ok::<_, clap::Error>(StacksConfig::try_from(args))
        };
        let stacks = config(&["--pid", "42", "--format", "json"])
            .unwrap()
            .unwrap();
        assert_eq!((stacks.pid.get(), stacks.format), (42, Format::Json));
        assert_eq!(config(&["-p", "7"]).unwrap().unwrap().format, Format::Text);
        assert_eq!(
            config(&["--pid", "0"]).unwrap().unwrap_err(),
            ConfigError::ZeroPid
        );
        assert!(config(&[]).is_err(), "--pid is required");
    }
}
