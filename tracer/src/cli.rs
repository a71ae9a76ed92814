//! Command-line parsing in two steps: clap's raw arguments, then a validated config the
//! rest of the program uses (typed pid, durations, output format).

use std::{num::NonZeroU32, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};
use thiserror::Error;

use crate::profile::sampling::{Sampling, UnwindMethod};
use crate::{kernel::MapSizes, probe::plan::StringRequest, target::TargetSpec};
use tracer_common::{DEFAULT_STR_LEN, MAX_STR_LEN, MAX_USDT_ARGS};

#[derive(Debug, Parser)]
#[command(
    name = "tracer",
    version,
    about = "eBPF tracer and wall-clock profiler for language runtimes",
    after_help = "Examples:\n  sudo tracer attach --pid 4242 -d 30s -o profile/\n  sudo tracer profile --comm python3.11 -d 10s\n  sudo tracer stacks --pid 4242\n\nSee `man tracer-COMMAND` or `tracer COMMAND --help`."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Show the eBPF programs' own diagnostics on standard error: each failed argument
    /// read, stack capture error and full map, with the probe, site and error. Off, the
    /// kernel drops the logging code: it costs nothing.
    #[arg(long, global = true)]
    pub bpf_debug: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Attach to running processes: GC pauses and latencies from their runtime's probes,
    /// and a wall-clock profile of every thread (on CPU, blocked, runnable) in the
    /// runtime's own frames.
    #[command(after_help = ATTACH_EXAMPLES)]
    Attach(AttachArgs),
    /// List the USDT probes of a file or a running process (with its shared libraries).
    #[command(after_help = LIST_EXAMPLES)]
    List(ListArgs),
    /// Print (or count) every hit of USDT probes, with its decoded arguments and, with
    /// --stack, its stacks.
    #[command(after_help = TRACE_EXAMPLES)]
    Trace(TraceArgs),
    /// Wall-clock profile: on-CPU samples and off-CPU (blocked) time of a process, or of
    /// every process, as flame graphs, folded stacks, pprof and speedscope files.
    #[command(after_help = PROFILE_EXAMPLES)]
    Profile(ProfileArgs),
    /// What every thread of a running process is doing now, without stopping it: state,
    /// the system call it is blocked in and for how long, kernel and user stacks.
    #[command(after_help = STACKS_EXAMPLES)]
    Stacks(StacksArgs),
    /// Writes the man pages or the shell completions into a directory (for packaging:
    /// `cargo xtask install` uses it).
    #[command(hide = true)]
    Generate(GenerateArgs),
}

/// Examples each command's `--help` ends with (the README's and the help's examples
/// are checked to parse).
pub const ATTACH_EXAMPLES: &str = "Examples:
  sudo tracer attach --pid 4242 --duration 30s -o profile/
  sudo tracer attach --exe /usr/lib/postgresql/15/bin/postgres --format json
  sudo tracer attach --pid 5211 --children --latency postgresql:transaction__start,postgresql:transaction__commit";
pub const LIST_EXAMPLES: &str = "Examples:
  tracer list /usr/bin/python3.11
  sudo tracer list --pid 4242 'hotspot:gc__*'
  tracer list 'usdt:/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so:*:thread__*'";
pub const TRACE_EXAMPLES: &str = "Examples:
  sudo tracer trace --pid 4242 'usdt:*:python:gc__*'
  sudo tracer trace --count --stack --pid 4242 'usdt:/usr/bin/python3.11:python:gc__start'
  sudo tracer trace --count 'usdt:*:python:gc__start' -- python3.11 app.py";
pub const PROFILE_EXAMPLES: &str = "Examples:
  sudo tracer profile --pid 4242 -d 10s -o prof/
  sudo tracer profile --comm python3.11 --per-thread
  sudo tracer profile -F 499 -d 5s";
pub const STACKS_EXAMPLES: &str = "Examples:
  sudo tracer stacks --pid 4242
  sudo tracer stacks --pid 4242 --format json";

