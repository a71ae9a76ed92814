//! The `tracer` binary: parse, validate, dispatch; errors become one line and exit 1.

use clap::Parser as _;
use tracer::{
    cli::{AttachConfig, Cli, Command, ListConfig, ProfileConfig, StacksConfig, TraceConfig},
    commands,
    console::OutputError,
    oserror, text,
};

fn main() {
    // One malloc arena for every thread: the naming threads parse symbol files while the
    // stacks are taken and views are written on threads of their own, and glibc's arena
    // per thread kept each one's freed memory apart (5 MB more at the peak of a stop).
    // SAFETY: mallopt only sets an allocator parameter; no allocation has a thread yet.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    if tracer::loader::keeper::is_keeper(std::env::args_os().nth(1).as_deref()) {
        std::process::exit(tracer::loader::keeper::serve());
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    if cli.bpf_debug {
        tracer::loader::enable_bpf_diagnostics();
    }
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
        Command::Generate(args) => commands::generate::run(args.what, &args.dir),
    };
    if let Err(error) = result {
        // A reader that went away (`tracer list | head -1`) wanted no more: not an error.
        if matches!(
            error.downcast_ref::<OutputError>(),
            Some(OutputError::Closed)
        ) {
            std::process::exit(0);
        }
        // Out of file descriptors wherever it happened: say it is the open-file limit.
        let hint = oserror::open_file_hint(&error)
            .map(|limit| format!(": {limit}"))
            .unwrap_or_default();
        // Names from the target (paths, probes) may be in it: no raw control characters,
        // though the lines of a verifier log stay lines.
        let message = format!("{error:#}{hint}");
        let lines: Vec<_> = message.split('\n').map(text::escape_text).collect();
        tracer::status!("tracer: error: {}", lines.join("\n"));
        std::process::exit(1);
    }
}
