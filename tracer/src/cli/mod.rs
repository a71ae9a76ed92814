//! Command-line parsing in two steps: clap's raw arguments, then a validated config the
//! rest of the program uses (typed pid, durations, output format).
//!
//! This file holds the parser: [`Cli`] and its [`Command`]s.
//! It holds the arguments several commands share: targets, sampling and map sizes.
//! It holds [`ConfigError`], the error of every validation.
//! The hidden `generate` command's arguments are here too.
//! Each other command's raw arguments and validated config are in a file named after it.
//! The value parsers several commands share are in `parse.rs`.

mod attach;
mod list;
mod parse;
mod profile;
mod stacks;
mod trace;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use thiserror::Error;

use crate::profile::sampling::{Sampling, UnwindMethod};
use crate::{kernel::MapSizes, target::TargetSpec};
use parse::nonzero_pid;
use tracer_common::{MAX_STR_LEN, MAX_USDT_ARGS};

pub(crate) use attach::{AttachArgs, AttachConfig, LatencyProbe, RollingConfig};
pub(crate) use list::{ListArgs, ListConfig};
pub(crate) use parse::parse_buffer_size;
pub(crate) use profile::{ProfileArgs, ProfileConfig};
pub(crate) use stacks::{StacksArgs, StacksConfig};
pub(crate) use trace::{TraceArgs, TraceConfig};

#[derive(Debug, Parser)]
#[command(
    name = "tracer",
    version,
    about = "eBPF tracer and wall-clock profiler for language runtimes",
    after_help = "Examples:\n  sudo tracer attach --pid 4242 -d 30s -o profile/\n  sudo tracer profile --comm python3.11 -d 10s\n  sudo tracer stacks --pid 4242\n\nSee `man tracer-COMMAND` or `tracer COMMAND --help`."
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Show the eBPF programs' own diagnostics on standard error: each failed argument
    /// read, stack capture error and full map, with the probe, site and error. Off, the
    /// kernel drops the logging code: it costs nothing.
    #[arg(long, global = true)]
    pub bpf_debug: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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

/// Examples each command's `--help` ends with (these, and those of the README and docs/,
/// are checked to parse).
pub(crate) const ATTACH_EXAMPLES: &str = "Examples:
  sudo tracer attach --pid 4242 --duration 30s -o profile/
  sudo tracer attach --exe /usr/lib/postgresql/15/bin/postgres --format json
  sudo tracer attach --pid 5211 --children --latency postgresql:transaction__start,postgresql:transaction__commit";
pub(crate) const LIST_EXAMPLES: &str = "Examples:
  tracer list /usr/bin/python3.11
  sudo tracer list --pid 4242 'hotspot:gc__*'
  tracer list 'usdt:/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so:*:thread__*'";
pub(crate) const TRACE_EXAMPLES: &str = "Examples:
  sudo tracer trace --pid 4242 'usdt:*:python:gc__*'
  sudo tracer trace --count --stack --pid 4242 'usdt:/usr/bin/python3.11:python:gc__start'
  sudo tracer trace --count 'usdt:*:python:gc__start' -- python3.11 app.py";
pub(crate) const PROFILE_EXAMPLES: &str = "Examples:
  sudo tracer profile --pid 4242 -d 10s -o prof/
  sudo tracer profile --comm python3.11 --per-thread
  sudo tracer profile --comm postgres --group-by name -d 30s
  sudo tracer profile -F 499 -d 5s";
pub(crate) const STACKS_EXAMPLES: &str = "Examples:
  sudo tracer stacks --pid 4242
  sudo tracer stacks --pid 4242 --format json";

/// What `tracer generate` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Generated {
    /// `tracer.1` and one page per command (`tracer-attach.1`, ...).
    Man,
    /// `tracer.bash`, `_tracer` (zsh) and `tracer.fish`.
    Completions,
}

#[derive(Debug, Args)]
pub(crate) struct GenerateArgs {
    /// What to write.
    #[arg(value_enum)]
    pub what: Generated,
    /// The directory to write into (created if needed).
    pub dir: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    Text,
    Json,
}