/// What `tracer generate` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Generated {
    /// `tracer.1` and one page per command (`tracer-attach.1`, ...).
    Man,
    /// `tracer.bash`, `_tracer` (zsh) and `tracer.fish`.
    Completions,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// What to write.
    #[arg(value_enum)]
    pub what: Generated,
    /// The directory to write into (created if needed).
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct StacksArgs {
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

#[derive(Debug, Args)]
pub struct ProfileArgs {
    /// What to profile (every thread of each process); every process when absent.
    #[command(flatten)]
    pub targets: TargetArgs,
    /// Stop after this long (e.g. 10s, 500ms, 2m); otherwise at Ctrl-C or target exit.
    #[arg(long, short)]
    pub duration: Option<String>,
    /// Ignore off-CPU intervals shorter than this (e.g. 100us); the wall-clock view then
    /// leaves them out.
    #[arg(long, default_value = "0")]
    pub min_block: String,
    /// Put each thread under its own frame, below the process.
    #[arg(long)]
    pub per_thread: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub maps: MapSizeArgs,
    /// Directory for the outputs [default: tracer-profile-PID, or tracer-profile].
    #[arg(long = "output", short = 'o')]
    pub output: Option<PathBuf>,
}

/// Which processes to trace, the same for every command that traces processes. The
/// options add up: `--pid 1 --pid 2 --exe /usr/bin/x` traces all of them.
#[derive(Debug, Clone, Default, Args)]
pub struct TargetArgs {
    /// A process to trace (all its threads). May be repeated.
    #[arg(long, short, value_name = "PID")]
    pub pid: Vec<u32>,
    /// Every process running this executable, those started while tracing included.
    #[arg(long, value_name = "PATH")]
    pub exe: Option<PathBuf>,
    /// Every process of this name (as `ps -o comm` shows it; names are cut to 15
    /// bytes), those started while tracing included.
    #[arg(long, value_name = "NAME")]
    pub comm: Option<String>,
    /// Every process in this cgroup or below it: a systemd service
    /// (/sys/fs/cgroup/system.slice/NAME.service) or a container.
    #[arg(long, value_name = "DIR")]
    pub cgroup: Option<PathBuf>,
    /// Also every process the targets fork while tracing, and theirs (the backends of a
    /// server that forks one per connection).
    #[arg(long)]
    pub children: bool,
}

impl TryFrom<&TargetArgs> for TargetSpec {
    type Error = ConfigError;

    fn try_from(args: &TargetArgs) -> Result<Self, ConfigError> {
        let mut pids = Vec::new();
        for &pid in &args.pid {
            let pid = nonzero_pid(pid)?;
            if !pids.contains(&pid) {
                pids.push(pid);
            }
        }
        if let Some(comm) = &args.comm
            && comm.is_empty()
        {
            return Err(ConfigError::EmptyComm);
        }
        let spec = TargetSpec {
            pids,
            exe: args.exe.clone(),
            comm: args.comm.clone(),
            cgroup: args.cgroup.clone(),
            children: args.children,
        };
        if spec.children && spec.is_everything() {
            return Err(ConfigError::ChildrenOfNothing);
        }
        Ok(spec)
    }
}

/// How stacks are sampled and walked, the same for every command that collects them.
#[derive(Debug, Clone, Args)]
pub struct SamplingArgs {
    /// On-CPU samples per second of CPU time, on every CPU.
    #[arg(long, short = 'F', default_value_t = 99)]
    pub frequency: u64,
    /// How user stacks are walked: `dwarf` (the binaries' call frame information,
    /// .eh_frame and .debug_frame, unwound in user space from a copy of the stack, and
    /// frame pointers for code no call frame information covers: works on distribution
    /// binaries, which have no frame pointers) or `fp` (frame pointers only, walked in
    /// the kernel: cheapest, but callers in code built without them are lost).
    #[arg(long, value_enum, default_value_t = UnwindMethod::Dwarf)]
    pub unwind: UnwindMethod,
    /// With --unwind dwarf: size of the buffer stack copies (16 KiB each) wait in until
    /// they are unwound (e.g. 8M, 64M); more absorbs bursts, and costs twice its size in
    /// resident memory (the kernel maps a ring's pages twice). Rounded up to a power of two.
    #[arg(long, default_value = "8M", value_name = "SIZE")]
    pub unwind_buffer: String,
    /// Leave CPython processes' stacks in C: no Python frames (`function (file.py:LINE)`)
    /// in place of the interpreter's. Python frames need --unwind dwarf.
    #[arg(long)]
    pub no_python_frames: bool,
    /// Leave HotSpot JVMs alone: do not ask them for their perf maps (what
    /// `jcmd PID Compiler.perfmap` does), so JIT-compiled Java methods stay unnamed
    /// unless a perf map is there already.
    #[arg(long)]
    pub no_jit_symbols: bool,
}

impl TryFrom<&SamplingArgs> for Sampling {
    type Error = ConfigError;

    fn try_from(args: &SamplingArgs) -> Result<Self, ConfigError> {
        if !(1..=MAX_FREQUENCY_HZ).contains(&args.frequency) {
            return Err(ConfigError::Frequency(args.frequency));
        }
        Ok(Self {
            frequency_hz: args.frequency,
            unwind: args.unwind,
            unwind_buffer_bytes: parse_buffer_size("unwind-buffer", &args.unwind_buffer)?,
            python_frames: !args.no_python_frames,
            jit_symbols: !args.no_jit_symbols,
        })
    }
}

/// Sizes of the kernel's aggregation maps: what fills them is counted and reported as
/// lost, so a run that reports losses can be repeated with larger maps.
#[derive(Debug, Clone, Args)]
pub struct MapSizeArgs {
    /// Distinct stacks the kernel can keep (user and kernel stacks count separately)
    /// [default: 32768].
    #[arg(long, value_name = "N")]
    pub stack_map_size: Option<u32>,
    /// Entries of each kernel hash map: threads off CPU at once, and distinct
    /// (thread, stacks) keys of the profile [default: 65536].
    #[arg(long, value_name = "N")]
    pub map_size: Option<u32>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// List the probes of this process: its executable and every mapped library.
    #[arg(long, short)]
    pub pid: Option<u32>,
    /// Show every site with its address, semaphore and argument specs.
    #[arg(long, short)]
    pub verbose: bool,
    /// A file, a probe pattern (`python:gc__*`, with --pid) or `usdt:PATH:PROVIDER:NAME`.
    pub target: Option<String>,
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    /// Only hits in these processes (their probes are searched in every object they
    /// map); every process running the probes' files when absent.
    #[command(flatten)]
    pub targets: TargetArgs,
    /// Output format: one line per event, or one JSON object per line.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Stop after this long (e.g. 10s).
    #[arg(long, short)]
    pub duration: Option<String>,
    /// Size of the kernel-to-user event buffer (e.g. 4M, 64M): more absorbs longer bursts.
    /// Rounded up to a power of two.
    #[arg(long, default_value = "4M", value_name = "SIZE")]
    pub ring_buffer: String,
    /// Count hits per probe in the kernel and print the counts at the end, instead of
    /// one line per hit.
    #[arg(long, short)]
    pub count: bool,
    /// Show an argument as the string it points to, read at the hit, at most LEN bytes
    /// (default 64, at most 4096; longer ones are cut, marked `...`), like bpftrace's
    /// `str(argN, LEN)`: of every probe (`arg0`), or of those named so (`query__start:arg0`,
    /// `postgresql:query__*:arg0:256`). May be repeated; not with --count.
    #[arg(long = "str", value_name = "[[PROVIDER:]NAME:]argN[:LEN]")]
    pub strings: Vec<String>,
    /// The user and kernel stacks of each hit (frame pointers), printed after its line
    /// (a `stack` array in JSON); with --count, hits are counted per stack and written
    /// as folded stacks and a flame graph into --output.
    #[arg(long)]
    pub stack: bool,
    /// How --stack walks user stacks: `fp` (frame pointers, in the kernel: cheapest, and
    /// counted in the kernel with --count) or `dwarf` (the binaries' call frame
    /// information, unwound here from a 16 KiB copy of the stack sent with each hit: for
    /// binaries without frame pointers, as `profile --unwind dwarf`).
    #[arg(long, value_enum, default_value_t = UnwindMethod::Fp, requires = "stack")]
    pub unwind: UnwindMethod,
    /// Directory for the flame graph (SVG) and folded stacks of `--count --stack`
    /// [default: tracer-trace].
    #[arg(long = "output", short = 'o', requires_all = ["count", "stack"])]
    pub output: Option<PathBuf>,
    /// Probes as bpftrace writes them: usdt:PATH:PROVIDER:NAME (wildcards allowed; with
    /// --pid the path may be `*` or a library name), or functions: uprobe:PATH:FUNC
    /// (entry; FUNC+OFFSET or 0xADDRESS within it) and uretprobe:PATH:FUNC (return),
    /// C++ and Rust names matched mangled or demangled.
    #[arg(required = true, value_name = "PROBE")]
    pub probes: Vec<String>,
    /// Stop the process each time it loads a library (SIGSTOP, then SIGCONT), until the
    /// library's probes are attached, so not even the first hits of its initialization
    /// are missed. The process can see the stop: its shell's job control, a SIGCONT
    /// handler, a read interrupted (EINTR). Off by default: a library's probes are then
    /// attached within a millisecond of its loading. One process only (--pid, or a
    /// command after --).
    #[arg(long)]
    pub hold_at_dlopen: bool,
    /// A command to start and trace from its first instruction.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The processes to trace: at least one of --pid, --exe, --comm, --cgroup.
    #[command(flatten)]
    pub targets: TargetArgs,
    /// Stop after this long (e.g. 10s, 500ms, 2m); otherwise at Ctrl-C or target exit.
    #[arg(long, short)]
    pub duration: Option<String>,
    /// Directory for the flamegraph (SVG) and folded stacks [default: tracer-PID, or
    /// tracer-NAME for --exe, --comm, --cgroup].
    #[arg(long = "output", short = 'o')]
    pub output: Option<PathBuf>,
    /// Ignore off-CPU intervals shorter than this (e.g. 100us).
    #[arg(long, default_value = "0")]
    pub min_block: String,
    /// Measure the latency between two probes of the target, matched per thread: USDT
    /// probes as PROVIDER:NAME, functions as uprobe:PATH:FUNC (entry) and
    /// uretprobe:PATH:FUNC (return; a function's entry to its return is matched per call,
    /// recursion included). May be repeated.
    #[arg(long = "latency", value_name = "BEGIN,END")]
    pub latencies: Vec<String>,
    /// Put each thread under its own root frame in the flamegraph.
    #[arg(long)]
    pub per_thread: bool,
    /// Stop the process each time it loads a library (SIGSTOP, then SIGCONT), until the
    /// library's probes are attached, so not even the first hits of its initialization
    /// are missed. The process can see the stop: its shell's job control, a SIGCONT
    /// handler, a read interrupted (EINTR). Off by default: a library's probes are then
    /// attached within a millisecond of its loading. One process only (--pid, or a
    /// command after --).
    #[arg(long)]
    pub hold_at_dlopen: bool,
    /// Also write a timeline to FILE: Chrome trace-event JSON (Perfetto, speedscope,
    /// chrome://tracing) with a track per thread (latencies such as GC phases, task runs,
    /// time off CPU) and one per runtime task (running, parked).
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<PathBuf>,
    /// In the timeline, off-CPU intervals shorter than this are left out.
    #[arg(
        long,
        default_value = "1ms",
        value_name = "DURATION",
        requires = "timeline"
    )]
    pub timeline_min_block: String,
    /// Report format on standard output.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub maps: MapSizeArgs,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("invalid PID 0")]
    ZeroPid,
    #[error("--pid and a command after -- cannot be used together")]
    PidAndCommand,
    #[error("--exe, --comm and --cgroup cannot be used with a command after --")]
    MatchAndCommand,
    #[error("attach needs a target: --pid PID, --exe PATH, --comm NAME or --cgroup DIR")]
    NoTarget,
    #[error(
        "--children needs processes to follow: --pid, --exe, --comm or --cgroup (or a command after --)"
    )]
    ChildrenOfNothing,
    #[error("--comm needs a name")]
    EmptyComm,
    #[error(
        "--hold-at-dlopen stops one process at a time: it needs --pid PID (once) or a command after --, without --children"
    )]
    HoldNeedsOneProcess,
    #[error("invalid --{0} {1:?}: expected a size from 4K to 1G, like 4M or 65536")]
    BufferSize(&'static str, String),
    #[error("invalid --{0} {1}: expected 1 to {2} entries")]
    MapSize(&'static str, u32, u32),
    #[error("invalid duration {0:?}: expected a number with a unit, like 10s, 500ms, 2m or 100us")]
    Duration(String),
    #[error("invalid --frequency {0}: expected 1 to {MAX_FREQUENCY_HZ} samples per second")]
    Frequency(u64),
    #[error(
        "invalid --latency {0:?}: expected BEGIN,END, each PROVIDER:NAME (a USDT probe), \
         uprobe:PATH:FUNC or uretprobe:PATH:FUNC (e.g. julia:gc__begin,julia:gc__end)"
    )]
    Latency(String),
    #[error("invalid --latency {0:?}: {1}")]
    LatencyProbe(String, String),
    #[error(
        "invalid --str {0:?}: expected [[PROVIDER:]NAME:]argN[:LEN], like arg0, query__start:arg0 or postgresql:query__start:arg0:256"
    )]
    StrSyntax(String),
    #[error(
        "invalid --str {0:?}: a USDT probe has at most {MAX_USDT_ARGS} arguments, arg0 to arg11"
    )]
    StrArgument(String),
    #[error("invalid --str {0:?}: the length must be 1 to {MAX_STR_LEN} bytes")]
    StrLength(String),
    #[error(
        "--str shows strings in the events of each hit; --count prints only counts: use one or the other"
    )]
    StrWithCount,
}

