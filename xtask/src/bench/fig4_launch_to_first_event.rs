//! Figure 4: launch to first event. t0 = CLOCK_MONOTONIC just before spawning the tool;
//! the target fires `tracer:gc__begin` every 100 µs; the figure is the first event's
//! timestamp (bpf_ktime_get_ns, the same clock) minus t0: for `tracer attach` the earliest
//! `first_hit_monotonic_ns` of its JSON report, for `tracer trace` the first event's
//! `time_ns`, for bpftrace the `nsecs` its first event prints. With `TRACER_BASELINE` set
//! to another build of tracer (the one before a change), its `attach` and `trace` are
//! measured in the same rounds, to judge the change against it.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{Context as _, Result};
use serde_json::Value;

use super::{
    Config, PeakMemory, Row,
    harness::{Stream, Tool, bin, json_lines, monotonic_ns, ready_pid},
    stats::{list_ms, median},
    yes_no,
};

/// The tools figure 4 starts, in the order of the first round (later rounds rotate it).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Launcher {
    TracerAttach,
    TracerTrace,
    Bpftrace,
    BaselineAttach,
    BaselineTrace,
}

pub(super) fn measure(config: &Config, memory: &mut PeakMemory) -> Result<Vec<Row>> {
    let loop_bin = bin("bench-usdt-loop");
    let probe = format!("usdt:{}:tracer:gc__begin", loop_bin.display());
    let out_dir = std::env::temp_dir().join(format!("tracer-bench-launch-{}", std::process::id()));
    let baseline = std::env::var_os("TRACER_BASELINE").map(std::path::PathBuf::from);
    let mut launchers = vec![
        Launcher::TracerAttach,
        Launcher::TracerTrace,
        Launcher::Bpftrace,
    ];
    if baseline.is_some() {
        launchers.extend([Launcher::BaselineAttach, Launcher::BaselineTrace]);
    }
    let mut ms: Vec<Vec<f64>> = vec![Vec::new(); launchers.len()];
    for round in 0..config.rounds {
        for k in 0..launchers.len() {
            let which = (k + round) % launchers.len();
            let mut target = Tool::spawn(
                Command::new(&loop_bin).args(["--forever", "--interval-us", "100"]),
                "bench-usdt-loop",
            )?;
            let pid = ready_pid(&mut target)?.to_string();
            let t0 = monotonic_ns();
            let first = launch_to_first_event(
                launchers[which],
                baseline.as_deref(),
                &pid,
                &probe,
                &out_dir,
                memory,
            );
            target.kill();
            ms[which].push(first?.saturating_sub(t0) as f64 / 1e6);
        }
    }
    let _ = std::fs::remove_dir_all(&out_dir);
    let [attach, trace, bpftrace] = [0, 1, 2].map(|i| median(&ms[i]));
    if let Some(path) = &baseline {
        let [old_attach, old_trace] = [3, 4].map(|i| median(&ms[i]));
        println!(
            "  baseline {}: attach median {old_attach:.1} ms (runs {}), trace {old_trace:.1} ms (runs {}); this build: attach {:+.0}%, trace {:+.0}%",
            path.display(),
            list_ms(&ms[3]),
            list_ms(&ms[4]),
            (attach / old_attach - 1.0) * 100.0,
            (trace / old_trace - 1.0) * 100.0
        );
    }
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
    baseline: Option<&Path>,
    pid: &str,
    probe: &str,
    out_dir: &Path,
    memory: &mut PeakMemory,
) -> Result<u64> {
    let tracer = match launcher {
        Launcher::BaselineAttach | Launcher::BaselineTrace => {
            baseline.context("no baseline")?.to_path_buf()
        }
        _ => bin("tracer"),
    };
    let (mut cmd, name, what) = match launcher {
        Launcher::TracerAttach | Launcher::BaselineAttach => {
            let mut cmd = Command::new(&tracer);
            cmd.args(["attach", "--pid", pid, "--format", "json", "-o"])
                .arg(out_dir);
            (cmd, "tracer", "attach (launch)")
        }
        Launcher::TracerTrace | Launcher::BaselineTrace => {
            let mut cmd = Command::new(&tracer);
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
        Launcher::TracerAttach | Launcher::BaselineAttach => tool
            .wait_line(Stream::Stderr, timeout, |l| l.starts_with("Attached"))
            .map(|_| std::thread::sleep(Duration::from_millis(20))),
        Launcher::TracerTrace | Launcher::BaselineTrace => tool
            .wait_line(Stream::Stdout, timeout, |l| {
                serde_json::from_str::<Value>(l).is_ok_and(|event| event["time_ns"].is_u64())
            })
            .map(|_| ()),
        Launcher::Bpftrace => tool
            .wait_line(Stream::Stdout, timeout, |l| l.starts_with("first "))
            .map(|_| ()),
    };
    tool.interrupt();
    let finished = tool.finish(Duration::from_secs(10));
    first?;
    let finished = finished?;
    // The baseline build's memory is not this build's (figure 6).
    if !matches!(launcher, Launcher::BaselineAttach | Launcher::BaselineTrace) {
        memory.note(name, what, finished.max_rss_kib);
    }
    match launcher {
        // attach reports when each probe first fired; the earliest is its first event.
        // Its stdout is the report, one pretty-printed JSON object; probes not hit have null.
        Launcher::TracerAttach | Launcher::BaselineAttach => {
            let report: Value = serde_json::from_str(&finished.stdout)
                .with_context(|| format!("tracer attach's report: {}", finished.stdout))?;
            report["probes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|probe| probe["first_hit_monotonic_ns"].as_u64())
                .min()
                .with_context(|| format!("no probe hit in {}", finished.stdout))
        }
        Launcher::TracerTrace | Launcher::BaselineTrace => json_lines(&finished.stdout)
            .find_map(|event| event["time_ns"].as_u64())
            .with_context(|| format!("no event in {}", finished.stdout)),
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
