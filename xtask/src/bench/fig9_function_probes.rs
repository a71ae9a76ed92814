//! Figure 9: what function probes cost. (a) Per hit: `bench-usdt-loop --calls` calls
//! `bench_collect` N times, which holds the `tracer:gc__begin` USDT site; ns/hit =
//! (traced - untraced) / N for the USDT probe, a uprobe on the function's entry, and a
//! uprobe and uretprobe pair (tracer `trace --count`, and bpftrace's pair counting the
//! same). (b) GC-heavy programs measured through their GC functions: the time a fixed
//! amount of work takes under `tracer attach` (every collection timed, and the
//! wall-clock profile) against untraced, for pyenv's CPython
//! (`tests/python/gc_workload.py`) and Node (`tests/src/functions/gc_workload.js`).

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use super::{
    Config, Row,
    harness::{
        BPFTRACE_ATTACHED, Stream, ToolSpec, bin, first_lines, json_u64, last_json_line, strings,
        traced_run,
    },
    stats::median,
};
use crate::workspace_root;

/// The pyenv CPython the slowdown is measured on (its GC through `gc_collect_main`).
const PYTHON_VERSION: &str = "3.12";

pub(super) fn measure(config: &Config) -> Result<Vec<Row>> {
    let mut rows = per_hit(config)?;
    rows.extend(slowdowns(config)?);
    Ok(rows)
}

/// Runs `target ARGS` untraced and under each of `tools`, `config.rounds` times in
/// rotating order; the median `ns` each printed, or why it failed.
fn medians(
    config: &Config,
    target: &Path,
    args: &[String],
    tools: &[ToolSpec],
) -> Vec<Result<f64, String>> {
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
            let ns = traced_run(target, args, tool)
                .and_then(|run| json_u64(&last_json_line(&run.target)?, "ns"));
            match ns {
                Ok(ns) => times[kind].push(ns as f64),
                Err(err) => failures[kind] = Some(first_lines(&format!("{err:#}"), 3)),
            }
        }
    }
    (0..kinds)
        .map(|kind| match &failures[kind] {
            Some(err) => Err(err.clone()),
            None => Ok(median(&times[kind])),
        })
        .collect()
}

fn per_hit(config: &Config) -> Result<Vec<Row>> {
    let n = config.events;
    let loop_bin = bin("bench-usdt-loop");
    let path = loop_bin.display().to_string();
    let usdt = format!("usdt:{path}:tracer:gc__begin");
    let entry = format!("uprobe:{path}:bench_collect");
    let exit = format!("uretprobe:{path}:bench_collect");
    let tracer = |label: &'static str, probes: &[&str]| {
        let mut args = strings(&["trace", "--count", "--format", "json", "--pid", "{pid}"]);
        args.extend(probes.iter().map(std::string::ToString::to_string));
        ToolSpec {
            tool: "tracer",
            label,
            program: bin("tracer"),
            args,
            ready: (Stream::Stderr, "Attached"),
            stops_with_target: true,
        }
    };
    let tools = vec![
        tracer("tracer, USDT probe", &[&usdt]),
        tracer("tracer, uprobe (entry)", &[&entry]),
        tracer("tracer, uprobe + uretprobe", &[&entry, &exit]),
        ToolSpec {
            tool: "bpftrace",
            label: "bpftrace, uprobe + uretprobe",
            program: "bpftrace".into(),
            args: strings(&[
                "-p",
                "{pid}",
                "-e",
                &format!(
                    "BEGIN {{ printf(\"{BPFTRACE_ATTACHED}\\n\"); }} {entry} {{ @e = count(); }} \
                     {exit} {{ @r = count(); }}"
                ),
            ]),
            ready: (Stream::Stdout, BPFTRACE_ATTACHED),
            stops_with_target: true,
        },
    ];
    let args = strings(&["--calls", "--iters", &n.to_string(), "--wait-for-signal"]);
    let results = medians(config, &loop_bin, &args, &tools);
    let Ok(untraced) = results[0].clone() else {
        bail!("the untraced runs failed: {:?}", results[0]);
    };
    println!(
        "(a) {n} calls of bench_collect per run, {} rounds; ns/hit = (median traced - median untraced) / {n}",
        config.rounds
    );
    println!(
        "  {:<32} {:>12.1} ms",
        "untraced (probe disabled)",
        untraced / 1e6
    );
    let mut per = Vec::new();
    for (tool, result) in tools.iter().zip(&results[1..]) {
        match result {
            Ok(ns) => {
                let hit = (ns - untraced) / n as f64;
                println!(
                    "  {:<32} {:>12.1} ms {hit:>8.0} ns/hit",
                    tool.label,
                    ns / 1e6
                );
                per.push(Some(hit));
            }
            Err(err) => {
                println!("  {:<32} n/a: {err}", tool.label);
                per.push(None);
            }
        }
    }
    let (Some(usdt_ns), Some(entry_ns), Some(pair_ns)) = (per[0], per[1], per[2]) else {
        bail!("a tracer run failed (see above)");
    };
    let bpftrace_pair = per[3];
    Ok(vec![Row {
        figure: "9a. function probe, ns per hit".into(),
        tracer: format!("entry {entry_ns:.0} ns, entry+return {pair_ns:.0} ns"),
        baselines: format!(
            "USDT {usdt_ns:.0} ns; bpftrace entry+return {}",
            bpftrace_pair.map_or("n/a".into(), |b| format!("{b:.0} ns"))
        ),
        ratio: format!(
            "pair {:.2}x of USDT{}",
            pair_ns / usdt_ns,
            bpftrace_pair.map_or(String::new(), |b| format!(
                ", {:.2}x of bpftrace",
                pair_ns / b
            ))
        ),
        goal: "pair <= bpftrace's".into(),
        met: bpftrace_pair.map_or("?".into(), |b| {
            if pair_ns <= b * 1.1 { "yes" } else { "no" }.into()
        }),
    }])
}

