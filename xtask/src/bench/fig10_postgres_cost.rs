//! Figure 10: the tracer's own cost on a real service. PostgreSQL 15 (a throwaway cluster
//! of the `postgres` user, scale 2, autovacuum and fsync off, its Unix socket only) serves
//! `pgbench -n -c 8 -j 2 -T S` untraced and under each tool keeping every backend's
//! off-CPU time by stack: `tracer attach --pid POSTMASTER --children` with DWARF unwinding
//! (the default) and with `--unwind fp` (both also sample on-CPU stacks, at 99 Hz, which
//! the others do not); a bpftrace `sched_switch` script, figure 3's, on every task named
//! `postgres` (bpftrace cannot follow a process's children, and every backend is one of
//! the postmaster's); and `perf record -g -e sched:sched_switch -a` when perf is
//! installed. Each round runs every kind once, in an order that rotates from round to
//! round; before each run the tables pgbench updates are vacuumed, its history emptied
//! and a checkpoint taken, outside the measured time.
//!
//! Per run: the transactions pgbench processed and its tps; the cluster's CPU time over the
//! run (`/proc/PID/stat`: the postmaster's, its background processes', and that of the
//! backends it reaped, read once pgbench is done and its backends are gone); pgbench's
//! own CPU time (this process's reaped children's, around it); the tool's CPU time from
//! attached to just before its SIGINT ("own"), and apart from it, its CPU time to attach
//! and from SIGINT to exit (writing its report); its peak RSS while tracing (VmHWM) and
//! over its whole life (wait4). The eBPF programs and perf's kernel side run in the traced
//! tasks, so their time lands in postgres's CPU time (and pgbench's), not in the tool's:
//! the figure's measure is the total, postgres + the tool's own, per transaction, next to
//! the tool's own alone. Throughput and added CPU time are each run's against the same
//! round's untraced run.

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::{
    Config, Row,
    harness::{
        BPFTRACE_ATTACHED, Finished, Stream, Tool, bin, error_lines, first_lines, strings, which,
    },
    stats::{median, median_range},
};

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
/// pgbench's clients and worker threads: more clients than this machine has cores, so
/// that backends wait on each other and on the CPU, and switch often.
const CLIENTS: &str = "8";
const THREADS: &str = "2";
/// The untimed pgbench run before the rounds: the first measured run would otherwise be
/// the only one on a cluster fresh from the load.
const WARM_UP_S: u64 = 3;
/// How much longer than pgbench the tracer is told to run (`-d`): it is stopped with
/// SIGINT once pgbench is done, and must still be tracing then.
const TRACER_MARGIN_S: u64 = 60;
/// How long a tool may take to say it attached (bpftrace compiles its script first).
const ATTACH_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a tool gets from SIGINT to exit, before a second SIGINT (bpftrace sometimes
/// misses the first, figure 7) and again after it.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the backends get to exit once pgbench has closed its connections.
const BACKENDS_TIMEOUT: Duration = Duration::from_secs(30);
/// perf's output file, in the tools' output directory.
const PERF_DATA: &str = "perf.data";

/// Figure 3's off-CPU script, on every task named `postgres` instead of one PID. `comm`
/// is the name of the task leaving the CPU; the time is summed when it comes back.
fn bpftrace_offcpu_postgres() -> String {
    let script = super::fig3_offcpu_pingpong::BPFTRACE_OFFCPU;
    assert!(
        script.contains("pid == $1"),
        "figure 3's script filters by pid"
    );
    script.replace("pid == $1", "comm == \"postgres\"")
}

/// The kinds of run: untraced, then one per tool, in the order of [`tools`].
const UNTRACED: usize = 0;
const TRACER_DWARF: usize = 1;
const TRACER_FP: usize = 2;
const BPFTRACE: usize = 3;
const PERF: usize = 4;

/// A tool that watches the cluster for a run.
struct TracingTool {
    /// What it does, as shown in the tables.
    label: &'static str,
    program: PathBuf,
    args: Vec<String>,
    /// The stream and line prefix that say it is attached.
    ready: (Stream, &'static str),
    /// How it shows it wrote what it collected.
    output: Output,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    /// `tracer attach --format json`: a report on stdout.
    TracerReport,
    /// bpftrace: its map of off-CPU time, printed at exit.
    BpftraceMap,
    /// perf: [`PERF_DATA`].
    PerfData,
}

/// What one run measured.
#[derive(Clone, Copy, Debug)]
struct RunResult {
    transactions: f64,
    tps: f64,
    postgres_us: f64,
    pgbench_us: f64,
    tool: Option<ToolCost>,
}

/// A tool's CPU time (its own and its waited-for children's) and memory in one run.
#[derive(Clone, Copy, Debug)]
struct ToolCost {
    /// From its start to "attached".
    attach_us: f64,
    /// From "attached" to just before its SIGINT: while pgbench ran.
    tracing_us: f64,
    /// From SIGINT to its exit: stopping and writing what it collected.
    stop_us: f64,
    tracing_rss_kib: u64,
    lifetime_rss_kib: u64,
    /// What the tracer's report says it lost, by [`LOST_KEYS`] (0 for the others).
    lost: [u64; LOST_KEYS.len()],
    /// Off-CPU stacks that reused a snapshot not yet unwound, the ring half full.
    reused_unchecked: u64,
}

/// The keys of the tracer's `lost` report whose events its cost does not include.
const LOST_KEYS: [&str; 4] = [
    "events_lost",
    "map_full",
    "stack_map_full",
    "unwind_ring_full",
];

pub(super) fn measure(config: &Config) -> Result<Vec<Row>> {
    let seconds = config.pgbench_seconds;
    let cluster = Cluster::start().context("setting up a PostgreSQL 15 cluster")?;
    let postmaster = cluster.postmaster()?;
    let out_dir = RemovedOnDrop(
        std::env::temp_dir().join(format!("tracer-bench-pg-tools-{}", std::process::id())),
    );
    let tools = tools(postmaster, &out_dir.0, seconds);
    cluster.pgbench(&pgbench_args(WARM_UP_S))?;
    let kinds = tools.len() + 1;
    println!(
        "{kinds} kinds of run x {} rounds of pgbench -T {seconds}: about {:.0} min",
        config.rounds,
        // Each run also vacuums, checkpoints, attaches and stops: a few seconds.
        (kinds * config.rounds) as f64 * (seconds as f64 + 6.0) / 60.0
    );
    let mut results: Vec<Vec<Option<RunResult>>> = vec![vec![None; kinds]; config.rounds];
    let mut failures: Vec<Option<String>> = vec![None; kinds];
    for (round, results) in results.iter_mut().enumerate() {
        for k in 0..kinds {
            let kind = (k + round) % kinds;
            if failures[kind].is_some() {
                continue;
            }
            let tool = kind.checked_sub(1).map(|t| &tools[t]);
            match run_once(&cluster, postmaster, tool, seconds, &out_dir.0) {
                Ok(run) => results[kind] = Some(run),
                Err(err) => failures[kind] = Some(first_lines(&format!("{err:#}"), 3)),
            }
        }
    }
    drop(cluster);
    if let Some(err) = &failures[UNTRACED] {
        bail!("the untraced runs failed: {err}");
    }
    let label = |kind: usize| match kind {
        UNTRACED => "untraced",
        _ => tools[kind - 1].label,
    };
    let measured = |kind: usize| kind < kinds && failures[kind].is_none();
    // A value of every round's run of `kind`, given the run and the same round's untraced
    // run.
    let per_round = |kind: usize, value: &dyn Fn(&RunResult, &RunResult) -> Option<f64>| {
        results
            .iter()
            .filter_map(|round| value(round[kind].as_ref()?, round[UNTRACED].as_ref()?))
            .collect::<Vec<f64>>()
    };
    // A tool's own CPU while pgbench ran, and over its whole life: bpftrace does its
    // user-space work (naming the stacks) after the stop, the tracer while it runs.
    let tracing = |run: &RunResult| run.tool.map_or(0.0, |t| t.tracing_us);
    let life = |run: &RunResult| {
        run.tool
            .map_or(0.0, |t| t.attach_us + t.tracing_us + t.stop_us)
    };
    let tracing_per_txn = |run: &RunResult, _: &RunResult| Some(tracing(run) / run.transactions);
    let own_per_txn = |run: &RunResult, _: &RunResult| Some(life(run) / run.transactions);
    let total_per_txn = |run: &RunResult| (run.postgres_us + life(run)) / run.transactions;

    println!(
        "pgbench -n -c {CLIENTS} -j {THREADS} -T {seconds} (scale 2), {} rounds; each cell: \
         median (lowest..highest) over the rounds",
        config.rounds
    );
    println!(
        "  {:<38} {:>24} {:>24} {:>24} {:>24}",
        "", "tps", "vs untraced", "postgres µs/txn", "pgbench µs/txn"
    );
    for (kind, failure) in failures.iter().enumerate() {
        if let Some(err) = failure {
            println!("  {:<38} n/a: {err}", label(kind));
            continue;
        }
        let tps = per_round(kind, &|run, _| Some(run.tps));
        let vs_untraced = per_round(kind, &|run, untraced| Some(run.tps / untraced.tps));
        let postgres = per_round(kind, &|run, _| Some(run.postgres_us / run.transactions));
        let pgbench = per_round(kind, &|run, _| Some(run.pgbench_us / run.transactions));
        println!(
            "  {:<38} {:>24} {:>24} {:>24} {:>24}",
            label(kind),
            median_range(&tps, 0),
            if kind == UNTRACED {
                "-".into()
            } else {
                median_range(&vs_untraced, 3)
            },
            median_range(&postgres, 1),
            median_range(&pgbench, 1),
        );
    }
    println!(
        "  {:<38} {:>24} {:>24} {:>24} {:>24}",
        "", "own µs/txn tracing", "own µs/txn life", "total µs/txn", "added µs/txn"
    );
    for kind in (1..kinds).filter(|&kind| measured(kind)) {
        let total = per_round(kind, &|run, _| Some(total_per_txn(run)));
        let added = per_round(kind, &|run, untraced| {
            Some(total_per_txn(run) - total_per_txn(untraced))
        });
        println!(
            "  {:<38} {:>24} {:>24} {:>24} {:>24}",
            label(kind),
            median_range(&per_round(kind, &tracing_per_txn), 1),
            median_range(&per_round(kind, &own_per_txn), 1),
            median_range(&total, 1),
            median_range(&added, 1),
        );
    }
    println!(
        "  {:<38} {:>24} {:>24} {:>24}",
        "", "attach CPU ms", "stop and report CPU ms", "peak RSS MB"
    );
    for kind in (1..kinds).filter(|&kind| measured(kind)) {
        let cost =
            |value: fn(&ToolCost) -> f64| per_round(kind, &|run, _| run.tool.map(|t| value(&t)));
        let tracing_rss = cost(|t| t.tracing_rss_kib as f64 / 1024.0);
        let lifetime_rss = cost(|t| t.lifetime_rss_kib as f64 / 1024.0);
        println!(
            "  {:<38} {:>24} {:>24} {:>24}",
            label(kind),
            median_range(&cost(|t| t.attach_us / 1e3), 0),
            median_range(&cost(|t| t.stop_us / 1e3), 0),
            format!(
                "{} / {:.1}",
                median_range(&tracing_rss, 1),
                median(&lifetime_rss)
            ),
        );
        let lost: Vec<String> = LOST_KEYS
            .iter()
            .enumerate()
            .filter_map(|(i, key)| {
                let sum: u64 = per_round(kind, &|run, _| run.tool.map(|t| t.lost[i] as f64))
                    .iter()
                    .sum::<f64>() as u64;
                (sum > 0).then(|| format!("{key} {sum}"))
            })
            .collect();
        if !lost.is_empty() {
            println!(
                "  {:<38} lost over the runs ({}): its cost is understated",
                "",
                lost.join(", ")
            );
        }
        let reused: f64 = cost(|t| t.reused_unchecked as f64).iter().sum();
        if reused > 0.0 {
            println!(
                "  {:<38} {reused:.0} off-CPU stacks over the runs reused a snapshot not yet \
                 unwound (the stack-copy ring half full)",
                ""
            );
        }
    }
    if which("perf").is_none() {
        println!(
            "  {:<38} not run: perf is not installed, its column is skipped",
            "perf record"
        );
    }
    println!(
        "  postgres: the cluster's CPU time (postmaster, background processes, backends); \
         pgbench: the client's; own tracing: the tool's from attached to SIGINT; own life: \
         from its start to its exit; total: postgres + own life; added: total minus the \
         same round's untraced postgres µs/txn; peak RSS: \
         VmHWM before SIGINT / wait4's over its life (medians); CPU times in 1/{} s ticks",
        clock_ticks_per_second()
    );

    // The tracer's cost against bpftrace's: ratios of the medians over the rounds.
    let median_of = |kind: usize, value: &dyn Fn(&RunResult, &RunResult) -> Option<f64>| {
        measured(kind).then(|| median(&per_round(kind, value)))
    };
    let own_of = |kind: usize| median_of(kind, &own_per_txn);
    let total_of = |kind: usize| median_of(kind, &|run, _| Some(total_per_txn(run)));
    let tps_of = |kind: usize| median_of(kind, &|run, untraced| Some(run.tps / untraced.tps));
    let versus = |kind: usize| {
        own_of(kind)
            .zip(own_of(BPFTRACE))
            .zip(total_of(kind).zip(total_of(BPFTRACE)))
            .map(|((own, bpftrace_own), (total, bpftrace_total))| {
                (own / bpftrace_own, total / bpftrace_total)
            })
    };
    // The same, round by round: each round's machine is the same for both tools.
    let paired = |kind: usize, value: &dyn Fn(&RunResult) -> f64| -> Vec<f64> {
        results
            .iter()
            .filter_map(|round| {
                let (run, peer) = (round[kind].as_ref()?, round[BPFTRACE].as_ref()?);
                Some(value(run) / value(peer))
            })
            .collect()
    };
    for kind in [TRACER_DWARF, TRACER_FP] {
        if let Some((own, total)) = versus(kind) {
            println!(
                "  {} against bpftrace: own CPU/txn over its life {own:.2}x, total CPU/txn {total:.2}x",
                label(kind)
            );
            println!(
                "  {:<38} in each round against that round's bpftrace: own {}x, total {}x",
                "",
                median_range(&paired(kind, &|run| life(run) / run.transactions), 2),
                median_range(&paired(kind, &total_per_txn), 2),
            );
        }
    }
    let peer = |name: &str, kind: usize| match (own_of(kind), total_of(kind)) {
        (Some(own), Some(total)) => format!("{name} {own:.1} own, {total:.0} total µs/txn"),
        _ => format!("{name} n/a"),
    };
    let baselines = format!("{}; {}", peer("bpftrace", BPFTRACE), peer("perf", PERF));
    let mut rows = Vec::new();
    for (kind, figure) in [
        (TRACER_DWARF, "10. PostgreSQL, CPU per txn"),
        (TRACER_FP, "10b. same, --unwind fp"),
    ] {
        let (Some(own), Some(total), Some(tps)) = (own_of(kind), total_of(kind), tps_of(kind))
        else {
            bail!(
                "{} failed: {}",
                label(kind),
                failures[kind].clone().unwrap_or_default()
            );
        };
        rows.push(Row {
            figure: figure.into(),
            tracer: format!("{own:.1} own, {total:.0} total µs/txn, tps {tps:.3}x"),
            baselines: baselines.clone(),
            ratio: versus(kind).map_or("-".into(), |(own, total)| {
                format!("own {own:.2}x, total {total:.2}x of bpftrace's")
            }),
            goal: "own, total <= 1x".into(),
            met: versus(kind).map_or("-".into(), |(own, total)| {
                if own <= 1.0 && total <= 1.0 {
                    "yes"
                } else {
                    "no"
                }
                .into()
            }),
        });
    }
    // Peak resident memory over the tool's whole life, the stop's report included.
    let peak_rss_mb = |kind: usize| {
        measured(kind).then(|| {
            per_round(kind, &|run, _| {
                run.tool.map(|t| t.lifetime_rss_kib as f64 / 1024.0)
            })
        })
    };
    if let (Some(tracer), Some(bpftrace)) = (peak_rss_mb(TRACER_DWARF), peak_rss_mb(BPFTRACE)) {
        let highest = tracer.iter().copied().fold(f64::NAN, f64::max);
        rows.push(Row {
            figure: "10c. same, peak RSS MB".into(),
            tracer: median_range(&tracer, 1),
            baselines: format!("bpftrace {:.1}", median(&bpftrace)),
            ratio: format!("{:.2}", median(&tracer) / median(&bpftrace)),
            goal: format!("<= {PEAK_RSS_GOAL_MB} MB"),
            met: if highest <= PEAK_RSS_GOAL_MB {
                "yes"
            } else {
                "no"
            }
            .into(),
        });
    }
    Ok(rows)
}

/// The most resident memory `attach --children` may hold on the cluster, at its peak.
const PEAK_RSS_GOAL_MB: f64 = 80.0;

/// The tools of the figure, in the order of the kinds of run ([`TRACER_DWARF`] ...).
fn tools(postmaster: u32, out_dir: &Path, seconds: u64) -> Vec<TracingTool> {
    let pid = postmaster.to_string();
    let out = out_dir.display().to_string();
    let duration = format!("{}s", seconds + TRACER_MARGIN_S);
    let attach = |label, extra: &[&str]| {
        let mut args = strings(&[
            "attach",
            "--pid",
            &pid,
            "--children",
            "-d",
            &duration,
            "--format",
            "json",
            "-o",
            &out,
        ]);
        args.extend(strings(extra));
        TracingTool {
            label,
            program: bin("tracer"),
            args,
            ready: (Stream::Stderr, "Attached"),
            output: Output::TracerReport,
        }
    };
    let mut tools = vec![
        attach("tracer attach --children", &[]),
        attach("tracer attach --children --unwind fp", &["--unwind", "fp"]),
        TracingTool {
            label: "bpftrace sched_switch stacks",
            program: "bpftrace".into(),
            args: strings(&["-e", &bpftrace_offcpu_postgres()]),
            ready: (Stream::Stdout, BPFTRACE_ATTACHED),
            output: Output::BpftraceMap,
        },
    ];
    // Without perf its row says so (see `measure`), and the other tools still run.
    if let Some(perf) = which("perf") {
        let data = out_dir.join(PERF_DATA).display().to_string();
        tools.push(TracingTool {
            label: "perf record -g sched_switch -a",
            program: perf,
            // `-D 1` (enable the events 1 ms after start) is only there for the line
            // it prints once they are on, "Events enabled": perf says nothing else
            // before it exits.
            args: strings(&[
                "record",
                "-D",
                "1",
                "-g",
                "-e",
                "sched:sched_switch",
                "-a",
                "-o",
                &data,
            ]),
            ready: (Stream::Stderr, "Events enabled"),
            output: Output::PerfData,
        });
    }
    tools
}

fn pgbench_args(seconds: u64) -> Vec<String> {
    strings(&[
        "-n",
        "-c",
        CLIENTS,
        "-j",
        THREADS,
        "-T",
        &seconds.to_string(),
    ])
}

/// One pgbench run against `cluster`, under `tool` if any.
fn run_once(
    cluster: &Cluster,
    postmaster: u32,
    tool: Option<&TracingTool>,
    seconds: u64,
    out_dir: &Path,
) -> Result<RunResult> {
    // The same start for every run, outside the measured time: what pgbench does before a
    // run without -n (the tables it updates most vacuumed, its history emptied), and a
    // checkpoint, so that no timed checkpoint falls in a run.
    cluster.psql(&[
        "VACUUM pgbench_branches",
        "VACUUM pgbench_tellers",
        "TRUNCATE pgbench_history",
        "CHECKPOINT",
    ])?;
    wait_for_backends_to_exit(postmaster)?;
    let _ = std::fs::remove_dir_all(out_dir);
    std::fs::create_dir_all(out_dir)?;
    let attached = tool.map(start).transpose()?;
    let attach_ticks = match &attached {
        Some(running) => proc_stat(running.pid() as u32)?.all_ticks(),
        None => 0,
    };
    let postgres_before = cluster_ticks(postmaster)?;
    let pgbench_before = reaped_children_cpu_us();
    let out = cluster.pgbench(&pgbench_args(seconds))?;
    // runuser and the pgbench it waited for, the only children reaped meanwhile.
    let pgbench_us = reaped_children_cpu_us() - pgbench_before;
    let (transactions, tps) = parse_pgbench(&out)?;
    // A backend's CPU time joins the postmaster's when the postmaster reaps it.
    wait_for_backends_to_exit(postmaster)?;
    let postgres_us = ticks_to_us(cluster_ticks(postmaster)? - postgres_before);
    let tool = match (tool, attached) {
        (Some(tool), Some(running)) => Some(stop(tool, running, attach_ticks, out_dir)?),
        _ => None,
    };
    Ok(RunResult {
        transactions: transactions as f64,
        tps,
        postgres_us,
        pgbench_us,
        tool,
    })
}

/// Starts `tool` and waits until it says it is attached.
fn start(tool: &TracingTool) -> Result<Tool> {
    let mut running = Tool::spawn(Command::new(&tool.program).args(&tool.args), tool.label)?;
    let (stream, prefix) = tool.ready;
    if let Err(err) = running.wait_line(stream, ATTACH_TIMEOUT, |l| l.starts_with(prefix)) {
        running.interrupt();
        let detail = running
            .finish(Duration::from_secs(5))
            .map(|o| error_lines(&format!("{}{}", o.stderr, o.stdout), 4))
            .unwrap_or_default();
        bail!("{} did not attach: {err:#}; {detail}", tool.label);
    }
    Ok(running)
}

/// Stops `running` with SIGINT and reaps it; its CPU time and memory.
fn stop(tool: &TracingTool, running: Tool, attach_ticks: u64, out_dir: &Path) -> Result<ToolCost> {
    let pid = running.pid();
    // Read before the signal: what it spends from here on, stopping and writing its
    // report, is shown apart.
    let tracing = proc_stat(pid as u32)?;
    let tracing_rss_kib = vm_hwm_kib(pid as u32)?;
    running.interrupt();
    let mut exited = wait_until_exited(pid, STOP_TIMEOUT);
    if !exited {
        running.interrupt();
        exited = wait_until_exited(pid, STOP_TIMEOUT);
    }
    // Exited and not yet reaped, it still shows the CPU time of its whole life.
    let stopped = if exited {
        proc_stat(pid as u32).ok()
    } else {
        None
    };
    let finished = running.finish(Duration::from_secs(5))?;
    let stopped =
        stopped.with_context(|| format!("{} did not exit after two SIGINTs", tool.label))?;
    let (lost, reused_unchecked) = check_output(tool.output, &finished, out_dir)
        .with_context(|| format!("{} at SIGINT", tool.label))?;
    Ok(ToolCost {
        attach_us: ticks_to_us(attach_ticks),
        tracing_us: ticks_to_us(tracing.all_ticks().saturating_sub(attach_ticks)),
        stop_us: ticks_to_us(stopped.all_ticks().saturating_sub(tracing.all_ticks())),
        tracing_rss_kib,
        lifetime_rss_kib: finished.max_rss_kib,
        lost,
        reused_unchecked,
    })
}

/// Fails unless the tool wrote what it collected (a stop that drops it is no stop); the
/// events the tracer's report says it lost, and the snapshots it reused unchecked.
fn check_output(
    output: Output,
    finished: &Finished,
    out_dir: &Path,
) -> Result<([u64; LOST_KEYS.len()], u64)> {
    if output != Output::PerfData && !finished.success {
        bail!(
            "failed: {}",
            error_lines(&format!("{}{}", finished.stderr, finished.stdout), 4)
        );
    }
    match output {
        Output::TracerReport => {
            let report: Value = serde_json::from_str(&finished.stdout).with_context(|| {
                format!(
                    "no JSON report on its stdout: {}",
                    first_lines(&finished.stdout, 3)
                )
            })?;
            if report["offcpu"]["intervals"].as_u64().unwrap_or(0) == 0 {
                bail!("its report has no off-CPU interval");
            }
            let lost = &report["lost"];
            Ok((
                LOST_KEYS.map(|key| lost[key].as_u64().unwrap_or(0)),
                lost["snapshots_reused_unchecked"].as_u64().unwrap_or(0),
            ))
        }
        Output::BpftraceMap => {
            if !finished.stdout.contains("@off[") {
                bail!("it printed no off-CPU map");
            }
            Ok(([0; LOST_KEYS.len()], 0))
        }
        Output::PerfData => {
            // perf raises SIGINT again on itself as it exits, so its status is that of a
            // process killed by it: what it says it wrote is what tells.
            let size = std::fs::metadata(out_dir.join(PERF_DATA)).map_or(0, |m| m.len());
            if size == 0 || !finished.stderr.contains("Captured and wrote") {
                bail!("it wrote no data: {}", error_lines(&finished.stderr, 4));
            }
            Ok(([0; LOST_KEYS.len()], 0))
        }
    }
}

/// pgbench's "number of transactions actually processed" and tps.
fn parse_pgbench(out: &str) -> Result<(u64, f64)> {
    let transactions: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
        .and_then(|n| n.split('/').next())
        .and_then(|n| n.trim().parse().ok())
        .with_context(|| format!("no processed count from pgbench: {}", first_lines(out, 4)))?;
    let tps: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .with_context(|| format!("no tps from pgbench: {}", first_lines(out, 4)))?;
    if transactions == 0 {
        bail!("pgbench processed no transaction");
    }
    Ok((transactions, tps))
}

/// What `/proc/PID/stat` says of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ProcStat {
    state: char,
    /// utime + stime, in clock ticks: all its threads', the exited ones' too.
    own_ticks: u64,
    /// cutime + cstime: its children's that it waited for.
    children_ticks: u64,
}

impl ProcStat {
    fn parse(text: &str) -> Option<ProcStat> {
        // The name, in parentheses, may hold spaces and parentheses itself.
        let fields: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
        // proc(5) numbers the fields from 1; the list starts at field 3, the state.
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        Some(ProcStat {
            state: fields.first()?.chars().next()?,
            own_ticks: field(14)? + field(15)?,
            children_ticks: field(16)? + field(17)?,
        })
    }

    fn all_ticks(&self) -> u64 {
        self.own_ticks + self.children_ticks
    }
}

fn proc_stat(pid: u32) -> Result<ProcStat> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| path.clone())?;
    ProcStat::parse(&text).with_context(|| format!("cannot parse {path}: {text:?}"))
}

