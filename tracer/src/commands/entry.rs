//! The entry point of the `tracer` binary: parse the command line, validate it, run the
//! command; an error becomes one line and exit code 1.

use clap::Parser as _;

use crate::{
    cli::{AttachConfig, Cli, Command, ListConfig, ProfileConfig, StacksConfig, TraceConfig},
    commands,
    system::console::OutputError,
    system::oserror,
    system::out_of_memory,
    system::text,
};

/// The `tracer` binary: parse, validate, dispatch; errors become one line and exit 1.
pub fn main() {
    // One malloc arena for every thread: the naming threads parse symbol files while the
    // stacks are taken and views are written on threads of their own, and glibc's arena
    // per thread kept each one's freed memory apart (5 MB more at the peak of a stop).
    // musl's allocator has no arenas to limit.
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter; no allocation has a thread yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1)
    };
    out_of_memory::prepare();
    if crate::kernel::keeper::is_keeper(std::env::args_os().nth(1).as_deref()) {
        std::process::exit(crate::kernel::keeper::serve());
    }
    init_log();
    let cli = Cli::parse();
    if cli.bpf_debug {
        crate::kernel::enable_bpf_diagnostics();
    }
    // Loading eBPF programs in too small a memory cgroup ends in the kernel killing
    // tracer without a word: refused with the limit named instead.
    let room = match &cli.command {
        Command::Attach(_) | Command::Profile(_) | Command::Trace(_) => {
            out_of_memory::check_cgroup_room()
        }
        _ => Ok(()),
    };
    let result = room.and_then(|()| match cli.command {
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
    });
    if let Err(error) = result {
        // A reader that went away (`tracer list | head -1`) wanted no more: not an error.
        if matches!(
            error.downcast_ref::<OutputError>(),
            Some(OutputError::Closed)
        ) {
            std::process::exit(0);
        }
        // Out of file descriptors or of memory wherever it happened: say which limit.
        let hint = match oserror::open_file_hint(&error) {
            Some(limit) => format!(": {limit}"),
            None => oserror::memory_limit_hint(&error)
                .map(|limits| format!(": out of memory: {limits}"))
                .unwrap_or_default(),
        };
        // Names from the target (paths, probes) may be in it: no raw control characters,
        // though the lines of a verifier log stay lines.
        let message = format!("{}{hint}", oserror::error_chain_text(&error));
        let lines: Vec<_> = message.split('\n').map(text::escape_text).collect();
        crate::status!("tracer: error: {}", lines.join("\n"));
        std::process::exit(1);
    }
}

/// Warnings read like the tool's errors (`tracer: warning: ...`); debugging levels name the
/// module they come from.
fn init_log() {
    use std::io::Write as _;
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format(|out, record| match record.level() {
            log::Level::Error => writeln!(out, "tracer: error: {}", record.args()),
            log::Level::Warn => writeln!(out, "tracer: warning: {}", record.args()),
            level => writeln!(
                out,
                "tracer: {} [{}]: {}",
                level.as_str().to_lowercase(),
                record.target(),
                record.args()
            ),
        })
        .init();
}
