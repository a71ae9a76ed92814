//! `cargo xtask bench`: the figures of issues 6 and 15, each next to its baseline measured in
//! the same run, as medians of alternating runs (the machines this runs on are noisy).
//! One file per figure says what it measures and how:
//!
//! 1. [`fig1_disabled_probe`]: a disabled `probes` probe against no probe at all.
//! 2. [`fig2_event_cost`]: cost per traced USDT event, against bpftrace and a bare trap.
//! 3. [`fig3_offcpu_pingpong`]: throughput loss of a ping-pong under off-CPU tracing.
//! 4. [`fig4_launch_to_first_event`]: launch to first event, against bpftrace.
//! 5. [`fig5_render_profile`]: symbolize + fold + render a profile, against inferno.
//! 6. [`fig6_peak_memory`]: peak RSS of the tracer runs of figures 2-4, against bpftrace's.
//! 7. [`fig7_stop`]: Ctrl-C to exit in each mode on a busy target, against bpftrace.
//! 8. [`fig8_python_frames`]: a Python target's throughput and the eBPF programs' time with
//!    Python frames on and off, against py-spy.
//! 9. [`fig9_function_probes`]: what function probes cost, per hit and to GC-heavy programs.
//! 10. [`fig10_postgres_cost`]: the tracer's own CPU time per PostgreSQL transaction under
//!     pgbench, and the cluster's, against bpftrace and perf.
//! 11. [`fig11_agent`]: the always-on agent (`--metrics`, `--profile-every`) on a service
//!     that churns processes: its CPU share and memory over the run, and a scrape's cost.
//!
//! [`harness`] starts, times and stops the targets and tools; [`stats`] reduces the runs.
//!
//! Needs root. tracefs is mounted for bpftrace if it is not (and unmounted afterwards).

mod fig10_postgres_cost;
mod fig11_agent;
mod fig1_disabled_probe;
mod fig2_event_cost;
mod fig3_offcpu_pingpong;
mod fig4_launch_to_first_event;
mod fig5_render_profile;
mod fig6_peak_memory;
mod fig7_stop;
mod fig8_python_frames;
mod fig9_function_probes;
mod harness;
mod stats;

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};

use fig6_peak_memory::PeakMemory;
use harness::{TracefsMount, load_average};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Fewer iterations, rounds and stacks: about a minute instead of a few.
    #[arg(long)]
    quick: bool,
    /// Rounds of alternating runs in figures 2-4 and 7-10 [default: 5; --quick: 3].
    #[arg(long)]
    rounds: Option<usize>,
    /// Only these figures (1-11, comma-separated); 6 uses the tracer runs of 2-4.
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
    /// Seconds of each run of the Python workload, figure 8 [default: 3; --quick: 2].
    #[arg(long)]
    python_seconds: Option<f64>,
    /// Seconds of each pgbench run, figure 10 [default: 20; --quick: 8].
    #[arg(long)]
    pgbench_seconds: Option<u64>,
    /// Seconds of the agent's run, figure 11 [default: 600; --quick: 60].
    #[arg(long)]
    agent_seconds: Option<u64>,
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
    python_seconds: f64,
    pgbench_seconds: u64,
    agent_seconds: u64,
    figures: Vec<u8>,
}

impl Config {
    fn new(args: BenchArgs) -> Result<Self> {
        let quick = args.quick;
        let pick = |value: Option<u64>, full: u64, fast: u64| {
            value.unwrap_or(if quick { fast } else { full })
        };
        let figures = if args.only.is_empty() {
            (1..=11).collect()
        } else {
            args.only
        };
        if let Some(bad) = figures.iter().find(|f| !(1..=11).contains(*f)) {
            bail!("no figure {bad}: figures are 1 to 11");
        }
        let rounds = args.rounds.unwrap_or(if quick { 3 } else { 5 });
        if rounds == 0 {
            bail!("--rounds must be at least 1");
        }
        let python_seconds = args.python_seconds.unwrap_or(if quick { 2.0 } else { 3.0 });
        if python_seconds.is_nan() || python_seconds <= 0.0 {
            bail!("--python-seconds must be more than 0");
        }
        let pgbench_seconds = pick(args.pgbench_seconds, 20, 8);
        if pgbench_seconds == 0 {
            bail!("--pgbench-seconds must be at least 1");
        }
        let agent_seconds = pick(args.agent_seconds, 600, 60);
        if agent_seconds < 10 {
            bail!("--agent-seconds must be at least 10");
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
            python_seconds,
            pgbench_seconds,
            agent_seconds,
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

pub fn run(args: BenchArgs) -> Result<()> {
    let config = Config::new(args)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("cargo xtask bench loads eBPF programs: run it as root");
    }
    crate::build()?;
    // bpftrace's tracepoints, and perf's in figure 10.
    let needs_tracefs = [2, 3, 4, 7, 10].iter().any(|&f| config.wants(f));
    let _tracefs = if needs_tracefs {
        Some(TracefsMount::ensure()?)
    } else {
        None
    };
    let started = Instant::now();
    let load_before = load_average();
    println!("load average before: {load_before} (other work on the machine skews every figure)");
    let mut rows = Vec::new();
    let mut memory = PeakMemory::default();
    let figures: [(u8, &str); 11] = [
        (1, "disabled probe vs no probe"),
        (2, "cost per traced USDT event"),
        (3, "off-CPU tracing of a ping-pong"),
        (4, "launch to first event"),
        (5, "symbolize + render a profile"),
        (6, "peak memory while tracing"),
        (7, "Ctrl-C to exit"),
        (8, "the cost of Python frames"),
        (9, "what function probes cost"),
        (10, "the tracer's own cost on PostgreSQL"),
        (11, "the always-on agent on a churning service"),
    ];
    for (figure, title) in figures {
        if !config.wants(figure) {
            continue;
        }
        println!("\n== Figure {figure}: {title}");
        let result = match figure {
            1 => fig1_disabled_probe::measure(&config),
            2 => fig2_event_cost::measure(&config, &mut memory),
            3 => fig3_offcpu_pingpong::measure(&config, &mut memory),
            4 => fig4_launch_to_first_event::measure(&config, &mut memory),
            5 => fig5_render_profile::measure(&config),
            // Figure 6 reports the tracer runs of figures 2-4, so it comes after them.
            6 => Ok(vec![fig6_peak_memory::measure(&memory)]),
            7 => fig7_stop::measure(&config),
            8 => fig8_python_frames::measure(&config),
            9 => fig9_function_probes::measure(&config),
            10 => fig10_postgres_cost::measure(&config),
            _ => fig11_agent::measure(&config),
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
    print_summary(&rows, started.elapsed());
    println!(
        "load average before: {load_before}; after: {}",
        load_average()
    );
    Ok(())
}

fn yes_no(ok: bool) -> String {
    if ok { "yes".into() } else { "NO".into() }
}

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
