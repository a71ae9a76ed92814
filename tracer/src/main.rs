//! The `tracer` binary: parse, validate, dispatch; errors become one line and exit 1.

use clap::Parser as _;
use tracer::{
    cli::{AttachConfig, Cli, Command, ListConfig, ProfileConfig, StacksConfig, TraceConfig},
    commands,
    console::OutputError,
};

fn main() {
    if tracer::loader::keeper::is_keeper(std::env::args_os().nth(1).as_deref()) {
        std::process::exit(tracer::loader::keeper::serve());
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Attach(args) => AttachConfig::try_from(args)
            .map_err(anyhow::Error::from)
            .and_then(commands::attach::run),
        Command::List(args) => ListConfig::try_from(args)
            .map_err(anyhow::Error::from)
            .and_then(commands::list::run),
        Command::Trace(args) => TraceConfig::try_from(args)
            .map_err(anyhow::Error::from)
            .and_then(commands::trace::run),
        Command::Profile(args) => ProfileConfig::try_from(args)
            .map_err(anyhow::Error::from)
            .and_then(commands::profile::run),
        Command::Stacks(args) => StacksConfig::try_from(args)
            .map_err(anyhow::Error::from)
            .and_then(commands::stacks::run),
    };
    if let Err(error) = result {
        // A reader that went away (`tracer list | head -1`) wanted no more: not an error.
        if matches!(
            error.downcast_ref::<OutputError>(),
            Some(OutputError::Closed)
        ) {
            std::process::exit(0);
        }
        tracer::status!("tracer: error: {error:#}");
        std::process::exit(1);
    }
}
