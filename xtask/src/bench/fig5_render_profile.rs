//! Figure 5: symbolize + fold + render a profile of 1M blocked intervals over many
//! distinct stacks through the tracer library, against inferno alone rendering the same
//! folded stacks (`bench-render`, which links both).

use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

use super::{
    Config, Row,
    harness::{bin, json_numbers, json_u64, last_json_line},
    stats::median,
    yes_no,
};

pub(super) fn measure(config: &Config) -> Result<Vec<Row>> {
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
    let result = last_json_line(&String::from_utf8_lossy(&out.stdout))?;
    let med = |key: &str| -> Result<f64> { Ok(median(&json_numbers(&result, key)?) / 1e9) };
    let (total, symbolize, folded, render, inferno) = (
        med("tracer_ns")?,
        med("symbolize_ns")?,
        med("files_ns")?,
        med("render_ns")?,
        med("inferno_ns")?,
    );
    // The tracer hands inferno its lines as they are (sorted already): its picture
    // must be the one inferno draws from the same lines sorted by itself.
    let same_svg = result["same_svg"].as_bool() == Some(true);
    let stacks = json_u64(&result, "folded_stacks")?;
    let bytes = json_u64(&result, "folded_bytes")?;
    println!(
        "profile: {} blocked intervals over {} keys -> {stacks} distinct folded stacks, {:.0} MB folded; {} round(s)",
        json_u64(&result, "samples")?,
        json_u64(&result, "keys")?,
        bytes as f64 / 1e6,
        config.render_rounds
    );
    println!("  tracer, all steps:          {total:.2} s");
    println!("    build_profile (symbolize, fold): {symbolize:.2} s");
    println!("    write the folded file and SVG:  {folded:.2} s (together, as every view)");
    println!("  tracer's SVG render alone:        {render:.2} s");
    println!("  inferno alone (same folded stacks): {inferno:.2} s");
    println!(
        "  tracer's SVG {} inferno's, byte for byte",
        if same_svg { "is" } else { "DIFFERS from" }
    );
    Ok(vec![
        Row {
            figure: "5. symbolize + render".into(),
            tracer: format!("{total:.2} s"),
            baselines: format!("inferno {inferno:.2} s"),
            ratio: format!("{:.2}x", total / inferno),
            // inferno is given names; tracer must find them (kallsyms, ELF and DWARF of
            // every mapped object) and fold the stacks too.
            goal: "<= 2x inferno".into(),
            met: yes_no(total <= inferno * 2.0),
        },
        Row {
            figure: "5b. render step alone".into(),
            tracer: format!("{render:.2} s"),
            baselines: format!("inferno {inferno:.2} s"),
            ratio: format!("{:.2}x", render / inferno),
            goal: "<= 1.10x inferno".into(),
            met: yes_no(render <= inferno * 1.10 && same_svg),
        },
    ])
}
