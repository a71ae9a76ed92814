//! `cargo xtask fuzz [--seconds N]`: run each cargo-fuzz target of tracer-usdt, the USDT parser
//! (USDT note descriptors, whole-object discovery with site validation, argument specs)
//! for N seconds. On demand, not in CI.

use std::process::Command;

use anyhow::Result;

use crate::workspace_root;

const TARGETS: &[&str] = &["note_desc", "discovery", "arg_spec"];

pub fn run(seconds: u32) -> Result<()> {
    crate::setup::run()?;
    let have_cargo_fuzz = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_cargo_fuzz {
        eprintln!("xtask fuzz: installing cargo-fuzz");
        crate::run(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let toolchain = crate::setup::ebpf_toolchain()?;
    for target in TARGETS {
        eprintln!("xtask fuzz: {target} for {seconds} s");
        // libFuzzer's sanitizer flags need a nightly compiler: the eBPF build's pinned one,
        // new enough for what tracer depends on.
        let mut cmd = Command::new("rustup");
        cmd.args([
            "run",
            &toolchain,
            "cargo",
            "fuzz",
            "run",
            target,
            "--",
            &format!("-max_total_time={seconds}"),
        ]);
        cmd.env(
            "PATH",
            crate::cargo(&[])
                .get_envs()
                .find(|(k, _)| *k == "PATH")
                .and_then(|(_, v)| v)
                .expect("PATH is set"),
        );
        cmd.current_dir(workspace_root().join("tracer-usdt"));
        let status = cmd.status()?;
        anyhow::ensure!(
            status.success(),
            "fuzz target {target} failed ({status}); see tracer-usdt/fuzz/artifacts/{target}"
        );
    }
    Ok(())
}
