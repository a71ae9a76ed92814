//! `cargo xtask test`: every test, privileged end-to-end tests included. Those are
//! `#[ignore]`d with the reason (a plain `cargo test` lists them as ignored, never as
//! passed) and run here with `--include-ignored`; without root they fail. Last, the smoke
//! test in a privileged container (`cargo xtask container`). Before the tests: rustfmt,
//! clippy with `-D warnings`, and a build of the fuzz targets (which only `cargo xtask fuzz`
//! runs), so they keep up with the parser they fuzz.

use std::process::Command;

use anyhow::Result;

use crate::{cargo, release_dir};

pub fn run() -> Result<()> {
    crate::build()?;
    crate::run(&mut cargo(&["fmt", "--all", "--", "--check"]))?;
    // The workspace's lints ([workspace.lints]) and clippy's defaults, as errors. tracer-ebpf
    // builds only for the bpf target, with its own toolchain: see `clippy_ebpf`.
    crate::run(&mut cargo(&[
        "clippy",
        "--release",
        "--workspace",
        "--exclude",
        "tracer-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    clippy_ebpf()?;
    let fuzz = crate::workspace_root().join("tracer-usdt/fuzz/Cargo.toml");
    crate::run(&mut cargo(&[
        "check",
        "--release",
        "--manifest-path",
        fuzz.to_str().expect("the workspace's path is UTF-8"),
        "--bins",
    ]))?;
    crate::run(
        cargo(&[
            "test",
            "--release",
            "--workspace",
            "--exclude",
            "tracer-ebpf",
            "--",
            "--include-ignored",
        ])
        .env("TRACER_BIN", release_dir().join("tracer")),
    )?;
    crate::container::run_built(Default::default())
}

/// Clippy on the eBPF programs, with the same lints, as errors: with their pinned nightly
/// (which gets clippy here; the demo needs none) and for the bpf target.
fn clippy_ebpf() -> Result<()> {
    let toolchain = crate::setup::ebpf_toolchain()?;
    crate::run(Command::new("rustup").args([
        "component",
        "add",
        "clippy",
        "--toolchain",
        &toolchain,
    ]))?;
    crate::run(
        Command::new("cargo")
            .arg(format!("+{toolchain}"))
            .args([
                "clippy",
                "--release",
                "-p",
                "tracer-ebpf",
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
                "--",
                "-D",
                "warnings",
            ])
            .env_remove("RUSTC"),
    )
}