/// A latency asked for on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyRequest {
    pub begin: LatencyProbe,
    pub end: LatencyProbe,
}

/// One end of a latency asked for: a USDT probe by provider and name, or a function's
/// entry or return (resolved to its symbol in the targets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LatencyProbe {
    Usdt { provider: String, name: String },
    Function(crate::probe::usdt::UsdtSpecifier),
}

impl std::fmt::Display for LatencyProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LatencyProbe::Usdt { provider, name } => write!(f, "{provider}:{name}"),
            LatencyProbe::Function(spec) => f.write_str(&spec.describe()),
        }
    }
}

/// `tracer attach`, validated.
#[derive(Debug, Clone)]
pub struct AttachConfig {
    pub targets: TargetSpec,
    pub duration: Option<Duration>,
    pub output_dir: PathBuf,
    pub min_block: Duration,
    pub latencies: Vec<LatencyRequest>,
    pub per_thread: bool,
    /// `--timeline FILE` and `--timeline-min-block`.
    pub timeline: Option<TimelineConfig>,
    pub format: Format,
    pub sampling: Sampling,
    pub map_sizes: MapSizes,
    /// `--hold-at-dlopen`.
    pub hold_at_dlopen: bool,
}

/// Where the timeline goes, and the shortest off-CPU interval it shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineConfig {
    pub path: PathBuf,
    pub min_block: Duration,
}

