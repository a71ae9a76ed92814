//! `cargo xtask bench`: the six figures of issue 6, each next to its baseline measured in
//! the same run, as medians of alternating runs (the machines this runs on are noisy).
//!
//! 1. A disabled `probes` probe against no probe at all: `bench-usdt-loop
//!    --compare-disabled` times a loop of N iterations with and without `probes::gc_begin`
//!    (alternating, in one process); the figure is the median per-iteration difference.
//! 2. Cost per traced USDT event: `bench-usdt-loop` fires `tracer:gc__begin` N times in a
//!    tight loop, timed with `clock_gettime`, after waiting (SIGUSR1) until the tool has
//!    attached; ns/event = (traced time - untraced time) / N, and the tool's count must be
//!    exactly N. Tools: `tracer trace --count`, bpftrace `@ = count()`, bpftrace with an
//!    empty action (trap + a do-nothing eBPF program), and `bench-uprobe-count` (counting
//!    perf uprobes, no eBPF at all). The bare trap is the cheaper of the last two (the
//!    kernel's perf path for a uprobe costs more than running a tiny eBPF program).
//! 3. Throughput loss of `pingpong` (two threads, one byte through two pipes, N round
//!    trips) under `tracer attach --pid` (off-CPU with user+kernel stacks), under a bpftrace
//!    `sched_switch` script doing the same accounting, and BCC's offcputime (when it runs).
//! 4. Launch to first event: t0 = CLOCK_MONOTONIC just before spawning the tool; the
//!    target fires `tracer:gc__begin` every 100 µs; the figure is the first event's
//!    timestamp (bpf_ktime_get_ns, the same clock) minus t0: for `tracer attach` the
//!    earliest `first_hit_monotonic_ns` of its JSON report, for `tracer trace` the first
//!    event's `time_ns`, for bpftrace the `nsecs` its first event prints.
//! 5. Symbolize + fold + render a profile of 1M blocked intervals over many distinct
//!    stacks through the tracer library, against inferno alone rendering the same folded
//!    stacks (`bench-render`, which links both).
//! 6. Peak RSS (wait4's ru_maxrss) of every tracer run of figures 2-4, against bpftrace's.
//!
//! Needs root. tracefs is mounted for bpftrace if it is not (and unmounted afterwards).

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc::{self, Receiver, RecvTimeoutError},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};

use crate::release_dir;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Fewer iterations, rounds and stacks: about a minute instead of a few.
    #[arg(long)]
    quick: bool,
    /// Rounds of alternating runs in figures 2-4 [default: 5; --quick: 3].
    #[arg(long)]
    rounds: Option<usize>,
    /// Only these figures (1-6, comma-separated); 6 uses the tracer runs of 2-4.
    #[arg(long, value_delimiter = ',')]
    only: Vec<u8>,
    /// Iterations of each disabled-probe loop, figure 1 [default: 200M; --quick: 50M].
    #[arg(long)]
    loop_iters: Option<u64>,
    /// Probe hits per traced run, figure 2 [default: 1M; --quick: 200k].
    #[arg(long)]
    events: Option<u64>,
    /// Ping-pong round trips per run, figure 3 [default: 100k; --quick: 30k].
    #[arg(long)]
    round_trips: Option<u64>,
    /// Blocked intervals in the rendered profile, figure 5 [default: 1M].
    #[arg(long)]
    render_samples: Option<u64>,
    /// Distinct (thread, user stack, kernel stack) keys in it [default: 200k; --quick: 50k].
    #[arg(long)]
    render_stacks: Option<u64>,
}

struct Config {
    rounds: usize,
    loop_iters: u64,
    loop_rounds: usize,
    events: u64,
    round_trips: u64,
    render_samples: u64,
    render_stacks: u64,
    render_rounds: usize,
    figures: Vec<u8>,
}

impl Config {
    fn new(args: BenchArgs) -> Result<Self> {
        let quick = args.quick;
        let pick = |value: Option<u64>, full: u64, fast: u64| {
            value.unwrap_or(if quick { fast } else { full })
        };
        let figures = if args.only.is_empty() {
            (1..=6).collect()
        } else {
            args.only
        };
        if let Some(bad) = figures.iter().find(|f| !(1..=6).contains(*f)) {
            bail!("no figure {bad}: figures are 1 to 6");
        }
        let rounds = args.rounds.unwrap_or(if quick { 3 } else { 5 });
        if rounds == 0 {
            bail!("--rounds must be at least 1");
        }
        Ok(Self {
            rounds,
            loop_iters: pick(args.loop_iters, 200_000_000, 50_000_000),
            loop_rounds: if quick { 7 } else { 11 },
            events: pick(args.events, 1_000_000, 200_000),
            round_trips: pick(args.round_trips, 100_000, 30_000),
            render_samples: pick(args.render_samples, 1_000_000, 1_000_000),
            render_stacks: pick(args.render_stacks, 200_000, 50_000),
            // One round is a single sample of a noisy machine, with the tracer always
            // first; three alternate the order and give a median, for a few seconds more.
            render_rounds: 3,
            figures,
        })
    }

    fn wants(&self, figure: u8) -> bool {
        self.figures.contains(&figure)
    }
}

/// One line of the final summary.
struct Row {
    figure: String,
    tracer: String,
    baselines: String,
    ratio: String,
    goal: String,
    met: String,
}

/// Peak RSS of the tools' runs, for figure 6.
#[derive(Default)]
struct Memory {
    /// (what ran, peak RSS in KiB)
    tracer: Vec<(String, u64)>,
    bpftrace: Vec<(String, u64)>,
}

impl Memory {
    fn note(&mut self, tool: &str, what: &str, rss_kib: u64) {
        let list = if tool == "tracer" {
            &mut self.tracer
        } else if tool == "bpftrace" {
            &mut self.bpftrace
        } else {
            return;
        };
        match list.iter_mut().find(|(w, _)| w == what) {
            Some((_, peak)) => *peak = (*peak).max(rss_kib),
            None => list.push((what.to_string(), rss_kib)),
        }
    }
}

