//! Figure 1: a disabled `probes` probe against no probe at all. `bench-usdt-loop
//! --compare-disabled` times a loop of N iterations with and without `probes::gc_begin`
//! (alternating, in one process); the figure is the median per-iteration difference.

use std::process::Command;

use anyhow::{Context as _, Result, bail};

use super::{
    Config, Row,
    harness::{bin, json_numbers, last_json_line},
    stats::{median, spread},
    yes_no,
};

pub(super) fn measure(config: &Config) -> Result<Vec<Row>> {
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
    let runs = last_json_line(&String::from_utf8_lossy(&out.stdout))?;
    let with = json_numbers(&runs, "with_probe_ns")?;
    let without = json_numbers(&runs, "without_probe_ns")?;
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