impl TryFrom<AttachArgs> for AttachConfig {
    type Error = ConfigError;

    fn try_from(args: AttachArgs) -> Result<Self, ConfigError> {
        let targets = TargetSpec::try_from(&args.targets)?;
        if targets.is_everything() {
            return Err(ConfigError::NoTarget);
        }
        if args.hold_at_dlopen && targets.single_pid().is_none() {
            return Err(ConfigError::HoldNeedsOneProcess);
        }
        Ok(Self {
            hold_at_dlopen: args.hold_at_dlopen,
            duration: args.duration.as_deref().map(parse_duration).transpose()?,
            output_dir: args
                .output
                .unwrap_or_else(|| PathBuf::from(format!("tracer-{}", targets.short_name()))),
            targets,
            min_block: parse_duration(&args.min_block)?,
            latencies: args
                .latencies
                .iter()
                .map(|l| parse_latency(l))
                .collect::<Result<_, _>>()?,
            per_thread: args.per_thread,
            timeline: match args.timeline {
                Some(path) => Some(TimelineConfig {
                    path,
                    min_block: parse_duration(&args.timeline_min_block)?,
                }),
                None => None,
            },
            format: args.format,
            sampling: Sampling::try_from(&args.sampling)?,
            map_sizes: map_sizes(&args.maps)?,
        })
    }
}

/// The highest sampling frequency accepted (the kernel's own default limit,
/// `kernel.perf_event_max_sample_rate`, is 100000 and it lowers it under load).
pub const MAX_FREQUENCY_HZ: u64 = 100_000;

/// `tracer profile`, validated.
#[derive(Debug, Clone)]
pub struct ProfileConfig {
    /// What to profile ([`TargetSpec::is_everything`]: every process).
    pub targets: TargetSpec,
    pub duration: Option<Duration>,
    pub min_block: Duration,
    pub per_thread: bool,
    pub sampling: Sampling,
    pub map_sizes: MapSizes,
    pub output_dir: PathBuf,
}

impl TryFrom<ProfileArgs> for ProfileConfig {
    type Error = ConfigError;

    fn try_from(args: ProfileArgs) -> Result<Self, ConfigError> {
        let targets = TargetSpec::try_from(&args.targets)?;
        Ok(Self {
            duration: args.duration.as_deref().map(parse_duration).transpose()?,
            min_block: parse_duration(&args.min_block)?,
            per_thread: args.per_thread,
            sampling: Sampling::try_from(&args.sampling)?,
            map_sizes: map_sizes(&args.maps)?,
            output_dir: args
                .output
                .unwrap_or_else(|| match targets.is_everything() {
                    false => PathBuf::from(format!("tracer-profile-{}", targets.short_name())),
                    true => PathBuf::from("tracer-profile"),
                }),
            targets,
        })
    }
}

/// `tracer list`, validated.
#[derive(Debug, Clone)]
pub struct ListConfig {
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

/// `tracer stacks`, validated.
#[derive(Debug, Clone)]
pub struct StacksConfig {
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

/// `tracer trace`, validated.
#[derive(Debug, Clone)]
pub struct TraceConfig {
    /// Whose hits ([`TargetSpec::is_everything`]: every process running the probes).
    pub targets: TargetSpec,
    pub format: Format,
    pub duration: Option<Duration>,
    pub count: bool,
    /// Stacks at every hit (`--stack`).
    pub stack: bool,
    /// How `--stack` walks user stacks.
    pub unwind: UnwindMethod,
    /// Where `--count --stack` writes its flame graph.
    pub output_dir: PathBuf,
    pub ring_buffer_bytes: u32,
    /// Arguments shown as strings (`--str`).
    pub strings: Vec<StringRequest>,
    pub probes: Vec<String>,
    pub command: Option<Vec<String>>,
    /// `--hold-at-dlopen`.
    pub hold_at_dlopen: bool,
}

impl TryFrom<TraceArgs> for TraceConfig {
    type Error = ConfigError;

