//! `cargo xtask test`: every test, privileged end-to-end tests included. Those are
//! `#[ignore]`d with the reason (a plain `cargo test` lists them as ignored, never as
//! passed) and run here with `--include-ignored`; without root they fail. Last, the smoke
//! test in a privileged container (`cargo xtask container`). Before the tests: rustfmt and
//! clippy with `-D warnings`.

use anyhow::Result;

use crate::{cargo, release_dir};

pub fn run() -> Result<()> {
    crate::build()?;
    crate::run(&mut cargo(&["fmt", "--all", "--", "--check"]))?;
    // The workspace's lints ([workspace.lints]) and clippy's defaults, as errors. tracer-ebpf
    // builds only for the bpf target (tracer's build script compiles it).
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
