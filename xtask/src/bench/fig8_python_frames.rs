//! Figure 8: the cost of Python frames. `tests/python/bench_workload.py` runs on pyenv's
//! CPython 3.12 for a fixed time: four threads that block and wake often, each from 20
//! nested Python calls, count the descents they complete. It runs untraced, under
//! `tracer profile --pid` (Python frames on, the default), under the same with
//! `--no-python-frames`, and under py-spy `record --idle -r 100`, the peer that names
//! Python frames from outside the process (the tracer samples at its default 99 Hz). Each
//! round runs every kind once, in an order that rotates from round to round. A tool's
//! throughput is a ratio to the same round's untraced run; the figure shows the median
//! over the rounds, with the lowest and the highest.
//!
//! The eBPF programs' own time per run (`kernel.bpf_stats_enabled`, read from the
//! tracer's `/proc/PID/fdinfo` while the target runs, as in figure 3) is shown for
//! `sched_switch_dwarf` and `oncpu_sample_dwarf`, with frames on and off. The first runs
//! at every context switch on any CPU and walks the frame chain of a Python thread that
//! leaves its CPU; its time per run also averages in the machine's other switches, which
//! it leaves early. The second runs at every on-CPU sample. The ratio of frames on to off
//! is what walking the frames costs in the kernel. The two are told apart by what the
//! tracer holds: a link that names the `sched_switch` tracepoint, and the only perf-event
//! program.
//!
//! py-spy is installed with pip in a venv of its own on first use; when that fails, the
//! figure shows py-spy as not run, with the reason.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::{
    Config, Row,
    harness::{
        BpfStats, ProgramStats, Stream, ToolSpec, bin, first_lines, json_u64, last_json_line,
        strings, traced_run,
    },
    stats::{median, min_max},
    yes_no,
};

/// The interpreter: a pyenv build, which every machine of this project's kind has.
const PYTHON_VERSION: &str = "3.12.1";
const PY_SPY_VERSION: &str = "0.4.3";
/// BPF_PROG_TYPE_PERF_EVENT of the kernel's `enum bpf_prog_type`, as fdinfo shows it.
const PROG_TYPE_PERF_EVENT: u64 = 7;
/// The programs of the figure, in the order of [`Named`] and [`Costs`].
const PROGRAMS: [&str; 2] = ["sched_switch_dwarf", "oncpu_sample_dwarf"];
const SCHED_SWITCH: usize = 0;
const ONCPU_SAMPLE: usize = 1;
/// The kinds of run: the untraced one, then one per tool.
const UNTRACED: usize = 0;
const FRAMES_ON: usize = 1;
const FRAMES_OFF: usize = 2;
const PY_SPY: usize = 3;

