//! `tracer attach`: its raw arguments and its validated config.
//! The latencies it measures (`--latency`) and its timeline (`--timeline`) are here too.

use std::{path::PathBuf, time::Duration};

use clap::Args;

use super::parse::parse_duration;
use super::{
    ConfigError, Format, MapSizeArgs, MetricsArgs, MetricsConfig, SamplingArgs, TargetArgs,
    map_sizes,
};
use crate::profile::sampling::Sampling;
use crate::{kernel::MapSizes, profile::wallclock::GroupBy, target::TargetSpec};

#[derive(Debug, Args)]
pub(crate) struct AttachArgs {
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
    /// Which processes share a tower in the flame graphs: `process` (one each, rooted
    /// at `name [pid]`) or `name` (every process running the same program, rooted at its
    /// name: eight PostgreSQL backends make one tower).
    #[arg(long, value_enum, default_value_t = GroupBy::Process, value_name = "BY")]
    pub group_by: GroupBy,
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
    #[command(flatten)]
    pub metrics: MetricsArgs,
    /// Also write the wall-clock profile of every window of this length (e.g. 1m) into
    /// the output directory while tracing: pprof (samples labelled process and pid) and
    /// folded stacks, named by the window's start (wallclock-20261205T083000Z.pb.gz).
    #[arg(long, value_name = "DURATION")]
    pub profile_every: Option<String>,
    /// With --profile-every: how many windows' files to keep; the oldest go [default: 60].
    #[arg(long, value_name = "N", requires = "profile_every")]
    pub keep: Option<usize>,
    /// Of a set of processes: how many exited ones keep their own tower (`name [pid]`),
    /// threads and latency rows in the report. Older ones are folded into their
    /// program's, and all they left is freed: a run can last for weeks in bounded memory.
    #[arg(long, value_name = "N", default_value_t = crate::profile::retire::DEFAULT_KEEP_EXITED)]
    pub keep_exited: usize,
    /// Report format on standard output.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub maps: MapSizeArgs,
}

/// `--profile-every` and `--keep`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RollingConfig {
    pub every: Duration,
    pub keep: usize,
}

impl RollingConfig {
    /// Windows kept without `--keep`.
    pub(crate) const DEFAULT_KEEP: usize = 60;

    fn parse(every: Option<&str>, keep: Option<usize>) -> Result<Option<Self>, ConfigError> {
        let Some(every) = every else {
            return Ok(None);
        };
        let window = parse_duration("profile-every", every)?;
        if window < Duration::from_secs(1) {
            return Err(ConfigError::ProfileEvery(every.to_string()));
        }
        let keep = keep.unwrap_or(Self::DEFAULT_KEEP);
        if keep == 0 {
            return Err(ConfigError::KeepNothing);
        }
        Ok(Some(Self {
            every: window,
            keep,
        }))
    }
}

/// A latency asked for on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LatencyRequest {
    pub begin: LatencyProbe,
    pub end: LatencyProbe,
}

/// One end of a latency asked for: a USDT probe by provider and name, or a function's
/// entry or return (resolved to its symbol in the targets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LatencyProbe {
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
pub(crate) struct AttachConfig {
    pub targets: TargetSpec,
    pub duration: Option<Duration>,
    pub output_dir: PathBuf,
    pub min_block: Duration,
    pub latencies: Vec<LatencyRequest>,
    pub per_thread: bool,
    pub group_by: GroupBy,
    /// `--timeline FILE` and `--timeline-min-block`.
    pub timeline: Option<TimelineConfig>,
    pub format: Format,
    pub sampling: Sampling,
    pub map_sizes: MapSizes,
    /// `--hold-at-dlopen`.
    pub hold_at_dlopen: bool,
    /// `--metrics ADDR`.
    pub metrics: Option<MetricsConfig>,
    /// `--profile-every`.
    pub rolling: Option<RollingConfig>,
    /// `--keep-exited`.
    pub keep_exited: usize,
}

/// Where the timeline goes, and the shortest off-CPU interval it shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TimelineConfig {
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
            duration: args
                .duration
                .as_deref()
                .map(|text| parse_duration("duration", text))
                .transpose()?,
            output_dir: args
                .output
                .unwrap_or_else(|| PathBuf::from(format!("tracer-{}", targets.short_name()))),
            targets,
            min_block: parse_duration("min-block", &args.min_block)?,
            latencies: args
                .latencies
                .iter()
                .map(|l| parse_latency(l))
                .collect::<Result<_, _>>()?,
            per_thread: args.per_thread,
            group_by: args.group_by,
            timeline: match args.timeline {
                Some(path) => Some(TimelineConfig {
                    path,
                    min_block: parse_duration("timeline-min-block", &args.timeline_min_block)?,
                }),
                None => None,
            },
            format: args.format,
            sampling: Sampling::try_from(&args.sampling)?,
            map_sizes: map_sizes(&args.maps)?,
            rolling: RollingConfig::parse(args.profile_every.as_deref(), args.keep)?,
            metrics: MetricsConfig::from_args(args.metrics),
            keep_exited: args.keep_exited,
        })
    }
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
    use crate::cli::{Cli, Command};
    use clap::Parser as _;

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
}