/// pyenv's python3.X, or why it is missing.
fn pyenv_python() -> Result<PathBuf> {
    let root = std::env::var("PYENV_ROOT").unwrap_or_else(|_| "/root/.pyenv".into());
    let versions = std::fs::read_dir(format!("{root}/versions"))?;
    versions
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                n.to_string_lossy()
                    .starts_with(&format!("{PYTHON_VERSION}."))
            })
        })
        .map(|p| p.join(format!("bin/python{PYTHON_VERSION}")))
        .find(|p| p.exists())
        .ok_or_else(|| anyhow::anyhow!("no pyenv CPython {PYTHON_VERSION} under {root}"))
}

fn slowdowns(config: &Config) -> Result<Vec<Row>> {
    let attach = ToolSpec {
        tool: "tracer",
        label: "tracer attach",
        program: bin("tracer"),
        args: strings(&["attach", "--pid", "{pid}", "-o", "/tmp/tracer-bench-fig9"]),
        ready: (Stream::Stderr, "Attached"),
        stops_with_target: true,
    };
    let workspace = workspace_root();
    let mut targets: Vec<(&str, Result<PathBuf>, Vec<String>)> = Vec::new();
    let script = workspace.join("tests/python/gc_workload.py");
    targets.push((
        "CPython (pyenv), gc_collect_main",
        pyenv_python(),
        vec![
            script.display().to_string(),
            "--rounds".into(),
            "150".into(),
            "--wait-for-signal".into(),
        ],
    ));
    let js = workspace.join("tests/src/functions/gc_workload.js");
    targets.push((
        "Node, Heap::CollectGarbage",
        Ok(PathBuf::from("/usr/bin/node")),
        vec![js.display().to_string(), "--rounds".into(), "1500".into()],
    ));
    println!(
        "(b) a GC-heavy program's fixed work, median of {} runs, untraced and under `tracer attach`",
        config.rounds
    );
    let mut rows = Vec::new();
    for (name, program, args) in targets {
        let program = match program {
            Ok(program) => program,
            Err(err) => {
                println!("  {name}: not run: {err:#}");
                continue;
            }
        };
        let results = medians(config, &program, &args, std::slice::from_ref(&attach));
        match (&results[0], &results[1]) {
            (Ok(untraced), Ok(traced)) => {
                let ratio = traced / untraced;
                println!(
                    "  {name:<36} untraced {:.0} ms, traced {:.0} ms: {ratio:.3}x",
                    untraced / 1e6,
                    traced / 1e6
                );
                rows.push(Row {
                    figure: format!("9b. {name}: time under attach"),
                    tracer: format!("{:.0} ms", traced / 1e6),
                    baselines: format!("untraced {:.0} ms", untraced / 1e6),
                    ratio: format!("{ratio:.3}x"),
                    goal: "-".into(),
                    met: "-".into(),
                });
            }
            (untraced, traced) => println!(
                "  {name}: failed: {}",
                untraced
                    .as_ref()
                    .err()
                    .or(traced.as_ref().err())
                    .cloned()
                    .unwrap_or_default()
            ),
        }
    }
    Ok(rows)
}