pub(super) fn measure(config: &Config) -> Result<Vec<Row>> {
    let python = python()?;
    let script = crate::workspace_root().join("tests/python/bench_workload.py");
    let out_dir = std::env::temp_dir().join(format!("tracer-bench-python-{}", std::process::id()));
    let profile_dir = out_dir.join("profile");
    let folded = profile_dir.join("wallclock.folded");
    let py_spy_file = out_dir.join("py-spy.txt");
    std::fs::create_dir_all(&out_dir)?;
    let profile = |label, extra: &[&str]| {
        let mut args = strings(&["profile", "--pid", "{pid}", "-o"]);
        args.push(profile_dir.display().to_string());
        args.extend(strings(extra));
        ToolSpec {
            tool: "tracer",
            label,
            program: bin("tracer"),
            args,
            ready: (Stream::Stderr, "Attached"),
            stops_with_target: true,
        }
    };
    let mut tools = vec![
        profile("tracer profile --pid", &[]),
        profile("tracer --no-python-frames", &["--no-python-frames"]),
    ];
    let py_spy = py_spy();
    if let Ok(program) = &py_spy {
        let mut args = strings(&["record", "--idle", "-r", "100", "-p", "{pid}", "-f", "raw"]);
        args.extend(["-o".to_string(), py_spy_file.display().to_string()]);
        tools.push(ToolSpec {
            tool: "py-spy",
            label: "py-spy record --idle -r 100",
            program: program.clone(),
            args,
            ready: (Stream::Stdout, "py-spy> Sampling process"),
            stops_with_target: true,
        });
    }
    let _stats = BpfStats::enable()?;
    let seconds = config.python_seconds;
    let mut target_args = vec![script.display().to_string()];
    target_args.extend(strings(&[
        "--seconds",
        &seconds.to_string(),
        "--wait-for-signal",
    ]));
    let kinds = tools.len() + 1;
    // Per round and kind: the target's result line (its operations and time).
    let mut results: Vec<Vec<Option<Value>>> = vec![vec![None; kinds]; config.rounds];
    let mut costs: Vec<Vec<Costs>> = vec![Vec::new(); kinds];
    let mut failures: Vec<Option<String>> = vec![None; kinds];
    for (round, results) in results.iter_mut().enumerate() {
        for k in 0..kinds {
            let kind = (k + round) % kinds;
            if failures[kind].is_some() {
                continue;
            }
            let tool = kind.checked_sub(1).map(|t| &tools[t]);
            // What a run writes is checked below: what an earlier run left must not pass.
            let written = if kind == PY_SPY {
                &py_spy_file
            } else {
                &folded
            };
            let _ = std::fs::remove_file(written);
            let (run, named) = naming_programs(|| traced_run(&python, &target_args, tool));
            let run = match run {
                Ok(run) => run,
                Err(err) => {
                    failures[kind] = Some(first_lines(&format!("{err:#}"), 3));
                    continue;
                }
            };
            results[kind] = Some(last_json_line(&run.target)?);
            if kind == UNTRACED {
                continue;
            }
            if kind != PY_SPY {
                costs[kind].push(named.costs(&run.programs));
            }
            // A tool that named no Python frame, or a tracer that named them with frames
            // off, does not measure what its row says.
            let has_frames = names_the_script(written);
            if has_frames != (kind != FRAMES_OFF) {
                let has = if has_frames { "has" } else { "has no" };
                failures[kind] = Some(format!("its profile {has} Python frames"));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&out_dir);

    // Ops (or `key`) per second of a run.
    let rate = |result: &Option<Value>, key: &str| -> Option<f64> {
        let result = result.as_ref()?;
        let ops = json_u64(result, key).ok()? as f64;
        Some(ops / (json_u64(result, "ns").ok()? as f64 / 1e9))
    };
    // A kind's ops per second, one per run.
    let rates = |kind: usize| -> Vec<f64> {
        results
            .iter()
            .filter_map(|round| rate(&round[kind], "ops"))
            .collect()
    };
    let untraced = rates(UNTRACED);
    if untraced.is_empty() {
        bail!(
            "the untraced runs failed: {}",
            failures[UNTRACED].clone().unwrap_or_default()
        );
    }
    // A kind's ratios to the untraced run of the same round, one per round.
    let ratios = |kind: usize, key: &str| -> Vec<f64> {
        results
            .iter()
            .filter_map(|round| Some(rate(&round[kind], key)? / rate(&round[UNTRACED], key)?))
            .collect()
    };
    // A kind past the tools measured (py-spy when it is not installed) has no ratio.
    let ratio = |kind: usize| {
        let measured = failures.get(kind).is_some_and(Option::is_none);
        let runs = if measured {
            ratios(kind, "ops")
        } else {
            Vec::new()
        };
        (!runs.is_empty()).then(|| median(&runs))
    };
    println!(
        "{seconds} s per run, {} rounds, CPython {PYTHON_VERSION}; ops: the 20-deep Python \
         descents completed by the target's four threads",
        config.rounds
    );
    println!(
        "  {:<30} {:>10} {:>12} {:>13} {:>10}",
        "", "ops/s", "vs untraced", "range", "ping-pong"
    );
    println!(
        "  {:<30} {:>10.0} {:>12} {:>13} {:>10}",
        "untraced",
        median(&untraced),
        "-",
        "-",
        "-"
    );
    for (t, tool) in tools.iter().enumerate() {
        let kind = t + 1;
        if let Some(err) = &failures[kind] {
            println!("  {:<30} n/a: {err}", tool.label);
            continue;
        }
        let runs = ratios(kind, "ops");
        let (lo, hi) = min_max(&runs);
        println!(
            "  {:<30} {:>10.0} {:>11.3}x {:>13} {:>9.3}x",
            tool.label,
            median(&rates(kind)),
            median(&runs),
            format!("{lo:.3}..{hi:.3}"),
            median(&ratios(kind, "ping")),
        );
    }
    if let Err(err) = &py_spy {
        println!("  {:<30} not run: {err:#}", "py-spy record --idle -r 100");
    }
    println!(
        "  ops/s: median of the runs; vs untraced: ops/s over the same round's untraced run's, \
         median of the rounds (range: lowest..highest); ping-pong: the same for the queue \
         ping-pong's round trips"
    );

    println!("  eBPF programs' time per run (bpf_stats), median of the runs:");
    println!(
        "  {:<30} {:>12} {:>12} {:>8}",
        "", "frames on", "frames off", "on/off"
    );
    let per_run = |kind: usize, program: usize| {
        let values: Vec<f64> = costs[kind].iter().filter_map(|c| c[program]).collect();
        (failures[kind].is_none() && !values.is_empty()).then(|| median(&values))
    };
    let ns = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.0} ns"));
    let times = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.2}x"));
    let (mut on_cells, mut off_cells, mut ratio_cells) = (Vec::new(), Vec::new(), Vec::new());
    for (program, name) in PROGRAMS.iter().enumerate() {
        let (on, off) = (per_run(FRAMES_ON, program), per_run(FRAMES_OFF, program));
        let on_off = on.zip(off).map(|(on, off)| on / off);
        println!(
            "  {name:<30} {:>12} {:>12} {:>8}",
            ns(on),
            ns(off),
            times(on_off)
        );
        // The summary's cells are narrow: "sched_switch" for "sched_switch_dwarf".
        let short = name.strip_suffix("_dwarf").unwrap_or(name);
        on_cells.push(format!("{short} {}", ns(on)));
        off_cells.push(format!("{short} {}", ns(off)));
        ratio_cells.push(format!("{short} {}", times(on_off)));
    }

    let (Some(on), Some(off)) = (ratio(FRAMES_ON), ratio(FRAMES_OFF)) else {
        let kind = if ratio(FRAMES_ON).is_some() {
            FRAMES_OFF
        } else {
            FRAMES_ON
        };
        bail!(
            "{} failed: {}",
            tools[kind - 1].label,
            failures[kind].clone().unwrap_or_else(|| "no runs".into())
        );
    };
    let py_spy_ratio = ratio(PY_SPY);
    let py_spy_cell = match (&py_spy, py_spy_ratio) {
        (_, Some(r)) => format!("py-spy {r:.3}x"),
        (Err(_), _) => "py-spy not run".into(),
        (Ok(_), None) => "py-spy failed".into(),
    };
    Ok(vec![
        Row {
            figure: "8. Python frames, throughput".into(),
            tracer: format!("{on:.3}x of untraced"),
            baselines: format!("--no-python-frames {off:.3}x; {py_spy_cell}"),
            ratio: format!("{:.3}x of --no-python-frames", on / off),
            goal: ">= py-spy's".into(),
            met: py_spy_ratio.map_or("?".into(), |p| yes_no(on >= p)),
        },
        Row {
            figure: "8b. Python frames, BPF time per run".into(),
            tracer: on_cells.join(", "),
            baselines: format!("--no-python-frames: {}", off_cells.join(", ")),
            ratio: ratio_cells.join(", "),
            goal: "-".into(),
            met: "-".into(),
        },
    ])
}