    fn try_from(args: TraceArgs) -> Result<Self, ConfigError> {
        let command = !args.command.is_empty();
        let t = &args.targets;
        if command && !t.pid.is_empty() {
            return Err(ConfigError::PidAndCommand);
        }
        if command && (t.exe.is_some() || t.comm.is_some() || t.cgroup.is_some()) {
            return Err(ConfigError::MatchAndCommand);
        }
        // The command's children are followed once it runs (its PID joins the targets).
        let targets = match command && t.children {
            true => TargetSpec {
                children: true,
                ..TargetSpec::default()
            },
            false => TargetSpec::try_from(t)?,
        };
        if args.count && !args.strings.is_empty() {
            return Err(ConfigError::StrWithCount);
        }
        let one_process = match command {
            true => !t.children,
            false => targets.single_pid().is_some(),
        };
        if args.hold_at_dlopen && !one_process {
            return Err(ConfigError::HoldNeedsOneProcess);
        }
        let strings = args
            .strings
            .iter()
            .map(|s| parse_string_request(s))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            targets,
            format: args.format,
            duration: args.duration.as_deref().map(parse_duration).transpose()?,
            count: args.count,
            stack: args.stack,
            unwind: args.unwind,
            output_dir: args.output.unwrap_or_else(|| PathBuf::from("tracer-trace")),
            ring_buffer_bytes: parse_buffer_size("ring-buffer", &args.ring_buffer)?,
            strings,
            probes: args.probes,
            command: (!args.command.is_empty()).then_some(args.command),
            hold_at_dlopen: args.hold_at_dlopen,
        })
    }
}

/// The most entries a map may be given.
pub const MAX_MAP_ENTRIES: u32 = 1 << 24;

/// The most entries the stack map may be given: its ids must stay below those of the
/// kernel stacks taken at switch in (`tracer_common::FIRST_SWITCH_IN_STACK_ID`), which are
/// below the ids user space gives unwound stacks (`unwind::FIRST_UNWOUND_ID`).
pub const MAX_STACK_MAP_ENTRIES: u32 = tracer_common::FIRST_SWITCH_IN_STACK_ID as u32;

fn map_sizes(args: &MapSizeArgs) -> Result<MapSizes, ConfigError> {
    let check = |flag: &'static str, value: Option<u32>, max: u32| match value {
        Some(n) if !(1..=max).contains(&n) => Err(ConfigError::MapSize(flag, n, max)),
        _ => Ok(value),
    };
    Ok(MapSizes {
        stacks: check("stack-map-size", args.stack_map_size, MAX_STACK_MAP_ENTRIES)?,
        entries: check("map-size", args.map_size, MAX_MAP_ENTRIES)?,
    })
}

