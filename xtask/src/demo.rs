//! `cargo xtask demo`: trace the demo runtime (tests/src/bin/gc-demo.rs) from outside,
//! as a user would: start it, attach `tracer attach --pid`, let it run its GCs.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::{release_dir, workspace_root};

const GCS: &str = "20";
const PAUSE_MS: &str = "20";

pub fn run() -> Result<()> {
    crate::build_demo()?;
    let out_dir = workspace_root().join("out/demo");
    std::fs::create_dir_all(&out_dir)?;

    let mut target = Command::new(release_dir().join("gc-demo"))
        .args([
            "--wait-for-signal",
            "--gcs",
            GCS,
            "--pause-ms",
            PAUSE_MS,
            "--interval-ms",
            "30",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start gc-demo")?;
    let mut target_out = BufReader::new(target.stdout.take().expect("piped"));
    let mut line = String::new();
    target_out.read_line(&mut line)?;
    let pid = line
        .trim()
        .strip_prefix("ready pid=")
        .with_context(|| format!("gc-demo said {line:?}"))?
        .to_string();

    eprintln!(
        "xtask demo: gc-demo (pid {pid}) will run {GCS} collections of {PAUSE_MS} ms; attaching tracer"
    );
    let mut tracer = Command::new(release_dir().join("tracer"))
        .args(["attach", "--pid", &pid, "--output"])
        .arg(&out_dir)
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start tracer")?;
    let mut tracer_err = BufReader::new(tracer.stderr.take().expect("piped"));
    loop {
        line.clear();
        if tracer_err.read_line(&mut line)? == 0 {
            let _ = target.kill();
            bail!("tracer exited before attaching: {:?}", tracer.wait()?);
        }
        eprint!("{line}");
        if line.contains("Attached") {
            break;
        }
    }
    crate::run(Command::new("kill").args(["-USR1", &pid]))?;
    std::thread::spawn(move || std::io::copy(&mut tracer_err, &mut std::io::stderr()));

    let mut truth = String::new();
    std::io::Read::read_to_string(&mut target_out, &mut truth)?;
    target.wait()?;
    let status = tracer.wait()?;
    if !status.success() {
        bail!("tracer failed ({status})");
    }
    eprintln!("\nxtask demo: gc-demo's own measurements: {}", truth.trim());
    eprintln!(
        "xtask demo: flamegraph: {}",
        out_dir.join("offcpu.svg").display()
    );
    Ok(())
}