/// pyenv's build of [`PYTHON_VERSION`].
fn python() -> Result<PathBuf> {
    let root = std::env::var_os("PYENV_ROOT").map_or_else(|| "/root/.pyenv".into(), PathBuf::from);
    let minor: Vec<&str> = PYTHON_VERSION.splitn(3, '.').take(2).collect();
    let path = root
        .join("versions")
        .join(PYTHON_VERSION)
        .join("bin")
        .join(format!("python{}", minor.join(".")));
    if !path.is_file() {
        bail!(
            "{} is missing: figure 8 runs on pyenv's CPython {PYTHON_VERSION}, which the \
             machines this project runs on have",
            path.display()
        );
    }
    Ok(path)
}

/// py-spy from its venv in `~/.cache/tracer/py-spy`, which is made and filled with pip
/// when it is not there.
fn py_spy() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
    let venv = home.join(".cache/tracer/py-spy");
    let program = venv.join("bin/py-spy");
    let works = |program: &Path| {
        Command::new(program)
            .arg("--version")
            .output()
            .is_ok_and(|out| {
                out.status.success()
                    && String::from_utf8_lossy(&out.stdout).trim()
                        == format!("py-spy {PY_SPY_VERSION}")
            })
    };
    if works(&program) {
        return Ok(program);
    }
    eprintln!(
        "xtask bench: installing py-spy {PY_SPY_VERSION} with pip in a venv, {}",
        venv.display()
    );
    crate::run(
        Command::new("/usr/bin/python3")
            .args(["-m", "venv"])
            .arg(&venv),
    )
    .context("making py-spy's venv failed")?;
    crate::run(
        Command::new(venv.join("bin/pip"))
            .args(["install", "-q"])
            .arg(format!("py-spy=={PY_SPY_VERSION}")),
    )
    .context("installing py-spy with pip failed")?;
    if !works(&program) {
        bail!(
            "{} does not run as py-spy {PY_SPY_VERSION}",
            program.display()
        );
    }
    Ok(program)
}