/// A process's peak resident memory so far (VmHWM), in KiB.
fn vm_hwm_kib(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| path.clone())?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("VmHWM:")?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .with_context(|| format!("no VmHWM in {path}"))
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no memory preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as u64 } else { 100 }
}

fn ticks_to_us(ticks: u64) -> f64 {
    ticks as f64 * 1e6 / clock_ticks_per_second() as f64
}

/// The CPU time of this process's children that have been reaped, and of theirs that
/// they waited for, in µs.
fn reaped_children_cpu_us() -> f64 {
    // SAFETY: struct rusage is plain integers, for which all zeroes is a value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &raw mut usage) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

/// Waits until our child `pid` has exited, without reaping it (its `/proc/PID/stat`
/// stays); false after `timeout`.
fn wait_until_exited(pid: libc::pid_t, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        // SAFETY: siginfo_t is plain data, for which all zeroes is a value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid out-pointer; the pid is our unreaped child's.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &raw mut info,
                libc::WEXITED | libc::WNOWAIT | libc::WNOHANG,
            )
        };
        // SAFETY: waitid filled `info` (with WNOHANG and nothing to report, si_pid is 0).
        if rc == 0 && unsafe { info.si_pid() } == pid {
            return true;
        }
        if rc < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return false;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The children of process `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Whether a child of the postmaster is a client backend, live or exited and not yet
/// reaped. Every connection comes through the socket, and a backend's title says so:
/// `postgres: postgres postgres [local] idle`; an exited one has no title left.
fn is_backend(pid: u32) -> bool {
    let exited = proc_stat(pid).is_ok_and(|stat| matches!(stat.state, 'Z' | 'X'));
    let title = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    exited || String::from_utf8_lossy(&title).contains("[local]")
}

fn wait_for_backends_to_exit(postmaster: u32) -> Result<()> {
    let deadline = Instant::now() + BACKENDS_TIMEOUT;
    loop {
        let left = children_of(postmaster)
            .into_iter()
            .filter(|&child| is_backend(child))
            .count();
        if left == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("{left} backends still there {BACKENDS_TIMEOUT:?} after their clients left");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The cluster's CPU time so far, in clock ticks: the postmaster's, that of the children
/// it reaped (every backend so far), and its live children's (its background processes,
/// when no backend is left).
fn cluster_ticks(postmaster: u32) -> Result<u64> {
    let mut ticks = proc_stat(postmaster)?.all_ticks();
    for child in children_of(postmaster) {
        if let Ok(stat) = proc_stat(child) {
            ticks += stat.all_ticks();
        }
    }
    Ok(ticks)
}

/// A throwaway PostgreSQL cluster run by the `postgres` user in a directory of its own
/// (also its socket directory: no TCP), autovacuum off, loaded for pgbench (scale 2), as
/// the services test's. Stopped and removed when dropped, whatever happened.
struct Cluster {
    dir: PathBuf,
    started: bool,
}

impl Cluster {
    fn start() -> Result<Cluster> {
        let dir = std::env::temp_dir().join(format!("tracer-bench-pg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).with_context(|| dir.display().to_string())?;
        let mut cluster = Cluster {
            dir,
            started: false,
        };
        let (uid, gid) = postgres_user()?;
        std::os::unix::fs::chown(&cluster.dir, Some(uid), Some(gid))?;
        std::fs::set_permissions(&cluster.dir, std::fs::Permissions::from_mode(0o700))?;
        let data = cluster.data();
        cluster.run(
            "initdb",
            &["-D", &data, "-A", "trust", "--no-sync", "-U", "postgres"],
        )?;
        // fsync off, as in the services test: the runs measure CPU time, which a flush
        // per commit would leave waiting on the disk.
        let options = format!(
            "-k {} -c listen_addresses='' -c autovacuum=off -c fsync=off",
            cluster.dir.display()
        );
        let log = cluster.log().display().to_string();
        // Set before the start: a start that fails half-way is still stopped.
        cluster.started = true;
        cluster.run(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-o", &options, "-w", "start"],
        )?;
        cluster.pgbench(&strings(&["-i", "-s", "2", "-q"]))?;
        Ok(cluster)
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn log(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// Runs PG_BIN/`program` `args` as the postgres user, in the cluster's directory (it
    /// may not enter the workspace); its stdout.
    fn run(&self, program: &str, args: &[&str]) -> Result<String> {
        let out = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(Path::new(PG_BIN).join(program))
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot run {program} as postgres with runuser"))?;
        if !out.status.success() {
            let log = std::fs::read_to_string(self.log()).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(3).collect();
            bail!(
                "{program} failed ({}): {}; server log: {}",
                out.status,
                error_lines(
                    &format!(
                        "{}{}",
                        String::from_utf8_lossy(&out.stderr),
                        String::from_utf8_lossy(&out.stdout)
                    ),
                    4
                ),
                tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn pgbench(&self, args: &[String]) -> Result<String> {
        let socket_dir = self.dir.display().to_string();
        let mut all = vec!["-h", &socket_dir];
        all.extend(args.iter().map(String::as_str));
        all.push("postgres");
        self.run("pgbench", &all)
    }

    /// Runs each of `commands` with psql, one transaction each (VACUUM needs its own).
    fn psql(&self, commands: &[&str]) -> Result<()> {
        let socket_dir = self.dir.display().to_string();
        let mut all = vec!["-h", &socket_dir, "-X", "-q", "-v", "ON_ERROR_STOP=1"];
        for command in commands {
            all.extend(["-c", *command]);
        }
        all.push("postgres");
        self.run("psql", &all).map(drop)
    }

    /// The postmaster's PID: the first line of postmaster.pid.
    fn postmaster(&self) -> Result<u32> {
        let path = self.dir.join("data/postmaster.pid");
        let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
        text.lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .with_context(|| format!("no PID in {}", path.display()))
    }

    fn pg_ctl_stop(&self, mode: &str) -> bool {
        Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(Path::new(PG_BIN).join("pg_ctl"))
            .args(["-D", &self.data(), "-m", mode, "-w", "stop"])
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.started && !self.pg_ctl_stop("fast") {
            self.pg_ctl_stop("immediate");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `postgres` user's uid and gid.
fn postgres_user() -> Result<(u32, u32)> {
    // SAFETY: getpwnam's argument is a NUL-terminated string; the result is read at once,
    // before any other call that could reuse its buffer.
    unsafe {
        let pw = libc::getpwnam(c"postgres".as_ptr());
        if pw.is_null() {
            bail!(
                "no postgres user: PostgreSQL 15 is not installed (cargo xtask setup installs it)"
            );
        }
        Ok(((*pw).pw_uid, (*pw).pw_gid))
    }
}

/// A directory removed when dropped: the tools' output, whatever happened.
struct RemovedOnDrop(PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgbench_output_gives_transactions_and_tps() {
        let out = "transaction type: <builtin: TPC-B (sort of)>\n\
                   scaling factor: 2\n\
                   number of clients: 8\n\
                   number of transactions actually processed: 41234\n\
                   number of failed transactions: 0 (0.000%)\n\
                   latency average = 3.881 ms\n\
                   initial connection time = 11.262 ms\n\
                   tps = 2061.327459 (without initial connection time)\n";
        assert_eq!(parse_pgbench(out).unwrap(), (41234, 2061.327459));
        assert!(parse_pgbench("tps = 12.0 (without initial connection time)\n").is_err());
        assert!(
            parse_pgbench("number of transactions actually processed: 0\ntps = 0.0\n").is_err()
        );
    }

    #[test]
    fn proc_stat_gives_state_and_cpu_ticks() {
        let text = "4242 (postgres: a) b) S 1 4242 4242 0 -1 4194560 512 0 0 0 \
                    70 30 9 1 20 0 1 0 100 200000000 3000 18446744073709551615";
        let stat = ProcStat::parse(text).unwrap();
        assert_eq!(
            stat,
            ProcStat {
                state: 'S',
                own_ticks: 100,
                children_ticks: 10
            }
        );
        assert_eq!(stat.all_ticks(), 110);
        assert!(ProcStat::parse("4242 (short) S 1 2").is_none());
    }

    #[test]
    fn the_bpftrace_script_announces_its_attach() {
        assert!(bpftrace_offcpu_postgres().contains(BPFTRACE_ATTACHED));
    }
}