/// Parses the size of ring buffer `--flag` (`65536`, `64K`, `4M`, `1G`), rounded up to a
/// power of two (which the kernel requires) and at least one page.
pub fn parse_buffer_size(flag: &'static str, text: &str) -> Result<u32, ConfigError> {
    let err = || ConfigError::BufferSize(flag, text.to_string());
    let text = text.trim();
    let (number, multiplier) = match text.char_indices().last() {
        Some((i, 'K' | 'k')) => (&text[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&text[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&text[..i], 1 << 30),
        _ => (text, 1),
    };
    let bytes = number
        .parse::<u64>()
        .map_err(|_| err())?
        .checked_mul(multiplier)
        .ok_or_else(err)?;
    if !(4096..=1 << 30).contains(&bytes) {
        return Err(err());
    }
    Ok(bytes.next_power_of_two() as u32)
}

fn nonzero_pid(pid: u32) -> Result<NonZeroU32, ConfigError> {
    NonZeroU32::new(pid).ok_or(ConfigError::ZeroPid)
}

/// Parses `10s`, `1.5s`, `500ms`, `100us`, `250ns`, `2m`, `1h`; a bare number is seconds.
pub fn parse_duration(text: &str) -> Result<Duration, ConfigError> {
    let err = || ConfigError::Duration(text.to_string());
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| err())?;
    let seconds_per_unit = match unit {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "ns" => 1e-9,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(err()),
    };
    Duration::try_from_secs_f64(value * seconds_per_unit).map_err(|_| err())
}

/// `--str [[PROVIDER:]NAME:]argN[:LEN]`. The `arg` prefix marks the argument, so a
/// number after it is the length, never taken for a probe name.
fn parse_string_request(text: &str) -> Result<StringRequest, ConfigError> {
    let syntax = || ConfigError::StrSyntax(text.to_string());
    let mut parts: Vec<&str> = text.split(':').collect();
    let is_arg = |part: &str| {
        part.strip_prefix("arg")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let max_len = match parts.as_slice() {
        [.., arg, len] if is_arg(arg) && !is_arg(len) => {
            let len: u16 = len.parse().map_err(|_| {
                match len.bytes().all(|b| b.is_ascii_digit()) && !len.is_empty() {
                    true => ConfigError::StrLength(text.to_string()),
                    false => syntax(),
                }
            })?;
            if len == 0 || len > MAX_STR_LEN {
                return Err(ConfigError::StrLength(text.to_string()));
            }
            parts.pop();
            len
        }
        _ => DEFAULT_STR_LEN,
    };
    let (arg, probe) = parts.split_last().ok_or_else(syntax)?;
    if !is_arg(arg) {
        return Err(syntax());
    }
    let arg = arg[3..]
        .parse::<u8>()
        .ok()
        .filter(|&i| (i as usize) < MAX_USDT_ARGS)
        .ok_or_else(|| ConfigError::StrArgument(text.to_string()))?;
    let (provider, name) = match probe {
        [] => ("*", "*"),
        [name] => ("*", *name),
        [provider, name] => (*provider, *name),
        _ => return Err(syntax()),
    };
    if provider.is_empty() || name.is_empty() {
        return Err(syntax());
    }
    Ok(StringRequest {
        text: text.to_string(),
        provider: provider.to_string(),
        name: name.to_string(),
        arg,
        max_len,
    })
}

fn parse_latency(text: &str) -> Result<LatencyRequest, ConfigError> {
    let err = || ConfigError::Latency(text.to_string());
    let (begin, end) = text.split_once(',').ok_or_else(err)?;
    let probe = |side: &str| -> Result<LatencyProbe, ConfigError> {
        let side = side.trim();
        if crate::probe::usdt::has_probe_type(side) {
            let spec = crate::probe::usdt::parse_specifier(side)
                .map_err(|e| ConfigError::LatencyProbe(text.to_string(), e.to_string()))?;
            if spec.kind.is_function() {
                return Ok(LatencyProbe::Function(spec));
            }
            let (provider, name) = (spec.pattern.provider, spec.pattern.name);
            if !provider.is_literal() || !name.is_literal() {
                return Err(err());
            }
            return Ok(LatencyProbe::Usdt {
                provider: provider.to_string(),
                name: name.to_string(),
            });
        }
        match side.split_once(':') {
            Some((provider, name))
                if !provider.is_empty() && !name.is_empty() && !name.contains(':') =>
            {
                Ok(LatencyProbe::Usdt {
                    provider: provider.into(),
                    name: name.into(),
                })
            }
            _ => Err(err()),
        }
    };
    Ok(LatencyRequest {
        begin: probe(begin)?,
        end: probe(end)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    /// The words of a shell command line: single and double quotes group, as a shell's.
    fn shell_words(line: &str) -> Vec<String> {
        let (mut words, mut word, mut quote, mut any) = (Vec::new(), String::new(), None, false);
        for c in line.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), c) => word.push(c),
                (None, '\'' | '"') => {
                    quote = Some(c);
                    any = true;
                }
                (None, c) if c.is_whitespace() => {
                    if any || !word.is_empty() {
                        words.push(std::mem::take(&mut word));
                    }
                    any = false;
                }
                (None, c) => word.push(c),
            }
        }
        if any || !word.is_empty() {
            words.push(word);
        }
        words
    }

    /// A `tracer ...` command line of an example, as clap gets it (without `sudo` and a
    /// trailing comment).
    fn example_args(line: &str) -> Option<Vec<String>> {
        let line = line
            .trim()
            .trim_start_matches("$ ")
            .trim_start_matches("sudo ");
        let line = line.split("   #").next()?.trim();
        line.starts_with("tracer ").then(|| shell_words(line))
    }

    #[test]
    fn every_example_in_the_help_and_the_readme_parses() {
        let help = [
            ATTACH_EXAMPLES,
            LIST_EXAMPLES,
            TRACE_EXAMPLES,
            PROFILE_EXAMPLES,
            STACKS_EXAMPLES,
        ];
        let top = Cli::command()
            .get_after_help()
            .map(|h| h.to_string())
            .unwrap_or_default();
        let readme = include_str!("../../README.md");
        let mut checked = 0;
        for line in help
            .iter()
            .flat_map(|h| h.lines())
            .chain(top.lines())
            .chain(readme.lines())
        {
            let Some(args) = example_args(line) else {
                continue;
            };
            if let Err(e) = Cli::try_parse_from(&args) {
                panic!("{line:?} does not parse: {e}");
            }
            checked += 1;
        }
        assert!(checked >= 25, "only {checked} examples found");
    }

    #[test]
    fn str_requests_name_a_probe_an_argument_and_a_length() {
        let parse = |text: &str| parse_string_request(text);
        let request = |provider: &str, name: &str, arg: u8, max_len: u16| StringRequest {
            text: String::new(),
            provider: provider.into(),
            name: name.into(),
            arg,
            max_len,
        };
        let ok = |text: &str| StringRequest {
            text: String::new(),
            ..parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
        };
        assert_eq!(ok("arg0"), request("*", "*", 0, 64));
        assert_eq!(ok("arg11:4096"), request("*", "*", 11, 4096));
        assert_eq!(ok("query__start:arg0"), request("*", "query__start", 0, 64));
        assert_eq!(
            ok("postgresql:query__*:arg2:1"),
            request("postgresql", "query__*", 2, 1)
        );
        assert_eq!(parse("arg0").unwrap().text, "arg0", "kept for errors");
        // A probe named like an argument is still a probe when an argument follows.
        assert_eq!(ok("arg1:arg0"), request("*", "arg1", 0, 64));
        for bad in [
            "",
            "0",
            "query__start:0",
            "query__start",
            "arg",
            "argx",
            "a:b:c:arg0",
            ":arg0",
            "p::arg0",
            "arg0:x",
            "arg0:-1",
        ] {
            assert_eq!(
                parse(bad).unwrap_err(),
                ConfigError::StrSyntax(bad.into()),
                "{bad:?}"
            );
        }
        for bad in ["arg12", "n:arg300", "arg99999999999"] {
            assert_eq!(
                parse(bad).unwrap_err(),
                ConfigError::StrArgument(bad.into())
            );
        }
        for bad in ["arg0:0", "arg0:4097", "n:arg1:70000"] {
            assert_eq!(parse(bad).unwrap_err(), ConfigError::StrLength(bad.into()));
        }
        let trace = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["tracer", "trace"], args].concat()).unwrap();
            let Command::Trace(args) = cli.command else {
                panic!("not trace")
            };
            TraceConfig::try_from(args)
        };
        let config = trace(&["--str", "arg0", "--str", "n:arg1:8", "usdt:./a:p:n"]).unwrap();
        assert_eq!(
            config
                .strings
                .iter()
                .map(|r| (r.name.as_str(), r.arg, r.max_len))
                .collect::<Vec<_>>(),
            [("*", 0, 64), ("n", 1, 8)]
        );
        assert_eq!(
            trace(&["--count", "--str", "arg0", "usdt:./a:p:n"]).unwrap_err(),
            ConfigError::StrWithCount
        );
        assert_eq!(
            trace(&["--str", "arg0:0", "usdt:./a:p:n"])
                .unwrap_err()
                .to_string(),
            "invalid --str \"arg0:0\": the length must be 1 to 4096 bytes"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("100us").unwrap(), Duration::from_micros(100));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        for bad in ["", "s", "10x", "-1s", "1.2.3s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ring_buffer_sizes() {
        assert_eq!(parse_buffer_size("ring-buffer", "4M").unwrap(), 4 << 20);
        assert_eq!(parse_buffer_size("ring-buffer", "65536").unwrap(), 65536);
        assert_eq!(
            parse_buffer_size("ring-buffer", "100K").unwrap(),
            128 << 10,
            "rounded up"
        );
        for bad in ["", "1K", "2G", "M", "-4M", "4X"] {
            assert!(parse_buffer_size("ring-buffer", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn latencies() {
        let l = parse_latency("julia:gc__begin,julia:gc__end").unwrap();
        assert_eq!(
            (l.begin.to_string(), l.end.to_string()),
            ("julia:gc__begin".into(), "julia:gc__end".into())
        );
        let l = parse_latency("uprobe:/lib/x.so:f,uretprobe:/lib/x.so:f").unwrap();
        let LatencyProbe::Function(begin) = &l.begin else {
            panic!("{l:?}")
        };
        assert_eq!(begin.kind, crate::probe::usdt::ProbeKind::Uprobe);
        assert_eq!(l.end.to_string(), "uretprobe:/lib/x.so:f");
        // Any mix, of providers too.
        let l = parse_latency("python:gc__start,uretprobe:/x:f").unwrap();
        assert!(matches!(l.begin, LatencyProbe::Usdt { .. }));
        assert!(parse_latency("a:b,c:d").is_ok());
        for bad in ["a:b", "a:b,", ":b,:c", "ab,cd", "a:b,uretprobe:/x:f+4"] {
            assert!(parse_latency(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn attach_config_validates() {
        let cli = Cli::try_parse_from(["tracer", "attach", "--pid", "0"]).unwrap();
        let Command::Attach(args) = cli.command else {
            panic!("not attach")
        };
        assert_eq!(
            AttachConfig::try_from(args).unwrap_err(),
            ConfigError::ZeroPid
        );
        let cli = Cli::try_parse_from(["tracer", "attach", "-p", "42", "-d", "3s"]).unwrap();
        let Command::Attach(args) = cli.command else {
            panic!("not attach")
        };
        let config = AttachConfig::try_from(args).unwrap();
        assert_eq!(config.duration, Some(Duration::from_secs(3)));
        assert_eq!(config.output_dir, PathBuf::from("tracer-42"));
    }

    fn profile_config(args: &[&str]) -> Result<ProfileConfig, ConfigError> {
        let cli = Cli::try_parse_from([&["tracer", "profile"], args].concat()).unwrap();
        let Command::Profile(args) = cli.command else {
            panic!("not profile")
        };
        ProfileConfig::try_from(args)
    }

    #[test]
    fn profile_config_validates() {
        let config = profile_config(&[]).unwrap();
        assert!(config.targets.is_everything());
        assert_eq!(config.sampling.frequency_hz, 99);
        assert_eq!(config.output_dir, PathBuf::from("tracer-profile"));
        let config = profile_config(&["-p", "7", "-F", "499", "-d", "2s", "--per-thread"]).unwrap();
        assert_eq!(config.targets.single_pid(), Some(7));
        assert_eq!(config.sampling.frequency_hz, 499);
        assert_eq!(config.duration, Some(Duration::from_secs(2)));
        assert!(config.per_thread);
        assert_eq!(config.output_dir, PathBuf::from("tracer-profile-7"));
        assert_eq!(
            profile_config(&["--frequency", "0"]).unwrap_err(),
            ConfigError::Frequency(0)
        );
        assert_eq!(
            profile_config(&["--pid", "0"]).unwrap_err(),
            ConfigError::ZeroPid
        );
        assert!(profile_config(&["--min-block", "x"]).is_err());
    }

    #[test]
    fn stacks_are_unwound_with_call_frame_information_unless_told() {
        assert_eq!(
            profile_config(&[]).unwrap().sampling.unwind,
            UnwindMethod::Dwarf
        );
        let fp = profile_config(&["--unwind", "fp"]).unwrap();
        assert_eq!(fp.sampling.unwind, UnwindMethod::Fp);
        assert!(Cli::try_parse_from(["tracer", "profile", "--unwind", "lbr"]).is_err());
        let attach = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["tracer", "attach", "-p", "7"], args].concat());
            let Command::Attach(args) = cli.unwrap().command else {
                panic!("not attach")
            };
            AttachConfig::try_from(args)
        };
        let config = attach(&[]).unwrap();
        assert_eq!(config.sampling.unwind, UnwindMethod::Dwarf);
        assert_eq!(config.sampling.frequency_hz, 99);
        let config = attach(&["--unwind", "fp", "-F", "199"]).unwrap();
        assert_eq!(config.sampling.unwind, UnwindMethod::Fp);
        assert_eq!(config.sampling.frequency_hz, 199);
        assert_eq!(attach(&["-F", "0"]).unwrap_err(), ConfigError::Frequency(0));
    }

    #[test]
    fn map_sizes_default_to_the_objects_and_are_bounded() {
        let config = profile_config(&[]).unwrap();
        assert_eq!(config.map_sizes, MapSizes::default());
        assert_eq!(config.sampling.unwind_buffer_bytes, 8 << 20);
        let config = profile_config(&["--stack-map-size", "1000", "--map-size", "300000"]).unwrap();
        assert_eq!(config.map_sizes.stacks, Some(1000));
        assert_eq!(config.map_sizes.entries, Some(300000));
        assert_eq!(
            profile_config(&["--map-size", "0"]).unwrap_err(),
            ConfigError::MapSize("map-size", 0, MAX_MAP_ENTRIES)
        );
        assert!(profile_config(&["--stack-map-size", "16777217"]).is_err());
        // Stack map ids stay below the ids of kernel stacks taken at switch in.
        assert!(profile_config(&["--stack-map-size", "8388608"]).is_ok());
        assert!(profile_config(&["--stack-map-size", "8388609"]).is_err());
        assert!(profile_config(&["--unwind-buffer", "1K"]).is_err());
    }

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

    #[test]
    fn targets_add_up_and_children_need_parents() {
        let cli = Cli::try_parse_from([
            "tracer",
            "attach",
            "-p",
            "7",
            "--pid",
            "8",
            "-p",
            "7",
            "--children",
            "--exe",
            "/bin/x",
            "--comm",
            "postgres",
            "--cgroup",
            "/sys/fs/cgroup/a",
        ])
        .unwrap();
        let Command::Attach(args) = cli.command else {
            panic!("not attach")
        };
        let config = AttachConfig::try_from(args).unwrap();
        let t = &config.targets;
        assert_eq!(t.pids.iter().map(|p| p.get()).collect::<Vec<_>>(), [7, 8]);
        assert!(t.children && t.can_grow() && t.single_pid().is_none());
        assert_eq!(t.comm.as_deref(), Some("postgres"));
        assert_eq!(config.output_dir, PathBuf::from("tracer-postgres"));
        let attach = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["tracer", "attach"], args].concat()).unwrap();
            let Command::Attach(args) = cli.command else {
                panic!("not attach")
            };
            AttachConfig::try_from(args)
        };
        assert_eq!(attach(&[]).unwrap_err(), ConfigError::NoTarget);
        assert_eq!(
            attach(&["--children"]).unwrap_err(),
            ConfigError::ChildrenOfNothing
        );
        assert_eq!(attach(&["--comm", ""]).unwrap_err(), ConfigError::EmptyComm);
        let config = attach(&["-p", "9"]).unwrap();
        assert_eq!(config.targets.single_pid(), Some(9));
        assert_eq!(config.output_dir, PathBuf::from("tracer-9"));
        let trace = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["tracer", "trace"], args].concat()).unwrap();
            let Command::Trace(args) = cli.command else {
                panic!("not trace")
            };
            TraceConfig::try_from(args)
        };
        let config = trace(&["--children", "usdt:./a:p:n", "--", "./a"]).unwrap();
        assert!(config.targets.children && config.targets.pids.is_empty());
        assert_eq!(
            trace(&["--exe", "/bin/x", "usdt:./a:p:n", "--", "./a"]).unwrap_err(),
            ConfigError::MatchAndCommand
        );
        // The hold stops one process: never a set, whose loader the whole machine shares.
        assert!(
            trace(&["--hold-at-dlopen", "-p", "9", "usdt:*:p:n"])
                .unwrap()
                .hold_at_dlopen
        );
        assert!(trace(&["--hold-at-dlopen", "usdt:./a:p:n", "--", "./a"]).is_ok());
        for set in [
            &["--hold-at-dlopen", "--comm", "x", "usdt:*:p:n"][..],
            &["--hold-at-dlopen", "-p", "9", "--children", "usdt:*:p:n"],
            &[
                "--hold-at-dlopen",
                "--children",
                "usdt:./a:p:n",
                "--",
                "./a",
            ],
            &["--hold-at-dlopen", "usdt:./a:p:n"],
        ] {
            assert_eq!(
                trace(set).unwrap_err(),
                ConfigError::HoldNeedsOneProcess,
                "{set:?}"
            );
        }
        assert!(
            attach(&["--hold-at-dlopen", "-p", "9"])
                .unwrap()
                .hold_at_dlopen
        );
        assert!(!attach(&["-p", "9"]).unwrap().hold_at_dlopen);
        assert_eq!(
            attach(&["--hold-at-dlopen", "--exe", "/bin/x"]).unwrap_err(),
            ConfigError::HoldNeedsOneProcess
        );
    }

    #[test]
    fn trace_takes_probes_and_a_command() {
        let cli =
            Cli::try_parse_from(["tracer", "trace", "usdt:./a:p:n", "--", "./a", "-x"]).unwrap();
        let Command::Trace(args) = cli.command else {
            panic!()
        };
        let config = TraceConfig::try_from(args).unwrap();
        assert_eq!(config.probes, ["usdt:./a:p:n"]);
        assert_eq!(config.command.unwrap(), ["./a", "-x"]);
        let cli =
            Cli::try_parse_from(["tracer", "trace", "-p", "1", "usdt:*:p:n", "--", "ls"]).unwrap();
        let Command::Trace(args) = cli.command else {
            panic!()
        };
        assert_eq!(
            TraceConfig::try_from(args).unwrap_err(),
            ConfigError::PidAndCommand
        );
        assert!(
            Cli::try_parse_from(["tracer", "trace"]).is_err(),
            "a probe is required"
        );
    }

    /// `--stack` walks frame pointers unless told otherwise; `--unwind` and `-o` only
    /// mean something with the stacks (and `-o` with their counts).
    #[test]
    fn trace_stack_options() {
        let config = |args: &[&str]| {
            let mut all = vec!["tracer", "trace", "usdt:./a:p:n"];
            all.extend_from_slice(args);
            let Command::Trace(args) = Cli::try_parse_from(all)?.command else {
                panic!()
            };
            Ok::<_, clap::Error>(TraceConfig::try_from(args).unwrap())
        };
        let fp = config(&["--stack"]).unwrap();
        assert!(fp.stack && fp.unwind == UnwindMethod::Fp);
        assert_eq!(fp.output_dir, PathBuf::from("tracer-trace"));
        let dwarf = config(&["--stack", "--unwind", "dwarf", "-c", "-o", "d"]).unwrap();
        assert!(dwarf.count && dwarf.unwind == UnwindMethod::Dwarf);
        assert_eq!(dwarf.output_dir, PathBuf::from("d"));
        assert!(!config(&[]).unwrap().stack);
        assert!(config(&["--unwind", "dwarf"]).is_err());
        assert!(config(&["--stack", "-o", "d"]).is_err());
        assert!(config(&["--count", "-o", "d"]).is_err());
    }
}