/// Whether `file` (folded stacks, from the tracer or py-spy) has a frame of the workload.
fn names_the_script(file: &Path) -> bool {
    std::fs::read_to_string(file).is_ok_and(|text| text.contains("(bench_workload.py:"))
}

/// Time per run of each of [`PROGRAMS`], in ns; `None` without stats.
type Costs = [Option<f64>; 2];

/// The ids of [`PROGRAMS`] in the tool that ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Named([Option<u32>; 2]);

impl Named {
    fn costs(&self, programs: &[ProgramStats]) -> Costs {
        self.0.map(|id| {
            let program = programs.iter().find(|p| Some(p.id) == id)?;
            (program.run_cnt > 0 && program.run_time_ns > 0)
                .then(|| program.run_time_ns as f64 / program.run_cnt as f64)
        })
    }

    /// Adds what one file of `/proc/PID/fdinfo` says: a link to the `sched_switch`
    /// tracepoint names its program, and a perf-event program is the sampler.
    fn note(&mut self, fdinfo: &str) {
        let field = |name: &str| {
            fdinfo
                .lines()
                .find_map(|l| Some(l.strip_prefix(name)?.trim()))
        };
        let Some(id) = field("prog_id:").and_then(|v| v.parse::<u32>().ok()) else {
            return;
        };
        let is_link = field("link_type:").is_some();
        if is_link && field("tp_name:") == Some("sched_switch") {
            self.0[SCHED_SWITCH] = Some(id);
        }
        let prog_type = field("prog_type:").and_then(|v| v.parse::<u64>().ok());
        if !is_link && prog_type == Some(PROG_TYPE_PERF_EVENT) {
            self.0[ONCPU_SAMPLE] = Some(id);
        }
    }

    fn complete(&self) -> bool {
        self.0.iter().all(Option::is_some)
    }
}

/// Runs `run` while reading the fdinfo of this process's children (the target and the
/// tool it starts) to learn which of their eBPF programs are which. The ids are read
/// while the tool runs: its programs go when it exits.
fn naming_programs<T>(run: impl FnOnce() -> T) -> (T, Named) {
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let mut named = Named::default();
            while !done.load(Ordering::Relaxed) && !named.complete() {
                for pid in children() {
                    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
                        continue;
                    };
                    for fd in fds.flatten() {
                        if let Ok(text) = std::fs::read_to_string(fd.path()) {
                            named.note(&text);
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            named
        });
        let result = run();
        done.store(true, Ordering::Relaxed);
        (result, watcher.join().unwrap_or_default())
    })
}

/// The children of every thread of this process.
fn children() -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|pid| pid.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_named_by_their_link_and_type() {
        let mut named = Named::default();
        named.note("prog_type:\t7\nprog_jited:\t1\nprog_id:\t597\nrun_time_ns:\t93\nrun_cnt:\t7\n");
        named.note("prog_type:\t26\nprog_id:\t596\nrun_time_ns:\t115\nrun_cnt:\t9\n");
        named.note("prog_type:\t26\nprog_id:\t598\nrun_time_ns:\t6\nrun_cnt:\t2\n");
        named.note("link_type:\tperf\nlink_id:\t627\nprog_id:\t597\ntype:\t6\n");
        assert!(!named.complete());
        named.note(
            "link_type:\traw_tracepoint\nlink_id:\t626\nprog_id:\t596\ntp_name:\tsched_switch\n",
        );
        assert_eq!(named, Named([Some(596), Some(597)]));
        let programs = [
            ProgramStats {
                id: 596,
                run_cnt: 4,
                run_time_ns: 4000,
            },
            ProgramStats {
                id: 597,
                run_cnt: 0,
                run_time_ns: 0,
            },
        ];
        assert_eq!(named.costs(&programs), [Some(1000.0), None]);
    }
}
