//! Figure 3: off-CPU accounting of `pingpong` (two threads, one byte through two pipes, N
//! round trips) under `tracer attach --pid` (off-CPU with user+kernel stacks; DWARF
//! unwinding, the default, and frame pointers), under a bpftrace `sched_switch` script
//! doing the same accounting, and BCC's offcputime (when it runs).
//!
//! The goal is set on the eBPF programs' own cost per context switch: the time the kernel
//! measured in all of the tool's programs (`kernel.bpf_stats_enabled`, read from the
//! tool's `/proc/PID/fdinfo` while the target runs) over the runs of its `sched_switch`
//! program (one per switch on any CPU). Throughput loss is shown too, but does not carry
//! across machines: the untraced ping-pong's rate varies twofold between machines of the
//! same kind, and tracing can even speed it up (fewer idle-state exits).

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use anyhow::{Result, bail};
use serde_json::Value;

use super::{
    Config, PeakMemory, Row,
    harness::{
        BPFTRACE_ATTACHED, BpfStats, ProgramStats, Stream, ToolSpec, bin, first_lines, json_u64,
        last_json_line, strings, traced_run, which,
    },
    stats::{median, min_max},
    yes_no,
};

/// Off-CPU time by user+kernel stack per thread of the target ($1), the way bpftrace users
/// write it: timestamp and stacks when a thread of the target leaves the CPU, the blocked
/// time summed by those stacks when it comes back.
pub(super) const BPFTRACE_OFFCPU: &str = r#"
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
    let attach = |label, unwind: &str| ToolSpec {
        tool: "tracer",
        label,
        program: bin("tracer"),
        args: strings(&[
            "attach",
            "--pid",
            "{pid}",
            "--unwind",
            unwind,
            "--format",
            "json",
            "-o",
            &out_dir.display().to_string(),
        ]),
        ready: (Stream::Stderr, "Attached"),
        stops_with_target: true,
    };
    let _stats = BpfStats::enable()?;
    let mut tools = vec![
        attach("tracer attach --pid", "dwarf"),
        attach("tracer attach --unwind fp", "fp"),
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
    let mut switch_costs: Vec<Vec<f64>> = vec![Vec::new(); kinds];
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
                    if let Some(cost) = ns_per_switch(&run.programs) {
                        switch_costs[kind].push(cost);
                    }
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
        "  {:<30} {:>16} {:>11} {:>15} {:>14}",
        "", "round trips/s", "throughput", "runs", "BPF ns/switch"
    );
    println!(
        "  {:<30} {:>16.0} {:>11} {:>15} {:>14}",
        "untraced",
        untraced,
        "-",
        runs(0),
        "-"
    );
    let cost = |kind: usize| {
        let costs = &switch_costs[kind];
        (!costs.is_empty()).then(|| median(costs))
    };
    for (t, tool) in tools.iter().enumerate() {
        let kind = t + 1;
        match (&failures[kind], loss(kind)) {
            (Some(err), _) if tool.tool == "bcc" => {
                println!("  {:<30} n/a: {err} ({})", tool.label, bcc_reason());
            }
            (Some(err), _) => println!("  {:<30} n/a: {err}", tool.label),
            (None, Some(l)) => println!(
                "  {:<30} {:>16.0} {:>+10.1}% {:>15} {:>14}",
                tool.label,
                rate(kind),
                -l * 100.0,
                runs(kind),
                cost(kind).map_or("n/a".into(), |c| format!("{c:.0}")),
            ),
            (None, None) => println!("  {:<30} n/a", tool.label),
        }
    }
    if bcc.is_none() {
        println!("  {:<30} n/a: {}", "BCC offcputime", bcc_reason());
    }
    println!(
        "  BPF ns/switch: the time in all of the tool's eBPF programs over its sched_switch \
         program's runs (bpf_stats), median of the runs"
    );

    let bpftrace_kind = 3;
    let ok = |kind: usize| failures.get(kind).is_some_and(Option::is_none);
    let bpftrace_cost = cost(bpftrace_kind).filter(|_| ok(bpftrace_kind));
    let mut baselines = match (
        bpftrace_cost,
        loss(bpftrace_kind).filter(|_| ok(bpftrace_kind)),
    ) {
        (Some(c), Some(l)) => format!("bpftrace {c:.0} ns/switch ({:+.1}%)", -l * 100.0),
        _ => "bpftrace n/a".into(),
    };
    let bcc_loss = bcc.as_ref().and_then(|_| loss(4)).filter(|_| ok(4));
    match bcc_loss {
        Some(l) => {
            let _ = write!(baselines, "; BCC {:+.1}%", -l * 100.0);
        }
        None => baselines.push_str("; BCC n/a"),
    }
    let mut rows = Vec::new();
    for (kind, figure) in [
        (1, "3. off-CPU, BPF time per switch"),
        (2, "3b. same, --unwind fp"),
    ] {
        let (Some(tracer), Some(l)) = (cost(kind).filter(|_| ok(kind)), loss(kind)) else {
            bail!(
                "{} failed: {}",
                tools[kind - 1].label,
                failures[kind]
                    .clone()
                    .unwrap_or_else(|| "no BPF stats".into())
            );
        };
        let ratio = bpftrace_cost.map(|b| tracer / b);
        rows.push(Row {
            figure: figure.into(),
            tracer: format!("{tracer:.0} ns/switch ({:+.1}%)", -l * 100.0),
            baselines: baselines.clone(),
            ratio: ratio.map_or("-".into(), |r| format!("{r:.2}x")),
            goal: "<= 1/3 of bpftrace's".into(),
            met: ratio.map_or("?".into(), |r| yes_no(r <= 1.0 / 3.0)),
        });
    }
    Ok(rows)
}

/// BPF time per context switch: the time in all of a tool's programs over the runs of the
/// one run most (its `sched_switch` program: once per switch); `None` without stats.
fn ns_per_switch(programs: &[ProgramStats]) -> Option<f64> {
    let switches = programs.iter().map(|p| p.run_cnt).max()?;
    let time: u64 = programs.iter().map(|p| p.run_time_ns).sum();
    (switches > 0 && time > 0).then(|| time as f64 / switches as f64)
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
