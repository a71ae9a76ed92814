//! Figure 3: throughput loss of `pingpong` (two threads, one byte through two pipes, N
//! round trips) under `tracer attach --pid` (off-CPU with user+kernel stacks), under a
//! bpftrace `sched_switch` script doing the same accounting, and BCC's offcputime (when it
//! runs).

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use anyhow::{Result, bail};
use serde_json::Value;

use super::{
    Config, PeakMemory, Row,
    harness::{
        BPFTRACE_ATTACHED, Stream, ToolSpec, bin, first_lines, json_u64, last_json_line, strings,
        traced_run, which,
    },
    stats::{median, min_max},
    yes_no,
};

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

pub(super) fn measure(config: &Config, memory: &mut PeakMemory) -> Result<Vec<Row>> {
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
                    times[kind].push(json_u64(&last_json_line(&run.target)?, "ns")? as f64);
                    if let (Some(tool), Some(out)) = (tool, &run.tool) {
                        memory.note(tool.tool, "attach (off-CPU)", out.max_rss_kib);
                        if tool.tool == "tracer" && !has_offcpu_report(&out.stdout) {
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

/// Whether `tracer attach --format json` printed a report with an off-CPU section (its
/// stdout is the report, one pretty-printed JSON object).
fn has_offcpu_report(stdout: &str) -> bool {
    serde_json::from_str::<Value>(stdout).is_ok_and(|report| report["offcpu"].is_object())
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
