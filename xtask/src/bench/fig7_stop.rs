//! Figure 7: Ctrl-C to exit. Each mode is started on a busy target, left to collect for a
//! second after it says it attached, then sent SIGINT; the figure is the time from the
//! signal to the tool's exit (wait4 returning), report written included. The target is the
//! ping-pong (two threads switching ~50k times a second: every switch is traced) or, for
//! `trace`, the USDT loop (a probe hit every 100 µs). bpftrace's off-CPU script on the same
//! ping-pong is the baseline (its median: bpftrace
//! sometimes misses a SIGINT and waits for a second one, 30 s later). A stop that waits on the kernel (uprobe removal, grace periods)
//! shows here; it once held the exit of `attach` on a busy PostgreSQL for 2.5 s.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::{
    Config, Row,
    fig3_offcpu_pingpong::BPFTRACE_OFFCPU,
    harness::{BPFTRACE_ATTACHED, Stream, Tool, bin, error_lines, ready_pid},
    stats::{median, min_max},
    yes_no,
};

/// Collection time before the signal: enough for maps, rings and stacks to fill.
const COLLECT: Duration = Duration::from_secs(1);
/// The goal: every mode exits within this after Ctrl-C.
const GOAL_S: f64 = 0.5;

struct Mode {
    label: &'static str,
    /// `None`: bpftrace (the baseline).
    tracer_args: Option<&'static [&'static str]>,
    /// The target is the USDT loop instead of the ping-pong.
    usdt_target: bool,
}

const MODES: &[Mode] = &[
    Mode {
        label: "tracer attach --pid",
        tracer_args: Some(&["attach", "--pid", "{pid}"]),
        usdt_target: false,
    },
    Mode {
        label: "tracer attach --unwind fp",
        tracer_args: Some(&["attach", "--unwind", "fp", "--pid", "{pid}"]),
        usdt_target: false,
    },
    Mode {
        label: "tracer profile --pid",
        tracer_args: Some(&["profile", "--pid", "{pid}"]),
        usdt_target: false,
    },
    Mode {
        label: "tracer profile (system-wide)",
        tracer_args: Some(&["profile"]),
        usdt_target: false,
    },
    Mode {
        label: "tracer trace --pid",
        tracer_args: Some(&["trace", "--pid", "{pid}", "{probe}"]),
        usdt_target: true,
    },
    Mode {
        label: "bpftrace off-CPU stacks",
        tracer_args: None,
        usdt_target: false,
    },
];

pub(super) fn measure(config: &Config) -> Result<Vec<Row>> {
    let out_dir = std::env::temp_dir().join(format!("tracer-bench-stop-{}", std::process::id()));
    let mut seconds: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
    for round in 0..config.rounds {
        for k in 0..MODES.len() {
            let which = (k + round) % MODES.len();
            seconds[which].push(stop_time(&MODES[which], &out_dir)?);
        }
    }
    let _ = std::fs::remove_dir_all(&out_dir);
    println!(
        "SIGINT after {COLLECT:?} of collection on a busy target, to exit; {} rounds",
        config.rounds
    );
    let mut worst_tracer: Option<(f64, &str)> = None;
    let mut bpftrace = (f64::NAN, f64::NAN);
    for (mode, runs) in MODES.iter().zip(&seconds) {
        let (_, worst) = min_max(runs);
        let list: Vec<String> = runs.iter().map(|s| format!("{s:.2}")).collect();
        println!(
            "  {:<30} worst {worst:.2} s (runs {})",
            mode.label,
            list.join(", ")
        );
        if mode.tracer_args.is_none() {
            bpftrace = (median(runs), worst);
        } else if worst_tracer.is_none_or(|(w, _)| worst > w) {
            worst_tracer = Some((worst, mode.label));
        }
    }
    let (worst, label) = worst_tracer.context("no tracer mode measured")?;
    Ok(vec![Row {
        figure: "7. Ctrl-C to exit, worst mode".into(),
        tracer: format!("{worst:.2} s ({label})"),
        baselines: format!(
            "bpftrace median {:.2} s, worst {:.2} s",
            bpftrace.0, bpftrace.1
        ),
        ratio: format!("{:.2}x of bpftrace's median", worst / bpftrace.0),
        goal: format!("< {GOAL_S} s in every mode"),
        met: yes_no(worst < GOAL_S),
    }])
}

/// Starts `mode` on a fresh target and returns the seconds from SIGINT to its exit.
fn stop_time(mode: &Mode, out_dir: &Path) -> Result<f64> {
    let loop_bin = bin("bench-usdt-loop");
    let mut target = if mode.usdt_target {
        Tool::spawn(
            Command::new(&loop_bin).args(["--forever", "--interval-us", "100"]),
            "bench-usdt-loop",
        )?
    } else {
        Tool::spawn(
            Command::new(bin("pingpong")).args(["--round-trips", "1000000000"]),
            "pingpong",
        )?
    };
    let pid = ready_pid(&mut target)?.to_string();
    let probe = format!("usdt:{}:tracer:gc__begin", loop_bin.display());
    let (mut cmd, name, ready) = if let Some(args) = mode.tracer_args {
        let mut cmd = Command::new(bin("tracer"));
        for arg in args {
            cmd.arg(arg.replace("{pid}", &pid).replace("{probe}", &probe));
        }
        if !mode.usdt_target {
            cmd.arg("-o").arg(out_dir);
        }
        (cmd, "tracer", (Stream::Stderr, "Attached"))
    } else {
        let mut cmd = Command::new("bpftrace");
        cmd.args(["-e", BPFTRACE_OFFCPU, &pid]);
        (cmd, "bpftrace", (Stream::Stdout, BPFTRACE_ATTACHED))
    };
    let mut tool = Tool::spawn(&mut cmd, name)?;
    tool.wait_line(ready.0, Duration::from_secs(30), |l| l.starts_with(ready.1))
        .with_context(|| format!("{} did not attach", mode.label))?;
    std::thread::sleep(COLLECT);
    let signalled = Instant::now();
    tool.interrupt();
    let finished = tool.finish(Duration::from_secs(30))?;
    let elapsed = signalled.elapsed().as_secs_f64();
    target.kill();
    if !finished.success {
        bail!(
            "{} failed at Ctrl-C: {}",
            mode.label,
            error_lines(&finished.stderr, 5)
        );
    }
    // What it collected must be written: a stop that drops its report is no stop. stdout
    // holds tracer's report alone (it says "Attached" on stderr); bpftrace's also holds its
    // ready line, so its report is its map of blocked time.
    let wrote = match mode.tracer_args {
        Some(_) => !finished.stdout.trim().is_empty(),
        None => finished.stdout.contains("@off["),
    };
    if !wrote {
        bail!("{} wrote nothing at Ctrl-C", mode.label);
    }
    Ok(elapsed)
}