pub fn run(args: BenchArgs) -> Result<()> {
    let config = Config::new(args)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { sys::geteuid() } != 0 {
        bail!("cargo xtask bench loads eBPF programs: run it as root");
    }
    crate::build()?;
    let needs_tracefs = [2, 3, 4].iter().any(|&f| config.wants(f));
    let _tracefs = if needs_tracefs {
        Some(TracefsMount::ensure()?)
    } else {
        None
    };
    let started = Instant::now();
    let load_before = load_average();
    println!("load average before: {load_before} (other work on the machine skews every figure)");
    let mut rows = Vec::new();
    let mut memory = Memory::default();
    let figures: [(u8, &str); 5] = [
        (1, "disabled probe vs no probe"),
        (2, "cost per traced USDT event"),
        (3, "off-CPU tracing of a ping-pong"),
        (4, "launch to first event"),
        (5, "symbolize + render a profile"),
    ];
    for (figure, title) in figures {
        if !config.wants(figure) {
            continue;
        }
        println!("\n== Figure {figure}: {title}");
        let result = match figure {
            1 => figure_disabled_probe(&config),
            2 => figure_event_cost(&config, &mut memory),
            3 => figure_offcpu(&config, &mut memory),
            4 => figure_launch(&config, &mut memory),
            _ => figure_render(&config),
        };
        match result {
            Ok(mut new_rows) => rows.append(&mut new_rows),
            Err(err) => {
                println!("figure {figure} failed: {err:#}");
                rows.push(Row {
                    figure: format!("{figure}. {title}"),
                    tracer: "failed".into(),
                    baselines: format!("{err:#}"),
                    ratio: "-".into(),
                    goal: "-".into(),
                    met: "?".into(),
                });
            }
        }
    }
    if config.wants(6) {
        println!("\n== Figure 6: peak memory while tracing");
        rows.push(figure_memory(&memory));
    }
    print_summary(&rows, started.elapsed());
    println!(
        "load average before: {load_before}; after: {}",
        load_average()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Figure 1

fn figure_disabled_probe(config: &Config) -> Result<Vec<Row>> {
    let n = config.loop_iters;
    let out = Command::new(bin("bench-usdt-loop"))
        .args(["--compare-disabled", "--iters", &n.to_string()])
        .args(["--rounds", &config.loop_rounds.to_string()])
        .output()
        .context("cannot run bench-usdt-loop")?;
    if !out.status.success() {
        bail!(
            "bench-usdt-loop failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let with = json_array(&text, "with_probe_ns")?;
    let without = json_array(&text, "without_probe_ns")?;
    let per_iter = |ns: f64| ns / n as f64;
    let diffs: Vec<f64> = with.iter().zip(&without).map(|(w, o)| w - o).collect();
    let diff = per_iter(median(&diffs));
    let (with_m, without_m) = (per_iter(median(&with)), per_iter(median(&without)));
    println!(
        "{} rounds of {n} iterations each, alternating; per iteration:",
        with.len()
    );
    println!(
        "  with a disabled probes::gc_begin: median {with_m:.3} ns (runs {})",
        spread(&with, n as f64)
    );
    println!(
        "  without a probe:                  median {without_m:.3} ns (runs {})",
        spread(&without, n as f64)
    );
    println!("  difference (median of the paired rounds): {diff:+.3} ns/iteration");
    let goal = 0.05;
    Ok(vec![Row {
        figure: "1. disabled probe, per iteration".into(),
        tracer: format!("{with_m:.3} ns (+{diff:.3} ns)"),
        baselines: format!("no probe {without_m:.3} ns"),
        ratio: format!("{:.2}x", with_m / without_m),
        goal: format!("+< {goal} ns"),
        met: yes_no(diff.abs() < goal),
    }])
}

// ---------------------------------------------------------------------------------------
// Figure 2

/// How to start a tool against a process and know it attached.
struct ToolSpec {
    /// "tracer", "bpftrace" or another tool name (for the memory figure).
    tool: &'static str,
    /// What it does, as shown in the tables.
    label: &'static str,
    program: PathBuf,
    /// `{pid}` is replaced by the target's PID.
    args: Vec<String>,
    /// The stream and line prefix that say the tool is attached.
    ready: (Stream, &'static str),
    /// Whether it exits by itself once the target exits; otherwise it gets SIGINT.
    stops_with_target: bool,
}

fn figure_event_cost(config: &Config, memory: &mut Memory) -> Result<Vec<Row>> {
    let n = config.events;
    let loop_bin = bin("bench-usdt-loop");
    let probe = format!("usdt:{}:tracer:gc__begin", loop_bin.display());
    let mut tools = vec![
        ToolSpec {
            tool: "tracer",
            label: "tracer trace --count",
            program: bin("tracer"),
            args: strings(&[
                "trace", "--count", "--format", "json", "--pid", "{pid}", &probe,
            ]),
            ready: (Stream::Stderr, "Attached"),
            stops_with_target: true,
        },
        ToolSpec {
            tool: "bpftrace",
            label: "bpftrace @ = count()",
            program: "bpftrace".into(),
            args: strings(&[
                "-p",
                "{pid}",
                "-e",
                &bpftrace_program(&probe, "@ = count();"),
            ]),
            ready: (Stream::Stdout, BPFTRACE_ATTACHED),
            stops_with_target: true,
        },
        ToolSpec {
            tool: "bpftrace-empty",
            label: "bpftrace empty action",
            program: "bpftrace".into(),
            args: strings(&["-p", "{pid}", "-e", &bpftrace_program(&probe, "")]),
            ready: (Stream::Stdout, BPFTRACE_ATTACHED),
            stops_with_target: true,
        },
    ];
    let mut skipped = Vec::new();
    match probe_sites(&loop_bin) {
        Ok((offsets, semaphore)) => {
            let mut args = strings(&["--pid", "{pid}", "--path"]);
            args.push(loop_bin.display().to_string());
            for offset in offsets {
                args.push("--offset".into());
                args.push(format!("{offset:#x}"));
            }
            args.push("--semaphore".into());
            args.push(format!("{semaphore:#x}"));
            tools.push(ToolSpec {
                tool: "perf-uprobe",
                label: "perf uprobe counter, no eBPF",
                program: bin("bench-uprobe-count"),
                args,
                ready: (Stream::Stderr, "Attached"),
                stops_with_target: true,
            });
        }
        Err(err) => skipped.push(format!("bare perf uprobe: n/a ({err:#})")),
    }
    let target_args = strings(&["--iters", &n.to_string(), "--wait-for-signal"]);

    // untraced = None; then each tool. The order rotates from round to round.
    let kinds = tools.len() + 1;
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); kinds];
    let mut failures: Vec<Option<String>> = vec![None; kinds];
    let mut bad_counts: Vec<Vec<u64>> = vec![Vec::new(); kinds];
    for round in 0..config.rounds {
        for k in 0..kinds {
            let kind = (k + round) % kinds;
            if failures[kind].is_some() {
                continue;
            }
            let tool = kind.checked_sub(1).map(|t| &tools[t]);
            match traced_run(&loop_bin, &target_args, tool) {
                Ok(run) => {
                    times[kind].push(json_u64(&run.target, "ns")? as f64);
                    if let (Some(tool), Some(out)) = (tool, &run.tool) {
                        memory.note(tool.tool, "trace --count", out.max_rss_kib);
                        if let Some(count) = tool_count(tool, out)?
                            && count != n
                        {
                            bad_counts[kind].push(count);
                        }
                    }
                }
                Err(err) => failures[kind] = Some(first_lines(&format!("{err:#}"), 3)),
            }
        }
    }

    let label = |kind: usize| {
        if kind == 0 {
            "untraced (probe disabled)"
        } else {
            tools[kind - 1].label
        }
    };
    let Some(untraced) = (!times[0].is_empty()).then(|| median(&times[0])) else {
        bail!(
            "the untraced runs failed: {}",
            failures[0].clone().unwrap_or_default()
        );
    };
    let per_event = |kind: usize| -> Option<f64> {
        (!times[kind].is_empty()).then(|| (median(&times[kind]) - untraced) / n as f64)
    };
    println!(
        "{n} hits of tracer:gc__begin per run, {} rounds; ns/event = (median traced - median untraced) / {n}",
        config.rounds
    );
    println!(
        "  {:<30} {:>12} {:>10} {:>13}  count == N in every run",
        "", "median run", "ns/event", "runs"
    );
    for kind in 0..kinds {
        if let Some(err) = &failures[kind] {
            println!("  {:<30} n/a: {err}", label(kind));
            continue;
        }
        let check = if kind == 0 {
            "-".to_string()
        } else if bad_counts[kind].is_empty() {
            "yes".to_string()
        } else {
            format!("NO: counted {:?}", bad_counts[kind])
        };
        let (lo, hi) = min_max(&times[kind]);
        let (value, runs) = if kind == 0 {
            (format!("({:.2}/it)", untraced / n as f64), "-".to_string())
        } else {
            let per = |t: f64| (t - untraced) / n as f64;
            (
                per_event(kind).map_or("-".into(), |v| format!("{v:.0}")),
                format!("{:.0}..{:.0}", per(lo), per(hi)),
            )
        };
        println!(
            "  {:<30} {:>9.1} ms {value:>10} {runs:>13}  {check}",
            label(kind),
            median(&times[kind]) / 1e6,
        );
    }
    for line in &skipped {
        println!("  {line}");
    }

    let find = |tool: &str| tools.iter().position(|t| t.tool == tool).map(|i| i + 1);
    let tracer = find("tracer").and_then(per_event);
    let bpftrace = find("bpftrace").and_then(per_event);
    let bare_candidates: Vec<(&str, f64)> = ["perf-uprobe", "bpftrace-empty"]
        .iter()
        .filter_map(|t| Some((label(find(t)?), find(t).and_then(per_event)?)))
        .collect();
    let bare = bare_candidates
        .iter()
        .copied()
        .min_by(|a, b| a.1.total_cmp(&b.1));
    let counts_ok = find("tracer").is_some_and(|k| bad_counts[k].is_empty());

    let mut rows = Vec::new();
    let (Some(tracer), Some(bpftrace)) = (tracer, bpftrace) else {
        bail!("the tracer or bpftrace runs failed (see above)");
    };
    let mut baselines = format!("bpftrace {bpftrace:.0} ns");
    let mut added_ok = None;
    if let Some((bare_label, bare_ns)) = bare {
        let (ours, theirs) = (tracer - bare_ns, bpftrace - bare_ns);
        println!(
            "  above the bare trap ({bare_label}, {bare_ns:.0} ns): tracer adds {ours:.0} ns, bpftrace adds {theirs:.0} ns"
        );
        let _ = write!(baselines, "; bare trap {bare_ns:.0} ns");
        if theirs <= 0.0 {
            println!(
                "  (bpftrace's count() measured no cost above the bare trap: the noise is larger \
                 than the difference; use more --rounds or --events)"
            );
        } else {
            added_ok = Some(ours <= theirs / 2.0);
        }
    }
    if !counts_ok {
        println!("  WARNING: the tracer's count differed from N: {bad_counts:?}");
    }
    rows.push(Row {
        figure: "2. per traced event".into(),
        tracer: format!("{tracer:.0} ns"),
        baselines,
        ratio: format!("{:.2}x", tracer / bpftrace),
        goal: "<= bpftrace; added <= 1/2 of bpftrace's".into(),
        met: match (counts_ok, tracer <= bpftrace, added_ok) {
            (false, _, _) => "NO (count != N)".into(),
            (true, false, _) | (true, true, Some(false)) => "NO".into(),
            (true, true, Some(true)) => "yes".into(),
            (true, true, None) => "? (noise)".into(),
        },
    });
    Ok(rows)
}

/// What bpftrace's BEGIN probe prints. "Attaching N probes..." is printed before the probes
/// are attached; BEGIN fires once they all are.
const BPFTRACE_ATTACHED: &str = "bench: attached";

/// A bpftrace program running `action` at `probe`, announcing when it is attached.
fn bpftrace_program(probe: &str, action: &str) -> String {
    format!("BEGIN {{ printf(\"{BPFTRACE_ATTACHED}\\n\"); }} {probe} {{ {action} }}")
}

/// The file offsets of `tracer:gc__begin`'s sites in `binary` and of its semaphore, from
/// `tracer list -v`.
fn probe_sites(binary: &Path) -> Result<(Vec<u64>, u64)> {
    let out = Command::new(bin("tracer"))
        .args(["list", "-v"])
        .arg(format!("usdt:{}:tracer:gc__begin", binary.display()))
        .output()
        .context("cannot run tracer list")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut offsets = Vec::new();
    let mut semaphore = None;
    for line in text.lines().filter(|l| l.trim_start().starts_with("site ")) {
        let hex_after = |from: usize| -> Option<u64> {
            let rest = line[from..].split("file offset 0x").nth(1)?;
            let digits: String = rest.chars().take_while(char::is_ascii_hexdigit).collect();
            u64::from_str_radix(&digits, 16).ok()
        };
        offsets.push(hex_after(0).context("no site file offset in `tracer list -v`")?);
        if let Some(at) = line.find("semaphore") {
            semaphore = hex_after(at);
        }
    }
    if offsets.is_empty() {
        bail!("`tracer list -v` printed no site: {text}");
    }
    Ok((offsets, semaphore.unwrap_or(0)))
}

/// The event count a figure-2 tool reported; None for a tool that counts nothing.
fn tool_count(tool: &ToolSpec, out: &Finished) -> Result<Option<u64>> {
    let text = &out.stdout;
    let number = |s: &str| s.trim().trim_end_matches('}').trim().parse::<u64>().ok();
    let count = match tool.tool {
        // An empty action counts nothing.
        "bpftrace-empty" => return Ok(None),
        // @: N
        "bpftrace" => text
            .lines()
            .find_map(|l| number(l.trim().strip_prefix("@:")?)),
        // tracer: {"usdt:...:gc__begin":N}; bench-uprobe-count: {"count":N}
        _ => text
            .lines()
            .rev()
            .find_map(|l| number(l.rsplit(':').next()?)),
    };
    count
        .map(Some)
        .with_context(|| format!("no count in the output of {}: {text}", tool.label))
}

// ---------------------------------------------------------------------------------------
// Figure 3

/// Off-CPU time by user+kernel stack per thread of the target ($1), the way bpftrace users
/// write it: timestamp and stacks when a thread of the target leaves the CPU, the blocked
/// time summed by those stacks when it comes back.
const BPFTRACE_OFFCPU: &str = r#"
BEGIN { printf("bench: attached\n"); }
tracepoint:sched:sched_switch
{
  if (pid == $1) {
    @start[tid] = nsecs;
    @ustk[tid] = ustack;
    @kstk[tid] = kstack;
  }
  $t = @start[args->next_pid];
  if ($t != 0) {
    @off[@ustk[args->next_pid], @kstk[args->next_pid]] = sum(nsecs - $t);
    delete(@start[args->next_pid]);
  }
}
END { clear(@start); clear(@ustk); clear(@kstk); }
"#;

fn figure_offcpu(config: &Config, memory: &mut Memory) -> Result<Vec<Row>> {
    let n = config.round_trips;
    let target = bin("pingpong");
    let out_dir = std::env::temp_dir().join(format!("tracer-bench-attach-{}", std::process::id()));
    let mut tools = vec![
        ToolSpec {
            tool: "tracer",
            label: "tracer attach --pid",
            program: bin("tracer"),
            args: vec![
                "attach".into(),
                "--pid".into(),
                "{pid}".into(),
                "--format".into(),
                "json".into(),
                "-o".into(),
                out_dir.display().to_string(),
            ],
            ready: (Stream::Stderr, "Attached"),
            stops_with_target: true,
        },
        ToolSpec {
            tool: "bpftrace",
            label: "bpftrace sched_switch stacks",
            program: "bpftrace".into(),
            args: strings(&["-e", BPFTRACE_OFFCPU, "{pid}"]),
            ready: (Stream::Stdout, BPFTRACE_ATTACHED),
            stops_with_target: false,
        },
    ];
    let bcc = bcc_offcputime();
    if let Some(program) = &bcc {
        tools.push(ToolSpec {
            tool: "bcc",
            label: "BCC offcputime",
            program: program.clone(),
            args: strings(&["-p", "{pid}"]),
            ready: (Stream::Stdout, "Tracing"),
            stops_with_target: false,
        });
    }
    let target_args = strings(&["--round-trips", &n.to_string(), "--wait-for-signal"]);
    let kinds = tools.len() + 1;
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); kinds];
    let mut failures: Vec<Option<String>> = vec![None; kinds];
    for round in 0..config.rounds {
        for k in 0..kinds {
            let kind = (k + round) % kinds;
            if failures[kind].is_some() {
                continue;
            }
            let tool = kind.checked_sub(1).map(|t| &tools[t]);
            match traced_run(&target, &target_args, tool) {
                Ok(run) => {
                    times[kind].push(json_u64(&run.target, "ns")? as f64);
                    if let (Some(tool), Some(out)) = (tool, &run.tool) {
                        memory.note(tool.tool, "attach (off-CPU)", out.max_rss_kib);
                        if tool.tool == "tracer" && !out.stdout.contains("\"offcpu\"") {
                            failures[kind] = Some(format!(
                                "no off-CPU report in its output: {}",
                                out.stdout.chars().take(300).collect::<String>()
                            ));
                        }
                    }
                }
                Err(err) => failures[kind] = Some(first_lines(&format!("{err:#}"), 3)),
            }
        }
    }
    let _ = std::fs::remove_dir_all(&out_dir);

    if times[0].is_empty() {
        bail!(
            "the untraced runs failed: {}",
            failures[0].clone().unwrap_or_default()
        );
    }
    let rate = |kind: usize| n as f64 / (median(&times[kind]) / 1e9);
    let untraced = rate(0);
    // A kind past the tools measured (BCC when it is not installed) has no loss.
    let loss = |kind: usize| -> Option<f64> {
        let measured = times.get(kind).is_some_and(|t| !t.is_empty());
        measured.then(|| 1.0 - rate(kind) / untraced)
    };
    println!(
        "{n} round trips per run, {} rounds; throughput from the median run",
        config.rounds
    );
    // Throughput of the slowest and fastest run of a kind.
    let runs = |kind: usize| {
        let (lo, hi) = min_max(&times[kind]);
        format!("{:.0}..{:.0}", n as f64 / (hi / 1e9), n as f64 / (lo / 1e9))
    };
    println!(
        "  {:<30} {:>16} {:>8} {:>15}",
        "", "round trips/s", "loss", "runs"
    );
    println!(
        "  {:<30} {:>16.0} {:>8} {:>15}",
        "untraced",
        untraced,
        "-",
        runs(0)
    );
    for (t, tool) in tools.iter().enumerate() {
        let kind = t + 1;
        match (&failures[kind], loss(kind)) {
            (Some(err), _) if tool.tool == "bcc" => {
                println!("  {:<30} n/a: {err} ({})", tool.label, bcc_reason())
            }
            (Some(err), _) => println!("  {:<30} n/a: {err}", tool.label),
            (None, Some(l)) => println!(
                "  {:<30} {:>16.0} {:>7.1}% {:>15}",
                tool.label,
                rate(kind),
                l * 100.0,
                runs(kind)
            ),
            (None, None) => println!("  {:<30} n/a", tool.label),
        }
    }
    if bcc.is_none() {
        println!("  {:<30} n/a: {}", "BCC offcputime", bcc_reason());
    }

    let tracer = loss(1).filter(|_| failures[1].is_none());
    let bpftrace = loss(2).filter(|_| failures[2].is_none());
    let Some(tracer) = tracer else {
        bail!(
            "tracer attach failed: {}",
            failures[1].clone().unwrap_or_default()
        );
    };
    let mut baselines = match bpftrace {
        Some(b) => format!("bpftrace -{:.1}%", b * 100.0),
        None => "bpftrace n/a".into(),
    };
    let bcc_loss = bcc
        .as_ref()
        .and_then(|_| loss(3))
        .filter(|_| failures.get(3).is_some_and(Option::is_none));
    match bcc_loss {
        Some(l) => {
            let _ = write!(baselines, "; BCC -{:.1}%", l * 100.0);
        }
        None => baselines.push_str("; BCC n/a"),
    }
    Ok(vec![Row {
        figure: "3. ping-pong throughput loss".into(),
        tracer: format!("-{:.1}%", tracer * 100.0),
        baselines,
        ratio: bpftrace
            .map(|b| format!("{:.2}x", tracer / b))
            .unwrap_or_else(|| "-".into()),
        goal: "<= 10% loss".into(),
        met: yes_no(tracer <= 0.10),
    }])
}

fn bcc_offcputime() -> Option<PathBuf> {
    ["offcputime-bpfcc", "offcputime"]
        .iter()
        .find_map(|name| which(name))
        .or_else(|| {
            let p = PathBuf::from("/usr/share/bcc/tools/offcputime");
            p.is_file().then_some(p)
        })
}

/// Why BCC's offcputime cannot work here, from what this machine lacks.
fn bcc_reason() -> String {
    let mut reasons = Vec::new();
    if bcc_offcputime().is_none() {
        reasons.push("not installed (Debian package bpfcc-tools)".to_string());
    }
    if !Path::new("/sys/bus/event_source/devices/kprobe").exists() {
        reasons.push(
            "no kprobes on this kernel (no kprobe PMU), and it attaches a kprobe to finish_task_switch"
                .to_string(),
        );
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let headers = format!("/lib/modules/{}/build", release.trim());
    if !Path::new(&headers).exists() && !Path::new("/sys/kernel/kheaders.tar.xz").exists() {
        reasons.push(format!(
            "no kernel headers ({headers}, /sys/kernel/kheaders.tar.xz) for its run-time compile"
        ));
    }
    if reasons.is_empty() {
        "see the error above".into()
    } else {
        reasons.join("; ")
    }
}

// ---------------------------------------------------------------------------------------
// Figure 4

/// The tools figure 4 starts, in the order of the first round (later rounds rotate it).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Launcher {
    TracerAttach,
    TracerTrace,
    Bpftrace,
}

fn figure_launch(config: &Config, memory: &mut Memory) -> Result<Vec<Row>> {
    let loop_bin = bin("bench-usdt-loop");
    let probe = format!("usdt:{}:tracer:gc__begin", loop_bin.display());
    let out_dir = std::env::temp_dir().join(format!("tracer-bench-launch-{}", std::process::id()));
    let launchers = [
        Launcher::TracerAttach,
        Launcher::TracerTrace,
        Launcher::Bpftrace,
    ];
    let mut ms: [Vec<f64>; 3] = Default::default();
    for round in 0..config.rounds {
        for k in 0..launchers.len() {
            let which = (k + round) % launchers.len();
            let mut target = Tool::spawn(
                Command::new(&loop_bin).args(["--forever", "--interval-us", "100"]),
                "bench-usdt-loop",
            )?;
            let pid = ready_pid(&mut target)?.to_string();
            let t0 = sys::monotonic_ns();
            let first = launch_to_first_event(launchers[which], &pid, &probe, &out_dir, memory);
            target.kill();
            ms[which].push(first?.saturating_sub(t0) as f64 / 1e6);
        }
    }
    let _ = std::fs::remove_dir_all(&out_dir);
    let [attach, trace, bpftrace] = [0, 1, 2].map(|i| median(&ms[i]));
    println!(
        "target fires tracer:gc__begin every 100 us; first event time - CLOCK_MONOTONIC before spawn, {} rounds",
        config.rounds
    );
    println!(
        "  tracer attach --pid:  median {attach:.1} ms (runs {}; first_hit_monotonic_ns of its JSON report)",
        list_ms(&ms[0])
    );
    println!(
        "  tracer trace --pid:   median {trace:.1} ms (runs {}; time_ns of the first event)",
        list_ms(&ms[1])
    );
    println!(
        "  bpftrace -p:          median {bpftrace:.1} ms (runs {}; nsecs printed by the first event)",
        list_ms(&ms[2])
    );
    println!(
        "  bpftrace / tracer: attach {:.1}x, trace {:.1}x",
        bpftrace / attach,
        bpftrace / trace
    );
    let row = |figure: &str, tracer: f64| Row {
        figure: figure.into(),
        tracer: format!("{tracer:.1} ms"),
        baselines: format!("bpftrace {bpftrace:.1} ms"),
        ratio: format!(
            "{:.2}x ({:.1}x faster)",
            tracer / bpftrace,
            bpftrace / tracer
        ),
        goal: "<= 20 ms, 5x faster".into(),
        met: yes_no(tracer <= 20.0 && bpftrace / tracer >= 5.0),
    };
    Ok(vec![
        row("4. launch to first event, attach", attach),
        row("4b. launch to first event, trace", trace),
    ])
}

/// Starts `launcher` on process `pid` and returns the CLOCK_MONOTONIC time of the first
/// event it recorded, as the tool itself reports it.
fn launch_to_first_event(
    launcher: Launcher,
    pid: &str,
    probe: &str,
    out_dir: &Path,
    memory: &mut Memory,
) -> Result<u64> {
    let (mut cmd, name, what) = match launcher {
        Launcher::TracerAttach => {
            let mut cmd = Command::new(bin("tracer"));
            cmd.args(["attach", "--pid", pid, "--format", "json", "-o"])
                .arg(out_dir);
            (cmd, "tracer", "attach (launch)")
        }
        Launcher::TracerTrace => {
            let mut cmd = Command::new(bin("tracer"));
            cmd.args(["trace", "--format", "json", "--pid", pid, probe]);
            (cmd, "tracer", "trace (per-event JSON)")
        }
        Launcher::Bpftrace => {
            let mut cmd = Command::new("bpftrace");
            cmd.args(["-p", pid, "-e"]);
            cmd.arg(format!(
                "{probe} {{ printf(\"first %llu\\n\", nsecs); exit(); }}"
            ));
            (cmd, "bpftrace", "trace (per-event JSON)")
        }
    };
    let mut tool = Tool::spawn(&mut cmd, name)?;
    let timeout = Duration::from_secs(30);
    let first = match launcher {
        Launcher::TracerAttach => tool
            .wait_line(Stream::Stderr, timeout, |l| l.starts_with("Attached"))
            .map(|_| std::thread::sleep(Duration::from_millis(20))),
        Launcher::TracerTrace => tool
            .wait_line(Stream::Stdout, timeout, |l| l.contains("\"time_ns\""))
            .and_then(|l| json_u64(&l, "time_ns"))
            .map(|_| ()),
        Launcher::Bpftrace => tool
            .wait_line(Stream::Stdout, timeout, |l| l.starts_with("first "))
            .map(|_| ()),
    };
    tool.interrupt();
    let finished = tool.finish(Duration::from_secs(10));
    first?;
    let finished = finished?;
    memory.note(name, what, finished.max_rss_kib);
    match launcher {
        // attach reports when each probe first fired; the earliest is its first event.
        Launcher::TracerAttach => json_u64_all(&finished.stdout, "first_hit_monotonic_ns")
            .into_iter()
            .min()
            .with_context(|| format!("no probe hit in {}", finished.stdout)),
        Launcher::TracerTrace => json_u64(&finished.stdout, "time_ns"),
        Launcher::Bpftrace => {
            let line = finished
                .stdout
                .lines()
                .find(|l| l.starts_with("first "))
                .context("bpftrace printed no first event")?;
            Ok(line["first ".len()..].trim().parse::<u64>()?)
        }
    }
}

// ---------------------------------------------------------------------------------------
// Figure 5

fn figure_render(config: &Config) -> Result<Vec<Row>> {
    let out = Command::new(bin("bench-render"))
        .args(["--samples", &config.render_samples.to_string()])
        .args(["--stacks", &config.render_stacks.to_string()])
        .args(["--rounds", &config.render_rounds.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run bench-render")?;
    if !out.status.success() {
        bail!("bench-render failed ({})", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let med = |key: &str| -> Result<f64> { Ok(median(&json_array(&text, key)?) / 1e9) };
    let (total, symbolize, folded, render, inferno) = (
        med("tracer_ns")?,
        med("symbolize_ns")?,
        med("write_folded_ns")?,
        med("render_ns")?,
        med("inferno_ns")?,
    );
    let stacks = json_u64(&text, "folded_stacks")?;
    let bytes = json_u64(&text, "folded_bytes")?;
    println!(
        "profile: {} blocked intervals over {} keys -> {stacks} distinct folded stacks, {:.0} MB folded; {} round(s)",
        json_u64(&text, "samples")?,
        json_u64(&text, "keys")?,
        bytes as f64 / 1e6,
        config.render_rounds
    );
    println!("  tracer, all steps:          {total:.2} s");
    println!("    build_profile (symbolize, fold): {symbolize:.2} s");
    println!("    write_folded:                    {folded:.2} s");
    println!("    write_flamegraph_svg:            {render:.2} s");
    println!("  inferno alone (same folded stacks): {inferno:.2} s");
    Ok(vec![
        Row {
            figure: "5. symbolize + render".into(),
            tracer: format!("{total:.2} s"),
            baselines: format!("inferno {inferno:.2} s"),
            ratio: format!("{:.2}x", total / inferno),
            // inferno is given names; tracer must find them (kallsyms, ELF and DWARF of
            // every mapped object): the comparison with a goal is the render step's.
            goal: "(informative)".into(),
            met: "-".into(),
        },
        Row {
            figure: "5b. render step alone".into(),
            tracer: format!("{render:.2} s"),
            baselines: format!("inferno {inferno:.2} s"),
            ratio: format!("{:.2}x", render / inferno),
            goal: "<= 1.10x inferno".into(),
            met: yes_no(render <= inferno * 1.10),
        },
    ])
}

// ---------------------------------------------------------------------------------------
// Figure 6

fn figure_memory(memory: &Memory) -> Row {
    let mb = |kib: u64| kib as f64 / 1024.0;
    if memory.tracer.is_empty() {
        println!("no tracer run to measure: run figures 2, 3 or 4 with it");
        return Row {
            figure: "6. tracer peak RSS".into(),
            tracer: "not measured".into(),
            baselines: "-".into(),
            ratio: "-".into(),
            goal: "<= 64 MB".into(),
            met: "?".into(),
        };
    }
    println!("peak RSS (wait4 ru_maxrss), highest over the runs of each kind:");
    for (what, kib) in &memory.tracer {
        println!("  tracer   {what:<26} {:>7.1} MB", mb(*kib));
    }
    for (what, kib) in &memory.bpftrace {
        println!("  bpftrace {what:<26} {:>7.1} MB", mb(*kib));
    }
    let tracer = memory.tracer.iter().map(|(_, k)| *k).max().unwrap_or(0);
    let bpftrace = memory.bpftrace.iter().map(|(_, k)| *k).max();
    Row {
        figure: "6. tracer peak RSS".into(),
        tracer: format!("{:.1} MB", mb(tracer)),
        baselines: bpftrace
            .map(|b| format!("bpftrace {:.1} MB", mb(b)))
            .unwrap_or_else(|| "-".into()),
        ratio: bpftrace
            .map(|b| format!("{:.2}x", tracer as f64 / b as f64))
            .unwrap_or_else(|| "-".into()),
        goal: "<= 64 MB".into(),
        met: yes_no(mb(tracer) <= 64.0),
    }
}

// ---------------------------------------------------------------------------------------
// Summary

fn print_summary(rows: &[Row], elapsed: Duration) {
    let headers = ["figure", "tracer", "baseline(s)", "ratio", "goal", "met?"];
    let cells: Vec<[&str; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.figure.as_str(),
                r.tracer.as_str(),
                r.baselines.as_str(),
                r.ratio.as_str(),
                r.goal.as_str(),
                r.met.as_str(),
            ]
        })
        .collect();
    let mut widths = headers.map(str::len);
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |row: &[&str; 6]| {
        let mut out = String::from("|");
        for (cell, w) in row.iter().zip(widths) {
            let _ = write!(out, " {cell:<w$} |");
        }
        out
    };
    println!("\n== Summary ({:.0} s)", elapsed.as_secs_f64());
    println!("{}", line(&headers));
    let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
    let rule: [&str; 6] = std::array::from_fn(|i| rule[i].as_str());
    println!("{}", line(&rule));
    for row in &cells {
        println!("{}", line(row));
    }
}

// ---------------------------------------------------------------------------------------
// Running targets and tools

/// A target and, optionally, a tool attached to it for the whole run.
struct Run {
    /// The target's stdout (its ready line and its JSON result).
    target: String,
    tool: Option<Finished>,
}

/// Starts `target` (which waits for SIGUSR1), attaches `tool` if any, releases the target,
/// waits for both.
fn traced_run(target: &Path, target_args: &[String], tool: Option<&ToolSpec>) -> Result<Run> {
    let mut target = Tool::spawn(Command::new(target).args(target_args), "target")?;
    let pid = ready_pid(&mut target)?;
    let mut attached = match tool {
        Some(spec) => {
            let args: Vec<String> = spec
                .args
                .iter()
                .map(|a| a.replace("{pid}", &pid.to_string()))
                .collect();
            let mut running = Tool::spawn(Command::new(&spec.program).args(&args), spec.label)?;
            let (stream, prefix) = spec.ready;
            if let Err(err) =
                running.wait_line(stream, Duration::from_secs(60), |l| l.starts_with(prefix))
            {
                target.kill();
                running.interrupt();
                let out = running.finish(Duration::from_secs(5));
                let detail = out
                    .map(|o| error_lines(&format!("{}{}", o.stderr, o.stdout), 4))
                    .unwrap_or_default();
                bail!("{} did not attach: {err:#}; {detail}", spec.label);
            }
            Some((spec, running))
        }
        None => None,
    };
    target.signal(sys::SIGUSR1);
    let target_out = target.finish(Duration::from_secs(600))?;
    if !target_out.success {
        bail!("the target failed: {}", target_out.stderr);
    }
    let tool = match attached.take() {
        Some((spec, running)) => {
            if !spec.stops_with_target {
                running.interrupt();
            }
            let out = running.finish(Duration::from_secs(60))?;
            if !out.success {
                bail!(
                    "{} failed: {}",
                    spec.label,
                    error_lines(&format!("{}{}", out.stderr, out.stdout), 4)
                );
            }
            Some(out)
        }
        None => None,
    };
    Ok(Run {
        target: target_out.stdout,
        tool,
    })
}

fn ready_pid(target: &mut Tool) -> Result<u32> {
    let line = target.wait_line(Stream::Stdout, Duration::from_secs(10), |l| {
        l.starts_with("ready pid=")
    })?;
    Ok(line["ready pid=".len()..].trim().parse()?)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stream {
    Stdout,
    Stderr,
}

/// A child process whose output is read line by line by two threads, so it never blocks
/// on a full pipe, and which is reaped with wait4 to learn its peak RSS.
struct Tool {
    name: String,
    child: Child,
    lines: [Receiver<String>; 2],
    seen: [String; 2],
    readers: Vec<JoinHandle<()>>,
    reaped: bool,
}

/// How a child ended and everything it printed.
struct Finished {
    success: bool,
    stdout: String,
    stderr: String,
    max_rss_kib: u64,
}

impl Tool {
    fn spawn(cmd: &mut Command, name: &str) -> Result<Tool> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {name} ({:?})", cmd.get_program()))?;
        let (out_tx, out_rx) = mpsc::channel();
        let (err_tx, err_rx) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let readers = vec![forward_lines(stdout, out_tx), forward_lines(stderr, err_tx)];
        Ok(Tool {
            name: name.to_string(),
            child,
            lines: [out_rx, err_rx],
            seen: [String::new(), String::new()],
            readers,
            reaped: false,
        })
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Reads `stream` until a line matches; fails at its end or after `timeout`.
    fn wait_line(
        &mut self,
        stream: Stream,
        timeout: Duration,
        matches: impl Fn(&str) -> bool,
    ) -> Result<String> {
        let index = stream as usize;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines[index].recv_timeout(left) {
                Ok(line) => {
                    self.seen[index].push_str(&line);
                    self.seen[index].push('\n');
                    if matches(&line) {
                        return Ok(line);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    bail!("{} printed no expected line within {timeout:?}", self.name)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    bail!(
                        "{} ended its {stream:?} before the expected line",
                        self.name
                    )
                }
            }
        }
    }

    fn signal(&self, signal: i32) {
        if !self.reaped {
            // SAFETY: kill has no memory preconditions; the pid is our unreaped child's.
            unsafe { sys::kill(self.pid(), signal) };
        }
    }

    fn interrupt(&self) {
        self.signal(sys::SIGINT);
    }

    fn kill(&mut self) {
        self.signal(sys::SIGKILL);
        let _ = self.reap(Some(Duration::from_secs(5)));
    }

    /// Waits for the child; after `timeout` it gets SIGINT, then SIGKILL.
    fn finish(mut self, timeout: Duration) -> Result<Finished> {
        let (status, max_rss_kib) = match self.reap(Some(timeout)) {
            Ok(done) => done,
            Err(_) => {
                self.interrupt();
                match self.reap(Some(Duration::from_secs(5))) {
                    Ok(done) => done,
                    Err(_) => {
                        self.signal(sys::SIGKILL);
                        self.reap(None)?
                    }
                }
            }
        };
        for handle in self.readers.drain(..) {
            let _ = handle.join();
        }
        for index in 0..2 {
            while let Ok(line) = self.lines[index].try_recv() {
                self.seen[index].push_str(&line);
                self.seen[index].push('\n');
            }
        }
        Ok(Finished {
            success: status == 0,
            stdout: std::mem::take(&mut self.seen[0]),
            stderr: std::mem::take(&mut self.seen[1]),
            max_rss_kib,
        })
    }

    /// wait4 with a deadline (None: block): (raw wait status, ru_maxrss in KiB).
    fn reap(&mut self, timeout: Option<Duration>) -> Result<(i32, u64)> {
        if self.reaped {
            bail!("{} was already reaped", self.name);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let flags = if deadline.is_some() { sys::WNOHANG } else { 0 };
            let mut status = 0;
            let mut usage = sys::Rusage::default();
            // SAFETY: valid out-pointers; the pid is our child's.
            let rc = unsafe { sys::wait4(self.pid(), &mut status, flags, &mut usage) };
            if rc == self.pid() {
                self.reaped = true;
                return Ok((status, usage.ru_maxrss.max(0) as u64));
            }
            if rc < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err).with_context(|| format!("waiting for {}", self.name));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                bail!("{} still runs after {timeout:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Tool {
    fn drop(&mut self) {
        if !self.reaped {
            self.signal(sys::SIGKILL);
            let _ = self.reap(Some(Duration::from_secs(5)));
        }
    }
}

fn forward_lines(stream: impl Read + Send + 'static, tx: mpsc::Sender<String>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    })
}

/// Mounts tracefs for bpftrace's tracepoints if needed, and unmounts it when dropped if
/// it mounted it.
struct TracefsMount {
    mounted_here: bool,
}

impl TracefsMount {
    const PATH: &str = "/sys/kernel/tracing";

    fn ensure() -> Result<Self> {
        let mounts = std::fs::read_to_string("/proc/self/mounts")?;
        let mounted = mounts
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some(Self::PATH));
        if mounted {
            return Ok(Self {
                mounted_here: false,
            });
        }
        let status = Command::new("mount")
            .args(["-t", "tracefs", "tracefs", Self::PATH])
            .status()
            .context("cannot run mount")?;
        if !status.success() {
            bail!("mounting tracefs on {} failed ({status})", Self::PATH);
        }
        eprintln!(
            "xtask bench: mounted tracefs on {} for bpftrace",
            Self::PATH
        );
        Ok(Self { mounted_here: true })
    }
}

impl Drop for TracefsMount {
    fn drop(&mut self) {
        if self.mounted_here {
            let _ = Command::new("umount").arg(Self::PATH).status();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Small helpers

/// The first three fields of /proc/loadavg.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn bin(name: &str) -> PathBuf {
    release_dir().join(name)
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

fn min_max(values: &[f64]) -> (f64, f64) {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

/// Per-iteration values of each run, e.g. "0.36..0.74".
fn spread(runs: &[f64], per: f64) -> String {
    let (lo, hi) = min_max(runs);
    format!("{:.3}..{:.3}", lo / per, hi / per)
}

fn list_ms(values: &[f64]) -> String {
    let items: Vec<String> = values.iter().map(|v| format!("{v:.1}")).collect();
    items.join(", ")
}

fn yes_no(ok: bool) -> String {
    if ok { "yes".into() } else { "NO".into() }
}

fn first_lines(text: &str, n: usize) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(n)
        .collect::<Vec<_>>()
        .join(" / ")
}

/// Up to `n` lines of a tool's output, those that look like errors first.
fn error_lines(text: &str, n: usize) -> String {
    let looks_bad = |l: &&str| {
        let lower = l.to_ascii_lowercase();
        ["error", "unable", "fail", "cannot", "not found"]
            .iter()
            .any(|w| lower.contains(w))
    };
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let (bad, rest): (Vec<&str>, Vec<&str>) = lines.into_iter().partition(looks_bad);
    bad.into_iter()
        .chain(rest)
        .take(n)
        .collect::<Vec<_>>()
        .join(" / ")
}

/// The number after `"key":` in a one-line JSON object.
/// Every number after `"key":` in `text` (other values, such as null, are skipped).
fn json_u64_all(text: &str, key: &str) -> Vec<u64> {
    let pattern = format!("\"{key}\":");
    text.match_indices(&pattern)
        .filter_map(|(at, _)| {
            let digits: String = text[at + pattern.len()..]
                .trim_start()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .collect()
}

fn json_u64(text: &str, key: &str) -> Result<u64> {
    let pattern = format!("\"{key}\":");
    let at = text
        .find(&pattern)
        .with_context(|| format!("no {key:?} in {text:?}"))?;
    let digits: String = text[at + pattern.len()..]
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .with_context(|| format!("{key:?} is not a number in {text:?}"))
}

/// The numbers of the array after `"key":` in a one-line JSON object.
fn json_array(text: &str, key: &str) -> Result<Vec<f64>> {
    let pattern = format!("\"{key}\":[");
    let at = text
        .find(&pattern)
        .with_context(|| format!("no {key:?} array in {text:?}"))?;
    let rest = &text[at + pattern.len()..];
    let end = rest
        .find(']')
        .ok_or_else(|| anyhow!("unterminated {key:?}"))?;
    rest[..end]
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim()
                .parse::<f64>()
                .with_context(|| format!("{key:?}: {s:?}"))
        })
        .collect()
}

/// The few libc calls the harness needs, declared by hand: xtask does not depend on the
/// libc crate. 64-bit Linux layouts.
mod sys {
    pub const SIGINT: i32 = 2;
    pub const SIGKILL: i32 = 9;
    pub const SIGUSR1: i32 = 10;
    pub const WNOHANG: i32 = 1;
    const CLOCK_MONOTONIC: i32 = 1;

    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }

    /// struct rusage: two timevals, then 14 longs of which ru_maxrss (KiB) is the first.
    #[repr(C)]
    #[derive(Default)]
    pub struct Rusage {
        ru_utime: [i64; 2],
        ru_stime: [i64; 2],
        pub ru_maxrss: i64,
        rest: [i64; 13],
    }

    unsafe extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
        pub fn kill(pid: i32, signal: i32) -> i32;
        pub fn wait4(pid: i32, status: *mut i32, options: i32, usage: *mut Rusage) -> i32;
        pub fn geteuid() -> u32;
    }

    /// CLOCK_MONOTONIC in nanoseconds: the clock of bpf_ktime_get_ns and bpftrace's nsecs.
    pub fn monotonic_ns() -> u64 {
        let mut ts = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists.
        unsafe { clock_gettime(CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }
}
