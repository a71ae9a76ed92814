//! `tracer trace`: its raw arguments and its validated config.
//! The parser of its `--str` requests is here too.

use std::{path::PathBuf, time::Duration};

use clap::Args;

use super::parse::{parse_buffer_size, parse_duration};
use super::{ConfigError, Format, TargetArgs};
use crate::profile::sampling::UnwindMethod;
use crate::{probe::plan::StringRequest, target::TargetSpec};
use tracer_common::{DEFAULT_STR_LEN, MAX_STR_LEN, MAX_USDT_ARGS};

#[derive(Debug, Args)]
pub(crate) struct TraceArgs {
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

/// `tracer trace`, validated.
#[derive(Debug, Clone)]
pub(crate) struct TraceConfig {
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
            duration: args
                .duration
                .as_deref()
                .map(|text| parse_duration("duration", text))
                .transpose()?,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser as _;

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