/// Which processes to trace, the same for every command that traces processes. The
/// options add up: `--pid 1 --pid 2 --exe /usr/bin/x` traces all of them.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct TargetArgs {
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
pub(crate) struct SamplingArgs {
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
    /// `auto`: 4 MiB per CPU for the processes named, 16 MiB per CPU for every process,
    /// from 8 MiB to 128 MiB. The report says how many stacks found it full.
    #[arg(long, default_value = "auto", value_name = "SIZE")]
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
            unwind_buffer_bytes: match args.unwind_buffer.trim() {
                "auto" => None,
                size => Some(parse_buffer_size("unwind-buffer", size)?),
            },
            python_frames: !args.no_python_frames,
            jit_symbols: !args.no_jit_symbols,
        })
    }
}

/// The highest sampling frequency accepted (the kernel's own default limit,
/// `kernel.perf_event_max_sample_rate`, is 100000 and it lowers it under load).
pub(crate) const MAX_FREQUENCY_HZ: u64 = 100_000;

/// Sizes of the kernel's aggregation maps: what fills them is counted and reported as
/// lost, so a run that reports losses can be repeated with larger maps.
#[derive(Debug, Clone, Args)]
pub(crate) struct MapSizeArgs {
    /// Distinct stacks the kernel can keep (user and kernel stacks count separately)
    /// [default: 32768].
    #[arg(long, value_name = "N")]
    pub stack_map_size: Option<u32>,
    /// Entries of each kernel hash map: threads off CPU at once, and distinct
    /// (thread, stacks) keys of the profile [default: 65536].
    #[arg(long, value_name = "N")]
    pub map_size: Option<u32>,
}

/// The most entries a map may be given.
pub(crate) const MAX_MAP_ENTRIES: u32 = 1 << 24;

/// The most entries the stack map may be given: its ids must stay in their range
/// (`tracer_common::stack_id::STACK_MAP_IDS`).
pub(crate) const MAX_STACK_MAP_ENTRIES: u32 = tracer_common::stack_id::STACK_MAP_IDS.end as u32;

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

/// `--metrics ADDR` and `--metrics-labels`, of `attach` and `profile`.
#[derive(Debug, clap::Args)]
pub(crate) struct MetricsArgs {
    /// Serve Prometheus metrics at http://ADDR/metrics while tracing (127.0.0.1:9464,
    /// or :9464 for every address): time on and off CPU per process, the events lost,
    /// and with attach the latency histograms (GC pauses, --latency).
    #[arg(long = "metrics", value_name = "ADDR")]
    pub addr: Option<String>,
    /// Labels added to the per-process series of --metrics: `pid` (PIDs churn, and
    /// Prometheus keeps each series apart).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        requires = "addr",
        value_name = "LABELS"
    )]
    pub metrics_labels: Vec<MetricLabel>,
}

/// A label `--metrics-labels` can add.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum MetricLabel {
    Pid,
}

/// `--metrics ADDR` and its labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MetricsConfig {
    pub addr: String,
    pub labels: MetricLabels,
}

impl MetricsConfig {
    pub(super) fn from_args(args: MetricsArgs) -> Option<Self> {
        let addr = args.addr?;
        Some(Self {
            addr,
            labels: MetricLabels {
                pid: args.metrics_labels.contains(&MetricLabel::Pid),
            },
        })
    }
}

/// Which optional labels the per-process series carry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MetricLabels {
    pub pid: bool,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub(crate) enum ConfigError {
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
    #[error("invalid --{0} {1:?}: expected a number with a unit, like 10s, 500ms, 2m or 100us")]
    Duration(&'static str, String),
    #[error("invalid --profile-every {0:?}: expected a window of at least 1s, like 1m")]
    ProfileEvery(String),
    #[error("invalid --keep 0: keep at least one window")]
    KeepNothing,
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;
    use std::path::Path;

    use crate::output::markdown::slug;

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

    /// The documentation, by path from the workspace root: the README, CONTRIBUTING.md and
    /// every page under `docs/` (a test checks that none is missing here).
    const DOCS: [(&str, &str); 16] = [
        ("README.md", include_str!("../../../README.md")),
        ("CONTRIBUTING.md", include_str!("../../../CONTRIBUTING.md")),
        ("docs/README.md", include_str!("../../../docs/README.md")),
        ("docs/attach.md", include_str!("../../../docs/attach.md")),
        ("docs/trace.md", include_str!("../../../docs/trace.md")),
        ("docs/list.md", include_str!("../../../docs/list.md")),
        ("docs/profile.md", include_str!("../../../docs/profile.md")),
        ("docs/stacks.md", include_str!("../../../docs/stacks.md")),
        ("docs/targets.md", include_str!("../../../docs/targets.md")),
        ("docs/frames.md", include_str!("../../../docs/frames.md")),
        ("docs/json.md", include_str!("../../../docs/json.md")),
        ("docs/metrics.md", include_str!("../../../docs/metrics.md")),
        (
            "docs/requirements.md",
            include_str!("../../../docs/requirements.md"),
        ),
        (
            "docs/containers-and-ci.md",
            include_str!("../../../docs/containers-and-ci.md"),
        ),
        (
            "docs/how-it-works.md",
            include_str!("../../../docs/how-it-works.md"),
        ),
        (
            "docs/building.md",
            include_str!("../../../docs/building.md"),
        ),
    ];

    /// The tracer command lines of the deployment examples: the systemd unit's
    /// `ExecStart` and the DaemonSet's `args`, each as clap gets it.
    fn deployment_command_lines() -> Vec<Vec<String>> {
        let unit = include_str!("../../../docs/deploy/tracer.service");
        let exec = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .expect("the unit has an ExecStart");
        let mut unit_args = shell_words(exec);
        unit_args[0] = "tracer".into();
        let daemonset = include_str!("../../../docs/deploy/tracer-daemonset.yaml");
        let mut daemonset_args = vec!["tracer".to_string()];
        let mut in_args = false;
        for line in daemonset.lines() {
            let item = line.trim_start().strip_prefix("- ");
            match (in_args, item) {
                (false, _) => in_args = line.trim() == "args:",
                (true, Some(arg)) => daemonset_args.push(arg.trim_matches('"').to_string()),
                (true, None) => break,
            }
        }
        vec![unit_args, daemonset_args]
    }

    #[test]
    fn the_deployment_examples_run_valid_command_lines() {
        for args in deployment_command_lines() {
            assert!(args.len() > 4, "{args:?}");
            let cli = Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            let Command::Attach(attach) = cli.command else {
                panic!("{args:?} is not attach");
            };
            let config = AttachConfig::try_from(attach).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert!(
                config.metrics.is_some() && config.rolling.is_some(),
                "{args:?}"
            );
        }
    }

    /// The workspace root, where the paths of [`DOCS`] start.
    fn workspace_root() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("tracer is inside the workspace")
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
            .map(std::string::ToString::to_string)
            .unwrap_or_default();
        // The README and the pages under docs/ (CONTRIBUTING.md shows no tracer command).
        let docs = DOCS
            .iter()
            .filter(|(path, _)| *path == "README.md" || path.starts_with("docs/"));
        let mut checked = 0;
        for line in help
            .iter()
            .flat_map(|h| h.lines())
            .chain(top.lines())
            .chain(docs.flat_map(|(_, text)| text.lines()))
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

    /// The lines of a markdown text outside fenced code blocks.
    fn prose_lines(text: &str) -> impl Iterator<Item = &str> {
        let mut fenced = false;
        text.lines().filter(move |line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
    }

    /// The targets of the relative links of a markdown text (`[text](target)` and images),
    /// outside code blocks and code spans; links with a scheme (`https:`) are left out.
    fn relative_links(text: &str) -> Vec<String> {
        let mut links = Vec::new();
        for line in prose_lines(text) {
            let mut in_code = false;
            let outside_code: String = line
                .chars()
                .filter(|&c| {
                    if c == '`' {
                        in_code = !in_code;
                    }
                    !in_code && c != '`'
                })
                .collect();
            let mut rest = outside_code.as_str();
            while let Some(at) = rest.find("](") {
                rest = &rest[at + 2..];
                let target = rest.split(')').next().unwrap_or_default().trim();
                if !target.contains("://") && !target.starts_with("mailto:") {
                    links.push(target.to_string());
                }
            }
        }
        links
    }

    /// The anchors of a markdown text's headings, as GitHub makes them (a repeated one
    /// gets `-1`, `-2`...).
    fn anchors(text: &str) -> Vec<String> {
        let mut seen = std::collections::HashMap::new();
        let mut anchors = Vec::new();
        for line in prose_lines(text) {
            let level = line.chars().take_while(|&c| c == '#').count();
            let Some(heading) = line[level..].strip_prefix(' ') else {
                continue;
            };
            if !(1..=6).contains(&level) {
                continue;
            }
            let slug = slug(heading);
            let times: &mut usize = seen.entry(slug.clone()).or_default();
            anchors.push(match *times {
                0 => slug,
                n => format!("{slug}-{n}"),
            });
            *times += 1;
        }
        anchors
    }

    /// `path` without `.` and with each `..` taking the component before it away.
    fn normalized(path: &Path) -> PathBuf {
        let mut out = PathBuf::new();
        for part in path.components() {
            match part {
                std::path::Component::CurDir => {}
                std::path::Component::ParentDir => {
                    out.pop();
                }
                part => out.push(part),
            }
        }
        out
    }

    #[test]
    fn slugs_are_githubs() {
        assert_eq!(
            slug("A timeline (`--timeline FILE`)"),
            "a-timeline---timeline-file"
        );
        assert_eq!(slug("Every task's wall time"), "every-tasks-wall-time");
        assert_eq!(
            slug("How it works, and what it costs"),
            "how-it-works-and-what-it-costs"
        );
        assert_eq!(
            anchors("# a\n```\n# not a heading\n```\n## a\n#no\n"),
            ["a", "a-1"]
        );
        assert_eq!(
            relative_links("[x](a.md#b) `[y](code.md)` [z](https://e.org) ![i](p.svg)"),
            ["a.md#b", "p.svg"]
        );
    }

    #[test]
    fn every_relative_link_in_the_docs_resolves() {
        let root = workspace_root();
        let mut listed: Vec<PathBuf> = DOCS.iter().map(|(path, _)| PathBuf::from(path)).collect();
        listed.sort();
        let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
            .expect("docs/ is there")
            .map(|entry| entry.expect("docs/ can be read").path())
            .filter(|path| path.extension().is_some_and(|e| e == "md"))
            .map(|path| {
                path.strip_prefix(root)
                    .expect("under the root")
                    .to_path_buf()
            })
            .chain(["README.md", "CONTRIBUTING.md"].map(PathBuf::from))
            .collect();
        pages.sort();
        assert_eq!(
            listed, pages,
            "every page of docs/ needs its include_str! in DOCS"
        );

        let mut broken = Vec::new();
        let mut checked = 0;
        for (page, text) in DOCS {
            let dir = Path::new(page).parent().expect("a file has a parent");
            for link in relative_links(text) {
                checked += 1;
                let (file, anchor) = link.split_once('#').unwrap_or((link.as_str(), ""));
                let target = match file {
                    "" => PathBuf::from(page),
                    file => normalized(&dir.join(file)),
                };
                if !root.join(&target).exists() {
                    broken.push(format!("{page}: {link}: no file {}", target.display()));
                    continue;
                }
                if anchor.is_empty() {
                    continue;
                }
                let Some((_, target_text)) =
                    DOCS.iter().find(|(p, _)| Path::new(p) == target.as_path())
                else {
                    broken.push(format!(
                        "{page}: {link}: an anchor into a file that is not a page"
                    ));
                    continue;
                };
                if !anchors(target_text).iter().any(|a| a == anchor) {
                    broken.push(format!(
                        "{page}: {link}: no heading #{anchor} in {}",
                        target.display()
                    ));
                }
            }
        }
        assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
        assert!(checked >= 50, "only {checked} links found");
    }

    /// `tracer profile ARGS`, validated (the tests in `profile.rs` use it too).
    pub(super) fn profile_config(args: &[&str]) -> Result<ProfileConfig, ConfigError> {
        let cli = Cli::try_parse_from([&["tracer", "profile"], args].concat()).unwrap();
        let Command::Profile(args) = cli.command else {
            panic!("not profile")
        };
        ProfileConfig::try_from(args)
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
        assert_eq!(config.sampling.unwind_buffer_bytes, None);
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
        let config = profile_config(&["--unwind-buffer", "16M"]).unwrap();
        assert_eq!(config.sampling.unwind_buffer_bytes, Some(16 << 20));
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
}
